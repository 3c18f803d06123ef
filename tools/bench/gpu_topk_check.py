"""Correctness and speed of day0's CUDA radix-select top-k (the `topk-to-radix-select` pass) on a
GPU host, against PyTorch's torch.topk on the same GPU.

    python -m day0.tools.bench.gpu_topk_check build DIR            # compile machine: vmfbs per k
    python -m day0.tools.bench.gpu_topk_check run DIR --json F     # GPU host: numpy + iree runtime
    python -m day0.tools.bench.gpu_topk_check kernels PTX          # GPU host with torch: kernel times
    python -m day0.tools.bench.gpu_topk_check small PTX            # GPU host with torch: day0_topk_small

Each k gets `topk_k{k}.vmfb` with topk(x: [T, N] f32) -> (values [T, k], indices [T, k] i32);
`run` compares, case by case in child processes with a timeout, the selected set with the first
k of a stable descending sort (ties: lower position) and the values with x at the indices.
`kernels` launches the PTX's kernels through the CUDA driver on torch tensors (tools/bench/cuda_launch.py)
and times them inside a CUDA graph (device time, no launch gaps), beside torch.topk timed the same way.
`small` checks `day0_topk_small` output slot by slot (indices in position order, values, empty
slots) on rows of 1 to 4224 keys with ties, signed zeros, NaN and infinities, and times the
router shapes.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from day0.lowering import kernel_geometry as kg

KS = (8, 64, 2048)


def _torch_stub(k: int) -> str:
    return f"""
