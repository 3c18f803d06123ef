// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-linalg-ext)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-linalg-ext{min-size=0})' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-linalg-ext{min-size=64})' | filecheck %s --check-prefix=MIN64
// RUN: day0-opt %s --pass-pipeline='builtin.module(topk-to-linalg-ext{min-size=100000})' | filecheck %s --check-prefix=MINBIG

// The default (min-size=0) rewrites every topk; no torch.aten.topk is left.
// CHECK-NOT: torch.aten.topk

// Static rows, largest: the empty slots start as (-inf, INT32_MAX), the comparator is a strict >.
func.func @static_largest(%x: !torch.vtensor<[4,64],f32>) -> (!torch.vtensor<[4,6],f32>, !torch.vtensor<[4,6],si64>) {
  %int6 = torch.constant.int 6
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %values, %indices = torch.aten.topk %x, %int6, %int-1, %true, %true : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,6],f32>, !torch.vtensor<[4,6],si64>
  return %values, %indices : !torch.vtensor<[4,6],f32>, !torch.vtensor<[4,6],si64>
}
// CHECK-LABEL: func.func @static_largest(
// CHECK-NEXT: [[X:%[0-9]+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[4,64],f32> -> tensor<4x64xf32>
// CHECK-NEXT: [[E0:%[0-9]+]] = tensor.empty() : tensor<4x6xf32>
// CHECK-NEXT: [[NINF:%.+]] = arith.constant 0xFF800000 : f32
// CHECK-NEXT: [[V0:%[0-9]+]] = linalg.fill ins([[NINF]] : f32) outs([[E0]] : tensor<4x6xf32>) -> tensor<4x6xf32>
// CHECK-NEXT: [[E1:%[0-9]+]] = tensor.empty() : tensor<4x6xi32>
// CHECK-NEXT: [[IMAX:%.+]] = arith.constant 2147483647 : i32
// CHECK-NEXT: [[I0:%[0-9]+]] = linalg.fill ins([[IMAX]] : i32) outs([[E1]] : tensor<4x6xi32>) -> tensor<4x6xi32>
// CHECK-NEXT: [[TK:%[0-9]+]]:2 = iree_linalg_ext.topk dimension(1) ins([[X]] : tensor<4x64xf32>) outs([[V0]], [[I0]] : tensor<4x6xf32>, tensor<4x6xi32>) {
// CHECK-NEXT: ^bb0([[A:%.+]]: f32, [[B:%.+]]: f32):
// CHECK-NEXT: [[C:%[0-9]+]] = arith.cmpf ogt, [[A]], [[B]] : f32
// CHECK-NEXT: iree_linalg_ext.yield [[C]] : i1
// CHECK-NEXT: } -> tensor<4x6xf32>, tensor<4x6xi32>
// CHECK-NEXT: [[V:%[0-9]+]] = torch_c.from_builtin_tensor [[TK]]#0 : tensor<4x6xf32> -> !torch.vtensor<[4,6],f32>
// CHECK-NEXT: [[I32:%[0-9]+]] = torch_c.from_builtin_tensor [[TK]]#1 : tensor<4x6xi32> -> !torch.vtensor<[4,6],si32>
// CHECK-NEXT: %int4 = torch.constant.int 4
// CHECK-NEXT: %false = torch.constant.bool false
// CHECK-NEXT: %none = torch.constant.none
// CHECK-NEXT: [[I:%[0-9]+]] = torch.aten.to.dtype [[I32]], %int4, %false, %false, %none : !torch.vtensor<[4,6],si32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[4,6],si64>
// CHECK-NEXT: return [[V]], [[I]] : !torch.vtensor<[4,6],f32>, !torch.vtensor<[4,6],si64>

