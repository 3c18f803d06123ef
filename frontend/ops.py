"""day0's custom ops: torch.library definitions, fake kernels and eager reference kernels.

Each op survives torch.export and torch-mlir's raw import as `torch.operator "torch.day0.<name>"`;
a pass in `day0.passes` expands it before IREE sees the module. The eager kernels here are the
semantic reference those passes are tested against.
"""

import math
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.library.custom_op("day0::dsa_attention", mutates_args=())
def dsa_attention(q: Tensor, kv: Tensor, indices: Tensor, scale: float, value_dim: int) -> Tensor:
    """Sparse MQA of every query over the KV rows the indexer selected.

    q:       [S, H, D]  f32   queries (absorbed MLA form: latent part then rope part)
    kv:      [T, D]     f32   one shared key row per cached position; values are kv[:, :value_dim]
    indices: [S, K]     i64   selected rows per query, -1 marks an empty slot
    returns: [S, H, value_dim] f32, softmax(scale · q·kᵀ) over the selected rows · v.
    A query whose slots are all empty gets zeros. q and kv may both be bf16 instead: the math
    stays f32 on the widened (exact) q and rows, and the result is f32 all the same (no rounding
    to bf16: the result is small, and rounding it would only cost accuracy).
    """
    valid = indices >= 0  # [S, K]
    rows = kv[indices.clamp(min=0)].float()  # [S, K, D]
    scores = torch.einsum("shd,skd->shk", q.float(), rows) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-empty rows: 0 instead of NaN
    return torch.einsum("shk,skv->shv", probs, rows[..., :value_dim])


@dsa_attention.register_fake
def _(q: Tensor, kv: Tensor, indices: Tensor, scale: float, value_dim: int) -> Tensor:
    torch._check(q.dim() == 3 and kv.dim() == 2 and indices.dim() == 2)
    return q.new_empty(q.shape[0], q.shape[1], value_dim, dtype=torch.float32)


# Ops a target may keep whole (its pipeline has a kernel for them). Models call the Python
# function of the same name; it emits the custom op only inside `keeping({...})` (set by export
# for the target), and otherwise the op's reference body, so other targets trace plain aten ops.
# (A decomposition-table entry for a custom op would change later exports in the process too.)
DECOMPOSABLE = ("indexer_scores", "moe_route", "materialize", "vision_attention", "mxfp4_moe_swiglu")
_KEPT: ContextVar[frozenset] = ContextVar("day0_kept_ops", default=frozenset())


@contextmanager
def keeping(names):
    """Within the block, calls of the DECOMPOSABLE ops in `names` emit the day0 custom op."""
    unknown = set(names) - set(DECOMPOSABLE)
    if unknown:
        raise ValueError(f"cannot keep {sorted(unknown)}: decomposable day0 ops are {sorted(DECOMPOSABLE)}")
    token = _KEPT.set(frozenset(names))
    try:
        yield
    finally:
        _KEPT.reset(token)


# the head dims `vision_attention` is kept at (day0::vision_attention): those of the CUDA kernel's
# entries, lowering/kernel_geometry.VISION_HEAD_DIMS (tests/test_export_kept_ops.py keeps them equal;
# the frontend imports nothing from lowering/)
VISION_HEAD_DIMS = (16, 32, 64, 128)
EMPTY_SCORE = -1e30  # indexer_scores' score of an empty slot (a negative row)


