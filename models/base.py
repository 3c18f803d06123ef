"""What every day0 architecture shares: explicit device state, uninitialized construction in the
checkpoint's dtypes, and the RoPE table.

An architecture subclasses `CausalLM`, provides `state_specs()`, `step(ids, start, *state)`,
`_run(ids, view, state, last=False)` (the step over caches addressed through a models/paging.py view,
which `step_paged` uses; `last`: the logits of the last row only) and `rope_dim()`, and declares the capabilities below that differ from their defaults; its module
tree mirrors the checkpoint's tensor names exactly.
"""

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from day0.models.layers import RMSNorm, rope_at, rope_tables
from day0.models.paging import CacheView, paged_view
from day0.runtime.artifact import StateTensor


class ParameterShapes(dict):
    """CausalLM.parameter_shapes(): a dict that also carries the model's `allow_unused` patterns,
    which Checkpoint.check_expected honours wherever it is called."""

    def __init__(self, shapes: dict, allow_unused: tuple[str, ...] = ()):
        super().__init__(shapes)
        self.allow_unused = tuple(allow_unused)


class Backbone(nn.Module):
    """`model.embed_tokens`, `model.layers.{i}`, `model.norm`: the trunk every checkpoint names."""

    def __init__(self, cfg, layer_cls):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


CACHE_DTYPES = ("float32", "bfloat16")
# state of a fixed size per sequence (not per position): a paged step keeps it in slots
SEQUENCE_KINDS = frozenset({"conv_tail", "kda_state"})


def allocate_empty(build: Callable[[], nn.Module], dtypes: dict[str, torch.dtype] | None = None) -> nn.Module:
    """The module `build` makes, its parameters allocated on the CPU but not initialized (untouched
    pages cost no memory); floating parameters take the dtype the checkpoint stores (`dtypes`:
    parameter name -> dtype), packed integer ones (MXFP4 bytes) keep theirs. Buffers are left
    uninitialized too: the caller computes the ones it needs."""
    with torch.device("meta"):
        m = build()
    m = m.to_empty(device="cpu")
    for name, p in m.named_parameters():
        want = (dtypes or {}).get(name)
        if want is not None and p.is_floating_point() and want.is_floating_point and want != p.dtype:
            p.data = torch.empty(p.shape, dtype=want)
    return m


