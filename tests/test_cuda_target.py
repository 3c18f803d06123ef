"""The cuda-sm90 target cannot rot on CPU-only CI: compile parity models for it and check the
artifacts. Running it needs a GPU (tools/bench/gpu_smoke.py on the GPU host)."""

import json

import pytest

from day0.lowering.targets import TARGETS, DsaShape


def test_deepseek_compiles_for_sm90(cuda_artifact):
    from day0.runtime.artifact import read_manifest

    out, _ = cuda_artifact("ds-tiles-mxfp4")  # (the MXFP4 test below and tests/test_cache_dtype.py read it too)
    manifest = read_manifest(out, verify=False)
    assert manifest.target == "cuda-sm90"
    entries = json.loads((out / "manifest.json").read_text())["entry_points"]
    assert entries.keys() == {"prefill", "decode", "prefill_first", "prefill_chunk"}
    assert entries["prefill_chunk"]["static_len"] == 64  # the target's 512, capped at max_seq_len
    assert "--iree-opt-level=O3" in manifest.compile_flags
    # every entry point takes its transients from the caller (runtime/step_call.py)
    assert "--iree-torch-externalize-transients" in manifest.compile_flags
    vmfb = (out / "model.vmfb").read_bytes()
    assert b"prefill$async_transients_size" in vmfb
    assert b".target sm_90" in vmfb  # PTX for Hopper, not a fallback arch
    # the top-k, the DSA attention and the indexer scores run day0's kernels on CUDA (the entries
    # of the kernels' PTX modules; which ones the dispatches call: the passes' lit tests)
    for kernel in (
        b"day0_topk_hist",
        b"day0_topk_collect",
        b"day0_topk_finish",
        b"day0_topk_small",
        b"day0_dsa_partial_f32",
        b"day0_dsa_combine_f32",
        b"day0_indexer_scores_causal_bf16_mma",
        b"day0_moe_route",  # the router, kept as one op (tests/test_export_kept_ops.py)
    ):
        assert kernel in vmfb
    assert "indexer-scores-to-cuda-kernel" in TARGETS["cuda-sm90"].pipeline(DsaShape(16))


def test_decode_launches_are_pinned(cuda_artifact):
    """The launches of one decode step (IREE's dispatches in the flow phase), pinned. At one
    sequence the GPU step is bound by the rate of its launches, ~7 µs each (docs/perf.md, "A step
    that never holds the host"), so a change that adds one says so here and in docs/perf.md.
    ds-tiles-mxfp4: a dense-MLP layer, an MoE layer, the lm_head and greedy sampling."""
    from day0.lowering.compile import flow_dispatches

    out, _ = cuda_artifact("ds-tiles-mxfp4")
    flow = next((out / "stages" / "iree" / "phases").glob("*.flow.mlir")).read_text()
    launches = flow_dispatches(flow, "decode")
    assert len(launches) == 65, "\n".join(launches)
    # one matvec for the queries' and the indexer's projections of q_resid (models/mla.py): 4 heads
    # × (16 + 8) + 16 indexer heads × 32, once a layer
    assert sum("matvec_like_608x32_f32" in name for name in launches) == 2
    # the day0 kernels of a layer: indexer scores, its top-k, DSA partial and combine; the MoE
    # layer's router and two expert matvecs, the down one staging x through the SwiGLU (no
    # SwiGLU dispatch between them); and the greedy token's top-k
    for kernel, count in {
        "day0_indexer_scores_causal_bf16_mma": 2,
        "day0_dsa_partial_bf16_mma_vp8": 2,
        "day0_dsa_combine_bf16_mma": 2,
        "day0_moe_route": 1,
        "day0_mxfp4_matvec": 1,
        "day0_mxfp4_matvec_swiglu": 1,
        "day0_topk_small": 3,
    }.items():
        assert launches.count(kernel) == count, kernel


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ds-tiles-mxfp4", "oss-base"])
def test_mxfp4_checkpoints_compile_for_sm90_with_the_mxfp4_kernels(cuda_artifact, name):
    art, _ = cuda_artifact(name)
    vmfb = (art / "model.vmfb").read_bytes()
    assert b"day0_mxfp4_matvec" in vmfb and b".target sm_90" in vmfb
    if name.startswith("ds"):  # routed experts: decode on the matvec, prefill on the grouped GEMM
        assert b"day0_mxfp4_moe_gemm" in vmfb


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kl-base"])
def test_kda_models_compile_for_sm90(cuda_artifact, name):
    """KDA's chunk loop (a while loop over whole chunks) compiles for CUDA; models with a
    recurrent state get no static prefill chunk (lowering/driver.py). (glm5_next's KDA and k-pool
    DSA layers: tests/test_glm5_vision_artifact.py's CUDA compile checks the same.)
    IREE 3.13 rejects caller transients for that loop's dynamic-length prefill: the driver says so
    and compiles without them (the manifest's flags and the module agree), leaving no repro."""
    from day0.runtime.artifact import read_manifest

    art, notes = cuda_artifact(name)
    manifest = read_manifest(art, verify=False)
    again = [
        e for s, e in notes if s == "compile" and e.startswith("again without --iree-torch-externalize-transients")
    ]
    assert len(again) == 1 and "does not dominate" in again[0]
    assert "--iree-torch-externalize-transients" not in manifest.compile_flags
    assert b"transients_size" not in (art / "model.vmfb").read_bytes()
    assert not [p for p in art.parent.iterdir() if p.name.startswith(art.name) and "repro" in p.name]  # none kept
    assert "prefill_chunk" not in manifest.entry_points
    assert {s.kind for s in manifest.state} >= {"kda_state", "conv_tail"}
    assert b".target sm_90" in (art / "model.vmfb").read_bytes()


def test_matmul_terms_reach_the_pass_and_are_bounded(tmp_path):
    """cuda-sm90 runs matmul-to-bf16-terms with two terms, and the vision tower's matmuls and
    attention kernel with one (its measured defaults); BuildOptions .matmul_terms / .image_terms
    (--matmul-terms / --image-terms) set them, the attention kernel taking at most two; targets
    without the passes are unchanged; a count the passes cannot do is refused up front."""
    from day0.lowering.driver import BuildError, BuildOptions, check_options

    cuda = TARGETS["cuda-sm90"]
    assert "matmul-to-bf16-terms{terms=2 image-terms=1}," in cuda.pipeline()
    assert "vision-attention-to-cuda-kernel{terms=1}," in cuda.pipeline()
    assert cuda.pipeline(matmul_terms=2, image_terms=1) == cuda.pipeline()
    assert "matmul-to-bf16-terms{terms=3 image-terms=1}," in cuda.pipeline(matmul_terms=3)
    three = cuda.pipeline(image_terms=3)
    assert (
        "matmul-to-bf16-terms{terms=2 image-terms=3}," in three and "vision-attention-to-cuda-kernel{terms=2}," in three
    )
    assert TARGETS["llvm-cpu"].pipeline(matmul_terms=2, image_terms=1) == TARGETS["llvm-cpu"].pipeline()
    with pytest.raises(BuildError, match=r"--matmul-terms must be 2 or 3 \(got 1\)"):
        check_options(BuildOptions(target="cuda-sm90", matmul_terms=1))
    with pytest.raises(BuildError, match=r"--image-terms must be 1, 2 or 3 \(got 4\)"):
        check_options(BuildOptions(target="cuda-sm90", image_terms=4))
