// Sparse MQA over the indexer's selected rows (`day0::dsa_attention`) for IREE's CUDA target (sm_90):
//   out[s, h, :V] = Σ_j softmax_j(scale · q[s, h] · kv[idx[s, j]]) · kv[idx[s, j], :V]
// over the K slots j with 0 <= idx < T (other slots, e.g. -1, are empty; all empty -> zeros).
//
// Dispatched by the `dsa-to-cuda-kernel` pass (IREE external dispatch ABI). Flash-decoding split:
//   partial  grid (splits, ceil(H/HEADS), S): one CTA takes ROWS consecutive slots of one query
//            and HEADS heads; 16 selected rows at a time go to shared memory; per head it keeps
//            the running max m, sum l and V-wide accumulator (online softmax); writes m, l, acc.
//   combine  grid (H, S): merges the splits of one (query, head) and writes out.
// Type T_ is the dtype of q and kv (f32 or bf16); arithmetic is f32, and out is f32 for either
// (the op's contract: the result is not rounded to bf16).
//
// bf16 tensor-core form (day0_dsa_{partial,combine}_bf16_mma, FlashMLA-style), taken by the pass
// for bf16 when D % 8 == 0, V % 8 == 0, V <= D and V <= 512:
//   partial  grid (splits, ceil(H/64), S), push constant `rows` = slots per split (the pass: 32 at
//            decode, 128 for prefill): one CTA takes all (up to 64) heads of one query, so each
//            gathered row is read once per CTA. Tiles of 16 rows are copied to shared memory with
//            cp.async (double-buffered, empty slots zero-filled); a warp owns 8 heads (with fewer
//            than 64 heads the warps of one 8-head group split the values between them):
//            scores[16 rows, 8 heads] = rows · qᵀ on mma.sync m16n8k16 (A = rows via ldmatrix, B
//            = q held in registers, f32 accumulation, scale applied in f32), online softmax in f32
//            (base 2), then accᵀ[v, 8 heads] += rowsᵀ[v, 16] · P[16, 8 heads] (A = rows via
//            ldmatrix.trans, B = P as two bf16 terms hi + lo, transposed in registers with
//            movmatrix: two mma per tile, P carried to 16 significant bits).
//            Writes m (log2 units), l and the unnormalised acc per (split, head).
//   combine  grid (ceil(V/64), H, S): merges the splits of 64 values of one (query, head) and
//            writes them as f32.
// It agrees with the f32-arithmetic kernels to ~1e-5 relative (P rounded to bf16 alone, one mma,
// moved outputs by ~1e-3: a whole bf16 ulp of the result on the H200, which random benchmark
// models amplify into different tokens).

#include <cuda_bf16.h>

#include "mma_bf16.cuh"

#define THREADS 256
#define WARPS (THREADS / 32)
#define HEADS 4        // heads per partial CTA
#define CHUNK 16       // selected rows staged in shared memory at a time
#define ROWS 128       // selected slots per split
#define MAX_D 576      // kv row width (MLA latent 512 + rope 64)
#define MAX_V 1024     // value width (acc: ceil(V / 64) values a thread)

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T_>
__device__ void dsa_partial(const T_* __restrict__ q, const T_* __restrict__ kv,
                            const long long* __restrict__ idx, float* __restrict__ part_ml,
                            float* __restrict__ part_acc, int H, int D, int K, int V, int T,
                            int scale_bits) {
  const float scale = __int_as_float(scale_bits);  // push constants are 32-bit integers
  __shared__ float qs[HEADS][MAX_D];
  __shared__ T_ rows[CHUNK][MAX_D];
  __shared__ float p[HEADS][CHUNK];
  __shared__ int valid[CHUNK];
  const int split = blockIdx.x, h0 = blockIdx.y * HEADS, s = blockIdx.z;
  const int splits = gridDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < HEADS * D; i += THREADS) {
    int hh = i / D, d = i % D;
    qs[hh][d] = h0 + hh < H ? to_f(q[((size_t)s * H + h0 + hh) * D + d]) * scale : 0.0f;
  }
  // accumulator: thread -> head ah, dims ad0 + 64 i (i < per)
  const int ah = threadIdx.x / 64, ad0 = threadIdx.x % 64, per = (V - ad0 + 63) / 64;
  float acc[MAX_V / 64];
