// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(dsa-to-gather-tiles{block=5})'
// RUN: not day0-opt %s --pass-pipeline='builtin.module(dsa-to-gather-tiles{block=-1})' 2>&1 | filecheck %s --check-prefix=BADRANGE

// BADRANGE: pass 'dsa-to-gather-tiles': block must be >= 0, got -1

// The cache rows must be a multiple of the block.
func.func @rows_not_blocks(%q: !torch.vtensor<[1,2,16],f32>, %kv: !torch.vtensor<[32,16],f32>, %idx: !torch.vtensor<[1,9],si64>) -> !torch.vtensor<[1,2,16],f32> {
  %scale = torch.constant.float 1.250000e-01
  %vdim = torch.constant.int 16
  // expected-error @+1 {{dsa_attention: block=5 does not divide the 32 cache rows}}
  %0 = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim) : (!torch.vtensor<[1,2,16],f32>, !torch.vtensor<[32,16],f32>, !torch.vtensor<[1,9],si64>, !torch.float, !torch.int) -> !torch.vtensor<[1,2,16],f32>
  return %0 : !torch.vtensor<[1,2,16],f32>
}