def indexer_scores(
    q: Tensor, keys: Tensor, weights: Tensor, scale: float, rows: Tensor | None = None, last: Tensor | None = None
) -> Tensor:
    """The DSA lightning indexer's scores: out[s, t] = Σ_h weights[s, h] · relu(scale · q[s, h]·k[s, t]).

    q: [S, H, D] f32; weights: [S, H] f32 -> [S, T] f32. Keys (any float dtype, widened):
      rows None   keys [T, D], the same T keys for every query: k[s, t] = keys[t];
      rows [S, T] int64, one key range per query (a batched decode step over a paged pool:
                  models/paging.py): k[s, t] = keys[rows[s, t]], keys the whole pool [R, D];
                  a negative row is an empty slot, out[s, t] = EMPTY_SCORE (the CUDA kernel
                  reads no key there, and skips the products of a tile of empty slots);
      rows [T] and last [S], int64: one key range for every query, causal (a prompt chunk):
                  k[s, t] = keys[rows[t]] of a cache or pool [R, D], and out[s, t] = EMPTY_SCORE
                  where rows[t] < 0 or t > last[s] (slots past the query's position). The masked,
                  padded scores a top-k takes come out of the op itself: no [S, T] mask or copy.
    A target that keeps `indexer_scores` gets `day0::indexer_scores`, `day0::indexer_scores_rows`
    or `day0::indexer_scores_causal` (its kernels read the rows in place, no gathered copy).
    """
    kept = "indexer_scores" in _KEPT.get()
    if last is not None:
        if kept:
            return torch.ops.day0.indexer_scores_causal(q, keys, rows, last, weights, scale)
        return indexer_scores_causal_reference(q, keys, rows, last, weights, scale)
    if rows is not None:
        if kept:
            return torch.ops.day0.indexer_scores_rows(q, keys, rows, weights, scale)
        return indexer_scores_rows_reference(q, keys, rows, weights, scale)
    if kept:
        return torch.ops.day0.indexer_scores(q, keys, weights, scale)
    return indexer_scores_reference(q, keys, weights, scale)


def indexer_scores_reference(q: Tensor, keys: Tensor, weights: Tensor, scale: float) -> Tensor:
    keys = keys if keys.dtype == torch.float32 else keys.float()
    scores = torch.relu(torch.einsum("shd,td->sht", q, keys) * scale)  # [S, H, T]
    return torch.einsum("sh,sht->st", weights, scores)


def indexer_scores_rows_reference(q: Tensor, keys: Tensor, rows: Tensor, weights: Tensor, scale: float) -> Tensor:
    flat = rows.reshape(-1).clamp(min=0)
    gathered = keys.index_select(0, flat).view(*rows.shape, keys.shape[1]).float()  # [S, T, D]
    dots = torch.einsum("shd,std->sht", q, gathered) * scale
    return torch.where(rows < 0, EMPTY_SCORE, torch.einsum("sh,sht->st", weights, torch.relu(dots)))


def indexer_scores_causal_reference(
    q: Tensor, keys: Tensor, rows: Tensor, last: Tensor, weights: Tensor, scale: float
) -> Tensor:
    scores = indexer_scores_reference(q, keys.index_select(0, rows.clamp(min=0)), weights, scale)  # [S, T]
    slot = torch.arange(rows.shape[0], dtype=torch.int64)
    return torch.where((rows[None, :] < 0) | (slot[None, :] > last[:, None]), EMPTY_SCORE, scores)


@torch.library.custom_op("day0::indexer_scores", mutates_args=())
def _indexer_scores_op(q: Tensor, keys: Tensor, weights: Tensor, scale: float) -> Tensor:
    return indexer_scores_reference(q, keys, weights, scale)


@_indexer_scores_op.register_fake
def _(q: Tensor, keys: Tensor, weights: Tensor, scale: float) -> Tensor:
    torch._check(q.dim() == 3 and keys.dim() == 2 and weights.dim() == 2)
    return q.new_empty(q.shape[0], keys.shape[0])


@torch.library.custom_op("day0::indexer_scores_rows", mutates_args=())
def _indexer_scores_rows_op(q: Tensor, keys: Tensor, rows: Tensor, weights: Tensor, scale: float) -> Tensor:
    return indexer_scores_rows_reference(q, keys, rows, weights, scale)


@_indexer_scores_rows_op.register_fake
def _(q: Tensor, keys: Tensor, rows: Tensor, weights: Tensor, scale: float) -> Tensor:
    torch._check(q.dim() == 3 and keys.dim() == 2 and rows.dim() == 2 and weights.dim() == 2)
    return q.new_empty(rows.shape[0], rows.shape[1])


@torch.library.custom_op("day0::indexer_scores_causal", mutates_args=())
def _indexer_scores_causal_op(
    q: Tensor, keys: Tensor, rows: Tensor, last: Tensor, weights: Tensor, scale: float
) -> Tensor:
    return indexer_scores_causal_reference(q, keys, rows, last, weights, scale)


