// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-cuda-kernel{split-scores=false})' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-cuda-kernel)' | filecheck %s --check-prefix=GONE
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-cuda-kernel{tensor-cores=false})' | filecheck %s --check-prefix=FMA
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-cuda-kernel)' | filecheck %s --check-prefix=SPLIT

// tensor-cores=false: every site on the f32-arithmetic kernels (bf16 decode: 1 split of 128
// slots, 4 groups of 4 heads).
// FMA-NOT: _bf16_mma[
// FMA-LABEL: func.func private @day0_dsa_bf16_H16_D72_T100_K100_V64_s3e000000(
// FMA: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16[%c1, %c4, %dim]
// FMA: flow.dispatch @day0_dsa_attention::@day0_dsa_combine_bf16[%c16, %dim]
// FMA-SAME: -> tensor<?x16x64xf32>{%dim}
// FMA-LABEL: func.func private @day0_dsa_bf16_H4_D64_T32_K16_V64_s3f000000(
// FMA: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16[%c1, %c1{{.*}}, %dim]
// FMA-NOT: _bf16_mma[

// GONE-NOT: torch.day0.dsa_attention
// GONE: hal.executable.source private @day0_dsa_attention
// GONE-NOT: torch.day0.dsa_attention

// The partial kernel: q, kv, indices read-only; (m, l) and acc written; 6 constants (the
// tensor-core one: 7, with the slots per split). The combine kernels: the partials read-only, the
// output written; 3 constants.
// CHECK: #pipeline_layout = #hal.pipeline.layout<constants = 6, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>, #hal.pipeline.binding<storage_buffer>]>
// CHECK: #pipeline_layout1 = #hal.pipeline.layout<constants = 3, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>
// CHECK: #pipeline_layout2 = #hal.pipeline.layout<constants = 7, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>, #hal.pipeline.binding<storage_buffer>]>

// Decode (S = 1, f32): static shapes are cast to the function's dynamic S and back; the scale
// and value_dim constants go away with the op.
func.func @decode(%q: !torch.vtensor<[1,8,96],f32>, %kv: !torch.vtensor<[64,96],f32>, %idx: !torch.vtensor<[1,300],si64>) -> !torch.vtensor<[1,8,64],f32> {
  %scale = torch.constant.float 0.125
  %v = torch.constant.int 64
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[1,8,96],f32>, !torch.vtensor<[64,96],f32>, !torch.vtensor<[1,300],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,8,64],f32>
  return %o : !torch.vtensor<[1,8,64],f32>
}
// CHECK-LABEL: func.func @decode(
// CHECK-NOT: torch.constant
// CHECK: [[Q:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[1,8,96],f32> -> tensor<1x8x96xf32>
// CHECK: [[KV:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[64,96],f32> -> tensor<64x96xf32>
// CHECK: [[I:%.+]] = torch_c.to_builtin_tensor %arg2 : !torch.vtensor<[1,300],si64> -> tensor<1x300xi64>
// CHECK: [[QC:%.+]] = tensor.cast [[Q]] : tensor<1x8x96xf32> to tensor<?x8x96xf32>
// CHECK: [[IC:%.+]] = tensor.cast [[I]] : tensor<1x300xi64> to tensor<?x300xi64>
// CHECK: [[O:%.+]] = call @day0_dsa_f32_H8_D96_T64_K300_V64_s3e000000([[QC]], [[KV]], [[IC]])
// CHECK: tensor.cast [[O]] : tensor<?x8x64xf32> to tensor<1x8x64xf32>

// Prefill (dynamic S, bf16 q and kv, si32 indices widened to si64 first). The result is f32
// for either dtype (the combine kernels write f32).
func.func @prefill(%q: !torch.vtensor<[?,4,64],bf16>, %kv: !torch.vtensor<[32,64],bf16>, %idx: !torch.vtensor<[?,16],si32>) -> !torch.vtensor<[?,4,64],f32> {
  %scale = torch.constant.float 0.5
  %v = torch.constant.int 64
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[?,4,64],bf16>, !torch.vtensor<[32,64],bf16>, !torch.vtensor<[?,16],si32>, !torch.float, !torch.int) -> !torch.vtensor<[?,4,64],f32>
  return %o : !torch.vtensor<[?,4,64],f32>
}
// CHECK-LABEL: func.func @prefill(
// CHECK: [[I64:%.+]] = torch.aten.to.dtype %arg2, %int4, {{.*}} -> !torch.vtensor<[?,16],si64>
// CHECK: [[IB:%.+]] = torch_c.to_builtin_tensor [[I64]] : !torch.vtensor<[?,16],si64> -> tensor<?x16xi64>
// CHECK: [[Y:%.+]] = call @day0_dsa_bf16_H4_D64_T32_K16_V64_s3f000000_r128({{.*}}, {{.*}}, [[IB]]) : (tensor<?x4x64xbf16>, tensor<32x64xbf16>, tensor<?x16xi64>) -> tensor<?x4x64xf32>
// CHECK: torch_c.from_builtin_tensor [[Y]] : tensor<?x4x64xf32> -> !torch.vtensor<[?,4,64],f32>

