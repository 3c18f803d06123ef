"""`day0 serve` as its clients see it: a real server process on 127.0.0.1 (the demo checkpoint,
compiled once a run for the Engine, 256 positions), driven by the `openai` package, `curl` and plain HTTP.

At temperature 0 a served answer is Session.generate's tokens for the same prompt; chat prompts
are transformers' own rendering of the checkpoint's chat template; streams concatenate to the
non-streamed answer; bad requests get a 400 naming the field while good ones beside them are
unaffected; 32 concurrent clients all get their solo answers and /metrics counts them.
Faults, disconnects and overload: tests/test_serve_faults.py."""

import asyncio
import json
import subprocess
import threading
from pathlib import Path

import numpy as np
import openai
import pytest
from conftest import DEMO_MAX_SEQ_LEN

from day0.runtime.session import Session
from day0.runtime.tokenizer import load_tokenizer
from day0.tools.serve.process import MODEL, ServerProcess, get, post

PROMPTS = ["Day-0 adaptation: ", "The quick brown fox", "A sparse attention model reads", "Paged caches"]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}


@pytest.fixture(scope="module")
def server(demo_engine_artifact, tmp_path_factory):
    s = ServerProcess(demo_engine_artifact, tmp_path_factory.mktemp("serve") / "server.log", "--max-queue", "128")
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tok(demo_engine_artifact):
    return load_tokenizer(demo_engine_artifact)


@pytest.fixture(scope="module")
def solo(demo_engine_artifact):
    """Session.generate's greedy tokens for (prompt ids, n): what a served answer must equal."""
    session, cache = Session.load(demo_engine_artifact), {}

    def run(ids, n):
        key = (tuple(ids), n)
        if key not in cache:
            session.reset()
            cache[key] = session.generate(list(ids), max_new_tokens=n, stop_at_eos=False)
        return cache[key]

    return run


def _extra(obj, name):
    return obj.model_extra[name]


def test_completions_equal_session_generate(client, tok, solo):
    for prompt in PROMPTS[:2]:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, **GREEDY)
        ids, want = tok.encode(prompt), solo(tok.encode(prompt), 12)
        c = r.choices[0]
        assert _extra(c, "token_ids") == want and _extra(r, "prompt_token_ids") == ids
        assert c.text == tok.decode(want) and c.finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 12, len(ids) + 12)
    r = client.completions.create(model=MODEL, prompt=[40, 41, 42, 43, 44], max_tokens=6, **GREEDY)
    assert _extra(r.choices[0], "token_ids") == solo([40, 41, 42, 43, 44], 6)


def test_chat_renders_the_checkpoints_template_as_transformers_does(client, tok, solo, demo_engine_artifact):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(demo_engine_artifact)
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is paging?"},
        {"role": "assistant", "content": "Blocks."},
        {"role": "user", "content": "And DSA?"},
    ]
    text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    want_ids = hf.encode(text, add_special_tokens=False)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **GREEDY)
    assert _extra(r, "prompt_token_ids") == want_ids
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == tok.decode(solo(want_ids, 8))
    # content as a list of text parts is the same prompt
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    again = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=8, **GREEDY)
    assert _extra(again, "prompt_token_ids") == want_ids


