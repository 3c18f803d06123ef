// Exact top-k of float rows by radix select, for IREE's CUDA target (sm_90).
//
// Dispatched by the `topk-to-radix-select` pass as IREE external dispatches; the kernels follow
// IREE's CUDA ABI: bindings in dispatch order (read-only operands, read-write tied operands,
// then new results), then the i32 push constants. Row t of x is x[t*n .. t*n+n).
//
// Selection, per row: the k elements first under (score descending, position ascending), i.e.
// torch.topk's set with ties broken toward the lower position. NaN ranks above +inf (as in
// torch), -0.0 equals +0.0. The output order is NOT sorted by score: positions whose key is
// above the threshold come first in position order, then the threshold-bin picks in position
// order. It is deterministic. A row shorter than k fills the missing slots with (INT32_MAX, -inf).
//
// Steps (each bandwidth-bound; segments of SEG elements give a decode row of 1M scores 128 CTAs):
//   hist     grid (T, G): per segment, a 2048-bin histogram of the key's top 11 bits, stored as a
//            suffix count cum[t][g][b] = #elements of the segment with bin >= b; the segment's
//            counts are added into total[t][b] (zero-initialised by the caller).
//   collect  grid (T, G): every CTA finds the threshold bin b* of its row from total[t] (the bin
//            where the count from the top reaches k), its output offsets from the cum entries of
//            the earlier segments, and writes, in position order, positions with bin > b* into
//            out_idx/out_val and positions with bin == b* into cand[t][..]. CTA g=0 writes header.
//   finish   grid (T): radix select over the candidates on the remaining 21 bits (11 + 10), then
//            writes the picks (ties: lowest positions) after the bin > b* ones.

#define THREADS 256
#define WARPS (THREADS / 32)
#define SEG 8192
#define BINS 2048  // 11 bits
#define ITEMS 4    // consecutive elements per thread in one collect/finish chunk
#define CHUNK (THREADS * ITEMS)
#define EMPTY_INDEX 0x7fffffff
#define SMALL_N 8192  // keys a CTA keeps in shared memory (small rows; finish's candidates)

