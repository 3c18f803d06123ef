"""Where a compiled artifact's time goes on the GPU: torch.profiler (CUPTI) over IREE's kernels
during one prefill and a few decode steps of a day0 artifact, grouped by kernel name.

    python -m day0.tools.bench.gpu_artifact_profile ARTIFACT --checkpoint CKPT [--prompt N] [--steps N]
    python -m day0.tools.bench.gpu_artifact_profile ARTIFACT --checkpoint CKPT --engine 64,16,1 [--prompt N]
    python -m day0.tools.bench.gpu_artifact_profile ARTIFACT --checkpoint CKPT --image 1024

GPU host (torch with CUDA, the iree runtime wheel). Prints, per phase, the wall time, the kernel
count and device time, the GPU's busy time within the span of its kernels (busy well below the
span: the GPU waits on the host), and the kernels by total device time; --json writes it all.
--engine profiles an artifact with paged entry points instead: one 512-token prompt chunk of one
sequence (`paged_prefill`), then Engine steps at each number of running sequences (largest
first, aborting down), filled as the `engine` bench piece fills them (4 prompts run, the rest
copies: tools/bench/bench_gpu_engine.py). --image profiles the vision tower instead: one
Session.image_features call on a SIDE×SIDE image (bench_gpu_vision.image_png; preprocessing on
the host is in the wall time, not in the device time).
"""

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path


def profile_call(fn) -> dict:
    """fn() once under torch.profiler: its wall time, its kernels (launches, device time, by name,
    largest first), the GPU's busy share of their span and where it idles."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()  # without it (a CPU test) the profile holds no kernels
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    kernels = defaultdict(lambda: [0, 0.0])
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name]
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            spans.append((e.time_range.start, e.time_range.end, e.name))
    rows = sorted(
        ({"kernel": n, "launches": c, "us": round(us, 1)} for n, (c, us) in kernels.items()), key=lambda r: -r["us"]
    )
    host = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type != torch.autograd.DeviceType.CUDA and e.name.startswith("day0.")
    ]
    return {
        "wall_ms": round(wall * 1e3, 2),
        "timeline": _timeline(spans, host),
        "launches": sum(r["launches"] for r in rows),
        "device_ms": round(sum(r["us"] for r in rows) / 1e3, 2),
        **_busy([(a, b) for a, b, _ in spans]),
        "idle_after": _idle_after(spans),
        "kernels": rows,
    }


def _timeline(spans, host) -> list[str]:
    """The profile as lines in time order (µs from its first event): the host's day0 ranges
    (`_traced`) and the GPU's runs of back-to-back kernels (gaps under 3 µs merged)."""
    t0 = min([a for a, _, _ in spans + host], default=0)
    runs = []  # [start, end, kernels, first kernel's name]
    for a, b, name in sorted(spans):
        if runs and a - runs[-1][1] < 3:
            runs[-1][1], runs[-1][2] = max(runs[-1][1], b), runs[-1][2] + 1
        else:
            runs.append([a, b, 1, name])
    lines = [(a, f"gpu  {a - t0:10.1f} {b - t0:10.1f}  {n} kernels from {name[:50]}") for a, b, n, name in runs]
    lines += [(a, f"host {a - t0:10.1f} {b - t0:10.1f}  {name}") for a, b, name in host]
    return [text for _, text in sorted(lines)]


def _traced():
    """Wrap the Engine's host phases in torch.profiler ranges named `day0.<phase>` (the profile's
    timeline): the step, its decode submissions and reads, the module invocations."""
    import functools

    import torch

    from day0.runtime.engine import Engine
    from day0.runtime.step_call import PagedCaller
    from day0.runtime.vm import VmModule

    def wrap(cls, name):
        fn = getattr(cls, name)

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            with torch.profiler.record_function(f"day0.{cls.__name__}.{name}"):
                return fn(*args, **kwargs)

        setattr(cls, name, traced)

    for cls, name in ((Engine, "step"), (PagedCaller, "submit"), (PagedCaller, "finish"), (VmModule, "invoke")):
        wrap(cls, name)


