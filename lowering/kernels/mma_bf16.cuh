// Shared by day0's tensor-core kernels (dsa_attention.cu, indexer_scores.cu).
#pragma once

// c += a · b on one m16n8k16 tile: a (16 × 16 bf16, 4 registers), b (16 × 8 bf16, 2 registers),
// c (16 × 8 f32, 4 registers), in the fragment layouts of the PTX ISA.
__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
