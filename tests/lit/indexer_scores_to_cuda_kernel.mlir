// RUN: day0-opt %s --pass-pipeline='builtin.module(indexer-scores-to-cuda-kernel)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(indexer-scores-to-cuda-kernel)' | filecheck %s --check-prefix=GONE
// RUN: day0-opt %s --pass-pipeline='builtin.module(indexer-scores-to-cuda-kernel{tensor-cores=false})' | filecheck %s --check-prefix=EXACT

// GONE-NOT: torch.day0.indexer_scores
// GONE: hal.executable.source private @day0_indexer_scores
// GONE-NOT: torch.day0.indexer_scores

// q, keys, weights read-only, scores written; H, D, T and the scale's bits as constants.
// CHECK: #pipeline_layout = #hal.pipeline.layout<constants = 5, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>
// The rows form: q, pool, rows, weights read-only.
// CHECK: #pipeline_layout1 = #hal.pipeline.layout<constants = 4, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>
// The causal form: q, cache, rows, last, weights read-only; S a constant again.
// CHECK: #pipeline_layout2 = #hal.pipeline.layout<constants = 5, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>

// Decode: one query over a static cache of 1024 f32 keys.
func.func @decode(%q: !torch.vtensor<[1,16,64],f32>, %k: !torch.vtensor<[1024,64],f32>, %w: !torch.vtensor<[1,16],f32>) -> !torch.vtensor<[1,1024],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.indexer_scores"(%q, %k, %w, %scale) : (!torch.vtensor<[1,16,64],f32>, !torch.vtensor<[1024,64],f32>, !torch.vtensor<[1,16],f32>, !torch.float) -> !torch.vtensor<[1,1024],f32>
  return %o : !torch.vtensor<[1,1024],f32>
}
// CHECK-LABEL: func.func @decode(
// CHECK-NOT: torch.constant.float
// CHECK: [[Q:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[1,16,64],f32> -> tensor<1x16x64xf32>
// CHECK: [[K:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[1024,64],f32> -> tensor<1024x64xf32>
// CHECK: [[W:%.+]] = torch_c.to_builtin_tensor %arg2 : !torch.vtensor<[1,16],f32> -> tensor<1x16xf32>
// CHECK: [[QC:%.+]] = tensor.cast [[Q]] : tensor<1x16x64xf32> to tensor<?x16x64xf32>
// CHECK: [[WC:%.+]] = tensor.cast [[W]] : tensor<1x16xf32> to tensor<?x16xf32>
// CHECK: [[O:%.+]] = call @day0_indexer_scores_f32_H16_D64_T1024_s3e000000([[QC]], [[K]], [[WC]])
// CHECK: tensor.cast [[O]] : tensor<?x1024xf32> to tensor<1x1024xf32>

// Prefill over its own keys: S and T dynamic, bf16 keys (the tensor-core kernel by default).
func.func @prefill(%q: !torch.vtensor<[?,16,64],f32>, %k: !torch.vtensor<[?,64],bf16>, %w: !torch.vtensor<[?,16],f32>) -> !torch.vtensor<[?,?],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.indexer_scores"(%q, %k, %w, %scale) : (!torch.vtensor<[?,16,64],f32>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[?,16],f32>, !torch.float) -> !torch.vtensor<[?,?],f32>
  return %o : !torch.vtensor<[?,?],f32>
}
// CHECK-LABEL: func.func @prefill(
// CHECK: call @day0_indexer_scores_bf16_mma_H16_D64_Tq_s3e000000({{.*}}) : (tensor<?x16x64xf32>, tensor<?x64xbf16>, tensor<?x16xf32>) -> tensor<?x?xf32>
// EXACT-LABEL: func.func @prefill(
// EXACT: call @day0_indexer_scores_bf16_H16_D64_Tq_s3e000000({{.*}}) : (tensor<?x16x64xf32>, tensor<?x64xbf16>, tensor<?x16xf32>) -> tensor<?x?xf32>

// Decode over a static cache of 100000 bf16 keys.
func.func @decode_bf16(%q: !torch.vtensor<[1,32,128],f32>, %k: !torch.vtensor<[100000,128],bf16>, %w: !torch.vtensor<[1,32],f32>) -> !torch.vtensor<[1,100000],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.indexer_scores"(%q, %k, %w, %scale) : (!torch.vtensor<[1,32,128],f32>, !torch.vtensor<[100000,128],bf16>, !torch.vtensor<[1,32],f32>, !torch.float) -> !torch.vtensor<[1,100000],f32>
  return %o : !torch.vtensor<[1,100000],f32>
}
// CHECK-LABEL: func.func @decode_bf16(
// CHECK: call @day0_indexer_scores_bf16_mma_H32_D128_T100000_s3e000000(
// EXACT-LABEL: func.func @decode_bf16(
// EXACT: call @day0_indexer_scores_bf16_H32_D128_T100000_s3e000000(

