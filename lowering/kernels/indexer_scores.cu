// The DSA lightning indexer's scores (`day0::indexer_scores`) for IREE's CUDA target (sm_90):
//   out[s, t] = Σ_h w[s, h] · relu(scale · q[s, h, :] · keys[t, :])
// q [S, H, D] f32, keys [T, D] (f32 or bf16), w [S, H] f32, out [S, T] f32; H <= 64, D <= 128.
// The rows form (`day0::indexer_scores_rows`, a batched decode step over paged caches) reads key t
// of query s at row rows[s, t] of keys [R, D] (a pool): rows [S, T] int64, out [S, T]. A negative
// row is an empty slot (past the query's position, or top-k padding): its score is EMPTY_SCORE and
// no key is read; a warp's tile of 16 empty slots skips its products. The causal form
// (`day0::indexer_scores_causal`, a prompt chunk over its sequence's key range) reads slot t at
// row rows[t] of a cache or pool (rows [T] int64, the same for every query) and scores EMPTY_SCORE
// where rows[t] < 0 or t > last[s] (last [S] int64: the query's position), so the scores come
// out masked and padded as the top-k takes them: no [S, T] mask tensor and no masked copy.
//
// Dispatched by the `indexer-scores-to-cuda-kernel` pass (IREE external dispatch ABI: q, keys,
// [rows, [last,]] w, out, then the push constants H, D, T, scale bits and, but for the rows form,
// S; grid (x, S): a CTA takes keys of one query; the tensor-core kernel of one key range (plain or
// causal): grid (x, ceil(S / qb)), a CTA takes qb = queries_per_cta(H) queries, which share each
// key tile a warp loads).
//
// day0_indexer_scores_{f32,bf16}: exact f32 FMAs, grid (ceil(T / KEYS), S). The query's heads sit
// in shared memory (row stride D + 1: lane h reads head h, so an unpadded stride would put every
// lane on one bank); a warp stages one key row at a time and each lane computes the dot products
// of its heads (h = lane, lane + 32), then the warp sums w·relu over the heads. Bound by its two
// shared-memory loads per FMA.
//
// day0_indexer_scores_bf16_mma: tensor cores (mma.sync m16n8k16 bf16, f32 accumulation) for bf16
// keys; q (after the scale) is split once per CTA into two bf16 terms, hi = bf16(q) and
// lo = bf16(q - hi), and each tile takes both products (keys are exact in bf16, every product is
// exact in f32): scores carry q to 16 significant bits, ~1e-5 relative of the f32 kernel. (q
// rounded to bf16 alone, 8 bits, moved ~3 of a top-2048 selection per query on the H200.) Any grid x: CTA b takes a contiguous range of
// ceil(ceil(T / 16) / gridDim.x) tiles of 16 keys, its warps tiles first + warp + 8 i.
#include <cuda_bf16.h>

#include "mma_bf16.cuh"

#define THREADS 256
#define WARPS (THREADS / 32)
#define KEYS 128      // keys per CTA (16 a warp)
#define EMPTY_SCORE -1.0e30f  // an empty slot's score (models/dsa_indexer.py INVISIBLE)
#define MAX_H 64
#define MAX_D 128

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

// Where slot t of query s reads its key: slot t itself (rows nullptr), rows[s, t] (the rows form,
// rows [S, T]) or rows[t] unless t > last[s] (the causal form, rows [T]); < 0: an empty slot.
struct Slots {
  const long long* rows;
  const long long* last;
  __device__ __forceinline__ bool per_query() const { return rows && !last; }
  __device__ __forceinline__ long long row(int s, int T, int t) const {
    if (!rows) return t;
    if (!last) return rows[(size_t)s * T + t];
    return t > last[s] ? -1 : rows[t];
  }
  // the row a CTA's warp loads for a tile its queries share (the causal form: whatever their
  // positions; each query's own slots are masked where its scores are written)
  __device__ __forceinline__ long long loaded(int s, int T, int t) const { return last ? rows[t] : row(s, T, t); }
};

