"""`day0 quantize`: a bf16/f32 checkpoint -> the same checkpoint with MXFP4 routed experts, and back.

Only the routed experts are quantized (what gpt-oss and Kimi K3 ship); every other tensor is
copied byte for byte under its own name, in a shard of the same name. Which tensors are routed
experts, and what they become:

    per-expert (deepseek_v32, glm5_next)  <layer>.mlp.experts.<e>.{gate,up,down}_proj.weight [out, in]
    per-expert (kimi_linear, Moonshot)    <layer>.block_sparse_moe.experts.<e>.{w1,w2,w3}.weight [out, in]
      --layout compressed-tensors  ->   ....weight_packed u8 [out, in/2], ....weight_scale u8 [out, in/32]
    gpt_oss (save_pretrained layout)    <layer>.mlp.experts.gate_up_proj [E, H, 2I], down_proj [E, I, H]
                                        (that is [E, in, out]: transposed w.r.t. MXFP4's [E, out, ...])
      --layout gpt-oss             ->   ..._blocks u8 [E, out, in/32, 16], ..._scales u8 [E, out, in/32]
                                        (biases unchanged)

`dequantize_checkpoint` is the inverse used by oracles: either layout back to the unquantized
transformers layout (dequantized experts in float32, all else unchanged, no quantization_config),
which plain `from_pretrained` loads.

Both read the source through `Checkpoint` (headers first: every shape is checked before anything
is written), hold one shard at a time in memory, and write atomically: a temporary sibling of
`dst` renamed into place, so a failure leaves nothing at `dst`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from day0.models.checkpoint import INDEX_NAME, Checkpoint
from day0.models.mxfp4 import (
    BLOCK,
    Mxfp4Error,
    check_pair,
    compressed_tensors_names,
    compressed_tensors_quantization_config,
    dequantize,
    gpt_oss_blocks_to_packed,
    gpt_oss_names,
    gpt_oss_quantization_config,
    packed_to_gpt_oss_blocks,
    quant_method_of,
    quantization_config_of,
    quantize,
)
from day0.runtime.files import make_readable

LAYOUTS = ("gpt-oss", "compressed-tensors")
# Files besides config.json and the shards that travel with a checkpoint.
SIDECARS = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
FLOAT_DTYPES = {"F32", "BF16", "F16"}

# transformers' names (`mlp.experts.<e>.gate_proj`) and Moonshot's (`block_sparse_moe.experts.<e>.w1`)
PER_EXPERT = re.compile(
    r"(?P<module>.*\.(?:mlp\.experts\.\d+\.(?:gate|up|down)_proj"
    r"|block_sparse_moe\.experts\.\d+\.w[123]))\.weight"
)
GPT_OSS_EXPERT = re.compile(r".*\.mlp\.experts\.(?:gate_up|down)_proj")
CT_PACKED = re.compile(r"(?P<module>.*)\.weight_packed")
GPT_OSS_BLOCKS = re.compile(r"(?P<proj>.*)_blocks")

# A shard's plan: output name -> function producing that tensor from the open source shards.
Plan = dict[str, Callable[["_Reader"], torch.Tensor]]


# --- quantize --------------------------------------------------------------------------------


def quantize_checkpoint(src: str | Path, dst: str | Path, layout: str | None = None) -> Path:
    """Write `dst`: checkpoint `src` with its routed experts in MXFP4 (`layout` "gpt-oss" or
    "compressed-tensors"; None picks gpt-oss for gpt_oss checkpoints, compressed-tensors
    otherwise) and config.json's quantization_config set. Returns `dst`. Raises Mxfp4Error
    (nothing written) for an unquantizable checkpoint, e.g. an expert whose `in` is not a
    multiple of 32."""
    ckpt = Checkpoint.open(src)
    model_type = ckpt.config.get("model_type")
    if quant_method_of(ckpt.config) is not None:
        raise Mxfp4Error(
            f"checkpoint {ckpt.dir} is already quantized ({quantization_config_of(ckpt.config)[0]} is set)"
        )
    if layout is None:
        layout = "gpt-oss" if model_type == "gpt_oss" else "compressed-tensors"
    if layout not in LAYOUTS:
        raise Mxfp4Error(f"unknown MXFP4 layout {layout!r} (choose one of {', '.join(LAYOUTS)})")

    per_expert = {n: i for n, i in ckpt.tensors.items() if PER_EXPERT.fullmatch(n)}
    fused = {n: i for n, i in ckpt.tensors.items() if GPT_OSS_EXPERT.fullmatch(n)}
    if layout == "gpt-oss":
        if model_type != "gpt_oss" or not fused:
            raise Mxfp4Error(
                f"--layout gpt-oss is for gpt_oss checkpoints (fused "
                f"'...mlp.experts.gate_up_proj' / 'down_proj'); {ckpt.dir} has "
                f"model_type {model_type!r}: use --layout compressed-tensors"
            )
        experts = fused
    else:
        if not per_expert:
            hint = ": it is a gpt_oss checkpoint, use --layout gpt-oss" if fused else ""
            raise Mxfp4Error(
                f"--layout compressed-tensors needs per-expert weights "
                f"'...mlp.experts.<e>.{{gate,up,down}}_proj.weight' or "
                f"'...block_sparse_moe.experts.<e>.{{w1,w2,w3}}.weight', none found in "
                f"{ckpt.dir}{hint}"
            )
        experts = per_expert

    in_axis = 1  # gpt_oss [E, in, out], per expert [out, in]
    for name, info in experts.items():  # every check before anything is written
        if info.dtype not in FLOAT_DTYPES:
            raise Mxfp4Error(
                f"tensor {name} in {info.file}: dtype {info.dtype} cannot be "
                f"quantized (expected one of {sorted(FLOAT_DTYPES)})"
            )
        want_rank = 3 if layout == "gpt-oss" else 2
        if len(info.shape) != want_rank:
            raise Mxfp4Error(f"tensor {name} in {info.file}: shape {info.shape}, expected rank {want_rank}")
        if info.shape[in_axis] % BLOCK:
            raise Mxfp4Error(
                f"tensor {name} in {info.file}: shape {info.shape}: its input "
                f"dimension {info.shape[in_axis]} is not a multiple of {BLOCK}, so "
                f"it cannot be quantized to MXFP4"
            )

    plans: dict[Path, Plan] = {}
    for name, info in ckpt.tensors.items():
        plan = plans.setdefault(info.file, {})
        if name not in experts:
            plan[name] = _copy(name)
        elif layout == "gpt-oss":
            blocks, scales = gpt_oss_names(name)
            plan[blocks], plan[scales] = _gpt_oss_quantized(name)
        else:
            packed, scales = compressed_tensors_names(PER_EXPERT.fullmatch(name)["module"])
            plan[packed], plan[scales] = _ct_quantized(name)

    if layout == "gpt-oss":
        qconfig = gpt_oss_quantization_config()
    else:
        # compressed-tensors quantizes every Linear not ignored: list the others by module name
        # (2-D weights that are not routed experts and not embeddings), as compressed-tensors does.
        ignore = sorted(
            n.removesuffix(".weight")
            for n, i in ckpt.tensors.items()
            if n.endswith(".weight") and n not in experts and len(i.shape) == 2 and "embed_tokens" not in n
        )
        qconfig = compressed_tensors_quantization_config(ignore)
    config = dict(ckpt.config, quantization_config=qconfig)
    return _write(ckpt, Path(dst), plans, config)


def _copy(name: str):
    return lambda r: r.get(name)


def _float32(r: _Reader, name: str) -> np.ndarray:
    return r.get(name).to(torch.float32).numpy()


def _shared(compute):
    """Two plan entries (packed/blocks, scales) computed by one `compute(reader) -> (a, b)`."""
    cache = {}

    def part(i):
        def get(r):
            if "v" not in cache:
                cache["v"] = compute(r)
            value = cache["v"][i]
            if i == 1:  # the scales come second in the plan: the pair is done
                cache.clear()
            return torch.from_numpy(value)

        return get

    return part(0), part(1)


def _ct_quantized(name: str):
    """[out, in] -> (packed [out, in/2], scales [out, in/32])."""
    return _shared(lambda r: quantize(_float32(r, name), name))


def _gpt_oss_quantized(name: str):
    """[E, in, out] -> (blocks [E, out, in/32, 16], scales [E, out, in/32])."""

    def compute(r):
        w = np.ascontiguousarray(_float32(r, name).transpose(0, 2, 1))  # [E, out, in]
        packed, scales = quantize(w, name)
        return packed_to_gpt_oss_blocks(packed), scales

    return _shared(compute)


# --- dequantize ------------------------------------------------------------------------------


def dequantize_checkpoint(src: str | Path, dst: str | Path) -> Path:
    """Write `dst`: MXFP4 checkpoint `src` (gpt-oss or compressed-tensors layout) with its
    experts dequantized to float32 in the unquantized transformers layout (gpt-oss: `<proj>`
    [E, in, out]; per expert: `<module>.weight` [out, in]) and no quantization_config; all other
    tensors unchanged. Returns `dst`."""
    ckpt = Checkpoint.open(src)
    method = quant_method_of(ckpt.config)
    if method is None:
        raise Mxfp4Error(f"checkpoint {ckpt.dir} has no quantization_config: nothing to dequantize")
    pattern, partner = (
        (GPT_OSS_BLOCKS, lambda m: gpt_oss_names(m["proj"]))
        if method == "mxfp4"
        else (CT_PACKED, lambda m: compressed_tensors_names(m["module"]))
    )

    pairs = {}  # packed name -> (scales name, output name)
    for name in ckpt.tensors:
        m = pattern.fullmatch(name)
        if m is None:
            continue
        packed, scales = partner(m)
        if scales not in ckpt.tensors:
            raise Mxfp4Error(
                f"MXFP4 tensor {packed} in {ckpt.tensors[packed].file} has no scales {scales} in checkpoint {ckpt.dir}"
            )
        p, s = ckpt.tensors[packed], ckpt.tensors[scales]
        if p.dtype != "U8" or s.dtype != "U8":
            raise Mxfp4Error(f"MXFP4 tensors {packed} ({p.dtype}) and {scales} ({s.dtype}) must both be U8")
        k = check_pair(packed, p.shape, scales, s.shape)
        out = m["proj"] if method == "mxfp4" else f"{m['module']}.weight"
        shape_name = f"{m['module']}.weight_shape" if method != "mxfp4" else None
        pairs[packed] = (scales, out, shape_name, k)
    if not pairs:
        raise Mxfp4Error(
            f"checkpoint {ckpt.dir} declares {method} quantization but holds no MXFP4 tensor ({pattern.pattern})"
        )
    partners = {s for s, *_ in pairs.values()} | {n for _, _, n, _ in pairs.values() if n}

    plans: dict[Path, Plan] = {}
    for name, info in ckpt.tensors.items():
        plan = plans.setdefault(info.file, {})
        if name in pairs:
            scales, out, _, _ = pairs[name]
            plan[out] = _dequantized(name, scales, gpt_oss=method == "mxfp4")
        elif name not in partners:
            plan[name] = _copy(name)

    config = dict(ckpt.config)
    field, _ = quantization_config_of(config)
    if field == "quantization_config":
        config.pop("quantization_config")
    else:
        config["text_config"] = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
    return _write(ckpt, Path(dst), plans, config)


def _dequantized(packed: str, scales: str, gpt_oss: bool):
    def make(r):
        p, s = r.get(packed).numpy(), r.get(scales).numpy()
        if gpt_oss:  # blocks [E, out, in/32, 16] -> [E, out, in] -> transformers' [E, in, out]
            w = dequantize(gpt_oss_blocks_to_packed(p), s, packed).transpose(0, 2, 1)
        else:  # [out, in/2] -> [out, in]
            w = dequantize(p, s, packed)
        return torch.from_numpy(np.ascontiguousarray(w))

    return make


# --- writing ---------------------------------------------------------------------------------


class _Reader:
    """Reads tensors by name from the checkpoint's shards, keeping the files it opened open."""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt, self.open = ckpt, {}

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        f = self.ckpt.info(name).file
        if f not in self.open:
            self.open[f] = safe_open(str(f), "pt")
        return self.open[f].get_tensor(name)


