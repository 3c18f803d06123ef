"""What every day0 architecture shares: explicit device state, uninitialized construction in the
checkpoint's dtypes, and the RoPE table.

An architecture subclasses `CausalLM`, provides `state_specs()`, `step(ids, start, *state)` and
`rope_dim()`, and declares the capabilities below that differ from their defaults; its module
tree mirrors the checkpoint's tensor names exactly.
"""

import torch
from torch import Tensor, nn

from day0.models.layers import RMSNorm, rope_table
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
    # step_paged(ids, positions, tables, *pools, block) exists: the caches of state_specs as pools
    # of blocks shared by many sequences (models/paging.py; the paged entry points)
    supports_paging: bool = False

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
        with torch.device("meta"):
            m = cls(cfg, max_seq_len, cache_dtype)
        m = m.to_empty(device="cpu")
        for name, p in m.named_parameters():
            want = (dtypes or {}).get(name)
            if want is not None and p.is_floating_point() and want.is_floating_point and want != p.dtype:
                p.data = torch.empty(p.shape, dtype=want)
        if m.rope_dim():  # 0: no rotary anywhere (kimi_linear's NoPE attention), no table
            inv_freq, scaling = rope_frequencies(cfg, m.rope_dim())
            cos, sin = rope_table(inv_freq, max_seq_len, scaling)
            m.register_buffer("rope_cos", cos, persistent=True)
            m.register_buffer("rope_sin", sin, persistent=True)
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

    def rope_at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [S, rope_dim/2] at positions [S]."""
        return self.rope_cos.index_select(0, positions), self.rope_sin.index_select(0, positions)


def rope_frequencies(cfg, dim: int) -> tuple[Tensor, float]:
    """inv_freq [dim/2] and the cos/sin scaling, exactly as transformers computes them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = (cfg.rope_parameters or {}).get("rope_type", "default")
    if rope_type == "default":
        base = cfg.rope_parameters["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    return ROPE_INIT_FUNCTIONS[rope_type](cfg)
