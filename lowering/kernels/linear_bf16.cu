// Linear layer with bf16 weights for a batched decode step (few rows), on tensor cores, for IREE's
// CUDA target (sm_90): out[m, n] = Σ_k x[m, k] · w[n, k], x f32 [M, K], w bf16 [N, K] (the
// checkpoint's nn.Linear layout), out f32 [M, N], at f32 accuracy: x enters as three bf16 terms
// t0 = bf16(x), t1 = bf16(x - t0), t2 = bf16(x - t0 - t1) (each difference exact in f32; what is
// left is below 2^-27 |x|, as in passes/matmul_to_bf16_terms.py), every product exact in f32.
//
// Why: IREE 3.13 runs these products (the models widen bf16 weights to f32) at 5-17x their
// bytes' time for 64 rows, as one stacked 192-row bf16 matmul (docs/perf.md, "Where the
// 64-sequence step goes"). With few rows the weights are the large operand and the work is
// spread over the CTAs of a thread-block cluster along K.
//
// Dispatched by the `matmul-to-cuda-linear` pass. IREE external dispatch ABI: x, w | out, then
// the i32 push constants M, N, K; grid (ceil(N / 64), S) where S is the entry's cluster size
// (day0_linear_bf16_c<S>, S = 1, 2, 4, 8; lowering/kernel_geometry.py picks it). 1 <= M <= 64,
// K a multiple of 8 (16-byte rows of 8 bf16), any N.
//
// CTA (n-tile of 64 columns, cluster rank r): the K slice r of S (whole 64-k stages), 8 warps.
//  - Rows up to 32 ("k-half" mode): a stage is 128 k; warp w takes m16 tile w % 4 of the columns
//    and the 64-k half w / 4 of the stage, all of x's n8 tiles. Rows 33..64 ("n-half" mode): a
//    stage is 64 k; warp w takes m16 tile w % 4 and x's n8 tiles 4 (w / 4) .. + 3. Either way a
//    stage's x terms fill one buffer of 64 virtual rows × 64 k bf16 × 3 terms (24 KB).
//  - The MMA is transposed (out^T = w · x^T): the weights are the m16 side, read by each lane
//    straight from global memory into registers (no shared-memory tile), the next stage's loads
//    (weights and x) issued before this stage's split and MMAs. The k order inside an MMA is
//    free as long as A and B agree: lane (g, i4) of MMA j (c = j / 2, h = j % 2) holds k =
//    32 c + 8 i4 + 4 h + {0, 1} (fragment k 2 i4 + {0, 1}) and + {2, 3} (fragment k 2 i4 + 8 +
//    {0, 1}), so over a 64-k stage a lane reads 16 contiguous bytes of each of its rows per c
//    (coalesced: 4 lanes cover 64 contiguous bytes) and 8 contiguous bf16 of x's terms.
//  - x's stage is split into its terms by the whole CTA into shared memory (16-byte chunks of a
//    row XOR-swizzled by the row's parity: conflict-free reads), each stage's MMAs go into fresh
//    registers then added to the running sums with rounded f32 adds (tensor cores truncate).
//  - The CTA's partial out^T meets the other half's (k-half mode) in shared memory, then the
//    cluster's S partials are summed in rank order over distributed shared memory (deterministic)
//    by the S CTAs, each writing 1/S of the tile.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "mma_bf16.cuh"

namespace cg = cooperative_groups;

#define THREADS 256
#define COLS 64        // output columns (weight rows) a CTA: 4 m16 tiles
#define MAX_M 64       // rows of x (8 n8 tiles)
#define VROWS 64       // virtual rows of the x-terms buffer
#define KS 64          // k of one virtual row
#define TERMS 3
#define RED_LD 68      // row stride (floats) of the partial-sum tile red[m][n]: conflict-free writes

