"""`make bench`: the demo model on this CPU, day0's compiled artifact vs transformers eager on the
same checkpoint, side by side in one run. Prints a table and writes JSON.

Timings are medians of repeated runs after a warm-up; decode is timed over the steps after the
prompt (one token per step, taken from the prompt in turn; the logits are read back each step as
`Session.decode` does). Results: docs/perf.md, section 'CPU, demo deepseek_v32'.
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from day0.tools.bench.timing import median_seconds


def bench_day0(artifact: Path, prompt: np.ndarray, steps: int, repeats: int, device: str) -> dict:
    from day0.runtime.session import Session

    s = Session.load(artifact, device=device)

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

    prefill_s = median_seconds(prefill, repeats)
    decode()
    decode_s = statistics.median(decode() for _ in range(repeats))
    return {"prefill_tok_s": len(prompt) / prefill_s, "decode_tok_s": steps / decode_s}


def bench_transformers(checkpoint: Path, prompt: np.ndarray, steps: int, repeats: int) -> dict:
    from transformers import DeepseekV32ForCausalLM

    model = DeepseekV32ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return time_transformers(model, prompt, steps, repeats)


def time_transformers(model, prompt: np.ndarray, steps: int, repeats: int) -> dict:
    """Prefill and decode tokens/s of a transformers model with its cache (logits read each step)."""
    ids = torch.as_tensor(prompt)[None]

    @torch.no_grad()
    def prefill():
        return model(input_ids=ids, use_cache=True)

    @torch.no_grad()
    def decode():
        out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        t = time.perf_counter()
        for i in range(steps):
            tok = torch.tensor([[int(prompt[i % len(prompt)])]])
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            out.logits[0, -1].numpy()
        return time.perf_counter() - t

    prefill_s = median_seconds(prefill, repeats)
    decode()
    decode_s = statistics.median(decode() for _ in range(repeats))
    return {"prefill_tok_s": len(prompt) / prefill_s, "decode_tok_s": steps / decode_s}


def machine_rates() -> dict:
    """Measured copy bandwidth (bytes read + written per second, numpy) and f32 matmul rate."""
    src = np.ones(64 << 20, dtype=np.float32)  # 256 MiB
    dst = np.empty_like(src)
    copy_s = median_seconds(lambda: np.copyto(dst, src), 5)
    a = torch.randn(1024, 1024)
    mm_s = median_seconds(lambda: a @ a, 10)
    return {"copy_bytes_s": 2 * src.nbytes / copy_s, "matmul_flop_s": 2 * 1024**3 / mm_s}


def limits(checkpoint: Path, prompt_len: int, steps: int, rates: dict) -> dict:
    """Physical limits of the demo model on this machine.

    decode: bytes one step must read (all weights but the unchosen routed experts, plus the
    latent and indexer cache rows in use) ÷ copy bandwidth. prefill: 2 · active parameters
    · tokens FLOPs ÷ matmul rate (attention FLOPs are negligible at this length).
    """
    from day0.models.checkpoint import Checkpoint

    ckpt = Checkpoint.open(checkpoint)
    c = ckpt.config
    routed = sum(t.nbytes for n, t in ckpt.tensors.items() if ".mlp.experts." in n)
    dense = sum(t.nbytes for t in ckpt.tensors.values()) - routed
    active = dense + routed * c["num_experts_per_tok"] / c["n_routed_experts"]
    row = 4 * (c["kv_lora_rank"] + c["qk_rope_head_dim"] + c["index_head_dim"]) * c["num_hidden_layers"]
    context = prompt_len + steps // 2
    decode_s = (active + row * context) / rates["copy_bytes_s"]
    prefill_s = 2 * (active / 4) * prompt_len / rates["matmul_flop_s"]
    return {
        "prefill_tok_s": prompt_len / prefill_s,
        "decode_tok_s": 1 / decode_s,
        "decode_bytes_per_step": active + row * context,
    }


def arguments(prog: str, workdir: str, prompt_len: int, decode_steps: int, repeats: int) -> argparse.ArgumentParser:
    """The options every CPU benchmark takes."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--workdir", default=workdir)
    p.add_argument("--prompt-len", type=int, default=prompt_len)
    p.add_argument("--decode-steps", type=int, default=decode_steps)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--json", default=None, help="write results here (default WORKDIR/bench.json)")
    return p


def write_results(a: argparse.Namespace, results: dict) -> None:
    """Write a CPU benchmark's `results` as JSON where its `arguments` say (--json, else
    WORKDIR/bench.json) and print the path."""
    out = Path(a.json) if a.json else Path(a.workdir) / "bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


def demo_artifact(work: Path, options) -> tuple[Path, Path]:
    """(the demo checkpoint, its artifact compiled with `options`) under `work`, made once."""
    from day0.lowering.driver import compile_checkpoint
    from day0.tools.checkpoints.demo import ensure_demo_checkpoint

    ckpt, artifact = ensure_demo_checkpoint(work / "checkpoint"), work / "artifact"
    if not (artifact / "manifest.json").exists():
        compile_checkpoint(ckpt, artifact, options)
    return ckpt, artifact


def main(argv=None) -> int:
    from day0.lowering.driver import BuildOptions

    p = arguments("day0-bench", ".cache/bench", 128, 64, 5)
    p.add_argument("--devices", nargs="+", default=["local-task", "local-sync"])
    a = p.parse_args(argv)

    max_seq_len = 512
    ckpt, artifact = demo_artifact(Path(a.workdir), BuildOptions(max_seq_len=max_seq_len))
    prompt = np.random.default_rng(0).integers(0, 256, a.prompt_len).astype(np.int64)
    torch.set_num_threads(torch.get_num_threads())

    rates = machine_rates()
    limit = limits(ckpt, a.prompt_len, a.decode_steps, rates)
    ours = {dev: bench_day0(artifact, prompt, a.decode_steps, a.repeats, dev) for dev in a.devices}
    ref = bench_transformers(ckpt, prompt, a.decode_steps, a.repeats)
    print(
        f"\ndemo deepseek_v32, prompt {a.prompt_len}, {a.decode_steps} decode steps, "
        f"max_seq_len {max_seq_len}, {platform.machine()} x{os.cpu_count()}, copy "
        f"{rates['copy_bytes_s'] / 1e9:.1f} GB/s, f32 matmul {rates['matmul_flop_s'] / 1e9:.0f} GFLOP/s"
    )
    print(
        f"{'metric':<15}{'day0 device':<13}{'day0':>10}{'transformers':>14}{'limit':>11}"
        f"{'vs eager':>10}{'of limit':>10}"
    )
    for k in ("prefill_tok_s", "decode_tok_s"):
        for dev, r in ours.items():
            print(
                f"{k:<15}{dev:<13}{r[k]:>10.1f}{ref[k]:>14.1f}{limit[k]:>11.1f}"
                f"{r[k] / ref[k]:>9.2f}x{100 * r[k] / limit[k]:>9.1f}%"
            )
    write_results(
        a,
        {
            "day0": ours,
            "transformers": ref,
            "limit": limit,
            "machine": rates,
            "config": {"prompt_len": a.prompt_len, "decode_steps": a.decode_steps, "max_seq_len": max_seq_len},
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
