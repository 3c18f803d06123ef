// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-bf16-terms{stack-rows=0})' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-bf16-terms{min-rows=1 stack-rows=0})' | filecheck %s --check-prefix=ALL
// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-bf16-terms{terms=2 stack-rows=0})' | filecheck %s --check-prefix=TWO
// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-bf16-terms)' | filecheck %s --check-prefix=STACK

// A linear against a bf16 weight (export's form: widen, permute, mm): the permute is rebuilt on
// the bf16 weight, x is split into three bf16 terms (t0 = x rounded to nearest even on the
// bits, t1 = the same of x - t0, t2 of x - t0 - t1), and three bf16 matmuls accumulate into one
// f32 result. The widen is gone.
func.func @linear(%x: !torch.vtensor<[64,32],f32>, %w: !torch.vtensor<[96,32],bf16>) -> !torch.vtensor<[64,96],f32> {
  %int6 = torch.constant.int 6
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[96,32],bf16>, !torch.int -> !torch.vtensor<[96,32],f32>
  %perm = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %wt = torch.aten.permute %wf, %perm : !torch.vtensor<[96,32],f32>, !torch.list<int> -> !torch.vtensor<[32,96],f32>
  %y = torch.aten.mm %x, %wt : !torch.vtensor<[64,32],f32>, !torch.vtensor<[32,96],f32> -> !torch.vtensor<[64,96],f32>
  return %y : !torch.vtensor<[64,96],f32>
}
// CHECK-LABEL: func.func @linear(
// CHECK-NOT:     torch.prims.convert_element_type
// CHECK:         [[WT:%.+]] = torch.aten.permute %arg1, {{%.+}} : !torch.vtensor<[96,32],bf16>, !torch.list<int> -> !torch.vtensor<[32,96],bf16>
// CHECK-NEXT:    [[X:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[64,32],f32> -> tensor<64x32xf32>
// CHECK-NEXT:    [[W:%.+]] = torch_c.to_builtin_tensor [[WT]] : !torch.vtensor<[32,96],bf16> -> tensor<32x96xbf16>
// CHECK:         [[ACC:%.+]] = linalg.fill ins({{%.+}} : f32) outs({{%.+}} : tensor<64x96xf32>) -> tensor<64x96xf32>
// CHECK:         [[T0:%.+]] = linalg.generic {{.*}} ins([[X]] : tensor<64x32xf32>) outs({{%.+}} : tensor<64x32xbf16>) {
// CHECK-NEXT:    ^bb0([[V:%.+]]: f32, {{%.+}}: bf16):
// CHECK-NEXT:      [[C16:%.+]] = arith.constant 16 : i32
// CHECK-NEXT:      [[ONE:%.+]] = arith.constant 1 : i32
// CHECK-NEXT:      [[HALF:%.+]] = arith.constant 32767 : i32
// CHECK-NEXT:      [[MASK:%.+]] = arith.constant -65536 : i32
// CHECK-NEXT:      [[I:%.+]] = arith.bitcast [[V]] : f32 to i32
// CHECK-NEXT:      [[S:%.+]] = arith.shrui [[I]], [[C16]] : i32
// CHECK-NEXT:      [[LSB:%.+]] = arith.andi [[S]], [[ONE]] : i32
// CHECK-NEXT:      [[R0:%.+]] = arith.addi [[I]], [[HALF]] : i32
// CHECK-NEXT:      [[R:%.+]] = arith.addi [[R0]], [[LSB]] : i32
// CHECK-NEXT:      [[HB:%.+]] = arith.andi [[R]], [[MASK]] : i32
// CHECK-NEXT:      [[H:%.+]] = arith.bitcast [[HB]] : i32 to f32
// CHECK-NEXT:      [[T:%.+]] = arith.truncf [[H]] : f32 to bf16
// CHECK-NEXT:      linalg.yield [[T]] : bf16
// CHECK:         [[T1:%.+]] = linalg.generic {{.*}} ins([[X]] : tensor<64x32xf32>) outs({{%.+}} : tensor<64x32xbf16>) {
// CHECK:           [[H:%.+]] = arith.bitcast {{%.+}} : i32 to f32
// CHECK-NEXT:      [[D:%.+]] = arith.subf {{%.+}}, [[H]] : f32
// CHECK:           [[H1:%.+]] = arith.bitcast {{%.+}} : i32 to f32
// CHECK-NEXT:      [[T:%.+]] = arith.truncf [[H1]] : f32 to bf16
// CHECK-NEXT:      linalg.yield [[T]] : bf16
// CHECK:         [[T2:%.+]] = linalg.generic {{.*}} ins([[X]] : tensor<64x32xf32>) outs({{%.+}} : tensor<64x32xbf16>) {
// CHECK:           [[D1:%.+]] = arith.subf {{%.+}}, {{%.+}} : f32
// CHECK:           [[D2:%.+]] = arith.subf [[D1]], {{%.+}} : f32
// CHECK:           linalg.yield
// CHECK:         [[Y0:%.+]] = linalg.matmul ins([[T0]], [[W]] : tensor<64x32xbf16>, tensor<32x96xbf16>) outs([[ACC]] : tensor<64x96xf32>) -> tensor<64x96xf32>
// CHECK-NEXT:    [[Y1:%.+]] = linalg.matmul ins([[T1]], [[W]] : tensor<64x32xbf16>, tensor<32x96xbf16>) outs([[Y0]] : tensor<64x96xf32>) -> tensor<64x96xf32>
// CHECK-NEXT:    [[Y2:%.+]] = linalg.matmul ins([[T2]], [[W]] : tensor<64x32xbf16>, tensor<32x96xbf16>) outs([[Y1]] : tensor<64x96xf32>) -> tensor<64x96xf32>
// CHECK-NEXT:    [[Y:%.+]] = torch_c.from_builtin_tensor [[Y2]] : tensor<64x96xf32> -> !torch.vtensor<[64,96],f32>
// CHECK-NEXT:    return [[Y]] : !torch.vtensor<[64,96],f32>
// By default (stack-rows=256) 64 rows × 3 terms are stacked: one generic writes the three terms
// as [3, 64, 32] (linalg.index 0 picks the term), a collapse_shape makes them one 192-row operand,
// one product of 192 rows reads the weight once, then its three 64-row slices are summed.
// STACK-LABEL:   func.func @linear(
// STACK:           [[E:%.+]] = tensor.empty() : tensor<3x64x32xbf16>
// STACK-NEXT:      [[T:%.+]] = linalg.generic {indexing_maps = [#map{{[0-9]*}}, #map{{[0-9]*}}], iterator_types = ["parallel", "parallel", "parallel"]} ins({{%.+}} : tensor<64x32xf32>) outs([[E]] : tensor<3x64x32xbf16>)
// STACK-COUNT-3:     arith.truncf {{%.+}} : f32 to bf16
// STACK-NEXT:        [[I:%.+]] = linalg.index 0 : index
// STACK:             arith.select
// STACK:             arith.select
// STACK-NEXT:        linalg.yield
// STACK:           [[S:%.+]] = tensor.collapse_shape [[T]] {{\[\[}}0, 1], [2]] : tensor<3x64x32xbf16> into tensor<192x32xbf16>
// STACK-NOT:       linalg.generic
// STACK:           [[P:%.+]] = linalg.matmul ins([[S]], {{%.+}} : tensor<192x32xbf16>, tensor<32x96xbf16>) outs({{%.+}} : tensor<192x96xf32>)
// STACK-NOT:       linalg.matmul
// STACK:           tensor.extract_slice [[P]][0, 0] [64, 96] [1, 1]
// STACK-NEXT:      tensor.extract_slice [[P]][64, 0] [64, 96] [1, 1]
// STACK-NEXT:      tensor.extract_slice [[P]][128, 0] [64, 96] [1, 1]
// STACK-NEXT:      [[R:%.+]] = linalg.generic {{.*}} ins({{.*}} : tensor<64x96xf32>, tensor<64x96xf32>, tensor<64x96xf32>) outs({{%.+}} : tensor<64x96xf32>)
// STACK:             arith.addf
// STACK-NEXT:        arith.addf
// STACK:           torch_c.from_builtin_tensor [[R]] : tensor<64x96xf32>
// The absorbed query's bmm stacks along its rows (dim 1).
// STACK-LABEL:   func.func @absorb(
// STACK:           tensor.collapse_shape {{%.+}} {{\[\[}}0], [1, 2], [3]] : tensor<4x3x64x16xbf16> into tensor<4x192x16xbf16>
// STACK:           linalg.batch_matmul ins({{%.+}}, {{%.+}} : tensor<4x192x16xbf16>, tensor<4x16x64xbf16>) outs({{%.+}} : tensor<4x192x64xf32>)

