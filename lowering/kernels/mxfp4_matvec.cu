// MXFP4 expert matvec for IREE's CUDA target (sm_90): out[r, n] = W[e_r][n, :] · x[r / per_x, :]
// (day0_mxfp4_matvec_swiglu: x staged through the SwiGLU from gate_up rows, below)
// with W stored as the `day0::mxfp4_moe` op stores it: packed u8 [E, N, K/2] (two E2M1 codes a
// byte, low nibble = even element) and scales u8 [E, N, K/32] (E8M0, one per 32 elements).
//
// Dispatched by the `mxfp4-to-cuda-matvec` pass (IREE external dispatch ABI: bindings in order,
// then i32 push constants). Rows r = t·k + j of the op's [T, k, N] result, expert e_r =
// experts[r] (i64), x row = t = r / k. An expert index outside [0, E) yields zeros (never a
// fault). K must be a multiple of 32 (the op's precondition); any N.
//
// One 16-byte load of packed bytes is exactly one MX block (32 values) and its scale byte: lane l
// of a warp takes blocks l, l+32, ... of its weight rows, and the warp reduces. A CTA of 8 warps
// computes 32 rows (4 per warp) of one (t, j): grid (ceil(N / 32), T·k).
//
// A warp streams its 4 rows together: each step loads block b of all 4 rows (4 independent
// 16-byte loads a lane), and the next step's 4 are issued before this step's arithmetic (the
// first before x is staged), so 4–8 loads a lane are in flight where one row at a time had 1–2
// (K = 1024–2048: a row is 32–64 blocks, one or two a lane). Block b's 32 x values are read from
// shared memory into registers once for the 4 rows (x read from shared memory per row, or with
// 3 CTAs an SM forced, was 4–15% slower on the H100: docs/perf.md). One row at a time reached
// ~1/4 of the bandwidth.

#define WARPS 8
#define ROWS_PER_WARP 4
#define ROWS_PER_CTA (WARPS * ROWS_PER_WARP)
#define MAX_K 8192  // x row cached in shared memory (the pass checks K <= MAX_K)
// x is stored 33 floats per 32-value block: lane b reads block b, so an unpadded layout would
// put all 32 lanes on one shared-memory bank.
#define XPAD(i) ((i) + ((i) >> 5))

// 2·|E2M1[c]| for c = 0..7 as 4-bit fields: 0, 1, 2, 3, 4, 6, 8, 12.
__device__ __forceinline__ float e2m1(unsigned nibble) {
  float mag = (float)((0xC8643210u >> ((nibble & 7u) * 4u)) & 15u) * 0.5f;
  return (nibble & 8u) ? -mag : mag;
}

__device__ __forceinline__ void load_blocks(uint4 (&q)[ROWS_PER_WARP], float (&s)[ROWS_PER_WARP],
                                            const uint4* const (&prow)[ROWS_PER_WARP],
                                            const unsigned char* const (&srow)[ROWS_PER_WARP], int b) {
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
    if (prow[rr] != nullptr) {
      q[rr] = __ldg(prow[rr] + b);  // 16 bytes = 32 codes of block b
      s[rr] = __int_as_float((int)__ldg(srow[rr] + b) << 23);  // 2^(s-127)
    } else {
      q[rr] = make_uint4(0u, 0u, 0u, 0u);
      s[rr] = 0.0f;
    }
  }
}

// x's value i as the kernel stages it: x[t, i], or for the SwiGLU entry silu(min(g, limit)) ·
// clamp(u, -limit, limit) of g = x[t, i], u = x[t, K + i] (a row of 2K: gate | up; models/layers
// swiglu; limit +inf: no clamp), silu(g) = g / (1 + e^-g) with the fast exp and division (~2 ulp:
// every CTA of a row stages it again, on the path to its first products; gpu_kernel_times `moe`).
template <bool SWIGLU>
__device__ __forceinline__ float staged(const float* __restrict__ xr, int i, int K, float limit) {
  if (!SWIGLU) return xr[i];
  const float g = fminf(xr[i], limit), u = fminf(fmaxf(xr[K + i], -limit), limit);
  return __fdividef(g, 1.0f + __expf(-g)) * u;
}

