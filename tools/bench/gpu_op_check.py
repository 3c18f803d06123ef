"""Per-op check of a GPU target against the CPU: the building blocks of a day0 prefill/decode
step, each exported alone with a dynamic sequence length, run through each target's forms of
day0's passes (the CUDA kernels on the GPU), compiled for `llvm-cpu` and for the GPU target.

    python -m day0.tools.bench.gpu_op_check build DIR [--target cuda-sm90]   # here: vmfbs + CPU outputs
    python -m day0.tools.bench.gpu_op_check run DIR [--device cuda]          # GPU host: numpy + iree runtime

`run` executes each case in a child process with a timeout (a device fault must not hang the
whole check) and prints one line per case: max relative error against the CPU, or the failure.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

S = 12  # the sequence length the cases run at (exported dynamic)


def _pipeline(target: str) -> str:
    """The target's own lowering of the ops the cases hold (lowering/targets.py); the DSA cases
    select 8 slots, gathered in tiles of 4 on the CPU."""
    from day0.lowering.targets import DsaShape, get_target

    return get_target(target).pipeline(DsaShape(8, preferred_tile=4), roles=("topk", "mxfp4", "dsa"))


def _cases():
    import torch
    import torch.nn.functional as F

    import day0.frontend.ops  # noqa: F401
    from day0.models.dsa_indexer import INVISIBLE, select_topk

    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    T = 64

    def causal(x):
        vis = torch.arange(x.shape[1])[None, :] <= torch.arange(x.shape[0])[:, None]
        return x.masked_fill(~vis, INVISIBLE)

    idx = torch.stack([torch.randperm(S, generator=g)[:8] for _ in range(S)])
    idx[:4, 4:] = -1
    packed = torch.randint(0, 255, (4, 32, 32), dtype=torch.uint8, generator=g)
    scales = torch.randint(120, 130, (4, 32, 2), dtype=torch.uint8, generator=g)
    rows = {
        f"topk_random_T{n}": (lambda x: torch.topk(x, 8, sorted=False).indices, (r(S, n),), ({0: "s"},))
        for n in (16, 64, 512)
    }
    rows |= {f"topk_masked_T{n}": (lambda x: select_topk(causal(x), 8), (r(S, n),), ({0: "s"},)) for n in (16, 512)}
    return rows | {
        # name: (fn, args, dynamic dims per arg)
        "topk_masked": (lambda x: select_topk(causal(x), 8), (r(S, T),), ({0: "s"},)),
        "topk_padded": (
            lambda x: select_topk(F.pad(causal(x), (0, 8), value=INVISIBLE), 8),
            (r(S, S),),
            ({0: "s", 1: "s"},),
        ),
        "dsa_prefill": (
            lambda q, kv, i: torch.ops.day0.dsa_attention(q, kv, i, 0.25, 16),
            (r(S, 4, 24), r(T, 24), idx),
            ({0: "s"}, None, {0: "s"}),
        ),
        "index_copy": (
            lambda rows, cache, start: cache.index_copy(0, start + torch.arange(rows.shape[0]), rows) * 1.0,
            (r(S, 24), r(T, 24), torch.tensor([3])),
            ({0: "s"}, None, None),
        ),
        "indexer_scores": (
            lambda q, k: torch.einsum("shd,td->sht", q, k).relu().sum(1),
            (r(S, 16, 32), r(T, 32)),
            ({0: "s"}, None),
        ),
        "mxfp4_moe": (
            lambda x, e: torch.ops.day0.mxfp4_moe(x, packed, scales, e),
            (r(S, 64), torch.randint(0, 4, (S, 2), generator=g)),
            ({0: "s"}, {0: "s"}),
        ),
        "embedding_rope": (
            lambda ids, table: table.index_select(0, ids).cos(),
            (torch.randint(0, 100, (S,), generator=g), r(100, 8)),
            ({0: "s"}, None),
        ),
    }


def build(out: Path, target: str) -> None:
    import torch
    from torch_mlir import fx

    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.passes.pipeline import run_pipeline
    from day0.runtime.vm import VmModule

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, (fn, args, dims) in _cases().items():
        seq = torch.export.Dim("s", min=2, max=64)
        shapes = tuple(None if d is None else dict.fromkeys(d, seq) for d in dims)

        class M(torch.nn.Module):
            def forward(self, *a):
                return fn(*a)

        m = fx.export_and_import(M(), *args, output_type="raw", dynamic_shapes=(shapes,), func_name="main")
        text = str(m)
        for tgt, suffix in (("llvm-cpu", "cpu"), (target, "gpu")):
            with new_context():
                module = parse_module(text)
                run_pipeline(module, _pipeline(tgt))
                compile_mlir(str(module), tgt, out / f"{name}.{suffix}.vmfb")
        inputs = [a.numpy() for a in args]
        want = VmModule.load(out / f"{name}.cpu.vmfb").function("main")(*inputs).to_host()
        np.savez(out / f"{name}.npz", *inputs, expected=want)
        index[name] = len(inputs)
    (out / "cases.json").write_text(json.dumps(index))


def run_one(out: Path, name: str, device: str, save_dir: str | None = None) -> None:
    from day0.runtime.vm import VmModule

    data = np.load(out / f"{name}.npz")
    n = json.loads((out / "cases.json").read_text())[name]
    got = (
        VmModule.load(out / f"{name}.gpu.vmfb", device=device)
        .function("main")(*[data[f"arr_{i}"] for i in range(n)])
        .to_host()
    )
    want = data["expected"]
    if name.startswith("topk"):  # a selection is a set: the two targets order it differently
        got, want = np.sort(got, axis=-1), np.sort(want, axis=-1)
    err = float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))
    if err > 0 and save_dir is not None:  # keep the evidence of a mismatch
        np.savez(Path(save_dir) / f"{name}.mismatch.npz", got=got, expected=want)
    print(json.dumps({"case": name, "rel_err": err}))


def run(out: Path, device: str, timeout: float, save_dir: str | None = None) -> list[dict]:
    results = []
    for name in json.loads((out / "cases.json").read_text()):
        try:
            cmd = [sys.executable, "-m", "day0.tools.bench.gpu_op_check", "_one", str(out), name, "--device", device]
            if save_dir:
                cmd += ["--save", save_dir]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None
            res = json.loads(line) if line else {"case": name, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        except subprocess.TimeoutExpired:
            res = {"case": name, "error": f"timed out after {timeout} s"}
        print(json.dumps(res), flush=True)
        results.append(res)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-op-check")
    p.add_argument("mode", choices=["build", "run", "_one"])
    p.add_argument("dir")
    p.add_argument("case", nargs="?")
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--device", default="cuda")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--json", default=None)
    p.add_argument("--save", default=None, help="write got/expected of mismatching cases here")
    a = p.parse_args(argv)
    out = Path(a.dir)
    if a.mode == "build":
        build(out, a.target)
    elif a.mode == "_one":
        run_one(out, a.case, a.device, a.save)
    else:
        results = run(out, a.device, a.timeout, a.save)
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
