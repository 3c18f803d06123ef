"""The Engine: many sequences over paged caches, against each sequence run alone through Session
(the same artifact's dense entry points): the same logits (teacher-forced along the tokens) and
the same greedy tokens, with requests of different lengths added at different steps, some
aborted, a pool too small for all at once, and blocks reused by later sequences."""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from day0.runtime.artifact import ArtifactError
from day0.runtime.engine import Engine, EngineError, Progress
from day0.runtime.session import Session

sys.path.insert(0, str(Path(__file__).parent))
from parity_configs import PARITY  # noqa: E402

TOL = 1e-5


@pytest.fixture(params=["ds-sparse", "oss-base", "kl-base", "glm-base"])
def name(request) -> str:
    """Artifacts with blocks of 4 positions and batched decode steps for 1 and 3 sequences:
    deepseek_v32, gpt_oss, kimi_linear and glm5_next (KDA state in slots)."""
    return request.param


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 100, n).tolist()


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _alone(artifact, name, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Session's logits teacher-forced over the prompt and every generated token but the last."""
    s = Session.load(artifact(name))
    rows = [s.prefill(prompt)]
    rows += [s.decode(t)[None] for t in tokens[:-1]]
    return np.concatenate(rows)


def _run(engine: Engine, added: dict, late: dict | None = None, abort_at: dict | None = None, steps: int = 200):
    """Step until idle; `late`: {step: [(key, prompt, n)]} added then; `abort_at`: {step: key}."""
    rid = {key: engine.add(p, max_new_tokens=n, stop=(), keep_logits=True) for key, (p, n) in added.items()}
    tokens, logits, finished = {k: [] for k in rid}, {k: [] for k in rid}, {}
    for step in range(steps):
        for key, p, n in (late or {}).get(step, []):
            rid[key] = engine.add(p, max_new_tokens=n, stop=(), keep_logits=True)
            tokens[key], logits[key] = [], []
        if abort_at and step in abort_at:
            assert engine.abort(rid[abort_at[step]])
            finished[abort_at[step]] = "abort"
        if not engine.has_work():
            break
        by_id = {v: k for k, v in rid.items()}
        for r, prog in engine.step().items():
            tokens[by_id[r]] += prog.tokens
            logits[by_id[r]] += prog.logits
            if prog.finished:
                finished[by_id[r]] = prog.finished
    return tokens, logits, finished


def test_sequences_together_equal_each_alone(artifact, name):
    """Prompts of 3..21 tokens in chunks of 8 (a one-token remainder included), added at
    different steps, one aborted midway: each finished one has its logits and greedy tokens."""
    engine = Engine.load(artifact(name), chunk=8)
    first = {"a": (_ids(9, 1), 6), "b": (_ids(17, 2), 5), "c": (_ids(3, 3), 8)}
    late = {2: [("d", _ids(21, 4), 4)], 4: [("e", _ids(12, 5), 7)]}
    tokens, logits, finished = _run(engine, first, late, abort_at={6: "c"})
    prompts = {**first, **{k: (p, n) for v in late.values() for k, p, n in v}}
    assert finished == {"a": "length", "b": "length", "c": "abort", "d": "length", "e": "length"}
    for key in "abde":
        prompt, n = prompts[key]
        want_tokens = Session.load(artifact(name)).generate(prompt, max_new_tokens=n, stop_at_eos=False)
        assert tokens[key] == want_tokens, key
        got = np.stack(logits[key])
        assert got.shape[0] == len(prompt) + n - 1
        assert _rel(got, _alone(artifact, name, prompt, tokens[key])) < TOL, key
    idle = {"running": 0, "waiting": 0, "waiting_text": 0, "waiting_image": 0, "blocks_used": 0, "blocks_evicted": 0}
    idle["blocks_free"] = engine.blocks.capacity
    assert engine.counters() == {**idle, "slots_free": engine.max_running}


def test_lookahead_steps_give_what_steps_run_to_their_end_give(artifact, name):
    """The Engine submits each step's successor before reading it (runtime/engine.py,
    lookahead): step by step, the same tokens and finish reasons as with lookahead=False, through
    a stop token met mid-way (the row computed past it is dropped), an abort between steps, a
    request added while others decode and one that samples (no lookahead while it decodes)."""

    def run(lookahead: bool, stop: tuple[int, ...]):
        engine = Engine.load(artifact(name), chunk=8, lookahead=lookahead)
        rids = [engine.add(_ids(5, 40), max_new_tokens=9, stop=stop)]
        rids += [engine.add(_ids(9, 41), max_new_tokens=7, stop=()), engine.add(_ids(4, 42), max_new_tokens=8, stop=())]
        steps, ahead = [], 0
        for i in itertools.count():
            if i == 3:
                engine.abort(rids[2])
            if i == 4:
                engine.add(_ids(6, 43), max_new_tokens=5, stop=())
            if i == 6:
                engine.add(_ids(3, 44), max_new_tokens=4, temperature=0.8, seed=5, stop=())
            if not engine.has_work():
                return steps, ahead
            steps.append({r: (p.tokens, p.finished) for r, p in engine.step().items()})
            ahead += engine._ahead is not None

    first, _ = run(False, ())
    stop = [t for step in first for t in step.get(0, ([], None))[0]][3]  # the first request's 4th token
    plain, none = run(False, (stop,))
    got, ahead = run(True, (stop,))
    assert none == 0 and ahead >= 3
    assert got == plain
    assert [p[0][1] for p in plain if 0 in p][-1] == "stop"


@pytest.mark.parametrize("name", ["ds-sparse", "oss-base"])
def test_static_prompt_chunks_give_what_session_gives(artifact, name):
    """The artifacts' static prompt chunk of 8 (`paged_prefill_chunk`, the last row's logits
    only): prompts of 5 (shorter: the dynamic step), 8 (one chunk), 13 (one, then one overlapping
    it by 3 rows) and 21 tokens (two, then an overlap by 3) give Session's greedy tokens, and each
    token's log-probabilities (the first from the chunk's last row, the rest from decode steps
    reading the rows the chunks wrote) are the log-softmax of Session's rows."""
    engine = Engine.load(artifact(name))
    assert (engine.static_chunk, engine.chunk) == (8, 8)  # the default chunk: the static one
    calls = []
    call = engine._call
    engine._call = lambda name, ids, *a: (
        (name == "paged_prefill_chunk" and calls.append(ids.size)) or call(name, ids, *a)
    )
    prompts = {n: _ids(n, 40 + n) for n in (5, 8, 13, 21)}
    rids = {engine.add(p, max_new_tokens=5, stop=(), logprobs=20): n for n, p in prompts.items()}
    tokens, lps = {n: [] for n in prompts}, {n: [] for n in prompts}
    while engine.has_work():
        for r, prog in engine.step().items():
            tokens[rids[r]] += prog.tokens
            lps[rids[r]] += prog.logprobs
    assert calls == [8] * 6  # 0 + 1 + 2 + 3 static chunks
    for recurrent in ("kl-base", "glm-base"):  # KDA state: re-running rows is not exact, so no static chunk
        assert "paged_prefill_chunk" not in Engine.load(artifact(recurrent)).manifest.entry_points
    for n, prompt in prompts.items():
        assert tokens[n] == Session.load(artifact(name)).generate(prompt, max_new_tokens=5, stop_at_eos=False), n
        rows = _alone(artifact, name, prompt, tokens[n])[n - 1 :].astype(np.float64)
        for row, token, (lp, best) in zip(rows, tokens[n], lps[n], strict=True):
            ref = row - row.max() - np.log(np.exp(row - row.max()).sum())
            assert abs(lp - ref[token]) < TOL * np.abs(row).max(), n
            assert max(abs(got - ref[t]) for t, got in best) < TOL * np.abs(row).max(), n
            assert {t for t, _ in best} == set(np.argsort(-ref, kind="stable")[:20].tolist()), n


def test_a_short_pool_makes_requests_wait_not_fail(artifact, name):
    """A pool of 7 blocks (28 positions) holds one of these requests at a time: the others wait,
    then finish with the tokens they have alone; then a sequence on reused blocks equals a
    fresh run (nothing leaks between sequences)."""
    engine = Engine.load(artifact(name), num_blocks=8, chunk=16)
    reqs = {"a": (_ids(18, 6), 6), "b": (_ids(11, 7), 9), "c": (_ids(15, 8), 5)}
    for p, n in reqs.values():
        engine.add(p, max_new_tokens=n, stop=())
    engine.step()
    assert engine.counters()["running"] == 1 and engine.counters()["waiting"] == 2
    assert [engine.phase(r) for r in range(3)] == ["prompt", "waiting", "waiting"]  # 16 of 18 prompt tokens ran
    out: dict[int, list[int]] = {}
    while engine.has_work():
        for r, prog in engine.step().items():
            out.setdefault(r, []).extend(prog.tokens)
    for r, (key, (p, n)) in enumerate(reqs.items()):
        assert out[r] == Session.load(artifact(name)).generate(p, max_new_tokens=n, stop_at_eos=False), key
    prompt = _ids(13, 9)
    tokens, logits, _ = _run(engine, {"z": (prompt, 6)})
    assert _rel(np.stack(logits["z"]), _alone(artifact, name, prompt, tokens["z"])) < TOL


def test_one_running_sequence_at_a_time_gives_the_same_tokens(artifact, name):
    """max_running=1: one slot, so requests run one after another, each on the slot (and the
    blocks) the previous one left: the same greedy tokens as each alone."""
    engine = Engine.load(artifact(name), max_running=1, chunk=8)
    reqs = [(_ids(7, 30), 5), (_ids(12, 31), 4), (_ids(2, 32), 6)]
    rids = [engine.add(p, max_new_tokens=n, stop=()) for p, n in reqs]
    out = {r: list(prog.tokens) for r, prog in engine.step().items()}
    assert engine.counters()["running"] == 1 and engine.counters()["slots_free"] == 0
    out = {r: out.get(r, []) for r in rids}
    while engine.has_work():
        for r, prog in engine.step().items():
            out[r] += prog.tokens
    for r, (p, n) in zip(rids, reqs):
        assert out[r] == Session.load(artifact(name)).generate(p, max_new_tokens=n, stop_at_eos=False), r


def test_a_seeded_request_samples_the_same_beside_others(artifact, name):
    def sampled(neighbours: int) -> list[int]:
        engine = Engine.load(artifact(name), chunk=8)
        for j in range(neighbours):
            engine.add(_ids(5 + j, 20 + j), max_new_tokens=6, stop=())
        rid = engine.add(_ids(10, 11), max_new_tokens=8, temperature=0.9, top_p=0.95, seed=3, stop=())
        out = []
        while engine.has_work():
            out += engine.step().get(rid, type("P", (), {"tokens": []})).tokens
        return out

    alone = sampled(0)
    assert len(alone) == 8 and sampled(3) == alone


def test_a_long_prompt_delays_running_sequences_by_at_most_one_chunk(artifact):
    """While a 40-token prompt runs in chunks of 8, a decoding sequence gets a token every step:
    each step runs one prompt chunk beside one decode step of everything decoding."""
    engine = Engine.load(artifact("ds-sparse"), chunk=8)
    a = engine.add(_ids(4, 40), max_new_tokens=20, stop=())
    engine.step()  # a's prompt, and its first token
    assert engine.phase(a) == "decoding"
    b = engine.add(_ids(40, 41), max_new_tokens=2, stop=())
    prompt_steps = 0
    while engine.phase(b) != "decoding":
        progress = engine.step()
        assert len(progress[a].tokens) == 1  # a moved on while b's prompt ran
        prompt_steps += 1
    assert prompt_steps == 40 // 8


def test_requests_that_can_never_run_are_refused_at_add(artifact, name):
    engine = Engine.load(artifact(name), num_blocks=5)  # 4 usable blocks: 16 positions
    longest = PARITY[name]["max_seq_len"]
    with pytest.raises(EngineError, match=rf"needs {longest + 6} positions, more than the artifact's max_seq_len"):
        engine.add(_ids(longest - 4, 1), max_new_tokens=11)
    with pytest.raises(EngineError, match=r"needs 5 blocks of 4 positions, more than the whole pool's 4"):
        engine.add(_ids(15, 1), max_new_tokens=3)
    with pytest.raises(EngineError, match=r"token id 400 is outside the vocabulary"):
        engine.add([1, 400])
    with pytest.raises(EngineError, match=r"max_new_tokens must be an integer >= 1"):
        engine.add([1, 2], max_new_tokens=0)
    assert engine.counters()["waiting"] == 0


def test_load_time_limits_are_named(artifact, name):
    with pytest.raises(EngineError, match=r"holds [01] blocks of \d+ bytes beside 4 slots of \d+ bytes; the Engine"):
        Engine.load(artifact(name), memory_bytes=4000)
    with pytest.raises(EngineError, match=r"max_running must be an integer >= 1, got 0"):
        Engine.load(artifact(name), max_running=0)
    with pytest.raises(EngineError, match=r"num_blocks must be an integer >= 2"):
        Engine.load(artifact(name), num_blocks=1)
    with pytest.raises(EngineError, match=r"no paged entry points: compile it with --max-batch"):
        Engine.load(artifact("ds-tiles-mxfp4"))
    with pytest.raises(ArtifactError, match=r"not on device 'cuda'"):
        Engine.load(artifact(name), device="cuda")


def test_inspect_names_the_blocks_and_the_slots(artifact):
    """`day0 inspect` of a paged kimi_linear artifact: the pools' block bytes and the slots'
    recurrent state per sequence (KDA state and conv tails of its three KDA layers)."""
    from day0.runtime.artifact import read_manifest
    from day0.tools.artifact_summary import summary_json, summary_text

    art = artifact("kl-base")
    m = read_manifest(art)
    paged = summary_json(m)["paged"]
    assert paged["slot_bytes"] == sum(s.nbytes for s in m.paged.slots) > 0
    assert {s.kind for s in m.paged.slots} == {"kda_state", "conv_tail"}
    assert {p.kind for p in m.paged.pools} == {"mla_latent"}
    assert f"in {len(m.paged.slots)} slot tensors" in summary_text(art, m)


def _drain(engine: Engine, out: dict | None = None) -> dict:
    out = {} if out is None else out
    while engine.has_work():
        for r, prog in engine.step().items():
            out.setdefault(r, []).extend(prog.tokens)
    return out


def test_text_and_image_requests_wait_in_queues_of_their_own(artifact):
    """An image-bearing request that does not fit yet blocks its own queue only: a text request
    behind it is admitted; within a kind the order is kept (a small request does not pass a large
    one). The kind changes scheduling only: the tokens are each request's alone."""
    engine = Engine.load(artifact("ds-sparse"), num_blocks=9, chunk=8)  # 8 blocks of 4 positions
    big = engine.add(_ids(20, 1), max_new_tokens=5, stop=())  # 24 positions: 6 blocks
    image = engine.add(_ids(9, 2), max_new_tokens=4, stop=(), kind="image")  # 3 blocks: not yet
    text = engine.add(_ids(5, 3), max_new_tokens=4, stop=())  # 2 blocks: fits beside big
    text_late = engine.add(_ids(9, 4), max_new_tokens=4, stop=())  # 3 blocks: waits, behind text
    out = {r: list(p.tokens) for r, p in engine.step().items()}
    assert engine.phase(image) == "waiting" and engine.phase(text) in ("prompt", "decoding")
    assert engine.phase(text_late) == "waiting"
    c = engine.counters()
    assert (c["waiting_text"], c["waiting_image"], c["waiting"]) == (1, 1, 2)
    out = _drain(engine, out)
    for rid, (n, seed, new) in {big: (20, 1, 5), image: (9, 2, 4), text: (5, 3, 4), text_late: (9, 4, 4)}.items():
        assert out[rid] == Session.load(artifact("ds-sparse")).generate(
            _ids(n, seed), max_new_tokens=new, stop_at_eos=False
        )
    with pytest.raises(EngineError, match=r"kind must be one of text, image, got 'audio'"):
        engine.add([1, 2], kind="audio")


def test_prompt_chunks_of_the_two_kinds_take_turns(artifact):
    """Two long prompts admitted together, a text one first: the steps alternate their chunks,
    so an image request's long prefill does not hold a text prompt back for all its chunks."""
    engine = Engine.load(artifact("ds-sparse"), chunk=8)
    text = engine.add(_ids(24, 5), max_new_tokens=2, stop=(), keep_logits=True)
    image = engine.add(_ids(24, 6), max_new_tokens=2, stop=(), keep_logits=True, kind="image")
    order = []
    while engine.phase(text) == "prompt" or engine.phase(image) == "prompt" or not order:
        progress = engine.step()
        order.append([k for k, r in (("text", text), ("image", image)) if len(progress.get(r, Progress()).logits) > 1])
    assert order[:6] == [["text"], ["image"], ["text"], ["image"], ["text"], ["image"]]


def test_logprobs_are_the_log_softmax_of_the_rows(artifact):
    engine = Engine.load(artifact("ds-sparse"), chunk=8)
    greedy = engine.add(_ids(10, 7), max_new_tokens=4, stop=(), keep_logits=True, logprobs=3)
    sampled = engine.add(_ids(6, 8), max_new_tokens=4, stop=(), keep_logits=True, logprobs=0, temperature=0.8, seed=1)
    rows, tokens, lps = {}, {}, {}
    while engine.has_work():
        for r, p in engine.step().items():
            rows.setdefault(r, []).extend(p.logits)
            tokens.setdefault(r, []).extend(p.tokens)
            lps.setdefault(r, []).extend(p.logprobs)
    for rid, top in ((greedy, 3), (sampled, 0)):
        assert len(lps[rid]) == len(tokens[rid]) == 4
        prompt_rows = len(rows[rid]) - 3  # the last prompt row gives the first token
        for i, (token, (lp, best)) in enumerate(zip(tokens[rid], lps[rid])):
            row = rows[rid][prompt_rows - 1 + i].astype(np.float64)
            ref = row - np.log(np.exp(row - row.max()).sum()) - row.max()
            assert abs(lp - ref[token]) < 1e-9
            assert [t for t, _ in best] == np.argsort(-ref, kind="stable")[:top].tolist()
    with pytest.raises(EngineError, match=r"logprobs must be an integer in \[0, 20\] or None, got 21"):
        engine.add([1, 2], logprobs=21)


def test_paged_caller_matches_the_synchronous_entry_point(artifact):
    """runtime/step_call.py's PagedCaller (the `$async` entry point, inputs through a pinned
    staging buffer, logits and next tokens written into its buffers and read back by one copy)
    gives what `iree.runtime`'s synchronous call gives: the same logits, next token and state; a
    call whose ids point into an earlier call's next tokens (`prev`, submitted before that call is
    read) reads them on the device; an input larger than the buffers it sized is refused with
    the numbers."""
    from day0.runtime.step_call import PagedCaller

    engine = Engine.load(artifact("ds-sparse"))
    vm, state = engine._vm, engine._state
    vocab, most = engine.vocab_size, max(engine.layout.batch_sizes)
    ids, pos = np.array(_ids(6, 3), dtype=np.int64), np.arange(6, dtype=np.int64)
    table, slot = np.array([[1]], dtype=np.int64), np.array([1], dtype=np.int64)
    copies = [vm.to_device(np.array(s.to_host(), copy=True)) for s in state]
    prev = np.zeros(most, np.int64)
    logits_out, next_out = np.zeros((6, vocab), np.float32), np.zeros(1, np.int64)
    want_logits, want_next = vm.to_device(logits_out), vm.to_device(next_out)
    ref = vm.function("paged_prefill")(ids, pos, table, slot, prev, want_logits, want_next, *copies)
    caller = PagedCaller(vm, [8, 8, 4, 2], most, vocab)
    first, state = caller.submit("paged_prefill", [ids, pos, table, slot], state, 6, True)
    # the next position, its token taken from the first call's next token on the device
    second, state = caller.submit(
        "paged_prefill", [np.array([-1, 5]), np.arange(6, 8), table, slot], state, 2, True, first
    )
    logits, nxt = caller.finish(first)
    np.testing.assert_array_equal(logits, want_logits.to_host())
    np.testing.assert_array_equal(nxt, want_next.to_host())
    assert len(state) == len(ref)
    want_logits2, want_next2 = vm.to_device(np.zeros((2, vocab), np.float32)), vm.to_device(next_out)
    ids2 = np.array([nxt[0], 5])
    ref = vm.function("paged_prefill")(ids2, np.arange(6, 8), table, slot, prev, want_logits2, want_next2, *ref)
    logits2, nxt2 = caller.finish(second)
    np.testing.assert_array_equal(logits2, want_logits2.to_host())
    np.testing.assert_array_equal(nxt2, want_next2.to_host())
    for a, b in zip(state, ref):
        np.testing.assert_array_equal(np.asarray(a.to_host()), np.asarray(b.to_host()))
    with pytest.raises(ValueError, match="an input of 9 elements exceeds the 8"):
        caller.submit("paged_prefill", [np.zeros(9, np.int64), pos, table, slot], state, 9, False)