// A batched decode step over a paged pool: 4 queries, each over its own 256 rows of a pool of any
// row count (the rows form, read in place).
func.func @paged_decode(%q: !torch.vtensor<[4,16,64],f32>, %k: !torch.vtensor<[?,64],bf16>, %r: !torch.vtensor<[4,256],si64>, %w: !torch.vtensor<[4,16],f32>) -> !torch.vtensor<[4,256],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.indexer_scores_rows"(%q, %k, %r, %w, %scale) : (!torch.vtensor<[4,16,64],f32>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[4,256],si64>, !torch.vtensor<[4,16],f32>, !torch.float) -> !torch.vtensor<[4,256],f32>
  return %o : !torch.vtensor<[4,256],f32>
}
// CHECK-LABEL: func.func @paged_decode(
// CHECK: [[K:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[?,64],bf16> -> tensor<?x64xbf16>
// CHECK: [[R:%.+]] = torch_c.to_builtin_tensor %arg2 : !torch.vtensor<[4,256],si64> -> tensor<4x256xi64>
// CHECK: [[RC:%.+]] = tensor.cast [[R]] : tensor<4x256xi64> to tensor<?x256xi64>
// CHECK: [[O:%.+]] = call @day0_indexer_scores_rows_bf16_mma_H16_D64_T256_s3e000000({{%.+}}, [[K]], [[RC]], {{%.+}}) : (tensor<?x16x64xf32>, tensor<?x64xbf16>, tensor<?x256xi64>, tensor<?x16xf32>) -> tensor<?x256xf32>
// CHECK: tensor.cast [[O]] : tensor<?x256xf32> to tensor<4x256xf32>
// EXACT-LABEL: func.func @paged_decode(
// EXACT: call @day0_indexer_scores_rows_bf16_H16_D64_T256_s3e000000(

// The same with a static pool of f32 keys and a dynamic batch and key range.
func.func @paged_decode_dynamic(%q: !torch.vtensor<[?,16,64],f32>, %k: !torch.vtensor<[4096,64],f32>, %r: !torch.vtensor<[?,?],si64>, %w: !torch.vtensor<[?,16],f32>) -> !torch.vtensor<[?,?],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.indexer_scores_rows"(%q, %k, %r, %w, %scale) : (!torch.vtensor<[?,16,64],f32>, !torch.vtensor<[4096,64],f32>, !torch.vtensor<[?,?],si64>, !torch.vtensor<[?,16],f32>, !torch.float) -> !torch.vtensor<[?,?],f32>
  return %o : !torch.vtensor<[?,?],f32>
}
// CHECK-LABEL: func.func @paged_decode_dynamic(
// CHECK: [[K:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[4096,64],f32> -> tensor<4096x64xf32>
// CHECK: [[KC:%.+]] = tensor.cast [[K]] : tensor<4096x64xf32> to tensor<?x64xf32>
// CHECK: call @day0_indexer_scores_rows_f32_H16_D64_Tq_s3e000000({{%.+}}, [[KC]], {{%.+}}, {{%.+}}) : (tensor<?x16x64xf32>, tensor<?x64xf32>, tensor<?x?xi64>, tensor<?x16xf32>) -> tensor<?x?xf32>

// A prompt chunk over its sequence's key range (the causal form): 512 queries, the slots' rows of a
// pool of any row count, each query's last visible slot; the grid as for one key range.
func.func @paged_chunk(%q: !torch.vtensor<[512,16,64],f32>, %k: !torch.vtensor<[?,64],bf16>, %r: !torch.vtensor<[?],si64>, %l: !torch.vtensor<[512],si64>, %w: !torch.vtensor<[512,16],f32>) -> !torch.vtensor<[512,?],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.indexer_scores_causal"(%q, %k, %r, %l, %w, %scale) : (!torch.vtensor<[512,16,64],f32>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[?],si64>, !torch.vtensor<[512],si64>, !torch.vtensor<[512,16],f32>, !torch.float) -> !torch.vtensor<[512,?],f32>
  return %o : !torch.vtensor<[512,?],f32>
}
// CHECK-LABEL: func.func @paged_chunk(
// CHECK: [[L:%.+]] = torch_c.to_builtin_tensor %arg3 : !torch.vtensor<[512],si64> -> tensor<512xi64>
// CHECK: [[LC:%.+]] = tensor.cast [[L]] : tensor<512xi64> to tensor<?xi64>
// CHECK: [[O:%.+]] = call @day0_indexer_scores_causal_bf16_mma_H16_D64_Tq_s3e000000({{%.+}}, {{%.+}}, {{%.+}}, [[LC]], {{%.+}}) : (tensor<?x16x64xf32>, tensor<?x64xbf16>, tensor<?xi64>, tensor<?xi64>, tensor<?x16xf32>) -> tensor<?x?xf32>
// CHECK: tensor.cast [[O]] : tensor<?x?xf32> to tensor<512x?xf32>
// EXACT-LABEL: func.func @paged_chunk(
// EXACT: call @day0_indexer_scores_causal_bf16_H16_D64_Tq_s3e000000(

