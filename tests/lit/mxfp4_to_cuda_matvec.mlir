// RUN: day0-opt %s --pass-pipeline='builtin.module(mxfp4-to-cuda-matvec)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(mxfp4-to-cuda-matvec)' | filecheck %s --check-prefix=GONE
// RUN: day0-opt %s --pass-pipeline='builtin.module(mxfp4-to-cuda-matvec{gemm=false})' | filecheck %s --check-prefix=MATVEC
// RUN: day0-opt %s --pass-pipeline='builtin.module(mxfp4-to-cuda-matvec{few=false})' | filecheck %s --check-prefix=NOFEW

// No mxfp4 op is left anywhere.
// GONE-NOT: torch.day0.mxfp4
// GONE: hal.executable.source
// GONE-NOT: torch.day0.mxfp4
// gemm=false: every site on the matvec, no GEMM executable.
// MATVEC-NOT: day0_mxfp4_moe_gemm
// MATVEC: call @day0_mxfp4_moe_4x32x64_k2(
// MATVEC-NOT: day0_mxfp4_moe_gemm
// few=false: the few-rows site takes the 64-row GEMM.
// NOFEW-NOT: call @day0_mxfp4_moe_gemm_few
// NOFEW: call @day0_mxfp4_moe_gemm_16x32x64_k2(
// NOFEW-NOT: call @day0_mxfp4_moe_gemm_few
// The kernels: 4 read-only bindings (x, packed, scales, experts) + the result; the matvec takes 4
// constants (K, N, k, E), the GEMM 5 (K, N, k, E, T·k).
// CHECK: #hal.pipeline.layout<constants = 4, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>
// CHECK: #hal.pipeline.layout<constants = 5, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>

// moe with a dynamic token count (prefill): builtin operands, one call of the grouped GEMM,
// result back to torch.
func.func @moe(%x: !torch.vtensor<[?,64],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[?,2],si64>) -> !torch.vtensor<[?,2,32],f32> {
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[?,64],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[?,2],si64>) -> !torch.vtensor<[?,2,32],f32>
  return %y : !torch.vtensor<[?,2,32],f32>
}
// CHECK-LABEL: func.func @moe(
// CHECK-NEXT: [[X:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[?,64],f32> -> tensor<?x64xf32>
// CHECK-NEXT: [[P:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[4,32,32],ui8> -> tensor<4x32x32xi8>
// CHECK-NEXT: [[S:%.+]] = torch_c.to_builtin_tensor %arg2 : !torch.vtensor<[4,32,2],ui8> -> tensor<4x32x2xi8>
// CHECK-NEXT: [[E:%.+]] = torch_c.to_builtin_tensor %arg3 : !torch.vtensor<[?,2],si64> -> tensor<?x2xi64>
// CHECK-NEXT: [[Y:%.+]] = call @day0_mxfp4_moe_gemm_4x32x64_k2([[X]], [[P]], [[S]], [[E]]) : (tensor<?x64xf32>, tensor<4x32x32xi8>, tensor<4x32x2xi8>, tensor<?x2xi64>) -> tensor<?x2x32xf32>
// CHECK-NEXT: [[R:%.+]] = torch_c.from_builtin_tensor [[Y]] : tensor<?x2x32xf32> -> !torch.vtensor<[?,2,32],f32>
// CHECK-NEXT: return [[R]]

// linear with one static row; experts of another integer type are widened to si64 first.
func.func @lin(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[32,32],ui8>, %s: !torch.vtensor<[32,2],ui8>) -> !torch.vtensor<[1,32],f32> {
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[32,32],ui8>, !torch.vtensor<[32,2],ui8>) -> !torch.vtensor<[1,32],f32>
  return %y : !torch.vtensor<[1,32],f32>
}
// CHECK-LABEL: func.func @lin(
// CHECK: [[XC:%.+]] = tensor.cast {{.*}} : tensor<1x64xf32> to tensor<?x64xf32>
// CHECK: [[Y:%.+]] = call @day0_mxfp4_linear_32x64([[XC]], {{.*}}) : (tensor<?x64xf32>, tensor<32x32xi8>, tensor<32x2xi8>) -> tensor<?x32xf32>
// CHECK-NEXT: tensor.cast [[Y]] : tensor<?x32xf32> to tensor<1x32xf32>