// bf16 decode (static S = 1): the tensor-core kernels with 32 slots per split.
func.func @decode_bf16(%q: !torch.vtensor<[1,16,72],bf16>, %kv: !torch.vtensor<[100,72],bf16>, %idx: !torch.vtensor<[1,100],si64>) -> !torch.vtensor<[1,16,64],f32> {
  %scale = torch.constant.float 0.125
  %v = torch.constant.int 64
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[1,16,72],bf16>, !torch.vtensor<[100,72],bf16>, !torch.vtensor<[1,100],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,16,64],f32>
  return %o : !torch.vtensor<[1,16,64],f32>
}
// CHECK-LABEL: func.func @decode_bf16(
// CHECK: [[Y:%.+]] = call @day0_dsa_bf16_H16_D72_T100_K100_V64_s3e000000_r32({{.*}}) : (tensor<?x16x72xbf16>, tensor<100x72xbf16>, tensor<?x100xi64>) -> tensor<?x16x64xf32>
// CHECK: [[YC:%.+]] = tensor.cast [[Y]] : tensor<?x16x64xf32> to tensor<1x16x64xf32>
// CHECK: torch_c.from_builtin_tensor [[YC]] : tensor<1x16x64xf32> -> !torch.vtensor<[1,16,64],f32>

// bf16 with D % 8 != 0: the f32-arithmetic kernels.
func.func @odd_bf16(%q: !torch.vtensor<[1,4,60],bf16>, %kv: !torch.vtensor<[50,60],bf16>, %idx: !torch.vtensor<[1,20],si64>) -> !torch.vtensor<[1,4,32],f32> {
  %scale = torch.constant.float 0.125
  %v = torch.constant.int 32
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[1,4,60],bf16>, !torch.vtensor<[50,60],bf16>, !torch.vtensor<[1,20],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,4,32],f32>
  return %o : !torch.vtensor<[1,4,32],f32>
}
// CHECK-LABEL: func.func @odd_bf16(
// CHECK: call @day0_dsa_bf16_H4_D60_T50_K20_V32_s3e000000(

// A paged pool (models/paging.py): T is the pool's row count, chosen at load, so dynamic; the
// kernels take it as their T push constant, read from the tensor at run time.
func.func @paged_pool(%q: !torch.vtensor<[3,4,64],bf16>, %kv: !torch.vtensor<[?,64],bf16>, %idx: !torch.vtensor<[3,16],si64>) -> !torch.vtensor<[3,4,64],f32> {
  %scale = torch.constant.float 0.125
  %v = torch.constant.int 64
  %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %v) : (!torch.vtensor<[3,4,64],bf16>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[3,16],si64>, !torch.float, !torch.int) -> !torch.vtensor<[3,4,64],f32>
  return %o : !torch.vtensor<[3,4,64],f32>
}
// CHECK-LABEL: func.func @paged_pool(
// CHECK: call @day0_dsa_bf16_H4_D64_Tdyn_K16_V64_s3e000000_r128({{.*}}) : (tensor<?x4x64xbf16>, tensor<?x64xbf16>, tensor<?x16xi64>) -> tensor<?x4x64xf32>

// CHECK: hal.executable.source private @day0_dsa_attention <objects = <{#executable_target_cuda_nvptx_fb = [#hal.executable.object<{path = "dsa_attention.sm_90.ptx", data = dense<"0x{{[0-9A-F]+}}">
// CHECK: hal.executable.export public @day0_dsa_partial_f32 ordinal(0) layout(#pipeline_layout) count({{.*}}: !hal.device, [[X:%.+]]: index, [[Y:%.+]]: index, [[Z:%.+]]: index)
// CHECK: hal.return [[X]], [[Y]], [[Z]] : index, index, index
// CHECK: hal.executable.export public @day0_dsa_combine_f32 ordinal(1) layout(#pipeline_layout1)
// CHECK: hal.executable.export public @day0_dsa_partial_bf16 ordinal(2)
// CHECK: hal.executable.export public @day0_dsa_combine_bf16 ordinal(3)
// CHECK: hal.executable.export public @day0_dsa_partial_bf16_mma ordinal(4) layout(#pipeline_layout2) count({{.*}}: !hal.device, [[X:%.+]]: index, [[Y:%.+]]: index, [[Z:%.+]]: index)
// CHECK: hal.executable.export public @day0_dsa_partial_bf16_mma_vp2 ordinal(5) layout(#pipeline_layout2)
// CHECK: hal.executable.export public @day0_dsa_partial_bf16_mma_vp4 ordinal(6) layout(#pipeline_layout2)
// CHECK: hal.executable.export public @day0_dsa_partial_bf16_mma_vp8 ordinal(7) layout(#pipeline_layout2)
// CHECK: hal.executable.export public @day0_dsa_combine_bf16_mma ordinal(8) layout(#pipeline_layout1) count({{.*}}: !hal.device, [[X:%.+]]: index, [[Y:%.+]]: index, [[Z:%.+]]: index)
// CHECK: hal.return [[X]], [[Y]], [[Z]] : index, index, index