@_indexer_scores_causal_op.register_fake
def _(q: Tensor, keys: Tensor, rows: Tensor, last: Tensor, weights: Tensor, scale: float) -> Tensor:
    torch._check(q.dim() == 3 and keys.dim() == 2 and rows.dim() == 1 and last.dim() == 1 and weights.dim() == 2)
    return q.new_empty(q.shape[0], rows.shape[0])


def vision_attention(q: Tensor, k: Tensor, v: Tensor, segments: Tensor, scale: float) -> Tensor:
    """Dense attention within segments (the vision tower's): q, k, v [P, H, D] f32, segments [P]
    i64, non-decreasing (each segment one run of patches: runtime/images.py) -> [P, H, D] f32,
    out[s, h] = softmax_t(scale · q[s, h]·k[t, h]) · v[t, h] over the t of s's segment.
    A target that keeps `vision_attention` gets `day0::vision_attention` where its kernel takes
    the head dim (VISION_HEAD_DIMS); elsewhere the reference body, one masked
    attention over all P patches (P² scores)."""
    if "vision_attention" in _KEPT.get() and q.shape[-1] in VISION_HEAD_DIMS:
        return torch.ops.day0.vision_attention(q, k, v, segments, scale)
    return vision_attention_reference(q, k, v, segments, scale)


def vision_attention_reference(q: Tensor, k: Tensor, v: Tensor, segments: Tensor, scale: float) -> Tensor:
    same = segments[:, None] == segments[None, :]  # [P, P]
    scores = torch.einsum("shd,thd->hst", q, k) * scale  # [H, P, P]
    probs = torch.softmax(scores.masked_fill(~same, float("-inf")), dim=-1)
    return torch.einsum("hst,thd->shd", probs, v)


@torch.library.custom_op("day0::vision_attention", mutates_args=())
def _vision_attention_op(q: Tensor, k: Tensor, v: Tensor, segments: Tensor, scale: float) -> Tensor:
    return vision_attention_reference(q, k, v, segments, scale)


@_vision_attention_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, segments: Tensor, scale: float) -> Tensor:
    torch._check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3 and segments.dim() == 1)
    return q.new_empty(q.shape)


