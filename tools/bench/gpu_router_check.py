"""day0::moe_route's CUDA kernel (lowering/kernels/moe_route.cu) against the op's PyTorch reference
(frontend/ops.py moe_route_reference, its top-k's made stable: ties to the lower index, the
kernel's rule, where torch.topk leaves them open) on the GPU, launched as the pass dispatches it
(gpu_kernel_times.moe_route_launch), for each router of gpu_kernel_times.ROUTERS at 1, 5 and 64
tokens: the same set of experts per token (the kernel writes them largest first, the reference in
any order), weights within 1e-6 relative, on random logits and on logits with ties (repeated
values inside and across groups, where the lower index must win), plus the kernel's device time
at 64 tokens. GPU host with PyTorch:
    python -m day0.tools.bench.gpu_router_check [PTX_DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from day0.tools.bench.gpu_kernel_times import ROUTERS, Runner, _time, moe_route_launch

MAX_REL_ERR = 1e-6


def _logits(S: int, E: int, ties: bool, g):
    import torch

    x = torch.randn(S, E, device="cuda", generator=g)
    if ties:  # few distinct values: many exact ties of scores and of group sums
        x = (x * 2).round() / 2
    return x


def _lower_index_topk(x, k: int, dim: int = -1, sorted: bool = True):
    """torch.topk with ties broken toward the lower index (a stable descending sort)."""
    import torch

    values, indices = torch.sort(x, dim=dim, descending=True, stable=True)
    return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


def reference(*args):
    """moe_route_reference with every top-k's ties to the lower index."""
    from unittest import mock

    import torch

    from day0.frontend.ops import moe_route_reference

    with mock.patch.object(torch.Tensor, "topk", _lower_index_topk):
        return moe_route_reference(*args)


def check_router(run: Runner, name: str, S: int, ties: bool) -> dict:
    import torch

    E, groups, topk_group, top_k, normalize, scaling = ROUTERS[name]
    g = torch.Generator(device="cuda").manual_seed(S * 7 + ties)
    logits = _logits(S, E, ties, g)
    bias = torch.zeros(E, device="cuda") if ties else torch.randn(E, device="cuda", generator=g) * 0.05
    t = {
        "logits": logits,
        "bias": bias,
        "weights": torch.empty(S, top_k, device="cuda"),
        "experts": torch.empty(S, top_k, dtype=torch.int64, device="cuda"),
    }
    launch = moe_route_launch(S, E, groups, topk_group, top_k, normalize, scaling)
    run(launch, t)
    torch.cuda.synchronize()
    ref_w, ref_e = reference(logits.cpu(), bias.cpu(), groups, topk_group, top_k, normalize, scaling)
    got_e, got_w = t["experts"].cpu(), t["weights"].cpu()
    order, ref_order = got_e.argsort(-1), ref_e.argsort(-1)
    same_set = bool((got_e.gather(1, order) == ref_e.gather(1, ref_order)).all())
    rel = float((got_w.gather(1, order) - ref_w.gather(1, ref_order)).abs().max() / ref_w.abs().max().clamp_min(1e-30))
    res = {
        "piece": "router",
        "kernel": name,
        "S": S,
        "ties": ties,
        "grid": list(launch.grid),
        "same_set": same_set,
        "rel_err": rel,
        "ok": same_set and rel <= MAX_REL_ERR,
    }
    if S == 64 and not ties:
        res["us"], res["hot_us"] = (round(v, 2) for v in _time(run, lambda i: [(launch, t)], 1))
    print(json.dumps(res), flush=True)
    return res


def check_routers(run: Runner) -> list[dict]:
    return [check_router(run, name, S, ties) for name in ROUTERS for S in (1, 5, 64) for ties in (False, True)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-router-check")
    p.add_argument("ptx_dir", nargs="?", default=str(Path(__file__).resolve().parents[2] / "lowering" / "kernels"))
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    results = check_routers(Runner(Path(a.ptx_dir)))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    bad = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(bad)} of {len(results)} router cases agree with the reference")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
