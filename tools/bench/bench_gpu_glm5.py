"""`make bench-gpu`, piece `glm5`: the small glm5_next model of `make bench` (tools/checkpoints/glm5_next.BENCH_SMALL:
KDA, DSA with the k-pool indexer and a shared-indexer layer, mHC streams, MoE) compiled for the
GPU and run there against transformers eager (Glm5NextForConditionalGeneration, text only,
float32) on the same device and the same weights. Issue 5's GPU row.

package (compile machine): writes the seeded checkpoint and compiles it into out/glm5/artifact.
run (GPU host): writes the checkpoint again from the seed (the artifact reads its parameters at
load time, so only the shapes must agree), then
  prefill tokens/s  one prompt of `prompt_len` tokens up to the greedy first token in host memory,
                    median of `repeats`;
  decode tokens/s   greedy steps after the prompt, each token read back (median step);
  check             teacher-forced logits, day0 against transformers: every prompt row and
                    `check_steps` decode steps (max |Δ| ÷ max |want| per row), and whether the
                    greedy tokens agree.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

SETTINGS = {
    "full": {"prompt_len": 256, "decode_steps": 32, "check_steps": 16, "repeats": 3, "max_seq_len": 512},
    "tiny": {"prompt_len": 20, "decode_steps": 4, "check_steps": 4, "repeats": 1, "max_seq_len": 32},
}
SEED = 0
SHIPPED = [
    "frontend/__init__.py",
    "frontend/ops.py",
    "tools/bench/bench_gpu_glm5.py",
    "tools/checkpoints/__init__.py",
    "tools/checkpoints/common.py",
    "tools/checkpoints/demo.py",
    "tools/checkpoints/glm5_next.py",
]


def model_config(config: str) -> dict:
    """The glm5_next config overrides: `make bench`'s small model in `full`, the test defaults in `tiny`."""
    from day0.tools.checkpoints.glm5_next import BENCH_SMALL

    return dict(BENCH_SMALL) if config == "full" else {}


def package(out: Path, config: str, target: str, cache: Path) -> dict:
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.tools.bench import bench_e2e
    from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

    s = SETTINGS[config]
    ckpt = cache / f"ckpt-glm5-{config}-{SEED}"
    if not (ckpt / "config.json").exists():
        write_tiny_glm5_next_checkpoint(ckpt, model_config(config), seed=SEED)
    art = out / "glm5" / "artifact"
    if art.exists():
        shutil.rmtree(art)
    compile_checkpoint(ckpt, art, BuildOptions(target=target, max_seq_len=s["max_seq_len"]))
    bench_e2e.ship_sources(out, SHIPPED)
    return {"config": config, "seed": SEED, **s}


def _time_day0(art: Path, ckpt: Path, device: str, prompt, forced, s: dict) -> dict:
    from day0.runtime.session import Session
    from day0.tools.bench.bench_e2e import time_session

    sess = Session.load(art, device=device, verify=False, checkpoint_dir=ckpt)
    return {
        **time_session(sess, prompt, forced, s["repeats"], s["decode_steps"], warmup=1),
        "state_bytes": sess.state_bytes(),
    }


def _time_transformers(ckpt: Path, dev: str, prompt, forced, s: dict) -> dict:
    import numpy as np
    import torch
    from transformers import Glm5NextForConditionalGeneration

    model = Glm5NextForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).to(dev).eval()
    ids = torch.tensor(prompt, device=dev)[None]

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        prefill = []
        for _ in range(s["repeats"] + 1):
            sync()
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            tok = int(out.logits[0, -1].argmax())
            prefill.append(time.perf_counter() - t0)
        cache, steps = out.past_key_values, []
        for _ in range(s["decode_steps"] + 1):
            t0 = time.perf_counter()
            out = model(input_ids=torch.tensor([[tok]], device=dev), past_key_values=cache, use_cache=True)
            cache, tok = out.past_key_values, int(out.logits[0, -1].argmax())
            steps.append(time.perf_counter() - t0)
        out = model(input_ids=ids, use_cache=True)
        logits, cache, checks = out.logits[0].float().cpu().numpy(), out.past_key_values, []
        for t in forced:
            out = model(input_ids=torch.tensor([[t]], device=dev), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            checks.append(out.logits[0, -1].float().cpu().numpy())
    del model
    return {
        "prefill_s": float(np.median(prefill[1:])),
        "decode_s": float(np.median(steps[1:])),
        "logits": logits,
        "steps": np.stack(checks),
    }


def run(pkg: Path, spec: dict, device: str) -> dict:
    import json

    import numpy as np
    import torch

    from day0.tools.bench.bench_e2e import compare
    from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

    s = spec["glm5"]
    dev = "cuda" if device.startswith("cuda") else "cpu"
    ckpt = pkg / f"ckpt-glm5-{s['config']}-{s['seed']}"
    if not (ckpt / "config.json").exists():
        write_tiny_glm5_next_checkpoint(ckpt, model_config(s["config"]), seed=s["seed"])
    vocab = json.loads((ckpt / "config.json").read_text())["text_config"]["vocab_size"]
    rng = np.random.default_rng(s["seed"])
    prompt = rng.integers(0, vocab, s["prompt_len"]).tolist()
    forced = rng.integers(0, vocab, s["check_steps"]).tolist()
    ours = _time_day0(pkg / "glm5" / "artifact", ckpt, device, prompt, forced, s)
    theirs = _time_transformers(ckpt, dev, prompt, forced, s)
    if dev == "cuda":
        torch.cuda.empty_cache()
    res = {
        "piece": "glm5",
        "config": s["config"],
        "prompt_len": s["prompt_len"],
        "decode_steps": s["decode_steps"],
        "state_bytes": ours["state_bytes"],
        **compare(ours, theirs),
    }
    for who, r in (("day0", ours), ("transformers", theirs)):
        res[f"{who}_prefill_tok_s"] = s["prompt_len"] / r["prefill_s"]
        res[f"{who}_decode_tok_s"] = 1.0 / r["decode_s"]
    return res


def table(r: dict) -> str:
    lines = [f"{'glm5_next small':<18}{'day0 tok/s':>12}{'transf. tok/s':>15}{'day0/transf.':>14}"]
    for k in ("prefill", "decode"):
        ours, theirs = r[f"day0_{k}_tok_s"], r[f"transformers_{k}_tok_s"]
        lines.append(f"{k:<18}{ours:>12.1f}{theirs:>15.1f}{ours / theirs:>13.1f}x")
    lines.append(
        f"glm5: prompt {r['prompt_len']} tokens, greedy decode; transf. = transformers eager f32 on the "
        f"same device; day0 vs transformers teacher-forced: prompt rows {r['prompt_max_rel_err']:.1e}, "
        f"decode {r['decode_max_rel_err']:.1e}, same greedy rows {r['same_greedy_prompt_rows']:.3f}"
    )
    return "\n".join(lines)