// Two terms: t0 and t1, two products.
// TWO-LABEL:   func.func @linear(
// TWO-COUNT-2:   linalg.generic
// TWO-NOT:       linalg.generic
// TWO:           [[Y0:%.+]] = linalg.matmul
// TWO-NEXT:      linalg.matmul ins({{%.+}}, {{%.+}} : tensor<64x32xbf16>, tensor<32x96xbf16>) outs([[Y0]] : tensor<64x96xf32>)
// TWO-NEXT:      torch_c.from_builtin_tensor

// MLA's absorbed query: a bmm against a head-sliced view of a bf16 weight (view, slice) with the
// f32 operand on the left; the layout chain is rebuilt in bf16, the f32 side split in three.
func.func @absorb(%q: !torch.vtensor<[4,64,16],f32>, %w: !torch.vtensor<[128,64],bf16>) -> !torch.vtensor<[4,64,64],f32> {
  %int6 = torch.constant.int 6
  %int4 = torch.constant.int 4
  %int32 = torch.constant.int 32
  %int64 = torch.constant.int 64
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %int16 = torch.constant.int 16
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[128,64],bf16>, !torch.int -> !torch.vtensor<[128,64],f32>
  %shape = torch.prim.ListConstruct %int4, %int32, %int64 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %w3 = torch.aten.view %wf, %shape : !torch.vtensor<[128,64],f32>, !torch.list<int> -> !torch.vtensor<[4,32,64],f32>
  %wk = torch.aten.slice.Tensor %w3, %int1, %int0, %int16, %int1 : !torch.vtensor<[4,32,64],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4,16,64],f32>
  %y = torch.aten.bmm %q, %wk : !torch.vtensor<[4,64,16],f32>, !torch.vtensor<[4,16,64],f32> -> !torch.vtensor<[4,64,64],f32>
  return %y : !torch.vtensor<[4,64,64],f32>
}
// CHECK-LABEL: func.func @absorb(
// CHECK:         [[W3:%.+]] = torch.aten.view %arg1, {{%.+}} : !torch.vtensor<[128,64],bf16>, !torch.list<int> -> !torch.vtensor<[4,32,64],bf16>
// CHECK-NEXT:    [[WK:%.+]] = torch.aten.slice.Tensor [[W3]], {{.*}} -> !torch.vtensor<[4,16,64],bf16>
// CHECK-COUNT-3: linalg.generic {{.*}} outs({{%.+}} : tensor<4x64x16xbf16>)
// CHECK:         [[Y0:%.+]] = linalg.batch_matmul ins({{%.+}}, {{%.+}} : tensor<4x64x16xbf16>, tensor<4x16x64xbf16>) outs({{%.+}} : tensor<4x64x64xf32>)
// CHECK-NEXT:    [[Y1:%.+]] = linalg.batch_matmul ins({{%.+}}, {{%.+}} : tensor<4x64x16xbf16>, tensor<4x16x64xbf16>) outs([[Y0]] : tensor<4x64x64xf32>)
// CHECK-NEXT:    linalg.batch_matmul ins({{%.+}}, {{%.+}} : tensor<4x64x16xbf16>, tensor<4x16x64xbf16>) outs([[Y1]] : tensor<4x64x64xf32>)
// CHECK-NOT:     torch.aten.bmm
// CHECK-NOT:     torch.prims.convert_element_type
// CHECK:         return

