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
