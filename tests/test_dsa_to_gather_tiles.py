"""dsa-to-gather-tiles numerics: the rewritten op, compiled by IREE (llvm-cpu), matches the eager op.

Every (form, tile) variant becomes one function of a single module, compiled once per session:
decode (S = 1), static prefill (S = 5) and dynamic-S prefill (torch.export.Dim), tiles 4, 8, K.
The indices include -1 slots, a whole tile of -1 and a query whose slots are all -1.
"""

import numpy as np
import pytest
import torch

import day0.frontend.ops  # noqa: F401  (registers torch.ops.day0.*)
from day0.frontend.ir import StringAttr, new_context, parse_module
from day0.passes.pipeline import run_pipeline

H, D, T, K, V = 2, 16, 24, 16, 8
SCALE = 0.3
TILES = (4, 8, K)
FORMS = ("decode", "prefill", "dynamic")


class _Dsa(torch.nn.Module):
    def forward(self, q, kv, idx):
        return torch.ops.day0.dsa_attention(q, kv, idx, SCALE, V)


def _indices(S: int, gen: torch.Generator) -> torch.Tensor:
    idx = torch.randint(0, T, (S, K), generator=gen)
    idx[:, 1] = -1  # a scattered empty slot
    idx[0, 4:8] = -1  # a whole tile of 4 empty
    if S > 1:
        idx[1, :8] = -1  # a whole tile of 8 empty (the first one: state starts empty)
    if S > 2:
        idx[2, :] = -1  # a query with no slot at all -> zeros
    return idx


def _export(form: str) -> str:
    from torch_mlir import fx

    S = 1 if form == "decode" else 5
    q, kv, idx = torch.zeros(S, H, D), torch.zeros(T, D), torch.zeros(S, K, dtype=torch.long)
    dynamic = None
    if form == "dynamic":
        s = torch.export.Dim("S", min=2, max=64)
        dynamic = {"q": {0: s}, "kv": None, "idx": {0: s}}
    return str(fx.export_and_import(_Dsa(), q, kv, idx, output_type="raw", dynamic_shapes=dynamic))


@pytest.fixture(scope="module")
def compiled():
    """{(form, tile): callable(q, kv, idx) -> np.ndarray}, all from one compiled module."""
    import iree.compiler as ireec
    import iree.runtime as ireert

    ctx = new_context()
    combined = parse_module("module {}", ctx)
    with ctx:
        for form in FORMS:
            text = _export(form)
            for tile in TILES:
                m = parse_module(text, ctx)
                run_pipeline(m, f"builtin.module(dsa-to-gather-tiles{{tile={tile}}})")
                assert "torch.day0" not in str(m)
                for func in list(m.body.operations):
                    func.attributes["sym_name"] = StringAttr.get(f"{form}_t{tile}")
                    func.detach_from_parent()
                    combined.body.append(func)
    vmfb = ireec.compile_str(
        str(combined),
        input_type="torch",
        target_backends=["llvm-cpu"],
        extra_args=["--iree-llvmcpu-target-cpu=host"],
    )
    module = ireert.load_vm_flatbuffer(vmfb, backend="llvm-cpu")

    def fn(form, tile):
        f = module[f"{form}_t{tile}"]
        return lambda *args: np.asarray(f(*(a.numpy() for a in args)).to_host())

    return fn


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("form,S", [("decode", 1), ("prefill", 5), ("dynamic", 5), ("dynamic", 3)])
def test_matches_eager(compiled, form, S, tile):
    gen = torch.Generator().manual_seed(1000 * S + tile)
    q = torch.randn(S, H, D, generator=gen)
    kv = torch.randn(T, D, generator=gen)
    idx = _indices(S, gen)
    expected = torch.ops.day0.dsa_attention(q, kv, idx, SCALE, V).numpy()
    got = compiled(form, tile)(q, kv, idx)
    assert got.shape == expected.shape
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    if S > 2:
        assert (got[2] == 0).all()  # all slots empty -> zeros, not NaN


def test_bf16_io_accumulates_in_f32():
    """bf16 q/kv, f32 output: scores, softmax and sums run in f32 on the widened (exact) inputs and
    the result is not rounded to bf16, so only f32 summation order is left (in bf16 the sums over
    512 slots drift by ~1-2%)."""
    import iree.compiler as ireec
    import iree.runtime as ireert
    import ml_dtypes
    from torch_mlir import fx

    h, d, t, k, v = 4, 64, 1024, 512, 32

    class Dsa(torch.nn.Module):
        def forward(self, q, kv, idx):
            return torch.ops.day0.dsa_attention(q, kv, idx, 0.125, v)

    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, h, d, generator=gen).to(torch.bfloat16)
    kv = (torch.randn(t, d, generator=gen) * 2).to(torch.bfloat16)
    idx = torch.randperm(t, generator=gen)[:k].reshape(1, k)
    with new_context():
        m = parse_module(str(fx.export_and_import(Dsa(), q, kv, idx, output_type="raw")))
        run_pipeline(m, "builtin.module(dsa-to-gather-tiles{tile=64})")
        text = str(m)
    assert "bf16" in text and "f32" in text  # widened inside
    vmfb = ireec.compile_str(
        text, input_type="torch", target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=host"]
    )
    f = ireert.load_vm_flatbuffer(vmfb, backend="llvm-cpu")["main"]
    bf = lambda x: x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)  # noqa: E731
    got = np.asarray(f(bf(q), bf(kv), idx.numpy()).to_host())
    assert got.dtype == np.float32  # the op's result is f32 for bf16 io too
    want = torch.ops.day0.dsa_attention(q.float(), kv.float(), idx, 0.125, v).numpy()
    assert np.array_equal(torch.ops.day0.dsa_attention(q, kv, idx, 0.125, v).numpy(), want)  # eager: widened
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()  # f32 order only, no bf16 rounding


