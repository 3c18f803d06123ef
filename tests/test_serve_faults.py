"""`day0 serve` when things go wrong: an internal error in one request, clients that leave
mid-answer, more requests than the queue takes, a stop signal while answering, and arguments
`day0 serve` refuses before binding its port.

The server here is the real one with test instruments (tests/serve_instrumented.py): each engine
step sleeps 20 ms, so that an answer of N tokens takes about N x 20 ms and a test can act
mid-answer, and a request with seed 666 raises inside its handler."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from day0.tools.serve.process import MODEL, ServerProcess, get, post

sys.path.insert(0, str(Path(__file__).parent))
from serve_instrumented import FAULT_SEED  # noqa: E402

WAIT_S = 30


@pytest.fixture(scope="module")
def server(demo_engine_artifact, tmp_path_factory):
    s = ServerProcess(
        demo_engine_artifact,
        tmp_path_factory.mktemp("serve-faults") / "server.log",
        "--max-batch",
        "1",
        "--max-queue",
        "2",
        module="serve_instrumented",
        path=[Path(__file__).parent],
    )
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _until(server, check, what: str):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        m = server.metrics()
        if check(m):
            return m
        time.sleep(0.05)
    pytest.fail(f"not within {WAIT_S} s: {what}; metrics {server.metrics()}")


def _idle(m) -> bool:
    return m["day0_requests_running"] == 0 and m["day0_kv_blocks_used"] == 0


ABORTS = 'day0_requests_finished_total{finish_reason="abort"}'


def test_an_internal_error_is_a_500_for_that_request_only(server, client):
    good = {}

    def ask():
        good["r"] = client.completions.create(model=MODEL, prompt="fine", max_tokens=8, temperature=0)

    t = threading.Thread(target=ask)
    t.start()
    status, raw, headers = post(
        server.url + "/v1/completions", {"model": MODEL, "prompt": "boom", "max_tokens": 8, "seed": FAULT_SEED}
    )
    t.join(WAIT_S)
    error = json.loads(raw)["error"]
    rid = headers["x-request-id"]
    assert status == 500 and error["message"] == f"internal error (request {rid})" and "Traceback" not in raw.decode()
    assert good["r"].choices[0].finish_reason == "length" and good["r"].usage.completion_tokens == 8
    # streamed: the error arrives as one event, then [DONE]
    out = subprocess.run(
        ["curl", "-sS", "-N", "--max-time", "60", "-H", "Content-Type: application/json", "-d",
         json.dumps({"model": MODEL, "prompt": "boom", "max_tokens": 8, "seed": FAULT_SEED, "stream": True}),
         server.url + "/v1/completions"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    events = [line[len("data: ") :] for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["type"] == "internal_error"
    logged = [line for line in server.log_lines() if line.get("request_id") == rid and line["level"] == "ERROR"]
    assert logged and "RuntimeError: injected fault" in logged[0]["exc_info"]
    _until(server, _idle, "the failed requests' blocks freed")
    # and the server goes on serving
    assert client.completions.create(model=MODEL, prompt="after", max_tokens=3).usage.completion_tokens == 3


def test_a_client_leaving_mid_stream_frees_its_blocks(server, client):
    aborts = server.metrics().get(ABORTS, 0)
    stream = client.completions.create(
        model=MODEL, prompt="long", max_tokens=100, stream=True, extra_body={"ignore_eos": True}
    )
    for i, _ in enumerate(stream):
        if i == 2:
            break
    assert server.metrics()["day0_kv_blocks_used"] > 0
    stream.close()
    m = _until(server, lambda m: _idle(m) and m.get(ABORTS, 0) == aborts + 1, "the stream's request aborted")
    assert m["day0_kv_blocks_free"] > 0


def test_a_client_leaving_before_its_answer_frees_its_blocks(server):
    aborts = server.metrics().get(ABORTS, 0)
    body = json.dumps({"model": MODEL, "prompt": "long", "max_tokens": 100, "ignore_eos": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as s:
        s.sendall(head.encode() + b"\r\n\r\n" + body)
        _until(server, lambda m: m["day0_requests_running"] == 1, "the request running")
    _until(server, lambda m: _idle(m) and m.get(ABORTS, 0) == aborts + 1, "the request aborted")


def test_past_the_queue_limit_requests_get_429_and_the_others_finish(server):
    results = []

    def ask(i):
        results.append(
            post(
                server.url + "/v1/completions",
                {"model": MODEL, "prompt": f"q{i}", "max_tokens": 10, "ignore_eos": True},
            )
        )

    before = server.metrics().get('day0_request_errors_total{status="429"}', 0)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 2)
    statuses = sorted(status for status, _, _ in results)
    assert len(results) == 8 and set(statuses) == {200, 429}, statuses
    for status, raw, headers in results:
        body = json.loads(raw)
        if status == 429:
            assert headers["retry-after"] == "1" and body["error"]["code"] == "queue_full"
            assert "queue limit (2 requests waiting)" in body["error"]["message"]
        else:
            assert body["usage"]["completion_tokens"] == 10
    after = server.metrics()['day0_request_errors_total{status="429"}']
    assert after - before == statuses.count(429)


def test_a_stop_signal_lets_running_answers_finish(demo_engine_artifact, tmp_path):
    s = ServerProcess(
        demo_engine_artifact, tmp_path / "server.log", module="serve_instrumented", path=[Path(__file__).parent]
    )
    try:
        api = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        stream = api.completions.create(
            model=MODEL, prompt="bye", max_tokens=40, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = [next(iter(stream))]
        s.proc.terminate()
        chunks += list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert s.proc.wait(WAIT_S) is not None
    finally:
        s.close()


def test_an_artifact_without_tokenizer_or_chat_template(artifact, tmp_path):
    """A checkpoint may ship neither: chat is a 400 naming the missing template, a text prompt a
    400 asking for token ids, and token ids are served (ids back, no text)."""
    s = ServerProcess(artifact("ds-sparse"), tmp_path / "server.log")
    try:
        status, raw, _ = post(
            s.url + "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        )
        error = json.loads(raw)["error"]
        assert status == 400 and error["code"] == "no_chat_template" and error["param"] == "messages"
        status, raw, _ = post(s.url + "/v1/completions", {"model": MODEL, "prompt": "text"})
        assert status == 400 and "send the prompt as token ids" in json.loads(raw)["error"]["message"]
        body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True, "return_token_ids": True}
        status, raw, _ = post(s.url + "/v1/completions", body)
        choice = json.loads(raw)["choices"][0]
        assert status == 200 and len(choice["token_ids"]) == 3 and choice["text"] == ""
    finally:
        s.close()


def test_health_is_503_until_the_warm_up_ran(demo_engine_artifact, tmp_path):
    """With 0.1 s a step the warm-up takes about a second: /health answers 503 'warming up' (and
    /metrics day0_ready 0) while it runs, then 200; a request sent meanwhile is answered after."""
    s = ServerProcess(
        demo_engine_artifact,
        tmp_path / "server.log",
        module="serve_instrumented",
        path=[Path(__file__).parent],
        env={"DAY0_TEST_STEP_DELAY_S": "0.1"},
        wait=False,
    )
    try:
        seen, early = [], None
        deadline = time.monotonic() + WAIT_S * 4
        while time.monotonic() < deadline and 200 not in seen:
            try:
                # the gauge first: ready never goes back to 0, so a 503 after it means it read 0
                ready = s.metrics()["day0_ready"]
                status, raw, _ = get(s.url + "/health", timeout=5)
            except OSError:  # not listening yet
                time.sleep(0.05)
                continue
            seen.append(status)
            if status == 503:
                assert json.loads(raw) == {"status": "warming up"}
                assert ready == 0
                if early is None:
                    early = threading.Thread(
                        target=lambda: seen.append(
                            post(s.url + "/v1/completions", {"model": MODEL, "prompt": "early", "max_tokens": 2})[0]
                        )
                    )
                    early.start()
            time.sleep(0.05)
        assert seen[0] == 503 and 200 in seen, seen
        early.join(WAIT_S)
        assert seen[-1] == 200 and s.metrics()["day0_ready"] == 1
    finally:
        s.close()


@pytest.mark.parametrize(
    "args, words",
    [
        (["/no/such/artifact"], "/no/such/artifact"),
        (["ART", "--port", "70000"], "--port must be in 0..65535 (got 70000)"),
        (["ART", "--log-levels", "gpu=info"], "--log-levels: unknown layer 'gpu'"),
        (["ART", "--max-queue", "0"], "--max-queue must be >= 1 (got 0)"),
        (["ART", "--kv-memory", "1000"], "the Engine needs at least 2 blocks"),
        (["DENSE"], "no paged entry points: compile it with --max-batch N"),
    ],
)
def test_serve_refuses_bad_arguments_before_binding(demo_engine_artifact, artifact, args, words):
    args = [
        str(demo_engine_artifact) if a == "ART" else str(artifact("ds-tiles-mxfp4")) if a == "DENSE" else a
        for a in args
    ]
    out = subprocess.run(
        [sys.executable, "-m", "day0.tools.cli", "serve", *args, "--port" if "--port" not in args else "--host",
         "0" if "--port" not in args else "127.0.0.1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr
