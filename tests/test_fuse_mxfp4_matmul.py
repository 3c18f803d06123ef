"""fuse-mxfp4-matmul numerics and dispatch structure.

(a) The rewritten `day0::mxfp4_linear` / `mxfp4_moe`, compiled by IREE (llvm-cpu), match the
eager reference kernels of day0.frontend.ops within 1e-5 (relative to the output's max) on
random packed bytes and scales near 127: decode (M = 1), prefill (M = 5, both prefill forms),
moe decode (T = 1, k = 2 of E = 4) and moe prefill (T = 3).
(b) At IREE's flow level a decode function has ONE dispatch per matmul (one contraction
dispatch reading the packed bytes) and no tensor of the weight's unpacked shape.

Each prefill form is one module of several functions, compiled once per test module.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import day0.frontend.ops  # noqa: F401  (registers torch.ops.day0.*)
from day0.frontend.ir import StringAttr, new_context, parse_module
from day0.passes.pipeline import run_pipeline

N, K, E, TOPK = 64, 128, 4, 2


class _Linear(torch.nn.Module):
    def forward(self, x, packed, scales):
        return torch.ops.day0.mxfp4_linear(x, packed, scales)


class _Moe(torch.nn.Module):
    def forward(self, x, packed, scales, experts):
        return torch.ops.day0.mxfp4_moe(x, packed, scales, experts)


def _weights(*lead, seed=0):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (*lead, N, K // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 135, (*lead, N, K // 32), generator=g, dtype=torch.uint8)
    return packed, scales


def _x(rows, seed=1):
    return torch.randn(rows, K, generator=torch.Generator().manual_seed(seed))


def _experts(rows, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(rows)])


_ROWS = torch.export.Dim("rows", min=2, max=64)
# name -> (module, example args, dynamic shapes)
CASES = {
    "linear_decode": (_Linear(), (_x(1), *_weights()), None),
    "linear_prefill": (_Linear(), (_x(5), *_weights()), ({0: _ROWS}, None, None)),
    "moe_decode": (_Moe(), (_x(1), *_weights(E), _experts(1)), None),
    "moe_prefill": (_Moe(), (_x(3), *_weights(E), _experts(3)), ({0: _ROWS}, None, None, {0: _ROWS})),
}


def _export(name: str) -> str:
    from torch_mlir import fx

    module, args, dynamic = CASES[name]
    return str(fx.export_and_import(module, *args, output_type="raw", dynamic_shapes=dynamic))


def _rewritten(names, pipeline: str) -> str:
    """One module holding the rewritten function of every case in `names`, named after it."""
    ctx = new_context()
    combined = parse_module("module {}", ctx)
    with ctx:
        for name in names:
            m = parse_module(_export(name), ctx)
            run_pipeline(m, pipeline)
            assert "torch.day0." not in str(m), name
            for func in list(m.body.operations):
                func.attributes["sym_name"] = StringAttr.get(name)
                func.detach_from_parent()
                combined.body.append(func)
        return str(combined)


@pytest.fixture(scope="module", params=["unfused", "fused"])
def compiled(request, tmp_path_factory):
    """(prefill form, name -> callable(*tensors) -> np.ndarray), one compiled module per form."""
    from day0.lowering.compile import compile_mlir
    from day0.runtime.vm import VmModule

    form = request.param
    text = _rewritten(CASES, f"builtin.module(fuse-mxfp4-matmul{{prefill={form}}})")
    vmfb = Path(tmp_path_factory.mktemp("mxfp4")) / f"{form}.vmfb"
    compile_mlir(text, "llvm-cpu", vmfb)
    vm = VmModule.load(vmfb)

    def call(name, *args):
        return np.asarray(vm.function(name)(*(a.numpy() for a in args)).to_host())

    return form, call


def _assert_close(got, want):
    want = want.numpy()
    assert got.shape == want.shape
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-5, err


def test_linear_decode(compiled):
    _, call = compiled
    x, (packed, scales) = _x(1, seed=11), _weights(seed=12)
    _assert_close(call("linear_decode", x, packed, scales), torch.ops.day0.mxfp4_linear(x, packed, scales))


@pytest.mark.parametrize("rows", [5, 2])
def test_linear_prefill(compiled, rows):
    _, call = compiled
    x, (packed, scales) = _x(rows, seed=13), _weights(seed=14)
    _assert_close(call("linear_prefill", x, packed, scales), torch.ops.day0.mxfp4_linear(x, packed, scales))


def test_moe_decode(compiled):
    _, call = compiled
    x, (packed, scales), experts = _x(1, seed=15), _weights(E, seed=16), _experts(1, seed=17)
    _assert_close(call("moe_decode", x, packed, scales, experts), torch.ops.day0.mxfp4_moe(x, packed, scales, experts))


def test_moe_prefill(compiled):
    _, call = compiled
    x, (packed, scales), experts = _x(3, seed=18), _weights(E, seed=19), _experts(3, seed=20)
    _assert_close(call("moe_prefill", x, packed, scales, experts), torch.ops.day0.mxfp4_moe(x, packed, scales, experts))


def test_every_code_and_sign():
    """All 16 E2M1 codes in both nibbles, scales 1..254: the eager reference's exact values."""
    from day0.frontend.ops import E2M1_VALUES, mxfp4_dequantize

    codes = torch.arange(256, dtype=torch.uint8)  # every (low, high) pair once
    w = mxfp4_dequantize(codes.view(1, 256), torch.full((1, 16), 127, dtype=torch.uint8))
    assert w[0, 0::2].tolist() == [E2M1_VALUES[i % 16] for i in range(256)]