// A static site with T·k >= 64 rows (one GEMM tile) and more than 16 rows an expert on average
// (T·k = 80, E = 4) takes the GEMM too.
func.func @moe_t40(%x: !torch.vtensor<[40,64],f32>, %p: !torch.vtensor<[4,96,32],ui8>, %s: !torch.vtensor<[4,96,2],ui8>, %e: !torch.vtensor<[40,2],si64>) -> !torch.vtensor<[40,2,96],f32> {
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[40,64],f32>, !torch.vtensor<[4,96,32],ui8>, !torch.vtensor<[4,96,2],ui8>, !torch.vtensor<[40,2],si64>) -> !torch.vtensor<[40,2,96],f32>
  return %y : !torch.vtensor<[40,2,96],f32>
}
// CHECK-LABEL: func.func @moe_t40(
// CHECK: call @day0_mxfp4_moe_gemm_4x96x64_k2(

// A batched decode step: static T·k = 64 rows over E = 16 experts (4 an expert on average, at
// most 16): the few-rows GEMM.
func.func @moe_batch(%x: !torch.vtensor<[32,64],f32>, %p: !torch.vtensor<[16,32,32],ui8>, %s: !torch.vtensor<[16,32,2],ui8>, %e: !torch.vtensor<[32,2],si64>) -> !torch.vtensor<[32,2,32],f32> {
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[32,64],f32>, !torch.vtensor<[16,32,32],ui8>, !torch.vtensor<[16,32,2],ui8>, !torch.vtensor<[32,2],si64>) -> !torch.vtensor<[32,2,32],f32>
  return %y : !torch.vtensor<[32,2,32],f32>
}
// CHECK-LABEL: func.func @moe_batch(
// CHECK: [[XC:%.+]] = tensor.cast {{.*}} : tensor<32x64xf32> to tensor<?x64xf32>
// CHECK: [[Y:%.+]] = call @day0_mxfp4_moe_gemm_few_16x32x64_k2([[XC]], {{.*}}) : (tensor<?x64xf32>, tensor<16x32x32xi8>, tensor<16x32x2xi8>, tensor<?x2xi64>) -> tensor<?x2x32xf32>
// CHECK-NEXT: tensor.cast [[Y]] : tensor<?x2x32xf32> to tensor<32x2x32xf32>

// Decode's down call (its k (token, slot) rows as tokens, k = 1): fewer rows, the matvec.
func.func @moe_down_decode(%x: !torch.vtensor<[8,64],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[8,1],si64>) -> !torch.vtensor<[8,1,32],f32> {
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[8,64],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[8,1],si64>) -> !torch.vtensor<[8,1,32],f32>
  return %y : !torch.vtensor<[8,1,32],f32>
}
// CHECK-LABEL: func.func @moe_down_decode(
// CHECK: call @day0_mxfp4_moe_4x32x64_k1(

// T == 1 (decode's gate_up) keeps the matvec.
func.func @moe_i32(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[1,2],si32>) -> !torch.vtensor<[1,2,32],f32> {
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[1,2],si32>) -> !torch.vtensor<[1,2,32],f32>
  return %y : !torch.vtensor<[1,2,32],f32>
}
// CHECK-LABEL: func.func @moe_i32(
// CHECK: torch.aten.to.dtype %arg3, %int4, {{.*}} : !torch.vtensor<[1,2],si32>, {{.*}} -> !torch.vtensor<[1,2],si64>
// CHECK: call @day0_mxfp4_moe_4x32x64_k2(

