"""topk-to-linalg-ext numerics: the rewritten topk, compiled by IREE (llvm-cpu), selects exactly
what a stable sort selects: the k largest (or smallest), equal values in index order, -inf
positions in index order when a row has fewer than k finite values.

Every case is one function of a single module, compiled once per test module. The reference is
`torch.sort(x, descending=largest, stable=True)[..., :k]`, compared exactly (indices and values).
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from day0.frontend.ir import StringAttr, new_context, parse_module
from day0.passes.pipeline import run_pipeline

N = 64  # row length of the masked pair (the reproducer's shape)


class _TopK(torch.nn.Module):
    def __init__(self, k: int, largest: bool = True, sorted: bool = True):
        super().__init__()
        self.k, self.largest, self.sorted = k, largest, sorted

    def forward(self, x):
        r = torch.topk(x, self.k, largest=self.largest, sorted=self.sorted)
        return r.values, r.indices


class _MaskedPair(torch.nn.Module):
    """Two topk's over rows masked by one causal mask, S dynamic: IREE's sort lowering of this
    returned wrong indices for the second topk (rows >= 6)."""

    def forward(self, x, y):
        visible = torch.arange(N)[None, :] <= torch.arange(x.shape[0])[:, None]  # [S, N]
        a = torch.topk(x.masked_fill(~visible, float("-inf")), 6)
        b = torch.topk(y.masked_fill(~visible, float("-inf")), 6)
        return a.values, a.indices, b.values, b.indices


def _dim(name: str):
    return torch.export.Dim(name, min=2, max=64)


# name -> (module, example inputs, dynamic shapes)
CASES = {
    "rows": (_TopK(5), (torch.zeros(8, 48),), ({0: _dim("s")},)),
    "smallest": (_TopK(5, largest=False), (torch.zeros(8, 48),), ({0: _dim("s")},)),
    "unsorted": (_TopK(5, sorted=False), (torch.zeros(8, 48),), ({0: _dim("s")},)),
    "whole_row": (_TopK(16), (torch.zeros(8, 16),), None),
    "rank1": (_TopK(7), (torch.zeros(40),), None),
    "rank3": (_TopK(4), (torch.zeros(3, 2, 20),), ({0: _dim("b")},)),
    "masked_pair": (_MaskedPair(), (torch.zeros(12, N), torch.zeros(12, N)), ({0: _dim("s")}, {0: _dim("s")})),
}


def _export(name: str) -> str:
    from torch_mlir import fx

    module, args, dynamic = CASES[name]
    return str(fx.export_and_import(module, *args, output_type="raw", dynamic_shapes=dynamic))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """name -> callable(*tensors) -> tuple of np.ndarray, all from one compiled module."""
    from day0.lowering.compile import compile_mlir
    from day0.runtime.vm import VmModule

    ctx = new_context()
    combined = parse_module("module {}", ctx)
    with ctx:
        for name in CASES:
            m = parse_module(_export(name), ctx)
            run_pipeline(m, "builtin.module(topk-to-linalg-ext)")
            assert "torch.aten.topk" not in str(m), name
            assert "iree_linalg_ext.topk" in str(m), name
            for func in list(m.body.operations):
                func.attributes["sym_name"] = StringAttr.get(name)
                func.detach_from_parent()
                combined.body.append(func)
        text = str(combined)
    vmfb = Path(tmp_path_factory.mktemp("topk")) / "topk.vmfb"
    compile_mlir(text, "llvm-cpu", vmfb)
    vm = VmModule.load(vmfb)

    def call(name, *args):
        out = vm.function(name)(*(a.numpy() for a in args))
        return tuple(np.asarray(o.to_host()) for o in (out if isinstance(out, tuple) else (out,)))

    return call


def _reference(x: torch.Tensor, k: int, largest: bool = True):
    values, indices = torch.sort(x, dim=-1, descending=largest, stable=True)
    return values[..., :k].numpy(), indices[..., :k].numpy()


def _assert_same(got, x, k, largest=True):
    values, indices = got
    want_values, want_indices = _reference(x, k, largest)
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(values, want_values)


def _rows(kind: str, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(*shape, generator=g)
    # many exact ties: four distinct values, plus all-equal and two-valued rows
    x = torch.randint(0, 4, shape, generator=g).float()
    if len(shape) >= 2:
        x[0] = 1.0
        x[1] = torch.where(torch.arange(shape[-1]) % 3 == 0, 2.0, 0.5)
    return x


@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("S", [2, 9, 33])
def test_rows(compiled, kind, S):
    x = _rows(kind, (S, 48), seed=S)
    _assert_same(compiled("rows", x), x, 5)


@pytest.mark.parametrize("kind", ["random", "ties"])
def test_smallest(compiled, kind):
    x = _rows(kind, (9, 48), seed=1)
    _assert_same(compiled("smallest", x), x, 5, largest=False)


@pytest.mark.parametrize("kind", ["random", "ties"])
def test_unsorted_comes_out_sorted(compiled, kind):
    # sorted=False allows any order; the rewrite still returns stable-sort order.
    x = _rows(kind, (9, 48), seed=2)
    _assert_same(compiled("unsorted", x), x, 5)


@pytest.mark.parametrize("kind", ["random", "ties"])
def test_k_equals_row_length(compiled, kind):
    x = _rows(kind, (8, 16), seed=3)
    _assert_same(compiled("whole_row", x), x, 16)


@pytest.mark.parametrize("kind", ["random", "ties"])
def test_rank1(compiled, kind):
    x = _rows(kind, (40,), seed=4)
    _assert_same(compiled("rank1", x), x, 7)


def test_rank3_dynamic_batch(compiled):
    x = _rows("ties", (5, 2, 20), seed=5)
    _assert_same(compiled("rank3", x), x, 4)


def test_infinities(compiled):
    # -inf and +inf as ordinary values, rows with fewer than k finite values, all -inf rows.
    x = _rows("random", (6, 48), seed=6)
    x[0, :] = float("-inf")
    x[1, 3:] = float("-inf")  # 3 finite values < k = 5
    x[2, ::2] = float("inf")
    x[3, 10] = float("-inf")
    _assert_same(compiled("rows", x), x, 5)
    _assert_same(compiled("smallest", x), x, 5, largest=False)


@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("S", [12, 40])
def test_masked_pair(compiled, kind, S):
    """The reproducer: rows 0..4 have fewer than k = 6 visible positions (so -inf ties), both
    topk's share the mask; every row of both outputs must be the stable-sort selection."""
    x, y = _rows(kind, (S, N), seed=10 + S), _rows(kind, (S, N), seed=20 + S)
    got = compiled("masked_pair", x, y)
    visible = torch.arange(N)[None, :] <= torch.arange(S)[:, None]
    for (values, indices), t in ((got[0:2], x), (got[2:4], y)):
        _assert_same((values, indices), t.masked_fill(~visible, float("-inf")), 6)
