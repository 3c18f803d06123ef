// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=4})' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=4})' | filecheck %s --check-prefix=SHAPES
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=8})' | filecheck %s --check-prefix=TILE8
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles)' | filecheck %s --check-prefix=DEFAULT
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=2 decode-tile=8})' | filecheck %s --check-prefix=DTILE

// The tile=4 run pins the exact expansion. The shape run checks that no dsa_attention is left and
// that no tensor of the cache size squared ([32,32]) nor of queries x all K slots exists.
// SHAPES-NOT: torch.day0.dsa_attention
// SHAPES-NOT: [32,32]
// SHAPES-NOT: [?,2,8]
// SHAPES-NOT: vtensor<[2,8]

// Decode (S = 1), K = 8 in two tiles of 4: gathered rows [4,16], scores [2,4], never [32,32].
func.func @decode_two_tiles(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,8],si64>) -> !torch.vtensor<[1,2,12],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 12
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,12],f32>
  return %0 : !torch.vtensor<[1,2,12],f32>
}
// CHECK-LABEL: func.func @decode_two_tiles(
// CHECK-NEXT: %int1 = torch.constant.int 1
// CHECK-NEXT: %int0 = torch.constant.int 0
// CHECK-NEXT: %int-1 = torch.constant.int -1
// CHECK-NEXT: %int2 = torch.constant.int 2
// CHECK-NEXT: %int16 = torch.constant.int 16
// CHECK-NEXT: [[L0:%[0-9]+]] = torch.prim.ListConstruct %int2, %int16 : (!torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW0:%[0-9]+]] = torch.aten.view %arg0, [[L0]] : !torch.vtensor<[1,2,16],f32>, !torch.list<int> -> !torch.vtensor<[2,16],f32>
// CHECK-NEXT: %int8 = torch.constant.int 8
// CHECK-NEXT: [[L1:%[0-9]+]] = torch.prim.ListConstruct %int8 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW1:%[0-9]+]] = torch.aten.view %arg2, [[L1]] : !torch.vtensor<[1,8],si64>, !torch.list<int> -> !torch.vtensor<[8],si64>
// CHECK-NEXT: %int4 = torch.constant.int 4
// CHECK-NEXT: [[SEL0:%[0-9]+]] = torch.aten.slice.Tensor [[VIEW1]], %int0, %int0, %int4, %int1 : !torch.vtensor<[8],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4],si64>
// CHECK-NEXT: [[VALID0:%[0-9]+]] = torch.aten.ge.Scalar [[SEL0]], %int0 : !torch.vtensor<[4],si64>, !torch.int -> !torch.vtensor<[4],i1>
// CHECK-NEXT: %none = torch.constant.none
// CHECK-NEXT: [[SAFE0:%[0-9]+]] = torch.aten.clamp [[SEL0]], %int0, %none : !torch.vtensor<[4],si64>, !torch.int, !torch.none -> !torch.vtensor<[4],si64>
// CHECK-NEXT: [[ROWS0:%[0-9]+]] = torch.aten.index_select %arg1, %int0, [[SAFE0]] : !torch.vtensor<[32,16],f32>, !torch.int, !torch.vtensor<[4],si64> -> !torch.vtensor<[4,16],f32>
// CHECK-NEXT: %int-2 = torch.constant.int -2
// CHECK-NEXT: [[ROWST0:%[0-9]+]] = torch.aten.transpose.int [[ROWS0]], %int-2, %int-1 : !torch.vtensor<[4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[16,4],f32>
// CHECK-NEXT: [[SCORE0:%[0-9]+]] = torch.aten.mm [[VIEW0]], [[ROWST0]] : !torch.vtensor<[2,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: %float1.250000e-01 = torch.constant.float 1.250000e-01
// CHECK-NEXT: [[SCALED0:%[0-9]+]] = torch.aten.mul.Scalar [[SCORE0]], %float1.250000e-01 : !torch.vtensor<[2,4],f32>, !torch.float -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: %float-1.000000e30 = torch.constant.float -1.000000e+30
// CHECK-NEXT: [[MASKED0:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID0]], [[SCALED0]], %float-1.000000e30 : !torch.vtensor<[4],i1>, !torch.vtensor<[2,4],f32>, !torch.float -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[L2:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: %true = torch.constant.bool true
// CHECK-NEXT: [[TMAX0:%[0-9]+]] = torch.aten.amax [[MASKED0]], [[L2]], %true : !torch.vtensor<[2,4],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[DIFF0:%[0-9]+]] = torch.aten.sub.Tensor [[MASKED0]], [[TMAX0]], %int1 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,1],f32>, !torch.int -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[EXP0:%[0-9]+]] = torch.aten.exp [[DIFF0]] : !torch.vtensor<[2,4],f32> -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: %float0.000000e00 = torch.constant.float 0.000000e+00
// CHECK-NEXT: [[P0:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID0]], [[EXP0]], %float0.000000e00 : !torch.vtensor<[4],i1>, !torch.vtensor<[2,4],f32>, !torch.float -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[L3:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[PSUM0:%[0-9]+]] = torch.aten.sum.dim_IntList [[P0]], [[L3]], %true, %none : !torch.vtensor<[2,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: %int12 = torch.constant.int 12
// CHECK-NEXT: [[VAL0:%[0-9]+]] = torch.aten.slice.Tensor [[ROWS0]], %int-1, %int0, %int12, %int1 : !torch.vtensor<[4,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4,12],f32>
// CHECK-NEXT: [[PV0:%[0-9]+]] = torch.aten.mm [[P0]], [[VAL0]] : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,12],f32> -> !torch.vtensor<[2,12],f32>
// CHECK-NEXT: [[SEL1:%[0-9]+]] = torch.aten.slice.Tensor [[VIEW1]], %int0, %int4, %int8, %int1 : !torch.vtensor<[8],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4],si64>
// CHECK-NEXT: [[VALID1:%[0-9]+]] = torch.aten.ge.Scalar [[SEL1]], %int0 : !torch.vtensor<[4],si64>, !torch.int -> !torch.vtensor<[4],i1>
// CHECK-NEXT: [[SAFE1:%[0-9]+]] = torch.aten.clamp [[SEL1]], %int0, %none : !torch.vtensor<[4],si64>, !torch.int, !torch.none -> !torch.vtensor<[4],si64>
// CHECK-NEXT: [[ROWS1:%[0-9]+]] = torch.aten.index_select %arg1, %int0, [[SAFE1]] : !torch.vtensor<[32,16],f32>, !torch.int, !torch.vtensor<[4],si64> -> !torch.vtensor<[4,16],f32>
// CHECK-NEXT: [[ROWST1:%[0-9]+]] = torch.aten.transpose.int [[ROWS1]], %int-2, %int-1 : !torch.vtensor<[4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[16,4],f32>
// CHECK-NEXT: [[SCORE1:%[0-9]+]] = torch.aten.mm [[VIEW0]], [[ROWST1]] : !torch.vtensor<[2,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[SCALED1:%[0-9]+]] = torch.aten.mul.Scalar [[SCORE1]], %float1.250000e-01 : !torch.vtensor<[2,4],f32>, !torch.float -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[MASKED1:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID1]], [[SCALED1]], %float-1.000000e30 : !torch.vtensor<[4],i1>, !torch.vtensor<[2,4],f32>, !torch.float -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[L4:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[TMAX1:%[0-9]+]] = torch.aten.amax [[MASKED1]], [[L4]], %true : !torch.vtensor<[2,4],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[MAX0:%[0-9]+]] = torch.aten.maximum [[TMAX0]], [[TMAX1]] : !torch.vtensor<[2,1],f32>, !torch.vtensor<[2,1],f32> -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[DIFF1:%[0-9]+]] = torch.aten.sub.Tensor [[MASKED1]], [[MAX0]], %int1 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,1],f32>, !torch.int -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[EXP1:%[0-9]+]] = torch.aten.exp [[DIFF1]] : !torch.vtensor<[2,4],f32> -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[P1:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID1]], [[EXP1]], %float0.000000e00 : !torch.vtensor<[4],i1>, !torch.vtensor<[2,4],f32>, !torch.float -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT: [[L5:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[PSUM1:%[0-9]+]] = torch.aten.sum.dim_IntList [[P1]], [[L5]], %true, %none : !torch.vtensor<[2,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[VAL1:%[0-9]+]] = torch.aten.slice.Tensor [[ROWS1]], %int-1, %int0, %int12, %int1 : !torch.vtensor<[4,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4,12],f32>
// CHECK-NEXT: [[PV1:%[0-9]+]] = torch.aten.mm [[P1]], [[VAL1]] : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,12],f32> -> !torch.vtensor<[2,12],f32>
// CHECK-NEXT: [[MDIFF:%[0-9]+]] = torch.aten.sub.Tensor [[TMAX0]], [[MAX0]], %int1 : !torch.vtensor<[2,1],f32>, !torch.vtensor<[2,1],f32>, !torch.int -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[ALPHA:%[0-9]+]] = torch.aten.exp [[MDIFF]] : !torch.vtensor<[2,1],f32> -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[LSCALED:%[0-9]+]] = torch.aten.mul.Tensor [[PSUM0]], [[ALPHA]] : !torch.vtensor<[2,1],f32>, !torch.vtensor<[2,1],f32> -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[LSUM:%[0-9]+]] = torch.aten.add.Tensor [[LSCALED]], [[PSUM1]], %int1 : !torch.vtensor<[2,1],f32>, !torch.vtensor<[2,1],f32>, !torch.int -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[ACCSCALED:%[0-9]+]] = torch.aten.mul.Tensor [[PV0]], [[ALPHA]] : !torch.vtensor<[2,12],f32>, !torch.vtensor<[2,1],f32> -> !torch.vtensor<[2,12],f32>
// CHECK-NEXT: [[ACC:%[0-9]+]] = torch.aten.add.Tensor [[ACCSCALED]], [[PV1]], %int1 : !torch.vtensor<[2,12],f32>, !torch.vtensor<[2,12],f32>, !torch.int -> !torch.vtensor<[2,12],f32>
// CHECK-NEXT: %float1.000000e-30 = torch.constant.float 1.000000e-30
// CHECK-NEXT: [[LPOS:%[0-9]+]] = torch.aten.clamp [[LSUM]], %float1.000000e-30, %none : !torch.vtensor<[2,1],f32>, !torch.float, !torch.none -> !torch.vtensor<[2,1],f32>
// CHECK-NEXT: [[OUT0:%[0-9]+]] = torch.aten.div.Tensor [[ACC]], [[LPOS]] : !torch.vtensor<[2,12],f32>, !torch.vtensor<[2,1],f32> -> !torch.vtensor<[2,12],f32>
// CHECK-NEXT: [[L6:%[0-9]+]] = torch.prim.ListConstruct %int1, %int2, %int12 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW2:%[0-9]+]] = torch.aten.view [[OUT0]], [[L6]] : !torch.vtensor<[2,12],f32>, !torch.list<int> -> !torch.vtensor<[1,2,12],f32>
// CHECK-NEXT: return [[VIEW2]] : !torch.vtensor<[1,2,12],f32>
// TILE8-LABEL: func.func @decode_two_tiles(
// TILE8-COUNT-1: torch.aten.index_select {{.*}} -> !torch.vtensor<[8,16],f32>
// TILE8-NOT: torch.aten.index_select
// TILE8-NOT: torch.aten.maximum
// TILE8: return
// DEFAULT-LABEL: func.func @decode_two_tiles(
// DEFAULT-COUNT-1: torch.aten.index_select {{.*}} -> !torch.vtensor<[8,16],f32>
// DEFAULT-NOT: torch.aten.index_select
// DEFAULT: return
// DTILE-LABEL: func.func @decode_two_tiles(
// DTILE-COUNT-1: torch.aten.index_select {{.*}} -> !torch.vtensor<[8,16],f32>
// DTILE-NOT: torch.aten.index_select
// DTILE: return

