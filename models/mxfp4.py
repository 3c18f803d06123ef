"""MXFP4 (OCP Microscaling v1.0: FP4 E2M1 elements, one E8M0 scale per block of 32) in numpy.

    value = E2M1[code] · 2^(scale − 127)
    E2M1  = [0, .5, 1, 1.5, 2, 3, 4, 6, −0, −.5, −1, −1.5, −2, −3, −4, −6]   (code = sign·8 + index)

Storage: two codes a byte, LOW nibble = even element (element 2j in bits 0..3, 2j+1 in bits 4..7);
one scale byte per 32 consecutive elements along K (the reduction / `in` axis). Scale byte 0xFF is
NaN in the spec and is rejected. Two checkpoint layouts carry the same bytes:

- gpt-oss:  `<proj>_blocks` u8 [..., N, K/32, 16] and `<proj>_scales` u8 [..., N, K/32]
            (the blocks are `packed` [..., N, K/2] reshaped), config `quant_method: "mxfp4"`.
- compressed-tensors `mxfp4-pack-quantized`: `<module>.weight_packed` u8 [N, K/2] and
            `<module>.weight_scale` u8 [N, K/32], config `quant_method: "compressed-tensors"`.

Quantizing follows the spec and nothing else: per block, X = floor(log2(max|v|)) − 2 (2 = emax of
E2M1), clamped to E8M0's [−127, 127]; elements v / 2^X rounded to E2M1 with round-to-nearest-even
and saturation to ±6 (ml_dtypes.float4_e2m1fn does exactly that). Never IREE's truncf to
f4E2M1FN: IREE 3.13 rounds |x| in [0.75, 1) to zero.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from day0.frontend.ops import E2M1_VALUES

BLOCK = 32  # elements per shared scale
E2M1_EMAX = 2  # largest exponent of E2M1 (6 = 1.5 · 2^2)
SCALE_BIAS = 127  # E8M0: byte s means 2^(s - 127)
SCALE_NAN = 0xFF
# An all-zero block: log2(0) = -inf, which the spec's clamp takes to the smallest E8M0 scale,
# 2^-127 (byte 0). Every code of the block is 0, so any scale decodes to zeros.
ZERO_BLOCK_SCALE = 0

GPT_OSS_BLOCK_BYTES = BLOCK // 2  # the trailing 16 of gpt-oss `_blocks`
CT_FORMAT = "mxfp4-pack-quantized"

_LUT = np.array(E2M1_VALUES, dtype=np.float32)


class Mxfp4Error(ValueError):
    """An MXFP4 tensor, pair or config is unusable; the message names the tensor / field."""


# --- the format ------------------------------------------------------------------------------


def quantize(w: np.ndarray, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """w float32 / float16 / bfloat16 (ml_dtypes) [..., K] -> (packed u8 [..., K/2],
    scales u8 [..., K/32]), blocks of 32 along the last axis. K must be a multiple of 32 and every
    value finite (E2M1 has no NaN/inf); `name` is the tensor the error messages name."""
    w = np.asarray(w)
    if w.ndim == 0 or w.shape[-1] % BLOCK:
        raise Mxfp4Error(
            f"tensor {name}: shape {w.shape}: the quantized axis (last, K) must be a "
            f"multiple of {BLOCK} for MXFP4, got K = {w.shape[-1] if w.ndim else None}"
        )
    if not (np.issubdtype(w.dtype, np.floating) or w.dtype == ml_dtypes.bfloat16):
        raise Mxfp4Error(f"tensor {name}: dtype {w.dtype} is not a float type; cannot quantize")
    v = w.astype(np.float32).reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)  # exact upcast
    if not np.isfinite(v).all():
        raise Mxfp4Error(f"tensor {name}: holds NaN or inf, which MXFP4 (E2M1) cannot represent")
    amax = np.abs(v).max(axis=-1)  # [..., K/32]
    # floor(log2(amax)) exactly: frexp gives amax = m · 2^e with m in [0.5, 1).
    _, e = np.frexp(amax)
    x = np.where(amax > 0, e.astype(np.int32) - 1 - E2M1_EMAX, ZERO_BLOCK_SCALE - SCALE_BIAS)
    x = np.clip(x, -SCALE_BIAS, SCALE_BIAS)  # E8M0 range; 0xFF (NaN) is never produced
    scaled = np.ldexp(v, -x[..., None]).astype(np.float32)  # exact: a power-of-two scaling
    codes = scaled.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F  # RNE, saturating to ±6
    codes = codes.reshape(*w.shape[:-1], w.shape[-1] // 2, 2)
    packed = (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)  # low nibble = even element
    return packed, (x + SCALE_BIAS).astype(np.uint8)


def dequantize(packed: np.ndarray, scales: np.ndarray, name: str = "weight") -> np.ndarray:
    """packed u8 [..., K/2], scales u8 [..., K/32] -> float32 [..., K], exact (every E2M1 value
    times a power of two in [2^-127, 2^127] is a float32). Scale byte 0xFF -> Mxfp4Error."""
    packed, scales = np.asarray(packed), np.asarray(scales)
    check_pair(name, packed.shape, f"{name} (scales)", scales.shape)
    check_scales(name, scales)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    values = _LUT[codes].reshape(*scales.shape, BLOCK)
    exponent = scales.astype(np.int32) - SCALE_BIAS
    return np.ldexp(values, exponent[..., None]).astype(np.float32).reshape(*packed.shape[:-1], -1)


def check_scales(name: str, scales: np.ndarray) -> None:
    """Raise Mxfp4Error naming tensor `name` and the first position of a 0xFF (NaN) scale byte."""
    bad = np.argwhere(np.asarray(scales) == SCALE_NAN)
    if len(bad):
        raise Mxfp4Error(
            f"tensor {name}: scale byte 0xFF (NaN in the OCP MX spec) at index "
            f"{tuple(int(i) for i in bad[0])} ({len(bad)} such scales)"
        )


def check_pair(name_packed: str, packed_shape, name_scales: str, scales_shape, K_expected: int | None = None) -> int:
    """Check that packed codes and their scales agree and return K (elements per row).

    packed_shape is either packed [..., N, K/2] (compressed-tensors) or gpt-oss blocks
    [..., N, K/32, 16]; scales_shape is [..., N, K/32]. K_expected: the K the model needs."""
    p, s = tuple(packed_shape), tuple(scales_shape)

    def fail(why: str):
        raise Mxfp4Error(f"MXFP4 tensors {name_packed} (shape {p}) and {name_scales} (shape {s}) disagree: {why}")

    if not s:
        fail("scales must have at least one dimension")
    if len(p) == len(s) + 1 and p[-1] == GPT_OSS_BLOCK_BYTES:  # gpt-oss blocks
        if p[:-1] != s:
            fail(f"blocks [..., K/32, 16] need scales of shape {p[:-1]}")
        k = s[-1] * BLOCK
    elif len(p) == len(s):
        if p[:-1] != s[:-1]:
            fail(f"leading dimensions {p[:-1]} vs {s[:-1]}")
        if p[-1] * 2 != s[-1] * BLOCK:
            fail(
                f"packed rows of {p[-1]} bytes hold K = {2 * p[-1]} elements, which need "
                f"K/32 = {2 * p[-1] / BLOCK:g} scales per row; found {s[-1]}"
            )
        k = s[-1] * BLOCK
    else:
        fail("expected packed [..., N, K/2] or blocks [..., N, K/32, 16] with scales [..., N, K/32]")
    if K_expected is not None and k != K_expected:
        fail(f"they hold K = {k} elements per row, the model expects K = {K_expected}")
    return k


# --- layouts ---------------------------------------------------------------------------------


def gpt_oss_blocks_to_packed(blocks: np.ndarray) -> np.ndarray:
    """gpt-oss blocks u8 [..., N, K/32, 16] -> packed u8 [..., N, K/2] (a reshape)."""
    return blocks.reshape(*blocks.shape[:-2], blocks.shape[-2] * blocks.shape[-1])


def packed_to_gpt_oss_blocks(packed: np.ndarray) -> np.ndarray:
    """packed u8 [..., N, K/2] -> gpt-oss blocks u8 [..., N, K/32, 16] (a reshape)."""
    return packed.reshape(*packed.shape[:-1], packed.shape[-1] // GPT_OSS_BLOCK_BYTES, GPT_OSS_BLOCK_BYTES)


def gpt_oss_names(proj: str) -> tuple[str, str]:
    """`...mlp.experts.gate_up_proj` -> (`..._blocks`, `..._scales`)."""
    return f"{proj}_blocks", f"{proj}_scales"


def compressed_tensors_names(module: str) -> tuple[str, str]:
    """`...experts.3.up_proj` -> (`....weight_packed` [N, K/2], `....weight_scale` [N, K/32])."""
    return f"{module}.weight_packed", f"{module}.weight_scale"


# --- config.json `quantization_config` -------------------------------------------------------


def gpt_oss_quantization_config() -> dict:
    """What openai/gpt-oss-{20,120}b carry (and transformers' Mxfp4Config serializes): only the
    experts are MXFP4; attention, router, embeddings and lm_head stay in bf16."""
    return {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    }


def compressed_tensors_quantization_config(ignore: list[str] = ()) -> dict:
    """compressed-tensors' serialized QuantizationConfig for weight-only MXFP4 (the MXFP4A16
    preset, as Kimi K3 ships it): every Linear is quantized except the modules in `ignore`
    (names, or "re:<regex>" patterns)."""
    weights = {
        "actorder": None,
        "block_structure": None,
        "dynamic": False,
        "group_size": BLOCK,
        "num_bits": 4,
        "observer": "minmax",
        "observer_kwargs": {},
        "scale_dtype": "torch.uint8",
        "strategy": "group",
        "symmetric": True,
        "type": "float",
        "zp_dtype": None,
    }
    return {
        "config_groups": {
            "group_0": {
                "format": CT_FORMAT,
                "input_activations": None,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": weights,
            }
        },
        "format": CT_FORMAT,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


def quantization_config_of(config: dict) -> tuple[str, dict | None]:
    """(field path, quantization_config) of a config.json dict; multimodal configs (Kimi K3)
    may keep it under text_config."""
    if config.get("quantization_config") is not None:
        return "quantization_config", config["quantization_config"]
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("quantization_config") is not None:
        return "text_config.quantization_config", text["quantization_config"]
    return "quantization_config", None


def compressed_tensors_expert_format(config: dict, model_type: str) -> str:
    """'dense' (bf16/f32 routed experts) or 'mxfp4' (compressed-tensors mxfp4-pack-quantized) for
    an architecture that reads only those; the gpt-oss layout is a ConfigError naming the field."""
    from day0.models.config import require

    method = quant_method_of(config)
    require(
        method in (None, "compressed-tensors-mxfp4"),
        "quantization_config",
        f"'{method}' experts are not supported for {model_type} (supported: compressed-tensors mxfp4-pack-quantized)",
    )
    return "dense" if method is None else "mxfp4"


def quant_method_of(config: dict) -> str | None:
    """ "mxfp4" (gpt-oss layout), "compressed-tensors-mxfp4", or None (not quantized) for a
    config.json dict. Any other quant_method, or a compressed-tensors format / weight scheme
    other than MXFP4, raises Mxfp4Error naming the config.json field."""
    field, qc = quantization_config_of(config)
    if qc is None:
        return None

    def fail(sub: str, why: str):
        raise Mxfp4Error(f"config.json: field '{field}.{sub}': {why}")

    if not isinstance(qc, dict):
        raise Mxfp4Error(f"config.json: field '{field}' is a {type(qc).__name__}, expected an object")
    method = qc.get("quant_method")
    if method == "mxfp4":
        return "mxfp4"
    if method != "compressed-tensors":
        fail(
            "quant_method",
            f"unsupported quant_method {method!r} (supported: 'mxfp4', 'compressed-tensors' with format '{CT_FORMAT}')",
        )
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        fail("config_groups", f"expected an object, got {type(groups).__name__}")
    if fmt not in (CT_FORMAT, "mixed-precision"):
        fail("format", f"unsupported compressed-tensors format {fmt!r} (supported: '{CT_FORMAT}')")
    for gname, group in groups.items():
        if not isinstance(group, dict):
            continue  # a preset reference (targets list): its format is the top-level one
        gfmt = group.get("format") or fmt
        if gfmt != CT_FORMAT:
            fail(
                f"config_groups.{gname}.format",
                f"unsupported compressed-tensors format {gfmt!r} (supported: '{CT_FORMAT}')",
            )
        wts = group.get("weights") or {}
        for key, want in (("num_bits", 4), ("type", "float"), ("group_size", BLOCK)):
            if key in wts and wts[key] != want:
                fail(f"config_groups.{gname}.weights.{key}", f"{wts[key]!r} is not MXFP4 (expected {want!r})")
    return "compressed-tensors-mxfp4"


def scale_tensor_names(names) -> list[str]:
    """The E8M0 scale tensors of either layout among checkpoint tensor names."""
    return [n for n in names if n.endswith("_scales") or n.endswith(".weight_scale")]


def check_checkpoint_scales(ckpt) -> None:
    """Reject a NaN scale byte (0xFF) anywhere in a checkpoint's MXFP4 scales, naming the tensor.

    Scales are 1/16 of the packed bytes, so reading them all at compile time is cheap; a NaN
    found here would otherwise poison every output that touches its block, silently."""
    from safetensors import safe_open

    by_file: dict = {}
    for name in scale_tensor_names(ckpt.tensors):
        if ckpt.tensors[name].dtype == "U8":
            by_file.setdefault(ckpt.tensors[name].file, []).append(name)
    for file, names in by_file.items():
        with safe_open(str(file), "np") as shard:
            for name in names:
                check_scales(f"{name} in {file.name}", shard.get_tensor(name))
