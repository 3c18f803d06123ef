// MXFP4 expert GEMM, grouped by expert, on tensor cores, for IREE's CUDA target (sm_90):
// out[r, n] = W[e_r][n, :] · x[r / k, :] for the rows r = t·k + j of `day0::mxfp4_moe`'s [T, k, N]
// result (e_r = experts[r], i64), with W as the op stores it: packed u8 [E, N, K/2] (two E2M1
// codes a byte, low nibble = even element) and scales u8 [E, N, K/32] (E8M0, one per 32 values).
// The same product as mxfp4_matvec.cu, for prefill: there each (token, slot) row re-reads and
// re-decodes its expert's weights; here a CTA decodes an expert's weight tile once per 64 rows.
//
// Two entries, same ABI and grid, dispatched by the `mxfp4-to-cuda-matvec` pass:
// day0_mxfp4_moe_gemm for prefill (T dynamic, or many rows an expert) and day0_mxfp4_moe_gemm_few
// for a batched decode step (few rows an expert; below). IREE external dispatch ABI: x, packed,
// scales, experts, out, then the i32 push constants K, N, k, E, R = T·k; grid (ceil(N / 64), E).
// An expert index outside [0, E) yields zeros (CTA column e = 0 collects and zeroes those rows).
// K must be a multiple of 32 (the op's precondition); any N, any R.
//
// day0_mxfp4_moe_gemm (prefill), CTA (n-tile, e), 8 warps:
//  1. collect the next (up to) 64 rows r with experts[r] == e, in ascending order: rounds over
//     2048 entries of experts (a ballot bitmask per 32 entries in shared memory, then warp 0
//     ranks the matches), resuming after the 64th match; repeated until the array is exhausted.
//  2. for that group, K in stages of 64 (two MX blocks): decode the weight tile [64 n × 64 k] to
//     bf16 (E2M1 × 2^(s-127) is exact in bf16), and split the group's x rows [64 × 64] (f32,
//     gathered rows t = r / k) into two bf16 terms hi = bf16(x), lo = bf16(x - hi), so that x
//     keeps 16 significant bits (bf16(x) alone moves results by ~1e-3); the next stage's global
//     loads are in flight (registers) while this stage's MMAs run.
//  3. mma.sync m16n8k16 bf16 with f32 accumulation (fragments by ldmatrix), warp w: rows
//     16 (w % 4), columns 32 (w / 4); hi·W + lo·W. Tensor cores accumulate with truncation, so a
//     stage's 8 MMAs per tile go into fresh registers that are then added to the running sum
//     with ordinary (rounded) f32 adds.
//  4. each lane writes its accumulators to the group's valid rows (rows r, columns < N).
#include <cuda_bf16.h>

#include "mma_bf16.cuh"

#define THREADS 256
#define ROWS 64           // rows of x per group (the GEMM's M tile)
#define COLS 64           // output columns per CTA (N tile)
#define KSTAGE 64         // k per stage: two MX blocks
#define LDT (KSTAGE + 8)  // bf16 row stride of the tiles: +16 bytes keeps ldmatrix conflict-free
#define SCAN_ITEMS 8      // experts entries a thread tests per scan round
#define SCAN (SCAN_ITEMS * THREADS)

// 2·|E2M1[c]| for c = 0..7 as 4-bit fields: 0, 1, 2, 3, 4, 6, 8, 12.
__device__ __forceinline__ float e2m1(unsigned nibble) {
  float mag = (float)((0xC8643210u >> ((nibble & 7u) * 4u)) & 15u) * 0.5f;
  return (nibble & 8u) ? -mag : mag;
}

