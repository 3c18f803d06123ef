"""day0's hand-written CUDA kernels: the committed PTX is what nvcc makes of the .cu sources, and
each declares exactly the IREE ABI (bindings, push constants) its pass dispatches with."""

import re
import subprocess
import sys

import pytest

from day0.lowering.kernel_geometry import KERNEL_SETS
from day0.passes.extern_dispatch import kernel_ptx
from day0.tools import build_kernels


def _entries(ptx: str) -> dict[str, list[str]]:
    """entry name -> its .param types, from the PTX text."""
    return {
        m.group(1): re.findall(r"\.param \.(\w+)", m.group(2))
        for m in re.finditer(r"\.entry (\w+)\(\s*(.*?)\)", ptx, re.S)
    }


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=[k.ptx for k in KERNEL_SETS])
def test_ptx_declares_the_abi_its_pass_uses(kernels):
    ptx, abi = kernel_ptx(kernels.ptx).decode(), kernels.entries
    assert re.search(r"^\.target sm_90$", ptx, re.M)
    entries = _entries(ptx)
    assert set(entries) == {name for name, *_ in abi}
    for name, read_only, constants, _ in abi:
        # IREE's CUDA ABI: one pointer per binding, then one 32-bit value per push constant
        assert entries[name] == ["u64"] * len(read_only) + ["u32"] * constants, name


def test_ptx_is_what_nvcc_makes_of_the_sources():
    if build_kernels.nvcc() is None:
        pytest.skip("nvcc not installed: cannot rebuild the PTX to compare")
    release = build_kernels.nvcc_release()
    for kernels in KERNEL_SETS:
        if release not in kernel_ptx(kernels.ptx).decode():
            pytest.skip(f"the PTX was built by another nvcc than this one ({release})")
    p = subprocess.run([sys.executable, "-m", "day0.tools.build_kernels", "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
