"""The runtime against inputs that used to give a plausible wrong answer: NaN weights, a manifest
edited by hand, a vmfb from another compile, two threads on one Session, the token generate
returns last, a state saved under other weights, malformed state files, bad ids and seeds.
Each either works correctly or is refused naming the cause."""

import dataclasses
import json
import shutil
import threading

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from day0.runtime import state_file
from day0.runtime.artifact import MANIFEST, VMFB, ArtifactError
from day0.runtime.files import sha256_file
from day0.runtime.session import Session, SessionError
from day0.runtime.state_file import StateFileError

NAME = "ds-sparse"  # max_seq_len 64


def _ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 100, n).tolist()


def _nan_checkpoint(checkpoint, tmp_path):
    """A copy of the checkpoint with one NaN in lm_head (every position's logits get a NaN)."""
    ckpt = shutil.copytree(checkpoint(NAME), tmp_path / "nan-ckpt")
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors = load_file(f)
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"][3, 0] = float("nan")
            save_file(tensors, f, metadata={"format": "pt"})  # same names, shapes, dtypes: same size
            return ckpt
    raise AssertionError("no lm_head.weight")


def test_nan_weights_are_an_error_not_tokens(checkpoint, artifact, tmp_path):
    """The device's greedy token and the host's logits agree: a NaN row is an error either way."""
    s = Session.load(artifact(NAME), verify=False, checkpoint_dir=_nan_checkpoint(checkpoint, tmp_path))
    with pytest.raises(SessionError, match=r"logits .* are not finite \(NaN or infinity\)"):
        s.generate(_ids(5), max_new_tokens=3)  # greedy: chosen on the device
    s.reset()
    with pytest.raises(SessionError, match="not finite"):
        s.generate(_ids(5), max_new_tokens=3, temperature=0.8, seed=0)  # sampled on the host
    s.reset()
    with pytest.raises(SessionError, match="not finite"):
        s.prefill(_ids(5))
    s.reset()
    with pytest.raises(SessionError, match="not finite"):
        s.decode(7)


def _edited_copy(artifact, tmp_path, edit) -> object:
    art = shutil.copytree(artifact(NAME), tmp_path / "edited")
    m = json.loads((art / MANIFEST).read_text())
    edit(m, art)
    (art / MANIFEST).write_text(json.dumps(m))
    return art


@pytest.mark.parametrize(
    "edit,cause",
    [
        (
            lambda m, a: m.update(max_seq_len=m["max_seq_len"] * 4),
            r"function 'prefill': max_seq_len is 64 in the module, 256 in the manifest",
        ),
        (lambda m, a: m.update(vocab_size=m["vocab_size"] * 2), r"logits 0 is float32\[\?, \d+\] in the module"),
        (lambda m, a: m["state"][0].update(shape=[640, 8]), r"argument 2 is float32\[64, \d+\] in the module"),
        (lambda m, a: m["state"].pop(), r"the module has \d+ arguments, the manifest describes \d+"),
    ],
    ids=["max_seq_len", "vocab_size", "state-shape", "state-count"],
)
def test_edited_manifest_is_checked_against_the_module(artifact, tmp_path, edit, cause):
    art = _edited_copy(artifact, tmp_path, edit)
    with pytest.raises(ArtifactError, match=cause):
        Session.load(art)


def test_vmfb_of_another_compile_is_refused(artifact, tmp_path):
    """Even with the manifest's vmfb record rewritten to match, a vmfb compiled for another
    config does not run under this manifest."""

    def swap(m, art):
        shutil.copy(artifact("ds-tiles-mxfp4") / VMFB, art / VMFB)
        m["vmfb"].update(size=(art / VMFB).stat().st_size, sha256=sha256_file(art / VMFB))

    art = _edited_copy(artifact, tmp_path, swap)
    with pytest.raises(ArtifactError, match=r"function '\w+': .* in the module, .* in the manifest"):
        Session.load(art)


def test_out_of_range_ids_and_positions_stay_inside_the_step(artifact):
    """The host refuses them; the compiled step also clamps what reaches a gather or a cache write
    (called here below the Session's checks), so no input can read or write outside a tensor."""
    s = Session.load(artifact(NAME))
    with pytest.raises(SessionError, match=r"token id 2000000 is outside the vocabulary"):
        s.decode(2_000_000)
    decode = s._vm.function("decode")
    out = decode(np.array([2_000_000]), np.array([10**9]), *s._state)
    assert np.isfinite(np.asarray(out[0].to_host())).all()
    out = decode(np.array([-5]), np.array([-(10**9)]), *s._state)
    assert np.isfinite(np.asarray(out[0].to_host())).all()


def test_a_session_refuses_a_second_thread(artifact):
    s = Session.load(artifact(NAME))
    held, release = threading.Event(), threading.Event()

    def busy():  # a call in progress on another thread
        with s._busy:
            held.set()
            release.wait(30)

    t = threading.Thread(target=busy)
    t.start()
    held.wait(30)
    try:
        with pytest.raises(SessionError, match=r"Session.generate: the session is in use by another thread"):
            s.generate(_ids(3), max_new_tokens=2)
        assert s.position == 0
    finally:
        release.set()
        t.join()
    assert len(s.generate(_ids(3), max_new_tokens=2)) == 2  # free again


