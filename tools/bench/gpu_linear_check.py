"""day0's linear kernel for few rows (lowering/kernels/linear_bf16.cu: out [M, N] = x [M, K] f32 ·
w [N, K] bf16ᵀ) on the GPU, launched as `matmul-to-cuda-linear` dispatches it (the cluster size of
kernel_geometry.linear_cluster), against a float64 reference, and its device time at the 4.9B
benchmark model's projections beside every other cluster size, cuBLAS's bf16 product of x rounded
to bf16 (one term: a third of the kernel's tensor-core work, less accurate) and the bytes' time.
GPU host with PyTorch:

    python -m day0.tools.bench.gpu_linear_check [PTX_DIR] [--json OUT] [--rows 64,16,4,1]

Checks: x with values over a wide range (the three terms must carry f32 accuracy: max error ÷
max |reference| below MAX_REL_ERR), rows 1, 3, 17, 33 and 64 (both of the kernel's modes, partial
n8 tiles), N and K that are not multiples of the kernel's tiles, and every cluster size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from day0.lowering import kernel_geometry as kg
from day0.tools.bench.gpu_kernel_times import Launch, Runner, _copies, _limit, _rel, _time

MAX_REL_ERR = 2e-6  # f32 accumulation over K of exact products
# (N, K) of the 4.9B e2e model's projections in a decode step (bench_checkpoint --config e2e)
SHAPES = {
    "q_a|kv_a|wk|w": (1488, 2048),
    "q_b": (3072, 768),
    "wq_b": (2048, 768),
    "o_proj": (2048, 2048),
    "router|shared gate": (1088, 2048),
    "shared up": (1024, 2048),
    "shared down": (2048, 1024),
    "dense gate": (18432, 2048),
    "dense down": (2048, 18432),
    "lm_head": (32000, 2048),
}
CHECKS = [(1, 2048, 2048), (3, 1488, 2048), (17, 200, 1000), (33, 1088, 768), (64, 100, 200), (64, 2048, 18432)]


def linear_launch(M: int, N: int, K: int, S: int | None = None) -> Launch:
    """The pass's launch over x [M, K], w [N, K] (S: another cluster size)."""
    S = kg.linear_cluster(M, N, K) if S is None else S
    return Launch(kg.LINEAR_BF16.ptx, kg.linear_entry(S), kg.linear_grid(N, S), ("x", "w", "out"), (M, N, K))


def _inputs(M: int, N: int, K: int, g, wide: bool = True):
    import torch

    x = torch.randn(M, K, device="cuda", generator=g)
    if wide:  # magnitudes over 2^-8 .. 2^8: every term matters somewhere
        x = x * torch.exp2(torch.randint(-8, 9, (M, K), device="cuda", generator=g).float())
    w = (torch.randn(N, K, device="cuda", generator=g) * K**-0.5).to(torch.bfloat16)
    return x, w


def check(run: Runner) -> list[dict]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(4)
    results = []
    for M, N, K in CHECKS:
        x, w = _inputs(M, N, K, g)
        ref = x.double() @ w.double().T
        for S in kg.LINEAR_CLUSTERS:
            out = torch.full((M, N), float("nan"), device="cuda")
            run(linear_launch(M, N, K, S), {"x": x, "w": w, "out": out})
            torch.cuda.synchronize()
            rel = _rel(out, ref)  # NaN if an element was not written
            res = {"piece": "linear_check", "M": M, "N": N, "K": K, "S": S, "rel_err": rel, "ok": rel < MAX_REL_ERR}
            results.append(res)
            print(json.dumps(res), flush=True)
    return results


def bench(run: Runner, rows: list[int]) -> list[dict]:
    import torch

    from day0.tools.bench.cuda_launch import graph_us

    g = torch.Generator(device="cuda").manual_seed(5)
    results = []
    for name, (N, K) in SHAPES.items():
        copies = _copies(N * K * 2, most=8)
        ws = [(torch.randn(N, K, device="cuda", generator=g) * K**-0.5).to(torch.bfloat16) for _ in range(copies)]
        for M in rows:
            x = torch.randn(M, K, device="cuda", generator=g)
            xb = x.to(torch.bfloat16)
            outs = [torch.empty(M, N, device="cuda") for _ in range(copies)]
            nbytes = N * K * 2 + M * K * 4 + M * N * 4
            chosen = kg.linear_cluster(M, N, K)
            row = {"piece": "linear", "kernel": name, "M": M, "N": N, "K": K, "S": chosen}
            for S in kg.LINEAR_CLUSTERS:
                launch = linear_launch(M, N, K, S)
                cold, hot = _time(run, lambda i, l=launch: [(l, {"x": x, "w": ws[i], "out": outs[i]})], copies)
                row[f"us_c{S}"] = round(cold, 2)
                row[f"hot_us_c{S}"] = round(hot, 2)
            row["us"] = row[f"us_c{chosen}"]
            rounds = copies * kg.cdiv(20, copies)
            row["cublas_bf16_us"] = round(
                graph_us([[lambda i=i: torch.matmul(xb, ws[i].T)] for i in range(copies)], rounds=rounds), 2
            )
            row.update(_limit(nbytes, row["us"]))
            results.append(row)
            print(json.dumps(row), flush=True)
        ws.clear()
        torch.cuda.empty_cache()
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-linear-check")
    p.add_argument("ptx_dir", nargs="?", default=str(Path(__file__).resolve().parents[2] / "lowering" / "kernels"))
    p.add_argument("--json", default=None)
    p.add_argument("--rows", default="64,16,4,1")
    a = p.parse_args(argv)
    import torch

    run = Runner(Path(a.ptx_dir))
    results = check(run) + bench(run, [int(r) for r in a.rows.split(",")])
    if a.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        Path(a.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    bad = [r for r in results if not r.get("ok", True)]
    print(f"{len(bad)} of {sum('ok' in r for r in results)} checks failed" if bad else "all checks passed")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