func.func @stub(%x: !torch.vtensor<[?,?],f32>) -> (!torch.vtensor<[?,{k}],f32>, !torch.vtensor<[?,{k}],si64>) {{
  %k = torch.constant.int {k}
  %d = torch.constant.int -1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %v, %i = torch.aten.topk %x, %k, %d, %true, %false : !torch.vtensor<[?,?],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,{k}],f32>, !torch.vtensor<[?,{k}],si64>
  return %v, %i : !torch.vtensor<[?,{k}],f32>, !torch.vtensor<[?,{k}],si64>
}}"""


def _entry_functions(k: int) -> str:
    """@topk (the multi-kernel form, any row length) and @topk_small (the one-kernel form, rows
    of at most TOPK_SMALL_ROW), both over [?, ?] rows."""
    from day0.passes.topk_to_radix_select import select_function_name, small_function_text

    out = small_function_text(k)
    for name, small in (("topk", False), ("topk_small", True)):
        out += f"""
  func.func @{name}(%x: tensor<?x?xf32>) -> (tensor<?x{k}xf32>, tensor<?x{k}xi32>) {{
    %v, %i = func.call @{select_function_name(k, small)}(%x) : (tensor<?x?xf32>) -> (tensor<?x{k}xf32>, tensor<?x{k}xi32>)
    return %v, %i : tensor<?x{k}xf32>, tensor<?x{k}xi32>
  }}"""
    return out


def build(out: Path, target: str = "cuda-sm90") -> None:
    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.passes.pipeline import run_pipeline

    out.mkdir(parents=True, exist_ok=True)
    for k in KS:
        with new_context():
            module = parse_module(_torch_stub(k))
            run_pipeline(module, "builtin.module(topk-to-radix-select)")
            text = str(module)
        body = text[text.index("{", text.index("module")) + 1 : text.rindex("}")]
        stub_end = body.index("hal.executable.source")
        # drop the torch stub; keep the executable and the select function, add the entry points
        body = body[stub_end:]
        text = text[: text.index("module")] + "module {\n  " + body + _entry_functions(k) + "\n}\n"
        compile_mlir(text, target, out / f"topk_k{k}.vmfb", repro_dir=out / f"repro_k{k}")


# ---------------------------------------------------------------------------------------------
# GPU host

INVISIBLE = -1.0e30


def _cases(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, int]]:
    f = np.float32
    c = {}
    c["small_k8"] = (rng.standard_normal((3, 100)).astype(f), 8)
    c["row_shorter_than_k"] = (rng.standard_normal((2, 5)).astype(f), 8)
    c["ties_k64"] = ((np.round(rng.standard_normal((4, 5000)) * 2) / 2).astype(f), 64)
    c["all_equal_k64"] = (np.full((2, 3000), 0.5, f), 64)
    special = rng.standard_normal((2, 1000)).astype(f)
    special[0, :10] = np.nan
    special[1, ::3] = -0.0
    special[1, 1::3] = 0.0
    c["nan_and_signed_zero_k64"] = (special, 64)
    for n in (32768, 131072, 1048576):
        c[f"decode_{n}_k2048"] = (rng.standard_normal((1, n)).astype(f), 2048)
    # causal prefill rows: row t sees positions <= t, the rest INVISIBLE, k columns of padding
    t, n = 300, 300 + 2048
    x = rng.standard_normal((t, n)).astype(f)
    x[np.arange(n)[None, :] > np.arange(t)[:, None]] = INVISIBLE
    c["causal_prefill_300_k2048"] = (x, 2048)
    x = rng.standard_normal((1, 1048576)).astype(f)
    x[0, 1000:] = INVISIBLE  # decode early in a long cache: candidates = the whole invisible tail
    c["mostly_invisible_1M_k2048"] = (x, 2048)
    return c


def _reference(x: np.ndarray, k: int) -> list[set]:
    """The first k of a stable descending sort (NaN largest, as torch ranks it), per row."""
    nan = np.isnan(x)
    neg = np.where(nan, 0.0, -x.astype(np.float64))  # -0.0 == 0.0: a tie, broken by position
    pos = np.arange(x.shape[1])
    return [set(np.lexsort((pos, neg[r], ~nan[r]))[:k].tolist()) for r in range(x.shape[0])]


def check_one(out: Path, name: str, device: str) -> dict:
    from day0.runtime.vm import VmModule

    x, k = _cases(np.random.default_rng(0))[name]
    mod = VmModule.load(out / f"topk_k{k}.vmfb", device=device)
    want = _reference(x, k)
    res = {"case": name, "rows": int(x.shape[0]), "n": int(x.shape[1]), "k": k}
    forms = ["topk"] + (["topk_small"] if kg.topk_is_small(x.shape[1]) else [])
    for form in forms:
        vals, idx = (a.to_host() for a in mod.function(form)(x))
        bad_rows = 0
        for r in range(x.shape[0]):
            got = idx[r]
            filled = got[got != 0x7FFFFFFF]
            ok = set(filled.tolist()) == want[r] and len(filled) == min(k, x.shape[1])
            if ok:
                ok = np.array_equal(vals[r][: len(filled)], x[r][filled], equal_nan=True)
            bad_rows += not ok
        res["bad_rows" if form == "topk" else "bad_rows_small"] = bad_rows
    return res


def kernel_times(ptx_path: Path, n: int, k: int, rows: int = 1, reps: int = 200) -> dict:
    """Each kernel launched directly through the CUDA driver (tools/bench/cuda_launch.py) on torch
    tensors and timed in a CUDA graph: the kernels' own device time, without IREE's per-call costs."""
    import torch

    from day0.tools.bench.cuda_launch import PtxModule, graph_us

    mod = PtxModule(ptx_path)
    segs = kg.topk_segments(n)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, n, device="cuda", generator=g)
    total = torch.zeros(rows, kg.TOPK_BINS, dtype=torch.int32, device="cuda")
    cum = torch.empty(rows, segs, kg.TOPK_BINS, dtype=torch.int32, device="cuda")
    hdr = torch.empty(rows, 4, dtype=torch.int32, device="cuda")
    oi = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    ov = torch.empty(rows, k, dtype=torch.float32, device="cuda")
    cand = torch.empty(rows, n, dtype=torch.int32, device="cuda")

    def launch(entry: str, args: list):  # at the pass's grid
        mod.launch(entry, kg.topk_grid(entry, rows, n), args)

    steps = {
        "zero_total": lambda: total.zero_(),
        "hist": lambda: launch("day0_topk_hist", [x, total, cum, n, segs]),
        "collect": lambda: launch("day0_topk_collect", [x, total, cum, hdr, oi, ov, cand, n, segs, k]),
        "finish": lambda: launch("day0_topk_finish", [x, hdr, cand, oi, ov, n, k]),
    }
    for f in steps.values():
        f()
    torch.cuda.synchronize()
    want = set(torch.topk(x[0], k).indices.tolist())
    ok = set(oi[0].tolist()) == want
    res = {"n": n, "k": k, "rows": rows, "segments": segs, "correct": ok, "candidates": int(hdr[0, 2])}
    replays = max(1, reps // 20)
    for name, f in steps.items():
        res[f"{name}_us"] = graph_us([f], replays=replays)
    res["all_us"] = graph_us(list(steps.values()), replays=replays)
    if kg.topk_is_small(n):  # the one-kernel form for short rows
        si, sv = torch.empty_like(oi), torch.empty_like(ov)
        run_small = lambda: launch("day0_topk_small", [x, si, sv, n, k])  # noqa: E731
        run_small()
        torch.cuda.synchronize()
        res["small_correct"] = set(si[0].tolist()) == want
        res["small_us"] = graph_us([run_small], replays=replays)
    res["torch_topk_us"] = graph_us([lambda: torch.topk(x, k, sorted=False)], replays=replays)
    return res


def run(out: Path, device: str, timeout: float) -> list[dict]:
    results = []
    names = list(_cases(np.random.default_rng(0)))
    jobs = [("_check", n) for n in names]
    for mode, name in jobs:
        cmd = [sys.executable, "-m", "day0.tools.bench.gpu_topk_check", mode, str(out), name, "--device", device]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None
            res = (
                json.loads(line)
                if line
                else {"case": name, "mode": mode, "error": "\n".join(p.stderr.strip().splitlines()[-5:])}
            )
        except subprocess.TimeoutExpired:
            res = {"case": name, "mode": mode, "error": f"timed out after {timeout} s"}
        print(json.dumps(res), flush=True)
        results.append(res)
    return results


def small_rows(ptx_path: Path) -> list[dict]:
    """day0_topk_small against the rule: the first k of a stable descending sort, written in
    position order, then (INT32_MAX, -inf) for the slots a row shorter than k leaves."""
    import torch

    from day0.tools.bench.cuda_launch import PtxModule, graph_us

    mod = PtxModule(ptx_path)
    rng = np.random.default_rng(0)
    f = np.float32
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 1.0, -1.0], f)
    cases = []
    for n in (1, 5, 8, 64, 100, 255, 256, 257, 300, 4224, 8193, 12000, 16384):
        for k in (1, 2, 8, 16, 64, 2048):
            if (k > 2 * n and k != 2048) or (n > 8192 and k < 64):
                continue
            x = rng.standard_normal((3, n)).astype(f)
            x[1] = np.round(x[1] * 2) / 2  # many ties
            x[2, : min(n, 8)] = special[: min(n, 8)]
            cases.append((n, k, x))
    out = []
    for n, k, x in cases:
        rows = x.shape[0]
        xt = torch.from_numpy(x).cuda()
        oi = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
        ov = torch.zeros(rows, k, dtype=torch.float32, device="cuda")
        mod.launch("day0_topk_small", kg.topk_grid("day0_topk_small", rows, n), [xt, oi, ov, n, k])
        torch.cuda.synchronize()
        gi, gv = oi.cpu().numpy(), ov.cpu().numpy()
        ok = True
        for r in range(rows):
            sel = np.array(sorted(_reference(x[r : r + 1], k)[0]), dtype=np.int64)
            want_i = np.concatenate([sel, np.full(k - len(sel), 2**31 - 1)]).astype(np.int32)
            want_v = np.concatenate([x[r][sel], np.full(k - len(sel), -np.inf, f)])
            ok &= bool(np.array_equal(gi[r], want_i) and np.array_equal(gv[r], want_v, equal_nan=True))
        out.append({"n": n, "k": k, "correct": ok})
    for rows, n, k in ((1, 64, 8), (1, 8, 4), (1, 256, 8), (1, 4224, 2048), (512, 64, 8)):
        xt = torch.randn(rows, n, device="cuda")
        oi = torch.empty(rows, k, dtype=torch.int32, device="cuda")
        ov = torch.empty(rows, k, dtype=torch.float32, device="cuda")
        grid = kg.topk_grid("day0_topk_small", rows, n)
        us = graph_us([lambda: mod.launch("day0_topk_small", grid, [xt, oi, ov, n, k])], replays=10)
        out.append({"rows": rows, "n": n, "k": k, "small_us": us})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-topk-check")
    p.add_argument("mode", choices=["build", "run", "kernels", "small", "_check"])
    p.add_argument("dir")
    p.add_argument("case", nargs="?")
    p.add_argument("--device", default="cuda")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    out = Path(a.dir)
    if a.mode == "build":
        build(out)
    elif a.mode == "kernels":  # DIR is the .ptx here
        shapes = [(1, n) for n in (6272, 10240, 16384, 32768, 131072, 1048576)] + [(64, 4096), (2048, 4096)]
        for rows, n in shapes:
            print(json.dumps(kernel_times(out, n, 2048, rows)), flush=True)
    elif a.mode == "small":  # DIR is the .ptx here
        for r in small_rows(out):
            print(json.dumps(r), flush=True)
    elif a.mode == "_check":
        print(json.dumps(check_one(out, a.case, a.device)))
    else:
        results = run(out, a.device, a.timeout)
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
