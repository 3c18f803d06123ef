// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(topk-to-radix-select)'
// RUN: not day0-opt %s --pass-pipeline='builtin.module(topk-to-radix-select{min-size=-1})' 2>&1 | filecheck %s --check-prefix=BADRANGE

// BADRANGE: pass 'topk-to-radix-select': min-size must be >= 0, got -1

// The selection comes back in position order, so a sorted topk cannot be served.
func.func @sorted(%x: !torch.vtensor<[4,64],f32>) -> !torch.vtensor<[4,8],si64> {
  %int8 = torch.constant.int 8
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: sorted=true is not supported: the radix select returns the selection in position order, not by value (export the topk with sorted=False)}}
  %values, %indices = torch.aten.topk %x, %int8, %int-1, %true, %true : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,8],f32>, !torch.vtensor<[4,8],si64>
  return %indices : !torch.vtensor<[4,8],si64>
}

// -----

func.func @bf16(%x: !torch.vtensor<[4,64],bf16>) -> !torch.vtensor<[4,8],si64> {
  %int8 = torch.constant.int 8
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  // expected-error @+1 {{topk: the CUDA radix select takes an f32 !torch.vtensor of rank >= 1, got !torch.vtensor<[4,64],bf16>}}
  %values, %indices = torch.aten.topk %x, %int8, %int-1, %true, %false : !torch.vtensor<[4,64],bf16>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,8],bf16>, !torch.vtensor<[4,8],si64>
  return %indices : !torch.vtensor<[4,8],si64>
}

// -----

func.func @smallest(%x: !torch.vtensor<[4,64],f32>) -> !torch.vtensor<[4,8],si64> {
  %int8 = torch.constant.int 8
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  // expected-error @+1 {{topk: only largest=true is supported}}
  %values, %indices = torch.aten.topk %x, %int8, %int-1, %false, %false : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,8],f32>, !torch.vtensor<[4,8],si64>
  return %indices : !torch.vtensor<[4,8],si64>
}

// -----

func.func @not_last_dim(%x: !torch.vtensor<[64,4],f32>) -> !torch.vtensor<[8,4],si64> {
  %int8 = torch.constant.int 8
  %int0 = torch.constant.int 0
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  // expected-error @+1 {{topk: dim 0 is not the last dim of the rank-2 input (only -1 or 1)}}
  %values, %indices = torch.aten.topk %x, %int8, %int0, %true, %false : !torch.vtensor<[64,4],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],si64>
  return %indices : !torch.vtensor<[8,4],si64>
}

// -----

func.func @k_too_large(%x: !torch.vtensor<[4,64],f32>) -> !torch.vtensor<[4,65],si64> {
  %int65 = torch.constant.int 65
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  // expected-error @+1 {{topk: k=65 is larger than the row length 64}}
  %values, %indices = torch.aten.topk %x, %int65, %int-1, %true, %false : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,65],f32>, !torch.vtensor<[4,65],si64>
  return %indices : !torch.vtensor<[4,65],si64>
}

// -----

func.func @k_not_constant(%x: !torch.vtensor<[4,64],f32>, %k: !torch.int) -> !torch.vtensor<[4,?],si64> {
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  // expected-error @+1 {{topk: k must come from torch.constant.int}}
  %values, %indices = torch.aten.topk %x, %k, %int-1, %true, %false : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,?],f32>, !torch.vtensor<[4,?],si64>
  return %indices : !torch.vtensor<[4,?],si64>
}