// One token's down projection from its k = 2 experts' gate_up rows [2, 2K] (mxfp4_moe_swiglu,
// K = 64): the matvec's SwiGLU entry, one row an expert (k = 1), the clamp 7.0's f32 bits
// (0x40E00000 = 1088421888) a fifth constant; without a clamp (inf) no suffix and +inf's bits.
func.func @swiglu(%gu: !torch.vtensor<[2,128],f32>, %p: !torch.vtensor<[4,32,32],ui8>, %s: !torch.vtensor<[4,32,2],ui8>, %e: !torch.vtensor<[2,1],si64>) -> (!torch.vtensor<[2,1,32],f32>, !torch.vtensor<[2,1,32],f32>) {
  %limit = torch.constant.float 7.000000e+00
  %y = torch.operator "torch.day0.mxfp4_moe_swiglu"(%gu, %p, %s, %e, %limit) : (!torch.vtensor<[2,128],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[2,1],si64>, !torch.float) -> !torch.vtensor<[2,1,32],f32>
  %inf = torch.constant.float 0x7FF0000000000000
  %z = torch.operator "torch.day0.mxfp4_moe_swiglu"(%gu, %p, %s, %e, %inf) : (!torch.vtensor<[2,128],f32>, !torch.vtensor<[4,32,32],ui8>, !torch.vtensor<[4,32,2],ui8>, !torch.vtensor<[2,1],si64>, !torch.float) -> !torch.vtensor<[2,1,32],f32>
  return %y, %z : !torch.vtensor<[2,1,32],f32>, !torch.vtensor<[2,1,32],f32>
}
// CHECK-LABEL: func.func @swiglu(
// CHECK: [[G:%.+]] = tensor.cast {{.*}} : tensor<2x128xf32> to tensor<?x128xf32>
// CHECK: call @day0_mxfp4_moe_swiglu_4x32x64_k1_l40e00000([[G]], {{.*}}) : (tensor<?x128xf32>, tensor<4x32x32xi8>, tensor<4x32x2xi8>, tensor<?x1xi64>) -> tensor<?x1x32xf32>
// CHECK: call @day0_mxfp4_moe_swiglu_4x32x64_k1({{.*}}) : (tensor<?x128xf32>, tensor<4x32x32xi8>, tensor<4x32x2xi8>, tensor<?x1xi64>) -> tensor<?x1x32xf32>

// The executables with the PTX embedded.
// CHECK: hal.executable.source private @day0_mxfp4_matvec <objects = <{#executable_target_cuda_nvptx_fb = [#hal.executable.object<{path = "mxfp4_matvec.sm_90.ptx", data = dense<"0x{{[0-9A-F]+}}">
// CHECK: hal.executable.export public @day0_mxfp4_matvec ordinal(0)
// CHECK: hal.executable.export public @day0_mxfp4_matvec_swiglu ordinal(1)
// CHECK: } <workgroup_size = [256 : index, 1 : index, 1 : index]>
// CHECK: hal.executable.source private @day0_mxfp4_moe_gemm <objects = <{#executable_target_cuda_nvptx_fb = [#hal.executable.object<{path = "mxfp4_moe_gemm.sm_90.ptx", data = dense<"0x{{[0-9A-F]+}}">
// CHECK: hal.executable.export public @day0_mxfp4_moe_gemm ordinal(0)
// CHECK: hal.executable.export public @day0_mxfp4_moe_gemm_few ordinal(1)
// CHECK: } <workgroup_size = [256 : index, 1 : index, 1 : index]>

// linear: one expert (weights viewed [1, N, ...], experts all 0); grid (ceil(N/32), rows).
// CHECK-LABEL: func.func private @day0_mxfp4_linear_32x64(
// CHECK: [[ROWS:%.+]] = arith.muli %dim, %c1 : index
// CHECK: [[PW:%.+]] = tensor.expand_shape %arg1 {{\[\[}}0, 1], [2]] output_shape [1, 32, 32] : tensor<32x32xi8> into tensor<1x32x32xi8>
// CHECK: [[EF:%.+]] = linalg.fill ins(%c0_i64 : i64) outs({{.*}} : tensor<?xi64>) -> tensor<?xi64>
// CHECK: flow.dispatch @day0_mxfp4_matvec::@day0_mxfp4_matvec[%c1{{.*}}, [[ROWS]]](%c64_i32, %c32_i32, %c1_i32, %c1_i32{{.*}}, %arg0, [[PW]], {{.*}}, [[EF]]) : (i32, i32, i32, i32, tensor<?x64xf32>{%dim}, tensor<1x32x32xi8>, tensor<1x32x2xi8>, tensor<?xi64>{[[ROWS]]}) -> tensor<?x32xf32>{[[ROWS]]}

