"""Piece-by-piece check of a deepseek_v32 checkpoint on the GPU: pieces of the model (one
function each, the checkpoint's weights baked in as constants), compiled for llvm-cpu and for the
GPU target through each target's whole pass pipeline, run on the GPU host and compared with the
CPU row by row. It finds where a compiled model goes wrong when the whole artifact does (the
default model on cuda-sm90, docs/perf.md "The default model").

    python -m day0.tools.bench.gpu_piece_check build DIR [PIECE...]   # here: vmfbs + CPU outputs
    python -m day0.tools.bench.gpu_piece_check run DIR [--json F]    # GPU host: numpy + iree runtime

Pieces (S = 16 tokens at positions 0..15, a key range of T = 64, layer 0 unless named):
    rope_columns, cache_row, query, index_keys, norm   the elementwise forms of models/mla.py
    attn0, attn1, mlp0, moe1, layer0                   whole modules
    a_*                                                layer 0's attention step by step, each from
                                                       eager inputs (a_select: sorted slots)
A piece NAME@VARIANT compiles the GPU side without some of the target's passes: @no<role>
(lowering/targets.py ROLES; @nodsa lowers the DSA op through gather tiles), @notopk (no radix
select), @bare (none of day0's kernels). Row 0 of an attention piece attends to itself alone, so
it is right whatever the scores are: an error from row 1 on points at the scores or the selection.
"""

import argparse
import json
import re
from pathlib import Path

import numpy as np

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "default"
T = 64  # the pieces' key range
S = 16  # rows per piece