def _idle_after(spans, top: int = 12) -> list[dict]:
    """Where the GPU waits: for each kernel name, the idle time (no kernel running) between the
    end of its launches and the start of the next kernel, summed (µs), largest first. A kernel
    followed by a long wait marks where the host falls behind (launches slower than the kernels
    they follow) or blocks."""
    idle = defaultdict(lambda: [0, 0.0])
    end, last = None, None
    for a, b, name in sorted(spans):
        if end is not None and a > end:
            idle[last][0] += 1
            idle[last][1] += a - end
        if end is None or b >= end:
            end, last = b, name
    rows = sorted(({"kernel": n, "gaps": c, "us": round(us, 1)} for n, (c, us) in idle.items()), key=lambda r: -r["us"])
    return rows[:top]


def _busy(spans) -> dict:
    """span_ms: first kernel start to last kernel end; busy_ms: the time some kernel or copy ran
    (the union of their intervals). busy well below span: the GPU waits on the host."""
    if not spans:
        return {"span_ms": 0.0, "busy_ms": 0.0}
    spans.sort()
    busy, end = 0.0, spans[0][0]
    for a, b in spans:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return {"span_ms": round((end - spans[0][0]) / 1e3, 2), "busy_ms": round(busy / 1e3, 2)}


def run(artifact: Path, checkpoint: Path | None, prompt: int, steps: int, device: str, top: int) -> dict:
    import numpy as np

    from day0.runtime.session import Session

    s = Session.load(artifact, device=device, verify=False, checkpoint_dir=checkpoint)
    ids = np.random.default_rng(0).integers(0, s.vocab_size, prompt).tolist()
    for _ in range(2):  # warm: first calls load and JIT nothing, but allocate
        s.reset()
        tok = s.prefill_greedy(ids)
        tok = s.decode_greedy(tok)
    s.reset()
    out = {"prefill": profile_call(lambda: s.prefill_greedy(ids))}
    box = {"tok": 1}

    def decode():
        for _ in range(steps):
            box["tok"] = s.decode_greedy(box["tok"])

    out["decode"] = profile_call(decode)
    out["decode"]["steps"] = steps
    for phase, r in out.items():
        per = f", per step {r['wall_ms'] / steps:.2f} ms" if phase == "decode" else ""
        print(
            f"{phase}: wall {r['wall_ms']} ms{per}; {r['launches']} kernels, {r['device_ms']} ms on the device; "
            f"GPU busy {r['busy_ms']} of a {r['span_ms']} ms span"
        )
        for k in r["kernels"][:top]:
            print(f"  {k['us']:>10.1f} µs {k['launches']:>6}  {k['kernel'][:90]}")
    return out


def run_image(artifact: Path, checkpoint: Path | None, side: int, device: str, top: int) -> dict:
    """The profile of one image through the vision tower (module docstring)."""
    from day0.runtime.session import Session
    from day0.tools.bench.bench_gpu_vision import image_png

    s = Session.load(artifact, device=device, verify=False, checkpoint_dir=checkpoint)
    png = image_png(side)
    features = s.image_features([png])  # warm: allocates
    r = profile_call(lambda: s.image_features([png]))
    r.update(side_px=side, image_tokens=int(features.shape[0]))
    print(
        f"one {side}px image ({r['image_tokens']} image tokens): wall {r['wall_ms']} ms; {r['launches']} kernels, "
        f"{r['device_ms']} ms on the device; GPU busy {r['busy_ms']} of a {r['span_ms']} ms span"
    )
    for k in r["kernels"][:top]:
        print(f"  {k['us']:>10.1f} µs {k['launches']:>6}  {k['kernel'][:90]}")
    return {"image": r}