# ---------------------------------------------------------------------------------------------
# (b) flow level: one dispatch per matmul, no unpacked weight


FLOW_N, FLOW_K = 256, 512


class _DecodeLayer(torch.nn.Module):
    """A decode step's two MXFP4 matmuls: a linear and the routed experts."""

    def forward(self, x, packed, scales, e_packed, e_scales, experts):
        h = torch.ops.day0.mxfp4_linear(x, packed, scales)  # [1, 256]
        return torch.ops.day0.mxfp4_moe(h.repeat(1, 2), e_packed, e_scales, experts)  # [1, 2, 256]


def test_decode_flow_one_dispatch_per_matmul():
    from torch_mlir import fx

    from day0.lowering.compile import compile_to_phase

    g = torch.Generator().manual_seed(0)
    args = (
        torch.randn(1, FLOW_K, generator=g),
        torch.zeros(FLOW_N, FLOW_K // 2, dtype=torch.uint8),
        torch.zeros(FLOW_N, FLOW_K // 32, dtype=torch.uint8),
        torch.zeros(E, FLOW_N, FLOW_K // 2, dtype=torch.uint8),
        torch.zeros(E, FLOW_N, FLOW_K // 32, dtype=torch.uint8),
        torch.zeros(1, TOPK, dtype=torch.int64),
    )
    with new_context():
        m = parse_module(str(fx.export_and_import(_DecodeLayer(), *args, output_type="raw")))
        run_pipeline(m, "builtin.module(fuse-mxfp4-matmul)")
        text = str(m)
    flow = compile_to_phase(text, "llvm-cpu", "flow")
    dispatches = [line.strip() for line in flow.splitlines() if "flow.dispatch @" in line]
    # the contractions: the dispatches that read packed bytes (the moe one also gathers them)
    contractions = [d for d in dispatches if re.search(r"xi8>", d.split(" : ")[-1])]
    assert len(contractions) == 2, "\n".join(dispatches)
    assert all("reduction" in d for d in contractions), "\n".join(contractions)
    for unpacked in (f"{FLOW_N}x{FLOW_K}xf32", f"{TOPK}x{FLOW_N}x{FLOW_K}xf32", f"{FLOW_N}x{FLOW_K // 32}x16x2xf32"):
        assert unpacked not in flow, unpacked
