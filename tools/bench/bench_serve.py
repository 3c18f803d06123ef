"""`make bench-serve`: `day0 serve` on this CPU with the demo model, against the Engine alone.

At each concurrency C (1, 8, 32), C clients each send R streamed completion requests one after
another (prompts of P random token ids, N new tokens each, EOS ignored), through the `openai`
package's async client against a real `day0 serve` process on 127.0.0.1. Measured from the
client: requests/s, aggregate generated tokens/s, time to first token and inter-token latency
(p50 and p99; a chunk of k tokens counts k gaps of 1/k of its wait), end-to-end latency. The same
closed loop of C x R requests (a new request as soon as one finishes) then runs through the
Engine in this process, without HTTP; served tokens/s ÷ the Engine's is the server's overhead
ratio (goal >= 0.9). The clients share this machine's cores with the server: on a 2-core host
their own work is part of what the ratio measures. Results: docs/perf.md, 'day0 serve'.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from day0.tools.bench.bench_demo import arguments, demo_artifact, write_results

CONCURRENCY = (1, 8, 32)
MAX_SEQ_LEN = 512
MAX_BATCH = 32


def engine_tokens_per_s(artifact: Path, prompts: list[list[int]], concurrency: int, new: int) -> float:
    """Aggregate tokens/s of the Engine alone running `prompts` as a closed loop of `concurrency`."""
    from day0.runtime.engine import Engine

    engine = Engine.load(artifact, max_running=MAX_BATCH)
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


def main(argv=None) -> int:
    from day0.lowering.driver import BuildOptions

    p = arguments("day0-bench-serve", ".cache/bench-serve", 64, 32, 4)
    a = p.parse_args(argv)
    ckpt, artifact = demo_artifact(Path(a.workdir), BuildOptions(max_seq_len=MAX_SEQ_LEN, max_batch=MAX_BATCH))
    from day0.tools.serve.process import MODEL, ServerProcess

    rng = np.random.default_rng(0)
    rows = []
    server = ServerProcess(artifact, Path(a.workdir) / "server.log", "--log-level", "warning", "--max-queue", "1024")
    try:
        for c in CONCURRENCY:
            prompts = rng.integers(0, 256, (c, a.repeats, a.prompt_len)).tolist()
            results, wall = asyncio.run(_load(server.url, MODEL, prompts, a.decode_steps))
            flat = [q for client in prompts for q in client]
            engine_tok_s = statistics.median(engine_tokens_per_s(artifact, flat, c, a.decode_steps) for _ in range(2))
            gaps = [g for r in results for g in r["gaps"]]
            tokens = sum(r["tokens"] for r in results)
            rows.append(
                {
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
            )
    finally:
        server.close()
    print(
        f"\nday0 serve, demo deepseek_v32 on {platform.machine()} x{os.cpu_count()}: streamed completions, "
        f"prompts of {a.prompt_len} ids, {a.decode_steps} new tokens, {a.repeats} requests a client"
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
    config = {"prompt_len": a.prompt_len, "new_tokens": a.decode_steps, "requests_per_client": a.repeats}
    write_results(a, {"rows": rows, "config": config, "max_seq_len": MAX_SEQ_LEN, "max_batch": MAX_BATCH})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