def run_engine(
    artifact: Path,
    checkpoint: Path | None,
    prompt: int,
    steps: int,
    device: str,
    top: int,
    batches: list[int],
    lookahead: bool = True,
) -> dict:
    """Profiles of `steps` Engine steps at each of `batches` running sequences (module docstring)."""
    import numpy as np

    from day0.runtime.artifact import read_manifest
    from day0.runtime.engine import Engine
    from day0.tools.bench.bench_gpu_engine import WARM, _copies, _fill

    most = max(batches)
    manifest = read_manifest(artifact, verify=False, checkpoint_dir=checkpoint)  # a moved checkpoint
    block, vocab = manifest.paged.block_size, manifest.vocab_size
    distinct = min(4, most)
    new_tokens = len(batches) * (WARM + steps) + 2 + distinct * -(-prompt // 512)
    eng = Engine.load(
        artifact,
        device=device,
        verify=False,
        checkpoint_dir=checkpoint,
        chunk=512,
        num_blocks=most * -(-(prompt + new_tokens) // block) + 1,
        max_running=most,
        lookahead=lookahead,
    )
    rng = np.random.default_rng(0)
    # one prompt chunk of one sequence alone (`paged_prefill`, 512 tokens), then let it go
    rid = eng.add(rng.integers(0, vocab, min(prompt, 1024)).tolist(), max_new_tokens=1, stop=())
    eng.step()  # a first chunk, warm
    r = out_chunk = profile_call(eng.step)
    eng.abort(rid)
    print(
        f"one 512-token prompt chunk (paged_prefill): wall {r['wall_ms']:.2f} ms; {r['launches']} kernels, "
        f"{r['device_ms']:.2f} ms on the device"
    )
    for k in r["kernels"][:top]:
        print(f"  {k['us']:>10.1f} µs {k['launches']:>6}  {k['kernel'][:90]}")
    run = _fill(eng, [rng.integers(0, vocab, prompt).tolist() for _ in range(distinct)], False, new_tokens)
    _copies(eng, run, most - distinct, new_tokens, rng)
    out = {"engine_prompt_chunk": out_chunk}
    for b in sorted(batches, reverse=True):
        for r in run["rids"][b:]:
            eng.abort(r)
        del run["rids"][b:]
        for _ in range(WARM):
            eng.step()
        r = out[f"engine_{b}"] = profile_call(lambda: [eng.step() for _ in range(steps)])
        r["steps"] = steps
        print(
            f"{b} sequences: wall {r['wall_ms'] / steps:.2f} ms a step; {r['launches'] / steps:.0f} kernels, "
            f"{r['device_ms'] / steps:.2f} ms on the device a step"
        )
        for k in r["kernels"][:top]:
            print(f"  {k['us'] / steps:>10.1f} µs {k['launches'] / steps:>6.1f}  {k['kernel'][:90]}")
        print(f"  GPU idle a step, by the kernel it follows ({r['span_ms'] - r['busy_ms']:.2f} ms in all):")
        for k in r["idle_after"]:
            print(f"  {k['us'] / steps:>10.1f} µs {k['gaps'] / steps:>6.1f}  {k['kernel'][:90]}")
    eng.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-artifact-profile")
    p.add_argument("artifact")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", default="cuda")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", default=None)
    p.add_argument("--engine", default=None, help="comma-separated numbers of running sequences")
    p.add_argument("--image", type=int, default=None, help="profile the vision tower on an image of this side (px)")
    p.add_argument("--no-lookahead", action="store_true", help="the Engine runs each step to its end")
    p.add_argument("--trace", action="store_true", help="time the Engine's host phases too (the json's timeline)")
    a = p.parse_args(argv)
    ckpt = Path(a.checkpoint) if a.checkpoint else None
    if a.trace:
        _traced()
    if a.image:
        res = run_image(Path(a.artifact), ckpt, a.image, a.device, a.top)
    elif a.engine:
        batches = [int(b) for b in a.engine.split(",")]
        res = run_engine(Path(a.artifact), ckpt, a.prompt, a.steps, a.device, a.top, batches, not a.no_lookahead)
    else:
        res = run(Path(a.artifact), ckpt, a.prompt, a.steps, a.device, a.top)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
