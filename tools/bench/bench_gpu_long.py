"""Long context on the GPU: the 4.9B `deepseek_v32` benchmark model (tools/bench/bench_checkpoint.py)
compiled for max_seq_len 1,048,576 with the paged entry points, one sequence through the Engine.
Part of `make bench-gpu` (piece `long`); results in docs/perf.md, section 'Long context on the GPU'.

package (compile machine): the seeded checkpoint compiled with max_seq_len 1M, max_batch 1 and the
target's static prompt chunk into out/long/artifact (the tiny config runs on the engine piece's
artifact, whose options it shares: the CPU test adds no compile).
run (GPU host): the same checkpoint from the same seed, one Engine whose pool holds the longest
length (+ the steps) and one short request beside it:
  ttft    a random prompt of `ttft` tokens alone through the Engine's public API, median of 3;
  check   a random prompt of `check` tokens through one sequence's blocks in static prompt
          chunks, then CHECK_STEPS teacher-forced decode steps, against day0's eager model (same
          cache dtype) fed the same chunks on the same device: the last row of every chunk
          (what a static chunk returns) and every step (bench_e2e.compare); and the eager model
          against itself fed chunks NOISE_CHUNKS× as long (another float order of the same sums:
          on a random-weight model near-ties in the indexer's top-k and the router turn such
          differences into O(1) ones, docs/perf.md), the floor the check is read against;
  fill    the sequence's blocks up to the longest length: the check prompt's blocks repeated
          (one host round trip of the pools). A decode step reads every indexer key up to its
          position and the top-k selected latent rows whatever they hold, so its time is a long
          prompt's; repeated keys tie in the indexer, which the radix top-k handles like any
          value (the same passes over the same bytes);
  lengths for each L: decode ms per token (median of STEPS Engine steps of the sequence set to
          length L: its lookahead path, what a user's generation gets) and one static prompt
          chunk ending at L (median of 3: its ms, tokens/s, and its FLOPs ÷ PEAK_FLOPS);
  profile one more prompt chunk at the longest length under torch.profiler (CUPTI): its kernels
          by device time (tools/bench/gpu_artifact_profile.py), where a long chunk's time goes;
  ttft_estimate  time to first token of an L-token prompt, summed over its chunks from the
          chunk times measured at the lengths (linear between them): an estimate, labelled so;
  limits  a decode step's bytes (weights read, indexer keys of L positions, top-k latent rows:
          bench_gpu_engine.step_bytes) ÷ copy bandwidth; its indexer share alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

STEPS = 16
WARM = 3
CHECK_STEPS = 8
NOISE_CHUNKS = 4  # the reference run again in chunks this many times as long (check_noise)
PEAK_FLOPS = 790e12  # dense bf16 tensor-core FLOP/s of the H200 (../shared/PERF.md)
SETTINGS = {
    "full": {
        "checkpoint": "e2e",
        "max_seq_len": 1 << 20,
        "lengths": [4096, 32768, 131072, 524288, (1 << 20) - 64],
        "check": 32768,
        "ttft": 4096,
        "block_size": 64,
    },
    # the engine piece's tiny artifact (bench_gpu_engine.SETTINGS["tiny"]): max_seq_len 96, blocks of 4,
    # no static prompt chunk on llvm-cpu (the dynamic prefill runs chunks of `chunk`)
    "tiny": {"checkpoint": "tiny", "artifact": "engine", "lengths": [16, 40, 72], "check": 32, "ttft": 24, "chunk": 8},
}
SEED = 0
SHIPPED = ["tools/bench/bench_gpu_long.py", "tools/bench/bench_gpu_engine.py"]
PROFILE_TOP = 12  # kernels kept from the chunk's profile


def package(out: Path, config: str, target: str, cache: Path, engine: dict | None) -> dict:
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.tools.bench import bench_checkpoint, bench_e2e, bench_gpu_engine

    s = dict(SETTINGS[config])
    if s.get("artifact") == "engine":
        engine = engine or bench_gpu_engine.package(out, config, target, cache)
        s["artifact"] = "engine/artifact"
    else:
        ckpt = bench_checkpoint.write(cache / f"ckpt-{s['checkpoint']}-{SEED}", s["checkpoint"], SEED)
        options = BuildOptions(target=target, max_seq_len=s["max_seq_len"], max_batch=1, block_size=s["block_size"])
        compile_checkpoint(ckpt, out / "long" / "artifact", options)
        s["artifact"] = "long/artifact"
    bench_e2e.ship_sources(out, bench_e2e.SHIPPED + SHIPPED)
    return {"seed": SEED, **s}


# ---------------------------------------------------------------------------------------------
# run (GPU host)


def _chunk(eng, seq, ids, end: int, logits: bool):
    """One prompt chunk of `seq` ending at `end` (ids[end - C : end], C = the Engine's chunk: the
    artifact's static one, else the dynamic prefill's): (logits row or None, seconds). Straight
    through the Engine's caller: the bench places the chunk itself."""
    import numpy as np

    c = eng.chunk
    positions = np.arange(end - c, end, dtype=np.int64)
    table = np.array(eng._table(seq, end), dtype=np.int64)[None, :]
    fn = eng._prefill_static if eng.static_chunk else eng._prefill
    t0 = time.perf_counter()
    host, _ = eng._call(fn, ids[end - c : end], positions, table, [seq.slot], logits)
    return (None if host is None else host[-1]), time.perf_counter() - t0


