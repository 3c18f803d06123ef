"""Hardening of the compile path: every bad input is refused in one line naming the file, field or
argument, before any work where it can be, and no file of the user's is lost.

Config numbers are checked on the config dict (no checkpoint read, nothing compiled); the CLI cases
are refused before the read stage. One real compile (the smallest --max-seq-len, replacing an
artifact) and one compile stopped by SIGTERM in iree-compile are the only compiles here."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from day0.lowering.driver import MAX_MAX_SEQ_LEN, MIN_MAX_SEQ_LEN, BuildError, publish_replacing
from day0.models.checkpoint import Checkpoint, CheckpointError
from day0.models.config import ConfigError
from day0.models.registry import architecture

DAY0 = str(Path(sys.executable).parent / "day0")


def day0(*args, env=None):
    return subprocess.run([DAY0, *map(str, args)], capture_output=True, text=True, env=env)


def one_line_error(r, *names: str) -> str:
    """rc 2, no traceback, one stderr line `day0: error: ...` (besides the stage progress lines)
    naming each of names; returns it."""
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if not re.match(r"\[\d/5\] ", line)]
    assert len(lines) == 1 and lines[0].startswith("day0: error: "), r.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def _config(checkpoint, name: str) -> dict:
    return json.loads((checkpoint(name) / "config.json").read_text())


def _set(raw: dict, path: str, value) -> dict:
    d = raw
    *parents, last = path.split(".")
    for key in parents:
        d = d[key]
    d[last] = value
    return raw


# --- config numbers ----------------------------------------------------------------------------

BAD_NUMBERS = [
    # (parity config, field path in config.json, value, message)
    ("ds-sparse", "index_topk", 0, "must be an integer >= 1 (got 0)"),
    ("ds-sparse", "hidden_size", -64, "must be an integer >= 1 (got -64)"),
    ("ds-sparse", "num_hidden_layers", 0, "must be an integer >= 1 (got 0)"),
    ("ds-sparse", "vocab_size", 2**40, "must be at most 2147483647 (got 1099511627776)"),
    ("ds-sparse", "kv_lora_rank", 0, "must be an integer >= 1 (got 0)"),
    ("ds-sparse", "q_lora_rank", 0, "must be null or an integer >= 1 (got 0)"),
    ("ds-sparse", "qk_rope_head_dim", -2, "must be an integer >= 0 (got -2)"),
    ("ds-sparse", "n_shared_experts", -1, "must be an integer >= 0 (got -1)"),
    ("ds-sparse", "num_experts_per_tok", 0, "must be an integer >= 1 (got 0)"),
    ("ds-sparse", "moe_intermediate_size", 32.0, "must be an integer >= 1 (got 32.0)"),
    ("ds-sparse", "index_n_heads", "16", 'must be an integer >= 1 (got "16")'),
    ("ds-sparse", "index_head_dim", True, "must be an integer >= 1 (got true)"),
    ("ds-sparse", "rms_norm_eps", math.nan, "must be a finite number > 0 (got NaN)"),
    ("ds-sparse", "rms_norm_eps", 0.0, "must be a finite number > 0 (got 0.0)"),
    ("ds-sparse", "rope_parameters.rope_theta", -1.0, "must be a finite number > 0 (got -1.0)"),
    ("ds-sparse", "eos_token_id", -3, "must be null, a token id >= 0 or a list of them (got -3)"),
    ("oss-yarn", "rope_parameters.rope_theta", math.inf, "must be a finite number > 0 (got Infinity)"),
    ("oss-yarn", "rope_parameters.factor", 0.0, "must be a finite number > 0 (got 0.0)"),
    ("oss-yarn", "head_dim", 0, "must be null or an integer >= 1 (got 0)"),
    ("oss-yarn", "num_local_experts", 0, "must be an integer >= 1 (got 0)"),
    ("oss-yarn", "sliding_window", -8, "must be null or an integer >= 1 (got -8)"),
    ("oss-yarn", "swiglu_limit", 0.0, "must be a finite number > 0 (got 0.0)"),
    ("kl-hybrid", "linear_attn_config.num_heads", 0, "must be an integer >= 1 (got 0)"),
    ("kl-hybrid", "linear_attn_config.head_dim", 8.5, "must be an integer >= 1 (got 8.5)"),
    ("kl-hybrid", "linear_attn_config", [4], "must be a JSON object (got [4])"),
    ("kl-hybrid", "num_experts_per_token", 0, "must be an integer >= 1 (got 0)"),
    ("kl-hybrid", "num_experts", -8, "must be an integer >= 1 (got -8)"),
    ("kl-hybrid", "v_head_dim", None, "must be an integer >= 1 (got null)"),
    ("glm-base", "text_config.hidden_size", 0, "must be an integer >= 1 (got 0)"),
    ("glm-base", "text_config.index_topk", 0, "must be an integer >= 1 (got 0)"),
    ("glm-base", "text_config.hc_eps", math.nan, "must be a finite number > 0 (got NaN)"),
    ("glm-base", "text_config.linear_num_heads", 0, "must be an integer >= 1 (got 0)"),
    ("glm-base", "text_config.rms_norm_eps", -1e-5, "must be a finite number > 0 (got -1e-05)"),
    ("glm-base", "text_config", "none", 'must be a JSON object (got "none")'),
]


@pytest.mark.parametrize("name, path, value, why", BAD_NUMBERS, ids=[f"{c[0]}:{c[1]}={c[2]!r}" for c in BAD_NUMBERS])
def test_config_number_refused_naming_field(checkpoint, name, path, value, why):
    raw = _config(checkpoint, name)
    architecture(json.loads(json.dumps(raw)))  # the config as written works
    with pytest.raises(ConfigError) as e:
        architecture(_set(raw, path, value))
    assert str(e.value) == f"config.json: field '{path}': {why}"


def test_nested_object_fields_named_by_path(checkpoint):
    raw = _set(_config(checkpoint, "glm-base"), "text_config.linear_attn_config", {"num_heads": 0})
    with pytest.raises(ConfigError) as e:
        architecture(raw)
    assert (
        str(e.value) == "config.json: field 'text_config.linear_attn_config.num_heads': must be an integer >= 1 (got 0)"
    )


def test_real_configs_pass():
    """transformers' full-size default configs and the benchmark configs keep passing."""
    import transformers

    from day0.tools.bench.deepseek_v32_configs import CONFIGS
    from day0.tools.checkpoints.demo import tiny_deepseek_v32_config

    def raw(cfg, model_type):
        d = json.loads(cfg.to_json_string(use_diff=False))
        return {**d, "model_type": model_type}

    configs = [raw(transformers.DeepseekV32Config(**c), "deepseek_v32") for c in CONFIGS.values()]
    configs += [
        raw(tiny_deepseek_v32_config(), "deepseek_v32"),
        raw(transformers.DeepseekV32Config(), "deepseek_v32"),
        raw(transformers.GptOssConfig(), "gpt_oss"),
        raw(transformers.KimiLinearConfig(), "kimi_linear"),
        raw(transformers.Glm5NextConfig(), "glm5_next"),
    ]
    for c in configs:
        architecture(c)