// A dynamic leading dim (dim given as 1, the last): the outputs take it from tensor.dim.
func.func @dynamic_rows(%x: !torch.vtensor<[?,64],f32>) -> (!torch.vtensor<[?,6],f32>, !torch.vtensor<[?,6],si64>) {
  %int6 = torch.constant.int 6
  %int1 = torch.constant.int 1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %values, %indices = torch.aten.topk %x, %int6, %int1, %true, %false : !torch.vtensor<[?,64],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,6],f32>, !torch.vtensor<[?,6],si64>
  return %values, %indices : !torch.vtensor<[?,6],f32>, !torch.vtensor<[?,6],si64>
}
// CHECK-LABEL: func.func @dynamic_rows(
// CHECK-NEXT: [[X:%[0-9]+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[?,64],f32> -> tensor<?x64xf32>
// CHECK-NEXT: [[C0:%.+]] = arith.constant 0 : index
// CHECK-NEXT: [[D0:%.+]] = tensor.dim [[X]], [[C0]] : tensor<?x64xf32>
// CHECK-NEXT: [[E0:%[0-9]+]] = tensor.empty([[D0]]) : tensor<?x6xf32>
// CHECK-NEXT: [[NINF:%.+]] = arith.constant 0xFF800000 : f32
// CHECK-NEXT: [[V0:%[0-9]+]] = linalg.fill ins([[NINF]] : f32) outs([[E0]] : tensor<?x6xf32>) -> tensor<?x6xf32>
// CHECK-NEXT: [[E1:%[0-9]+]] = tensor.empty([[D0]]) : tensor<?x6xi32>
// CHECK-NEXT: [[IMAX:%.+]] = arith.constant 2147483647 : i32
// CHECK-NEXT: [[I0:%[0-9]+]] = linalg.fill ins([[IMAX]] : i32) outs([[E1]] : tensor<?x6xi32>) -> tensor<?x6xi32>
// CHECK-NEXT: [[TK:%[0-9]+]]:2 = iree_linalg_ext.topk dimension(1) ins([[X]] : tensor<?x64xf32>) outs([[V0]], [[I0]] : tensor<?x6xf32>, tensor<?x6xi32>) {
// CHECK-NEXT: ^bb0([[A:%.+]]: f32, [[B:%.+]]: f32):
// CHECK-NEXT: [[C:%[0-9]+]] = arith.cmpf ogt, [[A]], [[B]] : f32
// CHECK-NEXT: iree_linalg_ext.yield [[C]] : i1
// CHECK-NEXT: } -> tensor<?x6xf32>, tensor<?x6xi32>
// CHECK-NEXT: [[V:%[0-9]+]] = torch_c.from_builtin_tensor [[TK]]#0 : tensor<?x6xf32> -> !torch.vtensor<[?,6],f32>
// CHECK-NEXT: [[I32:%[0-9]+]] = torch_c.from_builtin_tensor [[TK]]#1 : tensor<?x6xi32> -> !torch.vtensor<[?,6],si32>
// CHECK-NEXT: %int4 = torch.constant.int 4
// CHECK-NEXT: %false = torch.constant.bool false
// CHECK-NEXT: %none = torch.constant.none
// CHECK-NEXT: [[I:%[0-9]+]] = torch.aten.to.dtype [[I32]], %int4, %false, %false, %none : !torch.vtensor<[?,6],si32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[?,6],si64>
// CHECK-NEXT: return [[V]], [[I]] : !torch.vtensor<[?,6],f32>, !torch.vtensor<[?,6],si64>

// largest=false on a rank-1 row: the comparator is a strict <, the empty slots start at +inf.
func.func @smallest_rank1(%x: !torch.vtensor<[32],f16>) -> (!torch.vtensor<[3],f16>, !torch.vtensor<[3],si64>) {
  %int3 = torch.constant.int 3
  %int0 = torch.constant.int 0
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %values, %indices = torch.aten.topk %x, %int3, %int0, %false, %true : !torch.vtensor<[32],f16>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[3],f16>, !torch.vtensor<[3],si64>
  return %values, %indices : !torch.vtensor<[3],f16>, !torch.vtensor<[3],si64>
}
// CHECK-LABEL: func.func @smallest_rank1(
// CHECK-NEXT: [[X:%[0-9]+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[32],f16> -> tensor<32xf16>
// CHECK-NEXT: [[E0:%[0-9]+]] = tensor.empty() : tensor<3xf16>
// CHECK-NEXT: [[PINF:%.+]] = arith.constant 0x7C00 : f16
// CHECK-NEXT: [[V0:%[0-9]+]] = linalg.fill ins([[PINF]] : f16) outs([[E0]] : tensor<3xf16>) -> tensor<3xf16>
// CHECK-NEXT: [[E1:%[0-9]+]] = tensor.empty() : tensor<3xi32>
// CHECK-NEXT: [[IMAX:%.+]] = arith.constant 2147483647 : i32
// CHECK-NEXT: [[I0:%[0-9]+]] = linalg.fill ins([[IMAX]] : i32) outs([[E1]] : tensor<3xi32>) -> tensor<3xi32>
// CHECK-NEXT: [[TK:%[0-9]+]]:2 = iree_linalg_ext.topk dimension(0) ins([[X]] : tensor<32xf16>) outs([[V0]], [[I0]] : tensor<3xf16>, tensor<3xi32>) {
// CHECK-NEXT: ^bb0([[A:%.+]]: f16, [[B:%.+]]: f16):
// CHECK-NEXT: [[C:%[0-9]+]] = arith.cmpf olt, [[A]], [[B]] : f16
// CHECK-NEXT: iree_linalg_ext.yield [[C]] : i1
// CHECK-NEXT: } -> tensor<3xf16>, tensor<3xi32>
// CHECK-NEXT: [[V:%[0-9]+]] = torch_c.from_builtin_tensor [[TK]]#0 : tensor<3xf16> -> !torch.vtensor<[3],f16>
// CHECK-NEXT: [[I32:%[0-9]+]] = torch_c.from_builtin_tensor [[TK]]#1 : tensor<3xi32> -> !torch.vtensor<[3],si32>
// CHECK-NEXT: %int4 = torch.constant.int 4
// CHECK-NEXT: %false = torch.constant.bool false
// CHECK-NEXT: %none = torch.constant.none
// CHECK-NEXT: [[I:%[0-9]+]] = torch.aten.to.dtype [[I32]], %int4, %false, %false, %none : !torch.vtensor<[3],si32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[3],si64>
// CHECK-NEXT: return [[V]], [[I]] : !torch.vtensor<[3],f16>, !torch.vtensor<[3],si64>

