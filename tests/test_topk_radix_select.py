"""The CUDA radix-select top-k: the CUDA pipeline uses it for every topk, and (on a machine with an
NVIDIA GPU) its selection equals a stable sort's. Its PTX and ABI: tests/test_cuda_kernels.py."""

import pytest

from day0.lowering.targets import TARGETS, DsaShape


def pipeline_for(target: str, width: int, keys: int = 0) -> str:
    return TARGETS[target].pipeline(DsaShape(width, keys=keys))


def test_cuda_pipeline_sends_every_topk_to_the_radix_select():
    cuda = pipeline_for("cuda-sm90", 16)
    assert "topk-to-radix-select{min-size=0 row-bound=0}" in cuda
    assert cuda.index("topk-to-radix-select") < cuda.index("topk-to-linalg-ext")
    assert "radix" not in pipeline_for("llvm-cpu", 16)


def test_the_indexer_rows_bound_is_the_key_range_plus_the_padding():
    # the indexer's top-k row: the key range (max_seq_len slots) plus k empty columns
    assert "row-bound=4112" in pipeline_for("cuda-sm90", 16, keys=4096)
    # a model without a DSA op still sends its routers' topk's to the radix select
    assert "topk-to-radix-select{min-size=0 row-bound=0}" in TARGETS["cuda-sm90"].pipeline(None)
    assert "dsa-to-cuda-kernel" not in TARGETS["cuda-sm90"].pipeline(None)


def test_cuda_pipeline_runs_mxfp4_matmuls_on_the_kernel():
    cuda, cpu = pipeline_for("cuda-sm90", 16), pipeline_for("llvm-cpu", 16)
    assert "mxfp4-to-cuda-matvec" in cuda and "fuse-mxfp4-matmul" not in cuda
    assert "fuse-mxfp4-matmul" in cpu and "mxfp4-to-cuda-matvec" not in cpu


def _cuda_device_present() -> bool:
    try:
        import iree.runtime as rt

        return bool(rt.get_driver("cuda").query_available_devices())
    except Exception:
        return False


@pytest.mark.skipif(not _cuda_device_present(), reason="needs an NVIDIA GPU (IREE cuda driver with a device)")
def test_radix_select_on_the_gpu_matches_a_stable_sort(tmp_path):
    import numpy as np

    from day0.tools.bench import gpu_topk_check

    gpu_topk_check.build(tmp_path)
    for name in gpu_topk_check._cases(np.random.default_rng(0)):
        res = gpu_topk_check.check_one(tmp_path, name, "cuda")
        assert res["bad_rows"] == 0 and res.get("bad_rows_small", 0) == 0, res
