"""`make bench-gpu`: the GPU benchmark, packaged on the compile machine and run on a GPU host that
has PyTorch but neither IREE's compiler nor network access.

    python -m day0.tools.bench.bench_gpu package OUT [--config full|tiny] [--target cuda-sm90]
        compile machine: OUT/ gets the vmfbs, bench.json (shapes), the day0 runtime sources the
        run needs and run.sh; `make bench-gpu` adds the iree-base-runtime wheel for the host.
    sh OUT/run.sh                       (GPU host; = python -m day0.tools.bench.bench_gpu run OUT)
        generates the weights from a seed on the device, measures, prints a table last and
        writes OUT/results.json.
    python -m day0.tools.bench.bench_gpu plot results.json --out docs/   (PNG plots for docs/perf.md)

Pieces (GLM-5.3-Flash shapes in the `full` config):
  moe   one MXFP4 MoE decode step, 8 of 288 experts, hidden 4096, intermediate 2048: day0's
        `mxfp4_routed` (the model's code: two fused `day0::mxfp4_moe` ops), PyTorch eager on
        weights dequantized to bf16 ahead of time, PyTorch eager dequantizing every call.
  dsa   one DSA decode step: indexer scores (32 heads × 128, ReLU, weighted sum) over T cached
        keys, top-2048, MQA of 64 heads over the selected 512-d latent rows; at T = 32K, 128K,
        1M. day0 (indexer + radix top-k + dsa-to-gather-tiles) vs PyTorch dense MQA over all T
        rows vs PyTorch eager sparse (the same steps in eager ops). Caches in bf16.
  e2e   the 4.9B deepseek_v32 (docs/perf.md) end to end (tools/bench/bench_e2e.py): decode ms per token and time
        to first token at 1K and 4K, day0 with f32 and with bf16 caches vs transformers eager.
  glm5  `make bench`'s small glm5_next (tools/bench/bench_gpu_glm5.py): prefill and decode tokens/s, day0
        vs transformers eager on the GPU, with a teacher-forced check against it.
  engine  the 4.9B deepseek_v32 through the Engine (tools/bench/bench_gpu_engine.py): aggregate decode
        tokens/s and step ms at 1, 8, 32, 64 sequences of 4K vs transformers eager at the same batch.
  long  the 4.9B deepseek_v32 compiled for 1M positions (tools/bench/bench_gpu_long.py): decode ms
        per token and a prompt chunk's time at 4K to 1M, time to first token at 4K, agreement with
        day0's eager model at 32K.
  default  the shipped default model (tools/bench/bench_gpu_default.py): held-out perplexity and
        greedy agreement, day0 with the target's and with f32 caches vs transformers on the GPU.
  vision  GLM-5.3-Flash's vision tower at release shapes (tools/bench/bench_gpu_vision.py): encode
        ms at 448² and 1024² and a time to first token, day0 vs transformers eager and sdpa bf16.
Limit: the bytes a step must read ÷ the measured device copy bandwidth (read + write).

Timing: a day0 call has a host floor (docs/perf.md); each vmfb is compiled twice, with the
step once and R times chained (each step's output feeds the next one's input), and the device
time of one step is (t_R − t_1) / (R − 1). PyTorch times are CUDA-event medians per call.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from day0.tools.bench import bench_gpu_long  # (its module top imports nothing heavy)

CONFIGS = {
    "full": {
        "moe": {"experts": 288, "top_k": 8, "hidden": 4096, "intermediate": 2048},
        "dsa": {
            "index_heads": 32,
            "index_dim": 128,
            "top_k": 2048,
            "heads": 64,
            "latent": 512,
            "contexts": [32768, 131072, 1048576],
        },
        "reps": 8,
    },
    "tiny": {  # the CPU smoke test of the whole package (tests/test_bench_gpu.py)
        "moe": {"experts": 8, "top_k": 2, "hidden": 64, "intermediate": 32},
        "dsa": {"index_heads": 4, "index_dim": 16, "top_k": 16, "heads": 4, "latent": 32, "contexts": [256]},
        "reps": 3,
    },
}
SEED = 0
# day0 sources the GPU host needs (no compiler, no torch-mlir): the runtime, this file and the
# piece modules `run` and `table` import whichever pieces a package holds.
_SHIPPED = [
    "runtime/__init__.py",
    "runtime/vm.py",
    "tools/__init__.py",
    "tools/bench/__init__.py",
    "tools/bench/bench_gpu.py",
    "tools/bench/timing.py",
    "tools/bench/bench_e2e.py",
    "tools/bench/bench_gpu_glm5.py",
    "tools/bench/bench_gpu_engine.py",
    "tools/bench/bench_gpu_long.py",
    "tools/bench/bench_gpu_default.py",
    "tools/bench/bench_gpu_vision.py",
    "frontend/__init__.py",
    "frontend/ops.py",
    "models/__init__.py",
    "models/moe.py",
    "models/layers.py",
    "lowering/__init__.py",
    "lowering/kernel_geometry.py",
]


# ---------------------------------------------------------------------------------------------
# the benchmarked steps (torch; exported on the compile machine, run eagerly on the host)


def moe_steps(reps: int):
    import torch

    from day0.models.moe import mxfp4_routed

    class MoeSteps(torch.nn.Module):
        def forward(self, x, gu_packed, gu_scales, down_packed, down_scales, chosen, weights):
            for _ in range(reps):  # chained: each step's output is the next step's input
                x = mxfp4_routed(x, weights, chosen, (gu_packed, gu_scales), (down_packed, down_scales))
            return x

    return MoeSteps()


def dsa_index(qi, wi, keys):
    """Indexer scores [1, T] f32 of one query: Σ_h w_h · relu(q_h · k_t) (the model's op)."""
    from day0.frontend import ops

    return ops.indexer_scores(qi[None], keys, wi[None], 1.0)


def dsa_steps(reps: int, top_k: int, latent: int, index_heads: int, index_dim: int):
    import torch

    import day0.frontend.ops  # noqa: F401  (registers torch.ops.day0.*)

    scale = latent**-0.5

    class DsaSteps(torch.nn.Module):
        def forward(self, qi, wi, keys, q, kv):
            for _ in range(reps):
                _, sel = torch.topk(dsa_index(qi, wi, keys), top_k, dim=-1, sorted=False)
                o = torch.ops.day0.dsa_attention(q[None], kv, sel, scale, latent)[0]  # [H, D] f32
                # chained: the next query (and indexer query) depend on this output; the op takes
                # q in the cache's dtype (bf16) and returns f32
                q = o.to(q.dtype)
                qi = o[:index_heads, :index_dim]
            return o  # the last step's f32 result (the op's contract: not rounded to bf16)

    return DsaSteps()


def _moe_inputs(c: dict, dev: str, gen):
    import torch

    E, k, H, I = c["experts"], c["top_k"], c["hidden"], c["intermediate"]
    u8 = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, device=dev, generator=gen)  # noqa: E731
    sc = lambda *s: torch.randint(118, 124, s, dtype=torch.uint8, device=dev, generator=gen)  # noqa: E731
    x = torch.randn(1, H, device=dev, generator=gen)
    chosen = torch.randperm(E, device=dev, generator=gen)[:k].reshape(1, k)
    weights = torch.softmax(torch.randn(1, k, device=dev, generator=gen), -1)
    return [x, u8(E, 2 * I, H // 2), sc(E, 2 * I, H // 32), u8(E, H, I // 2), sc(E, H, I // 32), chosen, weights]


def _dsa_inputs(c: dict, T: int, dev: str, gen):
    import torch

    bf = torch.bfloat16
    return [
        torch.randn(c["index_heads"], c["index_dim"], device=dev, generator=gen),
        torch.rand(c["index_heads"], device=dev, generator=gen),
        torch.randn(T, c["index_dim"], device=dev, generator=gen).to(bf),
        torch.randn(c["heads"], c["latent"], device=dev, generator=gen).to(bf),
        torch.randn(T, c["latent"], device=dev, generator=gen).to(bf),
    ]


# ---------------------------------------------------------------------------------------------
# package (compile machine)


def _compile(module, args, pipeline: str, target: str, out: Path) -> None:
    from torch_mlir import fx

    from day0.frontend import ops
    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.lowering.targets import get_target
    from day0.passes.pipeline import run_pipeline

    with new_context(), ops.keeping(get_target(target).kept_ops):  # as frontend.export does for the model
        m = parse_module(str(fx.export_and_import(module, *args, output_type="raw", func_name="main")))
        run_pipeline(m, pipeline)
        text = str(m)
    compile_mlir(text, target, out, repro_dir=out.parent / f"{out.stem}.repro")


PIECES = ("moe", "dsa", "e2e", "glm5", "engine", "serve", "long", "default", "vision")
E2E_GOALS_MS = {"decode_ms": 2.0, "ttft_ms": 100.0}  # at 4K context


def package(out: Path, config: str, target: str, pieces=PIECES, cache: Path = Path(".cache/bench-gpu-ckpt")) -> None:
    import torch

    from day0.lowering.targets import DsaShape, get_target
    from day0.tools.bench import bench_e2e, bench_gpu_default, bench_gpu_engine, bench_gpu_glm5, bench_gpu_vision

    cfg = CONFIGS[config]
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)
    # each piece through the target's own lowering of its ops (lowering/targets.py)
    mxfp4 = get_target(target).pipeline(roles=("mxfp4",))
    dsa = get_target(target).pipeline(DsaShape(cfg["dsa"]["top_k"]), roles=("indexer", "topk", "dsa"))
    entries = {}
    big = lambda ts: [t if t.numel() < 2**20 else torch.empty_like(t) for t in ts]  # noqa: E731 (shapes only)
    moe_args = big(_moe_inputs(cfg["moe"], "cpu", gen))
    for r in (1, cfg["reps"]) if "moe" in pieces else ():
        name = f"moe_r{r}"
        _compile(moe_steps(r), moe_args, mxfp4, target, out / f"{name}.vmfb")
        entries[name] = {"piece": "moe", "reps": r}
    d = cfg["dsa"]
    for T in d["contexts"] if "dsa" in pieces else ():
        args = big(_dsa_inputs(d, T, "cpu", gen))
        for r in (1, cfg["reps"]):
            name = f"dsa_{T}_r{r}"
            steps = dsa_steps(r, d["top_k"], d["latent"], d["index_heads"], d["index_dim"])
            _compile(steps, args, dsa, target, out / f"{name}.vmfb")
            entries[name] = {"piece": "dsa", "context": T, "reps": r}
    engine = bench_gpu_engine.package(out, config, target, cache) if "engine" in pieces else None
    # the e2e piece's artifact of the target's cache dtype is the engine piece's (same checkpoint)
    reuse = out / "engine" / "artifact" if engine is not None else None
    e2e = bench_e2e.package(out, config, target, cache, reuse) if "e2e" in pieces else None
    glm5 = bench_gpu_glm5.package(out, config, target, cache) if "glm5" in pieces else None
    serve = bench_gpu_engine.package_serve(out, config, target, cache, engine) if "serve" in pieces else None
    long = bench_gpu_long.package(out, config, target, cache, engine) if "long" in pieces else None
    default = bench_gpu_default.package(out, config, target) if "default" in pieces else None
    vision = bench_gpu_vision.package(out, config, target, cache) if "vision" in pieces else None
    (out / "bench.json").write_text(
        json.dumps(
            {
                "config": config,
                "target": target,
                "seed": SEED,
                "shapes": cfg,
                "pieces": list(pieces),
                "vmfbs": entries,
                "e2e": e2e,
                "glm5": glm5,
                "engine": engine,
                "serve": serve,
                "long": long,
                "default": default,
                "vision": vision,
            },
            indent=2,
        )
    )
    src = Path(__file__).resolve().parents[2]  # the day0 package root
    for rel in _SHIPPED:
        dst = out / "day0" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst)
    (out / "run.sh").write_text(
        "#!/bin/sh\n# GPU host: needs python3 with torch (CUDA) and numpy; installs the IREE runtime wheel locally.\n"
        'cd "$(dirname "$0")" || exit 1\n'
        "python3 -m pip install -q --no-index --no-deps --target .site wheels/*.whl || exit 1\n"
        'PYTHONPATH="$PWD/.site:$PWD" exec python3 -m day0.tools.bench.bench_gpu run . "$@"\n'
    )
    print(f"wrote {out}")


