// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(mxfp4-to-cuda-matvec)'

// x is cached in shared memory by the kernel: K is capped.
func.func @k_too_large(%x: !torch.vtensor<[1,16384],f32>, %p: !torch.vtensor<[32,8192],ui8>, %s: !torch.vtensor<[32,512],ui8>) -> !torch.vtensor<[1,32],f32> {
  // expected-error @+1 {{mxfp4_linear: K=16384 is larger than the CUDA matvec kernel's 8192 (x is cached in shared memory)}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,16384],f32>, !torch.vtensor<[32,8192],ui8>, !torch.vtensor<[32,512],ui8>) -> !torch.vtensor<[1,32],f32>
  return %y : !torch.vtensor<[1,32],f32>
}

// -----

// The op checks are fuse-mxfp4-matmul's.
func.func @bad_scales(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[32,32],ui8>, %s: !torch.vtensor<[32,4],ui8>) -> !torch.vtensor<[1,32],f32> {
  // expected-error @+1 {{mxfp4_linear: scales must be [32,2] (one byte per 32 values), got [32,4]}}
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[32,32],ui8>, !torch.vtensor<[32,4],ui8>) -> !torch.vtensor<[1,32],f32>
  return %y : !torch.vtensor<[1,32],f32>
}

// -----

// The SwiGLU form runs on the matvec alone: 40 rows (T·k with k = 1 < 64) are taken, 64 refused.
func.func @swiglu_rows(%gu: !torch.vtensor<[64,128],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[64,1],si64>) -> !torch.vtensor<[64,1,32],f32> {
  %limit = torch.constant.float 7.000000e+00
  // expected-error @+1 {{mxfp4_moe_swiglu: 64 rows; its kernel is the matvec's, for fewer than 64 static rows (one token's experts)}}
  %y = torch.operator "torch.day0.mxfp4_moe_swiglu"(%gu, %p, %s, %e, %limit) : (!torch.vtensor<[64,128],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[64,1],si64>, !torch.float) -> !torch.vtensor<[64,1,32],f32>
  return %y : !torch.vtensor<[64,1,32],f32>
}

// -----

// gate_up holds both halves: 2·K columns for the weights' K = 64.
func.func @swiglu_width(%gu: !torch.vtensor<[2,64],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[2,1],si64>) -> !torch.vtensor<[2,1,32],f32> {
  %limit = torch.constant.float 7.000000e+00
  // expected-error @+1 {{mxfp4_moe_swiglu: gate_up has 64 columns, expected 2·K = 128 for packed's K = 64}}
  %y = torch.operator "torch.day0.mxfp4_moe_swiglu"(%gu, %p, %s, %e, %limit) : (!torch.vtensor<[2,64],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[2,1],si64>, !torch.float) -> !torch.vtensor<[2,1,32],f32>
  return %y : !torch.vtensor<[2,1,32],f32>
}

// -----

// The clamp is a constant (it becomes the kernel's push constant).
func.func @swiglu_limit(%gu: !torch.vtensor<[2,128],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[2,1],si64>, %limit: !torch.float) -> !torch.vtensor<[2,1,32],f32> {
  // expected-error @+1 {{mxfp4_moe_swiglu: limit must come from torch.constant.float}}
  %y = torch.operator "torch.day0.mxfp4_moe_swiglu"(%gu, %p, %s, %e, %limit) : (!torch.vtensor<[2,128],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[2,1],si64>, !torch.float) -> !torch.vtensor<[2,1,32],f32>
  return %y : !torch.vtensor<[2,1,32],f32>
}
