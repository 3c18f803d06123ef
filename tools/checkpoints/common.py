"""What the seeded tiny-checkpoint writers share: a float32 transformers config from a base table
plus overrides, a model initialized from a seed with the writer's post-init changes applied (a
table per writer, `apply_inits`), and writing it with save_pretrained (safetensors, the
checkpoint's own tensor names)."""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path

import torch


def _transformers_class(cls):
    """`cls`, or the transformers class of that name (transformers is imported only then, so the
    writers' modules import without it)."""
    if isinstance(cls, str):
        import transformers

        return getattr(transformers, cls)
    return cls


def float32_config(config_cls, **fields):
    """`config_cls(**fields)` (a class or its transformers name) with its dtype set to float32."""
    config = _transformers_class(config_cls)(**fields)
    config.dtype = torch.float32
    return config


def tiny_config(config_cls, base: dict, overrides: dict):
    """A float32 `config_cls` (a class or its transformers name) from the writer's `base` fields
    with `overrides` applied."""
    return float32_config(config_cls, **{**base, **overrides})


@torch.no_grad()
def apply_inits(model, inits: dict[str, dict[str, tuple]]) -> None:
    """The post-init changes a tiny checkpoint needs, as a table: module class name -> {parameter
    or buffer path within the module: (in-place torch.Tensor method, *its arguments)}, e.g.
    {"GptOssAttention": {"sinks": ("normal_", 0.0, 1.0)}}. Applied in `model.modules()` order,
    each module's entries in table order, so the random draws follow one fixed sequence."""
    for module in model.modules():
        for name, (method, *args) in inits.get(type(module).__name__, {}).items():
            getattr(attrgetter(name)(module), method)(*args)


def seeded_model(model_cls, config, seed: int, inits: dict):
    """`model_cls(config)` in float32 and eval mode, initialized from `seed`, then `inits` applied
    (`apply_inits`), leaving the caller's RNG state alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32).eval()
        apply_inits(model, inits)
    return model


def write_seeded(path, model_cls, config, seed: int, inits: dict, **save_kwargs) -> Path:
    """Write `seeded_model(model_cls, config, seed, inits)` to the directory `path` with
    `save_pretrained` (safetensors; `save_kwargs` such as max_shard_size go to it); `model_cls`
    may be given by its name in transformers."""
    path = Path(path)
    seeded_model(_transformers_class(model_cls), config, seed, inits).save_pretrained(
        path, safe_serialization=True, **save_kwargs
    )
    return path
