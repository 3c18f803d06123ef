"""Shared fixtures: the parity checkpoints (tests/parity_configs.py) written once per run, each
compiled once per run, and transformers' oracle for each, loaded once a process.

`make test` runs pytest with two pytest-xdist workers, test by test (`--dist load`: 20:30 on the
2-core machine with nothing else running; pytest 9.2 with xdist 3.8 does not honour
`xdist_group` marks, and a third worker only made it slower): the checkpoints and artifacts live in
one directory for the whole run (`workdir`), and a file lock per item makes a worker that needs one
the other is making wait for it, so that each is still made once a run."""

import os
import sys
import types
from pathlib import Path

import pytest
from filelock import FileLock

sys.path.insert(0, str(Path(__file__).parent))
from parity_configs import PARITY, load_reference, write_checkpoint  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory, worker_id) -> Path:
    """One directory for every worker of this run (the workers' base temp dirs share a parent)."""
    base = tmp_path_factory.getbasetemp()
    path = (base if worker_id == "master" else base.parent) / "day0-shared"
    path.mkdir(exist_ok=True)
    return path


def once(workdir: Path, name: str):
    """The lock that makes `name` (a checkpoint, an artifact) made once for all workers."""
    return FileLock(str(workdir / f".{name}.fixture-lock"))  # .NAME.lock is the compile driver's


def shared_checkpoint(workdir: Path, name: str) -> Path:
    with once(workdir, f"ckpt-{name}"):
        return write_checkpoint(workdir, name)


@pytest.fixture(scope="session")
def checkpoint(workdir):
    return lambda name: shared_checkpoint(workdir, name)


@pytest.fixture(scope="session")
def artifact(workdir):
    from day0.lowering.driver import BuildOptions, compile_checkpoint

    def get(name: str) -> Path:
        spec, path = PARITY[name], workdir / f"artifact-{name}"
        with once(workdir, path.name):
            if path.exists():
                return path
            compile_checkpoint(
                shared_checkpoint(workdir, name),
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


CUDA_MAX_SEQ_LEN = 64


@pytest.fixture(scope="session")
def cuda_artifact(workdir):
    """A parity checkpoint compiled once a run for cuda-sm90 (max_seq_len 64; compiled only, CI
    has no GPU), with its stages dumped (IREE's flow phase: the launches of a step): the artifact
    and the compile's progress events, (stage, event) pairs."""
    import json

    from day0.lowering.driver import BuildOptions, compile_checkpoint

    def get(name: str) -> tuple[Path, list]:
        path = workdir / f"artifact-{name}-cuda"
        events = workdir / f"artifact-{name}-cuda.events.json"
        with once(workdir, path.name):
            if not path.exists():
                notes = []
                options = BuildOptions(target="cuda-sm90", max_seq_len=CUDA_MAX_SEQ_LEN, dump_stages=True)
                compile_checkpoint(shared_checkpoint(workdir, name), path, options, progress=lambda *e: notes.append(e))
                events.write_text(json.dumps(notes))
        return path, [tuple(e) for e in json.loads(events.read_text())]

    return get


LONG, LONG_BLOCK = 65536, 16  # the long artifacts' max_seq_len and block size


@pytest.fixture(scope="session")
def long_artifact(workdir):
    """A parity checkpoint compiled once a run with max_seq_len 65,536, blocks of 16 positions and
    batched decode for up to 3 sequences (tests/test_long_context.py)."""
    from day0.lowering.driver import BuildOptions, compile_checkpoint

    def get(name: str) -> Path:
        path = workdir / f"artifact-{name}-64k"
        with once(workdir, path.name):
            if not path.exists():
                options = BuildOptions(max_seq_len=LONG, max_batch=3, block_size=LONG_BLOCK)
                compile_checkpoint(shared_checkpoint(workdir, name), path, options, progress=lambda *_: None)
        return path

    return get


@pytest.fixture(scope="session")
def reference(workdir):
    cache = {}

    def get(name: str):
        if name not in cache:
            shared_checkpoint(workdir, name)
            cache[name] = load_reference(workdir, name)
        return cache[name]

    return get


DEMO_MAX_SEQ_LEN = 256  # demo_cli's positions


@pytest.fixture(scope="session")
def demo_cli(workdir):
    """The default model (tools/checkpoints/default.py, what `make demo` runs) compiled once through
    the CLI, as a user would: `day0 compile CKPT -o ART --max-seq-len 256 --max-batch 4
    --dump-stages` (dense and paged entry points, batched decode for up to 4 sequences).
    (checkpoint, artifact, the compile's CompletedProcess); test_cli reads its output and stages,
    the server tests serve it, test_default_model measures its perplexity (256 positions: its
    held-out windows)."""
    import subprocess

    from day0.tools.checkpoints.default import default_checkpoint

    art, log = workdir / "artifact-demo", workdir / "artifact-demo.stderr"
    with once(workdir, art.name):
        ckpt = default_checkpoint()
        if not art.exists():
            day0 = str(Path(sys.executable).parent / "day0")
            args = [
                day0,
                "compile",
                ckpt,
                "-o",
                art,
                "--max-seq-len",
                str(DEMO_MAX_SEQ_LEN),
                "--max-batch",
                "4",
                "--dump-stages",
            ]
            r = subprocess.run(list(map(str, args)), capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            log.write_text(r.stderr)
    return ckpt, art, types.SimpleNamespace(returncode=0, stderr=log.read_text())


@pytest.fixture(scope="session")
def demo_engine_artifact(demo_cli) -> Path:
    """The default model's artifact (tokenizer and chat template included, 256 positions, batched
    decode for up to 4 sequences) that `day0 serve` tests run."""
    return demo_cli[1]


GLM5_VISION_SEED = 3
GLM5_VISION_MAX_SEQ_LEN = 128
GLM5_VISION_BUCKETS = (32,)  # image tokens; the artifact adds max_seq_len's 128


@pytest.fixture(scope="session")
def glm5_vision_checkpoint(workdir) -> Path:
    """A tiny glm5_next checkpoint with a vision tower (tools/checkpoints/glm5_next.py,
    vision=True, tokenizer=True, seed GLM5_VISION_SEED: a vocabulary of 326 with a tokenizer and a
    chat template that spells image parts) and its preprocessor_config.json, written once a run."""
    from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

    path = workdir / "ckpt-glm5-vision"
    with once(workdir, path.name):
        if not path.exists():
            write_tiny_glm5_next_checkpoint(path, seed=GLM5_VISION_SEED, vision=True, tokenizer=True)
    return path


@pytest.fixture(scope="session")
def glm5_vision_artifact(workdir, glm5_vision_checkpoint) -> Path:
    """glm5_vision_checkpoint compiled once a run for llvm-cpu (max_seq_len 128): the dense entry
    points with the vision tower at 32 and 128 image tokens (GLM5_VISION_BUCKETS, and the
    largest: fewer than the default's seven, to keep the compile short) and prefill_mm (Session),
    and the paged ones with paged_prefill_mm (Engine, batched decode for up to 2 sequences,
    blocks of 16)."""
    from day0.lowering.driver import BuildOptions, compile_checkpoint

    path = workdir / "artifact-glm5-vision"
    with once(workdir, path.name):
        if not path.exists():
            options = BuildOptions(
                max_seq_len=GLM5_VISION_MAX_SEQ_LEN, max_batch=2, block_size=16, image_buckets=GLM5_VISION_BUCKETS
            )
            compile_checkpoint(glm5_vision_checkpoint, path, options, progress=lambda *_: None)
    return path