#pragma unroll
  for (int i = 0; i < MAX_V / 64; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // of head ah (every thread of the head keeps a copy)
  const long long* sel = idx + (size_t)s * K;
  const int first = split * ROWS, last = min(first + ROWS, K);
  for (int c0 = first; c0 < last; c0 += CHUNK) {
    __syncthreads();  // previous chunk fully consumed (and qs written on the first pass)
    if (threadIdx.x < CHUNK) {
      int j = c0 + threadIdx.x;
      long long r = j < last ? sel[j] : -1;
      valid[threadIdx.x] = (r >= 0 && r < T) ? (int)r : -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < CHUNK * D; i += THREADS) {
      int rr = i / D, d = i % D, r = valid[rr];
      rows[rr][d] = r >= 0 ? kv[(size_t)r * D + d] : T_(0.0f);
    }
    __syncthreads();
    // scores: HEADS x CHUNK pairs, one warp per pair, lanes over D
    for (int pair = warp; pair < HEADS * CHUNK; pair += WARPS) {
      int hh = pair / CHUNK, rr = pair % CHUNK;
      float dot = 0.0f;
      for (int d = lane; d < D; d += 32) dot += qs[hh][d] * to_f(rows[rr][d]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) p[hh][rr] = valid[rr] >= 0 ? dot : -INFINITY;
    }
    __syncthreads();
    // online softmax of head ah over this chunk, then acc += p · rows[:, :V]
    float cmax = -INFINITY;
    for (int rr = 0; rr < CHUNK; ++rr) cmax = fmaxf(cmax, p[ah][rr]);
    const float m_new = fmaxf(m, cmax);
    if (m_new > -INFINITY) {
      const float corr = m > -INFINITY ? __expf(m - m_new) : 0.0f;
      l *= corr;
#pragma unroll
      for (int i = 0; i < MAX_V / 64; ++i) acc[i] *= corr;  // (all: keeps acc in registers)
      for (int rr = 0; rr < CHUNK; ++rr) {
        const float w = p[ah][rr] > -INFINITY ? __expf(p[ah][rr] - m_new) : 0.0f;
        l += w;
#pragma unroll
        for (int i = 0; i < MAX_V / 64; ++i)
          if (i < per) acc[i] += w * to_f(rows[rr][ad0 + 64 * i]);
      }
      m = m_new;
    }
  }
  const int hh = h0 + ah;
  if (hh < H) {
    const size_t base = ((size_t)s * splits + split) * H + hh;
    if (threadIdx.x % 64 == 0) { part_ml[base * 2] = m; part_ml[base * 2 + 1] = l; }
#pragma unroll
    for (int i = 0; i < MAX_V / 64; ++i)
      if (i < per) part_acc[base * V + ad0 + 64 * i] = acc[i];
  }
}

__device__ void dsa_combine(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                            float* __restrict__ out, int H, int V, int splits) {
  const int h = blockIdx.x, s = blockIdx.y;
  float mx = -INFINITY;
  for (int i = 0; i < splits; ++i) mx = fmaxf(mx, part_ml[(((size_t)s * splits + i) * H + h) * 2]);
  float l = 0.0f;
  for (int i = 0; i < splits; ++i) {
    size_t b = ((size_t)s * splits + i) * H + h;
    float mi = part_ml[b * 2];
    if (mi > -INFINITY) l += __expf(mi - mx) * part_ml[b * 2 + 1];
  }
  for (int d = threadIdx.x; d < V; d += THREADS) {
    float o = 0.0f;
    for (int i = 0; i < splits; ++i) {
      size_t b = ((size_t)s * splits + i) * H + h;
      float mi = part_ml[b * 2];
      if (mi > -INFINITY) o += __expf(mi - mx) * part_acc[b * V + d];
    }
    out[((size_t)s * H + h) * V + d] = l > 0.0f ? o / l : 0.0f;
  }
}