class CausalLM(nn.Module):
    """The base of every architecture. Its class attributes and the two methods below them are
    the capabilities the compile driver and export ask about; each has the default an
    architecture gets by saying nothing."""

    # step(..., first_turn=True) exists: with start == 0 only the prompt's own keys are scored
    # (exported as the `prefill_first` entry point)
    has_first_turn: bool = False
    # every state row belongs to one position (no recurrent state): a prompt may run as static
    # chunks that overlap, the overlap rewriting the same rows (the `prefill_chunk` entry point)
    position_indexed_state: bool = False
    # the position-indexed caches may be stored in bfloat16 (`cache_dtype`)
    supports_bf16_cache: bool = False
    # checkpoint tensors the model never reads (globs or regexes, Checkpoint.check_expected)
    unused_tensors: tuple[str, ...] = ()
    # step and step_paged take `features` / `feature_rows`: rows whose input is a given vector (an
    # image's features from the vision tower) instead of the token's embedding (`mix_features`)
    takes_image_features: bool = False

    @classmethod
    def compile_notes(cls, raw_config: dict, cfg) -> list[str]:
        """What the compile driver tells the user about this checkpoint beyond its progress: parts
        of it the artifact leaves out, and why (none by default)."""
        return []

    def selection_width(self) -> int | None:
        """K, the number of positions the DSA indexer selects per query (None: no DSA op)."""
        return None

    def dsa_block(self) -> int:
        """The block size of a block-structured DSA selection (0: token-level or no DSA)."""
        return 0

    def __init__(self, cfg, max_seq_len: int, cache_dtype: str = "float32"):
        """`cache_dtype`: the dtype of the position-indexed caches (state_specs); bfloat16 only
        where `supports_bf16_cache`."""
        super().__init__()
        if cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"cache dtype '{cache_dtype}' is not supported (choose from {', '.join(CACHE_DTYPES)})")
        if cache_dtype != "float32" and not self.supports_bf16_cache:
            raise ValueError(
                f"cache dtype {cache_dtype} is not supported for {type(self).__name__} (its caches are float32 only)"
            )
        self.cfg, self.max_seq_len, self.cache_dtype = cfg, max_seq_len, cache_dtype

    @classmethod
    def empty(cls, cfg, max_seq_len: int, dtypes: dict[str, torch.dtype] | None = None, cache_dtype: str = "float32"):
        """Parameters allocated but not initialized (untouched pages cost no memory); floating
        parameters take the dtype the checkpoint stores (`dtypes`: name -> dtype), packed integer
        ones (MXFP4 bytes) keep theirs; the rope table is computed."""
        m = allocate_empty(lambda: cls(cfg, max_seq_len, cache_dtype), dtypes)
        if m.rope_dim():  # 0: no rotary anywhere (kimi_linear's NoPE attention), no table
            inv_freq, scaling = rope_frequencies(cfg, m.rope_dim())
            for name, table in rope_tables(inv_freq, max_seq_len, scaling).items():
                m.register_buffer(name, table, persistent=True)
        return m.requires_grad_(False)

    def rope_dim(self) -> int:
        raise NotImplementedError

    def parameter_shapes(self) -> "ParameterShapes":
        """name -> (shape, allowed safetensors dtypes): packed u8 tensors must be U8 in the file."""
        return ParameterShapes(
            {n: (tuple(p.shape), {"U8"} if p.dtype == torch.uint8 else None) for n, p in self.named_parameters()},
            self.unused_tensors,
        )

    def state_specs(self) -> list[StateTensor]:
        raise NotImplementedError

    def empty_state(self) -> list[Tensor]:
        return [torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in self.state_specs()]

    def positions_per_row(self, spec: StateTensor) -> int:
        """Positions one row of a position-indexed state tensor covers (1 but for pooled keys)."""
        return 1

    def paged_block_multiple(self) -> int:
        """What a paged block size must be a multiple of: every pooled row's positions, so that
        pooled rows fill whole blocks."""
        return math.lcm(*(self.positions_per_row(s) for s in self.state_specs() if s.kind not in SEQUENCE_KINDS))

    def paged_state(self, block: int) -> tuple[list[StateTensor], list[StateTensor]]:
        """The paged entry points' state: (pools, slots). Pools: each position-indexed tensor of
        state_specs with one block's rows (a pool of n blocks has n times as many); slots: each
        per-sequence tensor (SEQUENCE_KINDS) with one sequence's shape (n slots: [n, *shape]).
        state_specs order within each; the entry points take the pools, then the slots."""
        pools, slots = [], []
        for s in self.state_specs():
            if s.kind in SEQUENCE_KINDS:
                slots.append(s)
            else:
                pools.append(
                    StateTensor(s.name, s.kind, s.layer, (block // self.positions_per_row(s), *s.shape[1:]), s.dtype)
                )
        return pools, slots

    def step_paged(
        self,
        ids: Tensor,
        positions: Tensor,
        tables: Tensor,
        slots: Tensor,
        *state: Tensor,
        block: int,
        batched: bool = False,
        last: bool = False,
        features: Tensor | None = None,
        feature_rows: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        """Run ids [S] at `positions` [S] over paged state (paged_state: the pools, then the slot
        tensors), through block tables [G, nb] and state slots [G]: G = 1, the tokens of one
        sequence; G = S, token s is its own sequence's (a batched decode step; models/paging.py).
        A sequence at position 0 starts from empty per-sequence state, whatever its slot held.
        batched: a decode step (paged_view), which G > 1 implies. Returns (logits [S, V], *pools, *slot
        tensors); with `last`, logits [1, V] of the last row only (a prompt chunk whose other rows
        nobody reads: the LM head is a large part of a chunk's work). `features` [N, hidden] and
        `feature_rows` [S] (models with takes_image_features; a prompt chunk): see mix_features."""
        specs = self.state_specs()
        per_sequence = [s.kind in SEQUENCE_KINDS for s in specs]
        pools, slotted = list(state[: per_sequence.count(False)]), list(state[per_sequence.count(False) :])
        one = tables.shape[0] == 1  # one sequence: its slot's state without the slot dim
        fresh = (positions[:1] if one else positions) == 0  # [G]
        rows, taken_pools, taken_slots = [], iter(pools), iter(slotted)
        for is_seq in per_sequence:
            if not is_seq:
                rows.append(next(taken_pools))
                continue
            held = next(taken_slots).index_select(0, slots)  # [G, *shape]
            held = torch.where(fresh.view(-1, *[1] * (held.dim() - 1)), torch.zeros_like(held), held)
            rows.append(held[0] if one else held)
        mm = {} if features is None and feature_rows is None else {"features": features, "feature_rows": feature_rows}
        logits, *new = self._run(ids, paged_view(positions, tables, block, batched), rows, last=last, **mm)
        out_pools = [t for t, is_seq in zip(new, per_sequence) if not is_seq]
        out_slots = [
            full.index_copy(0, slots, t[None] if one else t)
            for full, t in zip(slotted, (t for t, is_seq in zip(new, per_sequence) if is_seq))
        ]
        return (logits, *out_pools, *out_slots)

    def _run(self, ids: Tensor, view: CacheView, state: list[Tensor], last: bool = False) -> tuple[Tensor, ...]:
        """ids [S] over `state` (state_specs order) addressed through `view` -> (logits [S, V], *state);
        `last`: logits [1, V] of the last row only. A model with takes_image_features also takes
        `features` and `feature_rows` (keywords, both or neither) and applies mix_features to the
        embeddings."""
        raise NotImplementedError

    def mix_features(self, x: Tensor, features: Tensor | None, feature_rows: Tensor | None) -> Tensor:
        """The input rows [S, hidden] of a step: the token embeddings `x` [S, hidden] f32, where
        feature_rows[s] >= 0 replaced by features[feature_rows[s]] (f32). features [N, hidden]: the
        vision tower's output for the images of a prompt, in placeholder order; feature_rows [S]
        i64: -1 for a token row, else the feature row that replaces it (the k-th image placeholder
        of the prompt takes row k: runtime/images.image_feature_rows). This is transformers'
        masked_scatter of the image features over the placeholder embeddings, in a form with no
        data-dependent shape or control flow: one gather from [zero row, *features] and a select.
        A prompt prefilled in pieces (turns, chunks, where an image may straddle a boundary) gives
        every piece the same `features` and its own slice of the prompt's feature_rows. Neither
        given: `x` itself (the text-only graph). Shapes are checked; eagerly (not while tracing)
        so are the row indices, ValueError naming the first bad one. Traced, they are clamped into
        [-1, N - 1] (no gather leaves its tensor, whatever the host lets through)."""
        if features is None and feature_rows is None:
            return x
        name = type(self).__name__
        if not self.takes_image_features:
            raise ValueError(f"{name} takes no image features (text only)")
        if features is None or feature_rows is None:
            raise ValueError("features and feature_rows go together: give both or neither")
        hidden = x.shape[-1]
        if features.dim() != 2 or features.shape[1] != hidden:
            raise ValueError(f"features must be [N, {hidden}] (one row per image token), got {tuple(features.shape)}")
        if tuple(feature_rows.shape) != tuple(x.shape[:1]) or feature_rows.dtype != torch.int64:
            raise ValueError(
                f"feature_rows must be int64 [{x.shape[0]}] (one per token), got {feature_rows.dtype} "
                f"{tuple(feature_rows.shape)}"
            )
        n = features.shape[0]
        if not torch.compiler.is_compiling():
            bad = ((feature_rows < -1) | (feature_rows >= n)).nonzero()
            if bad.numel():
                s = int(bad[0, 0])
                raise ValueError(
                    f"feature_rows[{s}] = {int(feature_rows[s])}: neither -1 (a token row) nor a row of "
                    f"the {n} feature rows given"
                )
        rows = feature_rows.clamp(-1, n - 1)
        table = torch.cat([x.new_zeros(1, hidden), features.float()])  # row 0: no feature
        return torch.where((rows >= 0)[:, None], table.index_select(0, rows + 1), x)

    def rope_at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [S, rope_dim/2] at positions [S]."""
        return rope_at(self, positions)


def rope_frequencies(cfg, dim: int) -> tuple[Tensor, float]:
    """inv_freq [dim/2] and the cos/sin scaling, exactly as transformers computes them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = (cfg.rope_parameters or {}).get("rope_type", "default")
    if rope_type == "default":
        base = cfg.rope_parameters["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    return ROPE_INIT_FUNCTIONS[rope_type](cfg)
