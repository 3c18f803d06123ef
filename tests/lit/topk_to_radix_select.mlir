// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-radix-select)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-radix-select{min-size=100})' | filecheck %s --check-prefix=MIN100
// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-radix-select{row-bound=16384})' | filecheck %s --check-prefix=BOUND
// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-radix-select{row-bound=16385})' | filecheck %s --check-prefix=LONG

// Every topk becomes a call of a wrapper over its own tensor type; no torch.aten.topk is left.
// CHECK-NOT: torch.aten.topk
// With min-size=100 the static rows of 16 and 64 keep their topk; the dynamic rows are rewritten.
// MIN100-COUNT-2: torch.aten.topk
// MIN100-NOT: torch.aten.topk

// Dynamic rows of dynamic length, k=64: a direct call, indices widened to si64.
func.func @dynamic(%x: !torch.vtensor<[?,?],f32>) -> (!torch.vtensor<[?,64],f32>, !torch.vtensor<[?,64],si64>) {
  %int64 = torch.constant.int 64
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %values, %indices = torch.aten.topk %x, %int64, %int-1, %true, %false : !torch.vtensor<[?,?],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,64],f32>, !torch.vtensor<[?,64],si64>
  return %values, %indices : !torch.vtensor<[?,64],f32>, !torch.vtensor<[?,64],si64>
}
// CHECK-LABEL: func.func @dynamic(
// Rows of dynamic length bounded by row-bound <= 16384 take the one-CTA form, one launch; a
// bound past it (or none, above) keeps the segmented form.
// BOUND-LABEL: func.func @dynamic(
// BOUND: call @day0_topk_radix_k64_qxq(
// BOUND-LABEL: func.func private @day0_topk_small_k64(
// BOUND-NOT: func.func private @day0_topk_radix_k64(
// BOUND-LABEL: func.func private @day0_topk_radix_k64_qxq(
// BOUND: call @day0_topk_small_k64(
// LONG-LABEL: func.func private @day0_topk_radix_k64_qxq(
// LONG: call @day0_topk_radix_k64(
// CHECK-NEXT: [[X:%[0-9]+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[?,?],f32> -> tensor<?x?xf32>
// CHECK-NEXT: [[R:%[0-9]+]]:2 = call @day0_topk_radix_k64_qxq([[X]]) : (tensor<?x?xf32>) -> (tensor<?x64xf32>, tensor<?x64xi32>)
// CHECK-NEXT: [[V:%[0-9]+]] = torch_c.from_builtin_tensor [[R]]#0 : tensor<?x64xf32> -> !torch.vtensor<[?,64],f32>
// CHECK-NEXT: [[I32:%[0-9]+]] = torch_c.from_builtin_tensor [[R]]#1 : tensor<?x64xi32> -> !torch.vtensor<[?,64],si32>
// CHECK: [[I:%[0-9]+]] = torch.aten.to.dtype [[I32]], %int4, %false, %false, %none : {{.*}} -> !torch.vtensor<[?,64],si64>
// CHECK-NEXT: return [[V]], [[I]]

// Rank 3 (a router's per-group rows), static row of 16: leading dims are collapsed into rows.
func.func @grouped(%x: !torch.vtensor<[?,4,16],f32>) -> (!torch.vtensor<[?,4,2],f32>, !torch.vtensor<[?,4,2],si64>) {
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %values, %indices = torch.aten.topk %x, %int2, %int-1, %true, %false : !torch.vtensor<[?,4,16],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,4,2],f32>, !torch.vtensor<[?,4,2],si64>
  return %values, %indices : !torch.vtensor<[?,4,2],f32>, !torch.vtensor<[?,4,2],si64>
}
// CHECK-LABEL: func.func @grouped(
// CHECK: call @day0_topk_radix_k2_qx4x16({{.*}}) : (tensor<?x4x16xf32>) -> (tensor<?x4x2xf32>, tensor<?x4x2xi32>)

// Static rows, dim given as 1; and a rank-1 dynamic row.
func.func @static_rows(%x: !torch.vtensor<[4,64],f32>, %y: !torch.vtensor<[?],f32>) -> (!torch.vtensor<[4,2],si64>, !torch.vtensor<[2],si64>) {
  %int2 = torch.constant.int 2
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %values, %indices = torch.aten.topk %x, %int2, %int1, %true, %false : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,2],f32>, !torch.vtensor<[4,2],si64>
  %v1, %i1 = torch.aten.topk %y, %int2, %int0, %true, %false : !torch.vtensor<[?],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2],f32>, !torch.vtensor<[2],si64>
  return %indices, %i1 : !torch.vtensor<[4,2],si64>, !torch.vtensor<[2],si64>
}
// CHECK-LABEL: func.func @static_rows(
// CHECK: call @day0_topk_radix_k2_4x64({{.*}}) : (tensor<4x64xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
// CHECK: call @day0_topk_radix_k2_q({{.*}}) : (tensor<?xf32>) -> (tensor<2xf32>, tensor<2xi32>)