// Four 8×8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The next group of (up to) MAX rows r >= pos with experts[r] == e, in ascending order, into
// rows[] (~r: an invalid expert id, collected by e = 0 and written as a zero row); returns how
// many and advances pos past the last one taken. Rounds over SCAN entries of experts: a ballot
// bitmask per 32 entries in shared memory, then warp 0 ranks the matches. Every thread calls it.
template <int MAX>
__device__ __forceinline__ int collect_rows(const long long* __restrict__ experts, int e, int E, int R,
                                            int& pos, unsigned* match, int* rows, int* s_state) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int count = 0;
  while (count < MAX && pos < R) {
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
      const int r = pos + j * THREADS + tid;
      bool hit = false;
      if (r < R) {
        const long long v = experts[r];
        hit = v == e || (e == 0 && (v < 0 || v >= E));  // column 0 also takes invalid ids
      }
      const unsigned bits = __ballot_sync(0xffffffffu, hit);
      if (lane == 0) match[j * (THREADS / 32) + warp] = bits;
    }
    __syncthreads();
    if (warp == 0) {  // lane l ranks entries pos + 64 l .. + 63 (words 2 l, 2 l + 1)
      const unsigned w0 = match[2 * lane], w1 = match[2 * lane + 1];
      const int c = __popc(w0) + __popc(w1);
      int incl = c;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      int rank = count + incl - c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        for (unsigned bits = h ? w1 : w0; bits && rank < MAX; bits &= bits - 1, ++rank) {
          const int r = pos + 64 * lane + 32 * h + __ffs(bits) - 1;
          rows[rank] = (e == 0 && experts[r] != 0) ? ~r : r;
          if (rank == MAX - 1) s_state[1] = r + 1;  // the next group resumes after the last row taken
        }
      }
      if (lane == 0) {
        s_state[0] = min(count + total, MAX);
        if (count + total < MAX) s_state[1] = pos + SCAN;
      }
    }
    __syncthreads();
    count = s_state[0];
    pos = s_state[1];
  }
  return count;
}