@pytest.mark.parametrize("S", [1, 5])
def test_bf16_roundings_survive_a_fused_consumer(S):
    """As SparseMLA uses it with bf16 caches: an f32 query narrowed to bf16, the f32 result fed to a
    matmul. IREE's CPU codegen drops a truncf -> extf pair inside one dispatch, which would lose
    the query's bf16 rounding (the result's, when the op still rounded it, was ~2e-2 off here);
    the pass rounds q on the bits instead."""
    import iree.compiler as ireec
    import iree.runtime as ireert
    import ml_dtypes
    from torch_mlir import fx

    h, d, t, k, v = 4, 40, 64, 8, 32
    gen = torch.Generator().manual_seed(S)
    w = torch.randn(h, 16, v, generator=gen)

    class Mla(torch.nn.Module):
        def forward(self, q, kv, idx):
            o = torch.ops.day0.dsa_attention(q.to(torch.bfloat16), kv, idx, 0.2, v)  # f32
            return torch.einsum("shr,hvr->shv", o, w)

    q = torch.randn(S, h, d, generator=gen) * 3
    kv = torch.randn(t, d, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, t, (S, k), generator=gen)
    with new_context():
        m = parse_module(str(fx.export_and_import(Mla(), q, kv, idx, output_type="raw")))
        run_pipeline(m, "builtin.module(dsa-to-gather-tiles)")
        text = str(m)
    vmfb = ireec.compile_str(
        text,
        input_type="torch",
        target_backends=["llvm-cpu"],
        extra_args=[
            "--iree-llvmcpu-target-cpu=host",
            "--iree-opt-level=O3",
            "--iree-dispatch-creation-enable-aggressive-fusion",
        ],
    )
    f = ireert.load_vm_flatbuffer(vmfb, backend="llvm-cpu")["main"]
    kv_np = kv.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    got = np.asarray(f(q.numpy(), kv_np, idx.numpy()).to_host())
    want = Mla()(q, kv, idx).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=0)


def _block_indices(S: int, n: int, block: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """glm5_next-shaped selections [S, n·block + block − 1]: n whole aligned blocks (or -1 blocks)
    then a tail block's first few positions (-1 after them), as the k-pool indexer emits."""
    rows = []
    for s in range(S):
        pools = torch.randperm(t // block, generator=gen)[:n]
        slots = (pools[:, None] * block + torch.arange(block)).reshape(-1)
        if s % 3 == 1:
            slots[:block] = -1  # an empty pool
        tail_pool = int(torch.randint(0, t // block, (1,), generator=gen))
        count = s % block  # 0 .. block-1 visible tail tokens
        tail = torch.where(torch.arange(block - 1) < count, tail_pool * block + torch.arange(block - 1), -1)
        rows.append(torch.cat([slots, tail]))
    return torch.stack(rows)


@pytest.mark.parametrize("block", [4, 8])
def test_block_tiles_match_eager(block):
    """block=B: pool-sized tiles gathered as aligned blocks equal the eager op on block-structured
    selections (decode and dynamic-S prefill, an empty pool, an empty and a partial tail)."""
    import iree.compiler as ireec
    import iree.runtime as ireert
    from torch_mlir import fx

    n, t = 3, 32
    k = n * block + block - 1
    ctx = new_context()
    combined = parse_module("module {}", ctx)
    with ctx:
        for form, S in (("decode", 1), ("dynamic", 5)):
            dynamic = None
            if form == "dynamic":
                s = torch.export.Dim("S", min=2, max=64)
                dynamic = {"q": {0: s}, "kv": None, "idx": {0: s}}
            args = (torch.zeros(S, H, D), torch.zeros(t, D), torch.zeros(S, k, dtype=torch.long))
            m = parse_module(str(fx.export_and_import(_Dsa(), *args, output_type="raw", dynamic_shapes=dynamic)), ctx)
            run_pipeline(m, f"builtin.module(dsa-to-gather-tiles{{block={block}}})")
            assert "torch.day0" not in str(m)
            for func in list(m.body.operations):
                func.attributes["sym_name"] = StringAttr.get(form)
                func.detach_from_parent()
                combined.body.append(func)
    vmfb = ireec.compile_str(
        str(combined), input_type="torch", target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=host"]
    )
    module = ireert.load_vm_flatbuffer(vmfb, backend="llvm-cpu")
    gen = torch.Generator().manual_seed(block)
    for form, S in (("decode", 1), ("dynamic", 5), ("dynamic", 7)):
        q, kv = torch.randn(S, H, D, generator=gen), torch.randn(t, D, generator=gen)
        idx = _block_indices(S, n, block, t, gen)
        want = torch.ops.day0.dsa_attention(q, kv, idx, SCALE, V).numpy()
        got = np.asarray(module[form](q.numpy(), kv.numpy(), idx.numpy()).to_host())
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
