"""runtime/vm.py: parameters from safetensors shards, devices, in-place state."""

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_lowering import LINEAR, stacked_experts_module

from day0.lowering.compile import compile_mlir
from day0.runtime.vm import VmModule

# new_cache = cache.index_copy(0, pos, x[None]); also returns new_cache.sum(0).
# (torch-mlir's raw import of that torch code, verbatim.)
STATE_STEP = """
module {
  func.func @step(%arg0: !torch.vtensor<[16,8],f32>, %arg1: !torch.vtensor<[1],si64>, %arg2: !torch.vtensor<[8],f32>) -> (!torch.vtensor<[16,8],f32>, !torch.vtensor<[8],f32>) {
    %int0 = torch.constant.int 0
    %0 = torch.aten.unsqueeze %arg2, %int0 : !torch.vtensor<[8],f32>, !torch.int -> !torch.vtensor<[1,8],f32>
    %1 = torch.prim.ListConstruct %arg1 : (!torch.vtensor<[1],si64>) -> !torch.list<optional<vtensor>>
    %false = torch.constant.bool false
    %2 = torch.aten.index_put %arg0, %1, %0, %false : !torch.vtensor<[16,8],f32>, !torch.list<optional<vtensor>>, !torch.vtensor<[1,8],f32>, !torch.bool -> !torch.vtensor<[16,8],f32>
    %3 = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
    %none = torch.constant.none
    %4 = torch.aten.sum.dim_IntList %2, %3, %false, %none : !torch.vtensor<[16,8],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[8],f32>
    return %2, %4 : !torch.vtensor<[16,8],f32>, !torch.vtensor<[8],f32>
  }
}
"""

rng = np.random.default_rng(0)


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    """The LINEAR module compiled, its weight in one shard and its bias in another."""
    d = tmp_path_factory.mktemp("linear")
    w = rng.standard_normal((8, 4), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    save_file({"layer.weight": w}, d / "model-00001-of-00002.safetensors")
    save_file({"layer.bias": b}, d / "model-00002-of-00002.safetensors")
    compile_mlir(LINEAR, "llvm-cpu", d / "model.vmfb")
    shards = sorted(d.glob("*.safetensors"))
    return d / "model.vmfb", shards, w, b


def test_parameters_from_two_safetensors_shards(linear):
    vmfb, shards, w, b = linear
    vm = VmModule.load(vmfb, shards)
    x = rng.standard_normal((2, 4), dtype=np.float32)
    y = vm.function("main")(x)
    np.testing.assert_allclose(y.to_host(), x @ w.T + b, rtol=1e-5, atol=1e-6)
    assert vm.function_names == ["main"]


def test_missing_parameter_names_the_key(linear):
    vmfb, shards, _, _ = linear
    with pytest.raises(RuntimeError, match="no parameter found in index with key 'layer.bias'"):
        VmModule.load(vmfb, shards[:1])


def test_wrong_scope_fails_at_load(linear):
    vmfb, shards, _, _ = linear
    with pytest.raises(RuntimeError, match="parameter scope 'weights'"):
        VmModule.load(vmfb, shards, scope="weights")


def test_unknown_function_lists_exports(linear):
    vmfb, shards, _, _ = linear
    with pytest.raises(KeyError, match="no function 'decode'.*exports: main"):
        VmModule.load(vmfb, shards).function("decode")


def test_unknown_device_lists_known_ones(linear):
    vmfb, shards, _, _ = linear
    with pytest.raises(ValueError, match="unknown device 'gpu'; known devices: local-task, local-sync, cuda"):
        VmModule.load(vmfb, shards, device="gpu")


def test_cuda_unavailable_is_a_clear_error(linear):
    from iree import runtime as rt

    try:
        rt.get_device("cuda")
        pytest.skip("a CUDA device is present")
    except Exception:
        pass
    vmfb, shards, _, _ = linear
    with pytest.raises(RuntimeError, match="device 'cuda'"):
        VmModule.load(vmfb, shards, device="cuda")


def test_stacked_experts_across_shards(tmp_path):
    """Per-expert tensors in two shards, stacked (hoisted, at load) and selected per call."""
    experts = [rng.standard_normal((16, 8), dtype=np.float32) for _ in range(4)]
    save_file({f"experts.{e}.weight": experts[e] for e in (0, 1)}, tmp_path / "a.safetensors")
    save_file({f"experts.{e}.weight": experts[e] for e in (2, 3)}, tmp_path / "b.safetensors")
    compile_mlir(stacked_experts_module(), "llvm-cpu", tmp_path / "moe.vmfb")
    vm = VmModule.load(
        tmp_path / "moe.vmfb", [tmp_path / "a.safetensors", tmp_path / "b.safetensors"], device="local-sync"
    )
    main = vm.function("main")
    x = rng.standard_normal((2, 8, 1), dtype=np.float32)
    for idx in ([3, 0], [1, 2]):
        y = main(x, np.array(idx, np.int64)).to_host()
        expected = np.stack([experts[i] @ x[j] for j, i in enumerate(idx)])
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def _address(array) -> int:
    mapped = array._buffer_view.get_buffer().map()
    return mapped.asarray(array.shape, np.dtype(array.dtype)).__array_interface__["data"][0]


@pytest.mark.parametrize("device", ["local-task", "local-sync"])
def test_state_is_updated_in_place(tmp_path, device):
    compile_mlir(STATE_STEP, "llvm-cpu", tmp_path / "step.vmfb")
    vm = VmModule.load(tmp_path / "step.vmfb", [], device=device)
    step = vm.function("step")
    host = np.zeros((16, 8), np.float32)
    step(host, np.array([3], np.int64), np.ones(8, np.float32))
    assert not host.any()  # numpy arguments are copied, never written

    expected = np.zeros((16, 8), np.float32)
    cache = first = vm.to_device(expected)
    for t in range(5):
        x = np.full(8, t + 1, np.float32)
        new_cache, total = step(cache, np.array([t], np.int64), x)
        expected[t] = x
        assert _address(new_cache) == _address(cache)  # tied: the same buffer comes back
        np.testing.assert_array_equal(total.to_host(), expected.sum(0))
        cache = new_cache
    np.testing.assert_array_equal(cache.to_host(), expected)
    np.testing.assert_array_equal(first.to_host(), expected)  # the argument was consumed
