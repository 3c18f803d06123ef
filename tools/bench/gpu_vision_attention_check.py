"""day0's vision attention kernel (lowering/kernels/vision_attention.cu: dense attention within
segments over q, k, v given as stacked bf16 terms) on the GPU, launched as
`vision-attention-to-cuda-kernel` dispatches it (kernel_geometry.vision_entry / vision_grid),
against a float64 reference, and its device time at the release tower's shapes (16 heads of 64;
P = 1,024 and 5,476 patches: a 448² and a 1024² image) beside PyTorch's SDPA on the same device.
GPU host with PyTorch:

    python -m day0.tools.bench.gpu_vision_attention_check [PTX_DIR] [--json OUT]

Checks: every entry (D 16, 32, 64, 128; one and two terms) on patch counts that are not
multiples of the CTA's 128 rows, with one segment, one image plus a padding segment, and three
images of odd sizes (runs that straddle the CTAs' rows and the key tiles). Error: max |error| ÷
max |reference| per check; two terms must carry ~16 significant bits (MAX_REL_ERR[2]), one term
is bf16 attention (q, k, v and P rounded to bf16, as FlashAttention's bf16 kernels).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from day0.lowering import kernel_geometry as kg
from day0.tools.bench.gpu_kernel_times import Launch, Runner

MAX_REL_ERR = {1: 2e-2, 2: 1e-4}
# (P, H, segment run lengths: their sum is P)
CHECKS = [(300, 2, (300,)), (300, 2, (250, 50)), (517, 3, (100, 260, 129, 28))]
RELEASE = {"H": 16, "D": 64}
BENCH_P = (1024, 5476)


def launch(P: int, H: int, D: int, terms: int, scale: float) -> Launch:
    return Launch(
        kg.VISION_ATTENTION.ptx,
        kg.vision_entry(D, terms),
        kg.vision_grid(P, H),
        ("q", "k", "v", "seg", "out"),
        (P, H, kg.f32_bits(scale)),
    )


def split_terms(x, terms: int):
    """[terms, *x.shape] bf16 with x ≈ Σ terms (each residual exact in f32)."""
    import torch

    out, r = [], x.float()
    for _ in range(terms):
        t = r.to(torch.bfloat16)
        out.append(t)
        r = r - t.float()
    return torch.stack(out).contiguous()


def segments(runs) -> list[int]:
    return [i for i, n in enumerate(runs) for _ in range(n)]


def reference(q, k, v, seg, scale: float):
    """float64 softmax(scale · q·kᵀ masked to equal segments) · v, [P, H, D]."""
    import torch

    same = seg[:, None] == seg[None, :]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for h in range(q.shape[1]):
        s = (q[:, h].double() @ k[:, h].double().T) * scale
        s = s.masked_fill(~same, float("-inf"))
        out[:, h] = torch.softmax(s, dim=-1) @ v[:, h].double()
    return out


def _inputs(P: int, H: int, D: int, runs, g):
    import torch

    q, k, v = (torch.randn(P, H, D, device="cuda", generator=g) for _ in range(3))
    seg = torch.tensor(segments(runs), dtype=torch.int64, device="cuda")
    return q, k, v, seg


def _run(run: Runner, q, k, v, seg, terms: int, scale: float):
    import torch

    P, H, D = q.shape
    t = {"q": split_terms(q, terms), "k": split_terms(k, terms), "v": split_terms(v, terms), "seg": seg}
    t["out"] = torch.full((P, H, D), float("nan"), device="cuda")
    run(launch(P, H, D, terms, scale), t)
    torch.cuda.synchronize()
    return t


def check(run: Runner) -> list[dict]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for D in kg.VISION_HEAD_DIMS:
        for P, H, runs in CHECKS:
            q, k, v, seg = _inputs(P, H, D, runs, g)
            scale = D**-0.5
            ref = reference(q, k, v, seg, scale)
            for terms in kg.VISION_TERMS:
                got = _run(run, q, k, v, seg, terms, scale)["out"]
                err = float((got.double() - ref).abs().max() / ref.abs().max())
                results.append(
                    {
                        "check": f"D{D} t{terms} P{P} H{H} runs{list(runs)}",
                        "rel_err": err,
                        "ok": err <= MAX_REL_ERR[terms],
                    }
                )
    return results


def bench(run: Runner) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from day0.tools.bench.cuda_launch import graph_us

    g = torch.Generator(device="cuda").manual_seed(1)
    H, D = RELEASE["H"], RELEASE["D"]
    results = []
    for P in BENCH_P:
        q, k, v, seg = _inputs(P, H, D, (P,), g)
        flops = 4 * P * P * D * H
        row = {"P": P, "H": H, "D": D, "gflop": round(flops / 1e9, 1)}
        for terms in kg.VISION_TERMS:
            t = _run(run, q, k, v, seg, terms, D**-0.5)
            row[f"day0_t{terms}_us"] = graph_us([lambda t=t, terms=terms: run(launch(P, H, D, terms, D**-0.5), t)])
        qb, kb, vb = (x.transpose(0, 1).unsqueeze(0).to(torch.bfloat16) for x in (q, k, v))  # [1, H, P, D]
        row["sdpa_bf16_us"] = graph_us([lambda: F.scaled_dot_product_attention(qb, kb, vb)])
        qf, kf, vf = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
        row["sdpa_f32_us"] = graph_us([lambda: F.scaled_dot_product_attention(qf, kf, vf)])
        for key in [k_ for k_ in row if k_.endswith("_us")]:
            row[key.replace("_us", "_tflops")] = round(flops / row[key] / 1e6, 1)
        results.append(row)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-vision-attention-check")
    p.add_argument("ptx_dir", nargs="?", default=str(Path(__file__).resolve().parents[2] / "lowering" / "kernels"))
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import torch

    run = Runner(Path(a.ptx_dir))
    checks = check(run)
    timings = bench(run)
    for r in checks:
        print(f"{'ok ' if r['ok'] else 'BAD'} {r['check']}: {r['rel_err']:.2e}")
    for r in timings:
        print(json.dumps(r))
    if a.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        Path(a.json).write_text(json.dumps({"meta": meta, "checks": checks, "timings": timings}, indent=2))
    return 0 if all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
