"""matmul-to-bf16-terms numerics: a linear against a bf16 weight and MLA's absorbed-query bmm
against a head slice of one, rewritten into bf16 products and compiled by IREE (llvm-cpu), match
float64 within 1e-6 of the output's max with three terms (an f32 matmul's accuracy) and 1e-5
with two, as one product per term or as one product over the stacked terms (stack-rows). One bf16 term alone (x rounded to bf16) is ~2e-3 off, so the bounds hold only if the
further terms carry x's remaining bits. Compiled for cuda-sm90, IREE puts the bf16 products on
tensor cores (the NVVM mma intrinsic on bf16 in the kernels' LLVM IR)."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from day0.frontend.ir import new_context, parse_module
from day0.passes.pipeline import run_pipeline

M, K, N, H, D, R = 64, 256, 96, 4, 16, 64


class _Proj(torch.nn.Module):
    def forward(self, x, w, q, kv):
        y = F.linear(x, w.float())  # [M, N]
        wk = kv.float().view(H, 2 * D, R)[:, :D]  # [H, D, R], a head slice of the weight
        a = torch.bmm(q.transpose(0, 1), wk)  # [H, M, R]
        c = torch.mm(w.float(), x.T)  # [N, M]: the f32 operand on the right, stacked along columns
        return y, a, c


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.exp(torch.randn(M, 1, generator=g))
    w = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    q = torch.randn(M, H, D, generator=g)
    kv = (torch.randn(H * 2 * D, R, generator=g) * 0.05).to(torch.bfloat16)
    return x, w, q, kv


def _bf16(t):
    import ml_dtypes

    return t.float().numpy().astype(ml_dtypes.bfloat16)  # exact: t holds bf16 values


def _reference(x, w, q, kv):
    y = x.double() @ w.double().T
    wk = kv.double().view(H, 2 * D, R)[:, :D]
    return y, torch.bmm(q.double().transpose(0, 1), wk), y.T


def _rewritten(terms: int, stack_rows: int = 0) -> str:
    from torch_mlir import fx

    text = str(fx.export_and_import(_Proj(), *_inputs(0), output_type="raw"))
    ctx = new_context()
    with ctx:
        m = parse_module(text, ctx)
        run_pipeline(m, f"builtin.module(matmul-to-bf16-terms{{terms={terms} stack-rows={stack_rows}}})")
        return str(m)


@pytest.mark.parametrize("terms,bound,stack", [(3, 1e-6, False), (2, 1e-5, False), (3, 1e-6, True), (2, 1e-5, True)])
def test_bf16_terms_match_float64(tmp_path: Path, terms, bound, stack):
    from day0.lowering.compile import compile_mlir
    from day0.runtime.vm import VmModule

    rewritten = _rewritten(terms, M * terms if stack else 0)
    products = 1 if stack else terms
    assert rewritten.count("linalg.matmul") == 2 * products and rewritten.count("linalg.batch_matmul") == products
    assert "torch.aten.mm" not in rewritten and "torch.aten.bmm" not in rewritten
    compile_mlir(rewritten, "llvm-cpu", tmp_path / "m.vmfb")
    fn = VmModule.load(tmp_path / "m.vmfb").function("main")
    for seed in (1, 2):
        x, w, q, kv = _inputs(seed)
        got = fn(x.numpy(), _bf16(w), q.numpy(), _bf16(kv))
        for g, want in zip(got, _reference(x, w, q, kv), strict=True):
            want = want.numpy()
            g = np.asarray(g.to_host())
            err = np.abs(g - want).max() / np.abs(want).max()
            assert err < bound, err
    # what one bf16 term would give: the bound above is meaningful
    one_term = x.to(torch.bfloat16).double() @ w.double().T
    want = _reference(x, w, q, kv)[0]
    assert (one_term - want).abs().max() / want.abs().max() > 1e-4


def test_bf16_terms_run_on_tensor_cores(tmp_path: Path):
    from day0.lowering.compile import compile_mlir

    compile_mlir(
        _rewritten(3),
        "cuda-sm90",
        tmp_path / "m.vmfb",
        extra_flags=[f"--iree-hal-dump-executable-intermediates-to={tmp_path / 'ir'}"],
    )
    llvm_ir = "".join(p.read_text() for p in (tmp_path / "ir").glob("*.optimized.ll"))
    assert "@llvm.nvvm.mma.m16n8k16.row.col.bf16" in llvm_ir  # mma.sync on bf16, f32 accumulators


def test_stacked_terms_are_one_dispatch_each():
    """Stacked, each product compiles for cuda-sm90 to three dispatches: the terms (one generic
    writing them stacked), the product, the sum of its slices: 9 for this module, where a generic
    per term and an insert_slice each took 21 (and one product per term 18). The launches of a
    64-sequence decode step: docs/perf.md."""
    from day0.lowering.compile import compile_to_phase

    flow = compile_to_phase(_rewritten(3, M * 3), "cuda-sm90", "flow")
    assert flow.count("flow.dispatch @") == 3 * 3
