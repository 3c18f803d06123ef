// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(vision-attention-to-cuda-kernel)'

func.func @head_dim_without_an_entry(%q: !torch.vtensor<[64,2,24],f32>, %k: !torch.vtensor<[64,2,24],f32>, %v: !torch.vtensor<[64,2,24],f32>, %seg: !torch.vtensor<[64],si64>) -> !torch.vtensor<[64,2,24],f32> {
  %scale = torch.constant.float 0.2
  // expected-error @+1 {{vision_attention: the CUDA kernel takes head dims 16, 32, 64, 128, got D=24}}
  %o = torch.operator "torch.day0.vision_attention"(%q, %k, %v, %seg, %scale) : (!torch.vtensor<[64,2,24],f32>, !torch.vtensor<[64,2,24],f32>, !torch.vtensor<[64,2,24],f32>, !torch.vtensor<[64],si64>, !torch.float) -> !torch.vtensor<[64,2,24],f32>
  return %o : !torch.vtensor<[64,2,24],f32>
}

// -----

func.func @dynamic_patches(%q: !torch.vtensor<[?,2,16],f32>, %k: !torch.vtensor<[?,2,16],f32>, %v: !torch.vtensor<[?,2,16],f32>, %seg: !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,2,16],f32> {
  %scale = torch.constant.float 0.25
  // expected-error @+1 {{vision_attention: q must have a static shape [P, H, D], got [?,2,16]}}
  %o = torch.operator "torch.day0.vision_attention"(%q, %k, %v, %seg, %scale) : (!torch.vtensor<[?,2,16],f32>, !torch.vtensor<[?,2,16],f32>, !torch.vtensor<[?,2,16],f32>, !torch.vtensor<[?],si64>, !torch.float) -> !torch.vtensor<[?,2,16],f32>
  return %o : !torch.vtensor<[?,2,16],f32>
}

// -----

func.func @int32_segments(%q: !torch.vtensor<[64,2,16],f32>, %k: !torch.vtensor<[64,2,16],f32>, %v: !torch.vtensor<[64,2,16],f32>, %seg: !torch.vtensor<[64],si32>) -> !torch.vtensor<[64,2,16],f32> {
  %scale = torch.constant.float 0.25
  // expected-error @+1 {{vision_attention: segments must be si64, got si32}}
  %o = torch.operator "torch.day0.vision_attention"(%q, %k, %v, %seg, %scale) : (!torch.vtensor<[64,2,16],f32>, !torch.vtensor<[64,2,16],f32>, !torch.vtensor<[64,2,16],f32>, !torch.vtensor<[64],si32>, !torch.float) -> !torch.vtensor<[64,2,16],f32>
  return %o : !torch.vtensor<[64,2,16],f32>
}

// -----

func.func @keys_of_other_patches(%q: !torch.vtensor<[64,2,16],f32>, %k: !torch.vtensor<[32,2,16],f32>, %v: !torch.vtensor<[32,2,16],f32>, %seg: !torch.vtensor<[64],si64>) -> !torch.vtensor<[64,2,16],f32> {
  %scale = torch.constant.float 0.25
  // expected-error @+1 {{vision_attention: shapes disagree: q [64,2,16], k [32,2,16], v [32,2,16], segments [64], result [64,2,16]}}
  %o = torch.operator "torch.day0.vision_attention"(%q, %k, %v, %seg, %scale) : (!torch.vtensor<[64,2,16],f32>, !torch.vtensor<[32,2,16],f32>, !torch.vtensor<[32,2,16],f32>, !torch.vtensor<[64],si64>, !torch.float) -> !torch.vtensor<[64,2,16],f32>
  return %o : !torch.vtensor<[64,2,16],f32>
}
