// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(indexer-scores-to-cuda-kernel)'

func.func @too_many_heads(%q: !torch.vtensor<[1,128,64],f32>, %k: !torch.vtensor<[32,64],f32>, %w: !torch.vtensor<[1,128],f32>) -> !torch.vtensor<[1,32],f32> {
  %scale = torch.constant.float 0.125
  // expected-error @+1 {{indexer_scores: the CUDA kernel takes H <= 64 heads of D <= 128, got H=128, D=64}}
  %o = torch.operator "torch.day0.indexer_scores"(%q, %k, %w, %scale) : (!torch.vtensor<[1,128,64],f32>, !torch.vtensor<[32,64],f32>, !torch.vtensor<[1,128],f32>, !torch.float) -> !torch.vtensor<[1,32],f32>
  return %o : !torch.vtensor<[1,32],f32>
}

// -----

func.func @f16_keys(%q: !torch.vtensor<[1,16,64],f32>, %k: !torch.vtensor<[32,64],f16>, %w: !torch.vtensor<[1,16],f32>) -> !torch.vtensor<[1,32],f32> {
  %scale = torch.constant.float 0.125
  // expected-error @+1 {{indexer_scores: keys must be f32 or bf16, got f16}}
  %o = torch.operator "torch.day0.indexer_scores"(%q, %k, %w, %scale) : (!torch.vtensor<[1,16,64],f32>, !torch.vtensor<[32,64],f16>, !torch.vtensor<[1,16],f32>, !torch.float) -> !torch.vtensor<[1,32],f32>
  return %o : !torch.vtensor<[1,32],f32>
}

// -----

func.func @rows_not_int64(%q: !torch.vtensor<[2,16,64],f32>, %k: !torch.vtensor<[?,64],bf16>, %r: !torch.vtensor<[2,32],si32>, %w: !torch.vtensor<[2,16],f32>) -> !torch.vtensor<[2,32],f32> {
  %scale = torch.constant.float 0.125
  // expected-error @+1 {{indexer_scores_rows: rows must be si64, got si32}}
  %o = torch.operator "torch.day0.indexer_scores_rows"(%q, %k, %r, %w, %scale) : (!torch.vtensor<[2,16,64],f32>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[2,32],si32>, !torch.vtensor<[2,16],f32>, !torch.float) -> !torch.vtensor<[2,32],f32>
  return %o : !torch.vtensor<[2,32],f32>
}

// -----

func.func @rows_of_other_queries(%q: !torch.vtensor<[2,16,64],f32>, %k: !torch.vtensor<[?,64],bf16>, %r: !torch.vtensor<[3,32],si64>, %w: !torch.vtensor<[2,16],f32>) -> !torch.vtensor<[2,32],f32> {
  %scale = torch.constant.float 0.125
  // expected-error @+1 {{indexer_scores_rows: shapes disagree: q [2,16,64], keys [?,64], rows [3,32], weights [2,16], result [2,32]}}
  %o = torch.operator "torch.day0.indexer_scores_rows"(%q, %k, %r, %w, %scale) : (!torch.vtensor<[2,16,64],f32>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[3,32],si64>, !torch.vtensor<[2,16],f32>, !torch.float) -> !torch.vtensor<[2,32],f32>
  return %o : !torch.vtensor<[2,32],f32>
}

// -----

func.func @causal_last_of_other_queries(%q: !torch.vtensor<[2,16,64],f32>, %k: !torch.vtensor<[?,64],bf16>, %r: !torch.vtensor<[32],si64>, %l: !torch.vtensor<[3],si64>, %w: !torch.vtensor<[2,16],f32>) -> !torch.vtensor<[2,32],f32> {
  %scale = torch.constant.float 0.125
  // expected-error @+1 {{indexer_scores_causal: shapes disagree: q [2,16,64], keys [?,64], rows [32], last [3], weights [2,16], result [2,32]}}
  %o = torch.operator "torch.day0.indexer_scores_causal"(%q, %k, %r, %l, %w, %scale) : (!torch.vtensor<[2,16,64],f32>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[32],si64>, !torch.vtensor<[3],si64>, !torch.vtensor<[2,16],f32>, !torch.float) -> !torch.vtensor<[2,32],f32>
  return %o : !torch.vtensor<[2,32],f32>
}

// -----

func.func @causal_rows_per_query(%q: !torch.vtensor<[2,16,64],f32>, %k: !torch.vtensor<[?,64],bf16>, %r: !torch.vtensor<[2,32],si64>, %l: !torch.vtensor<[2],si64>, %w: !torch.vtensor<[2,16],f32>) -> !torch.vtensor<[2,32],f32> {
  %scale = torch.constant.float 0.125
  // expected-error @+1 {{indexer_scores_causal: rows must be a rank-1 !torch.vtensor}}
  %o = torch.operator "torch.day0.indexer_scores_causal"(%q, %k, %r, %l, %w, %scale) : (!torch.vtensor<[2,16,64],f32>, !torch.vtensor<[?,64],bf16>, !torch.vtensor<[2,32],si64>, !torch.vtensor<[2],si64>, !torch.vtensor<[2,16],f32>, !torch.float) -> !torch.vtensor<[2,32],f32>
  return %o : !torch.vtensor<[2,32],f32>
}
