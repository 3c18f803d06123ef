// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(dsa-to-cuda-kernel)'

// Rows wider than the kernel stages in shared memory.
func.func @too_wide(%q: !torch.vtensor<[1,4,640],f32>, %kv: !torch.vtensor<[64,640],f32>, %idx: !torch.vtensor<[1,16],si64>) -> !torch.vtensor<[1,4,512],f32> {
  %scale = torch.constant.float 0.125
  %v = torch.constant.int 512
  // expected-error @+1 {{dsa_attention: the CUDA kernel cannot take D=640 > 576}}
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[1,4,640],f32>, !torch.vtensor<[64,640],f32>, !torch.vtensor<[1,16],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,4,512],f32>
  return %o : !torch.vtensor<[1,4,512],f32>
}

// -----

func.func @f16(%q: !torch.vtensor<[1,4,64],f16>, %kv: !torch.vtensor<[64,64],f16>, %idx: !torch.vtensor<[1,16],si64>) -> !torch.vtensor<[1,4,64],f32> {
  %scale = torch.constant.float 0.125
  %v = torch.constant.int 64
  // expected-error @+1 {{dsa_attention: the CUDA kernel cannot take dtype f16 (the kernel takes f32 or bf16)}}
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[1,4,64],f16>, !torch.vtensor<[64,64],f16>, !torch.vtensor<[1,16],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,4,64],f32>
  return %o : !torch.vtensor<[1,4,64],f32>
}

// -----

// The result is f32 for bf16 q and kv too (the combine kernels write f32).
func.func @bf16_result(%q: !torch.vtensor<[1,4,64],bf16>, %kv: !torch.vtensor<[64,64],bf16>, %idx: !torch.vtensor<[1,16],si64>) -> !torch.vtensor<[1,4,64],bf16> {
  %scale = torch.constant.float 0.125
  %v = torch.constant.int 64
  // expected-error @+1 {{dsa_attention: result must be f32 (whatever the q/kv dtype), got bf16}}
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[1,4,64],bf16>, !torch.vtensor<[64,64],bf16>, !torch.vtensor<[1,16],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,4,64],bf16>
  return %o : !torch.vtensor<[1,4,64],bf16>
}