# --- MXFP4 (OCP microscaling: E2M1 codes two per byte, low nibble = even element, one E8M0 scale
# byte per 32 consecutive elements along K; value = E2M1[code] · 2^(scale − 127)).

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_dequantize(packed: Tensor, scales: Tensor) -> Tensor:
    """packed u8 [..., N, K/2], scales u8 [..., N, K/32] -> f32 [..., N, K] (exact)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2).long()  # [..., N, K]
    values = lut[codes]
    exponent = scales.to(torch.int32) - 127  # [..., N, K/32]
    factor = torch.exp2(exponent.to(torch.float32)).repeat_interleave(32, dim=-1)
    return values * factor


@torch.library.custom_op("day0::mxfp4_linear", mutates_args=())
def mxfp4_linear(x: Tensor, packed: Tensor, scales: Tensor) -> Tensor:
    """x f32 [M, K] @ Wᵀ with W MXFP4: packed u8 [N, K/2], scales u8 [N, K/32] -> f32 [M, N]."""
    return x @ mxfp4_dequantize(packed, scales).T


@mxfp4_linear.register_fake
def _(x: Tensor, packed: Tensor, scales: Tensor) -> Tensor:
    torch._check(x.dim() == 2 and packed.dim() == 2 and scales.dim() == 2)
    return x.new_empty(x.shape[0], packed.shape[0])


@torch.library.custom_op("day0::mxfp4_moe", mutates_args=())
def mxfp4_moe(x: Tensor, packed: Tensor, scales: Tensor, experts: Tensor) -> Tensor:
    """Each token through each of its chosen experts' MXFP4 matrices.

    x f32 [T, K]; packed u8 [E, N, K/2]; scales u8 [E, N, K/32]; experts i64 [T, k]
    returns f32 [T, k, N] with out[t, j] = W[experts[t, j]] · x[t].
    Eagerly each used expert is dequantized once and applied to all its (token, slot) rows, so
    a long prompt costs E dequantized matrices, not T·k of them.
    """
    out = x.new_zeros(x.shape[0], experts.shape[1], packed.shape[1])
    for e in torch.unique(experts).tolist():
        t, j = (experts == e).nonzero(as_tuple=True)
        out[t, j] = x[t] @ mxfp4_dequantize(packed[e], scales[e]).T
    return out


@mxfp4_moe.register_fake
def _(x: Tensor, packed: Tensor, scales: Tensor, experts: Tensor) -> Tensor:
    torch._check(x.dim() == 2 and packed.dim() == 3 and scales.dim() == 3 and experts.dim() == 2)
    return x.new_empty(x.shape[0], experts.shape[1], packed.shape[1])


def mxfp4_moe_swiglu(gate_up: Tensor, packed: Tensor, scales: Tensor, experts: Tensor, limit: float | None) -> Tensor:
    """The experts' down projection from their gate_up output: mxfp4_moe(swiglu(gate_up), ...).

    gate_up f32 [T, 2I] ([gate | up] halves, one (token, slot) row each, as mxfp4_moe's
    gate_up result reshaped); packed u8 [E, N, I/2]; scales u8 [E, N, I/32]; experts i64 [T, 1];
    limit: SwiGLU's clamp (gate ≤ limit, up in [-limit, limit]; models/layers.swiglu) or None.
    Returns f32 [T, 1, N]. A target that keeps `mxfp4_moe_swiglu` gets `day0::mxfp4_moe_swiglu`:
    cuda-sm90's expert matvec applies the SwiGLU as it stages x, where the SwiGLU was a dispatch
    of its own between the two expert matvecs of every MoE layer (docs/perf.md, launches).
    """
    if "mxfp4_moe_swiglu" in _KEPT.get():
        return torch.ops.day0.mxfp4_moe_swiglu(gate_up, packed, scales, experts, math.inf if limit is None else limit)
    return mxfp4_moe_swiglu_reference(gate_up, packed, scales, experts, limit)


def mxfp4_moe_swiglu_reference(
    gate_up: Tensor, packed: Tensor, scales: Tensor, experts: Tensor, limit: float | None
) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if limit is not None and math.isfinite(limit):
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return torch.ops.day0.mxfp4_moe(F.silu(gate) * up, packed, scales, experts)


@torch.library.custom_op("day0::mxfp4_moe_swiglu", mutates_args=())
def _mxfp4_moe_swiglu_op(gate_up: Tensor, packed: Tensor, scales: Tensor, experts: Tensor, limit: float) -> Tensor:
    return mxfp4_moe_swiglu_reference(gate_up, packed, scales, experts, limit)


@_mxfp4_moe_swiglu_op.register_fake
def _(gate_up: Tensor, packed: Tensor, scales: Tensor, experts: Tensor, limit: float) -> Tensor:
    torch._check(gate_up.dim() == 2 and packed.dim() == 3 and scales.dim() == 3 and experts.dim() == 2)
    return gate_up.new_empty(gate_up.shape[0], experts.shape[1], packed.shape[1])


# --- DeepSeek's group-limited sigmoid routing (models/moe.py's Router), as one op.


def one_hot_sum(indices: Tensor, n: int, values: Tensor | None = None) -> Tensor:
    """out[s, j] = Σ_k values[s, k]·[indices[s, k] == j] (values default 1): a dense row per
    token built by comparison rather than scatter, which IREE fuses into one elementwise op."""
    hits = (indices[..., None] == torch.arange(n, dtype=indices.dtype)).float()  # [S, k, n]
    return hits.sum(1) if values is None else (hits * values[..., None]).sum(1)


def moe_route(
    logits: Tensor, bias: Tensor, groups: int, topk_group: int, top_k: int, normalize: bool, scaling: float
) -> tuple[Tensor, Tensor]:
    """The router after its linear: logits [S, E] f32, bias [E] f32 -> (weights [S, k] f32, experts
    [S, k] int64).

    scores = sigmoid(logits); biased = scores + bias; the `topk_group` of `groups` contiguous
    groups with the largest sum of their two best biased scores; the `top_k` experts of the
    largest biased score inside them; weights = their unbiased scores, divided by their sum
    (+1e-20) when `normalize`, times `scaling`. The selection is a set (its order is not part of
    the contract). A target that keeps `moe_route` gets `day0::moe_route` (one CUDA kernel for
    what IREE makes about eight dispatches, three of them top-k's).
    """
    args = (logits, bias, groups, topk_group, top_k, normalize, scaling)
    if "moe_route" in _KEPT.get():
        return torch.ops.day0.moe_route(*args)
    return moe_route_reference(*args)


def moe_route_reference(
    logits: Tensor, bias: Tensor, groups: int, topk_group: int, top_k: int, normalize: bool, scaling: float
) -> tuple[Tensor, Tensor]:
    scores = logits.sigmoid()  # [S, E]
    biased = scores + bias
    experts_per_group = logits.shape[-1] // groups
    per_group = biased.view(-1, groups, experts_per_group)
    group_scores = per_group.topk(2, dim=-1, sorted=False).values.sum(-1)  # [S, G]
    chosen_groups = group_scores.topk(topk_group, dim=-1, sorted=False).indices
    group_mask = one_hot_sum(chosen_groups, groups)  # [S, G] 1.0 at the chosen groups
    expert_mask = group_mask.repeat_interleave(experts_per_group, dim=1)
    # sorted=False throughout: every selection here is used as a set.
    experts = biased.masked_fill(expert_mask == 0, float("-inf")).topk(top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, experts)
    if normalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, experts


@torch.library.custom_op("day0::moe_route", mutates_args=())
def _moe_route_op(
    logits: Tensor, bias: Tensor, groups: int, topk_group: int, top_k: int, normalize: bool, scaling: float
) -> tuple[Tensor, Tensor]:
    return moe_route_reference(logits, bias, groups, topk_group, top_k, normalize, scaling)


@_moe_route_op.register_fake
def _(logits: Tensor, bias: Tensor, groups: int, topk_group: int, top_k: int, normalize: bool, scaling: float):
    torch._check(logits.dim() == 2 and bias.dim() == 1)
    s = logits.shape[0]
    return logits.new_empty(s, top_k), logits.new_empty(s, top_k, dtype=torch.int64)


# --- materialize: a fusion boundary


def materialize(x: Tensor) -> Tensor:
    """x itself. A target that keeps `materialize` gets `day0::materialize`, which its pipeline
    lowers to IREE's util.optimization_barrier (passes/materialize_to_barrier.py): x becomes a
    tensor of its own (a column slice is copied out contiguously) and no dispatch fuses across
    it. cuda-sm90 needs that where IREE 3.13's CUDA codegen miscompiles a fused form: a gather
    (a rope's partner column) from a column slice of a matmul's result, in the dispatch of a
    row reduction (the MLA cache row of the default model: rows past the first read the first
    row's values; docs/perf.md, "The default model on the GPU")."""
    if "materialize" in _KEPT.get():
        return torch.ops.day0.materialize(x)
    return x


@torch.library.custom_op("day0::materialize", mutates_args=())
def _materialize_op(x: Tensor) -> Tensor:
    return x.clone()


@_materialize_op.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


# --- to_device: where a value lives in an artifact compiled for several devices


def to_device(x: Tensor, device: int) -> Tensor:
    """x itself, to be used on device `device` of an artifact compiled for several (`day0 compile
    --devices N`; device 0 holds the arguments, the state and the results). The
    `to-device-transfer` pass makes it IREE's `flow.tensor.transfer` to that device, or, for a
    module global (a stack of experts), places the global there, so that only that device holds
    and reads it. In eager PyTorch there is one device and nothing moves."""
    return torch.ops.day0.to_device(x, device)


@torch.library.custom_op("day0::to_device", mutates_args=())
def _to_device_op(x: Tensor, device: int) -> Tensor:
    return x.clone()


@_to_device_op.register_fake
def _(x: Tensor, device: int) -> Tensor:
    return torch.empty_like(x)