template <bool SWIGLU>
__device__ __forceinline__ void mxfp4_matvec(const float* __restrict__ x, const unsigned char* __restrict__ packed,
                                             const unsigned char* __restrict__ scales,
                                             const long long* __restrict__ experts, float* __restrict__ out,
                                             int K, int N, int k, int E, float limit) {
  __shared__ float xs[XPAD(MAX_K)];
  __shared__ float2 lut[256];  // a byte's two decoded values (low nibble first)
  const int r = blockIdx.y, t = r / k;
  const long long e = experts[r];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int blocks = K / 32;
  const int n0 = blockIdx.x * ROWS_PER_CTA + warp * ROWS_PER_WARP;
  const uint4* prow[ROWS_PER_WARP];
  const unsigned char* srow[ROWS_PER_WARP];
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {  // null: a row past N or an expert outside [0, E)
    const bool live = e >= 0 && e < E && n0 + rr < N;
    const size_t row = live ? (size_t)e * N + n0 + rr : 0;
    prow[rr] = live ? reinterpret_cast<const uint4*>(packed + row * (size_t)(K / 2)) : nullptr;
    srow[rr] = live ? scales + row * (size_t)blocks : nullptr;
  }
  uint4 q[ROWS_PER_WARP];
  float s[ROWS_PER_WARP];
  if (lane < blocks) load_blocks(q, s, prow, srow, lane);  // in flight while x is staged
  const float* xr = x + (size_t)t * (SWIGLU ? 2 * K : K);
  for (int i = threadIdx.x; i < K; i += WARPS * 32) xs[XPAD(i)] = staged<SWIGLU>(xr, i, K, limit);
  lut[threadIdx.x] = make_float2(e2m1(threadIdx.x & 15u), e2m1(threadIdx.x >> 4));  // 256 threads
  __syncthreads();
  float acc[ROWS_PER_WARP] = {};
  for (int b = lane; b < blocks; b += 32) {
    uint4 qn[ROWS_PER_WARP];
    float sn[ROWS_PER_WARP];
    if (b + 32 < blocks) load_blocks(qn, sn, prow, srow, b + 32);  // the next step's loads first
    float xv[32];
    const float* xb = xs + b * 33;
#pragma unroll
    for (int i = 0; i < 32; ++i) xv[i] = xb[i];
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
      if (prow[rr] == nullptr) continue;  // zeros, whatever x holds (uniform across the warp)
      const unsigned words[4] = {q[rr].x, q[rr].y, q[rr].z, q[rr].w};
      float part = 0.0f;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 v = lut[(words[w] >> (8 * i)) & 0xffu];
          part += v.x * xv[w * 8 + 2 * i] + v.y * xv[w * 8 + 2 * i + 1];
        }
      }
      acc[rr] += part * s[rr];
    }
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) q[rr] = qn[rr], s[rr] = sn[rr];
  }
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) acc[rr] += __shfl_down_sync(0xffffffffu, acc[rr], d);
    if (lane == 0 && n0 + rr < N) out[(size_t)r * N + n0 + rr] = acc[rr];
  }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
day0_mxfp4_matvec(const float* __restrict__ x, const unsigned char* __restrict__ packed,
                  const unsigned char* __restrict__ scales, const long long* __restrict__ experts,
                  float* __restrict__ out, int K, int N, int k, int E) {
  mxfp4_matvec<false>(x, packed, scales, experts, out, K, N, k, E, 0.0f);
}

// x: gate_up rows [T, 2K] (day0::mxfp4_moe_swiglu); limit_bits: the clamp's f32 bits (+inf: none)
extern "C" __global__ void __launch_bounds__(WARPS * 32)
day0_mxfp4_matvec_swiglu(const float* __restrict__ x, const unsigned char* __restrict__ packed,
                         const unsigned char* __restrict__ scales, const long long* __restrict__ experts,
                         float* __restrict__ out, int K, int N, int k, int E, int limit_bits) {
  mxfp4_matvec<true>(x, packed, scales, experts, out, K, N, k, E, __int_as_float(limit_bits));
}