// 3 CTAs an SM: ptxas fits the kernel in 80 registers without spills.
extern "C" __global__ void __launch_bounds__(THREADS, 3)
day0_mxfp4_moe_gemm(const float* __restrict__ x, const unsigned char* __restrict__ packed,
                    const unsigned char* __restrict__ scales, const long long* __restrict__ experts,
                    float* __restrict__ out, int K, int N, int k, int E, int R) {
  __shared__ __align__(16) __nv_bfloat16 ws[COLS][LDT];   // decoded weights [n][k] (mma B, "col")
  __shared__ __align__(16) __nv_bfloat16 xhi[ROWS][LDT];  // x rows [m][k] (mma A, row): high term
  __shared__ __align__(16) __nv_bfloat16 xlo[ROWS][LDT];  // low term
  __shared__ float2 lut[256];            // a byte's two decoded values (low nibble first)
  __shared__ unsigned match[SCAN / 32];  // scan round: bit l of word w = entry pos + 32 w + l matches
  __shared__ int rows[ROWS];             // the group's rows r; ~r: an invalid expert (zero row)
  __shared__ int s_state[2];             // collect_rows: count, next pos
  const int e = blockIdx.y, n0 = blockIdx.x * COLS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  lut[tid] = make_float2(e2m1(tid & 15u), e2m1(tid >> 4));  // 256 threads

  // This thread's share of a stage's loads: x row `li` (16 values from k 16 lq), weight column
  // `li` (8 bytes = 16 values from k 16 lq, and their block's scale).
  const int li = tid >> 2, lq = tid & 3;
  const bool col_ok = n0 + li < N;
  const size_t wrow = (size_t)e * N + n0 + li;
  const uint2* wp = reinterpret_cast<const uint2*>(packed + wrow * (size_t)(K / 2)) + lq;
  const unsigned char* sp = scales + wrow * (size_t)(K / 32) + lq / 2;
  const int stages = (K + KSTAGE - 1) / KSTAGE;
  // The warp's output tile: rows wm .. + 16, columns wn .. + 32 (four m16n8 tiles); ldmatrix row
  // addresses: A (x) rows wm + l % 16, k + 8 (l / 16); B (weights) columns wn + l % 8 + 8 (l / 16),
  // k + 8 ((l / 8) % 2), so that B's four matrices are (b0, b1) of n-tiles 2p and 2p + 1.
  const int wm = 16 * (warp & 3), wn = 32 * (warp >> 2);
  const int a_row = wm + (lane & 15), a_k = 8 * (lane >> 4);
  const int b_col = wn + (lane & 7) + 8 * (lane >> 4), b_k = 8 * ((lane >> 3) & 1);
  const int g = lane >> 2, i4 = lane & 3;  // accumulator lane: rows g, g + 8; columns 2 i4, + 1

  for (int pos = 0; pos < R;) {
    // 1. the group: up to ROWS matching rows from `pos` on.
    const int count = collect_rows<ROWS>(experts, e, E, R, pos, match, rows, s_state);
    if (count == 0) break;

    // 2.-3. the group's GEMM.
    const int xr = li < count ? rows[li] : -1;
    const float* xp = xr >= 0 ? x + (size_t)(xr / k) * K + 16 * lq : nullptr;  // null: zeros
    float4 xv[4];
    uint2 wv;
    unsigned sv;
    auto load = [&](int s) {  // stage s's global loads into registers (zeros past K, N, count)
      const bool k_ok = s * KSTAGE + 16 * lq < K;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        xv[i] = xp && k_ok ? __ldg(reinterpret_cast<const float4*>(xp + s * KSTAGE) + i)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
      wv = col_ok && k_ok ? __ldg(wp + s * (KSTAGE / 16)) : make_uint2(0u, 0u);
      sv = col_ok && k_ok ? sp[s * (KSTAGE / 32)] : 0u;
    };
    float acc[4][4] = {};  // n-tile, accumulator register
    load(0);
    for (int s = 0; s < stages; ++s) {
      __syncthreads();  // the previous stage's MMAs are done with the tiles
      {
        const float sc = __int_as_float((int)sv << 23);  // 2^(s-127)
        const unsigned words[2] = {wv.x, wv.y};
        unsigned wb[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float2 v = lut[(words[i >> 2] >> (8 * (i & 3))) & 0xffu];
          wb[i] = pack_bf16(v.x * sc, v.y * sc);
        }
        uint4* wt = reinterpret_cast<uint4*>(&ws[li][16 * lq]);
        wt[0] = make_uint4(wb[0], wb[1], wb[2], wb[3]);
        wt[1] = make_uint4(wb[4], wb[5], wb[6], wb[7]);
        const float* f = reinterpret_cast<const float*>(xv);
        unsigned hb[8], lb[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          hb[i] = pack_bf16(f[2 * i], f[2 * i + 1]);
          const float h0 = __uint_as_float(hb[i] << 16), h1 = __uint_as_float(hb[i] & 0xffff0000u);
          lb[i] = pack_bf16(f[2 * i] - h0, f[2 * i + 1] - h1);  // exact differences
        }
        uint4* ht = reinterpret_cast<uint4*>(&xhi[li][16 * lq]);
        uint4* lt = reinterpret_cast<uint4*>(&xlo[li][16 * lq]);
        ht[0] = make_uint4(hb[0], hb[1], hb[2], hb[3]);
        ht[1] = make_uint4(hb[4], hb[5], hb[6], hb[7]);
        lt[0] = make_uint4(lb[0], lb[1], lb[2], lb[3]);
        lt[1] = make_uint4(lb[4], lb[5], lb[6], lb[7]);
      }
      __syncthreads();
      if (s + 1 < stages) load(s + 1);
      float part[4][4] = {};
#pragma unroll
      for (int kk = 0; kk < KSTAGE; kk += 16) {
        unsigned ah[4], al[4];
        ldsm_x4(ah, &xhi[a_row][kk + a_k]);
        ldsm_x4(al, &xlo[a_row][kk + a_k]);
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          unsigned b[4];
          ldsm_x4(b, &ws[b_col + 16 * p][kk + b_k]);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            mma_bf16(part[2 * p + h], ah[0], ah[1], ah[2], ah[3], b[2 * h], b[2 * h + 1]);
            mma_bf16(part[2 * p + h], al[0], al[1], al[2], al[3], b[2 * h], b[2 * h + 1]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] += part[t][i];
    }

    // 4. the result rows (`rows` is rewritten only after the next scan round's first barrier).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = wm + g + 8 * h;
      if (m < count) {
        const int r = rows[m];
        float* orow = out + (size_t)(r < 0 ? ~r : r) * N;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int n = n0 + wn + 8 * t + 2 * i4;
          if (n < N) orow[n] = r < 0 ? 0.0f : acc[t][2 * h];
          if (n + 1 < N) orow[n + 1] = r < 0 ? 0.0f : acc[t][2 * h + 1];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// day0_mxfp4_moe_gemm_few: the same product for a batch's decode step, where each expert has few
// rows (64 sequences × top-8 over 64 experts: ~8). The 64-row kernel above pads each group to 64
// rows, and its CTA waits on every 64-k stage of one weight tile; on the H200 it took 388 µs for
// the 4.9B model's gate_up at 64 sequences, this kernel 155 µs (docs/perf.md, "The MoE GEMM for
// few rows an expert"). Here:
//  - the MMA is transposed: out^T[n, r] = W[n, :] · x[r, :], so the weights are the m16 side and
//    a group of up to 16 rows is one or two n8 tiles (not 64 rows of which 56 are padding);
//  - no shared-memory tiles: a lane decodes its A fragments straight from the bytes it loaded
//    (a byte's two values from a bf16x2 table, times the scale with one bf16 multiply). The k
//    order inside an MMA is free as long as A and B agree, so lane (g, i4) of MMA j takes
//    k = 16 i4 + 4 j + {0, 1} (fragment k 2 i4 + {0, 1}) and k = 16 i4 + 4 j + {2, 3} (fragment
//    k 2 i4 + 8 + {0, 1}): over a 64-k stage its weight bytes are 8 contiguous bytes a row (one
//    uint2, one MX block's scale) and its x values 16 contiguous floats a row (four float4);
//  - the CTA (64 columns, expert e) has 2 column groups of 32 (two m16 tiles a warp) × 4 K
//    slices of contiguous stages (a warp reads each of its rows in order); the slices' partial
//    sums meet in shared memory.
// x enters as two bf16 terms (hi, lo) as above; each stage's MMAs go into fresh registers that are
// then added to the running sum with rounded f32 adds. Groups of more than FEW_ROWS rows run one
// after another. Dispatched by `mxfp4-to-cuda-matvec` for static-T sites with 64 <= T·k <=
// MXFP4_FEW_ROWS_PER_EXPERT · E (lowering/kernel_geometry.py); same ABI and grid as the 64-row
// kernel. Variants measured and not kept (four m16 tiles a warp, 1 or 2 CTAs an SM; one m16 tile;
// the next stage's bytes loaded ahead in registers): all slower or within 3%.
#define FEW_ROWS 16  // rows of a group: two n8 tiles
#define FEW_COLS 64  // output columns per CTA
#define FEW_MT 2    // m16 tiles (16 columns each) a warp
#define FEW_MINB 2  // CTAs an SM: 128 registers, no spills
#define FEW_GROUPS (FEW_COLS / (16 * FEW_MT))      // column groups of a CTA
#define FEW_SLICES ((THREADS / 32) / FEW_GROUPS)  // K slices: warp w takes slice w / GROUPS

// A byte's two E2M1 values (low nibble first) times the block's scale, as bf16x2: one bf16 multiply
// (exact: E2M1 values have 2 significant bits and the scale is a power of two).
__device__ __forceinline__ unsigned decode_pair(const unsigned* lut2, unsigned byte, unsigned scale2) {
  const unsigned v = lut2[byte];
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                   *reinterpret_cast<const __nv_bfloat162*>(&scale2));
  return *reinterpret_cast<const unsigned*>(&r);
}

// bf16x2 of 2^(s-127) in both halves (s = 0: the subnormal 2^-127).
__device__ __forceinline__ unsigned scale_bf16x2(unsigned s) {
  const unsigned b = s ? s << 7 : 0x40u;
  return b | (b << 16);
}

extern "C" __global__ void __launch_bounds__(THREADS, FEW_MINB)
day0_mxfp4_moe_gemm_few(const float* __restrict__ x, const unsigned char* __restrict__ packed,
                        const unsigned char* __restrict__ scales, const long long* __restrict__ experts,
                        float* __restrict__ out, int K, int N, int k, int E, int R) {
  __shared__ float red[FEW_SLICES][FEW_COLS][FEW_ROWS + 1];  // each K slice's partial out^T [n][r]
  __shared__ unsigned lut2[256];  // a byte's two decoded values as bf16x2 (low nibble low)
  __shared__ unsigned match[SCAN / 32];
  __shared__ int rows[FEW_ROWS];
  __shared__ int s_state[2];
  const int e = blockIdx.y, n0 = blockIdx.x * FEW_COLS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cg = warp % FEW_GROUPS, ks = warp / FEW_GROUPS;  // column group, K slice
  const int g = lane >> 2, i4 = lane & 3;
  lut2[tid] = pack_bf16(e2m1(tid & 15u), e2m1(tid >> 4));  // 256 threads
  const int stages = (K + KSTAGE - 1) / KSTAGE;
  // This warp's K slice: stages [s_lo, s_hi), contiguous so that it reads each row's bytes in order.
  const int per = (stages + FEW_SLICES - 1) / FEW_SLICES;
  const int s_lo = min(ks * per, stages), s_hi = min(s_lo + per, stages);
  const size_t KB = (size_t)(K / 2), KS = (size_t)(K / 32);

  // This lane's weight rows: nb + 16 mt + 8 h (mt = m16 tile, h = fragment row half), bit
  // 2 mt + h of `valid` when < N; a stage's bytes at wbase + (16 mt + 8 h) KB + 32 s.
  const int c0 = 16 * FEW_MT * cg, nb = n0 + c0 + g;
  const unsigned char* wbase = packed + ((size_t)e * N + nb) * KB + 8 * i4;
  const unsigned char* sbase = scales + ((size_t)e * N + nb) * KS + (i4 >> 1);
  unsigned valid = 0;
#pragma unroll
  for (int q = 0; q < 2 * FEW_MT; ++q) valid |= (nb + 8 * q < N ? 1u : 0u) << q;
  // A stage's loads: w[mt][h] the 8 bytes, sc[h] the scale bytes of tiles mt (byte mt).
  uint2 wv[FEW_MT][2];
  unsigned sv[2];
  auto load_w = [&](int s, uint2 (&w)[FEW_MT][2], unsigned (&sc)[2]) {
    const bool k_ok = s < s_hi && s * KSTAGE + 16 * i4 < K;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h] = 0u;
#pragma unroll
      for (int mt = 0; mt < FEW_MT; ++mt) {
        const int q = 2 * mt + h;
        const bool ok = k_ok && (valid >> q) & 1u;
        w[mt][h] = ok ? __ldg(reinterpret_cast<const uint2*>(wbase + (size_t)(8 * q) * KB + (size_t)s * (KSTAGE / 2)))
                      : make_uint2(0u, 0u);
        sc[h] |= (ok ? (unsigned)sbase[(size_t)(8 * q) * KS + 2 * s] : 0u) << (8 * mt);
      }
    }
  };

  for (int pos = 0; pos < R;) {
    const int count = collect_rows<FEW_ROWS>(experts, e, E, R, pos, match, rows, s_state);
    if (count == 0) break;
    const int nt = (count + 7) >> 3;  // n8 tiles of rows in use (1 or 2), warp-uniform
    const float* xrow[2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int m = 8 * t + g;
      const int r = m < count ? rows[m] : -1;
      xrow[t] = r >= 0 ? x + (size_t)(r / k) * K + 16 * i4 : nullptr;  // null: a zero row
    }

    float acc[FEW_MT][2][4] = {};  // m16 tile, n8 tile, accumulator register
    for (int s = s_lo; s < s_hi; ++s) {
      load_w(s, wv, sv);
      const bool k_ok = s * KSTAGE + 16 * i4 < K;
      const float4* xs[2];
#pragma unroll
      for (int t = 0; t < 2; ++t)
        xs[t] = t < nt && xrow[t] && k_ok ? reinterpret_cast<const float4*>(xrow[t] + (size_t)s * KSTAGE) : nullptr;
      float part[FEW_MT][2][4] = {};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        unsigned bh[2][2], bl[2][2];  // n8 tile, b register: x's k 16 i4 + 4 j + {0, 1} | + {2, 3}
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const float4 v = xs[t] ? __ldg(xs[t] + j) : make_float4(0.f, 0.f, 0.f, 0.f);
          const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            bh[t][q] = pack_bf16(f[2 * q], f[2 * q + 1]);
            const float h0 = __uint_as_float(bh[t][q] << 16), h1 = __uint_as_float(bh[t][q] & 0xffff0000u);
            bl[t][q] = pack_bf16(f[2 * q] - h0, f[2 * q + 1] - h1);  // exact differences
          }
        }
#pragma unroll
        for (int mt = 0; mt < FEW_MT; ++mt) {
          // bytes 2 j and 2 j + 1 of the rows' uint2: k 16 i4 + 4 j + {0, 1} and + {2, 3}
          const unsigned w0 = j < 2 ? wv[mt][0].x : wv[mt][0].y, w1 = j < 2 ? wv[mt][1].x : wv[mt][1].y;
          const int sh = 16 * (j & 1);
          const unsigned s0 = scale_bf16x2((sv[0] >> (8 * mt)) & 0xffu);
          const unsigned s1 = scale_bf16x2((sv[1] >> (8 * mt)) & 0xffu);
          const unsigned a0 = decode_pair(lut2, (w0 >> sh) & 0xffu, s0);
          const unsigned a2 = decode_pair(lut2, (w0 >> (sh + 8)) & 0xffu, s0);
          const unsigned a1 = decode_pair(lut2, (w1 >> sh) & 0xffu, s1);
          const unsigned a3 = decode_pair(lut2, (w1 >> (sh + 8)) & 0xffu, s1);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            if (t < nt) {
              mma_bf16(part[mt][t], a0, a1, a2, a3, bh[t][0], bh[t][1]);
              mma_bf16(part[mt][t], a0, a1, a2, a3, bl[t][0], bl[t][1]);
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < FEW_MT; ++mt)
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mt][t][i] += part[mt][t][i];
    }

    // The slices' partials out^T[n][r] (accumulator: n = c0 + 16 mt + g + 8 (i / 2), r = 8 t + 2 i4 +
    // i % 2), then their sum for the group's rows, written as out[row][n0 + n].
#pragma unroll
    for (int mt = 0; mt < FEW_MT; ++mt)
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          red[ks][c0 + 16 * mt + g + 8 * (i >> 1)][8 * t + 2 * i4 + (i & 1)] = acc[mt][t][i];
    __syncthreads();
    for (int idx = tid; idx < FEW_COLS * count; idx += THREADS) {
      const int r = idx / FEW_COLS, n = idx % FEW_COLS;
      if (n0 + n < N) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < FEW_SLICES; ++w) sum += red[w][n][r];
        const int row = rows[r];
        out[(size_t)(row < 0 ? ~row : row) * N + n0 + n] = row < 0 ? 0.0f : sum;
      }
    }
    __syncthreads();  // red and rows are rewritten by the next group
  }
}