// Prefill (S dynamic), K = 8 in two tiles of 4: scores are one tile [?,2,4], never [?,2,8].
func.func @prefill_two_tiles(%q: !torch.vtensor<[?,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[?,8],si64>) -> !torch.vtensor<[?,2,12],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 12
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[?,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[?,8],si64>, !torch.float, !torch.int) -> !torch.vtensor<[?,2,12],f32>
  return %0 : !torch.vtensor<[?,2,12],f32>
}
// CHECK-LABEL: func.func @prefill_two_tiles(
// CHECK-NEXT: %int1 = torch.constant.int 1
// CHECK-NEXT: %int0 = torch.constant.int 0
// CHECK-NEXT: %int-1 = torch.constant.int -1
// CHECK-NEXT: %int4 = torch.constant.int 4
// CHECK-NEXT: [[SEL0:%[0-9]+]] = torch.aten.slice.Tensor %arg2, %int1, %int0, %int4, %int1 : !torch.vtensor<[?,8],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[?,4],si64>
// CHECK-NEXT: [[VALID0:%[0-9]+]] = torch.aten.ge.Scalar [[SEL0]], %int0 : !torch.vtensor<[?,4],si64>, !torch.int -> !torch.vtensor<[?,4],i1>
// CHECK-NEXT: [[VALID1:%[0-9]+]] = torch.aten.unsqueeze [[VALID0]], %int1 : !torch.vtensor<[?,4],i1>, !torch.int -> !torch.vtensor<[?,1,4],i1>
// CHECK-NEXT: %none = torch.constant.none
// CHECK-NEXT: [[SAFE0:%[0-9]+]] = torch.aten.clamp [[SEL0]], %int0, %none : !torch.vtensor<[?,4],si64>, !torch.int, !torch.none -> !torch.vtensor<[?,4],si64>
// CHECK-NEXT: [[L0:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW0:%[0-9]+]] = torch.aten.view [[SAFE0]], [[L0]] : !torch.vtensor<[?,4],si64>, !torch.list<int> -> !torch.vtensor<[?],si64>
// CHECK-NEXT: [[ROWS0:%[0-9]+]] = torch.aten.index_select %arg1, %int0, [[VIEW0]] : !torch.vtensor<[32,16],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,16],f32>
// CHECK-NEXT: %int16 = torch.constant.int 16
// CHECK-NEXT: [[L1:%[0-9]+]] = torch.prim.ListConstruct %int-1, %int4, %int16 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW1:%[0-9]+]] = torch.aten.view [[ROWS0]], [[L1]] : !torch.vtensor<[?,16],f32>, !torch.list<int> -> !torch.vtensor<[?,4,16],f32>
// CHECK-NEXT: %int-2 = torch.constant.int -2
// CHECK-NEXT: [[ROWST0:%[0-9]+]] = torch.aten.transpose.int [[VIEW1]], %int-2, %int-1 : !torch.vtensor<[?,4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,16,4],f32>
// CHECK-NEXT: [[SCORE0:%[0-9]+]] = torch.aten.bmm %arg0, [[ROWST0]] : !torch.vtensor<[?,2,16],f32>, !torch.vtensor<[?,16,4],f32> -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: %float1.250000e-01 = torch.constant.float 1.250000e-01
// CHECK-NEXT: [[SCALED0:%[0-9]+]] = torch.aten.mul.Scalar [[SCORE0]], %float1.250000e-01 : !torch.vtensor<[?,2,4],f32>, !torch.float -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: %float-1.000000e30 = torch.constant.float -1.000000e+30
// CHECK-NEXT: [[MASKED0:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID1]], [[SCALED0]], %float-1.000000e30 : !torch.vtensor<[?,1,4],i1>, !torch.vtensor<[?,2,4],f32>, !torch.float -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[L2:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: %true = torch.constant.bool true
// CHECK-NEXT: [[TMAX0:%[0-9]+]] = torch.aten.amax [[MASKED0]], [[L2]], %true : !torch.vtensor<[?,2,4],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[DIFF0:%[0-9]+]] = torch.aten.sub.Tensor [[MASKED0]], [[TMAX0]], %int1 : !torch.vtensor<[?,2,4],f32>, !torch.vtensor<[?,2,1],f32>, !torch.int -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[EXP0:%[0-9]+]] = torch.aten.exp [[DIFF0]] : !torch.vtensor<[?,2,4],f32> -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: %float0.000000e00 = torch.constant.float 0.000000e+00
// CHECK-NEXT: [[P0:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID1]], [[EXP0]], %float0.000000e00 : !torch.vtensor<[?,1,4],i1>, !torch.vtensor<[?,2,4],f32>, !torch.float -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[L3:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[PSUM0:%[0-9]+]] = torch.aten.sum.dim_IntList [[P0]], [[L3]], %true, %none : !torch.vtensor<[?,2,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: %int12 = torch.constant.int 12
// CHECK-NEXT: [[VAL0:%[0-9]+]] = torch.aten.slice.Tensor [[VIEW1]], %int-1, %int0, %int12, %int1 : !torch.vtensor<[?,4,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[?,4,12],f32>
// CHECK-NEXT: [[PV0:%[0-9]+]] = torch.aten.bmm [[P0]], [[VAL0]] : !torch.vtensor<[?,2,4],f32>, !torch.vtensor<[?,4,12],f32> -> !torch.vtensor<[?,2,12],f32>
// CHECK-NEXT: %int8 = torch.constant.int 8
// CHECK-NEXT: [[SEL1:%[0-9]+]] = torch.aten.slice.Tensor %arg2, %int1, %int4, %int8, %int1 : !torch.vtensor<[?,8],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[?,4],si64>
// CHECK-NEXT: [[VALID2:%[0-9]+]] = torch.aten.ge.Scalar [[SEL1]], %int0 : !torch.vtensor<[?,4],si64>, !torch.int -> !torch.vtensor<[?,4],i1>
// CHECK-NEXT: [[VALID3:%[0-9]+]] = torch.aten.unsqueeze [[VALID2]], %int1 : !torch.vtensor<[?,4],i1>, !torch.int -> !torch.vtensor<[?,1,4],i1>
// CHECK-NEXT: [[SAFE1:%[0-9]+]] = torch.aten.clamp [[SEL1]], %int0, %none : !torch.vtensor<[?,4],si64>, !torch.int, !torch.none -> !torch.vtensor<[?,4],si64>
// CHECK-NEXT: [[L4:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW2:%[0-9]+]] = torch.aten.view [[SAFE1]], [[L4]] : !torch.vtensor<[?,4],si64>, !torch.list<int> -> !torch.vtensor<[?],si64>
// CHECK-NEXT: [[ROWS1:%[0-9]+]] = torch.aten.index_select %arg1, %int0, [[VIEW2]] : !torch.vtensor<[32,16],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,16],f32>
// CHECK-NEXT: [[L5:%[0-9]+]] = torch.prim.ListConstruct %int-1, %int4, %int16 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW3:%[0-9]+]] = torch.aten.view [[ROWS1]], [[L5]] : !torch.vtensor<[?,16],f32>, !torch.list<int> -> !torch.vtensor<[?,4,16],f32>
// CHECK-NEXT: [[ROWST1:%[0-9]+]] = torch.aten.transpose.int [[VIEW3]], %int-2, %int-1 : !torch.vtensor<[?,4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,16,4],f32>
// CHECK-NEXT: [[SCORE1:%[0-9]+]] = torch.aten.bmm %arg0, [[ROWST1]] : !torch.vtensor<[?,2,16],f32>, !torch.vtensor<[?,16,4],f32> -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[SCALED1:%[0-9]+]] = torch.aten.mul.Scalar [[SCORE1]], %float1.250000e-01 : !torch.vtensor<[?,2,4],f32>, !torch.float -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[MASKED1:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID3]], [[SCALED1]], %float-1.000000e30 : !torch.vtensor<[?,1,4],i1>, !torch.vtensor<[?,2,4],f32>, !torch.float -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[L6:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[TMAX1:%[0-9]+]] = torch.aten.amax [[MASKED1]], [[L6]], %true : !torch.vtensor<[?,2,4],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[MAX0:%[0-9]+]] = torch.aten.maximum [[TMAX0]], [[TMAX1]] : !torch.vtensor<[?,2,1],f32>, !torch.vtensor<[?,2,1],f32> -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[DIFF1:%[0-9]+]] = torch.aten.sub.Tensor [[MASKED1]], [[MAX0]], %int1 : !torch.vtensor<[?,2,4],f32>, !torch.vtensor<[?,2,1],f32>, !torch.int -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[EXP1:%[0-9]+]] = torch.aten.exp [[DIFF1]] : !torch.vtensor<[?,2,4],f32> -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[P1:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID3]], [[EXP1]], %float0.000000e00 : !torch.vtensor<[?,1,4],i1>, !torch.vtensor<[?,2,4],f32>, !torch.float -> !torch.vtensor<[?,2,4],f32>
// CHECK-NEXT: [[L7:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[PSUM1:%[0-9]+]] = torch.aten.sum.dim_IntList [[P1]], [[L7]], %true, %none : !torch.vtensor<[?,2,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[VAL1:%[0-9]+]] = torch.aten.slice.Tensor [[VIEW3]], %int-1, %int0, %int12, %int1 : !torch.vtensor<[?,4,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[?,4,12],f32>
// CHECK-NEXT: [[PV1:%[0-9]+]] = torch.aten.bmm [[P1]], [[VAL1]] : !torch.vtensor<[?,2,4],f32>, !torch.vtensor<[?,4,12],f32> -> !torch.vtensor<[?,2,12],f32>
// CHECK-NEXT: [[MDIFF:%[0-9]+]] = torch.aten.sub.Tensor [[TMAX0]], [[MAX0]], %int1 : !torch.vtensor<[?,2,1],f32>, !torch.vtensor<[?,2,1],f32>, !torch.int -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[ALPHA:%[0-9]+]] = torch.aten.exp [[MDIFF]] : !torch.vtensor<[?,2,1],f32> -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[LSCALED:%[0-9]+]] = torch.aten.mul.Tensor [[PSUM0]], [[ALPHA]] : !torch.vtensor<[?,2,1],f32>, !torch.vtensor<[?,2,1],f32> -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[LSUM:%[0-9]+]] = torch.aten.add.Tensor [[LSCALED]], [[PSUM1]], %int1 : !torch.vtensor<[?,2,1],f32>, !torch.vtensor<[?,2,1],f32>, !torch.int -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[ACCSCALED:%[0-9]+]] = torch.aten.mul.Tensor [[PV0]], [[ALPHA]] : !torch.vtensor<[?,2,12],f32>, !torch.vtensor<[?,2,1],f32> -> !torch.vtensor<[?,2,12],f32>
// CHECK-NEXT: [[ACC:%[0-9]+]] = torch.aten.add.Tensor [[ACCSCALED]], [[PV1]], %int1 : !torch.vtensor<[?,2,12],f32>, !torch.vtensor<[?,2,12],f32>, !torch.int -> !torch.vtensor<[?,2,12],f32>
// CHECK-NEXT: %float1.000000e-30 = torch.constant.float 1.000000e-30
// CHECK-NEXT: [[LPOS:%[0-9]+]] = torch.aten.clamp [[LSUM]], %float1.000000e-30, %none : !torch.vtensor<[?,2,1],f32>, !torch.float, !torch.none -> !torch.vtensor<[?,2,1],f32>
// CHECK-NEXT: [[OUT0:%[0-9]+]] = torch.aten.div.Tensor [[ACC]], [[LPOS]] : !torch.vtensor<[?,2,12],f32>, !torch.vtensor<[?,2,1],f32> -> !torch.vtensor<[?,2,12],f32>
// CHECK-NEXT: return [[OUT0]] : !torch.vtensor<[?,2,12],f32>
// TILE8-LABEL: func.func @prefill_two_tiles(
// TILE8-COUNT-1: torch.aten.bmm {{.*}} -> !torch.vtensor<[?,2,8],f32>
// TILE8-NOT: torch.aten.maximum
// TILE8: return
// DEFAULT-LABEL: func.func @prefill_two_tiles(
// DEFAULT-COUNT-1: torch.aten.bmm {{.*}} -> !torch.vtensor<[?,2,8],f32>
// DEFAULT-NOT: torch.aten.maximum
// DEFAULT: return
// DTILE-LABEL: func.func @prefill_two_tiles(
// DTILE-COUNT-4: torch.aten.index_select {{.*}} -> !torch.vtensor<[?,16],f32>
// DTILE-NOT: torch.aten.index_select
// DTILE: return