def test_multi_turn_generate_continues_what_the_caller_saw(artifact):
    """The last token generate returns is pending and goes in first on the next turn: two turns
    give the tokens one prompt holding both turns gives, and its logits to float rounding (a
    5-token and an 18-token prefill may take different vector paths through the same kernels:
    on some CPUs they differ in the last bit)."""
    s = Session.load(artifact(NAME))
    first, more = _ids(9, 1), _ids(4, 2)
    out1 = s.generate(first, max_new_tokens=5, stop_at_eos=False)
    assert s.pending == out1[-1] and s.position == len(first) + 4
    out2 = s.generate(more, max_new_tokens=5, stop_at_eos=False)
    ref = Session.load(artifact(NAME))
    assert ref.generate(first + out1 + more, max_new_tokens=5, stop_at_eos=False) == out2
    # the pending token survives save/load, and reset drops it
    s2 = Session.load(artifact(NAME))
    s2.generate(first, max_new_tokens=5, stop_at_eos=False)
    logits = s2.prefill(more)
    assert logits.shape == (len(more), s2.vocab_size)
    ref_logits = _prefill_fresh(artifact, first + out1 + more)[-len(more) :]
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-6)
    assert ref_logits.shape[0] == len(more)
    s2.reset()
    assert s2.pending is None and s2.position == 0


def _prefill_fresh(artifact, ids):
    return Session.load(artifact(NAME)).prefill(ids)


def test_pending_token_is_saved_with_the_state(artifact, tmp_path):
    a = Session.load(artifact(NAME))
    out = a.generate(_ids(7), max_new_tokens=3, stop_at_eos=False)
    path = a.save_state(tmp_path / "s.npz")
    b = Session.load(artifact(NAME))
    b.load_state(path)
    assert (b.pending, b.position) == (out[-1], a.position)
    assert b.generate([5], max_new_tokens=4, stop_at_eos=False) == a.generate([5], max_new_tokens=4, stop_at_eos=False)


def test_prompt_and_new_tokens_fill_max_seq_len_exactly(artifact):
    """P + n - 1 positions are fed (the last token is not): 57 + 8 fits 64, 57 + 9 does not."""
    s = Session.load(artifact(NAME))
    with pytest.raises(SessionError, match=r"needs 65 positions, more than max_seq_len 64"):
        s.generate(_ids(57), max_new_tokens=9, stop_at_eos=False)
    assert len(s.generate(_ids(57), max_new_tokens=8, stop_at_eos=False)) == 8
    assert s.position == 64 and s.pending is not None
    with pytest.raises(SessionError, match=r"sequence would reach 66 tokens"):
        s.decode(1)


def test_state_saved_under_other_weights_is_refused(artifact, tmp_path):
    s = Session.load(artifact(NAME))
    s.prefill(_ids(4))
    path = s.save_state(tmp_path / "s.npz")
    files = s.manifest.parameters.files
    other_weights = dataclasses.replace(
        s.manifest,
        parameters=dataclasses.replace(
            s.manifest.parameters, files=(dataclasses.replace(files[0], sha256="0" * 64), *files[1:])
        ),
    )
    with pytest.raises(StateFileError, match=r"different model: the weights differ"):
        state_file.read(path, other_weights)


def test_malformed_state_headers_are_refused(artifact, tmp_path):
    s = Session.load(artifact(NAME))
    good = s.save_state(tmp_path / "good.npz")
    with np.load(good) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(bytes(arrays[state_file.HEADER]).decode())
    cases = {
        "list": [1, 2],
        "no-config": {k: v for k, v in header.items() if k != "config"},
        "bad-position": {**header, "position": "3"},
        "bad-pending": {**header, "pending": 10**9},
    }
    causes = {
        "list": "header is not a JSON object",
        "no-config": r"malformed \(KeyError",
        "bad-position": "position '3' outside",
        "bad-pending": "pending token 1000000000 outside",
    }
    for name, h in cases.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **{**arrays, state_file.HEADER: np.frombuffer(json.dumps(h).encode(), dtype=np.uint8)})
        with pytest.raises(StateFileError, match=causes[name]):
            s.load_state(path)
    assert s.position == 0


@pytest.mark.parametrize(
    "ids,cause",
    [
        ([], "token ids are empty"),
        ([2**70], r"token id 1180591620717411303424 is outside the vocabulary"),
        ([1.5], r"token id 1.5 is not an integer"),
        ([[1, 2], [3]], "1-D list of integers"),
        ("hello", "not str"),
    ],
)
def test_bad_prompts_are_named(artifact, ids, cause):
    s = Session.load(artifact(NAME))
    with pytest.raises(SessionError, match=cause):
        s.generate(ids, max_new_tokens=1)
    assert s.position == 0


def test_negative_seed_is_named(artifact):
    s = Session.load(artifact(NAME))
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0"):
        s.generate(_ids(3), max_new_tokens=2, temperature=1.0, seed=-1)