def test_config_not_an_object():
    with pytest.raises(ConfigError, match=r"config.json: must be a JSON object \(got a JSON list\)"):
        architecture([1, 2])


def test_bad_config_number_refused_by_cli_before_reading_weights(checkpoint, tmp_path):
    ckpt = shutil.copytree(checkpoint("ds-sparse"), tmp_path / "ckpt")
    (ckpt / "config.json").write_text(json.dumps(_set(_config(checkpoint, "ds-sparse"), "index_topk", 0)))
    r = day0("compile", ckpt, "-o", tmp_path / "out")
    line = one_line_error(r, "config.json: field 'index_topk': must be an integer >= 1 (got 0)")
    assert line == "day0: error: config.json: field 'index_topk': must be an integer >= 1 (got 0)"
    assert not (tmp_path / "out").exists()


def test_non_utf8_config_refused_naming_file(checkpoint, tmp_path):
    ckpt = shutil.copytree(checkpoint("ds-sparse"), tmp_path / "ckpt")
    (ckpt / "config.json").write_bytes(b'{"model_type": "deepseek_v32", "name": "\xff\xfe"}')
    with pytest.raises(CheckpointError, match=rf"{ckpt / 'config.json'} is not UTF-8 text \(byte 0xFF at offset 40\)"):
        Checkpoint.open(ckpt)
    one_line_error(day0("compile", ckpt, "-o", tmp_path / "out"), str(ckpt / "config.json"), "UTF-8")


# --- the output directory ----------------------------------------------------------------------


