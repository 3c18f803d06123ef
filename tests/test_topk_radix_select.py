"""The CUDA radix-select top-k: its committed PTX, the ABI the pass declares for it, the CUDA
pipeline using it, and (on a machine with an NVIDIA GPU) its selection against a stable sort."""

import re
import subprocess
import sys

import pytest

from day0.passes.pipelines import pipeline_for
from day0.passes.topk_to_radix_select import KERNEL_ABI, kernel_ptx
from day0.tools import build_kernels


def _entries(ptx: str) -> dict[str, list[str]]:
    """entry name -> its .param types, from the PTX text."""
    out = {}
    for m in re.finditer(r"\.entry (\w+)\(\s*(.*?)\)", ptx, re.S):
        out[m.group(1)] = re.findall(r"\.param \.(\w+)", m.group(2))
    return out


def test_ptx_declares_the_abi_the_pass_uses():
    entries = _entries(kernel_ptx().decode())
    assert set(entries) == {name for name, *_ in KERNEL_ABI}
    for name, read_only, constants, _ in KERNEL_ABI:
        # IREE's CUDA ABI: one pointer per binding, then one 32-bit value per push constant
        assert entries[name] == ["u64"] * len(read_only) + ["u32"] * constants, name


def test_ptx_targets_sm90_and_is_what_nvcc_makes_of_the_source():
    ptx = kernel_ptx().decode()
    assert re.search(r"^\.target sm_90$", ptx, re.M)
    if build_kernels.nvcc() is None:
        pytest.skip("nvcc not installed: cannot rebuild the PTX to compare")
    if build_kernels.nvcc_release() not in ptx:
        pytest.skip(f"the PTX was built by another nvcc than this one ({build_kernels.nvcc_release()})")
    p = subprocess.run([sys.executable, "-m", "day0.tools.build_kernels", "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_cuda_pipeline_sends_every_topk_to_the_radix_select():
    cuda = pipeline_for("cuda-sm90", 16)
    assert "topk-to-radix-select{min-size=0}" in cuda
    assert cuda.index("topk-to-radix-select") < cuda.index("topk-to-linalg-ext")
    assert "radix" not in pipeline_for("llvm-cpu", 16)


def _cuda_device_present() -> bool:
    try:
        import iree.runtime as rt

        return bool(rt.get_driver("cuda").query_available_devices())
    except Exception:
        return False


@pytest.mark.skipif(not _cuda_device_present(), reason="needs an NVIDIA GPU (IREE cuda driver with a device)")
def test_radix_select_on_the_gpu_matches_a_stable_sort(tmp_path):
    import numpy as np

    from day0.tools import gpu_topk_check

    gpu_topk_check.build(tmp_path)
    for name in gpu_topk_check._cases(np.random.default_rng(0)):
        res = gpu_topk_check.check_one(tmp_path, name, "cuda")
        assert res["bad_rows"] == 0, res
