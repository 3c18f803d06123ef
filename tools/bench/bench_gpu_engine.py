"""The Engine on the GPU: aggregate decode tokens/s of the 4.9B `deepseek_v32` benchmark model
(tools/bench/bench_checkpoint.py) at 1, 8, 32 and 64 concurrent sequences with prompts of 4K
tokens, against transformers eager at the same batch and against the bytes a step must read ÷
the measured copy bandwidth. Part of `make bench-gpu` (piece `engine`); results in docs/perf.md,
section 'The Engine at real size on the H200'.

package (compile machine): writes the seeded checkpoint and compiles it with the paged entry
points (--max-batch, the target's default cache dtype) into out/engine/artifact.
run (GPU host): writes the same checkpoint from the same seed, then for each batch B:
  day0    `distinct` requests of random prompts run by one Engine (prompt chunks, then batched
          decode); the other max(B) − distinct sequences are copies of those (`_copies`: their
          blocks and slot hold a copy of one source's, each starts decoding from its own random
          token, so that routing differs per sequence and no two read the same blocks). At
          today's paged prefill speed the 64 × 4K prompts would take minutes of the device
          budget; a decode step reads the same bytes either way. Once all decode, for each B
          from the largest down (aborting sequences down to B), the median of STEPS steps (each
          advances every sequence): step ms, tokens/s = B ÷ step; the pool's bytes per sequence;
          the first sequence's logits (prompt and every step) checked teacher-forced against
          Session (the artifact's dense entry points).
  limit   bytes a step must read ÷ copy bandwidth: every weight but the routed experts no
          sequence chose (expected over uniform routing: E·(1 − (1 − k/E)^B) of E per layer),
          plus each sequence's indexer keys (all its rows) and selected latent rows.
  transformers  DeepseekV32ForCausalLM (bf16, the same weights; MXFP4 dequantized, exact in
          bf16): the B prompts prefilled together in chunks, then the median of STEPS greedy
          [B, 1] steps with its DynamicCache.
Also: one sequence through Session's dense decode (the pre-Engine path), for the one-sequence
goal; device bytes per sequence at 1K and 4K tokens (the pool blocks it holds).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

STEPS = 16
WARM = 3
SETTINGS = {
    "full": {
        "checkpoint": "e2e",
        "prompt": 4096,
        "short_prompt": 1024,
        "max_seq_len": 4096 + 128,
        "batches": [1, 8, 32, 64],
        "distinct": 4,
        "block_size": 64,
        "chunk": 512,
        "transformers_chunk": 256,
    },
    "tiny": {
        "checkpoint": "tiny",
        "prompt": 24,
        "short_prompt": 8,
        "max_seq_len": 96,
        "batches": [1, 2, 3],
        "distinct": 2,
        "block_size": 4,
        "chunk": 8,
        "transformers_chunk": 8,
    },
}
SEED = 0
SHIPPED = ["tools/bench/bench_gpu_engine.py"]
# piece `serve`: `day0 serve` on the same artifact (tools/bench/bench_serve.py), clients on the host
SERVE = {
    "full": {
        "concurrency": "1,8,32,64",
        "prompt": 512,
        "new_tokens": 128,
        "requests": 2,
        "min_requests": 8,
        "chunk": 512,
    },
    "tiny": {"concurrency": "1,3", "prompt": 8, "new_tokens": 4, "requests": 1, "min_requests": 1, "chunk": 8},
}
SERVE_SHIPPED = [
    *(f"tools/serve/{f.name}" for f in sorted((Path(__file__).resolve().parents[1] / "serve").glob("*.py"))),
    "tools/bench/bench_serve.py",
]


def package(out: Path, config: str, target: str, cache: Path) -> dict:
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.tools.bench import bench_checkpoint, bench_e2e

    s = SETTINGS[config]
    ckpt = bench_checkpoint.write(cache / f"ckpt-{s['checkpoint']}-{SEED}", s["checkpoint"], SEED)
    art = out / "engine" / "artifact"
    if art.exists():
        shutil.rmtree(art)
    options = BuildOptions(
        target=target, max_seq_len=s["max_seq_len"], max_batch=max(s["batches"]), block_size=s["block_size"]
    )
    compile_checkpoint(ckpt, art, options)
    bench_e2e.ship_sources(out, bench_e2e.SHIPPED + SHIPPED)
    return {"checkpoint": s["checkpoint"], "seed": SEED, **s}


def package_serve(out: Path, config: str, target: str, cache: Path, engine: dict | None) -> dict:
    """The serve piece: the engine piece's artifact (compiled here when that piece is not in the
    package) and the server's sources; its packages travel as wheels (Makefile `bench-gpu`)."""
    from day0.tools.bench import bench_e2e

    engine = engine or package(out, config, target, cache)
    bench_e2e.ship_sources(out, SERVE_SHIPPED)
    return {**SERVE[config], "engine": engine}


