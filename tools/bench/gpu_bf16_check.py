"""The bf16 tensor-core kernels inside IREE, at the model's shapes, against PyTorch references:
the exact op contract (f32 math on the widened bf16 values) and a rounded one, where one operand
goes through bf16 once: the indexer's scaled query, the attention's P for P·V. The kernels enter
both as two bf16 terms, hi + lo (passes/indexer_scores_to_cuda_kernel.py, passes/dsa_to_cuda_kernel.py),
so they should lie nearer the exact reference than the rounded one.

    python -m day0.tools.bench.gpu_bf16_check build DIR   # here: cuda-sm90 vmfbs + inputs + references
    python -m day0.tools.bench.gpu_bf16_check run DIR     # GPU host: numpy, ml_dtypes, iree runtime

Inputs are f32 and each case rounds them to bf16 inside the module (as the model writes its
caches), so no bf16 array crosses the runtime boundary. One JSON line per case: max |Δ| ÷ max
|want| against each reference, and for the indexer how many of each query's top-k differ.
"""

import argparse
import json
from pathlib import Path

import numpy as np

TOPK = 2048


def _cases():
    import torch

    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    bf = torch.bfloat16

    def sel(S, T, K, empty=0):
        idx = torch.stack([torch.randperm(T, generator=g)[:K] for _ in range(S)])
        if empty:
            idx[:, -empty:] = -1
        return idx

    def attn(S, H, D, V, T, empty=0):
        scale = D**-0.5
        return (
            lambda q, kv, i: torch.ops.day0.dsa_attention(q.to(bf), kv.to(bf), i, scale, V),  # f32
            (r(S, H, D), r(T, D), sel(S, T, TOPK, empty)),
            scale,
        )

    def index(S, H, D, T):
        from day0.frontend import ops

        return (
            lambda q, k, w: ops.indexer_scores(q, k.to(bf), w, D**-0.5),
            (r(S, H, D), r(T, D), torch.rand(S, H, generator=g)),
            D**-0.5,
        )

    return {
        "attn_decode_glm": attn(1, 64, 512, 512, 8192),  # the bench's DSA piece (shorter cache)
        "attn_decode_e2e": attn(1, 16, 576, 512, 4224),  # the 4.9B model's layer
        "attn_prefill_e2e": attn(12, 16, 576, 512, 4224, 100),
        "index_decode_glm": index(1, 32, 128, 16384),
        "index_prefill_e2e": index(12, 16, 128, 4224),
    }


def _references(name, args, scale):
    """(exact, rounded) references in f32 numpy (module docstring). The attention's result is f32 (the op's
    contract for bf16 q and kv too): no final bf16 rounding in either reference."""
    import torch

    bf = torch.bfloat16
    if name.startswith("attn"):
        q, kv, idx = args[0].to(bf).float(), args[1].to(bf).float(), args[2]
        rows = kv[idx.clamp(min=0)]  # [S, K, D]
        s = torch.einsum("shd,skd->shk", q, rows) * scale
        s = s.masked_fill(~(idx >= 0)[:, None, :], float("-inf"))
        p = torch.exp(s - s.amax(-1, keepdim=True))
        exact = torch.einsum("shk,skv->shv", p / p.sum(-1, keepdim=True), rows[..., :512])
        rounded = torch.einsum("shk,skv->shv", p.to(bf).float(), rows[..., :512]) / p.sum(-1, keepdim=True)
        return exact.numpy(), rounded.numpy()
    q, k, w = args
    k = k.to(bf).float()
    exact = torch.einsum("sh,sht->st", w, torch.relu(torch.einsum("shd,td->sht", q, k) * scale))
    qr = (q * scale).to(bf).float()
    rounded = torch.einsum("sh,sht->st", w, torch.relu(torch.einsum("shd,td->sht", qr, k)))
    return exact.numpy(), rounded.numpy()


def build(out: Path) -> None:
    import torch
    from torch_mlir import fx

    from day0.frontend.ir import new_context, parse_module
    from day0.frontend.ops import keeping
    from day0.lowering.compile import compile_mlir
    from day0.passes.pipeline import run_pipeline

    out.mkdir(parents=True, exist_ok=True)
    pipeline = "builtin.module(indexer-scores-to-cuda-kernel,dsa-to-cuda-kernel)"
    for name, (fn, args, scale) in _cases().items():

        class M(torch.nn.Module):
            def forward(self, *a):
                return fn(*a)

        with keeping({"indexer_scores"}):
            m = fx.export_and_import(M(), *args, output_type="raw", func_name="main")
        with new_context():
            module = parse_module(str(m))
            run_pipeline(module, pipeline)
            compile_mlir(str(module), "cuda-sm90", out / f"{name}.vmfb")
        exact, rounded = _references(name, args, scale)
        np.savez(out / f"{name}.npz", *[a.numpy() for a in args], exact=exact, rounded=rounded)
    (out / "cases.json").write_text(json.dumps({n: len(c[1]) for n, c in _cases().items()}))


def run(out: Path, device: str) -> list[dict]:
    from day0.runtime.vm import VmModule

    results = []
    for name, n in json.loads((out / "cases.json").read_text()).items():
        data = np.load(out / f"{name}.npz")
        got = np.asarray(
            VmModule.load(out / f"{name}.vmfb", device=device)
            .function("main")(*[data[f"arr_{i}"] for i in range(n)])
            .to_host(),
            np.float64,
        )
        res = {"case": name}
        for ref in ("exact", "rounded"):
            want = data[ref].astype(np.float64)
            res[f"vs_{ref}"] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            if name.startswith("index"):  # selections: top-k sets of each query
                k = min(TOPK, got.shape[-1] // 4)
                a, b = np.argsort(-got, -1)[:, :k], np.argsort(-want, -1)[:, :k]
                res[f"topk_diff_{ref}"] = int(max(k - len(np.intersect1d(x, y)) for x, y in zip(a, b)))
        print(json.dumps(res), flush=True)
        results.append(res)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-bf16-check")
    p.add_argument("mode", choices=["build", "run"])
    p.add_argument("dir")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.mode == "build":
        build(Path(a.dir))
    else:
        results = run(Path(a.dir), a.device)
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
