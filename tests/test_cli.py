"""The `day0` command line end to end on the default model: compile with --dump-stages,
generate from text and from ids, inspect."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEMO_MAX_SEQ_LEN

DAY0 = str(Path(sys.executable).parent / "day0")


def run(*args, check=True):
    r = subprocess.run([DAY0, *map(str, args)], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def demo(demo_cli):
    """(checkpoint, artifact, compile output): conftest's demo_cli, compiled once a run."""
    return demo_cli


def test_compile_shows_stages_and_dumps_ir(demo):
    _, artifact, r = demo
    for i, stage in enumerate(["read", "export", "passes", "compile", "publish"], start=1):
        assert f"[{i}/5] {stage} done in" in r.stderr
    stages = artifact / "stages"
    names = sorted(p.name for p in stages.glob("*.mlir"))
    assert names == [
        "00-export.mlir",
        "01-parameters-to-globals.mlir",
        "02-hoist-parameter-stacks.mlir",
        "03-topk-to-linalg-ext.mlir",
        "04-fuse-mxfp4-matmul.mlir",
        "05-dsa-to-gather-tiles.mlir",
    ]
    assert "torch.day0.dsa_attention" in (stages / "00-export.mlir").read_text()
    assert "torch.day0.dsa_attention" not in (stages / "05-dsa-to-gather-tiles.mlir").read_text()
    assert len(list((stages / "iree" / "phases").glob("*.mlir"))) >= 10


def test_artifact_holds_no_weights(demo):
    ckpt, artifact, _ = demo
    manifest = json.loads((artifact / "manifest.json").read_text())
    from day0.models.checkpoint import Checkpoint

    vmfb = (artifact / "model.vmfb").read_bytes()
    ckpt_index = Checkpoint.open(ckpt)
    for name in ("model.embed_tokens.weight", "model.layers.1.mlp.experts.0.up_proj.weight_packed"):  # (MXFP4)
        info = ckpt_index.info(name)
        with open(info.file, "rb") as f:
            f.seek(info.data_offsets[0])
            assert f.read(256) not in vmfb, f"{name}'s bytes are inside the vmfb"
    assert {f["path"] for f in manifest["parameters"]["files"]} == {p.name for p in ckpt.glob("*.safetensors")}


def test_generate_text_greedy_is_deterministic(demo):
    _, artifact, _ = demo
    a = run("generate", artifact, "--prompt", "Hello, day0", "--max-new-tokens", "8").stdout
    b = run("generate", artifact, "--prompt", "Hello, day0", "--max-new-tokens", "8").stdout
    assert a == b and a.startswith("Hello, day0")


def test_generate_ids_with_sampling_seed(demo):
    _, artifact, _ = demo
    args = (
        "generate",
        artifact,
        "--prompt-ids",
        "72,101,108",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.9",
        "--top-k",
        "20",
        "--top-p",
        "0.95",
    )
    a = run(*args, "--seed", "1").stdout.strip().split(",")
    assert a == run(*args, "--seed", "1").stdout.strip().split(",")
    assert 1 <= len(a) <= 6 and all(0 <= int(t) < 2048 for t in a)


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed": 1}, {"temperature": 1.2, "seed": 7}]
)
def test_generate_on_a_paged_artifact_gives_what_session_gives(demo, sampling):
    """The demo artifact has paged entry points, so `generate` runs one request through an Engine
    sized to it (tools/cli.py _generate_paged): the tokens are Session.generate's, greedy and
    seeded sampling alike."""
    from day0.runtime.session import Session

    _, artifact, _ = demo
    ids = [72, 101, 108, 32, 44]
    want = Session.load(artifact).generate(ids, max_new_tokens=12, **sampling)
    flags = [x for k, v in sampling.items() for x in (f"--{k.replace('_', '-')}", v)]
    out = run("generate", artifact, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", 12, *flags).stdout
    assert [int(t) for t in out.strip().split(",")] == want


def test_generate_rejects_bad_values(demo):
    _, artifact, _ = demo
    r = run("generate", artifact, "--prompt-ids", "1,2", "--top-p", "0", check=False)
    assert r.returncode == 2 and "top_p" in r.stderr and "Traceback" not in r.stderr
    r = run("generate", artifact, "--prompt-ids", "1,x", check=False)
    assert r.returncode == 2 and "--prompt-ids" in r.stderr
    r = run("generate", artifact, "--prompt", "x" * (4 * DEMO_MAX_SEQ_LEN), check=False)
    assert r.returncode == 2 and f"max_seq_len {DEMO_MAX_SEQ_LEN}" in r.stderr


def test_inspect(demo):
    _, artifact, _ = demo
    info = json.loads(run("inspect", artifact, "--json").stdout)
    assert info["architecture"] == "deepseek_v32" and info["max_seq_len"] == DEMO_MAX_SEQ_LEN
    assert info["device_count"] == 1 and info["device_bytes"] == []  # one device holds it all
    cfg = json.loads((demo[0] / "config.json").read_text())
    row = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]  # the latent and its rope part
    assert info["state"]["kv_cache.0"] == [DEMO_MAX_SEQ_LEN, row]
    layers = sum(1 for name in info["state"] if name.startswith("kv_cache."))
    assert layers == cfg["num_hidden_layers"]
    assert info["state_bytes"] == {
        "mla_latent": layers * DEMO_MAX_SEQ_LEN * row * 4,
        "indexer_keys": 4 * sum(DEMO_MAX_SEQ_LEN * info["state"][f"index_cache.{i}"][1] for i in range(layers)),
    }
    assert info["parameters"]["count"] > 0


def test_prompt_without_tokenizer(artifact):
    art = artifact("ds-sparse")  # its checkpoint has no tokenizer.json
    assert not (art / "tokenizer.json").exists()
    r = run("generate", art, "--prompt", "hi", check=False)
    assert r.returncode == 2 and "--prompt-ids" in r.stderr


def test_compile_passes_flags_after_double_dash_to_iree_compile():
    from day0.tools.cli import parse_args

    a = parse_args(
        [
            "compile",
            "ckpt",
            "-o",
            "out",
            "--target",
            "cuda-sm90",
            "--",
            "--iree-hal-indirect-command-buffers=false",
            "--mlir-timing",
        ]
    )
    assert (a.checkpoint, a.output, a.target) == ("ckpt", "out", "cuda-sm90")
    assert a.iree_flags == ["--iree-hal-indirect-command-buffers=false", "--mlir-timing"]
    assert parse_args(["compile", "ckpt", "-o", "out"]).iree_flags == []
