// Dense attention within segments (`day0::vision_attention`, the vision tower's attention) for IREE's
// CUDA target (sm_90), flash-style:
//   out[s, h] = Σ_t softmax_t(scale · q[s, h]·k[t, h]) · v[t, h]   over the t with seg[t] == seg[s]
// q, k, v: TERMS stacked bf16 terms [TERMS, P, H, D] of the f32 values (x ≈ Σ terms, as
// passes/matmul_to_bf16_terms.py splits them); seg [P] i64, non-decreasing (each image's patches
// are one run: runtime/images.py); out [P, H, D] f32.
//
// Why: IREE 3.13 runs this attention, fused or decomposed, at 4-9× PyTorch's bf16 SDPA in bf16
// and 8-30× in f32 (docs/perf.md, "Images"); the release tower spends most of an image's time here.
//
// Dispatched by the `vision-attention-to-cuda-kernel` pass (IREE external dispatch ABI): q, k, v,
// seg | out, then the i32 push constants P, H, scale bits; grid (ceil(P / 128), H). Entries
// day0_vision_attention_d<D>_t<TERMS> for D in 16, 32, 64, 128 and TERMS 1, 2
// (lowering/kernel_geometry.py, section vision_attention.cu).
//
// CTA: 128 query rows of one head, 8 warps of 16 rows. Segments are runs, so the keys the rows can
// see are one range [kbeg, kend) (the first key of the first row's segment to the last of the last
// row's: two binary searches); a padded image's padding patches (a segment of their own at the
// end) cost its real rows nothing. The range goes through shared memory in tiles of KT keys
// (cp.async, double-buffered, 16-byte chunks of a row XOR-swizzled: conflict-free ldmatrix), K
// and V of every term. A warp keeps its q fragments in registers; per tile:
//   scores[16, KT] = Σ_{i+j<TERMS} q_i · k_jᵀ on mma.sync m16n8k16 (f32 accumulation), times
//   scale·log2(e); masked to -inf where the segments differ (only in tiles that are not wholly
//   within the rows' one segment); online softmax in f32 (base 2; FlashAttention-2's running max,
//   sum and rescaled accumulator);
//   acc[16, D] += Σ_{i+j<TERMS} p_i · v_j with P's bf16 terms p_i taken straight from the score
//   accumulators (their layout is the A fragment's) and V through ldmatrix.trans.
// One term is bf16 attention as FlashAttention computes it (q, k, v and P rounded to bf16); two
// terms leave ~2^-16 of each factor out (the products q1·k1, p1·v1 too, ~2^-32).
#include <cuda_bf16.h>

#include "mma_bf16.cuh"

#define THREADS 256
#define QROWS 128            // query rows a CTA: 8 warps × 16
#define KV_BYTES 32768       // shared K and V tiles of every term, both buffers

// Keys a tile: the most that fit KV_BYTES, at most 64 (a multiple of 16: P·V's k-steps).
template <int D, int TERMS>
struct Tile {
  static constexpr int fit = KV_BYTES / (2 * 2 * TERMS * D * 2);
  static constexpr int KT = fit < 64 ? fit : 64;
  static constexpr int CH = D / 8;  // 16-byte chunks of a row
};

// The physical chunk of chunk c of tile row r: the 8 rows one ldmatrix reads hit 8 distinct
// 16-byte slots of a 128-byte line.
template <int CH>
__device__ __forceinline__ int swizzle(int r, int c) {
  if constexpr (CH >= 8) {
    return c ^ (r & 7);
  } else {
    return c ^ ((r / (8 / CH)) & (CH - 1));
  }
}

template <int CH>
__device__ __forceinline__ unsigned chunk_addr(unsigned base, int r, int c) {
  return base + (unsigned)((r * CH + swizzle<CH>(r, c)) * 16);
}

