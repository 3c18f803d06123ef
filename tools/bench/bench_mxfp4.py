"""`python -m day0.tools.bench.bench_mxfp4`: the MXFP4 expert matmul on this CPU, side by side.

For each shape [N, K] (weight) and row count M:
  fused     day0: fuse-mxfp4-matmul's fused form (M static; the decode form at M = 1)
  unfused   day0: the prefill=unfused form (dequantize to f32 [N, K], then matmul), compiled
            with a dynamic M and called with M rows
  eager     PyTorch: the reference op day0::mxfp4_linear (dequantize + matmul every call)
  f32       PyTorch: x @ Wᵀ on weights dequantized ahead of time (4 bytes an element, against
            17/32 packed)
and the limit: packed bytes (N·K/2 + N·K/32) ÷ measured copy bandwidth (numpy copy of a 256 MiB
array, bytes read + written). Times are medians; IREE calls include reading the result back.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

import day0.frontend.ops  # noqa: F401  (registers torch.ops.day0.*)
from day0.frontend.ops import mxfp4_dequantize
from day0.tools.bench.timing import median_seconds


def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes per second, read + written, of a numpy copy of `mib` MiB."""
    src = np.ones(mib * 2**20, np.uint8)
    dst = np.empty_like(src)
    return 2 * src.nbytes / median_seconds(lambda: np.copyto(dst, src), repeats)


class _Linear(torch.nn.Module):
    def forward(self, x, packed, scales):
        return torch.ops.day0.mxfp4_linear(x, packed, scales)


def _compile(args, prefill: str, dynamic: bool, out: Path):
    from torch_mlir import fx

    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.passes.pipeline import run_pipeline
    from day0.runtime.vm import VmModule

    dyn = ({0: torch.export.Dim("rows", min=1, max=4096)}, None, None) if dynamic else None
    with new_context():
        m = parse_module(str(fx.export_and_import(_Linear(), *args, output_type="raw", dynamic_shapes=dyn)))
        run_pipeline(m, f"builtin.module(fuse-mxfp4-matmul{{prefill={prefill}}})")
        text = str(m)
    compile_mlir(text, "llvm-cpu", out)
    vm = VmModule.load(out)
    return vm, vm.function("main")


def bench_shape(N: int, K: int, M: int, repeats: int, work: Path, bandwidth: float) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g)
    packed = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 135, (N, K // 32), generator=g, dtype=torch.uint8)
    w = mxfp4_dequantize(packed, scales)
    want = (x @ w.T).numpy()
    row = {"N": N, "K": K, "M": M}
    example = (x if M != 1 else torch.randn(2, K), packed, scales)
    forms = {
        "fused": _compile((x, packed, scales), "fused", False, work / f"fused_{N}_{K}_{M}.vmfb"),
        "unfused": _compile(example, "unfused", True, work / f"unfused_{N}_{K}.vmfb"),
    }
    for name, (vm, fn) in forms.items():
        args = [vm.to_device(a.numpy()) for a in (x, packed, scales)]
        got = np.asarray(fn(*args).to_host())
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < 1e-5, (name, err)
        row[name] = median_seconds(lambda: fn(*args).to_host(), repeats)
    with torch.no_grad():
        row["eager"] = median_seconds(lambda: torch.ops.day0.mxfp4_linear(x, packed, scales), repeats)
        row["f32"] = median_seconds(lambda: x @ w.T, repeats)
    row["packed_bytes"] = packed.numel() + scales.numel()
    row["limit"] = row["packed_bytes"] / bandwidth
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m day0.tools.bench.bench_mxfp4", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="2048x4096,4096x2048", help="N x K weight shapes, comma separated")
    ap.add_argument("--rows", default="1,32", help="M values, comma separated")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", dest="json_out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    torch.set_num_threads(torch.get_num_threads())
    bandwidth = copy_bandwidth()
    rows = []
    with tempfile.TemporaryDirectory(prefix="day0-bench-mxfp4-") as tmp:
        for shape in args.shapes.split(","):
            N, K = (int(v) for v in shape.lower().split("x"))
            for M in (int(m) for m in args.rows.split(",")):
                rows.append(bench_shape(N, K, M, args.repeats, Path(tmp), bandwidth))

    print(f"copy bandwidth (read + write): {bandwidth / 1e9:.2f} GB/s; torch threads {torch.get_num_threads()}")
    head = (
        f"{'N x K':>11} {'M':>3} | {'fused':>9} {'unfused':>9} {'eager':>9} {'f32':>9} {'limit':>9} | "
        f"{'unf/fus':>7} {'eag/fus':>7} {'f32/fus':>7} {'fus/lim':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ms = lambda k: f"{r[k] * 1e3:8.3f}m"  # noqa: E731
        print(
            f"{r['N']:>5}x{r['K']:<5} {r['M']:>3} | {ms('fused')} {ms('unfused')} {ms('eager')} {ms('f32')} "
            f"{ms('limit')} | {r['unfused'] / r['fused']:7.2f} {r['eager'] / r['fused']:7.2f} "
            f"{r['f32'] / r['fused']:7.2f} {r['fused'] / r['limit']:7.2f}"
        )
    print("(times in ms, medians; ratios > 1 under x/fus mean the fused form is faster)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"bandwidth_Bps": bandwidth, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
