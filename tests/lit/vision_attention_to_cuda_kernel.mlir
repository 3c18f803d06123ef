// RUN: day0-opt %s --pass-pipeline='builtin.module(vision-attention-to-cuda-kernel)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(vision-attention-to-cuda-kernel{terms=2})' | filecheck %s --check-prefix=TWO

// CHECK-NOT: torch.day0.vision_attention
// q, k, v and segments read-only, the output written; P, H and the scale's bits as constants.
// CHECK: #pipeline_layout = #hal.pipeline.layout<constants = 3, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>

// The release tower's attention at a 448² image: 1024 patches, 16 heads of 64.
func.func @encode_image_1024(%q: !torch.vtensor<[1024,16,64],f32>, %k: !torch.vtensor<[1024,16,64],f32>, %v: !torch.vtensor<[1024,16,64],f32>, %seg: !torch.vtensor<[1024],si64>) -> !torch.vtensor<[1024,16,64],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.vision_attention"(%q, %k, %v, %seg, %scale) : (!torch.vtensor<[1024,16,64],f32>, !torch.vtensor<[1024,16,64],f32>, !torch.vtensor<[1024,16,64],f32>, !torch.vtensor<[1024],si64>, !torch.float) -> !torch.vtensor<[1024,16,64],f32>
  return %o : !torch.vtensor<[1024,16,64],f32>
}
// CHECK-LABEL: func.func @encode_image_1024(
// CHECK: [[Q:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[1024,16,64],f32> -> tensor<1024x16x64xf32>
// CHECK: [[K:%.+]] = torch_c.to_builtin_tensor %arg1
// CHECK: [[V:%.+]] = torch_c.to_builtin_tensor %arg2
// CHECK: [[S:%.+]] = torch_c.to_builtin_tensor %arg3 : !torch.vtensor<[1024],si64> -> tensor<1024xi64>
// CHECK: [[O:%.+]] = call @day0_vision_attention_P1024_H16_D64_t1_s3e000000([[Q]], [[K]], [[V]], [[S]])
// CHECK: torch_c.from_builtin_tensor [[O]] : tensor<1024x16x64xf32> -> !torch.vtensor<[1024,16,64],f32>
// TWO: call @day0_vision_attention_P1024_H16_D64_t2_s3e000000(

// The function: q, k, v each as stacked bf16 terms [terms, P, H, D], one dispatch over
// (ceil(P / 128), H) = (8, 16).
// CHECK: hal.executable.source private @day0_vision_attention
// CHECK: func.func private @day0_vision_attention_P1024_H16_D64_t1_s3e000000(%[[q:.+]]: tensor<1024x16x64xf32>, %[[k:.+]]: tensor<1024x16x64xf32>, %[[v:.+]]: tensor<1024x16x64xf32>, %[[seg:.+]]: tensor<1024xi64>) -> tensor<1024x16x64xf32>
// CHECK: %[[qs:.+]] = linalg.generic {{.*}} ins(%[[q]] : tensor<1024x16x64xf32>) outs({{.*}} : tensor<1x1024x16x64xbf16>)
// CHECK: %[[ks:.+]] = linalg.generic {{.*}} ins(%[[k]] : tensor<1024x16x64xf32>) outs({{.*}} : tensor<1x1024x16x64xbf16>)
// CHECK: %[[vs:.+]] = linalg.generic {{.*}} ins(%[[v]] : tensor<1024x16x64xf32>) outs({{.*}} : tensor<1x1024x16x64xbf16>)
// (the constants: grid 8 × 16, P 1024, H 16, the scale 0.125's bits)
// CHECK: flow.dispatch @day0_vision_attention::@day0_vision_attention_d64_t1[%c8, %c16](%c1024_i32, %c16_i32, %c1040187392_i32, %[[qs]], %[[ks]], %[[vs]], %[[seg]]) : (i32, i32, i32, tensor<1x1024x16x64xbf16>, tensor<1x1024x16x64xbf16>, tensor<1x1024x16x64xbf16>, tensor<1024xi64>) -> tensor<1024x16x64xf32>
// TWO: outs({{.*}} : tensor<2x1024x16x64xbf16>)
// TWO: flow.dispatch @day0_vision_attention::@day0_vision_attention_d64_t2
