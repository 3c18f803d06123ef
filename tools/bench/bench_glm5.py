"""`make bench`, glm5_next part: a small GLM-5.3-Flash-shaped text model on this CPU, day0's compiled
artifact vs transformers eager (Glm5NextForConditionalGeneration, text only, float32) on the same
checkpoint, prefill and decode tokens/s side by side in one run. Goal (issue 5): decode >= 3x.

The model: 4 layers (KDA, DSA full indexer, DSA shared indexer, KDA), hidden 256, 8 heads,
16 experts top-4 + 1 shared, k-pool 8, top-64 tokens, 2 residual streams; random weights from the
tiny-checkpoint writer (tie-free selections), prompt 256 tokens, then 32 decode steps (the
defaults). Results: docs/perf.md, section 'CPU, glm5_next small'.
"""

from pathlib import Path

import numpy as np
import torch

from day0.tools.bench.bench_demo import arguments, bench_day0, time_transformers, write_results
from day0.tools.checkpoints.glm5_next import BENCH_SMALL

MAX_SEQ_LEN = 512


def bench_transformers(checkpoint: Path, prompt: np.ndarray, steps: int, repeats: int) -> dict:
    from transformers import Glm5NextForConditionalGeneration

    model = Glm5NextForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return time_transformers(model, prompt, steps, repeats)


def main(argv=None) -> int:
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

    a = arguments("day0-bench-glm5", ".cache/bench-glm5", 256, 32, 3).parse_args(argv)

    work = Path(a.workdir)
    ckpt = work / "checkpoint"
    if not (ckpt / "config.json").exists():
        write_tiny_glm5_next_checkpoint(ckpt, BENCH_SMALL, seed=0)
    artifact = work / "artifact"
    if not (artifact / "manifest.json").exists():
        compile_checkpoint(ckpt, artifact, BuildOptions(max_seq_len=MAX_SEQ_LEN))
    prompt = np.random.default_rng(0).integers(0, BENCH_SMALL["vocab_size"], a.prompt_len).astype(np.int64)
    ours = bench_day0(artifact, prompt, a.decode_steps, a.repeats, "local-task")
    ref = bench_transformers(ckpt, prompt, a.decode_steps, a.repeats)
    print(
        f"\nglm5_next small (4 layers, hidden 256, 16 experts), prompt {a.prompt_len}, "
        f"{a.decode_steps} decode steps, max_seq_len {MAX_SEQ_LEN}, CPU local-task"
    )
    print(f"{'metric':<15}{'day0':>10}{'transformers':>14}{'vs eager':>10}")
    for k in ("prefill_tok_s", "decode_tok_s"):
        print(f"{k:<15}{ours[k]:>10.1f}{ref[k]:>14.1f}{ours[k] / ref[k]:>9.2f}x")
    write_results(
        a,
        {
            "day0": ours,
            "transformers": ref,
            "config": BENCH_SMALL,
            "prompt_len": a.prompt_len,
            "decode_steps": a.decode_steps,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
