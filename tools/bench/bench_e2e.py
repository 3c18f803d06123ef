"""End-to-end decode and time to first token of the benchmark `deepseek_v32` model (4.9B parameters,
MXFP4 routed experts; tools/bench/bench_checkpoint.py): the compiled artifact vs transformers eager
(bf16) vs day0's own model run eagerly in PyTorch, on one device, on the same weights. Part of
`make bench-gpu`; results in docs/perf.md, section 'End to end: the 4.9B `deepseek_v32` benchmark model'.

package (compile machine): writes the seeded checkpoint (tools/bench/bench_checkpoint.py), compiles it
for the target, once per cache dtype of the config, and puts the artifact directories into the
benchmark package.
run (GPU host): writes the same checkpoint from the same seed beside the package, then for each
context C (a random prompt of C tokens):
  TTFT    the prompt's prefill up to the greedy first token in host memory (day0: `prefill_greedy`,
          only the token id is read back; eager: forward + argmax + synchronize), median of 3;
  decode  ms per greedy token over DECODE_STEPS steps after the prompt (median step);
  check   teacher-forced logits against day0's eager model: every prompt row, then CHECK_STEPS
          decode steps. On a long prompt a few rows may differ by O(1): the indexer's top-k meets
          near-ties that the two float orders break differently, and a changed selection can
          change a MoE routing downstream (measured in docs/perf.md); so the report gives the
          fraction of prompt rows within 1e-3 and the worst decode step, not one max.
transformers runs on weights dequantized from the same MXFP4 bytes (exact in bf16), its dense
weights the same bf16 values; day0's eager model reads the checkpoint itself.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

DECODE_STEPS = 16
CHECK_STEPS = 8
SETTINGS = {  # per benchmark config: the checkpoint config, contexts, the artifact's max_seq_len,
    # transformers' dtype (bf16 as benchmarked; f32 in the CPU test, where it must match tightly:
    # in bf16 a router near-tie flips an expert choice and the rows part by O(0.1))
    "full": {
        "checkpoint": "e2e",
        "contexts": [1024, 4096],
        "max_seq_len": 4096 + 128,
        "transformers_dtype": "bfloat16",
        "cache_dtypes": ["float32", "bfloat16"],
    },
    "tiny": {
        "checkpoint": "tiny",
        "contexts": [24, 40],
        "max_seq_len": 96,  # the engine piece's tiny artifact's: one of the two is that artifact
        "transformers_dtype": "float32",
        "cache_dtypes": ["float32", "bfloat16"],
    },
}
SEED = 0
SHORT = {"float32": "f32", "bfloat16": "bf16"}  # cache dtypes in tables and plots
# day0 sources the e2e run needs on the host (the eager model and the runtime; no compiler)
SHIPPED_DIRS = ["models", "runtime"]
SHIPPED = [
    "frontend/__init__.py",
    "frontend/ops.py",
    "tools/bench/bench_checkpoint.py",
    "tools/bench/bench_e2e.py",
    "tools/bench/deepseek_v32_configs.py",
    "tools/checkpoints/__init__.py",
    "tools/checkpoints/common.py",
    "tools/checkpoints/demo.py",
    "tools/bench/gpu_artifact_profile.py",
]


def package(out: Path, config: str, target: str, cache: Path, reuse: Path | None = None) -> dict:
    """Compile the benchmark checkpoint (written once under `cache`) into out/e2e/artifact-<cache
    dtype>, one artifact per cache dtype of the config. reuse: an artifact of the same checkpoint
    (the engine piece's: its paged entry points beside the dense ones the Session runs) taken as
    the artifact of its cache dtype when its max_seq_len is the config's, instead of compiling it
    again."""
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.runtime.artifact import read_manifest
    from day0.tools.bench import bench_checkpoint

    s = SETTINGS[config]
    ckpt = bench_checkpoint.write(cache / f"ckpt-{s['checkpoint']}-{SEED}", s["checkpoint"], SEED)
    have = read_manifest(reuse, verify=False) if reuse is not None else None
    for dtype in s["cache_dtypes"]:
        art = out / "e2e" / f"artifact-{dtype}"
        if art.exists():
            shutil.rmtree(art)
        if have is not None and have.max_seq_len == s["max_seq_len"] and {x.dtype for x in have.state} == {dtype}:
            shutil.copytree(reuse, art)
            continue
        compile_checkpoint(ckpt, art, BuildOptions(target=target, max_seq_len=s["max_seq_len"], cache_dtype=dtype))
    ship_sources(out, SHIPPED)
    return {"checkpoint": s["checkpoint"], "seed": SEED, **s}


def ship_sources(out: Path, files) -> None:
    """Copy the day0 sources a model run on the host needs (models/, runtime/ and `files`) to out/day0."""
    src = Path(__file__).resolve().parents[2]  # the day0 package root
    for d in SHIPPED_DIRS:
        shutil.copytree(src / d, out / "day0" / d, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in files:
        (out / "day0" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, out / "day0" / rel)


# ---------------------------------------------------------------------------------------------
# run (GPU host)


def _sync(dev: str) -> None:
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()


def _median(xs) -> float:
    import numpy as np

    return float(np.median(xs))


def time_session(s, ids, forced, repeats: int, steps: int, warmup: int = 0) -> dict:
    """One day0 Session on a prompt: prefill_s, the median of `repeats` greedy prefills up to the
    first token id in host memory (`prefill_greedy`, from a reset); decode_s, the median of
    `steps` greedy steps after it (`decode_greedy`, one at a time); generate_s, a token of
    `Session.generate` at temperature 0 (the fastest of max(repeats, 5) generations of steps + 1 tokens
    less the fastest of 1 token, over steps: what a user's generation gets, its prefill taken out
    by the same call rather than by prefill_s); then teacher-forced logits of every prompt
    row and of one decode step per id in `forced`. The first `warmup` prefills and steps are not
    counted."""
    import numpy as np

    prefill = []
    for _ in range(warmup + repeats):
        s.reset()
        t0 = time.perf_counter()
        tok = s.prefill_greedy(ids)
        prefill.append(time.perf_counter() - t0)
    step_s = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        tok = s.decode_greedy(tok)
        step_s.append(time.perf_counter() - t0)
    gen = {1: [], steps + 1: []}  # interleaved, so that drift reaches both lengths alike
    # at least 5 of each: the difference of two fastest times is steps tokens' worth, which on a
    # small model is within the spread of a prefill over 3 repeats (it came out negative)
    for _ in range(max(repeats, 5)):
        for n, times in gen.items():
            s.reset()
            t0 = time.perf_counter()
            s.generate(ids, max_new_tokens=n, stop_at_eos=False)
            times.append(time.perf_counter() - t0)
    s.reset()
    logits = s.prefill(ids)
    checks = np.stack([s.decode(t) for t in forced])
    prefill_s = _median(prefill[warmup:])
    return {
        "prefill_s": prefill_s,
        "decode_s": _median(step_s[warmup:]),
        "generate_s": (min(gen[steps + 1]) - min(gen[1])) / steps,
        "logits": logits,
        "steps": checks,
    }


def _time_day0(art: Path, ckpt: Path, device: str, prompts: dict[int, list[int]], forced: list[int]) -> dict:
    from day0.runtime.session import Session

    s = Session.load(art, device=device, verify=False, checkpoint_dir=ckpt)
    out = {}
    for c, ids in prompts.items():
        r = time_session(s, ids, forced, repeats=3, steps=DECODE_STEPS)
        out[c] = {
            "ttft_ms": 1e3 * r["prefill_s"],
            "decode_ms": 1e3 * r["decode_s"],
            "generate_ms": 1e3 * r["generate_s"],
            "logits": r["logits"],
            "steps": r["steps"],
        }
    out["state_bytes"] = s.state_bytes()
    return out


def _time_eager(step, dev: str, prompts: dict[int, list[int]], forced: list[int]) -> dict:
    """step(ids [S] tensor, prompt: bool) -> logits [S, V]; it owns its state (reset on prompt)."""
    import numpy as np
    import torch

    out = {}
    for c, ids in prompts.items():
        ids = torch.tensor(ids, device=dev)
        ttft = []
        for _ in range(3):
            _sync(dev)
            t0 = time.perf_counter()
            tok = step(ids, True)[-1].argmax(-1, keepdim=True)
            int(tok)  # the token reaches the host
            ttft.append(time.perf_counter() - t0)
        logits = step(ids, True).float().cpu().numpy()
        checks = np.stack([step(torch.tensor([t], device=dev), False)[-1].float().cpu().numpy() for t in forced])
        step(ids, True)
        tok = torch.tensor([int(logits[-1].argmax())], device=dev)
        steps = []
        for _ in range(DECODE_STEPS):
            _sync(dev)
            t0 = time.perf_counter()
            tok = step(tok, False)[-1].argmax(-1, keepdim=True)
            int(tok)
            steps.append(time.perf_counter() - t0)
        out[c] = {"ttft_ms": 1e3 * _median(ttft), "decode_ms": 1e3 * _median(steps), "logits": logits, "steps": checks}
    return out


def _day0_eager(ckpt: Path, max_seq_len: int, dev: str):
    import torch

    from day0.models.registry import build_eager

    model = build_eager(ckpt, max_seq_len).to(dev)
    box = {}

    @torch.no_grad()
    def step(ids, prompt: bool):
        with torch.device(dev):
            if prompt:
                box["pos"], box["state"] = 0, [t.to(dev) for t in model.empty_state()]
            start = torch.tensor([box["pos"]], device=dev)
            logits, *box["state"] = model.step(ids, start, *box["state"], first_turn=prompt)
            box["pos"] += ids.shape[0]
            return logits

    return model, step


def _transformers_eager(model, raw: dict, dev: str, dtype: str):
    """transformers' DeepseekV32ForCausalLM in `dtype` with the weights of day0's eager model
    (MXFP4 experts dequantized: exact in bf16)."""
    import torch
    import transformers

    from day0.frontend.ops import mxfp4_dequantize

    fields = {k: v for k, v in raw.items() if k not in ("model_type", "quantization_config")}
    cfg = transformers.DeepseekV32Config(**fields)
    with torch.device(dev):  # built on the device in its dtype (no f32 copy of 4.9B on the host)
        ref = transformers.DeepseekV32ForCausalLM._from_config(
            cfg, attn_implementation="eager", dtype=getattr(torch, dtype)
        )
    ref = ref.eval()
    want = ref.state_dict()
    ours = dict(model.named_parameters())
    state = {}
    for name, t in want.items():
        if name in ours:
            state[name] = ours[name].to(t.dtype)
        elif name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            experts = model.get_submodule(name.rsplit(".", 1)[0])
            gate_up, down = experts.stacked()
            packed, scales = gate_up if name.endswith("gate_up_proj") else down
            state[name] = torch.stack([mxfp4_dequantize(p, s) for p, s in zip(packed, scales)]).to(t.dtype)
        else:
            raise KeyError(f"transformers tensor {name} has no day0 counterpart")
    ref.load_state_dict(state, strict=True)
    del state
    box = {}

    @torch.no_grad()
    def step(ids, prompt: bool):
        if prompt:
            box["cache"] = transformers.DynamicCache(config=cfg)
        out = ref(ids[None], past_key_values=box["cache"], use_cache=True)
        return out.logits[0]

    return ref, step


def compare(got: dict, want: dict) -> dict:
    """Teacher-forced agreement of `got` with `want` (a reference run): per prompt row and per
    checked decode step, max |Δ| ÷ max |want| of the row."""
    import numpy as np

    def rows(a, b):
        a, b = a.astype(np.float64), b.astype(np.float64)
        return np.abs(a - b).max(1) / np.maximum(np.abs(b).max(1), 1e-30)

    prompt = rows(got["logits"], want["logits"])
    return {
        "prompt_rows_within_1e-3": float((prompt < 1e-3).mean()),
        "prompt_max_rel_err": float(prompt.max()),
        "decode_max_rel_err": float(rows(got["steps"], want["steps"]).max()),
        "same_greedy_prompt_rows": float((got["logits"].argmax(1) == want["logits"].argmax(1)).mean()),
    }


def run(pkg: Path, spec: dict, device: str) -> dict:
    """The e2e rows of the benchmark (see the module docstring)."""
    import numpy as np
    import torch

    from day0.tools.bench import bench_checkpoint

    e = spec["e2e"]
    dev = "cuda" if device.startswith("cuda") else "cpu"
    ckpt = bench_checkpoint.write(pkg / f"ckpt-{e['checkpoint']}-{e['seed']}", e["checkpoint"], e["seed"])
    raw = json.loads((ckpt / "config.json").read_text())
    rng = np.random.default_rng(e["seed"])
    prompts = {c: rng.integers(0, raw["vocab_size"], c).tolist() for c in e["contexts"]}
    forced = rng.integers(0, raw["vocab_size"], CHECK_STEPS).tolist()
    res = {
        "piece": "e2e",
        "contexts": e["contexts"],
        "max_seq_len": e["max_seq_len"],
        "transformers_dtype": e["transformers_dtype"],
        "decode_steps": DECODE_STEPS,
    }
    day0, res["state_bytes"] = {}, {}
    for dtype in e["cache_dtypes"]:
        day0[dtype] = _time_day0(pkg / "e2e" / f"artifact-{dtype}", ckpt, device, prompts, forced)
        res["state_bytes"][dtype] = day0[dtype].pop("state_bytes")
    model, step = _day0_eager(ckpt, e["max_seq_len"], dev)
    ours = {}
    for dtype in e["cache_dtypes"]:  # the eager model with the artifact's caches: its check
        model.cache_dtype = dtype
        ours[dtype] = _time_eager(step, dev, prompts, forced)
    model.cache_dtype = "float32"
    ref, ref_step = _transformers_eager(model, raw, dev, e["transformers_dtype"])
    del step
    theirs = _time_eager(ref_step, dev, prompts, forced)
    rows = []
    for c in e["contexts"]:
        for dtype in e["cache_dtypes"]:
            rows.append(
                {
                    "context": c,
                    "cache_dtype": dtype,
                    **{f"day0_{k}": day0[dtype][c][k] for k in ("ttft_ms", "decode_ms", "generate_ms")},
                    **{f"eager_{k}": ours[dtype][c][k] for k in ("ttft_ms", "decode_ms")},
                    **{f"transformers_{k}": theirs[c][k] for k in ("ttft_ms", "decode_ms")},
                    "day0_vs_eager": compare(day0[dtype][c], ours[dtype][c]),
                    "day0_vs_eager_f32": compare(day0[dtype][c], ours["float32"][c]),
                    "transformers_vs_eager": compare(theirs[c], ours["float32"][c]),
                }
            )
    res["rows"] = rows
    del ref, model
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


def table(r: dict) -> str:
    lines = [
        f"{'e2e ctx':<10}{'caches':>9}{'day0 ms/tok':>12}{'generate':>9}{'eager':>9}{'transf.':>9}{'day0 TTFT ms':>14}"
        f"{'eager':>9}{'transf.':>9}{'transf./day0':>13}{'dec err':>10}{'rows ok':>9}"
    ]
    for row in r["rows"]:
        lines.append(
            f"{row['context']:<10}{SHORT[row['cache_dtype']]:>9}{row['day0_decode_ms']:>12.2f}"
            f"{row.get('day0_generate_ms', float('nan')):>9.2f}"
            f"{row['eager_decode_ms']:>9.2f}{row['transformers_decode_ms']:>9.2f}{row['day0_ttft_ms']:>14.1f}{row['eager_ttft_ms']:>9.1f}"
            f"{row['transformers_ttft_ms']:>9.1f}"
            f"{row['transformers_decode_ms'] / row['day0_decode_ms']:>13.1f}"
            f"{row['day0_vs_eager']['decode_max_rel_err']:>10.1e}"
            f"{row['day0_vs_eager']['prompt_rows_within_1e-3']:>9.3f}"
        )
    lines.append(
        "e2e: greedy decode ms per token (day0: decode_greedy steps; generate: a token of "
        "Session.generate) and time to first token; caches: day0's latent and indexer "
        "caches (f32 or bf16); eager = day0's model in PyTorch (f32 math, the same caches), "
        f"transf. = transformers eager ({r['transformers_dtype']}); dec err: day0 vs eager, "
        "worst teacher-forced decode step; rows ok: fraction of prompt rows within 1e-3 of eager"
    )
    return "\n".join(lines)
