// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=4})'
// RUN: not day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{tiles=4})' 2>&1 | filecheck %s --check-prefix=BADNAME
// RUN: not day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=four})' 2>&1 | filecheck %s --check-prefix=BADVALUE
// RUN: not day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=0})' 2>&1 | filecheck %s --check-prefix=BADRANGE

// BADNAME: pass 'dsa-to-gather-tiles' has no option 'tiles' (options: block, decode-tile, tile)
// BADVALUE: pass 'dsa-to-gather-tiles': option 'tile' expects int, got 'four'
// BADRANGE: pass 'dsa-to-gather-tiles': tile must be >= 1, got 0

// q of rank 2.
func.func @q_rank(%q: !torch.vtensor<[2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,8],si64>) -> !torch.vtensor<[1,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{dsa_attention: q must have rank 3, got rank 2}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32>
  return %0 : !torch.vtensor<[1,2,16],f32>
}

// -----

// kv of rank 3.
func.func @kv_rank(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[1,32,16],f32>, %idx: !torch.vtensor<[1,8],si64>) -> !torch.vtensor<[1,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[1,32,16],f32>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32> // expected-error {{kv must have rank 2, got rank 3}}
  return %0 : !torch.vtensor<[1,2,16],f32>
}

// -----

// Float indices.
func.func @float_indices(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,8],f32>) -> !torch.vtensor<[1,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{indices must be integers (si64 or si32), got f32}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,8],f32>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32>
  return %0 : !torch.vtensor<[1,2,16],f32>
}

// -----

// tile=4 does not divide K=6.
func.func @tile_not_dividing(%q: !torch.vtensor<[?,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[?,6],si64>) -> !torch.vtensor<[?,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{dsa_attention: tile=4 does not divide the 6 selected slots}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[?,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[?,6],si64>, !torch.float, !torch.int) -> !torch.vtensor<[?,2,16],f32>
  return %0 : !torch.vtensor<[?,2,16],f32>
}

// -----

// The scale is a function argument, not a constant.
func.func @scale_not_constant(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,8],si64>, %scale: !torch.float) -> !torch.vtensor<[1,2,16],f32> {
  %vdim = torch.constant.int 16
  // expected-error @+1 {{scale must come from torch.constant.float}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32>
  return %0 : !torch.vtensor<[1,2,16],f32>
}

// -----

// value_dim is a function argument, not a constant.
func.func @value_dim_not_constant(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,8],si64>, %vdim: !torch.int) -> !torch.vtensor<[1,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  // expected-error @+1 {{value_dim must come from torch.constant.int}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32>
  return %0 : !torch.vtensor<[1,2,16],f32>
}

// -----

// value_dim 20 exceeds the row size 16.
func.func @value_dim_too_large(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,8],si64>) -> !torch.vtensor<[1,2,20],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 20
  // expected-error @+1 {{value_dim 20 must be in [1, 16] (values are kv[:, :value_dim])}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,20],f32>
  return %0 : !torch.vtensor<[1,2,20],f32>
}

// -----

// A dynamic K: the number of tiles must be static.
func.func @dynamic_k(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,?],si64>) -> !torch.vtensor<[1,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{H, D and K must be static (only the query count S and the cache rows T may be dynamic)}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,?],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32>
  return %0 : !torch.vtensor<[1,2,16],f32>
}

// -----

// Queries and index rows disagree on S.
func.func @mismatched_s(%q: !torch.vtensor<[3,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[2,8],si64>) -> !torch.vtensor<[3,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{indices have 2 rows but there are 3 queries}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[3,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[2,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[3,2,16],f32>
  return %0 : !torch.vtensor<[3,2,16],f32>
}

// -----

// The result is f32 whatever the q/kv dtype: a bf16 result (the old contract) is rejected.
func.func @bf16_result(%q: !torch.vtensor<[1,2,16],bf16>, %kv: !torch.vtensor<[32,16],bf16>, %idx: !torch.vtensor<[1,8],si64>) -> !torch.vtensor<[1,2,16],bf16> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{dsa_attention: result must be f32 (whatever the q/kv dtype), got bf16}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],bf16>, !torch.vtensor<[32,16],bf16>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],bf16>
  return %0 : !torch.vtensor<[1,2,16],bf16>
}

// -----

// q and kv must share one dtype.
func.func @mixed_io(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],bf16>, %idx: !torch.vtensor<[1,8],si64>) -> !torch.vtensor<[1,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{dsa_attention: q and kv must share one float dtype (f32, bf16 or f16), got f32, bf16}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],bf16>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32>
  return %0 : !torch.vtensor<[1,2,16],f32>
}