def test_streams_concatenate_to_the_answer(client):
    kw = dict(model=MODEL, prompt=PROMPTS[2], max_tokens=20, **GREEDY)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in body) == whole.choices[0].text
    assert sum(len(_extra(c.choices[0], "token_ids")) for c in body) == 20
    assert [c.choices[0].finish_reason for c in body][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert len({c.id for c in chunks}) == 1

    msgs = [{"role": "user", "content": "Stream this."}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, **GREEDY)
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_curl_gets_json_and_an_event_stream(server, client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0}
    whole = client.chat.completions.create(**body)
    base = ["curl", "-sS", "-N", "--max-time", "60", "-H", "Content-Type: application/json"]
    out = subprocess.run(
        [*base, "-d", json.dumps(body), server.url + "/v1/chat/completions"], capture_output=True, text=True, timeout=90
    )
    assert json.loads(out.stdout)["choices"][0]["message"]["content"] == whole.choices[0].message.content
    out = subprocess.run(
        [*base, "-d", json.dumps({**body, "stream": True}), server.url + "/v1/chat/completions"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    events = [line for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    deltas = [json.loads(e[len("data: ") :])["choices"][0]["delta"] for e in events[:-1]]
    assert "".join(d.get("content", "") for d in deltas) == whole.choices[0].message.content


def test_stop_strings_and_stop_token_ids(client, tok):
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=24, **GREEDY)
    base = client.completions.create(**kw).choices[0]
    text, tokens = base.text, _extra(base, "token_ids")
    stop = text[6:9]
    cut = text.find(stop)
    r = client.completions.create(**kw, stop=[stop, "never in the text \u2603"])
    assert r.choices[0].text == text[:cut] and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(**kw, stop=stop, stream=True)
    pieces = [(c.choices[0].text, c.choices[0].finish_reason) for c in streamed]
    assert "".join(t for t, _ in pieces) == text[:cut] and pieces[-1][1] == "stop"
    # a stop token id: generation ends on it; it is counted and returned as an id, not as text
    k = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    r = client.completions.create(**{**kw, "extra_body": {**GREEDY["extra_body"], "stop_token_ids": [tokens[k]]}})
    assert _extra(r.choices[0], "token_ids") == tokens[: k + 1] and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == tok.decode(tokens[:k]) and r.usage.completion_tokens == k + 1


def test_logprobs_are_the_models_log_softmax(client, tok, demo_engine_artifact):
    ids = tok.encode(PROMPTS[1])
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=5, logprobs=2, **GREEDY)
    c = r.choices[0]
    tokens = _extra(c, "token_ids")
    s = Session.load(demo_engine_artifact)
    rows = [s.prefill(ids)[-1]] + [s.decode(t) for t in tokens[:-1]]
    for t, row, lp, top in zip(tokens, rows, c.logprobs.token_logprobs, c.logprobs.top_logprobs):
        row = row.astype(np.float64)
        ref = row - row.max() - np.log(np.exp(row - row.max()).sum())
        assert abs(lp - ref[t]) < 1e-4
        assert len(top) == 2 and max(top.values()) == pytest.approx(ref.max(), abs=1e-4)
    assert len(c.logprobs.tokens) == len(c.logprobs.text_offset) == 5
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob for e in content)
    assert all(e.logprob == e.top_logprobs[0].logprob for e in content)  # greedy: the chosen is the likeliest


def test_a_seed_gives_the_same_sample(client):
    kw = dict(model=MODEL, prompt=PROMPTS[3], max_tokens=16, temperature=0.9, top_p=0.95)
    a = client.completions.create(**kw, seed=5, extra_body={"top_k": 50}).choices[0].text
    b = client.completions.create(**kw, seed=5, extra_body={"top_k": 50}).choices[0].text
    c = client.completions.create(**kw, seed=6, extra_body={"top_k": 50}).choices[0].text
    assert a == b and a != c


BAD = [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "5"}, "max_tokens", "valid integer"),
    ({"model": "gpt-9", "prompt": "x"}, "model", "not served here"),
    ({"model": MODEL}, "prompt", "required"),
    ({"model": MODEL, "prompt": "x" * (4 * DEMO_MAX_SEQ_LEN)}, "prompt", f"the model's context is {DEMO_MAX_SEQ_LEN}"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": DEMO_MAX_SEQ_LEN}, "max_tokens", "max_tokens may be at most"),
    ({"model": MODEL, "prompt": [1, 9999]}, "prompt", "token id 9999 is outside the vocabulary [0, 2048)"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature", "greater than or equal to 0"),
    ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"model": MODEL, "prompt": "hi", "top_k": -2}, "top_k", "greater than or equal to -1"),
    ({"model": MODEL, "prompt": "hi", "seed": -3}, "seed", "greater than or equal to 0"),
    ({"model": MODEL, "prompt": "hi", "n": 2}, "n", "not supported"),
    ({"model": MODEL, "prompt": "hi", "stop": ""}, "stop", "must not be empty"),
    ({"model": MODEL, "prompt": "hi", "frobnicate": 1}, "frobnicate", "unknown or unsupported parameter"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 9}, "logprobs", "less than or equal to 5"),
]
BAD_CHAT = [
    ({"model": MODEL, "messages": []}, "messages", "at least 1 item"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages.0.content", "a string or a list"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "'system'"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages.0.content",
        "vision tower",
    ),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 50}, "top_logprobs", "20"),
]


def test_bad_requests_get_a_400_naming_the_field_and_change_nothing_for_good_ones(server, client, tok, solo):
    good, answers = [PROMPTS[0], PROMPTS[3]], {}

    def ask(prompt):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, **GREEDY)
        answers[prompt] = _extra(r.choices[0], "token_ids")

    threads = [threading.Thread(target=ask, args=(p,)) for p in good]
    for t in threads:
        t.start()
    for path, cases in (("/v1/completions", BAD), ("/v1/chat/completions", BAD_CHAT)):
        for body, param, words in cases:
            status, raw, _ = post(server.url + path, body)
            assert status == 400, (body, raw)
            error = json.loads(raw)["error"]
            assert error["param"] == param and words in error["message"], (body, error)
            assert error["type"] == "invalid_request_error" and "Traceback" not in raw.decode()
    for t in threads:
        t.join(120)
    assert {p: answers[p] for p in good} == {p: solo(tok.encode(p), 30) for p in good}
    assert server.metrics()['day0_request_errors_total{status="400"}'] >= len(BAD) + len(BAD_CHAT)


