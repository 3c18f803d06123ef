// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{block=4})' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{block=4})' | filecheck %s --check-prefix=SHAPES
// RUN: day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{block=4 tile=1})' | filecheck %s --check-prefix=OVERRIDE

// block=4 (glm5_next's k-pool of 4): K = 7 slots = one pool of 4 + a tail of 3. Each tile is
// gathered as ONE aligned block of the cache viewed [T/4, 4, D]: the pool id is
// clamp(max(slots), 0) // 4, an index_select of [n, 4, D] (sliced to [n, 3, D] for the tail), never
// one index per slot.
// SHAPES-NOT: torch.day0.dsa_attention
// SHAPES-NOT: [32,32]
// SHAPES-NOT: vtensor<[4,16],si64>
// OVERRIDE: torch.aten.floor_divide.Scalar

// Decode (S = 1), T = 32.
func.func @decode_pool_and_tail(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,7],si64>) -> !torch.vtensor<[1,2,12],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 12
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,7],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,12],f32>
  return %0 : !torch.vtensor<[1,2,12],f32>
}
// CHECK-LABEL: func.func @decode_pool_and_tail(
// CHECK: [[BLOCKS:%[0-9]+]] = torch.aten.view %arg1, {{%[0-9]+}} : !torch.vtensor<[32,16],f32>, !torch.list<int> -> !torch.vtensor<[8,4,16],f32>
// first tile: slots 0..3, one whole pool
// CHECK: [[SEL0:%[0-9]+]] = torch.aten.slice.Tensor {{%[0-9]+}}, %int0, %int0, %int4, %int1 : !torch.vtensor<[7],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4],si64>
// CHECK: [[TOP0:%[0-9]+]] = torch.aten.amax [[SEL0]], {{%[0-9]+}}, %true : !torch.vtensor<[4],si64>, !torch.list<int>, !torch.bool -> !torch.vtensor<[1],si64>
// CHECK: [[POOL0:%[0-9]+]] = torch.aten.floor_divide.Scalar {{%[0-9]+}}, %int4 : !torch.vtensor<[1],si64>, !torch.int -> !torch.vtensor<[1],si64>
// CHECK: [[ROWS0:%[0-9]+]] = torch.aten.index_select [[BLOCKS]], %int0, [[POOL0]] : !torch.vtensor<[8,4,16],f32>, !torch.int, !torch.vtensor<[1],si64> -> !torch.vtensor<[1,4,16],f32>
// CHECK: torch.aten.view [[ROWS0]], {{%[0-9]+}} : !torch.vtensor<[1,4,16],f32>, !torch.list<int> -> !torch.vtensor<[4,16],f32>
// second tile: the tail, slots 4..6, the first 3 rows of one block
// CHECK: [[SEL1:%[0-9]+]] = torch.aten.slice.Tensor {{%[0-9]+}}, %int0, %int4, %int7, %int1 : !torch.vtensor<[7],si64>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[3],si64>
// CHECK: torch.aten.floor_divide.Scalar
// CHECK: [[ROWS1:%[0-9]+]] = torch.aten.index_select [[BLOCKS]], %int0, {{%[0-9]+}} : !torch.vtensor<[8,4,16],f32>, !torch.int, !torch.vtensor<[1],si64> -> !torch.vtensor<[1,4,16],f32>
// CHECK: torch.aten.slice.Tensor [[ROWS1]], %int1, %int0, %int3, %int1 : !torch.vtensor<[1,4,16],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[1,3,16],f32>
// CHECK-NOT: torch.day0.dsa_attention
// CHECK: return

// Prefill (S dynamic): one block index per query and tile, rows [?, 4, 16].
func.func @prefill_pools(%q: !torch.vtensor<[?,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[?,11],si64>) -> !torch.vtensor<[?,2,16],f32> {
  %scale = torch.constant.float 2.500000e-01
  %vdim = torch.constant.int 16
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[?,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[?,11],si64>, !torch.float, !torch.int) -> !torch.vtensor<[?,2,16],f32>
  return %0 : !torch.vtensor<[?,2,16],f32>
}
// CHECK-LABEL: func.func @prefill_pools(
// CHECK-COUNT-3: torch.aten.index_select {{%[0-9]+}}, %int0, {{%[0-9]+}} : !torch.vtensor<[8,4,16],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,4,16],f32>
// CHECK-NOT: torch.aten.index_select
// CHECK: return

// A paged pool (models/paging.py): T is the pool's rows, chosen at load (dynamic); the compile
// driver makes every cache block a multiple of the k-pool, so the pool is whole aligned pools and
// the block view stays [?, 4, 16]. A batch of 3 sequences decoding one token each.
func.func @paged_pool_batch(%q: !torch.vtensor<[3,2,16],f32>, %kv: !torch.vtensor<[?,16],f32>, %idx: !torch.vtensor<[3,7],si64>) -> !torch.vtensor<[3,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[3,2,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[3,7],si64>, !torch.float, !torch.int) -> !torch.vtensor<[3,2,16],f32>
  return %0 : !torch.vtensor<[3,2,16],f32>
}
// CHECK-LABEL: func.func @paged_pool_batch(
// CHECK: [[PBLOCKS:%[0-9]+]] = torch.aten.view %arg1, {{%[0-9]+}} : !torch.vtensor<[?,16],f32>, !torch.list<int> -> !torch.vtensor<[?,4,16],f32>
// CHECK: torch.aten.index_select [[PBLOCKS]], %int0, {{%[0-9]+}} : !torch.vtensor<[?,4,16],f32>, !torch.int, !torch.vtensor<[3],si64> -> !torch.vtensor<[3,4,16],f32>
// CHECK: torch.aten.index_select [[PBLOCKS]], %int0, {{%[0-9]+}} : !torch.vtensor<[?,4,16],f32>, !torch.int, !torch.vtensor<[3],si64> -> !torch.vtensor<[3,4,16],f32>
// CHECK-NOT: torch.aten.index_select
// CHECK: return
