"""The cuda-sm90 target cannot rot on CPU-only CI: compile the demo model for it and check the
artifact. Running it needs a GPU (tools/gpu_smoke.py on the GPU host)."""

import json


def test_demo_model_compiles_for_sm90(tmp_path):
    from day0.lowering.build import BuildOptions, compile_checkpoint
    from day0.models.demo_checkpoint import ensure_demo_checkpoint

    ckpt = ensure_demo_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "artifact"
    manifest = compile_checkpoint(ckpt, out, BuildOptions(target="cuda-sm90", max_seq_len=128),
                                  progress=lambda *a: None)
    assert manifest["target"] == "cuda-sm90"
    assert json.loads((out / "manifest.json").read_text())["entry_points"].keys() == {
        "prefill", "decode", "prefill_first"}
    vmfb = (out / "model.vmfb").read_bytes()
    assert b".target sm_90" in vmfb  # PTX for Hopper, not a fallback arch
    # every topk runs day0's radix-select kernels (IREE's own CUDA topk is slow and was wrong)
    for kernel in (b"day0_topk_hist", b"day0_topk_collect", b"day0_topk_finish"):
        assert kernel in vmfb