def _refused_before_work(r, *names):
    one_line_error(r, *names)
    assert "[1/5] read" not in r.stderr  # refused before the checkpoint was read


def test_output_that_is_a_file_is_refused(checkpoint, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    _refused_before_work(day0("compile", checkpoint("ds-sparse"), "-o", target), str(target), "not a directory")
    assert target.read_text() == "mine"
    sub = target / "art"  # a file where a parent directory should be
    _refused_before_work(day0("compile", checkpoint("ds-sparse"), "-o", sub), str(target), "not a directory")
    assert target.read_text() == "mine"


def test_output_that_is_a_foreign_directory_is_refused(checkpoint, artifact, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    _refused_before_work(day0("compile", checkpoint("ds-sparse"), "-o", mine), str(mine), "not a day0 artifact")
    assert (mine / "thesis.tex").read_text() == "years of work"
    # a day0 artifact with a file day0 did not write in it is not replaced either
    art = shutil.copytree(artifact("ds-sparse"), tmp_path / "art")
    (art / "notes.txt").write_text("mine")
    _refused_before_work(day0("compile", checkpoint("ds-sparse"), "-o", art), str(art), "notes.txt")
    assert (art / "notes.txt").read_text() == "mine"
    # a manifest.json that day0 did not write does not make a directory an artifact
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "manifest.json").write_text('{"name": "my web app"}')
    _refused_before_work(day0("compile", checkpoint("ds-sparse"), "-o", fake), str(fake), "not a day0 artifact")
    assert (fake / "manifest.json").read_text() == '{"name": "my web app"}'


@pytest.mark.parametrize("value", [MIN_MAX_SEQ_LEN - 1, 10**12])
def test_max_seq_len_out_of_bounds_refused_before_work(checkpoint, tmp_path, value):
    r = day0("compile", checkpoint("ds-sparse"), "-o", tmp_path / "out", "--max-seq-len", value)
    _refused_before_work(r, "--max-seq-len", f"[{MIN_MAX_SEQ_LEN}, {MAX_MAX_SEQ_LEN}]", f"(got {value})")
    assert not (tmp_path / "out").exists()


def test_smallest_max_seq_len_compiles_and_matches_replacing_an_artifact(checkpoint, artifact, tmp_path):
    """The one extra compile: --max-seq-len at its minimum, into a directory holding an artifact
    (replaced whole); its logits are those of the parity-tested artifact (max_seq_len 64)."""
    from day0.runtime.session import Session

    out = shutil.copytree(artifact("ds-sparse"), tmp_path / "art")
    r = day0("compile", checkpoint("ds-sparse"), "-o", out, "--max-seq-len", MIN_MAX_SEQ_LEN)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".art.lock", "art"]  # nothing left beside it
    small, ref = Session.load(out), Session.load(artifact("ds-sparse"))
    assert small.max_seq_len == MIN_MAX_SEQ_LEN
    ids = list(range(5, 5 + MIN_MAX_SEQ_LEN - 1))
    np.testing.assert_allclose(small.prefill(ids), ref.prefill(ids), rtol=0, atol=1e-6)
    np.testing.assert_allclose(small.decode(9), ref.decode(9), rtol=0, atol=1e-6)


def test_concurrent_publishes_to_one_output(artifact, tmp_path):
    """Threads publishing to one output at once (each its own staging directory, as concurrent
    compiles have) all succeed; the output is one whole artifact and nothing is left beside it."""
    from day0.runtime.artifact import VMFB, read_manifest

    src = artifact("ds-sparse")
    manifest = read_manifest(src, verify=False)
    out = tmp_path / "out"
    errors = []
    for round in range(3):  # round 0: the output is absent; then it is an artifact, replaced
        barrier = threading.Barrier(6)

        def publish_one(i, round=round, barrier=barrier):
            tmp = tmp_path / f".out.partial-test-{round}-{i}"
            tmp.mkdir()
            shutil.copy(src / VMFB, tmp / VMFB)
            barrier.wait()
            try:
                publish_replacing(tmp, out, manifest)
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=publish_one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    read_manifest(out, verify=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_publish_checks_the_output_again(artifact, tmp_path):
    """A directory that appeared at the output while we compiled is not replaced."""
    from day0.runtime.artifact import VMFB, read_manifest

    src = artifact("ds-sparse")
    tmp = tmp_path / ".out.partial-test"
    tmp.mkdir()
    shutil.copy(src / VMFB, tmp / VMFB)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "data.csv").write_text("1,2")
    with pytest.raises(BuildError, match=r"out is a non-empty directory that is not a day0 artifact"):
        publish_replacing(tmp, tmp_path / "out", read_manifest(src, verify=False))
    assert (tmp_path / "out" / "data.csv").read_text() == "1,2"