// A dense decode step over a static cache: the causal form with a static key range of 1024 + 8 slots.
func.func @dense_decode(%q: !torch.vtensor<[1,16,64],f32>, %k: !torch.vtensor<[1024,64],bf16>, %r: !torch.vtensor<[1032],si64>, %l: !torch.vtensor<[1],si64>, %w: !torch.vtensor<[1,16],f32>) -> !torch.vtensor<[1,1032],f32> {
  %scale = torch.constant.float 0.125
  %o = torch.operator "torch.day0.indexer_scores_causal"(%q, %k, %r, %l, %w, %scale) : (!torch.vtensor<[1,16,64],f32>, !torch.vtensor<[1024,64],bf16>, !torch.vtensor<[1032],si64>, !torch.vtensor<[1],si64>, !torch.vtensor<[1,16],f32>, !torch.float) -> !torch.vtensor<[1,1032],f32>
  return %o : !torch.vtensor<[1,1032],f32>
}
// CHECK-LABEL: func.func @dense_decode(
// CHECK: call @day0_indexer_scores_causal_bf16_mma_H16_D64_T1032_s3e000000({{.*}}) : (tensor<?x16x64xf32>, tensor<?x64xbf16>, tensor<1032xi64>, tensor<?xi64>, tensor<?x16xf32>) -> tensor<?x1032xf32>

// CHECK: hal.executable.source private @day0_indexer_scores
// CHECK: hal.executable.export public @day0_indexer_scores_f32 ordinal(0)
// CHECK: hal.executable.export public @day0_indexer_scores_bf16 ordinal(1)
// CHECK: hal.executable.export public @day0_indexer_scores_bf16_mma ordinal(2)
// CHECK: hal.executable.export public @day0_indexer_scores_rows_f32 ordinal(3) layout(#pipeline_layout1)
// CHECK: hal.executable.export public @day0_indexer_scores_rows_bf16 ordinal(4)
// CHECK: hal.executable.export public @day0_indexer_scores_rows_bf16_mma ordinal(5)
// CHECK: hal.executable.export public @day0_indexer_scores_causal_f32 ordinal(6) layout(#pipeline_layout2)
// CHECK: hal.executable.export public @day0_indexer_scores_causal_bf16 ordinal(7)
// CHECK: hal.executable.export public @day0_indexer_scores_causal_bf16_mma ordinal(8)

// Dynamic keys, tensor cores: the grid's x is min(ceil(T / 128), max(264, ceil(T / 2048))) at run time,
// its y ceil(S / 4): a CTA takes the 4 queries whose 16 heads fill its 8 q units; S goes as a constant.
// CHECK-LABEL: func.func private @day0_indexer_scores_bf16_mma_H16_D64_Tq_s3e000000(
// CHECK: [[S:%.+]] = tensor.dim %arg0, %c0 : tensor<?x16x64xf32>
// CHECK: [[GY:%.+]] = arith.ceildivui [[S]], %c4 : index
// CHECK: [[S32:%.+]] = arith.index_cast [[S]] : index to i32
// CHECK: [[T:%.+]] = tensor.dim %arg1, %c0 : tensor<?x64xbf16>
// CHECK: [[GX0:%.+]] = arith.ceildivui [[T]], %c128 : index
// CHECK: [[LONG:%.+]] = arith.ceildivui [[T]], %c2048 : index
// CHECK: [[CAP:%.+]] = arith.maxui %c264, [[LONG]] : index
// CHECK: [[GX:%.+]] = arith.minui [[GX0]], [[CAP]] : index
// CHECK: [[T32:%.+]] = arith.index_cast [[T]] : index to i32
// CHECK: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_bf16_mma[[[GX]], [[GY]]](%c16_i32, %c64_i32, [[T32]], %c1040187392_i32, [[S32]], %arg0, %arg1, %arg2) : ({{.*}}) -> tensor<?x?xf32>{[[S]], [[T]]}

