"""Shared fixtures: the parity checkpoints (tests/parity_configs.py) written once per run, each
compiled once per run (session scope), and transformers' oracle for each, loaded once."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from parity_configs import PARITY, load_reference, write_checkpoint  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("day0")


@pytest.fixture(scope="session")
def checkpoint(workdir):
    return lambda name: write_checkpoint(workdir, name)


@pytest.fixture(scope="session")
def artifact(workdir):
    from day0.lowering.driver import BuildOptions, compile_checkpoint

    def get(name: str) -> Path:
        spec, path = PARITY[name], workdir / f"artifact-{name}"
        if not path.exists():
            compile_checkpoint(
                write_checkpoint(workdir, name),
                path,
                BuildOptions(
                    max_seq_len=spec["max_seq_len"],
                    dsa_tile=spec.get("tile", 64),
                    prefill_chunk=spec.get("prefill_chunk"),
                    max_batch=spec.get("max_batch", 0),
                    block_size=spec.get("block_size", 64),
                ),
                progress=lambda stage, event: None,
            )
        return path

    return get


@pytest.fixture(scope="session")
def reference(workdir):
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_reference(workdir, name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def demo_engine_artifact(workdir) -> Path:
    """The demo checkpoint (tokenizer and chat template included) compiled once for the Engine:
    batched decode for up to 4 sequences, 256 positions; what `day0 serve` tests run."""
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.tools.checkpoints.demo import ensure_demo_checkpoint

    path = workdir / "artifact-demo-engine"
    if not path.exists():
        ckpt = ensure_demo_checkpoint(workdir / "demo-checkpoint")
        compile_checkpoint(ckpt, path, BuildOptions(max_seq_len=256, max_batch=4), progress=lambda s, e: None)
    return path
