"""ops.materialize, the fusion boundary cuda-sm90 keeps (frontend/ops.py): identity in eager and
for targets that do not keep it (no trace of it in the export); kept, it becomes
util.optimization_barrier (passes/materialize_to_barrier.py) and iree-compile takes the result for
cuda-sm90 with a dynamic row count (the prefill's case: its dims are tied to the input's)."""

import numpy as np
import torch
from torch.export import Dim

from day0.frontend import ops


class SliceRope(torch.nn.Module):
    """A column slice of a matmul, materialized, then a gather from it (the cache row's shape)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(24, 16, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        y = ops.materialize((x @ self.w.T)[:, 8:])
        return y.index_select(-1, torch.tensor([1, 0, 3, 2] * 4)) * y.pow(2).mean(-1, keepdim=True).rsqrt()


def _mlir(keep: tuple[str, ...]) -> str:
    from torch_mlir import ir as tm_ir
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    from torch_mlir.extras.fx_importer import FxImporter

    x = torch.randn(4, 16)
    with torch.no_grad(), ops.keeping(keep):
        program = torch.export.export(SliceRope(), (x,), dynamic_shapes=({0: Dim("s", min=2, max=64)},), strict=False)
    program = program.run_decompositions(get_decomposition_table())
    context = tm_ir.Context()
    torch_d.register_dialect(context)
    importer = FxImporter(context=context)
    importer.import_program(program, func_name="main")
    return str(importer.module_op)


def test_identity_in_eager_and_unkept_exports():
    m, x = SliceRope(), torch.randn(5, 16)
    with ops.keeping(("materialize",)):
        kept = m(x)
    assert torch.equal(kept, m(x))
    assert "materialize" not in _mlir(())
    assert '"torch.day0.materialize"' in _mlir(("materialize",))


def test_kept_compiles_for_cuda_and_unkept_runs_on_the_cpu(tmp_path):
    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.passes.pipeline import run_pipeline
    from day0.runtime.vm import VmModule

    with new_context():
        module = parse_module(_mlir(("materialize",)))
        run_pipeline(module, "builtin.module(materialize-to-barrier)")
        text = str(module)
    assert "util.optimization_barrier" in text and "flow.tensor.tie_shape" in text
    compile_mlir(text, "cuda-sm90", tmp_path / "cuda.vmfb")  # compiles (no GPU needed)
    assert (tmp_path / "cuda.vmfb").stat().st_size > 0
    compile_mlir(_mlir(()), "llvm-cpu", tmp_path / "cpu.vmfb")
    x = np.random.default_rng(0).standard_normal((7, 16)).astype(np.float32)
    got = VmModule.load(tmp_path / "cpu.vmfb").function("main")(x).to_host()
    np.testing.assert_allclose(got, SliceRope()(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
