"""GLM-5.3-Flash's vision tower (`glm5_next`'s `model.visual.*`), eager and export-friendly, equal to
transformers' Glm5NextVisionModel up to float reassociation.

    encode: pixel_values [P, C·T·p·p] f32, positions [P, 2] i64, segments [P] i64
            -> features [P/m², out_hidden_size] f32 (transformers' `pooler_output`)

P patches of one or several images (or video frames) side by side, in transformers' patch order:
per frame, block-major over the m×m spatial-merge blocks (block row, block col, row in block, col in
block), as the image processor's patchify lays them out. `positions` holds each patch's (h, w)
coordinates in its frame and `segments` the attention segment it belongs to (one per frame: an
image, or one temporal step of a video); `vision_inputs(grid_thw)` (runtime/images.py, re-exported
here) computes both on the host, exactly as transformers' get_vision_position_ids /
get_vision_cu_seqlens do. Everything data-dependent stays there: the graph has no control flow on
tensor values, so P can be a dynamic dimension (a multiple of m²) of an exported program.

The tower (Glm5NextVision* in transformers):
  - patch_embed: a Conv3d whose stride is its kernel, i.e. one matmul of the flat patches with the
    flattened kernel;
  - `depth` pre-norm blocks: RMSNorm, attention (qkv with bias, per-head q/k RMSNorm, axial 2-D rope
    over the whole head dim, non-causal within a segment), RMSNorm, SwiGLU with clamping;
  - post_layernorm (RMSNorm), then `downsample`: a Conv2d of kernel = stride = m over each m×m block
    of m² consecutive patches, i.e. one matmul over the block's concatenated rows;
  - merger: proj, LayerNorm, exact GELU, clamped SwiGLU.
Attention within segments is `day0::vision_attention` (frontend/ops.py): eagerly and on llvm-cpu one
dense attention over all P patches, masked to equal segments (the same softmax as transformers'
per-segment attention: masked logits are -inf, their weights exactly 0), at the cost of P² scores;
cuda-sm90 keeps the op whole for day0's flash-style kernel, which visits only each segment's keys.

Module names are the checkpoint's relative to `model.visual.` (PREFIX); all math is float32 whatever
the parameters' storage dtype (models/layers.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from day0.frontend.ops import vision_attention
from day0.models.base import ParameterShapes, allocate_empty
from day0.models.checkpoint import CheckpointError
from day0.models.config import (
    ROPE_FIELDS,
    NumberFields,
    require,
    require_numbers,
    require_parsed_numbers,
    transformers_config,
)
from day0.models.layers import MLP, RMSNorm, linear, rotate_half_split, swiglu
from day0.runtime.images import vision_inputs  # noqa: F401  (re-exported)

MODEL_TYPE = "glm5_next_vision"
PREFIX = "model.visual."  # the tower's tensors in a glm5_next checkpoint
# every number the tower reads from config.json's vision_config, checked before the tower is built
NUMBER_FIELDS = NumberFields(
    {
        "depth": "int>=1",
        "hidden_size": "int>=1",
        "num_heads": "int>=1",
        "head_dim": "null|int>=1",
        "intermediate_size": "int>=1",
        "in_channels": "int>=1",
        "patch_size": "int>=1",
        "temporal_patch_size": "int>=1",
        "spatial_merge_size": "int>=1",
        "out_hidden_size": "int>=1",
        "projection_intermediate_size": "int>=1",
        "rms_norm_eps": ">0",
        "swiglu_limit": ">0",
        "rope_parameters": ROPE_FIELDS,
    },
    root_key="vision_config",
)


# -- config -----------------------------------------------------------------------------------------


def vision_fields(raw: dict) -> tuple[dict, str]:
    """(the tower's fields, the prefix naming them in config.json): a glm5_next config.json's
    `vision_config`, or a vision config dict itself."""
    if isinstance(raw.get("vision_config"), dict):
        return {k: v for k, v in raw["vision_config"].items() if k != "model_type"}, "vision_config."
    return {k: v for k, v in raw.items() if k != "model_type"}, ""


def parse_vision_config(raw):
    """A glm5_next config.json dict, its `vision_config` dict, or a Glm5NextVisionConfig ->
    transformers' Glm5NextVisionConfig, after checking what the tower supports. Every failure is a
    ConfigError naming the config.json field."""
    import transformers

    if isinstance(raw, dict):
        require(
            raw.get("model_type") != "glm5_next" or isinstance(raw.get("vision_config"), dict),
            "vision_config",
            "missing or not a JSON object: a text-only checkpoint has no vision tower",
        )
        require_numbers(raw, NUMBER_FIELDS)
        fields, prefix = vision_fields(raw)
        cfg = transformers_config(transformers.Glm5NextVisionConfig, fields, MODEL_TYPE)
        require_parsed_numbers(raw, cfg, NUMBER_FIELDS)
    else:
        cfg, prefix = raw, "vision_config."  # a parsed config: name its fields as config.json nests them
        require_parsed_numbers({"vision_config": {}}, cfg, NUMBER_FIELDS)
    require(cfg.hidden_act == "silu", prefix + "hidden_act", f"'{cfg.hidden_act}' is not supported (only silu)")
    rope_type = (cfg.rope_parameters or {}).get("rope_type")
    require(
        rope_type == "axial",
        prefix + "rope_parameters.rope_type",
        f"'{rope_type}' is not supported (the vision tower's rope is axial)",
    )
    require(
        cfg.hidden_size % cfg.num_heads == 0,
        prefix + "num_heads",
        f"must divide hidden_size ({cfg.hidden_size}), got {cfg.num_heads}",
    )
    head_dim = cfg.hidden_size // cfg.num_heads
    require(
        getattr(cfg, "head_dim", None) in (None, head_dim),
        prefix + "head_dim",
        f"must be hidden_size / num_heads ({head_dim}) or absent: attention splits hidden_size into "
        f"num_heads heads (got {getattr(cfg, 'head_dim', None)})",
    )
    require(
        head_dim % 4 == 0,
        prefix + "num_heads",
        f"the head dim hidden_size / num_heads ({head_dim}) must be a multiple of 4: "
        f"the axial rope gives h and w a quarter of it each, twice",
    )
    return cfg


def axial_inv_freq(cfg) -> Tensor:
    """inv_freq [head_dim/4] float32, exactly as transformers' Glm5NextVisionRotaryEmbedding: the
    frequencies of a rope over head_dim/2 (one half per spatial axis)."""
    spatial_dim = (cfg.hidden_size // cfg.num_heads) // 2
    base = cfg.rope_parameters["rope_theta"]
    return 1.0 / (base ** (torch.arange(0, spatial_dim, 2, dtype=torch.float) / spatial_dim))


# -- host-side inputs ---------------------------------------------------------------------------------
# vision_inputs (positions and segments of the patches) lives in runtime/images.py, which a serving
# host runs without PyTorch; re-exported here.


# -- the tower ------------------------------------------------------------------------------------


class Weight(nn.Module):
    """A convolution's `weight` (and `bias`), kept in the checkpoint's shape; the tower applies it
    as the matmul it amounts to."""

    def __init__(self, shape: tuple[int, ...], bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(shape[0])) if bias else None


class LayerNorm(nn.Module):
    """torch's LayerNorm (weight, bias, eps 1e-5 as nn.LayerNorm's default) in float32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), self.bias.float(), self.eps)