__device__ __forceinline__ void ldsm_x2(unsigned& r0, unsigned& r1, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

template <int D, int TERMS>
__device__ __forceinline__ void vision_attention(const __nv_bfloat16* __restrict__ q,
                                                 const __nv_bfloat16* __restrict__ k,
                                                 const __nv_bfloat16* __restrict__ v,
                                                 const long long* __restrict__ seg, float* __restrict__ out,
                                                 int P, int H, int scale_bits) {
  constexpr int KT = Tile<D, TERMS>::KT, CH = Tile<D, TERMS>::CH;
  constexpr int NT = KT / 8;   // n8 tiles of a score row
  constexpr int KS = D / 16;   // k-steps of the scores
  constexpr int DT = D / 8;    // n8 tiles of the output
  constexpr int PS = KT / 16;  // k-steps of P·V
  __shared__ __align__(128) __nv_bfloat16 ks[2][TERMS][KT * D];
  __shared__ __align__(128) __nv_bfloat16 vs[2][TERMS][KT * D];
  __shared__ long long kseg[2][KT];
  __shared__ int range[2];

  const float scale = __int_as_float(scale_bits) * 1.4426950408889634f;  // base-2 softmax
  const int h = blockIdx.y, q0 = blockIdx.x * QROWS, qlast = min(q0 + QROWS, P) - 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const size_t term = (size_t)P * H * D, row = (size_t)H * D;  // element strides

  if (threadIdx.x == 0) {
    const long long first = seg[q0], last = seg[qlast];
    int lo = 0, hi = q0;  // the first key whose segment is not before the first row's
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (seg[mid] < first) lo = mid + 1; else hi = mid;
    }
    range[0] = lo;
    lo = qlast + 1, hi = P;  // the first key past the last row's segment
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (seg[mid] <= last) lo = mid + 1; else hi = mid;
    }
    range[1] = lo;
  }

  // q fragments (A: rows r0 = g and r1 = g + 8 of the warp's 16, d 16 kk + 2t (+8)), every term
  const int r0 = q0 + 16 * warp + g, r1 = r0 + 8;
  unsigned qf[TERMS][KS][4];
#pragma unroll
  for (int i = 0; i < TERMS; ++i) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int r = (x & 1) ? r1 : r0, d = 16 * kk + 2 * t + 8 * (x >> 1);
        qf[i][kk][x] = r < P ? *reinterpret_cast<const unsigned*>(q + i * term + r * row + (size_t)h * D + d) : 0u;
      }
    }
  }
  const long long seg0 = r0 < P ? seg[r0] : -1, seg1 = r1 < P ? seg[r1] : -1;
  const bool one_segment = seg[q0] == seg[qlast];
  __syncthreads();
  const int kbeg = range[0], kend = range[1];
  const int tiles = (kend - kbeg + KT - 1) / KT;

  auto load = [&](int tile, int buf) {
    const int k0 = kbeg + tile * KT;
    for (int c = threadIdx.x; c < TERMS * KT * CH; c += THREADS) {
      const int i = c / (KT * CH), r = (c / CH) % KT, ch = c % CH, key = k0 + r;
      const bool ok = key < kend;
      const size_t src = i * term + (size_t)(ok ? key : 0) * row + (size_t)h * D + 8 * ch;
      const unsigned off = (unsigned)((r * CH + swizzle<CH>(r, ch)) * 16);
      cp_async16(smem_addr(ks[buf][i]) + off, k + src, ok ? 16 : 0);
      cp_async16(smem_addr(vs[buf][i]) + off, v + src, ok ? 16 : 0);
    }
    for (int r = threadIdx.x; r < KT; r += THREADS) kseg[buf][r] = k0 + r < kend ? seg[k0 + r] : -2;
  };

  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // rows g and g + 8 (this lane's part of l)

  if (tiles > 0) load(0, 0);
  cp_async_commit();
  for (int tile = 0; tile < tiles; ++tile) {
    const int buf = tile & 1;
    if (tile + 1 < tiles) {
      load(tile + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int k0 = kbeg + tile * KT;
    // every pair sees each other: the rows share one segment and so do the tile's keys (runs)
    const bool whole = one_segment && k0 + KT <= kend && kseg[buf][0] == seg0 && kseg[buf][KT - 1] == seg0;

    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < TERMS; ++kt) {
      const unsigned kb = smem_addr(ks[buf][kt]);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int kk = 0; kk < KS; kk += 2) {
          unsigned b[4];
          if constexpr (KS >= 2) {  // k-steps kk and kk + 1: matrices (rows 8j.., chunks 2kk + 0..3)
            ldsm_x4(b, chunk_addr<CH>(kb, 8 * j + (lane & 7), 2 * kk + (lane >> 3)));
          } else {
            ldsm_x2(b[0], b[1], chunk_addr<CH>(kb, 8 * j + (lane & 7), (lane >> 3) & 1));
          }
#pragma unroll
          for (int qt = 0; qt + kt < TERMS; ++qt) {
            mma_bf16(s[j], qf[qt][kk][0], qf[qt][kk][1], qf[qt][kk][2], qf[qt][kk][3], b[0], b[1]);
            if constexpr (KS >= 2) {
              mma_bf16(s[j], qf[qt][kk + 1][0], qf[qt][kk + 1][1], qf[qt][kk + 1][2], qf[qt][kk + 1][3], b[2], b[3]);
            }
          }
        }
      }
    }

    // scale, mask, online softmax (rows g: s[.][0..1], g + 8: s[.][2..3])
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * scale;
        if (!whole && kseg[buf][8 * j + 2 * t + (e & 1)] != (e < 2 ? seg0 : seg1)) x = -INFINITY;
        s[j][e] = x;
      }
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float b0 = n0 == -INFINITY ? 0.0f : n0, b1 = n1 == -INFINITY ? 0.0f : n1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);  // 0 while nothing was seen
    m0 = n0, m1 = n1, l0 *= c0, l1 *= c1;
