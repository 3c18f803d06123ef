// RUN: day0-opt %s --pass-pipeline='builtin.module(moe-route-to-cuda-kernel)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(moe-route-to-cuda-kernel)' | filecheck %s --check-prefix=GONE

// GONE-NOT: torch.day0.moe_route
// GONE: hal.executable.source private @day0_moe_route
// GONE-NOT: torch.day0.moe_route

// logits and bias read-only, weights and experts written; S, E, groups, topk_group, top_k,
// normalize and the scaling's bits as constants.
// CHECK: #pipeline_layout = #hal.pipeline.layout<constants = 7, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>, #hal.pipeline.binding<storage_buffer>]>

// A batched decode step: 4 tokens, 64 experts in 8 groups, the best 4 groups, 8 experts.
func.func @decode(%x: !torch.vtensor<[4,64],f32>, %b: !torch.vtensor<[64],f32>) -> (!torch.vtensor<[4,8],f32>, !torch.vtensor<[4,8],si64>) {
  %groups = torch.constant.int 8
  %topk_group = torch.constant.int 4
  %k = torch.constant.int 8
  %norm = torch.constant.bool true
  %scaling = torch.constant.float 2.5
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[4,64],f32>, !torch.vtensor<[64],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[4,8],f32>, !torch.vtensor<[4,8],si64>)
  return %w, %e : !torch.vtensor<[4,8],f32>, !torch.vtensor<[4,8],si64>
}
// CHECK-LABEL: func.func @decode(
// CHECK: [[X:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[4,64],f32> -> tensor<4x64xf32>
// CHECK: [[XC:%.+]] = tensor.cast [[X]] : tensor<4x64xf32> to tensor<?x64xf32>
// CHECK: [[B:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[64],f32> -> tensor<64xf32>
// CHECK: [[R:%.+]]:2 = call @day0_moe_route_E64_G8_g4_k8_n1_s40200000([[XC]], [[B]]) : (tensor<?x64xf32>, tensor<64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi64>)
// CHECK: [[W:%.+]] = tensor.cast [[R]]#0 : tensor<?x8xf32> to tensor<4x8xf32>
// CHECK: [[E:%.+]] = tensor.cast [[R]]#1 : tensor<?x8xi64> to tensor<4x8xi64>
// CHECK: torch_c.from_builtin_tensor [[W]] : tensor<4x8xf32> -> !torch.vtensor<[4,8],f32>
// CHECK: torch_c.from_builtin_tensor [[E]] : tensor<4x8xi64> -> !torch.vtensor<[4,8],si64>

// Prefill: a dynamic token count, one group (plain top-k), no normalization.
func.func @prefill(%x: !torch.vtensor<[?,8],f32>, %b: !torch.vtensor<[8],f32>) -> (!torch.vtensor<[?,2],f32>, !torch.vtensor<[?,2],si64>) {
  %groups = torch.constant.int 1
  %topk_group = torch.constant.int 1
  %k = torch.constant.int 2
  %norm = torch.constant.bool false
  %scaling = torch.constant.float 1.0
  %w, %e = torch.operator "torch.day0.moe_route"(%x, %b, %groups, %topk_group, %k, %norm, %scaling) : (!torch.vtensor<[?,8],f32>, !torch.vtensor<[8],f32>, !torch.int, !torch.int, !torch.int, !torch.bool, !torch.float) -> (!torch.vtensor<[?,2],f32>, !torch.vtensor<[?,2],si64>)
  return %w, %e : !torch.vtensor<[?,2],f32>, !torch.vtensor<[?,2],si64>
}
// CHECK-LABEL: func.func @prefill(
// CHECK-NOT: tensor.cast
// CHECK: call @day0_moe_route_E8_G1_g1_k2_n0_s3f800000({{.*}}) : (tensor<?x8xf32>, tensor<8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
// CHECK-NOT: tensor.cast
// CHECK: return

// One function a distinct routing; a warp a token, 8 tokens a CTA.
// CHECK-LABEL: func.func private @day0_moe_route_E64_G8_g4_k8_n1_s40200000(
// CHECK: %[[S:.+]] = tensor.dim %arg0, %c0 : tensor<?x64xf32>
// CHECK: %[[GX:.+]] = arith.ceildivui %[[S]], %c8 : index
// CHECK: flow.dispatch @day0_moe_route::@day0_moe_route[%[[GX]]](
// CHECK-SAME: -> (tensor<?x8xf32>{%[[S]]}, tensor<?x8xi64>{%[[S]]})
// CHECK-LABEL: func.func private @day0_moe_route_E8_G1_g1_k2_n0_s3f800000(
