"""tools/bench/gpu_piece_check.py cannot rot on CPU-only CI: its pipelines drop what their names
say, and a build for llvm-cpu run on the CPU gives back the pieces' CPU outputs row for row."""

import pytest

from day0.lowering.targets import DsaShape, get_target
from day0.tools.bench import gpu_piece_check as pc

DSA = DsaShape(64, keys=64)
KEPT = ("indexer_scores", "moe_route", "materialize", "vision_attention", "mxfp4_moe_swiglu")  # cuda-sm90's kept ops


@pytest.mark.parametrize(
    "variant, gone, kept",
    [
        ("", (), KEPT),
        ("nomatmul", ("matmul-to-cuda-linear", "matmul-to-bf16-terms"), KEPT),
        ("nodsa", ("dsa-to-cuda-kernel",), KEPT),
        ("noindexer", ("indexer-scores-to-cuda-kernel",), ()),
        ("notopk", ("topk-to-radix-select",), KEPT),
        ("bare", ("cuda", "radix"), ()),
    ],
)
def test_variant_pipelines_drop_what_they_name(variant, gone, kept):
    pipeline, kept_ops = pc.gpu_pipeline(get_target("cuda-sm90"), DSA, variant)
    assert pipeline.startswith("builtin.module(parameters-to-globals,hoist-parameter-stacks")
    assert not [g for g in gone if g in pipeline], pipeline
    assert tuple(kept_ops) == kept
    assert ("dsa-to-gather-tiles" in pipeline) == (variant in ("nodsa", "bare"))  # the op still lowers
    assert "topk-to-linalg-ext" in pipeline


def test_build_and_run_on_the_cpu(tmp_path):
    errors = pc.build(tmp_path, ["rope_columns", "a_select@bare"], target_name="llvm-cpu")
    assert set(errors) == {"rope_columns", "a_select@bare"}
    assert max(errors.values()) < 1e-6  # the CPU compile of each piece against eager
    results = pc.run(tmp_path, device="local-task")
    assert set(results) == {"rope_columns", "a_select@bare"}
    for name, r in results.items():
        assert len(r["rows"]) == pc.S, name
        assert max(r["rows"]) == 0.0, name  # the same compile on the same device: bit for bit


def test_unknown_piece_is_named(tmp_path):
    with pytest.raises(SystemExit, match="unknown pieces \\['attn9'\\]"):
        pc.build(tmp_path, ["attn9"], target_name="llvm-cpu")


def test_row_errors_are_per_row():
    import numpy as np

    want = np.array([[1.0, 2.0], [4.0, -8.0]])
    got = want + np.array([[0.0, 0.2], [0.0, 0.0]])
    assert pc.row_errors(got, want) == [pytest.approx(0.1), 0.0]