class VisionAttention(nn.Module):
    """Checkpoint names: qkv, proj (with bias when attention_bias), q_norm, k_norm [head_dim]."""

    def __init__(self, cfg):
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = self.head_dim**-0.5

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, segments: Tensor) -> Tensor:
        """x [P, hidden]; cos, sin [P, head_dim/2]; segments [P] i64 (only patches of one segment
        attend to each other: frontend/ops.py vision_attention). Returns [P, hidden]."""
        p = x.shape[0]
        q, k, v = linear(x, self.qkv).reshape(p, 3, self.heads, self.head_dim).unbind(1)  # [P, H, D] each
        q = rotate_half_split(self.q_norm(q), cos, sin)
        k = rotate_half_split(self.k_norm(k), cos, sin)
        o = vision_attention(q, k, v, segments, self.scale).reshape(p, self.heads * self.head_dim)
        return linear(o, self.proj)


class VisionBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(x)) (the MLP's bias is attention_bias,
    as transformers builds it)."""

    def __init__(self, cfg):
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = VisionAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.swiglu_limit, bias=cfg.attention_bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, segments: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """proj, LayerNorm, exact GELU, clamped SwiGLU; no biases but the LayerNorm's. Checkpoint names
    proj, post_projection_norm, gate/up/down_proj."""

    def __init__(self, dim: int, intermediate: int, limit: float):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.post_projection_norm = LayerNorm(dim)
        self.gate_proj = nn.Linear(dim, intermediate, bias=False)
        self.up_proj = nn.Linear(dim, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, dim, bias=False)
        self.limit = limit

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.post_projection_norm(linear(x, self.proj)))
        return linear(swiglu(linear(x, self.gate_proj), linear(x, self.up_proj), self.limit), self.down_proj)


class VisionTower(nn.Module):
    """The vision tower. `VisionTower(cfg)` (cfg: parse_vision_config's input or output) builds it
    with placeholder weights (to be loaded); `VisionTower.empty(cfg, dtypes)` builds it without
    touching memory, in the checkpoint's dtypes; fill it with `load_state_dict` (names relative to PREFIX) or
    `load_vision_tower(checkpoint_dir)`."""

    def __init__(self, cfg):
        super().__init__()
        cfg = parse_vision_config(cfg)
        self.cfg = cfg
        self.merge = cfg.spatial_merge_size
        c, t, p, m = cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.spatial_merge_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = Weight((cfg.hidden_size, c, t, p, p), bias=True)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.post_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.downsample = Weight((cfg.out_hidden_size, cfg.hidden_size, m, m), bias=True)
        self.merger = PatchMerger(cfg.out_hidden_size, cfg.projection_intermediate_size, cfg.swiglu_limit)
        # not in the checkpoint (transformers' is non-persistent too): computed, never loaded
        self.register_buffer("inv_freq", axial_inv_freq(cfg), persistent=False)

    @classmethod
    def empty(cls, cfg, dtypes: dict[str, torch.dtype] | None = None) -> VisionTower:
        """Parameters allocated but not initialized, floating ones in the dtype the checkpoint
        stores (`dtypes`: name relative to PREFIX -> dtype); the rope frequencies computed."""
        m = allocate_empty(lambda: cls(cfg), dtypes)
        m.inv_freq = axial_inv_freq(m.cfg)
        return m.requires_grad_(False)

    def patch_dim(self) -> int:
        """The width of a row of pixel_values: in_channels · temporal_patch_size · patch_size²."""
        return self.patch_embed.proj.weight[0].numel()

    def parameter_shapes(self, prefix: str = "") -> ParameterShapes:
        """name (with `prefix`, PREFIX for a checkpoint) -> (shape, None: any dtype), for
        Checkpoint.check_expected."""
        return ParameterShapes({prefix + n: (tuple(p.shape), None) for n, p in self.named_parameters()})

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """torch's load_state_dict, which with `strict` first checks every name and shape and
        reports all problems in one CheckpointError naming the tensors (check_state_dict)."""
        if strict:
            check_state_dict(state_dict, self.parameter_shapes())
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, pixel_values: Tensor, positions: Tensor, segments: Tensor) -> Tensor:
        """pixel_values [P, C·T·p·p], positions [P, 2] i64, segments [P] i64 (vision_inputs), P a
        multiple of m² -> features [P/m², out_hidden_size] f32."""
        x = self.embed(pixel_values)
        cos, sin = self.rope(positions)
        for block in self.blocks:
            x = block(x, cos, sin, segments)
        return self.merger(self.downsampled(self.post_layernorm(x)))

    def embed(self, pixel_values: Tensor) -> Tensor:
        """The Conv3d patch embedding (kernel = stride = one patch) as what it computes: each flat
        patch [C·T·p·p] (transformers views it [C, T, p, p]) times the kernel flattened the same way."""
        proj = self.patch_embed.proj
        return F.linear(pixel_values.float(), proj.weight.flatten(1).float(), proj.bias.float())

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [P, head_dim/2] of the axial rope: the h angles then the w angles, each over
        inv_freq [head_dim/4]; rotate_half over the whole head dim pairs column j with j + D/2,
        which sees the same frequency (transformers' [h, w, h, w] layout)."""
        angles = positions.float()[:, :, None] * self.inv_freq  # [P, 2, D/4], f32 as transformers
        return angles.cos().flatten(1), angles.sin().flatten(1)

    def downsampled(self, x: Tensor) -> Tensor:
        """The m×m Conv2d of stride m over each block of m² consecutive patches [P, hidden] ->
        [P/m², out_hidden_size]: transformers views the block [m, m, hidden] (row, col, channel),
        so the block's rows concatenated meet the kernel [out, hidden, m, m] permuted to
        [out, m, m, hidden] and flattened."""
        down, m = self.downsample, self.merge
        weight = down.weight.permute(0, 2, 3, 1).flatten(1).float()  # [out, m·m·hidden]
        return F.linear(x.reshape(-1, m * m * x.shape[-1]), weight, down.bias.float())


def check_state_dict(state_dict: dict, expected: dict[str, tuple[tuple[int, ...], object]]) -> None:
    """Every tensor `expected` names (name -> (shape, ...)) is in `state_dict` with that shape and
    nothing else is; every problem is reported in one CheckpointError, as Checkpoint.check_expected
    words them."""
    problems = []
    for name, (shape, _) in expected.items():
        t = state_dict.get(name)
        if t is None:
            problems.append(f"missing tensor {name} (expected shape {tuple(shape)})")
        elif tuple(t.shape) != tuple(shape):
            problems.append(f"tensor {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    unexpected = [n for n in state_dict if n not in expected]
    if unexpected:
        more = f", ... ({len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        problems.append(
            f"{len(unexpected)} unexpected tensors (not used by the vision tower): {', '.join(unexpected[:5])}{more}"
        )
    if problems:
        raise CheckpointError(
            f"state dict does not fit the vision tower ({len(problems)} problems):\n  " + "\n  ".join(problems)
        )


def load_vision_tower(checkpoint_dir) -> VisionTower:
    """The vision tower of a glm5_next checkpoint (config.json's vision_config, the `model.visual.*`
    tensors, streamed), in the checkpoint's dtypes; the text model's tensors are not read."""
    from day0.models.checkpoint import Checkpoint

    ckpt = Checkpoint.open(checkpoint_dir)
    cfg = parse_vision_config(ckpt.config)
    dtypes = {n[len(PREFIX) :]: ckpt.torch_dtype(n) for n in ckpt.tensors if n.startswith(PREFIX)}
    tower = VisionTower.empty(cfg, dtypes)
    ckpt.check_expected(tower.parameter_shapes(PREFIX), allow_unused=[r"(?!model\.visual\.).*"])
    ckpt.load_into({PREFIX + n: p for n, p in tower.named_parameters()})
    return tower
