// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(moe-route-to-cuda-kernel)'

func.func @too_many_experts(%x: !torch.vtensor<[1,2048],f32>, %b: !torch.vtensor<[2048],f32>) -> (!torch.vtensor<[1,8],f32>, !torch.vtensor<[1,8],si64>) {
  %groups = torch.constant.int 8
  %topk_group = torch.constant.int 4
  %k = torch.constant.int 8
  %norm = torch.constant.bool true
  %scaling = torch.constant.float 1.0
  // expected-error @+1 {{moe_route: the CUDA kernel takes at most 1024 experts, got 2048}}
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[1,2048],f32>, !torch.vtensor<[2048],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[1,8],f32>, !torch.vtensor<[1,8],si64>)
  return %w, %e : !torch.vtensor<[1,8],f32>, !torch.vtensor<[1,8],si64>
}

// -----

func.func @groups_not_dividing(%x: !torch.vtensor<[1,60],f32>, %b: !torch.vtensor<[60],f32>) -> (!torch.vtensor<[1,8],f32>, !torch.vtensor<[1,8],si64>) {
  %groups = torch.constant.int 8
  %topk_group = torch.constant.int 4
  %k = torch.constant.int 8
  %norm = torch.constant.bool true
  %scaling = torch.constant.float 1.0
  // expected-error @+1 {{moe_route: the CUDA kernel takes 1 to 32 groups of at least 2 experts dividing E=60, got 8}}
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[1,60],f32>, !torch.vtensor<[60],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[1,8],f32>, !torch.vtensor<[1,8],si64>)
  return %w, %e : !torch.vtensor<[1,8],f32>, !torch.vtensor<[1,8],si64>
}

// -----

func.func @top_k_over_32(%x: !torch.vtensor<[1,64],f32>, %b: !torch.vtensor<[64],f32>) -> (!torch.vtensor<[1,40],f32>, !torch.vtensor<[1,40],si64>) {
  %groups = torch.constant.int 1
  %topk_group = torch.constant.int 1
  %k = torch.constant.int 40
  %norm = torch.constant.bool true
  %scaling = torch.constant.float 1.0
  // expected-error @+1 {{moe_route: the CUDA kernel takes top_k must be in [1, 32], got 40}}
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[64],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[1,40],f32>, !torch.vtensor<[1,40],si64>)
  return %w, %e : !torch.vtensor<[1,40],f32>, !torch.vtensor<[1,40],si64>
}

// -----

func.func @dynamic_experts(%x: !torch.vtensor<[1,?],f32>, %b: !torch.vtensor<[?],f32>) -> (!torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si64>) {
  %groups = torch.constant.int 1
  %topk_group = torch.constant.int 1
  %k = torch.constant.int 2
  %norm = torch.constant.bool true
  %scaling = torch.constant.float 1.0
  // expected-error @+1 {{moe_route: the expert count (logits' last dim) must be static}}
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[1,?],f32>, !torch.vtensor<[?],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si64>)
  return %w, %e : !torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si64>
}

// -----

func.func @experts_not_int64(%x: !torch.vtensor<[1,8],f32>, %b: !torch.vtensor<[8],f32>) -> (!torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si32>) {
  %groups = torch.constant.int 1
  %topk_group = torch.constant.int 1
  %k = torch.constant.int 2
  %norm = torch.constant.bool true
  %scaling = torch.constant.float 1.0
  // expected-error @+1 {{moe_route: logits, bias and weights must be f32 and experts si64, got f32, f32, f32, si32}}
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[1,8],f32>, !torch.vtensor<[8],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si32>)
  return %w, %e : !torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si32>
}

// -----

func.func @groups_not_constant(%x: !torch.vtensor<[1,8],f32>, %b: !torch.vtensor<[8],f32>, %groups: !torch.int) -> (!torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si64>) {
  %topk_group = torch.constant.int 1
  %k = torch.constant.int 2
  %norm = torch.constant.bool true
  %scaling = torch.constant.float 1.0
  // expected-error @+1 {{moe_route: groups must come from torch.constant.int}}
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[1,8],f32>, !torch.vtensor<[8],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si64>)
  return %w, %e : !torch.vtensor<[1,2],f32>, !torch.vtensor<[1,2],si64>
}