# ---------------------------------------------------------------------------------------------
# run (GPU host)


def _cuda_time_us(fn, reps: int = 50) -> float:
    """Median of CUDA-event timings of fn() (device time when the host keeps ahead)."""
    import numpy as np
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return float(np.median(ts))


def _graph_us(fn, reps: int = 20) -> float:
    """Device time of fn() captured in a CUDA graph (PyTorch without its launch overhead)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return _cuda_time_us(g.replay, reps)


def _wall_us(fn, reps: int = 30) -> float:
    from day0.tools.bench.timing import median_seconds

    return median_seconds(fn, reps) * 1e6


def copy_bandwidth(dev: str) -> float:
    """Bytes per second (read + written) of a device copy of 1 GiB (64 MiB on the CPU)."""
    import torch

    n = 2**30 if dev == "cuda" else 2**26
    src, dst = torch.ones(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
    if dev == "cuda":
        return 2 * n / (_cuda_time_us(lambda: dst.copy_(src), 20) * 1e-6)
    return 2 * n / (_wall_us(lambda: dst.copy_(src), 5) * 1e-6)


def _day0_step_us(pkg: Path, names: tuple[str, str], inputs, reps: int, device: str):
    """Per-call wall time of the 1-step and R-step vmfbs, the step's device time from both, and
    the 1-step output (to check against PyTorch)."""
    import numpy as np

    from day0.runtime.vm import VmModule

    def timed(name: str):
        vm = VmModule.load(pkg / f"{name}.vmfb", device=device)
        args = [vm.to_device(a) for a in inputs]
        fn = vm.function("main")
        out = np.asarray(fn(*args).to_host()).astype(np.float32)
        return _wall_us(lambda: fn(*args).to_host()), out  # device buffers freed on return

    res, first = {}, None
    for name in names:
        res[name], out = timed(name)
        first = out if first is None else first
    t1, tr = res[names[0]], res[names[1]]
    return {"day0_call_us": t1, "day0_step_us": (tr - t1) / (reps - 1)}, first


def _rel_err(got, want) -> float:
    import numpy as np

    want = want.float().cpu().numpy()
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def run_moe(pkg: Path, spec: dict, dev: str, device: str, bw: float) -> dict:
    import torch
    import torch.nn.functional as F

    from day0.frontend.ops import mxfp4_dequantize

    c, reps = spec["shapes"]["moe"], spec["shapes"]["reps"]
    gen = torch.Generator(device=dev).manual_seed(SEED)
    x, gu_p, gu_s, d_p, d_s, chosen, weights = _moe_inputs(c, dev, gen)
    host = [_numpy(t) for t in (x, gu_p, gu_s, d_p, d_s, chosen, weights)]
    res = {"piece": "moe", **c}
    times, got = _day0_step_us(pkg, ("moe_r1", f"moe_r{reps}"), host, reps, device)
    del host
    res |= times
    res["day0_rel_err"] = _rel_err(got, moe_steps(1)(x, gu_p, gu_s, d_p, d_s, chosen, weights))
    idx = chosen[0].tolist()
    bf = torch.bfloat16
    # PyTorch eager, weights dequantized once to bf16 (only the chosen experts are kept: the
    # step reads those alone, and the full bf16 stack would not fit every host)
    gu_bf = {e: mxfp4_dequantize(gu_p[e], gu_s[e]).to(bf) for e in idx}
    dn_bf = {e: mxfp4_dequantize(d_p[e], d_s[e]).to(bf) for e in idx}
    xb, wb = x.to(bf), weights.to(bf)

    def eager_bf16():
        y = torch.zeros_like(xb)
        for j, e in enumerate(idx):
            g, u = F.linear(xb, gu_bf[e]).chunk(2, -1)
            y += wb[0, j] * F.linear(F.silu(g) * u, dn_bf[e])
        return y

    def eager_dequant():
        y = torch.zeros_like(xb)
        for j, e in enumerate(idx):
            g, u = F.linear(xb, mxfp4_dequantize(gu_p[e], gu_s[e]).to(bf)).chunk(2, -1)
            y += wb[0, j] * F.linear(F.silu(g) * u, mxfp4_dequantize(d_p[e], d_s[e]).to(bf))
        return y

    timer = _cuda_time_us if dev == "cuda" else _wall_us
    res["torch_bf16_us"] = timer(eager_bf16)
    res["torch_dequant_us"] = timer(eager_dequant)
    if dev == "cuda":
        res["torch_bf16_graph_us"] = _graph_us(eager_bf16)
    k, H, I = c["top_k"], c["hidden"], c["intermediate"]
    bytes_read = k * (2 * I * (H // 2 + H // 32) + H * (I // 2 + I // 32))
    res["bytes"] = bytes_read
    res["limit_us"] = bytes_read / bw * 1e6
    return res


def _numpy(t):
    """A host numpy copy; bf16 as an ml_dtypes.bfloat16 array (numpy has no bf16)."""
    import ml_dtypes
    import torch

    if t.dtype == torch.bfloat16:
        return t.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.cpu().numpy()


def run_dsa(pkg: Path, spec: dict, T: int, dev: str, device: str, bw: float) -> dict:
    import torch

    c, reps = spec["shapes"]["dsa"], spec["shapes"]["reps"]
    gen = torch.Generator(device=dev).manual_seed(SEED + T)
    qi, wi, keys, q, kv = _dsa_inputs(c, T, dev, gen)
    host = [_numpy(t) for t in (qi, wi, keys, q, kv)]
    res = {"piece": "dsa", "context": T, **{k: v for k, v in c.items() if k != "contexts"}}
    times, got = _day0_step_us(pkg, (f"dsa_{T}_r1", f"dsa_{T}_r{reps}"), host, reps, device)
    del host
    res |= times
    res["day0_rel_err"] = _rel_err(
        got, dsa_steps(1, c["top_k"], c["latent"], c["index_heads"], c["index_dim"])(qi, wi, keys, q, kv)
    )
    scale = c["latent"] ** -0.5

    def dense():
        p = torch.softmax((q @ kv.T).float() * scale, -1).to(torch.bfloat16)
        return p @ kv

    def sparse():
        _, sel = torch.topk(dsa_index(qi, wi, keys), c["top_k"], dim=-1, sorted=False)
        rows = kv[sel[0]]
        p = torch.softmax((q @ rows.T).float() * scale, -1).to(torch.bfloat16)
        return p @ rows

    timer = _cuda_time_us if dev == "cuda" else _wall_us
    res["torch_dense_us"] = timer(dense)
    res["torch_sparse_us"] = timer(sparse)
    if dev == "cuda":
        res["torch_sparse_graph_us"] = _graph_us(sparse)
    bytes_read = 2 * (T * c["index_dim"] + c["top_k"] * c["latent"])  # bf16 keys + selected rows
    res["bytes"] = bytes_read
    res["limit_us"] = bytes_read / bw * 1e6
    return res


def run(pkg: Path, device: str, json_out: Path | None, pieces=PIECES) -> list[dict]:
    import torch

    from day0.tools.bench import bench_e2e, bench_gpu_default, bench_gpu_engine, bench_gpu_glm5, bench_gpu_vision

    spec = json.loads((pkg / "bench.json").read_text())
    pieces = [p for p in pieces if p in spec.get("pieces", ("moe", "dsa"))]
    dev = "cuda" if device.startswith("cuda") else "cpu"
    bw = copy_bandwidth(dev)
    results = [
        {
            "piece": "bandwidth",
            "copy_GBps": bw / 1e9,
            "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        }
    ]
    if "moe" in pieces:
        results.append(run_moe(pkg, spec, dev, device, bw))
        print(json.dumps(results[-1]), flush=True)
    for T in spec["shapes"]["dsa"]["contexts"] if "dsa" in pieces else ():
        results.append(run_dsa(pkg, spec, T, dev, device, bw))
        print(json.dumps(results[-1]), flush=True)
        if dev == "cuda":
            torch.cuda.empty_cache()
    if "e2e" in pieces:
        results.append(bench_e2e.run(pkg, spec, device))
        print(json.dumps(results[-1]), flush=True)
    if "glm5" in pieces:
        results.append(bench_gpu_glm5.run(pkg, spec, device))
        print(json.dumps(results[-1]), flush=True)
    if "engine" in pieces:
        results.append(bench_gpu_engine.run(pkg, spec, device, bw))
        print(json.dumps(results[-1]), flush=True)
    if "serve" in pieces:
        results.append(bench_gpu_engine.run_serve(pkg, spec, device))
        print(json.dumps(results[-1]), flush=True)
    if "long" in pieces:
        results.append(bench_gpu_long.run(pkg, spec, device, bw))
        print(json.dumps(results[-1]), flush=True)
    if "default" in pieces:
        results.append(bench_gpu_default.run(pkg, spec, device))
        print(json.dumps(results[-1]), flush=True)
    if "vision" in pieces:
        results.append(bench_gpu_vision.run(pkg, spec, device))
        print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if json_out:
        json_out.write_text(json.dumps(results, indent=2))
    return results


def table(results: list[dict]) -> str:
    from day0.tools.bench import bench_e2e, bench_gpu_default, bench_gpu_engine, bench_gpu_glm5, bench_gpu_vision

    bw = results[0]
    lines = [
        f"device {bw['device']}, copy bandwidth {bw['copy_GBps']:.0f} GB/s (read + write)",
        f"{'piece':<14}{'day0 step µs':>14}{'day0 call µs':>14}{'torch A µs':>12}{'torch B µs':>12}"
        f"{'limit µs':>10}{'limit/day0':>11}{'A/day0':>8}",
    ]
    for r in results[1:]:
        if r["piece"] in ("e2e", "glm5", "engine", "serve", "long", "default", "vision"):
            continue
        if r["piece"] == "moe":
            name, a, b = "moe", r["torch_bf16_us"], r["torch_dequant_us"]
        else:
            ctx = r["context"]
            name = f"dsa {ctx // 1024}K" if ctx >= 1024 else f"dsa {ctx}"
            a, b = r["torch_sparse_us"], r["torch_dense_us"]
        s = r["day0_step_us"]
        lines.append(
            f"{name:<14}{s:>14.1f}{r['day0_call_us']:>14.1f}{a:>12.1f}{b:>12.1f}"
            f"{r['limit_us']:>10.1f}{r['limit_us'] / s:>11.2f}{a / s:>8.2f}"
        )
    lines.append(
        "torch A: moe = bf16 pre-dequantized, dsa = eager sparse; torch B: moe = dequantize per "
        "call, dsa = dense MQA over all keys"
    )
    lines += [bench_e2e.table(r) for r in results if r["piece"] == "e2e"]
    lines += [bench_gpu_glm5.table(r) for r in results if r["piece"] == "glm5"]
    lines += [bench_gpu_engine.table(r) for r in results if r["piece"] == "engine"]
    lines += [bench_gpu_engine.serve_table(r) for r in results if r["piece"] == "serve"]
    lines += [bench_gpu_long.table(r) for r in results if r["piece"] == "long"]
    lines += [bench_gpu_default.table(r) for r in results if r["piece"] == "default"]
    lines += [bench_gpu_vision.table(r) for r in results if r["piece"] == "vision"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# plots (compile machine; matplotlib)


def plot(results_path: Path, out_dir: Path) -> list[Path]:
    """PNGs of the pieces present in results.json (bench_gpu_moe/dsa/e2e.png)."""
    import matplotlib

    from day0.tools.bench import bench_e2e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(results_path.read_text())
    device = results[0]["device"]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        fig.tight_layout()
        written.append(out_dir / name)
        fig.savefig(written[-1], dpi=110)

    for moe in [r for r in results if r["piece"] == "moe"][:1]:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        bars = {
            "day0 (MXFP4 fused)": moe["day0_step_us"],
            "PyTorch bf16\n(pre-dequantized)": moe["torch_bf16_us"],
            "PyTorch\n(dequant per call)": moe["torch_dequant_us"],
            "bandwidth limit": moe["limit_us"],
        }
        ax.barh(list(bars), list(bars.values()), color=["#2a7", "#888", "#bbb", "#36c"])
        ax.set_xscale("log")
        ax.set_xlabel("µs per MoE decode step (log)")
        ax.set_title(f"MXFP4 MoE step, {moe['top_k']} of {moe['experts']} experts, {device}")
        for i, v in enumerate(bars.values()):
            ax.text(v, i, f" {v:.0f}", va="center", fontsize=8)
        save(fig, "bench_gpu_moe.png")
    dsa = [r for r in results if r["piece"] == "dsa"]
    if dsa:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        xs = [r["context"] for r in dsa]
        for key, label, style in (
            ("day0_step_us", "day0", "o-"),
            ("torch_sparse_us", "PyTorch eager sparse", "s--"),
            ("torch_dense_us", "PyTorch dense", "^--"),
            ("limit_us", "bandwidth limit", "k:"),
        ):
            ax.plot(xs, [r[key] for r in dsa], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("cached tokens")
        ax.set_ylabel("µs per decode step")
        ax.set_title(f"DSA decode layer, top-{dsa[0]['top_k']}, {device}")
        ax.legend(fontsize=8)
        save(fig, "bench_gpu_dsa.png")
    for e2e in [r for r in results if r["piece"] == "e2e"][:1]:
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
        rows = e2e["rows"]
        contexts = sorted({row["context"] for row in rows})
        dtypes = [d for d in ("float32", "bfloat16") if any(row.get("cache_dtype", "float32") == d for row in rows)]
        first = {c: next(row for row in rows if row["context"] == c) for c in contexts}
        bars = [
            (
                f"day0, {bench_e2e.SHORT[d]} caches",
                color,
                {row["context"]: row for row in rows if row.get("cache_dtype", "float32") == d},
                "day0",
            )
            for d, color in zip(dtypes, ("#2a7", "#176"))
        ]
        bars += [
            (f"transformers ({e2e['transformers_dtype']})", "#888", first, "transformers"),
            ("day0's model, eager", "#bbb", first, "eager"),
        ]
        for ax, metric, label, goal in (
            (axes[0], "decode_ms", "ms per token (decode)", E2E_GOALS_MS["decode_ms"]),
            (axes[1], "ttft_ms", "ms to first token", E2E_GOALS_MS["ttft_ms"]),
        ):
            ax.axhline(goal, color="#36c", linestyle=":", label="goal (issue 4)")
            width = 0.8 / len(bars)
            for j, (name, color, by_context, key) in enumerate(bars):
                vals = [by_context[c][f"{key}_{metric}"] for c in contexts]
                ax.bar([i + j * width for i in range(len(vals))], vals, width, label=name, color=color)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(contexts))], [f"{c // 1024}K" for c in contexts])
            ax.set_yscale("log")
            ax.set_ylabel(label)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"4.9B deepseek_v32, MXFP4 experts, greedy, {device}", fontsize=9)
        save(fig, "bench_gpu_e2e.png")
    for glm5 in [r for r in results if r["piece"] == "glm5"][:1]:
        fig, ax = plt.subplots(figsize=(6, 2.6))
        labels, width = ("prefill", "decode"), 0.38
        for j, (who, color) in enumerate((("day0", "#2a7"), ("transformers", "#888"))):
            vals = [glm5[f"{who}_{k}_tok_s"] for k in labels]
            ax.barh(
                [i + j * width for i in range(2)],
                vals,
                width,
                color=color,
                label="day0" if who == "day0" else "transformers eager (f32)",
            )
            for i, v in enumerate(vals):
                ax.text(v, i + j * width, f" {v:.0f}", va="center", fontsize=8)
        ax.set_yticks([i + width / 2 for i in range(2)], [f"{k} tok/s" for k in labels])
        ax.set_xscale("log")
        ax.legend(fontsize=7)
        ax.set_title(
            f"glm5_next small (KDA + k-pool DSA + mHC + MoE), prompt {glm5['prompt_len']}, {device}", fontsize=9
        )
        save(fig, "bench_gpu_glm5.png")
    for long in [r for r in results if r["piece"] == "long"][:1]:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        xs = [row["length"] for row in long["rows"]]
        ax.plot(xs, [row["decode_ms"] for row in long["rows"]], "o-", color="#2a7", label="day0 decode ms/token")
        ax.plot(xs, [row["limit_ms"] for row in long["rows"]], ":", color="#36c", label="bytes ÷ bandwidth")
        ax.axhline(2 * long["rows"][0]["decode_ms"], color="#c63", linestyle="--", label="goal at 1M: 2× the 4K step")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("ms per token")
        ax.legend(fontsize=7)
        ax.set_title(f"4.9B deepseek_v32, max_seq_len {long['max_seq_len']}, one sequence, {device}", fontsize=9)
        save(fig, "bench_gpu_long.png")
    return written


def _pieces(text: str) -> tuple[str, ...]:
    got = tuple(p for p in text.split(",") if p)
    bad = [p for p in got if p not in PIECES]
    if bad or not got:
        raise SystemExit(f"--pieces: unknown {bad} (choose from {', '.join(PIECES)})")
    return got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-bench-gpu")
    p.add_argument("mode", choices=["package", "run", "plot"])
    p.add_argument("path")
    p.add_argument("--config", default="full", choices=sorted(CONFIGS))
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default=None)
    p.add_argument("--out", default="docs")
    p.add_argument("--pieces", default=",".join(PIECES), help="comma-separated subset of " + ",".join(PIECES))
    a = p.parse_args(argv)
    if a.mode == "package":
        package(Path(a.path), a.config, a.target, _pieces(a.pieces))
    elif a.mode == "run":
        run(Path(a.path), a.device, Path(a.json) if a.json else Path(a.path) / "results.json", _pieces(a.pieces))
    else:
        for f in plot(Path(a.path), Path(a.out)):
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
