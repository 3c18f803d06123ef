"""The GPU benchmark package cannot rot on CPU-only CI: build it at tiny shapes for llvm-cpu and
run it the way a GPU host would (shipped sources only, weights from the seed), on the CPU."""

import json
import math
import os
import subprocess
import sys

import pytest

# the venv's editable day0 would fill in modules a package forgot to ship: fail on any day0 module
# loaded from outside the package
ONLY_SHIPPED = (
    "bad = [m.__file__ for m in list(sys.modules.values()) if m.__name__.startswith('day0.') "
    "and getattr(m, '__file__', None) and not m.__file__.startswith(sys.argv[1])]; "
    "assert not bad, 'not shipped: ' + ', '.join(bad)"
)


def _run_from_package(pkg, cwd) -> subprocess.CompletedProcess:
    """bench_gpu.run on the CPU with only the package's day0 sources on the path (as on the GPU
    host)."""
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import day0.tools.bench.bench_gpu as b, sys; "
            "assert b.__file__.startswith(sys.argv[1]), b.__file__; "
            "b.run(__import__('pathlib').Path(sys.argv[1]), 'local-task', None); " + ONLY_SHIPPED,
            str(pkg),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


@pytest.mark.slow
def test_bench_gpu_package_runs_from_its_own_sources(tmp_path):
    from day0.tools.bench import bench_gpu

    pkg = tmp_path / "bench-gpu"
    # every piece but `default`, which tests/test_bench_gpu_default.py packages on its own (a
    # module of its own runs beside this one: this test is the suite's longest)
    pieces = tuple(p for p in bench_gpu.PIECES if p not in ("default", "vision"))  # each its own module
    bench_gpu.package(pkg, "tiny", "llvm-cpu", pieces=pieces, cache=tmp_path / "ckpt-cache")
    spec = json.loads((pkg / "bench.json").read_text())
    assert set(spec["vmfbs"]) == {"moe_r1", "moe_r3", "dsa_256_r1", "dsa_256_r3"}
    p = _run_from_package(pkg, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "limit/day0" in p.stdout  # the table is printed last
    results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    moe, dsa, e2e, glm5, engine, serve, long = results
    assert moe["piece"] == "moe" and dsa["piece"] == "dsa" and dsa["context"] == 256
    assert moe["day0_rel_err"] < 1e-5  # f32 throughout
    assert dsa["day0_rel_err"] < 2e-2  # bf16 caches and output
    for r in (moe, dsa):
        assert r["limit_us"] > 0 and r["day0_call_us"] > 0
    # end to end: the compiled artifact and transformers against day0's eager model, same weights
    assert e2e["piece"] == "e2e"
    assert [(r["context"], r["cache_dtype"]) for r in e2e["rows"]] == [
        (c, d) for c in spec["e2e"]["contexts"] for d in ("float32", "bfloat16")
    ]
    assert e2e["state_bytes"]["float32"] == {k: 2 * v for k, v in e2e["state_bytes"]["bfloat16"].items()}
    for row in e2e["rows"]:
        ours, theirs = row["day0_vs_eager"], row["transformers_vs_eager"]
        # against the eager model with the same caches; with bf16 caches a float-order difference
        # can move an attention output across a bf16 rounding boundary (one ulp, 4e-3 of it)
        tol = 1e-4 if row["cache_dtype"] == "float32" else 1e-3
        assert ours["prompt_max_rel_err"] < tol and ours["decode_max_rel_err"] < tol
        # transformers in f32 here: the same weights reach it (bf16 on the GPU)
        assert theirs["prompt_max_rel_err"] < 1e-4 and theirs["decode_max_rel_err"] < 1e-4
        assert ours["same_greedy_prompt_rows"] == 1.0
        assert (
            min(row[f"{who}_{what}_ms"] for who in ("day0", "eager", "transformers") for what in ("ttft", "decode")) > 0
        )
        # a difference of two generation times: on the tiny model under a loaded CI machine it can come
        # out at or below zero (a benchmark number, not a property this test can pin)
        assert math.isfinite(row["day0_generate_ms"])
    assert "transf./day0" in p.stdout
    # glm5_next (KDA, k-pool DSA, mHC) compiled vs transformers eager, teacher-forced
    assert glm5["piece"] == "glm5" and glm5["prompt_len"] == spec["glm5"]["prompt_len"]
    assert glm5["prompt_max_rel_err"] < 1e-4 and glm5["decode_max_rel_err"] < 1e-4
    assert glm5["same_greedy_prompt_rows"] == 1.0
    assert set(glm5["state_bytes"]) >= {"kda_state", "mla_latent"}
    assert min(glm5[f"{who}_{k}_tok_s"] for who in ("day0", "transformers") for k in ("prefill", "decode")) > 0
    assert "glm5_next small" in p.stdout
    # the Engine: batches of 1..3 sequences, one checked against Session, transformers at the same batch
    assert engine["piece"] == "engine" and [r["batch"] for r in engine["rows"]] == spec["engine"]["batches"]
    for row in engine["rows"]:
        assert row["tok_s"] > 0 and row["transformers_tok_s"] > 0 and row["limit_ms"] > 0
    check = engine["check"]
    assert check["prompt_max_rel_err"] < 1e-5 and check["decode_max_rel_err"] < 1e-5, check
    assert check["same_greedy_rows"] == 1.0 and check["session_decode_ms"] > 0
    sizes = engine["bytes_per_sequence"]
    assert sizes[str(spec["engine"]["prompt"])] > sizes[str(spec["engine"]["short_prompt"])] > 0
    ttft = engine["ttft_s"]
    assert sorted(ttft) == sorted(str(spec["engine"][k]) for k in ("prompt", "short_prompt")) and min(ttft.values()) > 0
    # day0 serve on the same artifact: every request answered, against the Engine alone
    assert serve["piece"] == "serve" and [r["concurrency"] for r in serve["rows"]] == [1, 3]
    for row, clients in zip(serve["rows"], (1, 3)):
        assert row["requests"] == clients * spec["serve"]["requests"]
        assert row["served_tok_s"] > 0 and row["engine_tok_s"] > 0 and row["overhead_ratio"] > 0
    assert "day0 serve (prompts of" in p.stdout
    # long context, on the engine piece's artifact: the check against day0's eager model, every length
    assert long["piece"] == "long" and [r["length"] for r in long["rows"]] == spec["long"]["lengths"]
    check = long["check"]
    assert check["rows"] == spec["long"]["check"] // long["chunk"] and check["steps"] > 0
    assert check["same_greedy_prompt_rows"] == 1.0, check
    assert check["prompt_max_rel_err"] < 1e-3 and check["decode_max_rel_err"] < 1e-3, check  # bf16 caches
    noise = long["check_noise"]  # the eager model against itself in longer chunks
    assert noise["chunk"] > long["chunk"] and noise["same_greedy_prompt_rows"] == 1.0
    assert noise["prompt_max_rel_err"] < 1e-3 and noise["decode_max_rel_err"] < 1e-3, noise
    for row in long["rows"]:
        assert min(row[k] for k in ("decode_ms", "limit_ms", "chunk_ms", "chunk_of_peak", "ttft_estimate_s")) > 0
    assert long["ttft_s"] > 0 and "long context (max_seq_len" in p.stdout
    # one chunk at the longest length profiled (no kernels on the CPU: the wall time)
    assert long["chunk_profile"]["length"] == max(spec["long"]["lengths"]) and long["chunk_profile"]["wall_ms"] > 0
    # and the decode steps there, per step
    decode = long["decode_profile"]
    assert decode["length"] == max(spec["long"]["lengths"]) and decode["steps"] > 1 and decode["launches_per_step"] >= 0


def test_bench_gpu_package_of_some_pieces_imports_from_its_own_sources(tmp_path):
    # `run` and `table` import every piece's module, so a package built for a subset of the
    # pieces must ship them all (a package of only e2e once failed on the GPU host)
    from day0.tools.bench import bench_gpu

    pkg = tmp_path / "bench-gpu"
    bench_gpu.package(pkg, "tiny", "llvm-cpu", pieces=(), cache=tmp_path / "ckpt-cache")
    p = _run_from_package(pkg, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "copy bandwidth" in p.stdout


def test_long_piece_estimates_a_prefill_from_chunk_times():
    # TTFT at L from chunk times measured at a few lengths: linear between them, one per chunk
    from day0.tools.bench.bench_gpu_long import chunk_flops, ttft_estimate

    assert ttft_estimate({512: 0.01, 4096: 0.01}, 512, 4096) == pytest.approx(8 * 0.01)
    # chunk ends 512, 1024, ..., 2048 between 0.01 at 512 and 0.04 at 2048: 0.01, 0.02, 0.03, 0.04
    assert ttft_estimate({512: 0.01, 2048: 0.04}, 512, 2048) == pytest.approx(0.10)
    raw = {
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 1,
        "index_topk": 2,
        "qk_nope_head_dim": 1,
        "qk_rope_head_dim": 1,
        "v_head_dim": 1,
        "num_attention_heads": 1,
        "index_n_heads": 1,
        "index_head_dim": 1,
    }
    # 10 bf16 weights (5 parameters) and 17 MXFP4 bytes (32 values, 2 of 4 experts active: 16);
    # a chunk of 2 tokens at positions 2, 3: keys 3 + 4, selected rows 2 + 2, 2·(2+1) a row
    got = chunk_flops(raw, {"other": 10, "experts": 17}, 2, 4)
    assert got == pytest.approx(2 * (5 + 16) * 2 + 2 * 7 + 6 * 4)
