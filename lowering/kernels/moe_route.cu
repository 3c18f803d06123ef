// DeepSeek's group-limited sigmoid routing (day0::moe_route, frontend/ops.py) in one kernel, for
// IREE's CUDA target (sm_90). IREE made the same router about eight dispatches a layer (three of
// them top-k's); a decode step is bound by launches (docs/perf.md, "The Engine at real size").
//
// Dispatched by the `moe-route-to-cuda-kernel` pass as an IREE external dispatch; IREE's CUDA ABI:
// bindings in dispatch order (logits, bias, then the results weights, experts), then the i32 push
// constants (S, E, groups, topk_group, top_k, normalize, scaling bits).
//
// One warp a row (token), WARPS rows a CTA, grid ceil(S / WARPS):
//   scores  = sigmoid(logits[s]); biased = scores + bias             (biased kept in shared memory)
//   group g = experts [g·E/G, (g+1)·E/G): its score = the sum of its two largest biased scores
//   the topk_group groups of the largest score, then the top_k experts of the largest biased score
//   among the chosen groups' experts (the others count as -inf, as in the reference)
//   weights = scores at the chosen experts, / (their sum + 1e-20) if normalize, × scaling
// Every ranking is (value descending, index ascending): ties go to the lower index, NaN ranks
// above +inf (as torch.topk). The k choices are written in the order chosen (largest first).
// Limits (checked by the pass, lowering/kernel_geometry.py): E <= MAX_E, groups <= 32 dividing E
// with at least two experts a group, topk_group <= groups, top_k <= min(32, E).

#define THREADS 256
#define WARPS (THREADS / 32)
#define MAX_E 1024
#define FULL 0xffffffffu
#define NONE 0x7fffffff  // the index of "no candidate"; its key is 0, below every float's key

// Order-preserving map of a float to an unsigned key (bigger float -> bigger key, NaN biggest,
// -0.0 == +0.0); no float maps to 0.
__device__ __forceinline__ unsigned order_key(float f) {
  unsigned u = __float_as_uint(f);
  unsigned mag = u & 0x7fffffffu;
  if (mag == 0) u = 0;
  else if (mag > 0x7f800000u) u = 0x7fc00000u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (key, index) pairs: a is better than b when its key is larger, or equal with a lower index.
__device__ __forceinline__ bool better(unsigned ka, int ia, unsigned kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// The best (key, index) pair over the warp; every lane gets it.
__device__ __forceinline__ void warp_best(unsigned& key, int& index) {
  for (int d = 16; d > 0; d >>= 1) {
    unsigned k = __shfl_xor_sync(FULL, key, d);
    int i = __shfl_xor_sync(FULL, index, d);
    if (better(k, i, key, index)) key = k, index = i;
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

extern "C" __global__ void __launch_bounds__(THREADS)
    day0_moe_route(const float* __restrict__ logits, const float* __restrict__ bias, float* __restrict__ weights,
                   long long* __restrict__ experts, int S, int E, int G, int topk_group, int K, int normalize,
                   int scaling_bits) {
  __shared__ unsigned keys[WARPS][MAX_E];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * WARPS + warp;
  if (row >= S) return;  // the whole warp: no CTA-wide barrier below
  const float* x = logits + (long long)row * E;
  unsigned* key = keys[warp];
  for (int e = lane; e < E; e += 32) key[e] = order_key(sigmoid(x[e]) + bias[e]);
  __syncwarp();

  // Group scores: lane g sums its group's two best biased scores.
  const int per_group = E / G;
  unsigned group_key = 0;
  int group_index = NONE;
  if (lane < G) {
    unsigned k1 = 0, k2 = 0;
    int i1 = NONE, i2 = NONE;
    for (int e = lane * per_group; e < (lane + 1) * per_group; ++e) {
      unsigned k = key[e];
      if (better(k, e, k1, i1)) k2 = k1, i2 = i1, k1 = k, i1 = e;
      else if (better(k, e, k2, i2)) k2 = k, i2 = e;
    }
    const float b1 = sigmoid(x[i1]) + bias[i1], b2 = sigmoid(x[i2]) + bias[i2];
    group_key = order_key(b1 + b2), group_index = lane;
  }
  // The topk_group best groups, one a round; chosen bit g = group g.
  unsigned chosen = 0;
  for (int r = 0; r < topk_group; ++r) {
    unsigned k = group_key;
    int i = group_index;
    warp_best(k, i);
    chosen |= 1u << i;
    if (lane == i) group_key = 0, group_index = NONE;
  }

  // The top_k experts of the chosen groups; lane j keeps the j-th choice.
  const unsigned masked = order_key(-INFINITY);
  unsigned taken = 0;  // bit t: expert lane + 32·t is chosen
  int mine = NONE;
  for (int r = 0; r < K; ++r) {
    unsigned best_key = 0;
    int best = NONE;
    for (int t = 0, e = lane; e < E; ++t, e += 32) {
      if (taken >> t & 1u) continue;
      const unsigned k = (chosen >> (e / per_group) & 1u) ? key[e] : masked;
      if (better(k, e, best_key, best)) best_key = k, best = e;
    }
    warp_best(best_key, best);
    if ((best & 31) == lane) taken |= 1u << (best >> 5);
    if (lane == r) mine = best;
  }

  float w = lane < K ? sigmoid(x[mine]) : 0.0f;
  float sum = w;
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(FULL, sum, d);
  if (lane < K) {
    if (normalize) w = w / (sum + 1e-20f);
    weights[(long long)row * K + lane] = w * __int_as_float(scaling_bits);
    experts[(long long)row * K + lane] = mine;
  }
}