def run_serve(pkg: Path, spec: dict, device: str) -> dict:
    """`day0 serve` of out/engine/artifact against the Engine alone (bench_serve.py)."""
    from day0.tools.bench import bench_checkpoint, bench_serve

    s, e = spec["serve"], spec["serve"]["engine"]
    ckpt = bench_checkpoint.write(pkg / f"ckpt-{e['checkpoint']}-{e['seed']}", e["checkpoint"], e["seed"])
    out = pkg / "serve-results.json"
    bench_serve.main(
        [
            *("--artifact", str(pkg / "engine" / "artifact"), "--device", device, "--checkpoint-dir", str(ckpt)),
            *("--concurrency", s["concurrency"], "--prompt-len", str(s["prompt"]), "--chunk", str(s["chunk"])),
            *("--new-tokens", str(s["new_tokens"]), "--requests", str(s["requests"])),
            *("--min-requests", str(s["min_requests"])),
            *("--workdir", str(pkg / "serve-work"), "--json", str(out)),
        ]
    )
    return {"piece": "serve", **json.loads(out.read_text())}


# ---------------------------------------------------------------------------------------------
# run (GPU host)


def weight_bytes(shards: Path) -> dict:
    """The checkpoint's bytes: routed experts and everything else (from the shards' headers)."""
    from day0.models.checkpoint import read_shard_header

    out = {"experts": 0, "other": 0}
    for f in sorted(shards.glob("*.safetensors")):
        for name, info in read_shard_header(f).items():
            out["experts" if ".mlp.experts." in name else "other"] += info.nbytes
    return out


