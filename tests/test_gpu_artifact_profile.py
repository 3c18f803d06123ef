"""gpu_artifact_profile's busy time: the union of kernel intervals within their span (overlaps
counted once, gaps not at all). The profiler itself needs a GPU."""

from day0.tools.bench.gpu_artifact_profile import _busy, _idle_after


def test_busy_is_the_union_of_kernel_intervals():
    # µs intervals: [0, 10) and [5, 20) overlap; [30, 40) after a 10 µs gap; [32, 35) inside it
    assert _busy([(30, 40), (0, 10), (5, 20), (32, 35)]) == {"span_ms": 0.04, "busy_ms": 0.03}
    assert _busy([]) == {"span_ms": 0.0, "busy_ms": 0.0}


def test_idle_after_sums_the_waits_behind_each_kernel():
    # a [0, 10) then 5 µs idle; b [15, 20) then 10 µs; a [30, 40); c [32, 50) overlaps a, then 2 µs;
    # b [52, 53)
    spans = [(0, 10, "a"), (15, 20, "b"), (30, 40, "a"), (32, 50, "c"), (52, 53, "b")]
    assert _idle_after(spans) == [
        {"kernel": "b", "gaps": 1, "us": 10.0},
        {"kernel": "a", "gaps": 1, "us": 5.0},
        {"kernel": "c", "gaps": 1, "us": 2.0},
    ]
    assert _idle_after([]) == []


def test_engine_profile_runs_every_batch(artifact, capsys):
    """The --engine form end to end on a tiny paged artifact (CPU: the profiler sees no CUDA
    kernels, but the fill, the copies and the steps at each batch run as on the GPU)."""
    from day0.tools.bench.gpu_artifact_profile import run_engine

    out = run_engine(artifact("ds-sparse"), None, prompt=12, steps=2, device="local-task", top=5, batches=[3, 1])
    assert sorted(out) == ["engine_1", "engine_3", "engine_prompt_chunk"]
    chunk = out.pop("engine_prompt_chunk")
    assert chunk["wall_ms"] > 0 and "steps" not in chunk
    assert all(r["steps"] == 2 and r["wall_ms"] > 0 for r in out.values())
    printed = capsys.readouterr().out
    assert "3 sequences: wall" in printed and "one 512-token prompt chunk (paged_prefill)" in printed
    assert "GPU idle a step, by the kernel it follows" in printed


def test_engine_profile_takes_a_moved_checkpoint(artifact, tmp_path):
    """--checkpoint replaces the shard directory recorded at compile time (on the GPU host the
    checkpoint is regenerated elsewhere), for the manifest read as for the Engine."""
    import json
    import shutil

    from day0.tools.bench.gpu_artifact_profile import run_engine

    src = artifact("ds-sparse")
    moved = tmp_path / "a"
    shutil.copytree(src, moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    ckpt = manifest["parameters"]["base_dir"]
    manifest["parameters"]["base_dir"] = str(tmp_path / "gone")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    out = run_engine(moved, ckpt, prompt=6, steps=1, device="local-task", top=1, batches=[1])
    assert out["engine_1"]["steps"] == 1


def test_image_profile_encodes_one_image(glm5_vision_artifact, capsys):
    """The --image form on the tiny vision artifact (CPU: no CUDA kernels in the profile, but the
    image is decoded, preprocessed and encoded as on the GPU)."""
    from day0.tools.bench.gpu_artifact_profile import run_image

    out = run_image(glm5_vision_artifact, None, side=56, device="local-task", top=3)
    r = out["image"]
    assert r["side_px"] == 56 and r["image_tokens"] > 0 and r["wall_ms"] > 0
    assert f"one 56px image ({r['image_tokens']} image tokens)" in capsys.readouterr().out
