"""Device time of each of day0's hand-written CUDA kernels alone, at the benchmark shapes (those of
tools/bench/bench_gpu.py's `full` config), beside its bandwidth limit. GPU host with PyTorch:

    python -m day0.tools.bench.gpu_kernel_times [PTX_DIR] [--json OUT] [--pieces indexer,indexer_prefill,dsa,moe,moe_gemm,topk]

PTX_DIR holds the committed *.sm_90.ptx (default: this package's lowering/kernels/). Every
kernel is launched through the CUDA driver (tools/bench/cuda_launch.py) with exactly the grid, buffers
and push constants its pass dispatches: grids and entries come from lowering/kernel_geometry.py,
which the passes read too (tests/test_gpu_kernel_times.py checks the launches against the passes'
dispatch text and the PTX entries), inside a CUDA graph; a time is the median over graph replays
of µs per launch. Rounds rotate among copies of the inputs so that a
round's data is not still in the 50 MB L2 from the round before (as in a decode step, where
other layers run in between); `hot_us` is the same launch on one copy (L2-warm when it fits).

Pieces:
  indexer  day0::indexer_scores, S = 1, 32 heads × 128, bf16 keys, T = 32K / 128K / 1M: the exact
           f32-FMA kernel (`bf16`, the old one) and the tensor-core kernel (`bf16_mma`, the pass's
           default), the latter also over other grids; checks against a float64 torch reference
           (max error ÷ max |score|, vs exact q and vs q rounded to bf16, the kernel's former
           single-term form) and
           whether torch.topk(2048) of the scores selects the same set as of the reference
           (else how many keys swapped, and whether all swaps lie within the error of the
           2048th score). Plus correctness cases for prefill and odd shapes.
  dsa      day0::dsa_attention's partial + combine kernels: 64 heads, latent 512, 2048 selected
           rows of a bf16 cache of T rows (bf16 q, f32 out): the pass's tensor-core kernels, the
           same at other split sizes and the f32-arithmetic kernels (`fma`, the old ones); plus
           correctness cases (prefill, odd shapes, empty slots) against a float64 reference;
           and the 4.9B e2e model's prefill chunk (16 heads, 512 queries, T = 4224), in TFLOP/s.
  moe      day0::mxfp4_moe's matvec: 8 of 288 experts, hidden 4096, intermediate 2048: gate_up
           (packed [288, 4096, 2048]) and down (packed [288, 4096, 1024]).
  moe_gemm day0::mxfp4_moe in prefill: the grouped tensor-core GEMM (the pass's kernel unless T = 1)
           beside the matvec on the same input, at the 4.9B benchmark model's experts in one
           static prefill chunk: 64 experts, top-8 of T = 512 tokens, hidden 2048, intermediate
           1024: gate_up (x [512, 2048], experts [512, 8], N = 2048) and down (the model's call:
           x [4096, 1024], experts [4096, 1], N = 2048). Expert choices: random top-8 per token,
           skewed (half the rows on one expert), and T = 3 with invalid ids (-1, E: zero rows);
           each checked against a float64 reference (max error ÷ max |reference| < 1e-5).
           The same experts in a batched decode step of 16 and 64 sequences (gate_up: T = 16 | 64,
           k = 8; down: T·k rows, k = 1): the pass's few-rows GEMM beside the 64-row GEMM and
           the matvec.
  topk     the radix top-k (k = 2048) over rows of T (tools/bench/gpu_topk_check.py's kernel timing).
The router kernel (day0::moe_route, ROUTERS' shapes) has its own check: tools/bench/gpu_router_check.py.
Limit: the bytes a launch must move (reads + writes) ÷ 4248 GB/s.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from day0.lowering import kernel_geometry as kg

BANDWIDTH_GBS = 4248.0
CONTEXTS = (32768, 131072, 1048576)
COLD_BYTES = 128 << 20  # rotate input copies until the rounds' data exceeds this (L2: 50 MB)
INDEXER = {"H": 32, "D": 128, "scale": 1.0, "top_k": 2048}  # bench_gpu's dsa_index (scale 1.0)
DSA = {"H": 64, "D": 512, "V": 512, "K": 2048}  # scale latent**-0.5
MOE = {"E": 288, "k": 8, "hidden": 4096, "intermediate": 2048}
PREFILL_MOE = {"E": 64, "k": 8, "T": 512, "hidden": 2048, "intermediate": 1024}
SWIGLU_LIMIT = 7.0  # the `moe` piece's mxfp4_moe_swiglu clamp (GLM-5's swiglu_limit; inf: DeepSeek's)
MOE_SWIGLU_MAX_REL_ERR = 1e-5  # f32 sums of exact weights; silu's expf against float64
MOE_GEMM_MAX_REL_ERR = 1e-5  # x enters as two bf16 terms (16 significant bits), f32 sums


@dataclass(frozen=True)
class Launch:
    """One kernel launch as a pass dispatches it: buffers (names, in binding order) then i32 push
    constants; grid (x, y, z); block kg.THREADS."""

    ptx: str
    entry: str
    grid: kg.Grid
    buffers: tuple[str, ...]
    constants: tuple[int, ...]
    block: int = kg.THREADS


def indexer_launch(kernel: str, S: int, H: int, D: int, T: int, scale: float, grid_x: int | None = None) -> Launch:
    """kernel: f32 | bf16 (exact FMAs) | bf16_mma (tensor cores). grid_x: another grid (the
    tensor-core kernel takes any; the pass's by default)."""
    grid = kg.indexer_grid(kernel, S, T, H)
    if grid_x is not None:
        grid = (grid_x, *grid[1:])
    return Launch(
        kg.INDEXER_SCORES.ptx,
        kg.indexer_entry(kernel),
        grid,
        ("q", "keys", "w", "out"),
        (H, D, T, kg.f32_bits(scale), S),
    )


def dsa_launches(
    dt: str,
    S: int,
    H: int,
    D: int,
    T: int,
    K: int,
    V: int,
    scale: float,
    rows: int | None = None,
    fma: bool = False,
    split: bool = True,
) -> tuple[Launch, Launch]:
    """The pass's two launches; rows: another split size for the tensor-core kernels; fma: the
    f32-arithmetic kernels even where the pass takes the tensor-core ones; split=False: the general
    tensor-core partial where the pass (split-scores=true) takes the `_vp` entry for these heads."""
    mma = None if fma else (rows or kg.dsa_mma_rows(dt, S, D, V))
    partial_entry, combine_entry = kg.dsa_entries(dt, mma, kg.dsa_mma_vparts(H) if split else 1)
    partial_grid, combine_grid = kg.dsa_grids(S, H, K, V, mma)
    constants = (H, D, K, V, T, kg.f32_bits(scale)) + (() if mma is None else (mma,))
    partial = Launch(kg.DSA_ATTENTION.ptx, partial_entry, partial_grid, ("q", "kv", "idx", "ml", "acc"), constants)
    combine = Launch(kg.DSA_ATTENTION.ptx, combine_entry, combine_grid, ("ml", "acc", "out"), (H, V, partial_grid[0]))
    return partial, combine


def mxfp4_launch(T: int, k: int, E: int, N: int, K: int, limit: float | None = None) -> Launch:
    """mxfp4_moe over x [T, K], packed [E, N, K/2], experts [T, k] -> out [T·k, N]; limit (the
    mxfp4_moe_swiglu entry, inf: no clamp): x is gate_up [T, 2K], staged through the SwiGLU."""
    return Launch(
        kg.MXFP4_MATVEC.ptx,
        "day0_mxfp4_matvec" if limit is None else "day0_mxfp4_matvec_swiglu",
        kg.mxfp4_matvec_grid(T * k, N),
        ("x", "packed", "scales", "experts", "out"),
        (K, N, k, E) + (() if limit is None else (kg.f32_bits(limit),)),
    )


def mxfp4_gemm_launch(T: int, k: int, E: int, N: int, K: int, kernel: str = "gemm") -> Launch:
    """A grouped GEMM, same buffers; rows T·k. kernel: "gemm" (64 rows at a time, prefill) or
    "few" (16 at a time, a batched decode step)."""
    return Launch(
        kg.MXFP4_MOE_GEMM.ptx,
        {"gemm": "day0_mxfp4_moe_gemm", "few": "day0_mxfp4_moe_gemm_few"}[kernel],
        kg.mxfp4_gemm_grid(E, N),
        ("x", "packed", "scales", "experts", "out"),
        (K, N, k, E, T * k),
    )


def moe_route_launch(
    S: int, E: int, groups: int, topk_group: int, top_k: int, normalize: bool, scaling: float
) -> Launch:
    """moe_route over logits [S, E], bias [E] -> weights [S, top_k], experts [S, top_k] (i64)."""
    return Launch(
        kg.MOE_ROUTE.ptx,
        kg.MOE_ROUTE.entries[0].name,
        kg.moe_route_grid(S),
        ("logits", "bias", "weights", "experts"),
        (S, E, groups, topk_group, top_k, int(normalize), kg.f32_bits(scaling)),
    )


# (E, groups, topk_group, top_k, normalize, scaling) of the routers tools/bench/gpu_router_check.py checks: the
# 4.9B benchmark model (transformers' default 8 groups, best 4), DeepSeek-V3.2's 256 experts, the
# tiny parity config, one group (a plain top-k, Kimi-Linear's 384 experts), the kernel's limits
ROUTERS = {
    "bench": (64, 8, 4, 8, True, 2.5),
    "deepseek": (256, 8, 4, 8, True, 2.5),
    "tiny": (8, 4, 2, 3, True, 1.0),
    "one_group": (384, 1, 1, 8, False, 2.446),
    "limits": (1024, 32, 32, 32, True, 1.0),
}


def all_launches() -> dict[str, Launch]:
    """Every launch the benchmark makes at the pass's geometry (what the CPU test checks)."""
    out = {}
    H, D, sc = INDEXER["H"], INDEXER["D"], INDEXER["scale"]
    for T in CONTEXTS:
        for kernel in ("bf16", "bf16_mma"):
            out[f"indexer_{kernel}_T{T}"] = indexer_launch(kernel, 1, H, D, T, sc)
        p, c = dsa_launches("bf16", 1, DSA["H"], DSA["D"], T, DSA["K"], DSA["V"], DSA["D"] ** -0.5)
        out[f"dsa_partial_T{T}"], out[f"dsa_combine_T{T}"] = p, c
    E, k, hid, inter = MOE["E"], MOE["k"], MOE["hidden"], MOE["intermediate"]
    out["moe_gate_up"] = mxfp4_launch(1, k, E, 2 * inter, hid)
    out["moe_down"] = mxfp4_launch(k, 1, E, hid, inter)
    out["moe_down_swiglu"] = mxfp4_launch(k, 1, E, hid, inter, SWIGLU_LIMIT)
    for name, (T, k, N, K) in {**moe_gemm_shapes(), **moe_batch_shapes()}.items():
        kernel = kg.mxfp4_kernel(True, T, k, PREFILL_MOE["E"])
        out[f"moe_gemm_{name}"] = mxfp4_gemm_launch(T, k, PREFILL_MOE["E"], N, K, kernel)
    for name, router in ROUTERS.items():
        out[f"moe_route_{name}"] = moe_route_launch(64, *router)
    return out


def moe_gemm_shapes() -> dict[str, tuple[int, int, int, int]]:
    """(T, k, N, K) of the prefill chunk's two mxfp4_moe calls (models/moe.py's mxfp4_routed: down
    takes each (token, slot) row as a token of its own, k = 1)."""
    c = PREFILL_MOE
    return {
        "gate_up": (c["T"], c["k"], 2 * c["intermediate"], c["hidden"]),
        "down": (c["T"] * c["k"], 1, c["hidden"], c["intermediate"]),
    }


def moe_batch_shapes() -> dict[str, tuple[int, int, int, int]]:
    """(T, k, N, K) of the two mxfp4_moe calls of a batched decode step of the same model (static T:
    the engine's compiled batch sizes 16 and 64)."""
    c = PREFILL_MOE
    out = {}
    for B in (16, 64):
        out[f"gate_up_b{B}"] = (B, c["k"], 2 * c["intermediate"], c["hidden"])
        out[f"down_b{B}"] = (B * c["k"], 1, c["hidden"], c["intermediate"])
    return out


# ---------------------------------------------------------------------------------------------
# GPU host


class Runner:
    def __init__(self, ptx_dir: Path):
        from day0.tools.bench.cuda_launch import PtxModule

        self.ptx_dir = ptx_dir
        self._mods: dict[str, PtxModule] = {}
        self._cls = PtxModule

    def __call__(self, launch: Launch, tensors: dict) -> None:
        if launch.ptx not in self._mods:
            self._mods[launch.ptx] = self._cls(self.ptx_dir / launch.ptx)
        args = [tensors[b] for b in launch.buffers] + list(launch.constants)
        self._mods[launch.ptx].launch(launch.entry, launch.grid, args, block=launch.block)


def _copies(nbytes: int, most: int = 16) -> int:
    return max(1, min(most, math.ceil(COLD_BYTES / max(nbytes, 1))))


def _time(run: Runner, launches_of_copy, copies: int) -> tuple[float, float]:
    """(cold µs, hot µs) of one round: launches_of_copy(i) -> [(launch, tensors), ...]."""
    from day0.tools.bench.cuda_launch import graph_us

    def fns(i):
        return [lambda l=l, t=t: run(l, t) for l, t in launches_of_copy(i)]

    rounds = copies * kg.cdiv(20, copies)
    cold = graph_us([fns(i) for i in range(copies)], rounds=rounds)
    hot = graph_us(fns(0), rounds=20)
    return cold, hot


def _limit(nbytes: int, us: float) -> dict:
    limit = nbytes / (BANDWIDTH_GBS * 1e3)  # µs
    return {"bytes": nbytes, "limit_us": round(limit, 2), "limit_over_time": round(limit / us, 3)}


def indexer_reference(q, keys, w, scale: float, round_q: bool = False):
    """float64 Σ_h w · relu(scale · q_h · k_t) [S, T]; round_q: q·scale rounded to bf16 first (what
    the tensor-core kernel multiplied before it took q as two bf16 terms)."""
    import torch

    qs = q.double() * scale
    if round_q:
        qs = (q * scale).to(torch.bfloat16).double()
    kd = keys.double()
    out = torch.empty(q.shape[0], keys.shape[0], dtype=torch.float64, device=q.device)
    for s in range(q.shape[0]):
        out[s] = (torch.relu(qs[s] @ kd.T) * w[s].double()[:, None]).sum(0)
    return out


def _rel(got, ref) -> float:
    return float((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def topk_agreement(got, ref, k: int) -> dict:
    """Selections of torch.topk(k) of got and of ref (one row): same set? else the swaps, and
    whether every swapped key's reference score lies within 2·max|error| of the k-th largest."""
    import torch

    sel = torch.topk(got.double(), k).indices
    want = torch.topk(ref, k).indices
    inn = sel[~torch.isin(sel, want)]  # selected, not in the reference's set
    out = want[~torch.isin(want, sel)]
    res = {"same_set": inn.numel() == 0, "swapped": int(inn.numel())}
    if inn.numel():
        kth = torch.topk(ref, k).values[-1]
        tol = 2 * (got.double() - ref).abs().max()
        res["swaps_within_error_of_kth"] = bool((ref[inn] >= kth - tol).all() and (ref[out] <= kth + tol).all())
    return res


def bench_indexer(run: Runner, T: int) -> list[dict]:
    import torch

    H, D, scale, k = INDEXER["H"], INDEXER["D"], INDEXER["scale"], INDEXER["top_k"]
    g = torch.Generator(device="cuda").manual_seed(T)
    q = torch.randn(1, H, D, device="cuda", generator=g)
    w = torch.rand(1, H, device="cuda", generator=g)
    copies = _copies(T * D * 2)
    sets = [
        {
            "q": q,
            "w": w,
            "keys": torch.randn(T, D, device="cuda", generator=g).to(torch.bfloat16),
            "out": torch.empty(1, T, device="cuda"),
        }
        for _ in range(copies)
    ]
    nbytes = T * D * 2 + T * 4 + H * D * 4 + H * 4
    ref = indexer_reference(q, sets[0]["keys"], w, scale)
    ref_bq = indexer_reference(q, sets[0]["keys"], w, scale, round_q=True)
    results = []
    for kernel in ("bf16", "bf16_mma"):
        grids = [None]
        if kernel == "bf16_mma":  # the pass's grid, then others
            grids += sorted({kg.cdiv(T, kg.INDEXER_KEYS_PER_CTA), 132, 264, 528, 1056} - {kg.indexer_grid_x(kernel, T)})
        for gx in grids:
            launch = indexer_launch(kernel, 1, H, D, T, scale, gx)
            sets[0]["out"].fill_(float("nan"))
            run(launch, sets[0])
            torch.cuda.synchronize()
            out = sets[0]["out"]
            cold, hot = _time(run, lambda i: [(launch, sets[i])], copies)
            res = {
                "piece": "indexer",
                "kernel": launch.entry,
                "T": T,
                "grid": list(launch.grid),
                "pass_grid": gx is None,
                "us": round(cold, 2),
                "hot_us": round(hot, 2),
                **_limit(nbytes, cold),
                "rel_err": _rel(out[0], ref[0]),
                "rel_err_vs_bf16_q": _rel(out[0], ref_bq[0]),
            }
            if gx is None:
                res["topk"] = topk_agreement(out[0], ref[0], k)
            results.append(res)
            print(json.dumps(res), flush=True)
    return results


def _indexer_inputs(S: int, H: int, D: int, T: int, g) -> dict:
    """Random q [S, H, D], w [S, H], bf16 keys [T, D] and a NaN-filled out [S, T] on the GPU."""
    import torch

    return {
        "q": torch.randn(S, H, D, device="cuda", generator=g),
        "w": torch.rand(S, H, device="cuda", generator=g),
        "keys": torch.randn(T, D, device="cuda", generator=g).to(torch.bfloat16),
        "out": torch.full((S, T), float("nan"), device="cuda"),
    }


def bench_indexer_prefill(run: Runner, T: int) -> dict:
    """The tensor-core kernel on a prefill chunk of the 4.9B benchmark model (512 queries of 16
    heads × 128, bf16 keys) over T keys: µs, TFLOP/s of the scores (2·S·H·D·T, one term), and
    the first 8 queries against the exact-q reference."""
    import torch

    S, H, D = 512, 16, 128
    t = _indexer_inputs(S, H, D, T, torch.Generator(device="cuda").manual_seed(T))
    scale = D**-0.5
    launch = indexer_launch("bf16_mma", S, H, D, T, scale)
    run(launch, t)
    torch.cuda.synchronize()
    ref = indexer_reference(t["q"][:8], t["keys"], t["w"][:8], scale)
    cold, hot = _time(run, lambda i: [(launch, t)], 1)
    # the causal form on the same shapes: keys through the rows of a pool of 64-row blocks, the
    # chunk the last S slots before 64 padding ones
    c = _causal_inputs(S, H, D, T + 64, T + 4096, 64, torch.Generator(device="cuda").manual_seed(T))
    causal = causal_launch("bf16_mma", S, H, D, T + 64, scale)
    causal_us, _ = _time(run, lambda i: [(causal, c)], 1)
    res = {
        "piece": "indexer_prefill",
        "kernel": f"{launch.entry} S={S} H={H}",
        "S": S,
        "H": H,
        "T": T,
        "grid": list(launch.grid),
        "us": round(cold, 1),
        "tflops": round(2 * S * H * D * T / cold / 1e6, 1),
        "rel_err": _rel(t["out"][:8], ref),
        "ok": _rel(t["out"][:8], ref) < 1e-4,
        "causal_us": round(causal_us, 1),
    }
    print(json.dumps(res), flush=True)
    return res


def check_indexer_shapes(run: Runner) -> list[dict]:
    """The tensor-core kernel on prefill and odd shapes (H > 32, H and D not multiples of 8, T not
    a multiple of 16, one CTA for all keys) against the bf16-q reference (f32 accumulation: ~1e-6)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    cases = [
        (3, 32, 128, 5000, None),
        (2, 64, 128, 4099, None),
        (2, 40, 100, 777, None),
        (1, 8, 64, 33, None),
        (1, 32, 128, 100_000, 1),
        (4, 61, 120, 3000, 2),
        (1, 1, 1, 17, None),
        (13, 16, 128, 2500, None),  # a prefill chunk's form: 4 queries a CTA, the last CTA with 1
        (7, 24, 128, 1000, None),  # 2 queries a CTA (3 head tiles each), the last with 1
    ]
    results = []
    for S, H, D, T, gx in cases:
        t = _indexer_inputs(S, H, D, T, g)
        scale = D**-0.5
        res = {"piece": "indexer_check", "S": S, "H": H, "D": D, "T": T, "grid_x": gx}
        for kernel in ("bf16_mma", "bf16"):
            t["out"].fill_(float("nan"))
            run(indexer_launch(kernel, S, H, D, T, scale, gx if kernel == "bf16_mma" else None), t)
            torch.cuda.synchronize()
            ref = indexer_reference(t["q"], t["keys"], t["w"], scale)  # both against the exact q
            res[f"{kernel}_rel_err"] = _rel(t["out"], ref)  # NaN if a score was not written
        res["ok"] = res["bf16_mma_rel_err"] < 1e-4 and res["bf16_rel_err"] < 1e-4
        results.append(res)
        print(json.dumps(res), flush=True)
    return results


def check_indexer_rows(run: Runner) -> list[dict]:
    """The rows form (a paged decode step: each query's keys through its rows of a pool) with empty
    slots: a negative row scores EMPTY_SCORE and reads no key, a tile of 16 empty slots skips its
    products. Rows: each query's visible prefix (a causal tail of -1 of its own length, k padding
    columns of -1 after it), some -1 scattered inside."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(2)
    results = []
    for S, H, D, R, T in ((3, 64, 128, 9000, 6144), (2, 32, 128, 700, 530), (4, 40, 100, 300, 77)):
        keys = torch.randn(R, D, device="cuda", generator=g).to(torch.bfloat16)
        rows = torch.randint(0, R, (S, T), device="cuda", generator=g, dtype=torch.int64)
        visible = torch.tensor([T // 3, T - 17, 5, T][:S], device="cuda")
        rows[torch.arange(T, device="cuda")[None, :] >= visible[:, None]] = -1
        rows[:, 1::7] = -1
        t = {
            "q": torch.randn(S, H, D, device="cuda", generator=g),
            "w": torch.rand(S, H, device="cuda", generator=g),
            "keys": keys,
            "rows": rows,
            "out": torch.full((S, T), float("nan"), device="cuda"),
        }
        scale = D**-0.5
        ref = torch.stack(
            [
                indexer_reference(t["q"][s : s + 1], keys[rows[s].clamp(min=0)], t["w"][s : s + 1], scale)[0]
                for s in range(S)
            ]
        )
        res = {"piece": "indexer_rows_check", "S": S, "H": H, "D": D, "T": T}
        launches = {
            kernel: Launch(
                kg.INDEXER_SCORES.ptx,
                kg.indexer_entry(kernel),
                kg.indexer_grid(kernel, S, T, H),
                ("q", "keys", "rows", "w", "out"),
                (H, D, T, kg.f32_bits(scale)),
            )
            for kernel in ("rows_bf16_mma", "rows_bf16")
        }
        _check_masked(run, launches, t, ref, rows < 0, res)
        results.append(res)
        print(json.dumps(res), flush=True)
    return results


def _check_masked(run: Runner, launches: dict, t: dict, ref, empty, res: dict) -> None:
    """Each of `launches` (name -> Launch) on the tensors t against the float64 scores ref: into
    res, <name>_empty_ok (EMPTY_SCORE exactly where `empty`) and <name>_rel_err (the others), and
    ok (all empty right, all within 1e-4)."""
    import torch

    from day0.frontend.ops import EMPTY_SCORE

    for name, launch in launches.items():
        t["out"].fill_(float("nan"))
        run(launch, t)
        torch.cuda.synchronize()
        out = t["out"]
        res[f"{name}_empty_ok"] = bool((out[empty] == EMPTY_SCORE).all())
        res[f"{name}_rel_err"] = _rel(out[~empty], ref[~empty])
    res["ok"] = all(res[f"{k}_empty_ok"] and res[f"{k}_rel_err"] < 1e-4 for k in launches)


def causal_launch(kernel: str, S: int, H: int, D: int, T: int, scale: float) -> Launch:
    """The causal form (causal_<kernel>): slot t reads row rows[t] of a pool, empty past last[s]."""
    return Launch(
        kg.INDEXER_SCORES.ptx,
        kg.indexer_entry(f"causal_{kernel}"),
        kg.indexer_grid(f"causal_{kernel}", S, T, H),
        ("q", "keys", "rows", "last", "w", "out"),
        (H, D, T, kg.f32_bits(scale), S),
    )


def _causal_inputs(S: int, H: int, D: int, T: int, R: int, block: int, g) -> dict:
    """A prompt chunk of S queries ending at slot T - 1 - pad over a key range of T slots (the last
    `pad` = min(T // 4, 64) of them top-k padding, row -1) in blocks of `block` rows scattered over a
    pool of R rows, one block hidden (row -1, an evicted block); the chunk's last rows pad
    queries past the prompt's end (last = the end)."""
    import torch

    pad = min(T // 4, 64)
    L = T - pad
    blocks = torch.randperm(R // block, device="cuda", generator=g)[: -(-L // block)]
    rows = (blocks[:, None] * block + torch.arange(block, device="cuda")).reshape(-1)[:L]
    rows = torch.cat([rows, torch.full((pad,), -1, device="cuda", dtype=torch.int64)])
    if 2 * block < L:
        rows[block : 2 * block] = -1  # an evicted block
    last = (L - S + torch.arange(S, device="cuda")).clamp(min=0, max=L - 1)
    last[-2:] = L - 1  # padding queries
    return {
        "q": torch.randn(S, H, D, device="cuda", generator=g),
        "w": torch.rand(S, H, device="cuda", generator=g),
        "keys": torch.randn(R, D, device="cuda", generator=g).to(torch.bfloat16),
        "rows": rows,
        "last": last,
        "out": torch.full((S, T), float("nan"), device="cuda"),
    }


def check_indexer_causal(run: Runner) -> list[dict]:
    """The causal form (a prompt chunk over its sequence's key range, read in place through the
    slots' rows) against float64: slots past a query's last one, hidden rows and padding score
    EMPTY_SCORE exactly, the others within 1e-4; odd shapes (S not a multiple of the queries a
    CTA takes, H > 32, D not a multiple of 32, T not a multiple of 16)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(3)
    results = []
    for S, H, D, T, R in ((512, 16, 128, 4160, 8192), (13, 16, 64, 300, 1024), (7, 40, 72, 1001, 2048)):
        t = _causal_inputs(S, H, D, T, R, 64 if T > 1000 else 16, g)
        scale = D**-0.5
        rows, last = t["rows"], t["last"]
        ref = indexer_reference(t["q"], t["keys"][rows.clamp(min=0)], t["w"], scale)
        empty = (rows[None, :] < 0) | (torch.arange(T, device="cuda")[None, :] > last[:, None])
        res = {"piece": "indexer_causal_check", "S": S, "H": H, "D": D, "T": T}
        launches = {kernel: causal_launch(kernel, S, H, D, T, scale) for kernel in ("bf16_mma", "bf16")}
        _check_masked(run, launches, t, ref, empty, res)
        results.append(res)
        print(json.dumps(res), flush=True)
    return results


def dsa_reference(q, kv, idx, scale: float, V: int):
    """float64 reference of day0::dsa_attention [S, H, V]; slots outside [0, T) are empty (as the
    kernels); a query with no valid slot gets zeros."""
    import torch

    T = kv.shape[0]
    valid = (idx >= 0) & (idx < T)
    rows = kv[idx.clamp(0, T - 1)].double()  # [S, K, D]
    scores = torch.einsum("shd,skd->shk", q.double(), rows) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(scores, -1).nan_to_num(0.0)
    return torch.einsum("shk,skv->shv", p, rows[..., :V])


def _dsa_run(run: Runner, launches, t: dict):
    import torch

    t["out"].fill_(float("nan"))
    for l in launches:
        run(l, t)
    torch.cuda.synchronize()
    return t["out"]


def _dsa_tensors(S, H, D, T, K, V, dtype, g, empty=0.0, max_splits=None):
    """Inputs (random rows; a fraction `empty` of the slots -1 or >= T), partial buffers and the
    output (f32 for either input dtype)."""
    import torch

    bf = dtype
    idx = (
        torch.stack([torch.randperm(T, device="cuda", generator=g)[:K] for _ in range(S)])
        if K <= T
        else torch.randint(0, T, (S, K), device="cuda", generator=g)
    )
    if empty:
        drop = torch.rand(S, K, device="cuda", generator=g) < empty
        idx = torch.where(drop, torch.where(torch.rand(S, K, device="cuda", generator=g) < 0.5, -1, T + 3), idx)
    splits = max_splits or K
    return {
        "q": torch.randn(S, H, D, device="cuda", generator=g).to(bf),
        "kv": torch.randn(T, D, device="cuda", generator=g).to(bf),
        "idx": idx,
        "ml": torch.empty(S, splits, H, 2, device="cuda"),
        "acc": torch.empty(S, splits, H, V, device="cuda"),
        "out": torch.empty(S, H, V, device="cuda", dtype=torch.float32),
    }


def check_dsa_shapes(run: Runner) -> list[dict]:
    """Both bf16 kernel sets at the pass's geometry (and the tensor-core one at other split sizes)
    on decode, prefill and odd shapes, with empty slots (-1 and >= T), a query with every slot
    empty, H > 64, D % 16 == 8; against the float64 reference (max error ÷ max |reference|)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(7)
    # S, H, D, T, K, V, fraction of empty slots
    cases = [
        (1, 64, 576, 5000, 2048, 512, 0.0),
        (1, 64, 512, 4096, 2048, 512, 0.3),
        (1, 64, 576, 3000, 2048, 512, 0.97),
        (3, 64, 576, 2000, 300, 512, 0.2),
        (2, 128, 576, 700, 100, 512, 0.1),
        (1, 40, 72, 100, 77, 64, 0.25),
        (2, 4, 64, 32, 16, 64, 0.0),
        (1, 16, 256, 64, 2048, 128, 0.5),
        (1, 64, 576, 100, 33, 512, 1.0),
        (64, 16, 576, 4224, 2048, 512, 0.1),
        (5, 8, 576, 900, 300, 512, 0.2),
        (3, 24, 576, 900, 300, 512, 0.0),
    ]
    results = []
    for S, H, D, T, K, V, empty in cases:
        t = _dsa_tensors(S, H, D, T, K, V, torch.bfloat16, g, empty)
        scale = D**-0.5
        ref = dsa_reference(t["q"], t["kv"], t["idx"], scale, V)
        res = {"piece": "dsa_check", "S": S, "H": H, "D": D, "T": T, "K": K, "V": V, "empty": empty}
        scale_ref = ref.abs().max().clamp_min(1e-30)
        variants = [
            ("fma", dsa_launches("bf16", S, H, D, T, K, V, scale, fma=True)),
            ("pass", dsa_launches("bf16", S, H, D, T, K, V, scale)),
        ]
        if kg.dsa_mma_rows("bf16", S, D, V) is not None:
            variants += [
                (f"mma_r{r}", dsa_launches("bf16", S, H, D, T, K, V, scale, rows=r, split=False)) for r in (16, 64)
            ]
            if kg.dsa_mma_vparts(H) > 1:
                variants.append(("general", dsa_launches("bf16", S, H, D, T, K, V, scale, split=False)))
        for name, ls in variants:
            out = _dsa_run(run, ls, t).double()
            err = (out - ref).abs().max()
            res[f"{name}_entry"] = ls[0].entry
            res[f"{name}_rel_err"] = float(err / scale_ref) if float(ref.abs().max()) > 0 else float(err)
        res["ok"] = all(v < 1.5e-2 for k, v in res.items() if k.endswith("_rel_err"))  # NaN fails
        results.append(res)
        print(json.dumps(res), flush=True)
    return results


def bench_dsa(run: Runner, T: int) -> list[dict]:
    import torch

    H, D, V, K = DSA["H"], DSA["D"], DSA["V"], DSA["K"]
    scale = D**-0.5
    g = torch.Generator(device="cuda").manual_seed(T + 1)
    bf = torch.bfloat16
    kv_copies = _copies(T * D * 2, most=4)
    kvs = [torch.randn(T, D, device="cuda", generator=g).to(bf) for _ in range(kv_copies)]
    variants = 32  # selections rotate too: 32 × 2 MB of rows > L2
    most_splits = kg.cdiv(K, 16)
    shared = {
        "q": torch.randn(1, H, D, device="cuda", generator=g).to(bf),
        "ml": torch.empty(1, most_splits, H, 2, device="cuda"),
        "acc": torch.empty(1, most_splits, H, V, device="cuda"),
        "out": torch.empty(1, H, V, device="cuda", dtype=torch.float32),
    }
    sets = [
        {**shared, "kv": kvs[i % kv_copies], "idx": torch.randperm(T, device="cuda", generator=g)[:K].reshape(1, K)}
        for i in range(variants)
    ]
    ref = dsa_reference(shared["q"], sets[0]["kv"], sets[0]["idx"], scale, V)
    op_bytes = K * D * 2 + K * 8 + H * D * 2 + H * V * 4  # rows, indices, q, out (f32)
    results = []
    pass_rows = kg.dsa_mma_rows("bf16", 1, D, V)
    kernel_sets = [("pass", dsa_launches("bf16", 1, H, D, T, K, V, scale), True)]
    kernel_sets += [
        (f"mma_r{r}", dsa_launches("bf16", 1, H, D, T, K, V, scale, rows=r), False)
        for r in (16, 32, 64, 128)
        if r != pass_rows
    ]
    kernel_sets += [("fma", dsa_launches("bf16", 1, H, D, T, K, V, scale, fma=True), False)]
    for label, (partial, combine), is_pass in kernel_sets:
        splits = partial.grid[0]
        rel = _rel(_dsa_run(run, (partial, combine), sets[0])[0].float(), ref[0])
        part_bytes = K * D * 2 + K * 8 + H * D * 2 + splits * H * (2 + V) * 4
        comb_bytes = splits * H * (2 + V) * 4 + H * V * 4
        for name, launches, nbytes in (
            ("partial", [partial], part_bytes),
            ("combine", [combine], comb_bytes),
            ("partial+combine", [partial, combine], part_bytes + comb_bytes),
        ):
            if not is_pass and name != "partial+combine":
                continue
            cold, hot = _time(run, lambda i, ls=launches: [(l, sets[i]) for l in ls], variants)
            res = {
                "piece": "dsa",
                "kernel": f"{name} [{label}: {partial.entry}]",
                "T": T,
                "grid": [list(l.grid) for l in launches],
                "pass_grid": is_pass,
                "us": round(cold, 2),
                "hot_us": round(hot, 2),
                **_limit(nbytes, cold),
                "op_limit_us": round(op_bytes / (BANDWIDTH_GBS * 1e3), 2),
                "rel_err": rel,
            }
            results.append(res)
            print(json.dumps(res), flush=True)
    return results


def bench_dsa_batch(run: Runner) -> list[dict]:
    """The e2e benchmark model's batched decode step (16 heads): S = 64 queries, each over 2048 rows
    of its own 4224 in one bf16 pool, the pass's geometry (the `_vp4` partial) beside the general
    partial (split-scores=false: each warp of a head group computes the whole scores)."""
    import torch

    S, H, D, V, K, per = 64, 16, 576, 512, 2048, 4224
    T, scale = S * per, D**-0.5
    g = torch.Generator(device="cuda").manual_seed(12)
    results = []
    for label, split in (("general", False), ("pass", True)):
        partial, combine = dsa_launches("bf16", S, H, D, T, K, V, scale, split=split)
        t = _dsa_tensors(S, H, D, per, K, V, torch.bfloat16, g, max_splits=partial.grid[0])
        t["kv"] = torch.randn(T, D, device="cuda", generator=g).to(torch.bfloat16)
        t["idx"] = t["idx"] + per * torch.arange(S, device="cuda")[:, None]  # each query its own rows
        ref = dsa_reference(t["q"][:4], t["kv"], t["idx"][:4], scale, V)
        rel = _rel(_dsa_run(run, (partial, combine), t)[:4].float(), ref)
        cold, hot = _time(run, lambda i: [(partial, t), (combine, t)], 1)
        nbytes = S * K * (D * 2 + 8)
        res = {
            "piece": "dsa_batch",
            "kernel": f"partial+combine [{label}: {partial.entry}], S = {S}, H = {H}",
            "S": S,
            "grid": [list(partial.grid), list(combine.grid)],
            "us": round(cold, 1),
            "hot_us": round(hot, 1),
            **_limit(nbytes, cold),
            "rel_err": rel,
            "ok": rel < 1.5e-2,
        }
        results.append(res)
        print(json.dumps(res), flush=True)
    return results


def bench_dsa_prefill(run: Runner) -> list[dict]:
    """The e2e benchmark model's prefill chunk (docs/perf.md's 4.9B deepseek_v32: 16 heads): S = 512 queries
    over a 4224-row bf16 latent cache, 2048 selected rows each, the pass's geometry."""
    import torch

    S, H, D, V, K, T = 512, 16, 576, 512, 2048, 4224
    scale = D**-0.5
    g = torch.Generator(device="cuda").manual_seed(11)
    partial, combine = dsa_launches("bf16", S, H, D, T, K, V, scale)
    t = _dsa_tensors(S, H, D, T, K, V, torch.bfloat16, g, max_splits=partial.grid[0])
    ref = dsa_reference(t["q"][:4], t["kv"], t["idx"][:4], scale, V)
    rel = _rel(_dsa_run(run, (partial, combine), t)[:4].float(), ref)
    cold, hot = _time(run, lambda i: [(partial, t), (combine, t)], 1)
    flops = 2 * S * H * K * (D + V)
    res = {
        "piece": "dsa_prefill",
        "kernel": f"partial+combine [pass: {partial.entry}], S = {S}, H = {H}",
        "S": S,
        "H": H,
        "T": T,
        "K": K,
        "grid": [list(partial.grid), list(combine.grid)],
        "us": round(cold, 1),
        "hot_us": round(hot, 1),
        "tflops": round(flops / hot / 1e6, 1),
        "rel_err": rel,
    }
    print(json.dumps(res), flush=True)
    return [res]


def mxfp4_dequantize(packed, scales):
    """f32 [..., N, K] of packed u8 [..., N, K/2] (low nibble first) and E8M0 scales [..., N, K/32]."""
    import torch

    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], device=packed.device)
    v = torch.stack([lut[(packed & 15).long()], lut[(packed >> 4).long()]], -1).flatten(-2)
    s = torch.exp2(scales.float() - 127)
    return (v.unflatten(-1, (-1, 32)) * s[..., None]).flatten(-2)


def bench_moe(run: Runner) -> list[dict]:
    import torch

    E, k, hid, inter = MOE["E"], MOE["k"], MOE["hidden"], MOE["intermediate"]
    g = torch.Generator(device="cuda").manual_seed(2)
    u8 = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, device="cuda", generator=g)  # noqa: E731
    sc = lambda *s: torch.randint(118, 124, s, dtype=torch.uint8, device="cuda", generator=g)  # noqa: E731
    gate_up = mxfp4_launch(1, k, E, 2 * inter, hid)
    down = mxfp4_launch(k, 1, E, hid, inter)
    variants = 8  # expert choices rotate: 8 × 107 MB of weights
    choices = [torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(variants)]
    gu_w = {"packed": u8(E, 2 * inter, hid // 2), "scales": sc(E, 2 * inter, hid // 32)}
    dn_w = {"packed": u8(E, hid, inter // 2), "scales": sc(E, hid, inter // 32)}
    x = torch.randn(1, hid, device="cuda", generator=g)
    h = torch.randn(k, inter, device="cuda", generator=g)
    gu_sets = [
        {**gu_w, "x": x, "experts": c.reshape(1, k), "out": torch.empty(k, 2 * inter, device="cuda")} for c in choices
    ]
    dn_sets = [{**dn_w, "x": h, "experts": c.reshape(k, 1), "out": torch.empty(k, hid, device="cuda")} for c in choices]
    results = []
    for name, launch, sets, w, xin, N, K in (
        ("gate_up", gate_up, gu_sets, gu_w, x, 2 * inter, hid),
        ("down", down, dn_sets, dn_w, h, hid, inter),
    ):
        run(launch, sets[0])
        torch.cuda.synchronize()
        e = choices[0]
        wd = mxfp4_dequantize(w["packed"][e], w["scales"][e])  # [k, N, K]
        xs = xin.expand(k, K) if xin.shape[0] == 1 else xin
        ref = torch.einsum("jnk,jk->jn", wd.double(), xs.double())
        nbytes = k * N * (K // 2 + K // 32) + xin.numel() * 4 + k * 8 + k * N * 4
        cold, hot = _time(run, lambda i, l=launch, s=sets: [(l, s[i])], variants)
        res = {
            "piece": "moe",
            "kernel": name,
            "grid": list(launch.grid),
            "us": round(cold, 2),
            "hot_us": round(hot, 2),
            **_limit(nbytes, cold),
            "rel_err": _rel(sets[0]["out"], ref),
        }
        results.append(res)
        print(json.dumps(res), flush=True)
    # the down projection from the experts' gate_up rows (day0::mxfp4_moe_swiglu), with and
    # without the clamp; gate_up's values spread past the limit so that the clamp matters
    gu = 4.0 * torch.randn(k, 2 * inter, device="cuda", generator=g)
    for limit in (SWIGLU_LIMIT, math.inf):
        launch = mxfp4_launch(k, 1, E, hid, inter, limit)
        sets = [
            {**dn_w, "x": gu, "experts": c.reshape(k, 1), "out": torch.empty(k, hid, device="cuda")} for c in choices
        ]
        sets[0]["out"].fill_(float("nan"))
        run(launch, sets[0])
        torch.cuda.synchronize()
        gate, up = gu.double().chunk(2, dim=-1)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        h = gate * torch.sigmoid(gate) * up
        ref = mxfp4_moe_reference(h, dn_w["packed"], dn_w["scales"], choices[0].reshape(k, 1))
        rel = _rel(sets[0]["out"], ref)
        cold, hot = _time(run, lambda i, l=launch, s=sets: [(l, s[i])], variants)
        res = {
            "piece": "moe",
            "kernel": f"down_swiglu limit={limit}",
            "grid": list(launch.grid),
            "us": round(cold, 2),
            "hot_us": round(hot, 2),
            "rel_err": rel,
            "ok": rel < MOE_SWIGLU_MAX_REL_ERR,
        }
        results.append(res)
        print(json.dumps(res), flush=True)
    return results


def mxfp4_moe_reference(x, packed, scales, experts):
    """float64 out [T·k, N] of mxfp4_moe: row t·k + j = W[experts[t, j]] · x[t]; zeros for an
    expert outside [0, E)."""
    import torch

    E, N = packed.shape[:2]
    k = experts.shape[1]
    flat = experts.reshape(-1)
    out = torch.zeros(flat.numel(), N, dtype=torch.float64, device=x.device)
    for e in flat.unique().tolist():
        if 0 <= e < E:
            r = (flat == e).nonzero()[:, 0]
            out[r] = x[r // k].double() @ mxfp4_dequantize(packed[e], scales[e]).double().T
    return out


def bench_moe_gemm(run: Runner) -> list[dict]:
    import torch

    E = PREFILL_MOE["E"]
    g = torch.Generator(device="cuda").manual_seed(3)
    results = []
    for name, (T, k, N, K) in {**moe_gemm_shapes(), **moe_batch_shapes()}.items():
        batch = name in moe_batch_shapes()
        wbytes = E * N * (K // 2 + K // 32)
        copies = _copies(wbytes, most=4)
        weights = [
            {
                "packed": torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, device="cuda", generator=g),
                "scales": torch.randint(118, 124, (E, N, K // 32), dtype=torch.uint8, device="cuda", generator=g),
            }
            for _ in range(copies)
        ]
        for case in ("random", "skewed") if batch else ("random", "skewed", "T=3"):
            t = 3 if case == "T=3" else T
            experts = torch.rand(t, E, device="cuda", generator=g).topk(k, dim=1).indices  # distinct per token
            if case == "skewed":  # half the rows on expert 5
                experts = torch.where(torch.rand(t, k, device="cuda", generator=g) < 0.5, 5, experts)
            if case == "T=3":  # invalid ids give zero rows
                experts[0, 0], experts[2, k - 1] = -1, E
            x = torch.randn(t, K, device="cuda", generator=g)
            sets = [{**w, "x": x, "experts": experts, "out": torch.empty(t * k, N, device="cuda")} for w in weights]
            ref = mxfp4_moe_reference(x, weights[0]["packed"], weights[0]["scales"], experts)
            used = int(experts[(experts >= 0) & (experts < E)].unique().numel())  # experts whose weights are read
            nbytes = used * N * (K // 2 + K // 32) + t * K * 4 + t * k * 8 + t * k * N * 4
            kernels = [("gemm", mxfp4_gemm_launch(t, k, E, N, K)), ("matvec", mxfp4_launch(t, k, E, N, K))]
            if batch:
                kernels.insert(0, ("few", mxfp4_gemm_launch(t, k, E, N, K, "few")))
            for kernel, launch in kernels:
                sets[0]["out"].fill_(float("nan"))
                run(launch, sets[0])
                torch.cuda.synchronize()
                rel = _rel(sets[0]["out"], ref)  # NaN if a row was not written
                cold, hot = _time(run, lambda i, l=launch, s=sets: [(l, s[i])], copies)
                res = {
                    "piece": "moe_gemm",
                    "kernel": f"{kernel} {name} [{case}]",
                    "T": t,
                    "grid": list(launch.grid),
                    "us": round(cold, 2),
                    "hot_us": round(hot, 2),
                    **_limit(nbytes, cold),
                    "rel_err": rel,
                    "ok": rel < MOE_GEMM_MAX_REL_ERR,
                }
                results.append(res)
                print(json.dumps(res), flush=True)
        del weights, sets
        torch.cuda.empty_cache()
    return results


def bench_topk(ptx_dir: Path, T: int) -> dict:
    from day0.tools.bench.gpu_topk_check import kernel_times

    res = {"piece": "topk", **kernel_times(ptx_dir / kg.TOPK_SELECT.ptx, T, INDEXER["top_k"])}
    res.update(_limit(T * 4 + INDEXER["top_k"] * 8, res["all_us"]))
    print(json.dumps(res), flush=True)
    return res


def _over_contexts(bench, run: Runner, contexts) -> list[dict]:
    """bench(run, T) at each context T, freeing the cached device memory between them."""
    import torch

    results = []
    for T in contexts:
        results += bench(run, T)
        torch.cuda.empty_cache()
    return results


def _table(results: list[dict]) -> str:
    lines = [
        "| piece | kernel | T | grid | µs | hot µs | limit µs | limit ÷ µs | check |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["piece"] in ("indexer_check", "indexer_rows_check", "indexer_causal_check", "dsa_check"):
            continue  # checks without a timing (their lines above, in the JSON)
        check = ""
        if "rel_err" in r:
            check = f"rel {r['rel_err']:.1e}"
        if "topk" in r:
            t = r["topk"]
            check += (
                ", top-k same"
                if t["same_set"]
                else f", top-k {t['swapped']} swapped"
                + (" (within error)" if t.get("swaps_within_error_of_kth") else "")
            )
        if r["piece"] == "topk":
            r = {
                **r,
                "kernel": "radix top-k",
                "T": r["n"],
                "us": round(r["all_us"], 2),
                "hot_us": "",
                "grid": "",
                "correct": r["correct"],
            }
            check = "exact" if r["correct"] else "WRONG"
        kernel = r["kernel"] + ("" if r.get("pass_grid", True) else " (other grid)")
        lines.append(
            f"| {r['piece']} | {kernel} | {r.get('T', r.get('S', ''))} | {r['grid']} | {r.get('us', '')} | {r.get('hot_us', '')} | "
            f"{r.get('limit_us', '')} | {r.get('limit_over_time', '')} | {check} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-kernel-times")
    p.add_argument("ptx_dir", nargs="?", default=str(Path(__file__).resolve().parents[2] / "lowering" / "kernels"))
    p.add_argument("--json", default=None)
    p.add_argument("--pieces", default="indexer,indexer_prefill,dsa,moe,moe_gemm,topk")
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    a = p.parse_args(argv)
    import torch

    ptx_dir, pieces = Path(a.ptx_dir), set(a.pieces.split(","))
    contexts = [int(c) for c in a.contexts.split(",")]
    run = Runner(ptx_dir)
    results: list[dict] = []
    if "indexer" in pieces:
        results += check_indexer_shapes(run)
        results += check_indexer_rows(run)
        results += _over_contexts(bench_indexer, run, contexts)
    if "indexer_prefill" in pieces:
        results += check_indexer_causal(run)
        for T in (4096, 32768, 131072):
            results.append(bench_indexer_prefill(run, T))
            torch.cuda.empty_cache()
    if "dsa" in pieces:
        results += check_dsa_shapes(run)
        results += bench_dsa_batch(run)
        results += bench_dsa_prefill(run)
        results += _over_contexts(bench_dsa, run, contexts)
    if "moe" in pieces:
        results += bench_moe(run)
        torch.cuda.empty_cache()
    if "moe_gemm" in pieces:
        results += bench_moe_gemm(run)
    if "topk" in pieces:
        for T in contexts:
            results.append(bench_topk(ptx_dir, T))
    print(_table(results))
    bad = [r for r in results if not r.get("ok", True)]  # the correctness checks
    if a.json:
        meta = {"device": torch.cuda.get_device_name(), "bandwidth_gbs": BANDWIDTH_GBS, "torch": torch.__version__}
        Path(a.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