template <typename K_>
__device__ void indexer_scores(const float* __restrict__ q, const K_* __restrict__ keys,
                               const Slots slots, const float* __restrict__ w,
                               float* __restrict__ out, int H, int D, int T, int scale_bits) {
  __shared__ float qs[MAX_H * (MAX_D + 1)];
  __shared__ float ws[MAX_H];
  __shared__ float kbuf[WARPS][MAX_D];
  const float scale = __int_as_float(scale_bits);
  const int s = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* qrow = q + (size_t)s * H * D;
  for (int i = threadIdx.x; i < H * D; i += THREADS) qs[(i / D) * (D + 1) + i % D] = qrow[i];
  for (int h = threadIdx.x; h < H; h += THREADS) ws[h] = w[(size_t)s * H + h];
  __syncthreads();
  const int t0 = blockIdx.x * KEYS + warp * (KEYS / WARPS);
  for (int j = 0; j < KEYS / WARPS; ++j) {
    const int t = t0 + j;
    if (t >= T) break;
    const long long r = slots.row(s, T, t);  // the same for the warp's lanes
    if (r < 0) {
      if (lane == 0) out[(size_t)s * T + t] = EMPTY_SCORE;
      continue;
    }
    const K_* krow = keys + (size_t)r * D;
    for (int d = lane; d < D; d += 32) kbuf[warp][d] = to_f(krow[d]);
    __syncwarp();
    float total = 0.0f;
#pragma unroll
    for (int hh = 0; hh < MAX_H / 32; ++hh) {
      const int h = lane + 32 * hh;
      if (h < H) {
        const float* qh = qs + h * (D + 1);
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot += qh[d] * kbuf[warp][d];
        total += ws[h] * fmaxf(dot * scale, 0.0f);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) out[(size_t)s * T + t] = total;
    __syncwarp();  // kbuf is rewritten by the next key
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
day0_indexer_scores_f32(const float* q, const float* keys, const float* w, float* out, int H, int D,
                        int T, int scale_bits, int S) {
  indexer_scores<float>(q, keys, Slots{nullptr, nullptr}, w, out, H, D, T, scale_bits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
day0_indexer_scores_bf16(const float* q, const __nv_bfloat16* keys, const float* w, float* out,
                         int H, int D, int T, int scale_bits, int S) {
  indexer_scores<__nv_bfloat16>(q, keys, Slots{nullptr, nullptr}, w, out, H, D, T, scale_bits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
day0_indexer_scores_rows_f32(const float* q, const float* keys, const long long* rows, const float* w,
                             float* out, int H, int D, int T, int scale_bits) {
  indexer_scores<float>(q, keys, Slots{rows, nullptr}, w, out, H, D, T, scale_bits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
day0_indexer_scores_rows_bf16(const float* q, const __nv_bfloat16* keys, const long long* rows,
                              const float* w, float* out, int H, int D, int T, int scale_bits) {
  indexer_scores<__nv_bfloat16>(q, keys, Slots{rows, nullptr}, w, out, H, D, T, scale_bits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
day0_indexer_scores_causal_f32(const float* q, const float* keys, const long long* rows, const long long* last,
                               const float* w, float* out, int H, int D, int T, int scale_bits, int S) {
  indexer_scores<float>(q, keys, Slots{rows, last}, w, out, H, D, T, scale_bits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
day0_indexer_scores_causal_bf16(const float* q, const __nv_bfloat16* keys, const long long* rows,
                                const long long* last, const float* w, float* out, int H, int D, int T,
                                int scale_bits, int S) {
  indexer_scores<__nv_bfloat16>(q, keys, Slots{rows, last}, w, out, H, D, T, scale_bits);
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel (bf16 keys).
//
// A tile is scores[16 keys, 8 heads] = keys[16, D] · qᵀ[D, 8] as D/16 mma.m16n8k16 (A = keys, row
// major; B = q, "col" = one head's D values). The dot product does not care in which order it
// visits d, so the k index of the mma is a permutation of d chosen for the loads: for chunk c
// (32 values of d) lane (g = lane / 4, i = lane % 4) loads the 16 bytes d = 32 c + 8 i .. + 8 of
// key rows g and g + 8 (one 16-byte load each, a quad reads 64 contiguous bytes of a row), and
// uses words (x, y) as its (low, high) k pair of k-step 2c and words (z, w) of k-step 2c + 1.
// B follows the same map: lane (g, i) holds q[h = 8 nt + g, 32 c + 8 i .. + 8] as bf16 (hi and lo),
// which the CTA stores once in shared memory in exactly that fragment order (conflict-free 16-byte
// loads).
// Accumulator lane (g, i): keys g, g + 8 × heads 8 nt + 2 i, + 1; w·relu is summed per lane, then
// over the quad (2 shuffles).

#define MMA_CHUNKS (MAX_D / 32)  // 32-wide chunks of d
#define MMA_NT (MAX_H / 8)       // 8-head mma tiles
#define MMA_GROUP 4              // head tiles accumulated at once (H <= 32: one group)
#define TILE 16                  // keys per mma tile
#define QUNITS 8                 // 8-head q fragment units in shared memory (MAX_H / 8)

// Queries a CTA of the prefill form takes (lowering/kernel_geometry.py indexer_queries_per_cta):
// as many as QUNITS units of 8 heads hold.
__host__ __device__ __forceinline__ int queries_per_cta(int H) { return QUNITS / ((H + 7) / 8); }

// 16 bytes of keys read once: not kept in L1 (L2 keeps them for the other queries of a prefill).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Lane (g, i)'s A fragments of the tile at key t0: keys t0 + g (a[0]) and t0 + g + 8 (a[1]) of
// query s (Slots::loaded), 8 bf16 of chunk c each; zeros past T or D and for empty slots. vec: D % 8 == 0
// (16-byte aligned rows); slots past `reach` (the causal form: the CTA's queries' last slot) load
// nothing. Returns whether any of the tile's 16 slots holds a key (the same for
// the warp's lanes: every lane of the warp must call it).
__device__ __forceinline__ bool load_key_tile(uint4 (&a)[2][MMA_CHUNKS],
                                              const __nv_bfloat16* __restrict__ keys,
                                              const Slots slots, int s, int t0, int T,
                                              long long reach, int D, bool vec, int g, int i) {
  bool any = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = t0 + g + 8 * r;
    const long long kr = t < T && t <= reach ? slots.loaded(s, T, t) : -1;
    const bool live = kr >= 0;
    const size_t row = live ? (size_t)kr : 0;
    any |= live;
#pragma unroll
    for (int c = 0; c < MMA_CHUNKS; ++c) {
      const int d0 = 32 * c + 8 * i;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (live && d0 < D) {
        const __nv_bfloat16* p = keys + row * D + d0;
        if (vec) {
          v = ld_stream(p);
        } else {
          const unsigned short* e = reinterpret_cast<const unsigned short*>(p);
          unsigned u[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const unsigned lo = d0 + 2 * k < D ? e[2 * k] : 0u;
            const unsigned hi = d0 + 2 * k + 1 < D ? e[2 * k + 1] : 0u;
            u[k] = lo | (hi << 16);
          }
          v = make_uint4(u[0], u[1], u[2], u[3]);
        }
      }
      a[r][c] = v;
    }
  }
  return __any_sync(0xffffffffu, any);
}

__device__ __forceinline__ void indexer_scores_mma(const float* __restrict__ q,
                                                   const __nv_bfloat16* __restrict__ keys,
                                                   const Slots slots,
                                                   const float* __restrict__ w, float* __restrict__ out,
                                                   int H, int D, int T, int scale_bits, int S) {
  // unit u: the q fragments of 8 heads (head tile u % nt_n) of the CTA's query u / nt_n
  __shared__ uint4 qf[QUNITS][2][MMA_CHUNKS][32];  // q · scale as bf16 B fragments, hi and lo (32 KB)
  __shared__ __align__(16) float ws[QUNITS * 8];
  __shared__ long long lasts[QUNITS];  // the causal form: the CTA's queries' last visible slots
  const float scale = __int_as_float(scale_bits);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, i = lane & 3;
  // The grid is (key ranges, query groups). One key range for every query: the CTAs of one key
  // range take consecutive block ids, so that the query groups reading the same keys run together
  // and share them in L2 (in grid order, each group would stream every key from memory).
  const bool shared = !slots.per_query();
  const int id = blockIdx.x + blockIdx.y * gridDim.x;
  const int kx = shared ? id / gridDim.y : blockIdx.x, qy = shared ? id % gridDim.y : blockIdx.y;
  const int tiles = (T + TILE - 1) / TILE;
  const int per = (tiles + gridDim.x - 1) / gridDim.x;
  const int first = kx * per, last = min(first + per, tiles);
  const bool vec = (D & 7) == 0;
  const int nchunks = (D + 31) / 32, nt_n = (H + 7) / 8;
  // queries of this CTA: one in the rows form (each query its own keys), else QUNITS / nt_n sharing
  // every key tile a warp loads (a prefill chunk's queries read the same keys: fewer loads a product)
  const int qb = shared ? queries_per_cta(H) : 1;
  const int s_first = qy * qb, nq = min(qb, S - s_first);
  long long reach = T;  // no key past the CTA's queries' last slot is loaded (the causal form)
  if (slots.last) {
    reach = -1;
    for (int j = 0; j < nq; ++j) reach = max(reach, slots.last[s_first + j]);
  }

  // The first tile's keys do not depend on q: in flight while the CTA converts q.
  uint4 a[2][MMA_CHUNKS];
  int tile = first + warp;
  bool live = load_key_tile(a, keys, slots, s_first, tile < last ? tile * TILE : T, T, reach, D, vec, g, i);

  for (int f = threadIdx.x; f < nq * nt_n * MMA_CHUNKS * 32; f += THREADS) {
    const int l = f & 31, c = (f >> 5) % MMA_CHUNKS, u = (f >> 5) / MMA_CHUNKS;
    const int h = 8 * (u % nt_n) + (l >> 2), d0 = 32 * c + 8 * (l & 3);
    const float* qrow = q + (size_t)(s_first + u / nt_n) * H * D;
    float v[8], r[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[k] = h < H && d0 + k < D ? qrow[(size_t)h * D + d0 + k] * scale : 0.0f;
      r[k] = v[k] - __bfloat162float(__float2bfloat16_rn(v[k]));  // exact in f32
    }
    qf[u][0][c][l] = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                                pack_bf16(v[6], v[7]));
    qf[u][1][c][l] = make_uint4(pack_bf16(r[0], r[1]), pack_bf16(r[2], r[3]), pack_bf16(r[4], r[5]),
                                pack_bf16(r[6], r[7]));
  }
  for (int x = threadIdx.x; x < nq * nt_n * 8; x += THREADS) {
    const int u = x / 8, h = 8 * (u % nt_n) + x % 8;
    ws[x] = h < H ? w[(size_t)(s_first + u / nt_n) * H + h] : 0.0f;
  }
  if (threadIdx.x < nq) lasts[threadIdx.x] = slots.last ? slots.last[s_first + threadIdx.x] : (long long)T;
  __syncthreads();

  for (; tile < last; tile += WARPS) {
    uint4 next[2][MMA_CHUNKS];  // the warp's next tile, loading while this one computes
    const int nt0 = tile + WARPS;
    const bool next_live = load_key_tile(next, keys, slots, s_first, nt0 < last ? nt0 * TILE : T, T, reach, D, vec, g, i);
    for (int j = 0; j < nq; ++j) {
      float s0 = 0.0f, s1 = 0.0f;  // keys g, g + 8: Σ over this lane's heads of w·relu
      // a tile wholly past the query's last slot (the causal form) scores empty without products
      const bool seen = live && tile * TILE <= lasts[j];
      for (int hg = 0; seen && hg < nt_n; hg += MMA_GROUP) {
        float acc[MMA_GROUP][4];
#pragma unroll
        for (int n = 0; n < MMA_GROUP; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int c = 0; c < MMA_CHUNKS; ++c) {
          if (c < nchunks) {
#pragma unroll
            for (int n = 0; n < MMA_GROUP; ++n) {
              if (hg + n < nt_n) {
#pragma unroll
                for (int part = 0; part < 2; ++part) {  // q's hi and lo terms
                  const uint4 b = qf[j * nt_n + hg + n][part][c][lane];
                  mma_bf16(acc[n], a[0][c].x, a[1][c].x, a[0][c].y, a[1][c].y, b.x, b.y);
                  mma_bf16(acc[n], a[0][c].z, a[1][c].z, a[0][c].w, a[1][c].w, b.z, b.w);
                }
              }
            }
          }
        }
#pragma unroll
        for (int n = 0; n < MMA_GROUP; ++n) {
          if (hg + n < nt_n) {
            const float2 wv = *reinterpret_cast<const float2*>(&ws[8 * (j * nt_n + hg + n) + 2 * i]);  // 0 past H
            s0 += wv.x * fmaxf(acc[n][0], 0.0f) + wv.y * fmaxf(acc[n][1], 0.0f);
            s1 += wv.x * fmaxf(acc[n][2], 0.0f) + wv.y * fmaxf(acc[n][3], 0.0f);
          }
        }
      }
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, o);
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
      }
      const int s = s_first + j, t = tile * TILE + g + (i == 1 ? 8 : 0);
      if (i < 2 && t < T) out[(size_t)s * T + t] = slots.row(s, T, t) < 0 ? EMPTY_SCORE : (i == 0 ? s0 : s1);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < MMA_CHUNKS; ++c) a[r][c] = next[r][c];
    live = next_live;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
day0_indexer_scores_bf16_mma(const float* __restrict__ q, const __nv_bfloat16* __restrict__ keys,
                             const float* __restrict__ w, float* __restrict__ out, int H, int D,
                             int T, int scale_bits, int S) {
  indexer_scores_mma(q, keys, Slots{nullptr, nullptr}, w, out, H, D, T, scale_bits, S);
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
day0_indexer_scores_rows_bf16_mma(const float* __restrict__ q, const __nv_bfloat16* __restrict__ keys,
                                  const long long* __restrict__ rows, const float* __restrict__ w,
                                  float* __restrict__ out, int H, int D, int T, int scale_bits) {
  indexer_scores_mma(q, keys, Slots{rows, nullptr}, w, out, H, D, T, scale_bits, gridDim.y);
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
day0_indexer_scores_causal_bf16_mma(const float* __restrict__ q, const __nv_bfloat16* __restrict__ keys,
                                    const long long* __restrict__ rows, const long long* __restrict__ last,
                                    const float* __restrict__ w, float* __restrict__ out, int H, int D, int T,
                                    int scale_bits, int S) {
  indexer_scores_mma(q, keys, Slots{rows, last}, w, out, H, D, T, scale_bits, S);
}