// The three bf16 terms of (a, b) as bf16x2 words (a in the low half): one cvt.rn.bf16x2.f32 a
// term, the residuals from the unpacked halves.
__device__ __forceinline__ void split3(float a, float b, unsigned (&t)[TERMS]) {
#pragma unroll
  for (int q = 0; q < TERMS; ++q) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    t[q] = *reinterpret_cast<const unsigned*>(&h);
    a -= __uint_as_float(t[q] << 16);
    b -= __uint_as_float(t[q] & 0xffff0000u);
  }
}

// Byte offset of 16-byte chunk `chunk` (0..7) of virtual row `vr` of term q's buffer.
__device__ __forceinline__ int xs_offset(int q, int vr, int chunk) {
  return ((q * VROWS + vr) * 8 + (chunk ^ ((vr & 1) << 2))) * 16;
}

template <int S>
__device__ __forceinline__ void linear_bf16(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                            float* __restrict__ out, int M, int N, int K) {
  // x's terms for one stage; after the K loop the same bytes hold the CTA's partial sums red[m][n].
  __shared__ __align__(16) unsigned char smem[TERMS * VROWS * KS * 2];
  float* red = reinterpret_cast<float*>(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, i4 = lane & 3;
  const int mt = warp & 3, half = warp >> 2;
  const int n0 = blockIdx.x * COLS, rank = blockIdx.y;
  const bool khalf = M <= 32;                  // CTA-uniform mode
  const int width = khalf ? 2 * KS : KS;       // k a stage
  const int tiles = khalf ? (M + 7) >> 3 : min(4, ((M + 7) >> 3) - 4 * half);  // this warp's n8 tiles
  const int rows8 = ((M + 7) >> 3) << 3;       // rows of x written (zeros past M)

  // This CTA's K slice: whole stages, split as evenly as the stages allow.
  const int stages_all = (K + width - 1) / width;
  const int per = (stages_all + S - 1) / S;
  const int s_lo = min(rank * per, stages_all), s_hi = min(s_lo + per, stages_all);

  // This lane's weight rows n0 + 16 mt + g (+ 8) and their k offset within a 64-k (half-)stage.
  const int nr0 = n0 + 16 * mt + g, nr1 = nr0 + 8;
  const __nv_bfloat16* wr0 = w + (size_t)min(nr0, N - 1) * K;
  const __nv_bfloat16* wr1 = w + (size_t)min(nr1, N - 1) * K;
  const int koff = (khalf ? KS * half : 0) + 8 * i4;  // + 32 c

  // The split's share of a stage: quads p = tid + 256 i (i < 4) of the stage's rows8 × width / 4
  // quads; quad p at row (p / (width / 4)), k 4 (p % (width / 4)) (one float4 load, one 8-byte
  // store a term).
  const int quads_row = width >> 2;
  auto load_w = [&](int s, uint4 (&v)[2][2]) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int k = s * width + koff + 32 * c;
      const bool ok = s < s_hi && k < K;
      v[0][c] = ok && nr0 < N ? __ldg(reinterpret_cast<const uint4*>(wr0 + k)) : make_uint4(0, 0, 0, 0);
      v[1][c] = ok && nr1 < N ? __ldg(reinterpret_cast<const uint4*>(wr1 + k)) : make_uint4(0, 0, 0, 0);
    }
  };
  auto load_x = [&](int s, float4 (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = tid + THREADS * i, m = p / quads_row, k = s * width + 4 * (p % quads_row);
      v[i] = s < s_hi && m < M && k < K ? __ldg(reinterpret_cast<const float4*>(x + (size_t)m * K + k))
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };

  float acc[4][4] = {};  // n8 tile, accumulator register
  uint4 wv[2][2], wn[2][2];
  float4 xv[4], xn[4];
  load_w(s_lo, wv);
  load_x(s_lo, xv);
  for (int s = s_lo; s < s_hi; ++s) {
    load_w(s + 1, wn);  // in flight during this stage
    load_x(s + 1, xn);
    __syncthreads();  // the previous stage's terms are read
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = tid + THREADS * i, m = p / quads_row, kk = 4 * (p % quads_row);
      if (m < rows8) {
        const int vr = khalf ? (kk / KS) * 32 + m : m, kr = kk % KS;  // virtual row, its k
        unsigned t0[TERMS], t1[TERMS];
        split3(xv[i].x, xv[i].y, t0);
        split3(xv[i].z, xv[i].w, t1);
#pragma unroll
        for (int q = 0; q < TERMS; ++q)
          *reinterpret_cast<uint2*>(smem + xs_offset(q, vr, kr >> 3) + (kr & 7) * 2) = make_uint2(t0[q], t1[q]);
      }
    }
    __syncthreads();
    float part[4][4] = {};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if (t < tiles) {
        const int vr = 32 * half + 8 * t + g;  // k-half: the half's buffer; n-half: row 8 (4 half + t) + g
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          uint4 b[TERMS];
#pragma unroll
          for (int q = 0; q < TERMS; ++q) b[q] = *reinterpret_cast<const uint4*>(smem + xs_offset(q, vr, 4 * c + i4));
          // MMA j = 2 c + h: a0 / a2 the row's words 2 h / 2 h + 1 of chunk c, a1 / a3 the row + 8's
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const unsigned a0 = h ? wv[0][c].z : wv[0][c].x, a2 = h ? wv[0][c].w : wv[0][c].y;
            const unsigned a1 = h ? wv[1][c].z : wv[1][c].x, a3 = h ? wv[1][c].w : wv[1][c].y;
#pragma unroll
            for (int q = 0; q < TERMS; ++q)
              mma_bf16(part[t], a0, a1, a2, a3, h ? b[q].z : b[q].x, h ? b[q].w : b[q].y);
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] += part[t][i];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      wv[0][c] = wn[0][c];
      wv[1][c] = wn[1][c];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) xv[i] = xn[i];
  }

  // The CTA's partial out^T: accumulator i of tile t is column 16 mt + g + 8 (i / 2), row
  // 8 t' + 2 i4 + i % 2 with t' = t (k-half) or 4 half + t (n-half); the two k halves add.
  __syncthreads();  // the last stage's terms are read
  for (int pass = 0; pass < (khalf ? 2 : 1); ++pass) {
    if (!khalf || half == pass) {
#pragma unroll
      for (int t = 0; t < 4; ++t)
        if (t < tiles)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int m = 8 * (khalf ? t : 4 * half + t) + 2 * i4 + (i & 1), n = 16 * mt + g + 8 * (i >> 1);
            float* r = red + m * RED_LD + n;
            *r = pass ? *r + acc[t][i] : acc[t][i];
          }
    }
    __syncthreads();
  }

  // The cluster's partials, summed in rank order: CTA `rank` writes its 1/S of the tile's elements.
  const int total = rows8 * COLS, share = (total + S - 1) / S;
  const int e_lo = rank * share, e_hi = min(e_lo + share, total);
  if constexpr (S > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every CTA's red is complete
    for (int e = e_lo + tid; e < e_hi; e += THREADS) {
      const int m = e / COLS, n = e % COLS;
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < S; ++r) sum += cluster.map_shared_rank(red, r)[m * RED_LD + n];
      if (m < M && n0 + n < N) out[(size_t)m * N + n0 + n] = sum;
    }
    cluster.sync();  // keep this CTA's red alive until the others have read it
  } else {
    for (int e = e_lo + tid; e < e_hi; e += THREADS) {
      const int m = e / COLS, n = e % COLS;
      if (m < M && n0 + n < N) out[(size_t)m * N + n0 + n] = red[m * RED_LD + n];
    }
  }
}

#define LINEAR_ENTRY(S, CLUSTER)                                                                           \
  extern "C" __global__ void CLUSTER __launch_bounds__(THREADS, 2)                                        \
      day0_linear_bf16_c##S(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,              \
                            float* __restrict__ out, int M, int N, int K) {                                \
    linear_bf16<S>(x, w, out, M, N, K);                                                                   \
  }

LINEAR_ENTRY(1, )
LINEAR_ENTRY(2, __cluster_dims__(1, 2, 1))
LINEAR_ENTRY(4, __cluster_dims__(1, 4, 1))
LINEAR_ENTRY(8, __cluster_dims__(1, 8, 1))
