// Sparse MQA over the indexer's selected rows (`day0::dsa_attention`) for IREE's CUDA target (sm_90):
//   out[s, h, :V] = Σ_j softmax_j(scale · q[s, h] · kv[idx[s, j]]) · kv[idx[s, j], :V]
// over the K slots j with 0 <= idx < T (other slots, e.g. -1, are empty; all empty -> zeros).
//
// Dispatched by the `dsa-to-cuda-kernel` pass (IREE external dispatch ABI). Flash-decoding split:
//   partial  grid (splits, ceil(H/HEADS), S): one CTA takes ROWS consecutive slots of one query
//            and HEADS heads; 16 selected rows at a time go to shared memory; per head it keeps
//            the running max m, sum l and V-wide accumulator (online softmax); writes m, l, acc.
//   combine  grid (H, S): merges the splits of one (query, head) and writes out.
// Type T_ is the dtype of q, kv and out (f32 or bf16); arithmetic is f32.

#include <cuda_bf16.h>

#define THREADS 256
#define WARPS (THREADS / 32)
#define HEADS 4        // heads per partial CTA
#define CHUNK 16       // selected rows staged in shared memory at a time
#define ROWS 128       // selected slots per split
#define MAX_D 576      // kv row width (MLA latent 512 + rope 64)
#define MAX_V 1024     // value width (acc: ceil(V / 64) values a thread)

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void from_f(float v, float* o) { *o = v; }
__device__ __forceinline__ void from_f(float v, __nv_bfloat16* o) { *o = __float2bfloat16(v); }

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

template <typename T_>
__device__ void dsa_combine(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                            T_* __restrict__ out, int H, int V, int splits) {
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
    from_f(l > 0.0f ? o / l : 0.0f, &out[((size_t)s * H + h) * V + d]);
  }
}

#define DSA_KERNELS(NAME, T_)                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS)                                           \
  day0_dsa_partial_##NAME(const T_* q, const T_* kv, const long long* idx, float* part_ml,        \
                          float* part_acc, int H, int D, int K, int V, int T, int scale_bits) {   \
    dsa_partial<T_>(q, kv, idx, part_ml, part_acc, H, D, K, V, T, scale_bits);                    \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(THREADS)                                           \
  day0_dsa_combine_##NAME(const float* part_ml, const float* part_acc, T_* out, int H, int V,     \
                          int splits) {                                                           \
    dsa_combine<T_>(part_ml, part_acc, out, H, V, splits);                                        \
  }

DSA_KERNELS(f32, float)
DSA_KERNELS(bf16, __nv_bfloat16)
