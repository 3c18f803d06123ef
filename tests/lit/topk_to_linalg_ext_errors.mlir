// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(topk-to-linalg-ext)'
// RUN: not day0-opt %s --pass-pipeline='builtin.module(topk-to-linalg-ext{minsize=4})' 2>&1 | filecheck %s --check-prefix=BADNAME
// RUN: not day0-opt %s --pass-pipeline='builtin.module(topk-to-linalg-ext{min-size=big})' 2>&1 | filecheck %s --check-prefix=BADVALUE
// RUN: not day0-opt %s --pass-pipeline='builtin.module(topk-to-linalg-ext{min-size=-1})' 2>&1 | filecheck %s --check-prefix=BADRANGE

// BADNAME: pass 'topk-to-linalg-ext' has no option 'minsize' (options: min-size)
// BADVALUE: pass 'topk-to-linalg-ext': option 'min-size' expects int, got 'big'
// BADRANGE: pass 'topk-to-linalg-ext': min-size must be >= 0, got -1

// k is a function argument, not a constant.
func.func @k_not_constant(%x: !torch.vtensor<[4,64],f32>, %k: !torch.int) -> !torch.vtensor<[4,?],si64> {
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: k must come from torch.constant.int}}
  %values, %indices = torch.aten.topk %x, %k, %int-1, %true, %true : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,?],f32>, !torch.vtensor<[4,?],si64>
  return %indices : !torch.vtensor<[4,?],si64>
}

// -----

// k = 65 > the static row length 64.
func.func @k_too_large(%x: !torch.vtensor<[4,64],f32>) -> !torch.vtensor<[4,65],si64> {
  %int65 = torch.constant.int 65
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: k=65 is larger than the row length 64}}
  %values, %indices = torch.aten.topk %x, %int65, %int-1, %true, %true : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,65],f32>, !torch.vtensor<[4,65],si64>
  return %indices : !torch.vtensor<[4,65],si64>
}

// -----

// topk over dim 0 of a rank-2 input: only the last dim is supported.
func.func @dim_not_last(%x: !torch.vtensor<[64,4],f32>) -> !torch.vtensor<[6,4],si64> {
  %int6 = torch.constant.int 6
  %int0 = torch.constant.int 0
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: dim 0 is not the last dim of the rank-2 input (only -1 or 1)}}
  %values, %indices = torch.aten.topk %x, %int6, %int0, %true, %true : !torch.vtensor<[64,4],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[6,4],f32>, !torch.vtensor<[6,4],si64>
  return %indices : !torch.vtensor<[6,4],si64>
}

// -----

// -2 names the first dim of a rank-2 input, not the last.
func.func @negative_dim_not_last(%x: !torch.vtensor<[64,4],f32>) -> !torch.vtensor<[6,4],si64> {
  %int6 = torch.constant.int 6
  %int-2 = torch.constant.int -2
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: dim -2 is not the last dim of the rank-2 input (only -1 or 1)}}
  %values, %indices = torch.aten.topk %x, %int6, %int-2, %true, %true : !torch.vtensor<[64,4],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[6,4],f32>, !torch.vtensor<[6,4],si64>
  return %indices : !torch.vtensor<[6,4],si64>
}

// -----

// Integer scores.
func.func @integer_input(%x: !torch.vtensor<[4,64],si64>) -> !torch.vtensor<[4,6],si64> {
  %int6 = torch.constant.int 6
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: input must be a float tensor (f16, bf16, f32, f64), got si64}}
  %values, %indices = torch.aten.topk %x, %int6, %int-1, %true, %true : !torch.vtensor<[4,64],si64>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,6],si64>, !torch.vtensor<[4,6],si64>
  return %indices : !torch.vtensor<[4,6],si64>
}

// -----

// largest is a function argument: the comparator must be known.
func.func @largest_not_constant(%x: !torch.vtensor<[4,64],f32>, %largest: !torch.bool) -> !torch.vtensor<[4,6],si64> {
  %int6 = torch.constant.int 6
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: largest must come from torch.constant.bool}}
  %values, %indices = torch.aten.topk %x, %int6, %int-1, %largest, %true : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,6],f32>, !torch.vtensor<[4,6],si64>
  return %indices : !torch.vtensor<[4,6],si64>
}

// -----

// Every failing topk is reported, not only the first.
func.func @two_errors(%x: !torch.vtensor<[4,8],f32>, %k: !torch.int) -> (!torch.vtensor<[4,?],si64>, !torch.vtensor<[4,9],si64>) {
  %int9 = torch.constant.int 9
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  // expected-error @+1 {{topk: k must come from torch.constant.int}}
  %v0, %i0 = torch.aten.topk %x, %k, %int-1, %true, %true : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,?],f32>, !torch.vtensor<[4,?],si64>
  // expected-error @+1 {{topk: k=9 is larger than the row length 8}}
  %v1, %i1 = torch.aten.topk %x, %int9, %int-1, %true, %true : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,9],f32>, !torch.vtensor<[4,9],si64>
  return %i0, %i1 : !torch.vtensor<[4,?],si64>, !torch.vtensor<[4,9],si64>
}