// tile == K: one tile, no slice of the indices and no rescaling.
func.func @prefill_one_tile(%q: !torch.vtensor<[5,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[5,4],si64>) -> !torch.vtensor<[5,2,16],f32> {
  %scale = torch.constant.float 2.500000e-01
  %vdim = torch.constant.int 16
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[5,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[5,4],si64>, !torch.float, !torch.int) -> !torch.vtensor<[5,2,16],f32>
  return %0 : !torch.vtensor<[5,2,16],f32>
}
// CHECK-LABEL: func.func @prefill_one_tile(
// CHECK-NEXT: %int1 = torch.constant.int 1
// CHECK-NEXT: %int0 = torch.constant.int 0
// CHECK-NEXT: %int-1 = torch.constant.int -1
// CHECK-NEXT: [[VALID0:%[0-9]+]] = torch.aten.ge.Scalar %arg2, %int0 : !torch.vtensor<[5,4],si64>, !torch.int -> !torch.vtensor<[5,4],i1>
// CHECK-NEXT: [[VALID1:%[0-9]+]] = torch.aten.unsqueeze [[VALID0]], %int1 : !torch.vtensor<[5,4],i1>, !torch.int -> !torch.vtensor<[5,1,4],i1>
// CHECK-NEXT: %none = torch.constant.none
// CHECK-NEXT: [[SAFE0:%[0-9]+]] = torch.aten.clamp %arg2, %int0, %none : !torch.vtensor<[5,4],si64>, !torch.int, !torch.none -> !torch.vtensor<[5,4],si64>
// CHECK-NEXT: [[L0:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW0:%[0-9]+]] = torch.aten.view [[SAFE0]], [[L0]] : !torch.vtensor<[5,4],si64>, !torch.list<int> -> !torch.vtensor<[20],si64>
// CHECK-NEXT: [[ROWS0:%[0-9]+]] = torch.aten.index_select %arg1, %int0, [[VIEW0]] : !torch.vtensor<[32,16],f32>, !torch.int, !torch.vtensor<[20],si64> -> !torch.vtensor<[20,16],f32>
// CHECK-NEXT: %int4 = torch.constant.int 4
// CHECK-NEXT: %int16 = torch.constant.int 16
// CHECK-NEXT: [[L1:%[0-9]+]] = torch.prim.ListConstruct %int-1, %int4, %int16 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT: [[VIEW1:%[0-9]+]] = torch.aten.view [[ROWS0]], [[L1]] : !torch.vtensor<[20,16],f32>, !torch.list<int> -> !torch.vtensor<[5,4,16],f32>
// CHECK-NEXT: %int-2 = torch.constant.int -2
// CHECK-NEXT: [[ROWST0:%[0-9]+]] = torch.aten.transpose.int [[VIEW1]], %int-2, %int-1 : !torch.vtensor<[5,4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[5,16,4],f32>
// CHECK-NEXT: [[SCORE0:%[0-9]+]] = torch.aten.bmm %arg0, [[ROWST0]] : !torch.vtensor<[5,2,16],f32>, !torch.vtensor<[5,16,4],f32> -> !torch.vtensor<[5,2,4],f32>
// CHECK-NEXT: %float2.500000e-01 = torch.constant.float 2.500000e-01
// CHECK-NEXT: [[SCALED0:%[0-9]+]] = torch.aten.mul.Scalar [[SCORE0]], %float2.500000e-01 : !torch.vtensor<[5,2,4],f32>, !torch.float -> !torch.vtensor<[5,2,4],f32>
// CHECK-NEXT: %float-1.000000e30 = torch.constant.float -1.000000e+30
// CHECK-NEXT: [[MASKED0:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID1]], [[SCALED0]], %float-1.000000e30 : !torch.vtensor<[5,1,4],i1>, !torch.vtensor<[5,2,4],f32>, !torch.float -> !torch.vtensor<[5,2,4],f32>
// CHECK-NEXT: [[L2:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: %true = torch.constant.bool true
// CHECK-NEXT: [[TMAX0:%[0-9]+]] = torch.aten.amax [[MASKED0]], [[L2]], %true : !torch.vtensor<[5,2,4],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[5,2,1],f32>
// CHECK-NEXT: [[DIFF0:%[0-9]+]] = torch.aten.sub.Tensor [[MASKED0]], [[TMAX0]], %int1 : !torch.vtensor<[5,2,4],f32>, !torch.vtensor<[5,2,1],f32>, !torch.int -> !torch.vtensor<[5,2,4],f32>
// CHECK-NEXT: [[EXP0:%[0-9]+]] = torch.aten.exp [[DIFF0]] : !torch.vtensor<[5,2,4],f32> -> !torch.vtensor<[5,2,4],f32>
// CHECK-NEXT: %float0.000000e00 = torch.constant.float 0.000000e+00
// CHECK-NEXT: [[P0:%[0-9]+]] = torch.aten.where.ScalarOther [[VALID1]], [[EXP0]], %float0.000000e00 : !torch.vtensor<[5,1,4],i1>, !torch.vtensor<[5,2,4],f32>, !torch.float -> !torch.vtensor<[5,2,4],f32>
// CHECK-NEXT: [[L3:%[0-9]+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT: [[PSUM0:%[0-9]+]] = torch.aten.sum.dim_IntList [[P0]], [[L3]], %true, %none : !torch.vtensor<[5,2,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[5,2,1],f32>
// CHECK-NEXT: [[PV0:%[0-9]+]] = torch.aten.bmm [[P0]], [[VIEW1]] : !torch.vtensor<[5,2,4],f32>, !torch.vtensor<[5,4,16],f32> -> !torch.vtensor<[5,2,16],f32>
// CHECK-NEXT: %float1.000000e-30 = torch.constant.float 1.000000e-30
// CHECK-NEXT: [[LPOS:%[0-9]+]] = torch.aten.clamp [[PSUM0]], %float1.000000e-30, %none : !torch.vtensor<[5,2,1],f32>, !torch.float, !torch.none -> !torch.vtensor<[5,2,1],f32>
// CHECK-NEXT: [[OUT0:%[0-9]+]] = torch.aten.div.Tensor [[PV0]], [[LPOS]] : !torch.vtensor<[5,2,16],f32>, !torch.vtensor<[5,2,1],f32> -> !torch.vtensor<[5,2,16],f32>
// CHECK-NEXT: return [[OUT0]] : !torch.vtensor<[5,2,16],f32>
// DTILE-LABEL: func.func @prefill_one_tile(
// DTILE-COUNT-2: torch.aten.index_select {{.*}} -> !torch.vtensor<[10,16],f32>
// DTILE-NOT: torch.aten.index_select
// DTILE: return

// bf16 io: q and rows are widened to f32 and the result is f32 (no rounding, no narrowing). q is
// rounded to bf16 on its bits (nearest even; a no-op on bf16 values), so the caller's narrowing
// of q survives IREE's CPU codegen dropping a truncf -> extf pair inside one dispatch.
func.func @decode_bf16(%q: !torch.vtensor<[1,2,16],bf16>, %kv: !torch.vtensor<[32,16],bf16>, %idx: !torch.vtensor<[1,4],si64>) -> !torch.vtensor<[1,2,12],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 12
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],bf16>, !torch.vtensor<[32,16],bf16>, !torch.vtensor<[1,4],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,12],f32>
  return %0 : !torch.vtensor<[1,2,12],f32>
}
// CHECK-LABEL: func.func @decode_bf16(
// CHECK: [[QV:%[0-9]+]] = torch.aten.view %arg0, {{.*}} -> !torch.vtensor<[2,16],bf16>
// CHECK: [[QW:%[0-9]+]] = torch.aten.to.dtype [[QV]], %int6, %false, %false, %none : !torch.vtensor<[2,16],bf16>, {{.*}} -> !torch.vtensor<[2,16],f32>
// CHECK-NEXT: %int3 = torch.constant.int 3
// CHECK-NEXT: [[QB:%[0-9]+]] = torch.aten.view.dtype [[QW]], %int3 : !torch.vtensor<[2,16],f32>, !torch.int -> !torch.vtensor<[2,16],si32>
// CHECK-NEXT: %int65536 = torch.constant.int 65536
// CHECK-NEXT: [[QL:%[0-9]+]] = torch.aten.bitwise_and.Scalar [[QB]], %int65536 : {{.*}} -> !torch.vtensor<[2,16],si32>
// CHECK-NEXT: [[QLSB:%[0-9]+]] = torch.aten.floor_divide.Scalar [[QL]], %int65536 : {{.*}} -> !torch.vtensor<[2,16],si32>
// CHECK-NEXT: %int32767 = torch.constant.int 32767
// CHECK-NEXT: [[QH:%[0-9]+]] = torch.aten.add.Scalar [[QB]], %int32767, %int1 : {{.*}} -> !torch.vtensor<[2,16],si32>
// CHECK-NEXT: [[QS:%[0-9]+]] = torch.aten.add.Tensor [[QH]], [[QLSB]], %int1 : {{.*}} -> !torch.vtensor<[2,16],si32>
// CHECK-NEXT: %int-65536 = torch.constant.int -65536
// CHECK-NEXT: [[QM:%[0-9]+]] = torch.aten.bitwise_and.Scalar [[QS]], %int-65536 : {{.*}} -> !torch.vtensor<[2,16],si32>
// CHECK-NEXT: [[Q:%[0-9]+]] = torch.aten.view.dtype [[QM]], %int6 : !torch.vtensor<[2,16],si32>, !torch.int -> !torch.vtensor<[2,16],f32>
// CHECK: [[ROWS:%[0-9]+]] = torch.aten.index_select %arg1, {{.*}} -> !torch.vtensor<[4,16],bf16>
// CHECK-NEXT: [[ROWSW:%[0-9]+]] = torch.aten.to.dtype [[ROWS]], %int6, {{.*}} -> !torch.vtensor<[4,16],f32>
// CHECK: torch.aten.mm [[Q]], {{.*}} -> !torch.vtensor<[2,4],f32>
// CHECK: [[OUT:%[0-9]+]] = torch.aten.view {{.*}} -> !torch.vtensor<[1,2,12],f32>
// CHECK-NEXT: return [[OUT]] : !torch.vtensor<[1,2,12],f32>

// A paged pool (models/paging.py): the cache's row count T is the pool's, chosen at load, so it is
// dynamic; the indices are already pool rows (a batch of 3 sequences decoding one token each, every
// row through its own block table). The gather reads the pool directly, as for a dense cache.
func.func @paged_pool_batch(%q: !torch.vtensor<[3,2,16],f32>, %kv: !torch.vtensor<[?,16],f32>, %idx: !torch.vtensor<[3,4],si64>) -> !torch.vtensor<[3,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[3,2,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[3,4],si64>, !torch.float, !torch.int) -> !torch.vtensor<[3,2,16],f32>
  return %0 : !torch.vtensor<[3,2,16],f32>
}
// SHAPES-LABEL: func.func @paged_pool_batch(
// SHAPES: torch.aten.index_select %arg1, %int0, {{%[0-9]+}} : !torch.vtensor<[?,16],f32>, !torch.int, !torch.vtensor<[12],si64> -> !torch.vtensor<[12,16],f32>
// SHAPES: return {{%[0-9]+}} : !torch.vtensor<[3,2,16],f32>