// The f32 operand on the right (a widened activation on the left): the right side is split.
func.func @widened_left(%a: !torch.vtensor<[64,32],bf16>, %b: !torch.vtensor<[32,64],f32>) -> !torch.vtensor<[64,64],f32> {
  %int6 = torch.constant.int 6
  %none = torch.constant.none
  %false = torch.constant.bool false
  %af = torch.aten.to.dtype %a, %int6, %false, %false, %none : !torch.vtensor<[64,32],bf16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[64,32],f32>
  %y = torch.aten.mm %af, %b : !torch.vtensor<[64,32],f32>, !torch.vtensor<[32,64],f32> -> !torch.vtensor<[64,64],f32>
  return %y : !torch.vtensor<[64,64],f32>
}
// CHECK-LABEL: func.func @widened_left(
// CHECK:         [[A:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[64,32],bf16> -> tensor<64x32xbf16>
// CHECK:         [[T0:%.+]] = linalg.generic {{.*}} outs({{%.+}} : tensor<32x64xbf16>)
// CHECK:         [[T1:%.+]] = linalg.generic {{.*}} outs({{%.+}} : tensor<32x64xbf16>)
// CHECK:         [[T2:%.+]] = linalg.generic {{.*}} outs({{%.+}} : tensor<32x64xbf16>)
// CHECK:         [[Y0:%.+]] = linalg.matmul ins([[A]], [[T0]] : tensor<64x32xbf16>, tensor<32x64xbf16>)
// CHECK-NEXT:    [[Y1:%.+]] = linalg.matmul ins([[A]], [[T1]] : tensor<64x32xbf16>, tensor<32x64xbf16>) outs([[Y0]] : tensor<64x64xf32>)
// CHECK-NEXT:    linalg.matmul ins([[A]], [[T2]] : tensor<64x32xbf16>, tensor<32x64xbf16>) outs([[Y1]] : tensor<64x64xf32>)