def _forced_step(eng, seq, position: int, token: int):
    """One decode step of `seq`'s `token` at `position`, its logits row (teacher forcing)."""
    import numpy as np

    table = np.array(eng._table(seq, position + 1), dtype=np.int64)[None, :]
    host, _ = eng._call(eng._decode[min(eng._decode)], [token], [position], table, [seq.slot], True)
    return host[0]


def _eager(ckpt: Path, cache_dtype: str, ids, chunk: int, forced, dev: str, ends) -> dict:
    """day0's eager model fed `ids` in chunks of `chunk`, then the forced tokens one at a time:
    the rows of the positions before `ends` and each step's row."""
    import numpy as np
    import torch

    from day0.tools.bench import bench_e2e

    model, step = bench_e2e._day0_eager(ckpt, len(ids) + len(forced), dev)
    model.cache_dtype = cache_dtype
    rows = []
    for at in range(0, len(ids), chunk):
        logits = step(torch.tensor(ids[at : at + chunk], device=dev), at == 0)
        rows += [logits[e - 1 - at].float().cpu().numpy() for e in ends if at < e <= at + chunk]
    steps = [step(torch.tensor([t], device=dev), False)[-1].float().cpu().numpy() for t in forced]
    del model, step
    if dev == "cuda":
        torch.cuda.empty_cache()
    return {"logits": np.stack(rows), "steps": np.stack(steps)}


def _fill(eng, seq, source_blocks: int, upto: int) -> None:
    """seq's blocks from `source_blocks` to those holding `upto` positions: copies of its first
    `source_blocks` blocks, in turn (module docstring, fill)."""
    import numpy as np

    table = np.array(eng.blocks.table(seq.id), dtype=np.int64)
    dst = table[source_blocks : eng.blocks.blocks_for(upto)]
    src = table[np.arange(dst.size) % source_blocks]
    state = []
    for i, a in enumerate(eng._state):
        if i >= len(eng.layout.pools):
            state.append(a)
            continue
        host = np.array(a.to_host(), copy=True)
        blocks = host.reshape(eng.blocks.num_blocks, -1, *host.shape[1:])
        blocks[dst] = blocks[src]
        state.append(eng._vm.to_device(host))
        del host, blocks
    eng._state = state


def _decode_at(eng, seq, ids, length: int, rng) -> float:
    """The median Engine step (after WARM) of `seq` set to hold ids[:length] and decoding; the
    step submitted ahead by the last one is dropped (Engine.close)."""
    import numpy as np

    seq.prompt, seq.fed, seq.out = ids[:length], length, [int(rng.integers(0, eng.vocab_size))]
    times = []
    for _ in range(WARM + STEPS):
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
    eng.close()
    return float(np.median(times[WARM:]))


def chunk_flops(raw: dict, weights: dict, chunk: int, end: int) -> float:
    """FLOPs of a prompt chunk of `chunk` tokens ending at position `end`: 2 per active parameter
    per token (the weights but the routed experts a token does not choose; MXFP4 experts count
    32 values per 17 bytes, the rest 2 bytes a value), the indexer's scores over each token's
    visible keys (2·H_I·d_I per key) and the attention over its top-k rows (2·H·(d_qk + d_v) per row),
    every layer."""
    e, k, layers = raw["n_routed_experts"], raw["num_experts_per_tok"], raw["num_hidden_layers"]
    active = weights["other"] / 2 + weights["experts"] * 32 / 17 * k / e
    keys = chunk * (end - chunk) + chunk * (chunk + 1) / 2  # visible keys summed over the chunk's tokens
    rows = sum(min(raw["index_topk"], p + 1) for p in range(end - chunk, end))
    d_qk = raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"]
    per_row = 2 * raw["num_attention_heads"] * (d_qk + raw["v_head_dim"])
    return 2 * active * chunk + layers * (2 * raw["index_n_heads"] * raw["index_head_dim"] * keys + per_row * rows)


