"""What the seeded tiny-checkpoint writers share: a float32 transformers config, a model initialized
from a seed with the writer's init tweaks applied, and writing it with save_pretrained (safetensors,
the checkpoint's own tensor names)."""

from __future__ import annotations

from pathlib import Path

import torch


def float32_config(config_cls, **fields):
    """`config_cls(**fields)` with its dtype set to float32."""
    config = config_cls(**fields)
    config.dtype = torch.float32
    return config


def seeded_model(model_cls, config, seed: int, tweak):
    """`model_cls(config)` in float32 and eval mode, initialized from `seed`, then `tweak(model)`
    (the init changes a tiny checkpoint needs), leaving the caller's RNG state alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32).eval()
        tweak(model)
    return model


def write_seeded(path, model_cls, config, seed: int, tweak, **save_kwargs) -> Path:
    """Write `seeded_model(model_cls, config, seed, tweak)` to the directory `path` with
    `save_pretrained` (safetensors; `save_kwargs` such as max_shard_size go to it)."""
    path = Path(path)
    seeded_model(model_cls, config, seed, tweak).save_pretrained(path, safe_serialization=True, **save_kwargs)
    return path
