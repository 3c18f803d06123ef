"""Shared fixtures: tiny deepseek_v32 checkpoints written by transformers, each compiled once per
test run (session scope) so the suite stays inside its time budget."""

import os
from pathlib import Path

import pytest
import torch

# Parity configs: tie-free indexer selection (see models/demo_checkpoint.py), top-k smaller than
# the test sequences, sequences longer than one DSA tile, one checkpoint in several shards.
PARITY = {
    # index_topk 8 < prompt 20: every query past position 8 attends sparsely; K = one tile.
    "sparse": dict(config=dict(index_topk=8, num_hidden_layers=2), seed=1, shard=None, tile=64,
                   max_seq_len=64, prompt=20, tokenizer=False),
    # K = 24 in tiles of 8: three tiles per query, prompt 40 > K.
    "tiles": dict(config=dict(index_topk=24, num_hidden_layers=2, hidden_size=48), seed=4, shard=None,
                  tile=8, max_seq_len=96, prompt=40),
    # three layers (two MoE), group-limited routing over 4 groups, five-plus shards.
    "sharded": dict(config=dict(index_topk=12, num_hidden_layers=3, n_group=4, topk_group=2,
                                n_routed_experts=8, num_experts_per_tok=3), seed=3,
                    shard="40KB", tile=4, max_seq_len=64, prompt=24),
}
DECODE_STEPS = 16


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("day0")


def _checkpoint(workdir: Path, name: str) -> Path:
    from day0.models.demo_checkpoint import tiny_deepseek_v32_config, write_tiny_checkpoint

    spec = PARITY[name]
    path = workdir / f"ckpt-{name}"
    if not path.exists():
        write_tiny_checkpoint(path, tiny_deepseek_v32_config(**spec["config"]), spec["seed"],
                              max_shard_size=spec["shard"], tokenizer=spec.get("tokenizer", True))
    return path


def _artifact(workdir: Path, name: str) -> Path:
    from day0.lowering.build import BuildOptions, compile_checkpoint

    spec = PARITY[name]
    path = workdir / f"artifact-{name}"
    if not path.exists():
        compile_checkpoint(_checkpoint(workdir, name), path,
                           BuildOptions(max_seq_len=spec["max_seq_len"], dsa_tile=spec["tile"]),
                           progress=lambda stage, event: None)
    return path


@pytest.fixture(scope="session")
def checkpoint(workdir):
    return lambda name: _checkpoint(workdir, name)


@pytest.fixture(scope="session")
def artifact(workdir):
    return lambda name: _artifact(workdir, name)


@pytest.fixture(scope="session")
def reference():
    """transformers' DeepseekV32ForCausalLM loaded from a checkpoint dir, float32, eval."""
    cache = {}

    def load(path: Path):
        from transformers import DeepseekV32ForCausalLM

        if path not in cache:
            cache[path] = DeepseekV32ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return cache[path]

    return load


def sequence(name: str, vocab: int) -> torch.Tensor:
    """The test token sequence of a parity config: prompt + DECODE_STEPS tokens, seeded."""
    g = torch.Generator().manual_seed(100 + len(name))
    return torch.randint(0, vocab, (PARITY[name]["prompt"] + DECODE_STEPS,), generator=g)


def rel_err(got, want) -> float:
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    return ((got - want).abs().max() / want.abs().max()).item()


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
