// The DSA lightning indexer's scores (`day0::indexer_scores`) for IREE's CUDA target (sm_90):
//   out[s, t] = Σ_h w[s, h] · relu(scale · q[s, h, :] · keys[t, :])
// q [S, H, D] f32, keys [T, D] (f32 or bf16), w [S, H] f32, out [S, T] f32; H <= 64, D <= 128.
//
// Dispatched by the `indexer-scores-to-cuda-kernel` pass (IREE external dispatch ABI). Grid
// (ceil(T / KEYS), S): a CTA takes KEYS keys of one query. The query's heads sit in shared memory
// (row stride D + 1: lane h reads head h, so an unpadded stride would put every lane on one
// bank); a warp stages one key row at a time and each lane computes the dot products of its heads
// (h = lane, lane + 32), then the warp sums w·relu over the heads.

#include <cuda_bf16.h>

#define THREADS 256
#define WARPS (THREADS / 32)
#define KEYS 128      // keys per CTA (16 a warp)
#define MAX_H 64
#define MAX_D 128

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename K_>
__device__ void indexer_scores(const float* __restrict__ q, const K_* __restrict__ keys,
                               const float* __restrict__ w, float* __restrict__ out, int H, int D,
                               int T, int scale_bits) {
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
    const K_* krow = keys + (size_t)t * D;
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
                        int T, int scale_bits) {
  indexer_scores<float>(q, keys, w, out, H, D, T, scale_bits);
}

extern "C" __global__ void __launch_bounds__(THREADS)
day0_indexer_scores_bf16(const float* q, const __nv_bfloat16* keys, const float* w, float* out,
                         int H, int D, int T, int scale_bits) {
  indexer_scores<__nv_bfloat16>(q, keys, w, out, H, D, T, scale_bits);
}
