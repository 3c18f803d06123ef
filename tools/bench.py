"""`make bench`: the demo model on this CPU, day0's compiled artifact vs transformers eager on the
same checkpoint, side by side in one run. Prints a table and writes JSON.

Timings are medians of repeated runs after a warm-up; decode is measured as steady-state steps at
a fixed context (greedy, one token per step, logits read back each step as `Session.decode` does).
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_day0(artifact: Path, prompt: np.ndarray, steps: int, repeats: int) -> dict:
    from day0.runtime.session import Session

    s = Session.load(artifact)

    def prefill():
        s.reset()
        s.prefill(prompt)

    def decode():
        s.reset()
        s.prefill(prompt)
        t = time.perf_counter()
        for i in range(steps):
            s.decode(int(prompt[i % len(prompt)]))
        return time.perf_counter() - t

    prefill_s = _median_seconds(prefill, repeats)
    decode()
    decode_s = statistics.median(decode() for _ in range(repeats))
    return {"prefill_tok_s": len(prompt) / prefill_s, "decode_tok_s": steps / decode_s}


def bench_transformers(checkpoint: Path, prompt: np.ndarray, steps: int, repeats: int) -> dict:
    from transformers import DeepseekV32ForCausalLM

    model = DeepseekV32ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = torch.as_tensor(prompt)[None]

    @torch.no_grad()
    def prefill():
        return model(ids, use_cache=True)

    @torch.no_grad()
    def decode():
        out = model(ids, use_cache=True)
        cache = out.past_key_values
        t = time.perf_counter()
        for i in range(steps):
            tok = torch.tensor([[int(prompt[i % len(prompt)])]])
            out = model(tok, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            out.logits[0, -1].numpy()
        return time.perf_counter() - t

    prefill_s = _median_seconds(prefill, repeats)
    decode()
    decode_s = statistics.median(decode() for _ in range(repeats))
    return {"prefill_tok_s": len(prompt) / prefill_s, "decode_tok_s": steps / decode_s}


def main(argv=None) -> int:
    from day0.lowering.build import BuildOptions, compile_checkpoint
    from day0.models.demo_checkpoint import ensure_demo_checkpoint

    p = argparse.ArgumentParser(prog="day0-bench")
    p.add_argument("--workdir", default=".cache/bench")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="write results here (default WORKDIR/bench.json)")
    a = p.parse_args(argv)

    work = Path(a.workdir)
    ckpt = ensure_demo_checkpoint(work / "checkpoint")
    artifact = work / "artifact"
    max_seq_len = 512
    if not (artifact / "manifest.json").exists():
        compile_checkpoint(ckpt, artifact, BuildOptions(max_seq_len=max_seq_len))
    prompt = np.random.default_rng(0).integers(0, 256, a.prompt_len).astype(np.int64)
    torch.set_num_threads(torch.get_num_threads())

    ours = bench_day0(artifact, prompt, a.decode_steps, a.repeats)
    ref = bench_transformers(ckpt, prompt, a.decode_steps, a.repeats)
    rows = [(k, ours[k], ref[k], ours[k] / ref[k]) for k in ("prefill_tok_s", "decode_tok_s")]
    print(f"\ndemo deepseek_v32, prompt {a.prompt_len}, {a.decode_steps} decode steps, "
          f"max_seq_len {max_seq_len}, {platform.processor() or platform.machine()}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'metric':<16}{'day0':>12}{'transformers':>14}{'ratio':>8}")
    for name, x, y, r in rows:
        print(f"{name:<16}{x:>12.1f}{y:>14.1f}{r:>7.2f}x")
    out = Path(a.json) if a.json else work / "bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"day0": ours, "transformers": ref,
                               "config": {"prompt_len": a.prompt_len, "decode_steps": a.decode_steps,
                                          "max_seq_len": max_seq_len}}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
