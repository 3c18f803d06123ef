"""An artifact over several devices (`day0 compile --devices N`, issue 19): deepseek_v32's MXFP4
routed experts split among N local CPU devices, each device holding and reading only its own
experts, gives the one-device artifact's logits and tokens through Session and Engine; what
cannot be split so is refused before any work."""

import json
import re

import numpy as np
import pytest
from parity_configs import DECODE_STEPS, PARITY, rel_err, sequence

NAME = "ds-sparse-mxfp4"  # 8 routed experts, 2 a token


@pytest.fixture(scope="session")
def split(checkpoint, workdir):
    """(name, N) -> the checkpoint compiled for N local devices, once for all workers: NAME at 4
    with the Engine's paged entry points, in blocks of max_seq_len positions, one a sequence (a
    block table of one entry, which torch.export once refused), its stages dumped. (One compile:
    the suite's time is at its limit; glm5_next split over 2 devices was checked by hand,
    docs/scale.md.)"""
    from conftest import once

    from day0.lowering.driver import BuildOptions, compile_checkpoint

    builds = {
        (NAME, 4): dict(max_batch=2, block_size=PARITY[NAME]["max_seq_len"], dump_stages=True),
    }

    def get(name: str, n: int):
        spec, path = PARITY[name], workdir / f"artifact-{name}-devices{n}"
        with once(workdir, path.name):
            if not path.exists():
                options = BuildOptions(
                    max_seq_len=spec["max_seq_len"], dsa_tile=spec.get("tile", 64), devices=n, **builds[name, n]
                )
                compile_checkpoint(checkpoint(name), path, options, progress=lambda *a: None)
        return path

    return get


def _logits(artifact, ids, p):
    from day0.runtime.session import Session

    s = Session.load(artifact)
    rows = [s.prefill(ids[:p])] + [s.decode(int(t))[None] for t in ids[p:]]
    return np.concatenate(rows), s


@pytest.mark.parametrize("name, n", [(NAME, 4)])
def test_split_experts_give_the_one_device_logits(artifact, split, name, n):
    from day0.runtime.session import Session

    p = PARITY[name]["prompt"]
    ids = sequence(name, Session.load(artifact(name)).vocab_size).numpy()
    one, s1 = _logits(artifact(name), ids, p)
    got, s = _logits(split(name, n), ids, p)
    assert s.manifest.device_count == n and s1.manifest.device_count == 1
    assert got.shape == (p + DECODE_STEPS, s.vocab_size) and rel_err(got, one) < 1e-5
    assert (got.argmax(-1) == one.argmax(-1)).all()
    s.reset(), s1.reset()
    assert s.generate(list(range(3, 11)), max_new_tokens=6) == s1.generate(list(range(3, 11)), max_new_tokens=6)


def test_the_engine_runs_a_split_artifact(artifact, split):
    from day0.runtime.engine import Engine
    from day0.runtime.session import Session

    eng = Engine.load(split(NAME, 4))
    prompts = [list(range(5, 17)), list(range(40, 47))]
    rids = [eng.add(q, max_new_tokens=5, stop=()) for q in prompts]
    got = {r: [] for r in rids}
    while eng.has_work():
        for rid, prog in eng.step().items():
            got[rid] += prog.tokens
    for rid, q in zip(rids, prompts, strict=True):
        assert got[rid] == Session.load(artifact(NAME)).generate(q, max_new_tokens=5, stop_at_eos=False)


def test_each_device_holds_its_own_experts(checkpoint, artifact, split):
    from day0.runtime.artifact import read_manifest
    from day0.tools.artifact_summary import summary_json

    m = read_manifest(split(NAME, 4), verify=False)
    per = [0] * 4  # from the shards' own headers: each tensor's data_offsets
    for f in checkpoint(NAME).glob("*.safetensors"):
        raw = f.read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        for name, t in header.items():
            if name != "__metadata__":
                e = int(name.split(".experts.")[1].split(".")[0]) if ".experts." in name else None
                per[0 if e is None else e // 2] += t["data_offsets"][1] - t["data_offsets"][0]
    assert list(m.device_bytes) == per and per[1] == per[2] == per[3] > 0
    assert json.loads((split(NAME, 4) / "manifest.json").read_text())["device_bytes"] == per
    summary = summary_json(m)  # day0 inspect --json
    assert summary["device_count"] == 4 and summary["device_bytes"] == per
    # in the compiled module each device loads its parameters itself
    hal = next((split(NAME, 4) / "stages" / "iree" / "phases").glob("*.hal.mlir")).read_text()
    assert all(f"io_parameters.load<%__device_{d}" in hal for d in range(4))
    # a one-device artifact's manifest is what it always was
    assert "device_bytes" not in json.loads((artifact(NAME) / "manifest.json").read_text())


@pytest.mark.parametrize(
    "name, devices, target, words",
    [
        (NAME, 3, "llvm-cpu", "--devices 3 does not divide the checkpoint's 8 routed experts"),
        ("ds-sparse", 2, "llvm-cpu", "splits MXFP4 routed experts among devices"),
        (NAME, 2, "cuda-sm90", "built for llvm-cpu (local devices) so far, not for cuda-sm90"),
        (NAME, 0, "llvm-cpu", "--devices must be an integer in [1, 64] (got 0)"),
    ],
)
def test_what_cannot_be_split_is_refused(checkpoint, tmp_path, name, devices, target, words):
    from day0.lowering.driver import BuildError, BuildOptions, compile_checkpoint

    with pytest.raises(BuildError, match=re.escape(words)):
        compile_checkpoint(checkpoint(name), tmp_path / "a", BuildOptions(devices=devices, target=target))
    assert not (tmp_path / "a").exists()


def test_devices_are_distinct_local_task_devices():
    from day0.runtime.vm import VmError, get_devices

    devices = get_devices("local-task", 3)
    assert len({id(d) for d in devices}) == 3
    with pytest.raises(VmError, match="spans 2 devices; day0 runs such modules on local-task so far, not local-sync"):
        get_devices("local-sync", 2)
    with pytest.raises(ValueError, match="at least one device"):
        get_devices("local-task", 0)