def pieces(checkpoint: Path = CHECKPOINT) -> dict:
    """name -> (fn, args): the checkpoint's pieces with their inputs (eager tensors)."""
    import torch

    from day0.frontend import ops
    from day0.models.layers import linear, linears, rope_columns
    from day0.models.mla import absorb_uk, apply_uv, cache_row
    from day0.models.paging import dense_view
    from day0.models.registry import build_eager

    torch.manual_seed(0)
    m = build_eager(checkpoint, T)
    cfg = m.cfg
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, cfg.vocab_size, S))
    pos = torch.arange(S, dtype=torch.int64)
    cos, sin = m.rope_at(pos)
    h0 = m.model.embed_tokens.weight.index_select(0, ids).float()
    L0, L1 = m.model.layers[0], m.model.layers[1]
    att = L0.self_attn
    k = m.selection_width()
    heads, rank, rope = att.heads, att.rank, att.rope

    def caches():
        return torch.zeros(T, rank + rope), torch.zeros(T, cfg.index_head_dim)

    def attn(layer):
        return lambda x, p: layer.self_attn(layer.input_layernorm(x), dense_view(p, T), *m.rope_at(p), *caches(), k)[0]

    def whole(layer):
        return lambda x, p: layer(x, dense_view(p, T), *m.rope_at(p), *caches(), k)[0]

    def projections(x):
        return linears(
            x,
            att.q_a_proj,
            att.kv_a_proj_with_mqa,
            att.indexer.wk,
            att.indexer.weights_proj,
            scales=(1.0, 1.0, 1.0, att.indexer.weight_scale),
        )

    w_kv = att.kv_b_proj.weight.float().view(heads, att.nope + att.v, rank)
    with torch.no_grad():  # layer 0's attention, step by step (models/mla.py SparseMLA.forward)
        x = L0.input_layernorm(h0)
        view = dense_view(pos, T)
        q_a, compressed, index_key, index_weights = projections(x)
        q_resid = att.q_a_layernorm(q_a)
        q = linear(q_resid, att.q_b_proj).view(S, heads, att.nope + rope)
        kv, ix = caches()
        row = cache_row(compressed, att.kv_a_layernorm, rope_columns(compressed, cos, sin, rank, rope, True))
        kv = kv.index_copy(0, view.rows, row)
        ix = ix.index_copy(0, view.rows, att.indexer.keys(index_key, cos, sin))
        index_q = linear(q_resid, att.indexer.wq_b)
        slots = att.indexer.select(index_weights, index_q, cos, sin, ix, view, k)
        query = att._query(absorb_uk(q[..., : att.nope], w_kv[:, : att.nope]), q, cos, sin)
        o_latent = torch.ops.day0.dsa_attention(query, kv, slots, att.scale, rank)

    def select(w, r, c, s, keys, p):
        chosen = att.indexer.select(w, r, c, s, keys, dense_view(p, T), k)
        return torch.sort(chosen, -1).values.float()  # a set: the targets order it differently

    def q_path(r, c, s):
        qq = linear(att.q_a_layernorm(r), att.q_b_proj).view(S, heads, -1)
        return att._query(absorb_uk(qq[..., : att.nope], w_kv[:, : att.nope]), qq, c, s)

    def row_path(x, c, s, fence=()):
        """The cache row from x; `fence`: what ops.materialize makes a tensor of its own (the
        latent "slice" of the fused projections, the "rotated" columns; models/mla.py does both)."""
        latent = linears(x, att.q_a_proj, att.kv_a_proj_with_mqa)[1]
        latent = ops.materialize(latent) if "slice" in fence else latent
        rotated = rope_columns(latent, c, s, rank, rope, True)
        return cache_row(latent, att.kv_a_layernorm, ops.materialize(rotated) if "rotated" in fence else rotated)

    def keys_path(x, c, s):
        return att.indexer.keys(projections(x)[2], c, s)

    out = {
        "rope_columns": (
            lambda x, c, s: rope_columns(x, c, s, rank, rope, True),
            (torch.randn(S, rank + rope), cos, sin),
        ),
        "cache_row": (row_path, (x, cos, sin)),
        "cache_row_slice": (lambda x, c, s: row_path(x, c, s, ("slice",)), (x, cos, sin)),
        "cache_row_rotated": (lambda x, c, s: row_path(x, c, s, ("rotated",)), (x, cos, sin)),
        "cache_row_both": (lambda x, c, s: row_path(x, c, s, ("slice", "rotated")), (x, cos, sin)),
        "keys_row": (keys_path, (x, cos, sin)),
        "query": (lambda a, b, c, s: att._query(a, b, c, s), (torch.randn(S, heads, rank), q, cos, sin)),
        "index_keys": (lambda x, c, s: att.indexer.keys(x, c, s), (index_key, cos, sin)),
        "norm": (L0.input_layernorm, (h0,)),
        "mlp0": (L0.mlp, (x,)),
        "moe1": (L1.mlp, (x,)),
        "attn0": (attn(L0), (h0, pos)),
        "attn1": (attn(L1), (h0, pos)),
        "layer0": (whole(L0), (h0, pos)),
        "a_linears": (lambda x: torch.cat(projections(x), -1), (x,)),
        "a_qb": (lambda r: linear(att.q_a_layernorm(r), att.q_b_proj), (q_a,)),
        "a_absorb": (lambda a: absorb_uk(a[..., : att.nope], w_kv[:, : att.nope]), (q,)),
        "a_query": (
            lambda a, c, s: att._query(absorb_uk(a[..., : att.nope], w_kv[:, : att.nope]), a, c, s),
            (q, cos, sin),
        ),
        "a_qpath": (q_path, (q_a, cos, sin)),
        "a_kvwrite": (lambda r, p: torch.zeros(T, r.shape[1]).index_copy(0, p, r) * 1.0, (row, pos)),
        "a_select": (select, (index_weights, index_q, cos, sin, ix, pos)),
        "a_dsa": (lambda qu, c, sl: torch.ops.day0.dsa_attention(qu, c, sl, att.scale, rank), (query, kv, slots)),
        "a_uv": (lambda o: linear(apply_uv(o, w_kv[:, att.nope :]).reshape(S, -1), att.o_proj), (o_latent,)),
    }
    variants = {
        "attn0": ("nomatmul", "nodsa", "noindexer", "notopk", "bare"),
        "a_select": ("noindexer", "notopk", "bare"),
        "a_dsa": ("nodsa",),
        "a_linears": ("nomatmul",),
        "a_qb": ("nomatmul",),
        "a_absorb": ("nomatmul",),
        "a_query": ("nomatmul",),
        "a_uv": ("nomatmul",),
    }
    return out | {f"{n}@{v}": out[n] for n, vs in variants.items() for v in vs}


def gpu_pipeline(target, dsa, variant: str) -> tuple[str, tuple[str, ...]]:
    """(pass pipeline, ops export keeps whole) for the GPU side of a piece with `variant`."""
    from day0.lowering.targets import ROLES, _gather_tiles

    dropped = {"": (), "bare": ("indexer", "router", "mxfp4", "dsa", "matmul", "vision"), "notopk": ()}.get(
        variant, (variant.removeprefix("no"),)
    )
    pipeline = target.pipeline(dsa, roles=tuple(r for r in ROLES if r not in dropped))
    if variant in ("notopk", "bare"):
        pipeline = re.sub(r"topk-to-radix-select\{[^}]*\},?", "", pipeline)
    if "dsa" in dropped:  # the DSA op still needs a lowering: the CPU's gather tiles
        pipeline = pipeline[:-1] + "," + _gather_tiles(dsa) + ")"
    kept = () if {"indexer", "router"} & set(dropped) else target.kept_ops
    return pipeline, kept


