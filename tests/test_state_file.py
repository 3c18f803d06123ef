"""The sequence state outside one Session: saved to disk and continued elsewhere, refused when it
belongs to another model, cleared by reset; per-kind byte counts (MLA latent, indexer keys, KDA
recurrent state, conv tails)."""

import dataclasses
import json
import shutil

import numpy as np
import pytest

from day0.runtime import state_file
from day0.runtime.artifact import ArtifactError
from day0.runtime.session import Session
from day0.runtime.state_file import StateFileError


def _ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 100, n).tolist()


@pytest.mark.parametrize("name", ["ds-sparse", "kl-base"])
def test_saved_state_continues_the_sequence_exactly(name, artifact, tmp_path):
    a = Session.load(artifact(name))
    a.prefill(_ids(21))
    a.decode(5)
    path = a.save_state(tmp_path / "turn1.npz")
    b = Session.load(artifact(name))
    b.load_state(path)
    assert b.position == a.position == 22
    for t in (7, 3, 11):
        np.testing.assert_array_equal(b.decode(t), a.decode(t))
    np.testing.assert_array_equal(b.prefill([1, 2, 3]), a.prefill([1, 2, 3]))  # a second turn


def test_reset_clears_every_kind_of_state(artifact):
    """kl-base has MLA latent rows, KDA recurrent states and conv tails: none survives reset."""
    s, fresh = Session.load(artifact("kl-base")), Session.load(artifact("kl-base"))
    s.prefill(_ids(70, seed=1))
    s.reset()
    assert s.position == 0
    np.testing.assert_array_equal(s.prefill(_ids(9, seed=2)), fresh.prefill(_ids(9, seed=2)))


def test_state_bytes_per_kind(artifact):
    s = Session.load(artifact("kl-base"))
    by_kind = {}
    for spec in s.manifest.state:
        by_kind[spec.kind] = by_kind.get(spec.kind, 0) + 4 * int(np.prod(spec.shape))
    assert set(by_kind) == {"mla_latent", "kda_state", "conv_tail"}
    assert s.state_bytes() == by_kind


def test_state_of_another_config_is_refused(artifact, tmp_path):
    a = Session.load(artifact("ds-sparse"))
    a.prefill(_ids(5))
    path = a.save_state(tmp_path / "s.npz")
    other = Session.load(artifact("ds-tiles-mxfp4"))
    with pytest.raises(StateFileError, match=r"different model: config field 'hidden_size' is 64 there, 96 here"):
        other.load_state(path)
    assert other.position == 0  # unchanged
    kimi = Session.load(artifact("kl-base"))
    with pytest.raises(StateFileError, match=r"architecture is 'deepseek_v32' there, 'kimi_linear' here"):
        kimi.load_state(path)
    longer = dataclasses.replace(a.manifest, max_seq_len=a.manifest.max_seq_len * 2)
    with pytest.raises(StateFileError, match=r"max_seq_len is 64 there, 128 here"):
        state_file.read(path, longer)


def test_broken_state_files(artifact, tmp_path):
    s = Session.load(artifact("ds-sparse"))
    with pytest.raises(StateFileError, match="no such file"):
        s.load_state(tmp_path / "absent.npz")
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    with pytest.raises(StateFileError, match="not a day0 state file"):
        s.load_state(tmp_path / "plain.npz")
    good = s.save_state(tmp_path / "good.npz")
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:100])
    with pytest.raises(StateFileError, match="unreadable"):
        s.load_state(tmp_path / "cut.npz")
    with np.load(good) as z:
        arrays = {k: z[k] for k in z.files}
    name = s.manifest.state[0].name
    arrays[name] = arrays[name][:-1]
    np.savez(tmp_path / "short.npz", **arrays)
    with pytest.raises(StateFileError, match=rf"tensor '{name}' is float32\[63, "):
        s.load_state(tmp_path / "short.npz")


def test_moved_checkpoint_is_size_checked_without_verify(checkpoint, artifact, tmp_path):
    """verify=False skips the hashes (a regenerated checkpoint on another host) but not the
    sizes: the shards of another config are refused by name, not at the first call."""
    other = shutil.copytree(checkpoint("ds-tiles"), tmp_path / "other")
    manifest = json.loads((artifact("ds-sparse") / "manifest.json").read_text())
    shard = manifest["parameters"]["files"][0]["path"]
    with pytest.raises(ArtifactError, match=rf"{shard}.*size is"):
        Session.load(artifact("ds-sparse"), verify=False, checkpoint_dir=other)


@pytest.mark.parametrize("name", ["kl-base", "ds-sparse"])
def test_paged_session_state_files_hold_the_sequence_rows(name, artifact, tmp_path):
    """A Session over the paged entry points (kl-base: KDA states and conv tails in slots) saves
    only the rows its sequence holds; a dense Session continues it exactly, and the other way."""
    paged, dense = Session.load(artifact(name), paged=True), Session.load(artifact(name), paged=False)
    for s in (paged, dense):
        s.prefill(_ids(21, seed=4))
    np.testing.assert_allclose(paged.decode(5), dense.decode(5), rtol=0, atol=1e-5)
    saved = {kind: s.save_state(tmp_path / f"{kind}.npz") for kind, s in (("paged", paged), ("dense", dense))}
    with np.load(saved["paged"]) as z:
        header = json.loads(bytes(z[state_file.HEADER]).decode())
    assert header["rows"] and all(n < 64 for n in header["rows"].values())  # of max_seq_len 64
    want = dense.decode(7)
    for kind, path in (("dense", saved["paged"]), ("paged", saved["dense"])):
        s = Session.load(artifact(name), paged=kind == "paged")
        s.load_state(path)
        assert s.position == 22
        np.testing.assert_allclose(s.decode(7), want, rtol=0, atol=1e-5)


def test_truncated_rows_out_of_range_are_refused(artifact, tmp_path):
    s = Session.load(artifact("ds-sparse"), paged=True)
    s.prefill(_ids(5))
    path = s.save_state(tmp_path / "s.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(bytes(arrays[state_file.HEADER]).decode())
    name = next(iter(header["rows"]))
    header["rows"][name] = 65
    arrays[state_file.HEADER] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(StateFileError, match=rf"tensor '{name}' stores 65 rows, outside \[0, 64\]"):
        Session.load(artifact("ds-sparse")).load_state(tmp_path / "bad.npz")