#define DSA_KERNELS(NAME, T_)                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS)                                           \
  day0_dsa_partial_##NAME(const T_* q, const T_* kv, const long long* idx, float* part_ml,        \
                          float* part_acc, int H, int D, int K, int V, int T, int scale_bits) {   \
    dsa_partial<T_>(q, kv, idx, part_ml, part_acc, H, D, K, V, T, scale_bits);                    \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(THREADS)                                           \
  day0_dsa_combine_##NAME(const float* part_ml, const float* part_acc, float* out, int H, int V, \
                          int splits) {                                                           \
    dsa_combine(part_ml, part_acc, out, H, V, splits);                                            \
  }

DSA_KERNELS(f32, float)
DSA_KERNELS(bf16, __nv_bfloat16)

// ---------------------------------------------------------------------------------------------
// Tensor-core kernels (bf16 q and kv, f32 out).

#define MMA_HEADS 64              // heads per CTA: 8 warps × 8 heads
#define MMA_TILE 16               // rows per tile (the mma's M of the scores, K of P·V)
#define MMA_MAX_V 512             // accumulator: 8 heads × 512 values a warp = 128 floats a lane
#define MMA_KSTEPS (MAX_D / 16)   // k-steps of the score mma (q fragments held in registers)
#define MMA_STRIDE (MAX_D + 8)    // shared row stride in bf16: 1168 B, 8 rows hit distinct banks
#define MMA_CHAINS 4              // independent score accumulators (mma latency)

