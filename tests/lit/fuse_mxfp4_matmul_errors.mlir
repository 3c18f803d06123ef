// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(fuse-mxfp4-matmul)'
// RUN: not day0-opt %s --pass-pipeline='builtin.module(fuse-mxfp4-matmul{prefill=maybe})' 2>&1 | filecheck %s --check-prefix=BADVALUE
// RUN: not day0-opt %s --pass-pipeline='builtin.module(fuse-mxfp4-matmul{form=fused})' 2>&1 | filecheck %s --check-prefix=BADNAME

// BADVALUE: pass 'fuse-mxfp4-matmul': prefill must be one of fused, unfused, got 'maybe'
// BADNAME: pass 'fuse-mxfp4-matmul' has no option 'form' (options: prefill)

// K = 48 is not a multiple of 32.
func.func @k_not_multiple_of_32(%x: !torch.vtensor<[1,48],f32>, %p: !torch.vtensor<[8,24],ui8>, %s: !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32> {
  // expected-error @+1 {{mxfp4_linear: K=48 (from x) is not a multiple of 32}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,48],f32>, !torch.vtensor<[8,24],ui8>, !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}

// -----

// packed rows of 16 bytes hold 32 values, x has K = 64.
func.func @packed_k_mismatch(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[8,16],ui8>, %s: !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32> {
  // expected-error @+1 {{mxfp4_linear: packed has 16 bytes a row, expected K/2 = 32 for x's K=64}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[8,16],ui8>, !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}

// -----

// One scale byte per 32 values: K = 64 needs 2 a row, not 4.
func.func @scale_shape(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[8,32],ui8>, %s: !torch.vtensor<[8,4],ui8>) -> !torch.vtensor<[1,8],f32> {
  // expected-error @+1 {{mxfp4_linear: scales must be [8,2] (one byte per 32 values), got [8,4]}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[8,32],ui8>, !torch.vtensor<[8,4],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}

// -----

// packed as si8.
func.func @packed_not_ui8(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[8,32],si8>, %s: !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32> {
  // expected-error @+1 {{mxfp4_linear: packed must be ui8, got si8}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[8,32],si8>, !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}

// -----

// scales as f32.
func.func @scales_not_ui8(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[8,32],ui8>, %s: !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[1,8],f32> {
  // expected-error @+1 {{mxfp4_linear: scales must be ui8, got f32}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[8,32],ui8>, !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}

// -----

// x in bf16.
func.func @x_not_f32(%x: !torch.vtensor<[1,64],bf16>, %p: !torch.vtensor<[8,32],ui8>, %s: !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32> {
  // expected-error @+1 {{mxfp4_linear: x must be f32, got bf16}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],bf16>, !torch.vtensor<[8,32],ui8>, !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}

// -----

// A rank-3 weight given to the linear op.
func.func @linear_rank(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[2,8,32],ui8>, %s: !torch.vtensor<[2,8,2],ui8>) -> !torch.vtensor<[1,8],f32> {
  // expected-error @+1 {{mxfp4_linear: packed must have rank 2, got rank 3}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[2,8,32],ui8>, !torch.vtensor<[2,8,2],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}

// -----

// A rank-2 weight given to the moe op.
func.func @moe_rank(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[8,32],ui8>, %s: !torch.vtensor<[4,8,2],ui8>, %e: !torch.vtensor<[1,2],si64>) -> !torch.vtensor<[1,2,8],f32> {
  // expected-error @+1 {{mxfp4_moe: packed must have rank 3, got rank 2}}
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[8,32],ui8>, !torch.vtensor<[4,8,2],ui8>, !torch.vtensor<[1,2],si64>) -> !torch.vtensor<[1,2,8],f32>
  return %y : !torch.vtensor<[1,2,8],f32>
}

// -----

// Expert ids as floats.
func.func @experts_not_integer(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[4,8,32],ui8>, %s: !torch.vtensor<[4,8,2],ui8>, %e: !torch.vtensor<[1,2],f32>) -> !torch.vtensor<[1,2,8],f32> {
  // expected-error @+1 {{mxfp4_moe: experts must be integers, got f32}}
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[4,8,32],ui8>, !torch.vtensor<[4,8,2],ui8>, !torch.vtensor<[1,2],f32>) -> !torch.vtensor<[1,2,8],f32>
  return %y : !torch.vtensor<[1,2,8],f32>
}

// -----

// Every failing op is reported, not only the first: moe scales of the wrong shape, and a
// linear K that is not a multiple of 32.
func.func @two_errors(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[4,8,32],ui8>, %s: !torch.vtensor<[4,8,3],ui8>, %e: !torch.vtensor<[1,2],si64>, %x2: !torch.vtensor<[1,40],f32>, %p2: !torch.vtensor<[8,20],ui8>, %s2: !torch.vtensor<[8,1],ui8>) -> (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1,8],f32>) {
  // expected-error @+1 {{mxfp4_moe: scales must be [4,8,2] (one byte per 32 values), got [4,8,3]}}
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[4,8,32],ui8>, !torch.vtensor<[4,8,3],ui8>, !torch.vtensor<[1,2],si64>) -> !torch.vtensor<[1,2,8],f32>
  // expected-error @+1 {{mxfp4_linear: K=40 (from x) is not a multiple of 32}}
  %y2 = torch.operator "torch.day0.mxfp4_linear"(%x2, %p2, %s2) : (!torch.vtensor<[1,40],f32>, !torch.vtensor<[8,20],ui8>, !torch.vtensor<[8,1],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y, %y2 : !torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1,8],f32>
}

// -----

// mxfp4_moe_swiglu is cuda-sm90's form: no CPU lowering (export writes its body elsewhere).
func.func @swiglu(%gu: !torch.vtensor<[2,128],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[2,1],si64>) -> !torch.vtensor<[2,1,32],f32> {
  %limit = torch.constant.float 7.000000e+00
  // expected-error @+1 {{mxfp4_moe_swiglu has no CPU lowering: export keeps it whole only for cuda-sm90 (frontend/ops.py)}}
  %y = torch.operator "torch.day0.mxfp4_moe_swiglu"(%gu, %p, %s, %e, %limit) : (!torch.vtensor<[2,128],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[2,1],si64>, !torch.float) -> !torch.vtensor<[2,1,32],f32>
  return %y : !torch.vtensor<[2,1,32],f32>
}
