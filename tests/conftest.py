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
def demo_cli(workdir):
    """The demo checkpoint compiled once through the CLI, as a user would: `day0 compile CKPT -o ART
    --max-seq-len 128 --max-batch 4 --dump-stages` (dense and paged entry points, batched decode
    for up to 4 sequences). (checkpoint, artifact, the compile's CompletedProcess); test_cli reads
    its output and stages, the server tests serve it."""
    import subprocess

    from day0.tools.checkpoints.demo import ensure_demo_checkpoint

    ckpt, art = ensure_demo_checkpoint(workdir / "demo-checkpoint"), workdir / "artifact-demo"
    day0 = str(Path(sys.executable).parent / "day0")
    args = [day0, "compile", str(ckpt), "-o", str(art), "--max-seq-len", "128", "--max-batch", "4", "--dump-stages"]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return ckpt, art, r


@pytest.fixture(scope="session")
def demo_engine_artifact(demo_cli) -> Path:
    """The demo artifact (tokenizer and chat template included, 128 positions, batched decode for
    up to 4 sequences) that `day0 serve` tests run."""
    return demo_cli[1]