// (the functions in name order)
// bf16 decode, tensor cores: K = 100 -> 4 splits of 32 slots; combine grid (1, 16, S).
// CHECK-LABEL: func.func private @day0_dsa_bf16_H16_D72_T100_K100_V64_s3e000000_r32(
// CHECK: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16_mma[%c4, %c1{{.*}}, %dim](%c16_i32, %c72_i32, %c100_i32, %c64_i32, %c100_i32{{.*}}, %c1040187392_i32, %c32_i32, %arg0, %arg1, %arg2)
// CHECK-SAME: -> (tensor<?x4x16x2xf32>{%dim}, tensor<?x4x16x64xf32>{%dim})
// CHECK: flow.dispatch @day0_dsa_attention::@day0_dsa_combine_bf16_mma[%c1{{.*}}, %c16, %dim](%c16_i32, %c64_i32, %c4_i32,
// CHECK-SAME: -> tensor<?x16x64xf32>{%dim}
// CHECK-NEXT: return {{.*}} : tensor<?x16x64xf32>

// bf16, D % 8 != 0: the f32-arithmetic kernels, 1 split of 128 slots, 1 group of 4 heads.
// CHECK-LABEL: func.func private @day0_dsa_bf16_H4_D60_T50_K20_V32_s3e000000(
// CHECK: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16[%c1, %c1{{.*}}, %dim]
// CHECK: flow.dispatch @day0_dsa_attention::@day0_dsa_combine_bf16[%c4, %dim]
// CHECK-SAME: -> tensor<?x4x32xf32>{%dim}

// bf16 prefill, tensor cores: 1 split of 128 slots, 1 group of 64 heads, 7 constants (H, D, K,
// V, T, scale bits, rows); combine over (ceil(V/64), H, S).
// CHECK-LABEL: func.func private @day0_dsa_bf16_H4_D64_T32_K16_V64_s3f000000_r128(
// CHECK: [[S:%.+]] = tensor.dim %arg0, %c0 : tensor<?x4x64xbf16>
// CHECK: [[ML:%.+]]:2 = flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16_mma[%c1, %c1{{.*}}, [[S]]](%c4_i32, %c64_i32, %c16_i32, %c64_i32{{.*}}, %c32_i32, %c1056964608_i32, %c128_i32, %arg0, %arg1, %arg2) : ({{.*}}) -> (tensor<?x1x4x2xf32>{[[S]]}, tensor<?x1x4x64xf32>{[[S]]})
// CHECK: flow.dispatch @day0_dsa_attention::@day0_dsa_combine_bf16_mma[%c1{{.*}}, %c4, [[S]]]({{.*}}, %c1_i32, [[ML]]#0, [[ML]]#1) : ({{.*}}) -> tensor<?x4x64xf32>{[[S]]}

// the paged pool's function: T = the pool's rows, from tensor.dim, as the T push constant.
// CHECK-LABEL: func.func private @day0_dsa_bf16_H4_D64_Tdyn_K16_V64_s3e000000_r128(
// CHECK: [[T:%.+]] = tensor.dim %arg1, %c0 : tensor<?x64xbf16>
// CHECK: [[T32:%.+]] = arith.index_cast [[T]] : index to i32
// CHECK: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16_mma[{{.*}}]({{.*}}, [[T32]], {{.*}}, %arg0, %arg1, %arg2) : ({{.*}}, tensor<?x64xbf16>{[[T]]}, tensor<?x16xi64>{{.*}}

// f32 decode: K = 300 slots -> 3 splits of 128; 8 heads -> 2 groups; scale 0.125 as its f32 bits.
// CHECK-LABEL: func.func private @day0_dsa_f32_H8_D96_T64_K300_V64_s3e000000(
// CHECK: %c1040187392_i32 = arith.constant 1040187392 : i32
// CHECK: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_f32[%c3, %c2, %dim](%c8_i32, %c96_i32, %c300_i32, %c64_i32, %c64_i32{{.*}}, %c1040187392_i32, %arg0, %arg1, %arg2)
// CHECK-SAME: -> (tensor<?x3x8x2xf32>{%dim}, tensor<?x3x8x64xf32>{%dim})

// The default (split-scores=true): tensor-core sites of at most 32 heads take the partial whose
// head-group warps split the scores: 16 heads -> 2 groups of 4 warps (_vp4), 4 heads -> 1 group
// of 8 (_vp8); the same grids and push constants, the function names end in _vp<VP>.
// SPLIT-LABEL: func.func private @day0_dsa_bf16_H16_D72_T100_K100_V64_s3e000000_r32_vp4(
// SPLIT: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16_mma_vp4[%c4, %c1{{.*}}, %dim](%c16_i32, %c72_i32, %c100_i32, %c64_i32, %c100_i32{{.*}}, %c1040187392_i32, %c32_i32, %arg0, %arg1, %arg2)
// SPLIT: flow.dispatch @day0_dsa_attention::@day0_dsa_combine_bf16_mma[
// SPLIT-LABEL: func.func private @day0_dsa_bf16_H4_D64_T32_K16_V64_s3f000000_r128_vp8(
// SPLIT: flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16_mma_vp8[%c1, %c1