#pragma unroll
    for (int j = 0; j < DT; ++j) acc[j][0] *= c0, acc[j][1] *= c0, acc[j][2] *= c1, acc[j][3] *= c1;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      s[j][0] = exp2f(s[j][0] - b0), s[j][1] = exp2f(s[j][1] - b0);
      s[j][2] = exp2f(s[j][2] - b1), s[j][3] = exp2f(s[j][3] - b1);
      l0 += s[j][0] + s[j][1], l1 += s[j][2] + s[j][3];
    }

    // acc += P · V: P's A fragment of k-step kk is score tiles 2kk (cols 2t) and 2kk + 1 (+8)
#pragma unroll
    for (int kk = 0; kk < PS; ++kk) {
      unsigned pa[TERMS][4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float* sv = &s[2 * kk + (x >> 1)][2 * (x & 1)];
        float e0 = sv[0], e1 = sv[1];
#pragma unroll
        for (int i = 0; i < TERMS; ++i) {
          pa[i][x] = pack_bf16(e0, e1);
          e0 -= __uint_as_float(pa[i][x] << 16), e1 -= __uint_as_float(pa[i][x] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int vt = 0; vt < TERMS; ++vt) {
        const unsigned vb = smem_addr(vs[buf][vt]);
#pragma unroll
        for (int j = 0; j < DT; j += 2) {  // n8 tiles j, j + 1: matrices (keys 16kk + 0/8.., chunks j, j + 1)
          unsigned b[4];
          ldsm_x4_trans(b, chunk_addr<CH>(vb, 16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7), j + (lane >> 4)));
#pragma unroll
          for (int pt = 0; pt + vt < TERMS; ++pt) {
            mma_bf16(acc[j], pa[pt][0], pa[pt][1], pa[pt][2], pa[pt][3], b[0], b[1]);
            mma_bf16(acc[j + 1], pa[pt][0], pa[pt][1], pa[pt][2], pa[pt][3], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int d = 8 * j + 2 * t;
    if (r0 < P) *reinterpret_cast<float2*>(out + r0 * row + (size_t)h * D + d) = make_float2(acc[j][0] * i0, acc[j][1] * i0);
    if (r1 < P) *reinterpret_cast<float2*>(out + r1 * row + (size_t)h * D + d) = make_float2(acc[j][2] * i1, acc[j][3] * i1);
  }
}

#define VISION_ENTRY(D, TERMS, CTAS)                                                                        \
  extern "C" __global__ void __launch_bounds__(THREADS, CTAS) day0_vision_attention_d##D##_t##TERMS(        \
      const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,                       \
      const __nv_bfloat16* __restrict__ v, const long long* __restrict__ seg, float* __restrict__ out, \
      int P, int H, int scale_bits) {                                                                 \
    vision_attention<D, TERMS>(q, k, v, seg, out, P, H, scale_bits);                                   \
  }

// CTAS: the CTAs an SM should hold (registers ≤ 128 a thread for two); two where that spills nothing
VISION_ENTRY(16, 1, 2)
VISION_ENTRY(16, 2, 2)
VISION_ENTRY(32, 1, 2)
VISION_ENTRY(32, 2, 1)
VISION_ENTRY(64, 1, 2)
VISION_ENTRY(64, 2, 1)
VISION_ENTRY(128, 1, 1)
VISION_ENTRY(128, 2, 1)