def _import(fn, args, kept) -> str:
    import torch
    from torch_mlir import ir as tm_ir
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    from torch_mlir.extras.fx_importer import FxImporter

    from day0.frontend import ops

    class Piece(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)

    with torch.no_grad(), ops.keeping(kept):
        program = torch.export.export(Piece(), args, strict=False).run_decompositions(get_decomposition_table())
    context = tm_ir.Context()
    torch_d.register_dialect(context)
    importer = FxImporter(context=context)  # parameters (the baked weights) become literals
    importer.import_program(program, func_name="main")
    return str(importer.module_op)


def build(out: Path, names: list[str], target_name: str = "cuda-sm90", checkpoint: Path = CHECKPOINT) -> dict:
    """Compile the pieces `names` (all: empty) for llvm-cpu and `target_name` into `out`, with their
    inputs and CPU outputs; returns {name: CPU vs eager max relative error}."""
    import torch

    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.lowering.targets import DsaShape, get_target
    from day0.passes.pipeline import run_pipeline
    from day0.runtime.vm import VmModule

    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "pieces.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    every = pieces(checkpoint)
    unknown = set(names) - set(every)
    if unknown:
        raise SystemExit(f"unknown pieces {sorted(unknown)}; known: {', '.join(every)}")
    dsa = DsaShape(min(64, T), keys=T)
    cpu_errors = {}
    for name in names or list(every):
        fn, args = every[name]
        variant = name.partition("@")[2]
        cpu = get_target("llvm-cpu")
        gpu = get_target(target_name)
        for target, (pipeline, kept), suffix in (
            (cpu, (cpu.pipeline(dsa), cpu.kept_ops), "cpu"),
            (gpu, gpu_pipeline(gpu, dsa, variant), "gpu"),
        ):
            with new_context():
                module = parse_module(_import(fn, args, kept))
                run_pipeline(module, pipeline)
                compile_mlir(str(module), target.name, out / f"{name}.{suffix}.vmfb")
        inputs = [a.numpy() for a in args]
        want = VmModule.load(out / f"{name}.cpu.vmfb").function("main")(*inputs).to_host()
        with torch.no_grad():
            eager = fn(*args).float().numpy()
        cpu_errors[name] = float(np.abs(want - eager).max() / max(np.abs(eager).max(), 1e-30))
        print(f"{name}: built, CPU vs eager {cpu_errors[name]:.1e}", flush=True)
        np.savez(out / f"{name}.npz", *inputs, expected=want)
        index[name] = len(inputs)
        index_path.write_text(json.dumps(index, indent=1))
    return cpu_errors


def row_errors(got: np.ndarray, want: np.ndarray) -> list[float]:
    """Max relative error of each row (the first axis) of got against want."""
    g = got.reshape(got.shape[0], -1).astype(np.float64)
    w = want.reshape(want.shape[0], -1).astype(np.float64)
    return (np.abs(g - w).max(1) / np.maximum(np.abs(w).max(1), 1e-30)).tolist()


def run(out: Path, device: str = "cuda", save: Path | None = None) -> dict:
    """Each built piece on `device` against its CPU output: {name: per-row errors, or an error}."""
    from day0.runtime.vm import VmModule

    results = {}
    for name, n in json.loads((out / "pieces.json").read_text()).items():
        data = np.load(out / f"{name}.npz")
        try:
            module = VmModule.load(out / f"{name}.gpu.vmfb", device=device)
            got = module.function("main")(*[data[f"arr_{i}"] for i in range(n)]).to_host()
        except Exception as e:  # noqa: BLE001  (a failing piece is a result; the others still run)
            results[name] = {"error": str(e)[-300:]}
            print(f"{name}: ERROR {results[name]['error']}", flush=True)
            continue
        rows = row_errors(got, data["expected"])
        results[name] = {"rows": rows}
        print(f"{name:22s} max {max(rows):.1e}  rows " + " ".join(f"{r:.0e}" for r in rows), flush=True)
        if save is not None and max(rows) > 1e-4:  # keep the evidence of a mismatch
            np.savez(save / f"{name}.mismatch.npz", got=got, expected=data["expected"])
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-piece-check", description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["build", "run"])
    p.add_argument("dir")
    p.add_argument("pieces", nargs="*", help="build: these pieces only (default: all)")
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--checkpoint", default=str(CHECKPOINT))
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default=None, help="run: write the results here")
    p.add_argument("--save", default=None, help="run: write got/expected of mismatching pieces here")
    a = p.parse_args(argv)
    out = Path(a.dir)
    if a.mode == "build":
        build(out, a.pieces, a.target, Path(a.checkpoint))
    else:
        results = run(out, a.device, Path(a.save) if a.save else None)
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