def test_32_concurrent_clients_get_their_solo_answers_and_are_counted(server, tok, solo):
    """A bounded load test: 32 clients x 3 requests (completions and chat, streamed and not) on
    loopback, all at temperature 0; every answer equals its solo answer; /metrics moved by what
    was sent."""
    before = server.metrics()

    async def one_client(i: int, api: openai.AsyncOpenAI):
        out = []
        for j in range(3):
            prompt, stream = PROMPTS[(i + j) % len(PROMPTS)], (i + j) % 2 == 1
            if j == 2:  # chat
                msgs = [{"role": "user", "content": prompt}]
                if stream:
                    chunks = [
                        c
                        async for c in await api.chat.completions.create(
                            model=MODEL,
                            messages=msgs,
                            max_tokens=10,
                            stream=True,
                            stream_options={"include_usage": True},
                            **GREEDY,
                        )
                    ]
                    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    out.append(("chat", prompt, text, chunks[-1].usage))
                else:
                    r = await api.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, **GREEDY)
                    out.append(("chat", prompt, r.choices[0].message.content, r.usage))
            elif stream:
                chunks = [
                    c
                    async for c in await api.completions.create(
                        model=MODEL,
                        prompt=prompt,
                        max_tokens=12,
                        stream=True,
                        stream_options={"include_usage": True},
                        **GREEDY,
                    )
                ]
                out.append(("text", prompt, "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage))
            else:
                r = await api.completions.create(model=MODEL, prompt=prompt, max_tokens=12, **GREEDY)
                out.append(("text", prompt, r.choices[0].text, r.usage))
        return out

    async def run_all():
        api = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            return await asyncio.wait_for(asyncio.gather(*(one_client(i, api) for i in range(32))), 240)
        finally:
            await api.close()

    results = [r for client_results in asyncio.run(run_all()) for r in client_results]
    assert len(results) == 96
    template = _chat_ids(tok)
    for kind, prompt, text, _ in results:
        ids = template(prompt) if kind == "chat" else tok.encode(prompt)
        assert text == tok.decode(solo(ids, 10 if kind == "chat" else 12)), (kind, prompt)
    after = server.metrics()

    def moved(name):
        return after.get(name, 0) - before.get(name, 0)

    assert moved('day0_requests_finished_total{finish_reason="length"}') == 96
    assert moved("day0_prompt_tokens_total") == sum(u.prompt_tokens for *_, u in results)
    assert moved("day0_generation_tokens_total") == sum(u.completion_tokens for *_, u in results)
    assert moved("day0_time_to_first_token_seconds_count") == 96
    assert moved("day0_e2e_request_latency_seconds_count") == 96
    assert after["day0_requests_running"] == 0 and after["day0_kv_blocks_used"] == 0


def _chat_ids(tok):
    from day0.tools.serve.chat import load_chat_template

    template = load_chat_template(Path(tok.path).parent)
    return lambda prompt: tok.encode(template.render([{"role": "user", "content": prompt}]))


def test_models_health_metrics_and_request_ids(server):
    status, raw, _ = get(server.url + "/v1/models")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == MODEL
    assert get(server.url + "/health")[0] == 200
    status, raw, headers = post(
        server.url + "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": 2},
        headers={"X-Request-Id": "t-42"},
    )
    assert status == 200 and headers["x-request-id"] == "t-42" and json.loads(raw)["id"] == "t-42"
    names = server.metrics()
    for name in (
        "day0_requests_running",
        'day0_requests_waiting{kind="text"}',
        'day0_requests_waiting{kind="image"}',
        "day0_kv_blocks_used",
        "day0_kv_blocks_free",
        "day0_time_to_first_token_seconds_count",
        "day0_inter_token_latency_seconds_count",
        "day0_e2e_request_latency_seconds_count",
        "day0_prompt_tokens_total",
        "day0_generation_tokens_total",
        "day0_ready",
    ):
        assert name in names, name
    lines = server.log_lines()
    mine = [line for line in lines if line.get("request_id") == "t-42"]
    assert {line["message"] for line in mine} >= {"queued", "finished", "access"}
    assert {line["logger"] for line in mine} >= {"day0.server", "day0.engine"}
    about_requests = [line for line in lines if line["message"] in ("queued", "finished", "access", "refused")]
    assert about_requests and all("request_id" in line for line in about_requests)