// Both operands widened bf16: one exact product, no split.
func.func @both_widened(%a: !torch.vtensor<[64,32],bf16>, %b: !torch.vtensor<[32,64],bf16>) -> !torch.vtensor<[64,64],f32> {
  %int6 = torch.constant.int 6
  %af = torch.prims.convert_element_type %a, %int6 : !torch.vtensor<[64,32],bf16>, !torch.int -> !torch.vtensor<[64,32],f32>
  %bf = torch.prims.convert_element_type %b, %int6 : !torch.vtensor<[32,64],bf16>, !torch.int -> !torch.vtensor<[32,64],f32>
  %y = torch.aten.mm %af, %bf : !torch.vtensor<[64,32],f32>, !torch.vtensor<[32,64],f32> -> !torch.vtensor<[64,64],f32>
  return %y : !torch.vtensor<[64,64],f32>
}
// CHECK-LABEL: func.func @both_widened(
// CHECK-NOT:     linalg.generic
// CHECK:         linalg.matmul ins({{%.+}}, {{%.+}} : tensor<64x32xbf16>, tensor<32x64xbf16>) outs({{%.+}} : tensor<64x64xf32>)
// CHECK-NOT:     linalg.matmul
// CHECK:         return

// Left alone: a decode matvec (M = 1 < min-rows; min-rows=1 takes it), a matmul of two f32
// values, a widened operand whose chain has a computing op (neg), and a dynamic row count.
func.func @matvec(%x: !torch.vtensor<[1,32],f32>, %w: !torch.vtensor<[32,96],bf16>) -> !torch.vtensor<[1,96],f32> {
  %int6 = torch.constant.int 6
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[32,96],bf16>, !torch.int -> !torch.vtensor<[32,96],f32>
  %y = torch.aten.mm %x, %wf : !torch.vtensor<[1,32],f32>, !torch.vtensor<[32,96],f32> -> !torch.vtensor<[1,96],f32>
  return %y : !torch.vtensor<[1,96],f32>
}
// CHECK-LABEL: func.func @matvec(
// CHECK:         torch.prims.convert_element_type
// CHECK-NEXT:    torch.aten.mm
// ALL-LABEL:   func.func @matvec(
// ALL-NOT:       torch.aten.mm
// ALL:           linalg.matmul ins({{%.+}}, {{%.+}} : tensor<1x32xbf16>, tensor<32x96xbf16>)

func.func @all_f32(%x: !torch.vtensor<[64,32],f32>, %w: !torch.vtensor<[32,96],f32>) -> !torch.vtensor<[64,96],f32> {
  %y = torch.aten.mm %x, %w : !torch.vtensor<[64,32],f32>, !torch.vtensor<[32,96],f32> -> !torch.vtensor<[64,96],f32>
  return %y : !torch.vtensor<[64,96],f32>
}
// CHECK-LABEL: func.func @all_f32(
// CHECK-NEXT:    torch.aten.mm
// ALL-LABEL:   func.func @all_f32(
// ALL-NEXT:      torch.aten.mm

func.func @computed(%x: !torch.vtensor<[64,32],f32>, %w: !torch.vtensor<[32,96],bf16>) -> !torch.vtensor<[64,96],f32> {
  %int6 = torch.constant.int 6
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[32,96],bf16>, !torch.int -> !torch.vtensor<[32,96],f32>
  %wn = torch.aten.neg %wf : !torch.vtensor<[32,96],f32> -> !torch.vtensor<[32,96],f32>
  %y = torch.aten.mm %x, %wn : !torch.vtensor<[64,32],f32>, !torch.vtensor<[32,96],f32> -> !torch.vtensor<[64,96],f32>
  return %y : !torch.vtensor<[64,96],f32>
}
// CHECK-LABEL: func.func @computed(
// CHECK:         torch.aten.neg
// CHECK-NEXT:    torch.aten.mm

func.func @dynamic(%x: !torch.vtensor<[?,32],f32>, %w: !torch.vtensor<[32,96],bf16>) -> !torch.vtensor<[?,96],f32> {
  %int6 = torch.constant.int 6
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[32,96],bf16>, !torch.int -> !torch.vtensor<[32,96],f32>
  %y = torch.aten.mm %x, %wf : !torch.vtensor<[?,32],f32>, !torch.vtensor<[32,96],f32> -> !torch.vtensor<[?,96],f32>
  return %y : !torch.vtensor<[?,96],f32>
}
// CHECK-LABEL: func.func @dynamic(
// CHECK:         torch.prims.convert_element_type
// CHECK-NEXT:    torch.aten.mm
