"""The end-to-end benchmark checkpoint: a `deepseek_v32` configuration of 4.9B parameters (64 routed
experts top-8 in MXFP4, compressed-tensors layout; results in docs/perf.md, section 'End to end: the
4.9B `deepseek_v32` benchmark model') with random weights generated from a seed, byte for byte the
same on every machine.

The compile machine writes it to compile against (the artifact records the shards' hashes); the
GPU host, which cannot receive gigabytes, writes the same bytes from the same seed. Every tensor
has its own generator (seed, tensor index), so the bytes do not depend on the writing order, and
the writer streams one tensor at a time (memory: one chunk, not the checkpoint).

Values: 2-D float weights N(0, 0.02) in bf16 (what transformers' init draws); 1-D float tensors
(norm weights, biases) 1 and 0 in f32; MXFP4 codes uniform bytes with scale exponents 2^-8..2^-6
(element std about 0.02). The indexer and router get the demo checkpoint's tie breakers
(tools/checkpoints/demo.py): without them ReLU-zero indexer scores and equal router scores tie, and
which tied position wins is an implementation detail that would decide the comparisons.

    python -m day0.tools.bench.bench_checkpoint OUT [--config e2e|tiny] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from day0.tools.bench.deepseek_v32_configs import CONFIGS as _DEEPSEEK_V32

# The e2e benchmark model and its tiny CPU test (tests/test_bench_gpu.py), from the table of the
# deepseek_v32 benchmark models; transformers' defaults for everything they do not name.
CONFIGS = {name: _DEEPSEEK_V32[name] for name in ("e2e", "tiny")}
SHARD_BYTES = 1 << 30
CHUNK = 1 << 26  # elements generated at a time
_DTYPES = {"bf16": "BF16", "f32": "F32", "u8": "U8"}


def raw_config(name: str) -> tuple[dict, list]:
    """config.json of a benchmark config (transformers' DeepseekV32Config with compressed-tensors
    MXFP4 quantization of every Linear except the ones listed: all but the routed experts), and
    its checkpoint tensors (`_tensors`)."""
    import transformers

    from day0.models.mxfp4 import compressed_tensors_quantization_config

    raw = transformers.DeepseekV32Config(**CONFIGS[name]).to_dict()
    raw.pop("transformers_version", None)
    raw.pop("_name_or_path", None)
    raw["architectures"] = ["DeepseekV32ForCausalLM"]
    tensors = _tensors(dict(raw, quantization_config=compressed_tensors_quantization_config()))
    ignore = sorted(
        n.removesuffix(".weight")
        for n, (shape, kind) in tensors
        if n.endswith(".weight") and kind == "bf16" and len(shape) == 2 and "embed_tokens" not in n
    )
    raw["quantization_config"] = compressed_tensors_quantization_config(ignore)
    return raw, tensors  # (the ignore list changes no tensor)


def _tensors(raw: dict) -> list[tuple[str, tuple[tuple[int, ...], str]]]:
    """(name, (shape, kind)) of every checkpoint tensor, from day0's module tree (which mirrors
    the checkpoint's names); kind: bf16 (2-D float), f32 (1-D float) or u8 (MXFP4 bytes)."""
    import torch

    from day0.models.registry import architecture

    cfg, model_cls = architecture(raw)
    with torch.device("meta"):
        model = model_cls(cfg, 2)
    out = []
    for n, p in model.named_parameters():
        kind = "u8" if p.dtype == torch.uint8 else ("bf16" if p.dim() >= 2 else "f32")
        out.append((n, (tuple(p.shape), kind)))
    return out


def _generate(name: str, index: int, shape, kind: str, seed: int, fh) -> None:
    """Write the tensor's bytes to fh, chunk by chunk."""
    import ml_dtypes

    from day0.tools.checkpoints.demo import INDEXER_K_NORM_BIAS, INDEXER_WEIGHT_SCALE, ROUTER_BIAS_STD

    rng = np.random.default_rng([seed, index])
    n = int(np.prod(shape))
    if kind == "f32":
        if name.endswith("e_score_correction_bias"):
            fh.write((rng.standard_normal(n, dtype=np.float32) * np.float32(ROUTER_BIAS_STD)).tobytes())
        else:
            value = (
                1.0
                if name.endswith(("norm.weight", "norm1.weight", "norm2.weight"))
                else INDEXER_K_NORM_BIAS
                if name.endswith("indexer.k_norm.bias")
                else 0.0
            )
            fh.write(np.full(n, value, dtype="<f4").tobytes())
        return
    std = np.float32(
        0.02 * (INDEXER_WEIGHT_SCALE if name.endswith(("indexer.wq_b.weight", "indexer.weights_proj.weight")) else 1)
    )
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        if kind == "bf16":
            fh.write((rng.standard_normal(m, dtype=np.float32) * std).astype(ml_dtypes.bfloat16).tobytes())
        elif name.endswith("weight_scale"):
            fh.write(rng.integers(119, 122, m, dtype=np.uint8).tobytes())  # 2^-8 .. 2^-6
        else:
            fh.write(rng.integers(0, 256, m, dtype=np.uint8).tobytes())


def _nbytes(shape, kind: str) -> int:
    return int(np.prod(shape)) * {"bf16": 2, "f32": 4, "u8": 1}[kind]


def write(out: Path, config: str = "e2e", seed: int = 0, spec: tuple[dict, list] | None = None) -> Path:
    """Write the checkpoint directory atomically (complete, or absent). An existing complete one
    written with the same config and seed is kept. `spec`: (config.json, _tensors' list) of a
    checkpoint not in CONFIGS, named `config` (tools/bench/bench_gpu_vision.py)."""
    out = Path(out)
    stamp = {"config": config, "seed": seed, "values": 2}  # values: bump when the generator changes
    done = out / "day0-bench.json"
    if done.is_file() and json.loads(done.read_text()) == stamp:
        return out
    if out.exists():
        shutil.rmtree(out)
    raw, tensors = spec if spec is not None else raw_config(config)
    shards: list[list[tuple[int, str, tuple, str]]] = [[]]
    size = 0
    for i, (name, (shape, kind)) in enumerate(tensors):
        b = _nbytes(shape, kind)
        if shards[-1] and size + b > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((i, name, shape, kind))
        size += b
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        weight_map = {}
        for s, members in enumerate(shards):
            fname = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
            header, offset = {"__metadata__": {"format": "pt"}}, 0
            for _, name, shape, kind in members:
                b = _nbytes(shape, kind)
                header[name] = {"dtype": _DTYPES[kind], "shape": list(shape), "data_offsets": [offset, offset + b]}
                offset += b
                weight_map[name] = fname
            text = json.dumps(header, separators=(",", ":")).encode()
            text += b" " * (-len(text) % 8)
            with open(tmp / fname, "wb") as fh:
                fh.write(len(text).to_bytes(8, "little"))
                fh.write(text)
                for i, name, shape, kind in members:
                    _generate(name, i, shape, kind, seed, fh)
        total = sum(_nbytes(shape, kind) for _, (shape, kind) in tensors)
        (tmp / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
        )
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        (tmp / "day0-bench.json").write_text(json.dumps(stamp) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide it from other users of a shared host
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-bench-checkpoint")
    p.add_argument("out")
    p.add_argument("--config", default="e2e", choices=sorted(CONFIGS))
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(f"wrote {write(Path(a.out), a.config, a.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
