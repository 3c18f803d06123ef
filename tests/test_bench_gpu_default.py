"""`make bench-gpu`'s `default` piece (tools/bench/bench_gpu_default.py) built at the tiny settings
for llvm-cpu and run from its own package with only the package's day0 sources (as on the GPU
host): the shipped default model compiled, against transformers."""

import json

import pytest
from test_bench_gpu import _run_from_package


@pytest.mark.slow
def test_default_piece_runs_from_its_own_sources(tmp_path):
    from day0.tools.bench import bench_gpu

    pkg = tmp_path / "bench-gpu"
    bench_gpu.package(pkg, "tiny", "llvm-cpu", pieces=("default",), cache=tmp_path / "ckpt-cache")
    spec = json.loads((pkg / "bench.json").read_text())
    # llvm-cpu's caches: f32 only; it splits no matmul into bf16 terms
    assert spec["default"]["variants"] == [{"weights": "float32", "cache_dtype": "float32", "matmul_terms": 3}]
    p = _run_from_package(pkg, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    (default,) = results
    # the compiled artifact's held-out perplexity is transformers' within 0.5% and its greedy
    # continuations are token-identical
    assert default["piece"] == "default" and [r["way"] for r in default["rows"]] == [
        "transformers float32",
        "day0 float32 caches",
    ]
    ours = default["rows"][1]
    assert abs(ours["ratio"] - 1) < 5e-3 and ours["greedy_agree"] == [default["greedy"]] * 3
    assert "default model: held-out perplexity" in p.stdout