// The transpose of an 8×8 b16 matrix held in mma fragment order (lane g, t: row g, cols 2t, 2t+1).
__device__ __forceinline__ unsigned movmatrix_trans(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ float bf16_value(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// VP = 1: any head count; with fewer than 64 heads the warps of a head group each compute the
// whole scores (see below). VP > 1 (day0_dsa_partial_bf16_mma_vp<VP>, for at most 64 / VP heads
// a CTA, 8 / VP head groups): the VP warps of a head group split the scores' k-steps instead and
// add their partial scores through shared memory in a fixed order (each warp then holds the same
// scores), so a warp keeps 1 / VP of the q fragments and of the accumulators: fewer registers,
// two CTAs an SM (docs/perf.md, "Where the 64-sequence step goes").
template <int VP>
__device__ __forceinline__ void dsa_partial_mma(const __nv_bfloat16* __restrict__ q,
                                                const __nv_bfloat16* __restrict__ kv,
                                                const long long* __restrict__ idx, float* __restrict__ part_ml,
                                                float* __restrict__ part_acc, int H, int D, int K, int V, int T,
                                                int scale_bits, int rows) {
  constexpr int KQ = (MMA_KSTEPS + VP - 1) / VP;  // q fragments (k-steps) a warp holds
  constexpr int NVT = MMA_MAX_V / 16 / VP;        // 16-value accumulator tiles a warp holds
  __shared__ __align__(16) __nv_bfloat16 tile[2][MMA_TILE][MMA_STRIDE];
  __shared__ int valid[2][MMA_TILE];
  __shared__ float4 xch[VP > 1 ? WARPS : 1][32];  // VP > 1: each warp's partial scores
  const int split = blockIdx.x, s = blockIdx.z, splits = gridDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const float scale_log2 = __int_as_float(scale_bits) * 1.4426950408889634f;
  const int first = split * rows, last = min(first + rows, K);
  const int ntiles = last > first ? (last - first + MMA_TILE - 1) / MMA_TILE : 0;
  const int dpad = (D + 15) & ~15, nk = dpad / 16, nv = (V + 15) / 16;
  const long long* sel = idx + (size_t)s * K;
  // Warps: head group hg (8 heads) × value part vp. With fewer than 64 heads here the spare
  // warps split the P·V values instead of computing on zero queries: each of the vparts warps
  // of a head group computes the same scores and takes its own run of 16-value tiles.
  const int hgroups = (min(MMA_HEADS, H - blockIdx.y * MMA_HEADS) + 7) / 8;
  const int vparts = WARPS / hgroups, hg = warp % hgroups, vp = warp / hgroups;
  const int vper = (nv + vparts - 1) / vparts, vt_lo = vp < vparts ? vp * vper : nv;
  const int vt_hi = min(nv, vt_lo + vper);
  // this warp's score k-steps: all (VP = 1) or its 1 / VP of them
  const int kper = VP > 1 ? (nk + VP - 1) / VP : nk, c_lo = VP > 1 ? min(vp * kper, nk) : 0;
  const int c_hi = min(nk, c_lo + kper);

  // k padding [D, dpad) (8 columns when D % 16 == 8): zeros, never written by the row copies
  if (dpad > D && threadIdx.x < 2 * MMA_TILE)
    *reinterpret_cast<uint4*>(&tile[threadIdx.x / MMA_TILE][threadIdx.x % MMA_TILE][D]) =
        make_uint4(0u, 0u, 0u, 0u);

  // tile tt (rows first + 16 tt ..) into buffer b: D / 8 16-byte pieces a row; empty slots -> 0
  auto load_tile = [&](int tt, int b) {
    const int j0 = first + tt * MMA_TILE, pieces = D / 8;
    for (int i = threadIdx.x; i < MMA_TILE * pieces; i += THREADS) {
      const int r = i / pieces, c = i - r * pieces, j = j0 + r;
      const long long row = j < last ? sel[j] : -1;
      const bool ok = row >= 0 && row < T;
      cp_async16(smem_addr(&tile[b][r][c * 8]), kv + (ok ? (size_t)row * D + c * 8 : 0), ok ? 16 : 0);
      if (c == 0) valid[b][r] = ok;
    }
    cp_async_commit();
  };
  if (ntiles > 0) load_tile(0, 0);

  // B fragments of q: lane (g, t) holds q[head 8 warp + g, 16 c + 2t (+1), (+8, +9)] as bf16 pairs
  const int h = blockIdx.y * MMA_HEADS + hg * 8 + g;
  const unsigned* qrow = reinterpret_cast<const unsigned*>(q + ((size_t)s * H + min(h, H - 1)) * D);
  unsigned qf[KQ][2];  // k-step c_lo + j
#pragma unroll
  for (int j = 0; j < KQ; ++j) {
    const int d0 = 16 * (c_lo + j) + 2 * t;
    const bool ok = h < H && c_lo + j < c_hi;
    qf[j][0] = ok && d0 < D ? qrow[d0 / 2] : 0u;
    qf[j][1] = ok && d0 + 8 < D ? qrow[d0 / 2 + 4] : 0u;
  }

  float acc[NVT][4];  // accᵀ tile vt_lo + i: values 16 vt + g (+8) × heads 2t, 2t + 1
#pragma unroll
  for (int i = 0; i < NVT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // heads 2t, 2t+1 (log2 units)
  // ldmatrix row addresses: scores A = rows [16 rows, 16 d]; P·V A = rowsᵀ [16 v, 16 rows]
  const int sr = lane & 15, sc = (lane >> 4) * 8;
  const int vr = (lane & 7) + ((lane >> 4) << 3), vc = ((lane >> 3) & 1) * 8;

  for (int tt = 0; tt < ntiles; ++tt) {
    const int b = tt & 1;
    if (tt + 1 < ntiles) {
      load_tile(tt + 1, b ^ 1);  // buffer b ^ 1 was released by the sync ending tile tt - 1
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    float part[MMA_CHAINS][4];
#pragma unroll
    for (int k = 0; k < MMA_CHAINS; ++k) part[k][0] = part[k][1] = part[k][2] = part[k][3] = 0.0f;
    const unsigned abase = smem_addr(&tile[b][sr][sc]);
#pragma unroll
    for (int j = 0; j < KQ; ++j) {
      if (c_lo + j < c_hi) {
        unsigned a[4];
        ldsm_x4(a, abase + (c_lo + j) * 32);
        mma_bf16(part[j % MMA_CHAINS], a[0], a[1], a[2], a[3], qf[j][0], qf[j][1]);
      }
    }
    // x: rows g (x0, x1) and g + 8 (x2, x3) × heads 2t, 2t + 1; scaled to log2 units
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < MMA_CHAINS; ++k) v += part[k][i];
      x[i] = v;
    }
    if constexpr (VP > 1) {  // the head group's VP partial scores, added in vp order by every warp
      xch[warp][lane] = make_float4(x[0], x[1], x[2], x[3]);
      __syncthreads();
      float4 sum = xch[hg][lane];
#pragma unroll
      for (int v = 1; v < VP; ++v) {
        const float4 o = xch[hg + v * hgroups][lane];
        sum.x += o.x;
        sum.y += o.y;
        sum.z += o.z;
        sum.w += o.w;
      }
      x[0] = sum.x, x[1] = sum.y, x[2] = sum.z, x[3] = sum.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] *= scale_log2;
    const bool ok0 = valid[b][g], ok1 = valid[b][g + 8];
    float mx0 = fmaxf(ok0 ? x[0] : -INFINITY, ok1 ? x[2] : -INFINITY);
    float mx1 = fmaxf(ok0 ? x[1] : -INFINITY, ok1 ? x[3] : -INFINITY);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    // corr: 1 while nothing valid yet (acc and l are 0 then), else 2^(m - m_new) (0 from -inf)
    const float c0 = n0 == -INFINITY ? 1.0f : exp2f(m0 - n0);
    const float c1 = n1 == -INFINITY ? 1.0f : exp2f(m1 - n1);
    const float p0 = ok0 ? exp2f(x[0] - n0) : 0.0f, p1 = ok0 ? exp2f(x[1] - n1) : 0.0f;
    const float p2 = ok1 ? exp2f(x[2] - n0) : 0.0f, p3 = ok1 ? exp2f(x[3] - n1) : 0.0f;
    l0 = l0 * c0 + p0 + p2;
    l1 = l1 * c1 + p1 + p3;
    m0 = n0;
    m1 = n1;
    // B = P [16 rows, 8 heads]: lane (g, t) needs rows 2t, 2t+1 (+8) of head g: transpose.
    // P as two bf16 terms, hi = bf16(p) and lo = bf16(p - hi): P·V carries p to 16 bits.
    const unsigned b0 = movmatrix_trans(pack_bf16(p0, p1)), b1 = movmatrix_trans(pack_bf16(p2, p3));
    const unsigned b0_lo = movmatrix_trans(pack_bf16(p0 - bf16_value(p0), p1 - bf16_value(p1)));
    const unsigned b1_lo = movmatrix_trans(pack_bf16(p2 - bf16_value(p2), p3 - bf16_value(p3)));
    const unsigned vbase = smem_addr(&tile[b][vr][vc]);
#pragma unroll
    for (int i = 0; i < NVT; ++i) {
      const int vt = VP > 1 ? vt_lo + i : i;  // (VP = 1: constant tile indices, as registers allow)
      if (VP > 1 ? vt < vt_hi : vt >= vt_lo && vt < vt_hi) {
        acc[i][0] *= c0;
        acc[i][1] *= c1;
        acc[i][2] *= c0;
        acc[i][3] *= c1;
        unsigned a[4];
        ldsm_x4_trans(a, vbase + vt * 32);
        mma_bf16(acc[i], a[0], a[1], a[2], a[3], b0, b1);
        mma_bf16(acc[i], a[0], a[1], a[2], a[3], b0_lo, b1_lo);
      }
    }
    __syncthreads();  // buffer b is refilled by the next iteration's prefetch (and xch rewritten)
  }

#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {  // l over the rows the lanes g = 0..7 summed
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  const size_t base = ((size_t)s * splits + split) * H;
  const int hA = blockIdx.y * MMA_HEADS + hg * 8 + 2 * t, hB = hA + 1;
  if (vp >= vparts) return;  // a warp left over when the head groups do not divide the warps
  if (g == 0 && vp == 0) {
    if (hA < H) { part_ml[(base + hA) * 2] = m0; part_ml[(base + hA) * 2 + 1] = l0; }
    if (hB < H) { part_ml[(base + hB) * 2] = m1; part_ml[(base + hB) * 2 + 1] = l1; }
  }
  float* outA = part_acc + (base + hA) * V;
  float* outB = part_acc + (base + hB) * V;
#pragma unroll
  for (int i = 0; i < NVT; ++i) {
    const int vt = VP > 1 ? vt_lo + i : i, v = 16 * vt + g;
    if (VP > 1 ? vt < vt_hi : vt >= vt_lo && vt < vt_hi) {
      if (hA < H && v < V) outA[v] = acc[i][0];
      if (hB < H && v < V) outB[v] = acc[i][1];
      if (hA < H && v + 8 < V) outA[v + 8] = acc[i][2];
      if (hB < H && v + 8 < V) outB[v + 8] = acc[i][3];
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
day0_dsa_partial_bf16_mma(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv,
                          const long long* __restrict__ idx, float* __restrict__ part_ml,
                          float* __restrict__ part_acc, int H, int D, int K, int V, int T,
                          int scale_bits, int rows) {
  dsa_partial_mma<1>(q, kv, idx, part_ml, part_acc, H, D, K, V, T, scale_bits, rows);
}

#define DSA_PARTIAL_VP(VP, MINB)                                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB) day0_dsa_partial_bf16_mma_vp##VP(            \
      const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv,                        \
      const long long* __restrict__ idx, float* __restrict__ part_ml, float* __restrict__ part_acc, int H, \
      int D, int K, int V, int T, int scale_bits, int rows) {                                           \
    dsa_partial_mma<VP>(q, kv, idx, part_ml, part_acc, H, D, K, V, T, scale_bits, rows);                \
  }

DSA_PARTIAL_VP(2, 1)  // 18 k-steps and 16 value tiles a warp: more than 128 registers
DSA_PARTIAL_VP(4, 2)
DSA_PARTIAL_VP(8, 2)

// grid (ceil(V / 64), H, S): lane -> values v, v + 1 of a 64-value block; warp -> splits w + 8 i.
// m is in log2 units (the partial's); a split with no valid slot has m = -inf, l = 0, acc = 0.
extern "C" __global__ void __launch_bounds__(THREADS)
day0_dsa_combine_bf16_mma(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                          float* __restrict__ out, int H, int V, int splits) {
  __shared__ float2 red[WARPS][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = blockIdx.y, s = blockIdx.z, v = blockIdx.x * 64 + 2 * lane;
  const float* ml = part_ml + ((size_t)s * splits * H + h) * 2;  // split i at ml[2 H i]
  float mx = -INFINITY;
  for (int i = lane; i < splits; i += 32) mx = fmaxf(mx, ml[(size_t)2 * H * i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float l = 0.0f;
  for (int i = lane; i < splits; i += 32) {
    const float mi = ml[(size_t)2 * H * i];
    l += mi > -INFINITY ? exp2f(mi - mx) * ml[(size_t)2 * H * i + 1] : 0.0f;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  float2 o2 = make_float2(0.0f, 0.0f);
  if (v < V) {
    const float* a = part_acc + ((size_t)s * splits * H + h) * V + v;  // split i at a[H V i]
#pragma unroll 4
    for (int i = warp; i < splits; i += WARPS) {
      const float mi = ml[(size_t)2 * H * i];
      const float w = mi > -INFINITY ? exp2f(mi - mx) : 0.0f;
      const float2 x = *reinterpret_cast<const float2*>(a + (size_t)H * V * i);
      o2.x += w * x.x;
      o2.y += w * x.y;
    }
  }
  red[warp][lane] = o2;
  __syncthreads();
  if (warp == 0 && v < V) {
    float2 sum = red[0][lane];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) { sum.x += red[w][lane].x; sum.y += red[w][lane].y; }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    *reinterpret_cast<float2*>(&out[((size_t)s * H + h) * V + v]) = make_float2(sum.x * inv, sum.y * inv);
  }
}