// moe: rows = T·k, experts flattened, result viewed [T, k, N].
// CHECK-LABEL: func.func private @day0_mxfp4_moe_4x32x64_k2(
// CHECK: [[T:%.+]] = tensor.dim %arg0, %c0 : tensor<?x64xf32>
// CHECK: [[ROWS:%.+]] = arith.muli [[T]], %c2 : index
// CHECK: [[EF:%.+]] = tensor.collapse_shape %arg3 {{\[\[}}0, 1]] : tensor<?x2xi64> into tensor<?xi64>
// CHECK: [[O:%.+]] = flow.dispatch @day0_mxfp4_matvec::@day0_mxfp4_matvec[%c1, [[ROWS]]](%c64_i32, %c32_i32, %c2_i32, %c4_i32, %arg0, %arg1, %arg2, [[EF]])
// CHECK: tensor.expand_shape [[O]] {{\[\[}}0, 1], [2]] output_shape [[[T]], 2, 32] : tensor<?x32xf32> into tensor<?x2x32xf32>

// moe GEMM: grid (ceil(N/64), E), push constants K, N, k, E, rows = T·k.
// CHECK-LABEL: func.func private @day0_mxfp4_moe_gemm_4x32x64_k2(
// CHECK: [[T:%.+]] = tensor.dim %arg0, %c0 : tensor<?x64xf32>
// CHECK: [[ROWS:%.+]] = arith.muli [[T]], %c2 : index
// CHECK: [[EF:%.+]] = tensor.collapse_shape %arg3 {{\[\[}}0, 1]] : tensor<?x2xi64> into tensor<?xi64>
// CHECK: [[R:%.+]] = arith.index_cast [[ROWS]] : index to i32
// CHECK: [[O:%.+]] = flow.dispatch @day0_mxfp4_moe_gemm::@day0_mxfp4_moe_gemm[%c1, %c4](%c64_i32, %c32_i32, %c2_i32, %c4_i32, [[R]], %arg0, %arg1, %arg2, [[EF]]) : (i32, i32, i32, i32, i32, tensor<?x64xf32>{[[T]]}, tensor<4x32x32xi8>, tensor<4x32x2xi8>, tensor<?xi64>{[[ROWS]]}) -> tensor<?x32xf32>{[[ROWS]]}
// CHECK: tensor.expand_shape [[O]] {{\[\[}}0, 1], [2]] output_shape [[[T]], 2, 32] : tensor<?x32xf32> into tensor<?x2x32xf32>
// N = 96: two column tiles.
// CHECK-LABEL: func.func private @day0_mxfp4_moe_gemm_4x96x64_k2(
// CHECK: arith.muli
// CHECK-NEXT: [[GX:%.+]] = arith.constant 2 : index
// CHECK-NEXT: [[GE:%.+]] = arith.constant 4 : index
// CHECK: flow.dispatch @day0_mxfp4_moe_gemm::@day0_mxfp4_moe_gemm[[[GX]], [[GE]]](%c64_i32, %c96_i32, %c2_i32, %c4_i32,
// The few-rows GEMM: the same dispatch of the other entry.
// CHECK-LABEL: func.func private @day0_mxfp4_moe_gemm_few_16x32x64_k2(
// CHECK: [[ROWS:%.+]] = arith.muli
// CHECK: [[GE:%.+]] = arith.constant 16 : index
// CHECK: [[R:%.+]] = arith.index_cast [[ROWS]] : index to i32
// CHECK: flow.dispatch @day0_mxfp4_moe_gemm::@day0_mxfp4_moe_gemm_few[%c1, [[GE]]](%c64_i32, %c32_i32, %c2_i32, %c16_i32, [[R]], %arg0, %arg1, %arg2,
// The SwiGLU entry: the limit's bits a fifth push constant, gate_up ?x2K.
// CHECK-LABEL: func.func private @day0_mxfp4_moe_swiglu_4x32x64_k1(
// CHECK: flow.dispatch @day0_mxfp4_matvec::@day0_mxfp4_matvec_swiglu[%c1{{.*}}](%c64_i32, %c32_i32, %c1_i32, %c4_i32, %c2139095040_i32, %arg0, %arg1, %arg2, {{.*}}) : (i32, i32, i32, i32, i32, tensor<?x128xf32>{%dim}
// CHECK-LABEL: func.func private @day0_mxfp4_moe_swiglu_4x32x64_k1_l40e00000(
// CHECK: @day0_mxfp4_matvec_swiglu[{{.*}}](%c64_i32, %c32_i32, %c1_i32, %c4_i32, %c1088421888_i32,