// Rank 3, two dynamic leading dims and a dynamic row: one tensor.dim per dynamic leading dim.
func.func @rank3_dynamic(%x: !torch.vtensor<[?,2,?,?],f32>) -> (!torch.vtensor<[?,2,?,4],f32>, !torch.vtensor<[?,2,?,4],si64>) {
  %int4 = torch.constant.int 4
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %values, %indices = torch.aten.topk %x, %int4, %int-1, %true, %true : !torch.vtensor<[?,2,?,?],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,2,?,4],f32>, !torch.vtensor<[?,2,?,4],si64>
  return %values, %indices : !torch.vtensor<[?,2,?,4],f32>, !torch.vtensor<[?,2,?,4],si64>
}
// CHECK-LABEL: func.func @rank3_dynamic(
// CHECK-NEXT: [[X:%[0-9]+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[?,2,?,?],f32> -> tensor<?x2x?x?xf32>
// CHECK-NEXT: [[C0:%.+]] = arith.constant 0 : index
// CHECK-NEXT: [[D0:%.+]] = tensor.dim [[X]], [[C0]] : tensor<?x2x?x?xf32>
// CHECK-NEXT: [[C2:%.+]] = arith.constant 2 : index
// CHECK-NEXT: [[D2:%.+]] = tensor.dim [[X]], [[C2]] : tensor<?x2x?x?xf32>
// CHECK-NEXT: [[E0:%[0-9]+]] = tensor.empty([[D0]], [[D2]]) : tensor<?x2x?x4xf32>
// CHECK:      iree_linalg_ext.topk dimension(3) ins([[X]] : tensor<?x2x?x?xf32>)
// CHECK:      torch.aten.to.dtype {{.*}} -> !torch.vtensor<[?,2,?,4],si64>

// A row of 32: rewritten by default, left to torch-mlir's sort under min-size=64.
func.func @short_row(%x: !torch.vtensor<[4,32],f32>) -> !torch.vtensor<[4,2],si64> {
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %values, %indices = torch.aten.topk %x, %int2, %int-1, %true, %true : !torch.vtensor<[4,32],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[4,2],f32>, !torch.vtensor<[4,2],si64>
  return %indices : !torch.vtensor<[4,2],si64>
}
// CHECK-LABEL: func.func @short_row(
// CHECK:       iree_linalg_ext.topk dimension(1)

// min-size=64: rows of 64 and the dynamic-length row are rewritten, rows of 32 are not.
// MIN64-LABEL: func.func @static_largest(
// MIN64-NOT:   torch.aten.topk
// MIN64:       iree_linalg_ext.topk dimension(1) ins({{.*}} : tensor<4x64xf32>)
// MIN64-LABEL: func.func @dynamic_rows(
// MIN64:       iree_linalg_ext.topk
// MIN64-LABEL: func.func @smallest_rank1(
// MIN64-NEXT:  %int3 = torch.constant.int 3
// MIN64-NEXT:  %int0 = torch.constant.int 0
// MIN64-NEXT:  %false = torch.constant.bool false
// MIN64-NEXT:  %true = torch.constant.bool true
// MIN64-NEXT:  %values, %indices = torch.aten.topk %arg0, %int3, %int0, %false, %true
// MIN64-LABEL: func.func @rank3_dynamic(
// MIN64:       iree_linalg_ext.topk dimension(3)
// MIN64-LABEL: func.func @short_row(
// MIN64-NEXT:  %int2 = torch.constant.int 2
// MIN64-NEXT:  %int-1 = torch.constant.int -1
// MIN64-NEXT:  %true = torch.constant.bool true
// MIN64-NEXT:  %values, %indices = torch.aten.topk %arg0, %int2, %int-1, %true, %true
// MIN64-NOT:   iree_linalg_ext.topk

// min-size beyond every static row length: only the dynamic-length row (@rank3_dynamic) is
// rewritten; a dynamic leading dim does not matter.
// MINBIG-LABEL: func.func @static_largest(
// MINBIG-NEXT:  %int6 = torch.constant.int 6
// MINBIG-NEXT:  %int-1 = torch.constant.int -1
// MINBIG-NEXT:  %true = torch.constant.bool true
// MINBIG-NEXT:  %values, %indices = torch.aten.topk
// MINBIG-LABEL: func.func @dynamic_rows(
// MINBIG-NOT:   iree_linalg_ext.topk
// MINBIG-LABEL: func.func @smallest_rank1(
// MINBIG-NOT:   iree_linalg_ext.topk
// MINBIG-LABEL: func.func @rank3_dynamic(
// MINBIG-NEXT:  torch_c.to_builtin_tensor
// MINBIG-LABEL: func.func @short_row(
// MINBIG-NOT:   iree_linalg_ext.topk
