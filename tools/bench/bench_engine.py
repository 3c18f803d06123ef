"""`make bench`, the Engine: aggregate decode tokens/s of the demo model with 1, 4 and 16
sequences running at once on this CPU (one batched decode step advances all of them), against
transformers eager decoding the same batch (one [B, 1] forward a step, its own cache), and the
physical limit of a step, in one run. Prints a table and writes JSON.

A step is timed once every sequence has left its prompt; each timed step gives one token per
sequence (greedy, ids read back). Results: docs/perf.md, section 'CPU, the Engine'.
"""

import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from day0.tools.bench.bench_demo import arguments, demo_artifact, machine_rates, write_results

BATCHES = (1, 4, 16)
BLOCK = 64


def bench_engine(artifact: Path, prompts: np.ndarray, steps: int, repeats: int) -> float:
    """Median seconds of one decode step with len(prompts) sequences running."""
    from day0.runtime.engine import Engine

    b, p = prompts.shape
    need = p + steps + 2
    engine = Engine.load(artifact, num_blocks=b * -(-need // BLOCK) + 1, chunk=p)
    times = []
    for _ in range(repeats):
        ids = [engine.add(row, max_new_tokens=steps + 2, stop=()) for row in prompts]
        while any(engine.phase(r) != "decoding" for r in ids):
            engine.step()  # prompts, one a step (earlier ones decode meanwhile)
        for _ in range(steps):
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        for r in ids:
            engine.abort(r)
    return statistics.median(times)


def bench_transformers(checkpoint: Path, prompts: np.ndarray, steps: int, repeats: int) -> float:
    """Median seconds of one eager decode step of the whole batch ([B, 1] tokens, its cache)."""
    from transformers import DeepseekV32ForCausalLM

    model = DeepseekV32ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = torch.as_tensor(prompts)
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            out = model(input_ids=ids, use_cache=True)
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(steps):
                t = time.perf_counter()
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                tok.numpy()
                times.append(time.perf_counter() - t)
    return statistics.median(times)


def step_limit_s(checkpoint: Path, batch: int, context: int, rates: dict) -> tuple[float, float]:
    """(seconds, bytes) a batched decode step must at least take: the bytes it must read (every
    weight but the routed experts no sequence chose, expected over uniform routing, plus each
    sequence's latent and indexer cache rows) ÷ copy bandwidth."""
    from day0.models.checkpoint import Checkpoint

    ckpt = Checkpoint.open(checkpoint)
    c = ckpt.config
    routed = sum(t.nbytes for n, t in ckpt.tensors.items() if ".mlp.experts." in n)
    dense = sum(t.nbytes for t in ckpt.tensors.values()) - routed
    chosen = 1 - (1 - c["num_experts_per_tok"] / c["n_routed_experts"]) ** batch  # expected expert fraction
    row = 4 * (c["kv_lora_rank"] + c["qk_rope_head_dim"] + c["index_head_dim"]) * c["num_hidden_layers"]
    step_bytes = dense + routed * chosen + row * context * batch
    return step_bytes / rates["copy_bytes_s"], step_bytes


def main(argv=None) -> int:
    from day0.lowering.driver import BuildOptions

    p = arguments("day0-bench-engine", ".cache/bench-engine", 128, 16, 3)
    a = p.parse_args(argv)
    max_seq_len = 512
    options = BuildOptions(max_seq_len=max_seq_len, max_batch=max(BATCHES), block_size=BLOCK)
    ckpt, artifact = demo_artifact(Path(a.workdir), options)
    rates = machine_rates()
    rng = np.random.default_rng(0)
    rows = []
    for b in BATCHES:
        prompts = rng.integers(0, 256, (b, a.prompt_len)).astype(np.int64)
        ours = bench_engine(artifact, prompts, a.decode_steps, a.repeats)
        ref = bench_transformers(ckpt, prompts, a.decode_steps, a.repeats)
        limit, step_bytes = step_limit_s(ckpt, b, a.prompt_len + a.decode_steps // 2, rates)
        rows.append(
            {
                "batch": b,
                "day0_step_s": ours,
                "transformers_step_s": ref,
                "limit_step_s": limit,
                "step_bytes": step_bytes,
                "day0_tok_s": b / ours,
                "transformers_tok_s": b / ref,
                "limit_tok_s": b / limit,
            }
        )
    print(
        f"\nEngine, demo deepseek_v32, prompts of {a.prompt_len}, max_seq_len {max_seq_len}, blocks of {BLOCK}, "
        f"{platform.machine()} x{os.cpu_count()}, copy {rates['copy_bytes_s'] / 1e9:.1f} GB/s"
    )
    print(
        f"{'batch':>5}{'day0 tok/s':>12}{'eager tok/s':>13}{'limit tok/s':>13}{'vs eager':>10}{'of limit':>10}"
        f"{'step ms':>9}{'vs batch 1':>12}"
    )
    base = rows[0]["day0_step_s"]
    for r in rows:
        print(
            f"{r['batch']:>5}{r['day0_tok_s']:>12.1f}{r['transformers_tok_s']:>13.1f}{r['limit_tok_s']:>13.1f}"
            f"{r['day0_tok_s'] / r['transformers_tok_s']:>9.2f}x{100 * r['day0_tok_s'] / r['limit_tok_s']:>9.1f}%"
            f"{1e3 * r['day0_step_s']:>9.2f}{r['day0_step_s'] / base:>11.2f}x"
        )
    config = {"prompt_len": a.prompt_len, "decode_steps": a.decode_steps, "max_seq_len": max_seq_len, "block": BLOCK}
    write_results(a, {"rows": rows, "machine": rates, "config": config})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