def step_bytes(raw: dict, weights: dict, manifest, batch: int, length: int) -> dict:
    """Bytes one decode step of `batch` sequences at `length` tokens must read (module docstring);
    weights: weight_bytes of the checkpoint."""
    e, k = raw["n_routed_experts"], raw["num_experts_per_tok"]
    chosen = 1 - (1 - k / e) ** batch
    row = {p.kind: p.nbytes // p.shape[0] for p in manifest.paged.pools}  # a pool row's bytes
    per_seq = raw["num_hidden_layers"] * (
        length * row["indexer_keys"] + min(raw["index_topk"], length) * row["mla_latent"]
    )
    return {"weights": weights["other"] + weights["experts"] * chosen, "caches": batch * per_seq}


def _fill(eng, prompts: list[list[int]], keep_first: bool, new_tokens: int) -> dict:
    """Add the prompts and step until every one decodes; returns the request ids, the tokens and
    (keep_first) the first request's logits so far, and the time it took."""
    rids = [
        eng.add(p, max_new_tokens=new_tokens, stop=(), keep_logits=keep_first and i == 0) for i, p in enumerate(prompts)
    ]
    run = {"rids": rids, "tokens": {r: [] for r in rids}, "logits": []}
    t0 = time.perf_counter()
    while any(eng.phase(r) != "decoding" for r in rids):
        _record(run, eng.step())
        if any(eng.phase(r) is None for r in rids):
            raise RuntimeError(f"a request finished while the prompts ran: give more than {new_tokens} new tokens")
    run["prefill_s"] = time.perf_counter() - t0
    return run


def _ttft(eng, prompt: list[int]) -> float:
    """Seconds from adding a greedy request alone to its first token (its prompt's chunks)."""
    t0 = time.perf_counter()
    rid = eng.add(prompt, max_new_tokens=1, stop=())
    while eng.phase(rid) is not None:  # one new token: it finishes with its first
        eng.step()
    return time.perf_counter() - t0


def _copies(eng, run: dict, count: int, new_tokens: int, rng) -> None:
    """`count` more running sequences, the i-th a copy of run's (i mod distinct)-th: the same
    prompt and cache rows in blocks of its own, its source's slot state, and a random token of
    its own to decode next. Uses the Engine's internals (one host round trip of the state);
    the bench's way to fill many long caches without running every prompt."""
    import numpy as np

    sources = [eng._running[r] for r in run["rids"]]
    host = [np.array(a.to_host(), copy=True) for a in eng._state]
    pools = len(eng.layout.pools)
    for i in range(count):
        src = sources[i % len(sources)]
        rid = eng.add(src.prompt.tolist(), max_new_tokens=new_tokens, stop=())
        eng._admit()
        seq = eng._running[rid]
        seq.fed, seq.out = src.fed, [int(rng.integers(0, eng.vocab_size))]
        for a, b in zip(eng._table(src, src.fed), eng._table(seq, seq.fed)):
            for t in host[:pools]:
                n = t.shape[0] // eng.blocks.num_blocks  # the pool's rows per block
                t[b * n : (b + 1) * n] = t[a * n : (a + 1) * n]
        for t in host[pools:]:
            t[seq.slot] = t[src.slot]
        run["rids"].append(rid)
        run["tokens"][rid] = []
    eng._state = [eng._vm.to_device(t) for t in host]


def _record(run: dict, progress: dict) -> None:
    for r, prog in progress.items():
        run["tokens"][r] += prog.tokens
        if r == run["rids"][0]:
            run["logits"] += prog.logits


def _decode_steps(eng, run: dict) -> float:
    """The median of STEPS batched decode steps (after WARM) over the running sequences."""
    import numpy as np

    times = []
    for _ in range(WARM + STEPS):
        t0 = time.perf_counter()
        progress = eng.step()
        times.append(time.perf_counter() - t0)
        _record(run, progress)
    return float(np.median(times[WARM:]))


def _session_check(art: Path, ckpt: Path, device: str, prompt: list[int], tokens: list[int], logits) -> dict:
    """Session (dense entry points) on the same prompt and tokens: teacher-forced agreement and
    its one-sequence greedy decode step."""
    import numpy as np

    from day0.runtime.session import Session

    s = Session.load(art, device=device, verify=False, checkpoint_dir=ckpt)
    rows = [s.prefill(prompt)]
    rows += [s.decode(t)[None] for t in tokens[: len(logits) - len(prompt)]]
    want = np.concatenate(rows)
    got = np.stack(logits)
    err = np.abs(got - want).max(1) / np.abs(want).max(1)
    s.reset()
    tok = s.prefill_greedy(prompt)
    times = []
    for _ in range(WARM + STEPS):
        t0 = time.perf_counter()
        tok = s.decode_greedy(tok)
        times.append(time.perf_counter() - t0)
    return {
        "prompt_max_rel_err": float(err[: len(prompt)].max()),
        "decode_max_rel_err": float(err[len(prompt) :].max()) if len(err) > len(prompt) else 0.0,
        "same_greedy_rows": float((got.argmax(1) == want.argmax(1)).mean()),
        "session_decode_ms": 1e3 * float(np.median(times[WARM:])),
    }


def _transformers_batch(ref, cfg, prompts: list[list[int]], chunk: int, dev: str, rng) -> dict:
    """transformers eager: the batch's prompts prefilled together in chunks, then STEPS greedy
    [B, 1] steps (median) from a random token per row (as the Engine's copies: rows with the same
    prompt route apart)."""
    import numpy as np
    import torch
    import transformers

    from day0.tools.bench import bench_e2e

    ids = torch.tensor(prompts, device=dev)
    cache = transformers.DynamicCache(config=cfg)
    with torch.no_grad():
        for lo in range(0, ids.shape[1], chunk):
            out = ref(ids[:, lo : lo + chunk], past_key_values=cache, use_cache=True)
        del out
        tok = torch.tensor(rng.integers(0, cfg.vocab_size, (ids.shape[0], 1)), device=dev)
        times = []
        for _ in range(WARM + STEPS):
            bench_e2e._sync(dev)
            t0 = time.perf_counter()
            tok = ref(tok, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            tok.cpu()
            times.append(time.perf_counter() - t0)
    del cache
    return {"step_s": float(np.median(times[WARM:]))}


def run(pkg: Path, spec: dict, device: str, bw: float) -> dict:
    """The engine rows (module docstring); bw: the device's copy bandwidth, bytes/s."""
    import numpy as np
    import torch

    from day0.runtime.engine import Engine
    from day0.tools.bench import bench_checkpoint, bench_e2e

    e = spec["engine"]
    dev = "cuda" if device.startswith("cuda") else "cpu"
    ckpt = bench_checkpoint.write(pkg / f"ckpt-{e['checkpoint']}-{e['seed']}", e["checkpoint"], e["seed"])
    raw = json.loads((ckpt / "config.json").read_text())
    weights = weight_bytes(ckpt)
    art = pkg / "engine" / "artifact"
    rng = np.random.default_rng(e["seed"])
    most, distinct = max(e["batches"]), e["distinct"]
    # every batch's steps, for every sequence, beside the decode steps the first sequences take
    # while the later prompts run
    new_tokens = len(e["batches"]) * (WARM + STEPS) + 2 + distinct * -(-e["prompt"] // e["chunk"])
    blocks = most * -(-(e["prompt"] + new_tokens) // e["block_size"]) + 1
    t0 = time.perf_counter()
    eng = Engine.load(
        art, device=device, verify=False, checkpoint_dir=ckpt, chunk=e["chunk"], num_blocks=blocks, max_running=most
    )
    print(f"engine loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    res = {
        "piece": "engine",
        "prompt": e["prompt"],
        "block_size": e["block_size"],
        "batch_sizes": list(eng.layout.batch_sizes),
        "block_bytes": eng.layout.block_bytes,
        "copy_gb_s": bw / 1e9,
        "rows": [],
    }
    short = _fill(eng, [rng.integers(0, raw["vocab_size"], e["short_prompt"]).tolist()], False, 2)
    res["bytes_per_sequence"] = {e["short_prompt"]: eng.counters()["blocks_used"] * eng.layout.block_bytes}
    eng.abort(short["rids"][0])
    print(f"engine prompt of {e['short_prompt']} in {short['prefill_s']:.2f} s", flush=True)
    res["ttft_s"] = {
        n: _ttft(eng, rng.integers(0, raw["vocab_size"], n).tolist()) for n in (e["short_prompt"], e["prompt"])
    }
    print(f"engine time to first token {res['ttft_s']}", flush=True)
    # `distinct` prompts run, the rest are copies (_copies); then sequences are aborted down to
    # each smaller batch (the first one, checked against Session, stays to the end)
    prompts = [rng.integers(0, raw["vocab_size"], e["prompt"]).tolist() for _ in range(distinct)]
    run = _fill(eng, prompts, True, new_tokens)
    res["prefill_s"] = {"sequences": distinct, "seconds": run["prefill_s"]}
    print(f"engine {distinct} prompts of {e['prompt']} in {run['prefill_s']:.2f} s", flush=True)
    t0 = time.perf_counter()
    _copies(eng, run, most - distinct, new_tokens, rng)
    print(f"engine {most - distinct} copies in {time.perf_counter() - t0:.1f} s", flush=True)
    prompts = [prompts[i % distinct] for i in range(most)]
    res["bytes_per_sequence"][e["prompt"]] = eng.counters()["blocks_used"] / most * eng.layout.block_bytes
    for b in sorted(e["batches"], reverse=True):
        for r in run["rids"][b:]:
            eng.abort(r)
        step_s = _decode_steps(eng, run)
        need = step_bytes(raw, weights, eng.manifest, b, e["prompt"])
        row = {
            "batch": b,
            "compiled_batch": min(x for x in eng.layout.batch_sizes if x >= b),
            "step_ms": 1e3 * step_s,
            "tok_s": b / step_s,
            "step_bytes": need,
            "limit_ms": 1e3 * sum(need.values()) / bw,
        }
        res["rows"].insert(0, row)
        print("engine row", json.dumps(row), flush=True)
    first = run["rids"][0]
    res["check"] = _session_check(art, ckpt, device, prompts[0], run["tokens"][first], run["logits"])
    print("engine check", json.dumps(res["check"]), flush=True)
    del eng
    model, _ = bench_e2e._day0_eager(ckpt, e["max_seq_len"], dev)
    ref, _ = bench_e2e._transformers_eager(model, raw, dev, "bfloat16")
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    cfg = ref.config
    for row in res["rows"]:
        t = _transformers_batch(ref, cfg, prompts[: row["batch"]], e["transformers_chunk"], dev, rng)
        row["transformers_step_ms"] = 1e3 * t["step_s"]
        row["transformers_tok_s"] = row["batch"] / t["step_s"]
        print(row["batch"], "transformers", row["transformers_step_ms"], flush=True)
        if dev == "cuda":
            torch.cuda.empty_cache()
    return res


def table(r: dict) -> str:
    one = r["rows"][0]["step_ms"]
    lines = [
        f"{'sequences':>9}{'compiled':>9}{'step ms':>9}{'vs 1':>7}{'day0 tok/s':>11}{'transf. tok/s':>14}"
        f"{'vs transf.':>11}{'limit ms':>9}{'of limit':>9}"
    ]
    for row in r["rows"]:
        tt = row.get("transformers_tok_s")
        lines.append(
            f"{row['batch']:>9}{row['compiled_batch']:>9}{row['step_ms']:>9.2f}{row['step_ms'] / one:>7.2f}"
            f"{row['tok_s']:>11.0f}{tt or float('nan'):>14.0f}{row['tok_s'] / tt if tt else float('nan'):>11.1f}"
            f"{row['limit_ms']:>9.2f}{row['limit_ms'] / row['step_ms']:>9.1%}"
        )
    lines.append(
        f"engine: prompts of {r['prompt']} tokens, blocks of {r['block_size']}; bytes per sequence {r['bytes_per_sequence']}"
    )
    if "ttft_s" in r:
        lines.append(
            "engine: time to first token (one request alone) "
            + ", ".join(f"{n} tokens {1e3 * s:.0f} ms" for n, s in r["ttft_s"].items())
        )
    return "\n".join(lines)


def serve_table(r: dict) -> str:
    """The serve piece's rows: the server against the Engine alone on the same requests."""
    c = r["config"]
    lines = [
        f"day0 serve (prompts of {c['prompt_len']} ids, {c['new_tokens']} new tokens): "
        f"{'clients':>8}{'req/s':>8}{'tok/s':>9}{'Engine':>9}{'ratio':>7}{'TTFT p50':>10}{'ITL p99':>9}"
    ]
    pad = " " * len(lines[0].split(":")[0] + ": ")
    for row in r["rows"]:
        lines.append(
            f"{pad}{row['concurrency']:>8}{row['requests_s']:>8.1f}{row['served_tok_s']:>9.1f}"
            f"{row['engine_tok_s']:>9.1f}{row['overhead_ratio']:>7.2f}{1e3 * row['ttft_p50_s']:>8.1f}ms"
            f"{1e3 * row['itl_p99_s']:>7.1f}ms"
        )
    return "\n".join(lines)
