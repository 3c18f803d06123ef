"""`make bench-serve`: `day0 serve` on this CPU with the demo model, against the Engine alone.

At each concurrency C (1, 8, 32), C clients each send R streamed completion requests one after
another (at least 8 a level, so that one client's ratio is not two requests' noise; prompts of P
random token ids, N new tokens each, EOS ignored), through the `openai` package's async client
against a real `day0 serve` process on 127.0.0.1. Measured from the client: requests/s,
aggregate generated tokens/s, time to first token and inter-token latency (p50 and p99; a chunk
of k tokens counts k gaps of 1/k of its wait), end-to-end latency. The same
closed loop of C x R requests (a new request as soon as one finishes) then runs through the
Engine in this process, without HTTP; served tokens/s ÷ the Engine's is the server's overhead
ratio (goal >= 0.9). The clients share this machine's cores with the server: on a 2-core host
their own work is part of what the ratio measures. Results: docs/perf.md, 'day0 serve'.

On a GPU host (the serve piece of the H200 runs, docs/perf.md): `--artifact ART --device cuda
--checkpoint-dir CKPT` serves a compiled artifact instead of building the demo; this module then
needs numpy, the runtime and the server's packages there, not the compiler. The Engine-alone runs
come after the server has stopped, so that the two never share the device.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

CONCURRENCY = "1,8,32"
MAX_SEQ_LEN = 512  # the demo artifact's
MAX_BATCH = 32
CHUNK = 64  # prompt tokens an engine step runs (`day0 serve --prefill-chunk`'s default)


def engine_tokens_per_s(artifact: Path, prompts: list[list[int]], concurrency: int, new: int, **load) -> float:
    """Aggregate tokens/s of the Engine alone running `prompts` as a closed loop of `concurrency`."""
    from day0.runtime.engine import Engine

    engine = Engine.load(artifact, **load)
    todo, running, tokens = list(prompts), 0, 0
    t0 = time.perf_counter()
    while todo or running:
        while todo and running < concurrency:
            engine.add(todo.pop(), max_new_tokens=new, stop=())
            running += 1
        for p in engine.step().values():
            tokens += len(p.tokens)
            running -= p.finished is not None
    return tokens / (time.perf_counter() - t0)


async def _client(api, model: str, prompts: list[list[int]], new: int, out: list) -> None:
    for prompt in prompts:
        t0 = time.perf_counter()
        stream = await api.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=new,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        first, last, gaps, n = None, t0, [], 0
        async for chunk in stream:
            k = len(chunk.choices[0].model_extra.get("token_ids") or []) if chunk.choices else 0
            if not k:
                continue
            now = time.perf_counter()
            if first is None:
                first = now - t0
                gaps += [(now - last) / k] * (k - 1)  # a first chunk of several tokens
            else:
                gaps += [(now - last) / k] * k
            last, n = now, n + k
        out.append({"ttft": first, "gaps": gaps, "e2e": last - t0, "tokens": n})


async def _load(url: str, model: str, per_client: list[list[list[int]]], new: int) -> tuple[list, float]:
    import openai

    api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    out: list = []
    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(_client(api, model, ps, new, out) for ps in per_client)), 1800)
    finally:
        await api.close()
    return out, time.perf_counter() - t0


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _arguments(argv):
    import argparse

    p = argparse.ArgumentParser(prog="day0-bench-serve")
    p.add_argument("--workdir", default=".cache/bench-serve")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128, help="tokens a request generates")
    p.add_argument("--requests", type=int, default=4, help="requests a client sends, one after another")
    p.add_argument(
        "--min-requests", type=int, default=8, help="at least this many requests a level (few clients send more)"
    )
    p.add_argument("--concurrency", default=CONCURRENCY, help="client counts, e.g. 1,8,32")
    p.add_argument("--json", default=None, help="write results here (default WORKDIR/bench.json)")
    p.add_argument("--artifact", default=None, help="serve this artifact (default: build the demo's)")
    p.add_argument("--device", default=None)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--chunk", type=int, default=CHUNK)
    return p.parse_args(argv)


def _row(c: int, results: list, wall: float, engine_tok_s: float) -> dict:
    gaps = [g for r in results for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in results)
    return {
        "concurrency": c,
        "requests": len(results),
        "requests_s": len(results) / wall,
        "served_tok_s": tokens / wall,
        "engine_tok_s": engine_tok_s,
        "overhead_ratio": tokens / wall / engine_tok_s,
        "ttft_p50_s": _pct([r["ttft"] for r in results], 50),
        "ttft_p99_s": _pct([r["ttft"] for r in results], 99),
        "itl_p50_s": _pct(gaps, 50),
        "itl_p99_s": _pct(gaps, 99),
        "e2e_p50_s": _pct([r["e2e"] for r in results], 50),
    }


def main(argv=None) -> int:
    a = _arguments(argv)
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if a.artifact is None:
        from day0.lowering.driver import BuildOptions
        from day0.tools.bench.bench_demo import demo_artifact

        _, artifact = demo_artifact(work, BuildOptions(max_seq_len=MAX_SEQ_LEN, max_batch=MAX_BATCH))
    else:
        artifact = Path(a.artifact)
    from day0.tools.serve.process import MODEL, ServerProcess

    concurrency = [int(c) for c in a.concurrency.split(",")]
    most = max(concurrency)
    serve_args = ["--log-level", "warning", "--max-queue", "4096", "--prefill-chunk", str(a.chunk), "--no-verify"]
    serve_args += ["--max-batch", str(most)] + (["--device", a.device] if a.device else [])
    serve_args += ["--checkpoint-dir", a.checkpoint_dir] if a.checkpoint_dir else []
    rng = np.random.default_rng(0)
    per_client = {c: max(a.requests, -(-a.min_requests // c)) for c in concurrency}
    prompts = {c: rng.integers(0, 256, (c, per_client[c], a.prompt_len)).tolist() for c in concurrency}
    served = {}
    server = ServerProcess(artifact, work / "server.log", *serve_args)
    try:
        for c in concurrency:
            served[c] = asyncio.run(_load(server.url, MODEL, prompts[c], a.new_tokens))
    finally:
        server.close()
    load = dict(device=a.device, checkpoint_dir=a.checkpoint_dir, verify=False, chunk=a.chunk, max_running=most)
    rows = []
    for c in concurrency:
        flat = [q for client in prompts[c] for q in client]
        rows.append(_row(c, *served[c], engine_tokens_per_s(artifact, flat, c, a.new_tokens, **load)))
    print(
        f"\nday0 serve, {artifact.name} on {a.device or 'its first device'} ({platform.machine()} x{os.cpu_count()}): "
        f"streamed completions, prompts of {a.prompt_len} ids, {a.new_tokens} new tokens, {a.requests} requests a client (at least {a.min_requests} a level)"
    )
    print(
        f"{'conc':>5}{'req/s':>8}{'tok/s':>9}{'engine':>9}{'ratio':>7}{'TTFT p50':>10}{'p99':>8}"
        f"{'ITL p50':>9}{'p99':>8}{'e2e p50':>9}"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>5}{r['requests_s']:>8.1f}{r['served_tok_s']:>9.1f}{r['engine_tok_s']:>9.1f}"
            f"{r['overhead_ratio']:>7.2f}{1e3 * r['ttft_p50_s']:>8.1f}ms{1e3 * r['ttft_p99_s']:>6.1f}ms"
            f"{1e3 * r['itl_p50_s']:>7.2f}ms{1e3 * r['itl_p99_s']:>6.2f}ms{1e3 * r['e2e_p50_s']:>7.0f}ms"
        )
    config = {"prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "requests_per_client": per_client}
    out = Path(a.json) if a.json else work / "bench.json"
    out.write_text(
        json.dumps({"rows": rows, "config": config, "artifact": str(artifact), "device": a.device}, indent=2)
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
