"""runtime/step_call.py's caller-provided transient memory, on a module compiled the way cuda-sm90
artifacts are (`--iree-torch-externalize-transients`, lowering/targets.py), here for llvm-cpu:
the entry point takes a `!hal.buffer` after its arguments whose size a query function of the
module computes from the call's shapes."""

import warnings

import numpy as np
import pytest
import torch
from torch.export import Dim

from day0.lowering.compile import compile_mlir
from day0.runtime.step_call import StepCaller
from day0.runtime.vm import VmModule


class _Mix(torch.nn.Module):
    """Two dispatches with an [n, n] intermediate between them: transient memory growing with n."""

    def forward(self, ids):
        x = ids.float()
        weights = torch.softmax(torch.outer(x, x).sin(), dim=1)
        return weights @ x, ids.flip(0)


def _reference(ids: np.ndarray):
    x = ids.astype(np.float64)
    m = np.sin(np.outer(x, x))
    w = np.exp(m - m.max(1, keepdims=True))
    return (w / w.sum(1, keepdims=True)) @ x, ids[::-1]


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    from torch_mlir import fx

    n = Dim("n", min=2, max=4096)
    with warnings.catch_warnings():  # torch's own pytree code trips its LeafSpec deprecation
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        module = fx.export_and_import(_Mix(), torch.arange(8), dynamic_shapes=({0: n},), func_name="main")
    out = tmp_path_factory.mktemp("transients") / "m.vmfb"
    compile_mlir(str(module), "llvm-cpu", out, extra_flags=("--iree-torch-externalize-transients",))
    return VmModule.load(out)


def test_the_caller_sizes_and_passes_the_transient_buffer(vm):
    function = vm.async_function("main")
    assert "iree.abi.transients.size" in function.reflection  # a dynamic size: the query runs
    assert vm.function_names == ["main"]  # the query is not an entry point
    caller = StepCaller(vm, [512])
    sizes = []
    for n in (8, 512, 16):  # the buffer grows for 512 and is kept for 16
        ids = np.random.default_rng(n).integers(-3, 4, n)
        (mixed, flipped), state = caller("main", [ids], [], (0, 1))
        want_mixed, want_flipped = _reference(ids)
        np.testing.assert_allclose(mixed, want_mixed, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(flipped, want_flipped)
        assert state == []
        sizes.append(caller._transients._bytes)
    query = caller._transients._sizes
    assert query[("main", (8,))] < query[("main", (512,))]  # the module's own size function
    assert sizes[0] < sizes[1] == sizes[2] >= query[("main", (512,))]
