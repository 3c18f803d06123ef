"""day0's top-k tie rule: among equal scores the lower position wins, in the eager model and in
the compiled graph (aten.topk rewritten to iree_linalg_ext.topk), and -inf slots become -1."""

from pathlib import Path

import numpy as np
import torch

from day0.models.dsa_indexer import select_topk


def test_eager_lower_index_wins_ties():
    scores = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    assert select_topk(scores, 4).tolist() == [[1, 2, 4, 0], [0, 1, 2, 3]]


def test_eager_invisible_slots_are_empty():
    scores = torch.tensor([[2.0, 1.0, float("-inf"), float("-inf")]])
    assert select_topk(scores, 3).tolist() == [[0, 1, -1]]


def test_compiled_selection_equals_eager_on_ties(tmp_path):
    """The exported select_topk (aten.topk) compiled by day0's pipeline picks the same rows."""
    from torch_mlir import fx

    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.passes.pipeline import run_pipeline
    from day0.runtime.vm import VmModule

    class Select(torch.nn.Module):
        def forward(self, x):
            return select_topk(x, 5)

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (9, 16), generator=g).float()  # many exact ties
    x[0, 4:] = float("-inf")  # fewer finite values than k
    seq = torch.export.Dim("s", min=2, max=64)
    m = fx.export_and_import(Select(), x, output_type="raw", dynamic_shapes=({0: seq},), func_name="main")
    with new_context():
        module = parse_module(str(m))
        run_pipeline(module, "builtin.module(topk-to-linalg-ext)")
        text = str(module)
    compile_mlir(text, "llvm-cpu", tmp_path / "m.vmfb")
    got = VmModule.load(Path(tmp_path / "m.vmfb")).function("main")(x.numpy()).to_host()
    np.testing.assert_array_equal(got, select_topk(x, 5).numpy())
