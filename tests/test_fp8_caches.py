"""The FP8 cache accuracy study (tools/bench/fp8_caches.py, issue 18): its storage is the reference
layouts' (E4M3 values, one f32 scale a tile), the eager model writes its rows through it while the
study runs and not after, and the study's numbers come from real runs of the layouts."""

import pytest
import torch

from day0.tools.bench import fp8_caches

NAME = "ds-sparse"


def test_fp8_rows_is_e4m3_times_a_tile_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=g) * torch.logspace(-3, 3, 5)[:, None]
    x[2, 128:] = 0.0  # a zero tile stays zero
    q = fp8_caches.fp8_rows(x, 128)
    tiles, qt = x.view(5, 2, 128), q.view(5, 2, 128)
    scale = tiles.abs().amax(-1, keepdim=True) / fp8_caches.FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = qt / scale
    # every value an E4M3 code (times the scale: to f32 rounding)
    torch.testing.assert_close(codes.to(torch.float8_e4m3fn).float(), codes, rtol=1e-6, atol=0)
    assert codes.abs().amax() <= fp8_caches.FP8_MAX
    # round to nearest: within half an E4M3 step (2^-4 relative; 2^-10 absolute below 2^-6)
    assert ((qt - tiles).abs() <= torch.maximum(tiles.abs() * 2**-4, scale * 2**-10)).all()
    assert torch.equal(q[2, 128:], torch.zeros(128)) and not torch.equal(q, x)


def test_rows_are_written_in_fp8_and_the_model_is_restored(checkpoint):
    from day0.models import dsa_indexer, mla
    from day0.models.registry import build_eager

    keys, row = dsa_indexer.Indexer.keys, mla.cache_row
    model = build_eager(checkpoint(NAME), 32)
    ids = torch.arange(12) % 7 + 3
    with torch.no_grad(), fp8_caches.fp8_storage(index=True, latent=True):
        _, *state = model.step(ids, torch.tensor([0]), *model.empty_state())
    assert dsa_indexer.Indexer.keys is keys and mla.cache_row is row
    names = [s.name for s in model.state_specs()]
    rank = model.cfg.kv_lora_rank
    for name, t in zip(names, state, strict=True):
        written = t[: len(ids)]
        # stored again, a stored row stays (to f32 rounding of code × scale)
        if name.startswith("index_cache"):
            torch.testing.assert_close(fp8_caches.fp8_rows(written, written.shape[-1]), written, rtol=1e-6, atol=0)
        else:  # the latent in tiles of 128 (or its whole width), the rope part in bf16
            lat = written[:, :rank]
            torch.testing.assert_close(fp8_caches.fp8_rows(lat, min(128, rank)), lat, rtol=1e-6, atol=0)
            rope = written[:, rank:]
            assert torch.equal(rope.to(torch.bfloat16).float(), rope)
        assert not t[len(ids) :].any()  # nothing else written
    # without the context the same step writes other (f32) rows
    with torch.no_grad():
        _, *plain = model.step(ids, torch.tensor([0]), *model.empty_state())
    assert not all(torch.equal(a, b) for a, b in zip(state, plain, strict=True))


def test_the_study_measures_every_layout(checkpoint):
    ckpt = checkpoint(NAME)
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1))
    res = fp8_caches.measure(ckpt, ids, 24)
    assert set(res["layouts"]) == set(fp8_caches.LAYOUTS[1:])
    for r in res["layouts"].values():
        assert 0.0 <= r["greedy_agree"] <= 1.0 and 0.0 <= r["selection_overlap"] <= 1.0
        assert r["logits_rel"] > 0.0  # every layout rounds something
    # the selections compared are the model's: K = index_topk slots a query, fewer visible early
    _, sel = fp8_caches.teacher_forced(ckpt, "f32", ids, 24, 41)
    assert len(sel) == 2 * (1 + 16) and sel[0].shape == (24, 8)
    assert fp8_caches.overlap(sel, sel) == 1.0
    moved = [s.clone() for s in sel]
    moved[-1][0, 0] = 39  # a slot no query chose at that step
    assert fp8_caches.overlap(moved, sel) < 1.0


def test_bytes_per_token_are_the_reference_layouts():
    b = fp8_caches.bytes_per_token({"index_head_dim": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert b["fp8"] == {"index": 132, "latent": 656}  # DeepSeek-V3.2's indexer keys, FlashMLA's 656 B
    assert b["bf16"] == {"index": 256, "latent": 1152}


@pytest.mark.parametrize("argv, words", [(["--prompt", "0"], "--prompt 0 must be in")])
def test_cli_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        fp8_caches.main(["--tokens", "16", *argv])
    assert words in str(e.value)