def _write(ckpt: Checkpoint, dst: Path, plans: dict[Path, Plan], config: dict) -> Path:
    """Write the shards of `plans` (one output shard per source shard, same file name), an
    index when there are several, config.json and the sidecars, atomically at `dst`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if dst.resolve() == ckpt.dir.resolve():
        raise Mxfp4Error(f"output directory {dst} is the source checkpoint; choose another -o")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise Mxfp4Error(f"output {dst} already exists and is not an empty directory; remove it or choose another -o")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        reader = _Reader(ckpt)
        weight_map, total = {}, 0
        for src_file in ckpt.files:  # one shard at a time: memory is one shard's tensors
            plan = plans.get(src_file, {})
            if not plan and len(ckpt.files) > 1:
                continue  # a shard that held only scales whose pairs were written elsewhere
            with safe_open(str(src_file), "pt") as f:
                metadata = f.metadata() or {"format": "pt"}
            tensors = {name: make(reader).contiguous() for name, make in plan.items()}
            save_file(tensors, str(tmp / src_file.name), metadata=metadata)
            for name, t in tensors.items():
                weight_map[name] = src_file.name
                total += t.numel() * t.element_size()
            del tensors
            reader.open.pop(src_file, None)
        if len(ckpt.files) > 1 or (ckpt.dir / INDEX_NAME).exists():
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name in SIDECARS:
            if (ckpt.dir / name).is_file():
                shutil.copyfile(ckpt.dir / name, tmp / name)
        make_readable(tmp)
        os.replace(tmp, dst)  # atomic; dst is absent or an empty directory
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst
