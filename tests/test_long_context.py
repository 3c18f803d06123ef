"""Long-context artifacts on the CPU (issue 18): tiny configs compiled for 65,536 positions run
through the Engine's paged state, which holds only the blocks a sequence fills. Against
transformers at a few thousand tokens (teacher-forced logits along the generated path, greedy
tokens), against the short artifact at short lengths, and at the very end of max_seq_len."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from day0.runtime.engine import Engine, EngineError
from day0.runtime.session import Session, SessionError

sys.path.insert(0, str(Path(__file__).parent))
from parity_configs import rel_err  # noqa: E402

TOL = 1e-3  # the parity tests' (tests/test_parity.py)


def _run(engine: Engine, prompts: list[list[int]], new: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy tokens and kept logits of each prompt, all added at once, stepped to the end; the
    blocks in use checked against each sequence's own length along the way."""
    rids = [engine.add(p, max_new_tokens=new, stop=(), keep_logits=True) for p in prompts]
    tokens, logits = {r: [] for r in rids}, {r: [] for r in rids}
    while engine.has_work():
        for r, prog in engine.step().items():
            tokens[r] += prog.tokens
            logits[r] += prog.logits
        running = sum(engine.blocks.blocks_for(len(p) + new - 1) for p, r in zip(prompts, rids) if engine.phase(r))
        assert engine.counters()["blocks_used"] == running
    return [tokens[r] for r in rids], [np.stack(logits[r]) for r in rids]


@pytest.mark.parametrize("name", ["ds-sparse"])
def test_a_few_thousand_tokens_match_transformers(long_artifact, reference, name):
    """A 3,000-token prompt and 8 greedy tokens in the 64K artifact: logits within the parity
    tolerance of transformers' along the same tokens, the same greedy tokens. (glm-base and
    kl-base, KDA state in slots, agree the same way at 64K and 1M (docs/perf.md, 'Long context on
    the CPU'); each 64K compile costs 50-80 s of the suite's 2-core budget, so deepseek_v32 alone
    runs here.)"""
    ref = reference(name)
    prompt = np.random.default_rng(0).integers(0, ref.config.vocab_size, 3000).tolist()
    engine = Engine.load(long_artifact(name), num_blocks=400, max_running=1)  # 6,400 positions
    assert engine.max_seq_len == 65536 and engine.layout.block_size == 16
    (tokens,), (got,) = _run(engine, [prompt], 8)
    with torch.no_grad():
        want = ref(torch.tensor([prompt + tokens[:-1]]), use_cache=False).logits[0]
    assert got.shape == tuple(want.shape)
    assert rel_err(got, want) < TOL
    assert tokens == [int(want[i].argmax()) for i in range(len(prompt) - 1, want.shape[0])]


def test_short_sequences_give_what_the_short_artifact_gives(long_artifact, artifact):
    """Three sequences at once in the 64K artifact equal each alone through the 64-position
    artifact's Session (max_seq_len changes no result)."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 100, n).tolist() for n in (5, 19, 33)]
    tokens, logits = _run(Engine.load(long_artifact("ds-sparse")), prompts, 6)
    for prompt, toks, got in zip(prompts, tokens, logits):
        s = Session.load(artifact("ds-sparse"))
        want = np.concatenate([s.prefill(prompt)] + [s.decode(t)[None] for t in toks[:-1]])
        assert rel_err(got, want) < 1e-5
        assert toks == Session.load(artifact("ds-sparse")).generate(prompt, max_new_tokens=6, stop_at_eos=False)


def test_the_last_position(artifact):
    """A prompt of max_seq_len - 1 tokens prefills and decodes one token (two new tokens, the
    last position filled); one token more is refused with the numbers, by the Engine and Session."""
    art = artifact("ds-sparse")
    n = Session.load(art).max_seq_len
    prompt = np.random.default_rng(2).integers(0, 100, n - 1).tolist()
    want = Session.load(art).generate(prompt, max_new_tokens=2, stop_at_eos=False)
    engine = Engine.load(art)
    (tokens,), _ = _run(engine, [prompt], 2)
    assert tokens == want and len(want) == 2
    with pytest.raises(EngineError, match=rf"needs {n + 1} positions, more than the artifact's max_seq_len {n}"):
        engine.add(prompt + [7], max_new_tokens=2)
    with pytest.raises(SessionError, match=rf"needs {n + 1} positions, more than max_seq_len {n}"):
        Session.load(art).generate(prompt + [7], max_new_tokens=2)


def test_generate_cli_on_the_long_artifact(long_artifact):
    """`day0 generate` on the 64K artifact runs through an Engine sized to its request (not
    Session's 65,536 dense rows): the tokens of the Engine run alone."""
    import subprocess

    art = long_artifact("ds-sparse")
    prompt = np.random.default_rng(3).integers(0, 100, 1500).tolist()
    (want,), _ = _run(Engine.load(art, num_blocks=200, max_running=1), [prompt], 6)
    day0 = str(Path(sys.executable).parent / "day0")
    args = [day0, "generate", str(art), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "6"]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [int(t) for t in r.stdout.strip().split(",")] == want


def test_session_on_the_long_artifact_runs_the_paged_entry_points(long_artifact, tmp_path):
    """Session.load on the 64K artifact runs its paged entry points with pools that grow with
    the sequence: the logits (prompt rows in two pieces, decode steps) and greedy tokens of the
    dense entry points, device bytes for the tokens held, and state files either kind reads."""
    art = long_artifact("ds-sparse")
    paged, dense = Session.load(art), Session.load(art, paged=False)
    assert paged.paged and not dense.paged
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, 100, 600).tolist()  # over one 512-token piece
    assert rel_err(paged.prefill(prompt), dense.prefill(prompt)) < 1e-5
    for token in rng.integers(0, 100, 3).tolist():
        assert rel_err(paged.decode(token), dense.decode(token)) < 1e-5
    held = sum(paged.state_bytes().values())
    assert held < sum(dense.state_bytes().values()) / 16  # 603 of 65,536 positions, in grown pools
    # state files: the paged one holds the sequence's rows only; each kind loads the other's
    paged.save_state(tmp_path / "paged.npz")
    dense.save_state(tmp_path / "dense.npz")
    assert (tmp_path / "paged.npz").stat().st_size < (tmp_path / "dense.npz").stat().st_size / 16
    want = dense.decode(9)
    for kind, path in ((False, "paged.npz"), (True, "dense.npz")):
        s = Session.load(art, paged=kind)
        s.load_state(tmp_path / path)
        assert s.position == 603 and rel_err(s.decode(9), want) < 1e-5
    paged.reset()
    dense.reset()
    assert paged.generate(prompt[:300], max_new_tokens=6) == dense.generate(prompt[:300], max_new_tokens=6)
    assert paged.decode_greedy(3) == dense.decode_greedy(3)


def test_session_paged_needs_paged_entry_points(artifact):
    import dataclasses

    from day0.runtime.artifact import read_manifest

    dense_only = dataclasses.replace(read_manifest(artifact("ds-sparse")), paged=None)
    with pytest.raises(SessionError, match="no paged entry points"):
        Session(artifact("ds-sparse"), dense_only, vm=None, paged=True)  # refused before the device


def test_paged_session_refuses_what_the_device_cannot_hold(long_artifact, monkeypatch):
    """Growing pools that the device cannot double take the blocks the call needs alone; when
    those do not fit either, the call is refused with the bytes (nothing runs, the sequence is
    as it was and goes on)."""
    from day0.runtime import paged_sequence

    art = long_artifact("ds-sparse")
    s, dense = Session.load(art), Session.load(art, paged=False)
    rng = np.random.default_rng(6)
    first, more, too_many = (rng.integers(0, 100, n).tolist() for n in (100, 100, 200))
    for x in (s, dense):
        x.prefill(first)
    assert s._paged.capacity == 10  # 1 + 7 blocks of 16 needed, doubled from 5
    largest = max(p.nbytes for p in s.manifest.paged.pools)  # a block of the largest pool
    real = paged_sequence._device_buffer

    def device_of_14_blocks(device, size):
        if size > 14 * largest:
            raise RuntimeError("RESOURCE_EXHAUSTED; out of memory (the test's device)")
        return real(device, size)

    monkeypatch.setattr(paged_sequence, "_device_buffer", device_of_14_blocks)
    assert rel_err(s.prefill(more), dense.prefill(more)) < 1e-5  # 200 positions: 14 blocks, not 20
    assert s._paged.capacity == 14
    with pytest.raises(
        SessionError, match=r"needs 400 positions: pools of 26 blocks \(\d+ bytes\).*could not allocate"
    ):
        s.prefill(too_many)
    assert s.position == 200 and s._paged.capacity == 14
    assert rel_err(s.decode(5), dense.decode(5)) < 1e-5