// Order-preserving map of a float to an unsigned key (bigger float -> bigger key).
__device__ __forceinline__ unsigned order_key(float f) {
  unsigned u = __float_as_uint(f);
  unsigned mag = u & 0x7fffffffu;
  if (mag == 0) u = 0;                         // -0.0 == +0.0
  else if (mag > 0x7f800000u) u = 0x7fc00000u;  // every NaN ranks above +inf
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// h[bin] += 1 for every lane with bin < limit; lanes with equal bins add once, together (masked
// rows put thousands of equal keys in one bin). All 32 lanes of the warp must call it.
__device__ __forceinline__ void warp_count(unsigned* h, unsigned bin, unsigned limit) {
  unsigned peers = __match_any_sync(0xffffffffu, bin);
  if (bin < limit && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&h[bin], __popc(peers));
}

// Inclusive suffix sums of v over the threads of the block (thread i gets sum of v[j], j >= i).
__device__ __forceinline__ unsigned block_suffix_sum(unsigned v, unsigned* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned s = v;
  for (int d = 1; d < 32; d <<= 1) {
    unsigned o = __shfl_down_sync(0xffffffffu, s, d);
    if (lane + d < 32) s += o;
  }
  if (lane == 0) warp_sums[warp] = s;
  __syncthreads();
  unsigned above = 0;
  for (int w = warp + 1; w < WARPS; ++w) above += warp_sums[w];
  __syncthreads();  // warp_sums may be reused by the caller
  return s + above;
}

// Exclusive prefix sums of v over the threads of the block; *total gets the block's sum.
__device__ __forceinline__ unsigned block_prefix_sum(unsigned v, unsigned* warp_sums, unsigned* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned s = v;
  for (int d = 1; d < 32; d <<= 1) {
    unsigned o = __shfl_up_sync(0xffffffffu, s, d);
    if (lane >= d) s += o;
  }
  if (lane == 31) warp_sums[warp] = s;
  __syncthreads();
  unsigned before = 0, all = 0;
  for (int w = 0; w < WARPS; ++w) {
    unsigned ws = warp_sums[w];
    if (w < warp) before += ws;
    all += ws;
  }
  __syncthreads();
  *total = all;
  return before + s - v;
}

// The bin b where the count from the top reaches `need`: above(b) < need <= above(b) + h[b],
// above(b) = sum of h[b'] for b' > b. If the whole histogram holds fewer than need, b = 0.
// h: `bins` counters in shared memory (bins = THREADS * per, per <= 8). Result in out[0..1].
__device__ void find_bin(const unsigned* h, int bins, unsigned need, unsigned* warp_sums,
                         unsigned* out) {
  const int per = bins / THREADS;
  const int first = threadIdx.x * per;
  unsigned mine = 0;
  for (int j = 0; j < per; ++j) mine += h[first + j];
  const unsigned incl = block_suffix_sum(mine, warp_sums);
  unsigned acc = incl - mine;  // elements in bins above this thread's range
  if (acc < need && need <= incl) {
    for (int b = first + per - 1; b >= first; --b) {
      if (acc + h[b] >= need) { out[0] = b; out[1] = acc; break; }
      acc += h[b];
    }
  }
  if (threadIdx.x == 0 && incl < need) { out[0] = 0; out[1] = incl - h[0]; }  // row shorter than k
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// hist: grid (T, G). cum: [T, G, BINS] suffix counts; total: [T, BINS] accumulated (tied, RW).
extern "C" __global__ void __launch_bounds__(THREADS)
day0_topk_hist(const float* __restrict__ x, unsigned* __restrict__ total,
               unsigned* __restrict__ cum, int n, int segs) {
  __shared__ unsigned h[BINS];
  __shared__ unsigned warp_sums[WARPS];
  const int t = blockIdx.x, g = blockIdx.y;
  for (int b = threadIdx.x; b < BINS; b += THREADS) h[b] = 0;
  __syncthreads();
  const float* row = x + (size_t)t * n;
  const int begin = g * SEG, end = min(begin + SEG, n);
  for (int base = begin; base < end; base += THREADS * ITEMS) {
    float v[ITEMS];
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      int i = base + j * THREADS + threadIdx.x;
      v[j] = i < end ? row[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      int i = base + j * THREADS + threadIdx.x;
      warp_count(h, i < end ? (order_key(v[j]) >> 21) : BINS, BINS);
    }
  }
  __syncthreads();
  const int per = BINS / THREADS, first = threadIdx.x * per;
  unsigned mine = 0;
  for (int j = 0; j < per; ++j) mine += h[first + j];
  unsigned acc = block_suffix_sum(mine, warp_sums) - mine;
  unsigned* out = cum + ((size_t)t * segs + g) * BINS;
  unsigned* tot = total + (size_t)t * BINS;
  for (int b = first + per - 1; b >= first; --b) {
    acc += h[b];
    out[b] = acc;
    if (h[b]) atomicAdd(&tot[b], h[b]);
  }
}

// ---------------------------------------------------------------------------------------------
// collect: grid (T, G). header: [T, 4] = (b*, above, candidates, 0), written by g = 0.
// out_idx/out_val: [T, k] (slots [0, above) written here); cand: [T, n] (slots [0, candidates)).
extern "C" __global__ void __launch_bounds__(THREADS)
day0_topk_collect(const float* __restrict__ x, const unsigned* __restrict__ total,
                  const unsigned* __restrict__ cum, int* __restrict__ header,
                  int* __restrict__ out_idx, float* __restrict__ out_val, int* __restrict__ cand,
                  int n, int segs, int k) {
  __shared__ unsigned h[BINS];
  __shared__ unsigned warp_sums[WARPS];
  __shared__ unsigned found[2];
  const int t = blockIdx.x, g = blockIdx.y;
  const unsigned* tot = total + (size_t)t * BINS;
  for (int b = threadIdx.x; b < BINS; b += THREADS) h[b] = tot[b];
  __syncthreads();
  find_bin(h, BINS, (unsigned)k, warp_sums, found);
  const unsigned bstar = found[0], above = found[1];
  if (g == 0 && threadIdx.x == 0) {
    int* hd = header + (size_t)t * 4;
    hd[0] = (int)bstar; hd[1] = (int)above; hd[2] = (int)h[bstar]; hd[3] = 0;
  }
  // Offsets of this segment's outputs: counts of the earlier segments (suffix counts at b*, b*+1).
  unsigned gt_before = 0, eq_before = 0;
  for (int s = threadIdx.x; s < g; s += THREADS) {
    const unsigned* c = cum + ((size_t)t * segs + s) * BINS;
    unsigned ge = c[bstar], gt = bstar + 1 < BINS ? c[bstar + 1] : 0u;
    gt_before += gt; eq_before += ge - gt;
  }
  gt_before = block_suffix_sum(gt_before, warp_sums);  // thread 0 holds the block's sum
  eq_before = block_suffix_sum(eq_before, warp_sums);
  if (threadIdx.x == 0) { found[0] = gt_before; found[1] = eq_before; }
  __syncthreads();
  unsigned gt_off = found[0], eq_off = found[1];

  const float* row = x + (size_t)t * n;
  int* oi = out_idx + (size_t)t * k;
  float* ov = out_val + (size_t)t * k;
  int* cd = cand + (size_t)t * n;
  const int begin = g * SEG, end = min(begin + SEG, n);
  for (int base = begin; base < end; base += CHUNK) {
    const int i0 = base + threadIdx.x * ITEMS;  // this thread's ITEMS consecutive positions
    float v[ITEMS];
    unsigned bin[ITEMS];
    unsigned packed = 0;  // gt count | eq count << 16
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      int i = i0 + j;
      v[j] = i < end ? row[i] : 0.0f;
      bin[j] = i < end ? (order_key(v[j]) >> 21) : 0xffffffffu;
      if (i < end) packed += bin[j] > bstar ? 1u : (bin[j] == bstar ? 0x10000u : 0u);
    }
    unsigned chunk_total;
    unsigned pos = block_prefix_sum(packed, warp_sums, &chunk_total);
    unsigned gp = gt_off + (pos & 0xffffu), ep = eq_off + (pos >> 16);
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      int i = i0 + j;
      if (i >= end) break;
      if (bin[j] > bstar) { oi[gp] = i; ov[gp] = v[j]; ++gp; }
      else if (bin[j] == bstar) { cd[ep++] = i; }
    }
    gt_off += chunk_total & 0xffffu;
    eq_off += chunk_total >> 16;
  }
}