// Static keys, tensor cores: min(ceil(100000 / 128), max(264, ceil(100000 / 2048))) = 264 CTAs per
// 2 queries (32 heads: 4 units a query).
// CHECK-LABEL: func.func private @day0_indexer_scores_bf16_mma_H32_D128_T100000_s3e000000(
// CHECK: [[GY:%.+]] = arith.ceildivui %dim, %c2 : index
// CHECK: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_bf16_mma[%c264, [[GY]]](%c32_i32, %c128_i32, %c100000_i32, %c1040187392_i32, {{%.+}}, %arg0, %arg1, %arg2)

// A static key range: its grid x a constant, the rows without a dynamic size.
// CHECK-LABEL: func.func private @day0_indexer_scores_causal_bf16_mma_H16_D64_T1032_s3e000000(
// CHECK: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_causal_bf16_mma[%c9, {{%.+}}](%c16_i32, %c64_i32, %c1032_i32, {{.*}}) : ({{.*}}, tensor<1032xi64>, tensor<?xi64>{{.*}}) -> tensor<?x1032xf32>

// The causal form: the key count from the rows (dim 0), 4 queries a CTA as for one key range; the
// queries' last slots [S] pass with the query count.
// CHECK-LABEL: func.func private @day0_indexer_scores_causal_bf16_mma_H16_D64_Tq_s3e000000(
// CHECK: [[S:%.+]] = tensor.dim %arg0, %c0 : tensor<?x16x64xf32>
// CHECK: [[N:%.+]] = tensor.dim %arg1, %c0 : tensor<?x64xbf16>
// CHECK: [[GY:%.+]] = arith.ceildivui [[S]], %c4 : index
// CHECK: [[S32:%.+]] = arith.index_cast [[S]] : index to i32
// CHECK: [[T:%.+]] = tensor.dim %arg2, %c0 : tensor<?xi64>
// CHECK: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_causal_bf16_mma[{{%.+}}, [[GY]]](%c16_i32, %c64_i32, {{%.+}}, %c1040187392_i32, [[S32]], %arg0, %arg1, %arg2, %arg3, %arg4) : (i32, i32, i32, i32, i32, tensor<?x16x64xf32>{[[S]]}, tensor<?x64xbf16>{[[N]]}, tensor<?xi64>{[[T]]}, tensor<?xi64>{[[S]]}, tensor<?x16xf32>{[[S]]}) -> tensor<?x?xf32>{[[S]], [[T]]}

// tensor-cores=false: the exact kernel, grid x = ceil(T / 128).
// EXACT-LABEL: func.func private @day0_indexer_scores_bf16_H16_D64_Tq_s3e000000(
// EXACT: [[S:%.+]] = tensor.dim %arg0, %c0 : tensor<?x16x64xf32>
// EXACT: [[T:%.+]] = tensor.dim %arg1, %c0 : tensor<?x64xbf16>
// EXACT: [[GX:%.+]] = arith.ceildivui [[T]], %c128 : index
// EXACT: [[T32:%.+]] = arith.index_cast [[T]] : index to i32
// EXACT: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_bf16[[[GX]], {{%.+}}](%c16_i32, %c64_i32, [[T32]], %c1040187392_i32, {{%.+}}, %arg0, %arg1, %arg2) : ({{.*}}) -> tensor<?x?xf32>{[[S]], [[T]]}
// EXACT-LABEL: func.func private @day0_indexer_scores_bf16_H32_D128_T100000_s3e000000(
// EXACT: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_bf16[%c782, {{%.+}}]

// Static keys: 1024 / 128 = 8 CTAs per query.
// CHECK-LABEL: func.func private @day0_indexer_scores_f32_H16_D64_T1024_s3e000000(
// CHECK: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_f32[%c8, {{%.+}}](%c16_i32, %c64_i32, %c1024_i32, %c1040187392_i32, {{%.+}}, %arg0, %arg1, %arg2)

// The rows form's key count comes from the rows (dim 1), the pool's rows pass as they are.
// CHECK-LABEL: func.func private @day0_indexer_scores_rows_f32_H16_D64_Tq_s3e000000(
// CHECK: [[S:%.+]] = tensor.dim %arg0, %c0 : tensor<?x16x64xf32>
// CHECK: [[N:%.+]] = tensor.dim %arg1, %c0 : tensor<?x64xf32>
// CHECK: [[T:%.+]] = tensor.dim %arg2, %c1 : tensor<?x?xi64>
// CHECK: flow.dispatch @day0_indexer_scores::@day0_indexer_scores_rows_f32[{{%.+}}, [[S]]]({{.*}}, %arg0, %arg1, %arg2, %arg3) : (i32, i32, i32, i32, tensor<?x16x64xf32>{[[S]]}, tensor<?x64xf32>{[[N]]}, tensor<?x?xi64>{[[S]], [[T]]}, tensor<?x16xf32>{[[S]]}) -> tensor<?x?xf32>{[[S]], [[T]]}
