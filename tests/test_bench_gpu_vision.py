"""`make bench-gpu`'s `vision` piece (tools/bench/bench_gpu_vision.py) built at the tiny settings
for llvm-cpu and run from its own package with only the package's day0 sources (as on the GPU
host): a seeded glm5_next checkpoint with a vision tower, encode and time to first token against
transformers."""

import json

import pytest
from test_bench_gpu import _run_from_package


@pytest.mark.slow
def test_vision_piece_runs_from_its_own_sources(tmp_path):
    from day0.tools.bench import bench_gpu

    pkg = tmp_path / "bench-gpu"
    bench_gpu.package(pkg, "tiny", "llvm-cpu", pieces=("vision",), cache=tmp_path / "ckpt-cache")
    spec = json.loads((pkg / "bench.json").read_text())["vision"]
    assert spec["sides"] == [112, 168] and spec["image_tokens"] == [16, 36]
    p = _run_from_package(pkg, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    (vision,) = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert [r["image_tokens"] for r in vision["rows"]] == [16, 36]
    for row in vision["rows"]:
        # the compiled tower's features are transformers' (float32) ones; every timing is there
        assert row["check"] < 1e-4, row
        assert min(row["day0_ms"], row["transformers_eager_ms"], row["transformers_sdpa_ms"]) > 0
    assert vision["ttft"]["day0_ms"] > 0 and vision["ttft"]["transformers_sdpa_ms"] > 0
    assert "vision tower (tiny shapes)" in p.stdout and "time to first token" in p.stdout


def test_two_term_variant_only_where_the_tower_runs_one():
    """cuda-sm90 runs the tower at one bf16 term, so its package adds a two-term artifact to
    report what that costs; llvm-cpu (f32 tower) adds none."""
    from day0.tools.bench.bench_gpu_vision import variants

    assert variants("cuda-sm90") == [2] and variants("llvm-cpu") == []