// ---------------------------------------------------------------------------------------------
// finish: grid (T). Picks need = k - above of the candidates; out_idx/out_val tied (RW).
extern "C" __global__ void __launch_bounds__(THREADS)
day0_topk_finish(const float* __restrict__ x, const int* __restrict__ header,
                 const int* __restrict__ cand, int* __restrict__ out_idx,
                 float* __restrict__ out_val, int n, int k) {
  __shared__ unsigned h[BINS];
  __shared__ unsigned warp_sums[WARPS];
  __shared__ unsigned found[2];
  __shared__ unsigned ckeys[SMALL_N];  // the candidates' keys when they fit (the usual case)
  const int t = blockIdx.x;
  const int* hd = header + (size_t)t * 4;
  const unsigned above = (unsigned)hd[1], count = (unsigned)hd[2];
  const unsigned need = (unsigned)k - above;
  const float* row = x + (size_t)t * n;
  const int* cd = cand + (size_t)t * n;
  int* oi = out_idx + (size_t)t * k;
  float* ov = out_val + (size_t)t * k;

  // One gather of the candidates' keys; every later pass reads them from shared memory.
  const bool staged = count <= SMALL_N;
  if (staged)
    for (unsigned c = threadIdx.x; c < count; c += THREADS) ckeys[c] = order_key(row[cd[c]]);
  __syncthreads();
#define CKEY(c) (staged ? ckeys[c] : order_key(row[cd[c]]))
  // Threshold on the low 21 bits: (hi11 << 10 | lo10) = tlow; keys above it are all taken.
  unsigned tlow = 0, take_eq = 0xffffffffu;  // count <= need: every candidate is taken
  if (count > need) {
    for (int b = threadIdx.x; b < BINS; b += THREADS) h[b] = 0;
    __syncthreads();
    for (unsigned base = 0; base < count; base += THREADS) {
      unsigned c = base + threadIdx.x;
      warp_count(h, c < count ? (CKEY(c) >> 10) & 0x7ffu : BINS, BINS);
    }
    __syncthreads();
    find_bin(h, BINS, need, warp_sums, found);
    const unsigned b2 = found[0], above2 = found[1];
    __syncthreads();
    for (int b = threadIdx.x; b < 1024; b += THREADS) h[b] = 0;
    __syncthreads();
    for (unsigned base = 0; base < count; base += THREADS) {
      unsigned c = base + threadIdx.x, key = c < count ? CKEY(c) : 0u;
      warp_count(h, c < count && ((key >> 10) & 0x7ffu) == b2 ? key & 0x3ffu : BINS, 1024);
    }
    __syncthreads();
    find_bin(h, 1024, need - above2, warp_sums, found);
    tlow = (b2 << 10) | found[0];
    take_eq = need - above2 - found[1];
  }
  // Ordered pass over the candidates (they are in position order).
  unsigned gt_run = 0, eq_run = 0;
  for (unsigned base = 0; base < count; base += CHUNK) {
    const unsigned c0 = base + threadIdx.x * ITEMS;
    int idx[ITEMS];
    unsigned low[ITEMS];
    unsigned packed = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      unsigned c = c0 + j;
      idx[j] = c < count ? cd[c] : 0;
      low[j] = c < count ? CKEY(c) & 0x1fffffu : 0u;
      if (c < count) packed += low[j] > tlow ? 1u : (low[j] == tlow ? 0x10000u : 0u);
    }
    unsigned chunk_total;
    unsigned pos = block_prefix_sum(packed, warp_sums, &chunk_total);
    unsigned gp = gt_run + (pos & 0xffffu), ep = eq_run + (pos >> 16);
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      unsigned c = c0 + j;
      if (c >= count) break;
      bool gt = low[j] > tlow, eq = low[j] == tlow;
      if (gt || (eq && ep < take_eq)) {
        unsigned slot = above + gp + min(ep, take_eq);
        oi[slot] = idx[j]; ov[slot] = row[idx[j]];
      }
      if (gt) ++gp;
      if (eq) ++ep;
    }
    gt_run += chunk_total & 0xffffu;
    eq_run += chunk_total >> 16;
  }