def ttft_estimate(chunk_s: dict[int, float], chunk: int, length: int) -> float:
    """Seconds to prefill `length` tokens in static chunks, each chunk's time interpolated
    (linearly in its end position) between the measured {end: seconds}."""
    import numpy as np

    ends = sorted(chunk_s)
    at = np.arange(chunk, length + chunk, chunk).clip(max=length)
    return float(np.interp(at, ends, [chunk_s[e] for e in ends]).sum())


def run(pkg: Path, spec: dict, device: str, bw: float) -> dict:
    """The long-context rows (module docstring); bw: the device's copy bandwidth, bytes/s."""
    import numpy as np

    from day0.runtime.artifact import read_manifest
    from day0.runtime.blocks import blocks_for
    from day0.runtime.engine import Engine
    from day0.tools.bench import bench_checkpoint, bench_e2e, bench_gpu_engine, gpu_artifact_profile

    s = spec["long"]
    dev = "cuda" if device.startswith("cuda") else "cpu"
    ckpt = bench_checkpoint.write(pkg / f"ckpt-{s['checkpoint']}-{s['seed']}", s["checkpoint"], s["seed"])
    raw = json.loads((ckpt / "config.json").read_text())
    weights = bench_gpu_engine.weight_bytes(ckpt)
    rng = np.random.default_rng(s["seed"])
    longest = max(s["lengths"])
    art = pkg / s["artifact"]
    manifest = read_manifest(art, verify=False, checkpoint_dir=ckpt)
    block = manifest.paged.block_size
    blocks = blocks_for(longest + WARM + STEPS + 2, block) + blocks_for(s["ttft"] + 1, block) + 1  # + scratch
    t0 = time.perf_counter()
    eng = Engine.load(
        art, device=device, verify=False, checkpoint_dir=ckpt, num_blocks=blocks, max_running=2, chunk=s.get("chunk")
    )
    print(f"long: engine with {blocks} blocks loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    res = {"piece": "long", "max_seq_len": eng.max_seq_len, "block_size": block, "chunk": eng.chunk}
    res["pool_bytes"] = blocks * eng.layout.block_bytes
    res["bytes_per_token"] = eng.layout.block_bytes / block
    vocab = raw["vocab_size"]
    res["ttft_tokens"] = s["ttft"]
    res["ttft_s"] = float(
        np.median([bench_gpu_engine._ttft(eng, rng.integers(0, vocab, s["ttft"]).tolist()) for _ in range(3)])
    )
    print(f"long: time to first token at {s['ttft']}: {1e3 * res['ttft_s']:.1f} ms", flush=True)

    rid = eng.add(rng.integers(0, vocab, longest).tolist(), max_new_tokens=WARM + STEPS + 2, stop=())
    eng._admit()
    seq = eng._running[rid]
    ids = seq.prompt
    c, check = eng.chunk, s["check"]
    t0 = time.perf_counter()
    rows = [_chunk(eng, seq, ids, end, True)[0] for end in range(c, check + 1, c)]
    res["check_prefill_s"] = time.perf_counter() - t0
    forced = rng.integers(0, vocab, CHECK_STEPS).tolist()
    steps = [_forced_step(eng, seq, check + i, t) for i, t in enumerate(forced)]
    ours = {"logits": np.stack(rows), "steps": np.stack(steps)}
    print(f"long: {check} tokens in {res['check_prefill_s']:.2f} s through {check // c} chunks", flush=True)
    cache_dtype = next(p.dtype for p in manifest.paged.pools if p.kind == "mla_latent")
    ends = list(range(c, check + 1, c))
    eager = _eager(ckpt, cache_dtype, ids[:check].tolist(), c, forced, dev, ends)
    res["check"] = {"tokens": check, "rows": len(rows), "steps": CHECK_STEPS, "cache_dtype": cache_dtype}
    res["check"].update(bench_e2e.compare(ours, eager))
    print("long: check", json.dumps(res["check"]), flush=True)
    # the reference against itself: the same model fed chunks 4× as long (another float order
    # of the same sums), what the comparison above can mean on this model
    again = _eager(ckpt, cache_dtype, ids[:check].tolist(), NOISE_CHUNKS * c, forced, dev, ends)
    res["check_noise"] = {"chunk": NOISE_CHUNKS * c, **bench_e2e.compare(again, eager)}
    print("long: eager vs eager", json.dumps(res["check_noise"]), flush=True)

    t0 = time.perf_counter()
    _fill(eng, seq, eng.blocks.blocks_for(check), longest + WARM + STEPS + 2)
    res["fill_s"] = time.perf_counter() - t0
    print(f"long: pool filled to {longest} in {res['fill_s']:.1f} s", flush=True)
    res["rows"], chunk_s = [], {}
    row_bytes = {p.kind: p.nbytes // p.shape[0] for p in manifest.paged.pools}  # a pool row's bytes
    for length in s["lengths"]:
        times = [_chunk(eng, seq, ids, length, False)[1] for _ in range(4)][1:]
        chunk_s[length] = float(np.median(times))
        decode_s = _decode_at(eng, seq, ids, length, rng)
        need = bench_gpu_engine.step_bytes(raw, weights, manifest, 1, length)
        indexer = raw["num_hidden_layers"] * length * row_bytes["indexer_keys"]
        flops = chunk_flops(raw, weights, c, length)
        row = {
            "length": length,
            "decode_ms": 1e3 * decode_s,
            "limit_ms": 1e3 * sum(need.values()) / bw,
            "indexer_limit_ms": 1e3 * indexer / bw,
            "chunk_ms": 1e3 * chunk_s[length],
            "chunk_tok_s": c / chunk_s[length],
            "chunk_tflops": flops / chunk_s[length] / 1e12,
            "chunk_of_peak": flops / chunk_s[length] / PEAK_FLOPS,
        }
        res["rows"].append(row)
        print("long row", json.dumps(row), flush=True)
    for row in res["rows"]:
        row["ttft_estimate_s"] = ttft_estimate(chunk_s, c, row["length"])
    prof = gpu_artifact_profile.profile_call(lambda: _chunk(eng, seq, ids, longest, False))
    res["chunk_profile"] = {"length": longest, **{k: prof[k] for k in ("wall_ms", "launches", "device_ms")}}
    res["chunk_profile"]["kernels"] = prof["kernels"][:PROFILE_TOP]
    print("long: chunk profile", json.dumps(res["chunk_profile"]), flush=True)
    # and the decode step at that length (what grows with the context: the indexer's scores over
    # every key and the top-k over them), per step of _decode_at's WARM + STEPS
    prof = gpu_artifact_profile.profile_call(lambda: _decode_at(eng, seq, ids, longest, rng))
    n = WARM + STEPS
    res["decode_profile"] = {
        "length": longest,
        "steps": n,
        "device_ms_per_step": prof["device_ms"] / n,
        "launches_per_step": prof["launches"] / n,
        "kernels": [{**k, "launches": k["launches"] / n, "us": k["us"] / n} for k in prof["kernels"][:PROFILE_TOP]],
    }
    print("long: decode profile", json.dumps(res["decode_profile"]), flush=True)
    eng.abort(rid)
    return res


def table(r: dict) -> str:
    first = r["rows"][0]["decode_ms"]
    lines = [
        f"long context (max_seq_len {r['max_seq_len']}, blocks of {r['block_size']}, chunk {r['chunk']}, "
        f"{r['bytes_per_token']:.0f} pool bytes a token): time to first token at {r['ttft_tokens']} {1e3 * r['ttft_s']:.0f} ms",
        f"{'length':>9}{'decode ms':>10}{'vs first':>9}{'limit ms':>9}{'of limit':>9}{'indexer lim':>12}"
        f"{'chunk ms':>9}{'tok/s':>9}{'of peak':>8}{'TTFT est s':>11}",
    ]
    for row in r["rows"]:
        lines.append(
            f"{row['length']:>9}{row['decode_ms']:>10.2f}{row['decode_ms'] / first:>9.2f}{row['limit_ms']:>9.2f}"
            f"{row['limit_ms'] / row['decode_ms']:>9.1%}{row['indexer_limit_ms']:>12.3f}{row['chunk_ms']:>9.1f}"
            f"{row['chunk_tok_s']:>9.0f}{row['chunk_of_peak']:>8.1%}{row['ttft_estimate_s']:>11.1f}"
        )
    k, n = r["check"], r["check_noise"]
    lines.append(
        f"long: vs day0 eager at {k['tokens']} tokens ({k['cache_dtype']} caches): same greedy on "
        f"{k['same_greedy_prompt_rows']:.1%} of {k['rows']} chunk-end rows, rows max {k['prompt_max_rel_err']:.2e}, "
        f"{k['steps']} decode steps max {k['decode_max_rel_err']:.2e}; eager in chunks of {n['chunk']} vs eager: "
        f"{n['same_greedy_prompt_rows']:.1%}, rows max {n['prompt_max_rel_err']:.2e}, steps max "
        f"{n['decode_max_rel_err']:.2e}"
    )
    return "\n".join(lines)