// One executable holds the four kernels, with the PTX embedded; each export's grid is its workload.
// CHECK: hal.executable.source private @day0_topk_select <objects = <{#executable_target_cuda_nvptx_fb = [#hal.executable.object<{path = "topk_select.sm_90.ptx", data = dense<"0x{{[0-9A-F]+}}"> : vector<{{[0-9]+}}xi8>}>]}>> {
// CHECK-NEXT: hal.executable.export public @day0_topk_hist ordinal(0) layout(#pipeline_layout) count(%{{.+}}: !hal.device, [[T:%.+]]: index, [[G:%.+]]: index) -> (index, index, index) {
// CHECK-NEXT: [[ONE:%.+]] = arith.constant 1 : index
// CHECK-NEXT: hal.return [[T]], [[G]], [[ONE]] : index, index, index
// CHECK-NEXT: } <workgroup_size = [256 : index, 1 : index, 1 : index]>
// CHECK: hal.executable.export public @day0_topk_collect ordinal(1)
// CHECK: hal.executable.export public @day0_topk_finish ordinal(2) layout(#pipeline_layout2) count(%{{.+}}: !hal.device, [[T2:%.+]]: index) -> (index, index, index) {
// CHECK: hal.executable.export public @day0_topk_small ordinal(3)

// One select function per (k, form). Static rows of at most 8192: one kernel, one CTA a row.
// CHECK-LABEL: func.func private @day0_topk_radix_k2(
// CHECK-LABEL: func.func private @day0_topk_small_k2(%arg0: tensor<?x?xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
// CHECK: [[SR:%.+]] = tensor.dim %arg0, %c0
// CHECK: [[SI:%.+]]:2 = flow.dispatch @day0_topk_select::@day0_topk_small[[[SR]]]({{.*}}, %c2_i32, %arg0) : (i32, i32, tensor<?x?xf32>{{.*}}) -> (tensor<?x2xi32>{[[SR]]}, tensor<?x2xf32>{[[SR]]})
// CHECK: return [[SI]]#1, [[SI]]#0
// Dynamic rows: histogram into a zeroed total (tied), collect, finish in place.
// CHECK-LABEL: func.func private @day0_topk_radix_k64(%arg0: tensor<?x?xf32>) -> (tensor<?x64xf32>, tensor<?x64xi32>)
// CHECK: [[ROWS:%.+]] = tensor.dim %arg0, %c0
// CHECK: [[N:%.+]] = tensor.dim %arg0, %c1
// CHECK: [[SEGS:%.+]] = arith.ceildivui [[N]], %c8192 : index
// CHECK: [[TOTAL0:%.+]] = linalg.fill ins(%c0_i32 : i32) outs({{.*}} : tensor<?x2048xi32>) -> tensor<?x2048xi32>
// CHECK: [[H:%.+]]:2 = flow.dispatch @day0_topk_select::@day0_topk_hist[[[ROWS]], [[SEGS]]]({{.*}}, %arg0, [[TOTAL0]]) : ({{.*}}) -> (tensor<?x?x2048xi32>{[[ROWS]], [[SEGS]]}, [[TOTAL0]]{[[ROWS]]})
// CHECK: [[C:%.+]]:4 = flow.dispatch @day0_topk_select::@day0_topk_collect[[[ROWS]], [[SEGS]]]({{.*}}, %arg0, [[H]]#1, [[H]]#0) : ({{.*}}) -> (tensor<?x4xi32>{[[ROWS]]}, tensor<?x64xi32>{[[ROWS]]}, tensor<?x64xf32>{[[ROWS]]}, tensor<?x?xi32>{[[ROWS]], [[N]]})
// CHECK: [[F:%.+]]:2 = flow.dispatch @day0_topk_select::@day0_topk_finish[[[ROWS]]]({{.*}}, %arg0, [[C]]#0, [[C]]#3, [[C]]#1, [[C]]#2) : ({{.*}}) -> ([[C]]#1{[[ROWS]]}, [[C]]#2{[[ROWS]]})
// CHECK: return [[F]]#1, [[F]]#0 : tensor<?x64xf32>, tensor<?x64xi32>

// The wrappers: static rows of 64 and 16 call the one-kernel form, the dynamic row the other.
// CHECK-LABEL: func.func private @day0_topk_radix_k2_4x64(
// CHECK: call @day0_topk_small_k2(
// CHECK-LABEL: func.func private @day0_topk_radix_k2_q(
// CHECK: tensor.expand_shape %arg0 {{\[\[}}0, 1]] output_shape [1, %dim] : tensor<?xf32> into tensor<1x?xf32>
// CHECK: call @day0_topk_radix_k2(
// CHECK: tensor.collapse_shape {{.*}} {{\[\[}}0, 1]] : tensor<1x2xi32> into tensor<2xi32>
// CHECK-LABEL: func.func private @day0_topk_radix_k2_qx4x16(
// CHECK: [[D0:%.+]] = tensor.dim %arg0, %c0 : tensor<?x4x16xf32>
// CHECK-NEXT: [[FLAT:%.+]] = tensor.collapse_shape %arg0 {{\[\[}}0, 1], [2]] : tensor<?x4x16xf32> into tensor<?x16xf32>
// CHECK-NEXT: [[XD:%.+]] = tensor.cast [[FLAT]] : tensor<?x16xf32> to tensor<?x?xf32>
// CHECK-NEXT: [[R:%.+]]:2 = call @day0_topk_small_k2([[XD]])
// CHECK-NEXT: tensor.expand_shape [[R]]#0 {{\[\[}}0, 1], [2]] output_shape [[[D0]], 4, 2] : tensor<?x2xf32> into tensor<?x4x2xf32>