#undef CKEY
  // Slots past the row's length (n < k) stay empty.
  const unsigned filled = above + min(count, need);
  for (unsigned s = filled + threadIdx.x; s < (unsigned)k; s += THREADS) {
    oi[s] = EMPTY_INDEX; ov[s] = __int_as_float(0xff800000);
  }
}

// ---------------------------------------------------------------------------------------------
// small: grid (T), rows of any n. The whole selection in one CTA: three radix passes (11 + 11 +
// 10 bits) find the threshold key, then one ordered pass writes the picks in position order (ties
// at the threshold: lowest positions). Rows of n <= SMALL_N keep their keys in shared memory;
// longer ones read the row again on each pass (from L2: the pass uses this form up to 16K).

extern "C" __global__ void __launch_bounds__(THREADS)
day0_topk_small(const float* __restrict__ x, int* __restrict__ out_idx, float* __restrict__ out_val,
                int n, int k) {
  __shared__ unsigned keys[SMALL_N];
  __shared__ unsigned h[BINS];
  __shared__ unsigned warp_sums[WARPS];
  __shared__ unsigned found[2];
  const int t = blockIdx.x;
  const float* row = x + (size_t)t * n;
  int* oi = out_idx + (size_t)t * k;
  float* ov = out_val + (size_t)t * k;
  const bool staged = n <= SMALL_N;
  if (staged)
    for (int i = threadIdx.x; i < n; i += THREADS) keys[i] = order_key(row[i]);
#define KEY(i) (staged ? keys[i] : order_key(row[i]))
  unsigned need = (unsigned)k, prefix = 0, count_gt = 0;
  // pass p looks at the keys whose higher digits equal `prefix`
  const int shift[3] = {21, 10, 0}, width[3] = {11, 11, 10};
  for (int p = 0; p < 3; ++p) {
    const unsigned bins = 1u << width[p], mask = bins - 1;
    for (unsigned b = threadIdx.x; b < BINS; b += THREADS) h[b] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += THREADS) {
      const int i = base + threadIdx.x;
      const unsigned key = i < n ? KEY(i) : 0u;
      const bool in = i < n && (p == 0 || (key >> (shift[p] + width[p])) == prefix);
      warp_count(h, in ? (key >> shift[p]) & mask : BINS, bins);
    }
    __syncthreads();
    find_bin(h, (int)bins, need, warp_sums, found);
    prefix = (prefix << width[p]) | found[0];
    count_gt += found[1];
    need -= found[1];
    __syncthreads();
  }
  const unsigned tkey = prefix;  // the threshold key; `need` of the keys equal to it are taken
  unsigned run = 0, eq_run = 0;
  for (int base = 0; base < n; base += CHUNK) {
    const int i0 = base + threadIdx.x * ITEMS;
    unsigned packed = 0, key[ITEMS];
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const int i = i0 + j;
      key[j] = i < n ? KEY(i) : 0u;
      if (i < n) packed += key[j] > tkey ? 1u : (key[j] == tkey ? 0x10000u : 0u);
    }
    unsigned chunk_total;
    const unsigned pos = block_prefix_sum(packed, warp_sums, &chunk_total);
    unsigned gp = run + (pos & 0xffffu), ep = eq_run + (pos >> 16);
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const int i = i0 + j;
      if (i >= n) break;
      const bool gt = key[j] > tkey, eq = key[j] == tkey;
      if (gt || (eq && ep < need)) {
        const unsigned slot = gp + min(ep, need);
        oi[slot] = i; ov[slot] = row[i];
      }
      if (gt) ++gp;
      if (eq) ++ep;
    }
    run += chunk_total & 0xffffu;
    eq_run += chunk_total >> 16;
  }
#undef KEY
  const unsigned filled = min((unsigned)n, (unsigned)k);  // n < k: the rest stay empty
  for (unsigned s = filled + threadIdx.x; s < (unsigned)k; s += THREADS) {
    oi[s] = EMPTY_INDEX; ov[s] = __int_as_float(0xff800000);
  }
}