def test_failed_compile_leaves_a_users_repro_named_directory_alone(tmp_path):
    """The repro of a failed iree-compile goes to a fresh directory when the one asked for (the
    driver's `<output>.repro`) holds someone else's files."""
    from day0.lowering.compile import CompileError, compile_mlir

    theirs = tmp_path / "art.repro"
    theirs.mkdir()
    (theirs / "input.mlir").write_text("their module")
    with pytest.raises(CompileError) as e:
        compile_mlir("this is not MLIR", "llvm-cpu", tmp_path / "model.vmfb", repro_dir=theirs)
    assert e.value.repro_dir != theirs and (e.value.repro_dir / "command.sh").exists()
    assert sorted(p.name for p in theirs.iterdir()) == ["input.mlir"]
    assert (theirs / "input.mlir").read_text() == "their module"
    shutil.rmtree(e.value.repro_dir)
    # an earlier day0 repro there is replaced
    ours = tmp_path / "ours.repro"
    with pytest.raises(CompileError) as e:
        compile_mlir("this is not MLIR", "llvm-cpu", tmp_path / "model.vmfb", repro_dir=ours)
    with pytest.raises(CompileError) as e:
        compile_mlir("still not MLIR", "llvm-cpu", tmp_path / "model.vmfb", repro_dir=ours)
    assert e.value.repro_dir == ours.resolve() and (ours / "input.mlir").read_text().startswith("still not")


# --- SIGTERM -----------------------------------------------------------------------------------


def _children(pid: int) -> dict[int, str]:
    """pid -> executable of the live child processes of pid (Linux /proc)."""
    kids = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                kids[int(d.name)] = (d / "cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_sigterm_during_iree_compile_cleans_up(checkpoint, artifact, tmp_path):
    """SIGTERM while iree-compile runs: the compile stops (rc 143, one line, no traceback), its
    staging and temp directories are gone, iree-compile is dead, the old artifact is untouched."""
    temp = tmp_path / "temp"
    temp.mkdir()
    out = shutil.copytree(artifact("ds-sparse"), tmp_path / "art")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    env = dict(os.environ, TMPDIR=str(temp))
    args = [DAY0, "compile", str(checkpoint("ds-sparse")), "-o", str(out), "--max-seq-len", str(MIN_MAX_SEQ_LEN)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stderr:
            if line.startswith("[4/5] compile ..."):
                break
        deadline, compiler = time.monotonic() + 60, None
        while compiler is None and time.monotonic() < deadline and proc.poll() is None:
            compiler = next((p for p, exe in _children(proc.pid).items() if "iree-compile" in exe), None)
            time.sleep(0.02)
        assert compiler is not None, "iree-compile never started"
        assert list(temp.glob("day0-compile-*")) and list(tmp_path.glob(".art.partial-*"))
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 128 + signal.SIGTERM, rest
    assert "Traceback" not in rest and rest.strip().splitlines() == ["day0: stopped by SIGTERM"]
    deadline = time.monotonic() + 10
    while _alive(compiler) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(compiler), "iree-compile outlived the compile"
    assert not list(temp.glob("day0-*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "temp"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize(
    "args,names",
    [
        (("--max-batch", "-1"), ("--max-batch", "[0, 1024]", "(got -1)")),
        (("--max-batch", "2", "--block-size", "0"), ("--block-size", "[1, 4096]", "(got 0)")),
    ],
)
def test_paged_options_out_of_bounds_refused_before_work(checkpoint, tmp_path, args, names):
    _refused_before_work(day0("compile", checkpoint("ds-sparse"), "-o", tmp_path / "out", *args), *names)
    assert not (tmp_path / "out").exists()


def test_a_block_size_that_splits_a_k_pool_is_named(checkpoint, tmp_path):
    args = ("--max-seq-len", 96, "--max-batch", 2, "--block-size", 6)
    r = day0("compile", checkpoint("glm-base"), "-o", tmp_path / "out", *args)
    one_line_error(r, "--block-size 6 is not a multiple of 4: a block must hold whole k-pools of the indexer")
    assert not (tmp_path / "out").exists()
