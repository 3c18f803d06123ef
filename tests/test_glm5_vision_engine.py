"""The Engine with images: the shared glm5_next vision artifact (conftest glm5_vision_artifact:
paged entry points with `paged_prefill_mm`, batched decode for up to 2 sequences) running image
requests beside text requests, teacher-forced against transformers'
Glm5NextForConditionalGeneration over the whole sequence (prompt rows and decode rows, greedy
tokens identical). Prompt chunks smaller than the prompt put an image across chunk boundaries and
a prompt ending in an image row exercises the lone-last-row rule (an image row never runs as a
decode row). And the errors: images for a text-only artifact, placeholders that are not the
images in number, an image that is not an image, a prompt too long once expanded; each refused
at `add`, the requests already queued untouched."""

import io

import numpy as np
import pytest
import torch
from parity_configs import rel_err
from PIL import Image

from day0.runtime.engine import Engine, EngineError
from day0.runtime.images import ImageError

TOL = 1e-3  # logits (measured: ~1e-5, as the Session's)
# Image sizes here are multiples of 28 px of at least min_image_tokens (16) tokens: such an image is
# neither resized nor padded. A padded image has identical (zero) patches, whose identical feature
# rows make k-pools of equal indexer scores: a tie that decides the selection (day0 keeps the
# lower position, transformers' topk need not), and the logits then differ where it does.


@pytest.fixture(scope="module")
def oracle(glm5_vision_checkpoint):
    from transformers import Glm5NextForConditionalGeneration

    return Glm5NextForConditionalGeneration.from_pretrained(
        glm5_vision_checkpoint, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _png(w: int, h: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _ids(config, parts, seed: int, close: bool = True) -> list[int]:
    """Text runs (lengths) and images (None: start, placeholder[, end]) as a user writes them."""
    g = torch.Generator().manual_seed(seed)
    ids = []
    for p in parts:
        if p is None:
            ids += [config.image_start_token_id, config.image_token_id] + ([config.image_end_token_id] if close else [])
        else:
            ids += torch.randint(0, config.image_start_token_id, (p,), generator=g).tolist()
    return ids


def _run(engine: Engine) -> dict:
    """Step the engine until it has no work: {rid: (tokens, logits rows, finished)}."""
    out: dict = {}
    for _ in range(500):
        if not engine.has_work():
            return out
        for rid, p in engine.step().items():
            tokens, rows, _ = out.get(rid, ([], [], None))
            out[rid] = (tokens + p.tokens, rows + list(p.logits), p.finished)
    raise AssertionError("the engine did not finish in 500 steps")


def _oracle(oracle, seq, images) -> torch.Tensor:
    from day0.runtime.images import ImageConfig, preprocess

    kwargs = {}
    if images:
        pixels, grid = preprocess([Image.open(io.BytesIO(b)) for b in images], ImageConfig())
        kwargs = dict(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grid))
    with torch.no_grad():
        return oracle(torch.tensor(seq)[None], use_cache=False, **kwargs).logits[0]


def _check(oracle, expanded, images, tokens, rows, new):
    """The request's rows (its prompt's, then one per fed generated token) and greedy tokens
    against transformers over prompt + tokens."""
    seq = expanded + tokens
    want = _oracle(oracle, seq, images)
    assert len(tokens) == new and len(rows) == len(expanded) + new - 1
    got = torch.from_numpy(np.stack(rows))
    err = rel_err(got, want[: len(rows)])
    assert err < TOL, err
    assert want[len(expanded) - 1 :].argmax(-1).tolist()[:new] == tokens
    return err


@pytest.mark.parametrize("chunk", [None, 7])
def test_image_and_text_requests_equal_transformers(chunk, glm5_vision_artifact, oracle):
    config = oracle.config
    engine = Engine.load(glm5_vision_artifact, chunk=chunk)
    images = [_png(140, 112, 1), _png(112, 112, 2)]
    ids = _ids(config, [3, None, 2, None, 5], seed=1)
    text = _ids(config, [9], seed=2)
    expanded = engine.image_prompt(ids, images)
    assert expanded.count(config.image_token_id) > 2 and len(expanded) > 2 * 7  # chunk 7 splits the images
    a = engine.add(ids, max_new_tokens=4, images=images, keep_logits=True, stop=())
    b = engine.add(text, max_new_tokens=5, keep_logits=True, stop=())
    assert engine.counters()["waiting_image"] == 1 and engine.counters()["waiting_text"] == 1
    done = _run(engine)
    assert done[a][2] == done[b][2] == "length"
    err = _check(oracle, expanded, images, done[a][0], done[a][1], 4)
    _check(oracle, text, [], done[b][0], done[b][1], 5)
    print(f"chunk {chunk}: image request max rel err {err:.2e}")
    zero = _oracle(oracle, [config.image_start_token_id if t == config.image_token_id else t for t in expanded], [])
    assert rel_err(torch.from_numpy(np.stack(done[a][1][: len(expanded)])), zero) > 0.01  # the images matter
    assert engine.counters()["blocks_used"] == 0


def test_a_prompt_ending_in_an_image_row(glm5_vision_artifact, oracle):
    """The prompt's last row is an image row and the chunk leaves it alone: the pieces give it a
    neighbour (two rows), since an image row cannot run as a decode row."""
    config = oracle.config
    images = [_png(112, 112, 3)]
    ids = _ids(config, [4, None], seed=3, close=False)
    probe = Engine.load(glm5_vision_artifact)
    expanded = probe.image_prompt(ids, images)
    assert expanded[-1] == config.image_token_id
    engine = Engine.load(glm5_vision_artifact, chunk=len(expanded) - 1)
    rid = engine.add(ids, max_new_tokens=3, images=images, keep_logits=True, stop=())
    done = _run(engine)
    _check(oracle, expanded, images, done[rid][0], done[rid][1], 3)


def test_generated_tokens_equal_the_session(glm5_vision_artifact):
    from day0.runtime.session import Session

    session = Session.load(glm5_vision_artifact)
    engine = Engine.load(glm5_vision_artifact)
    config_ids = session.vision.image_token_id
    ids = [5, 6, config_ids - 2, config_ids, config_ids - 1, 7, 8]
    images = [_png(112, 140, 4)]
    rids = [engine.add(ids, max_new_tokens=6, images=images, stop=()) for _ in range(2)]  # one batch of 2
    done = _run(engine)
    want = session.generate(ids, max_new_tokens=6, images=images)
    assert [done[r][0] for r in rids] == [want, want]


def test_bad_image_requests_are_refused_and_the_others_run(glm5_vision_artifact, artifact, oracle):
    config = oracle.config
    engine = Engine.load(glm5_vision_artifact)
    ids = _ids(config, [3, None, 2], seed=5)
    ok = engine.add(_ids(config, [6], seed=6), max_new_tokens=2, stop=())
    with pytest.raises(EngineError, match=r"1 image placeholder token\(s\) .* but 2 image\(s\)"):
        engine.add(ids, images=[_png(28, 28, 1), _png(28, 28, 2)])
    with pytest.raises(EngineError, match=r"1 image placeholder token\(s\) .* but 0 image\(s\)"):
        engine.add(ids)
    with pytest.raises(ImageError, match=r"images\[0\]"):
        engine.add(ids, images=[b"not an image"])
    with pytest.raises(EngineError, match="images must be a list"):
        engine.add(ids, images=_png(28, 28, 1))
    big = _png(28 * 12, 28 * 12, 7)  # 144 image tokens: past max_seq_len 128
    with pytest.raises(EngineError, match="more than the artifact's max_seq_len 128"):
        engine.add(ids, images=[big])
    assert engine.counters()["waiting"] == 1
    assert _run(engine)[ok][2] == "length"
    text_only = Engine.load(artifact("glm-base"))  # glm5_next without a tower
    with pytest.raises(EngineError, match="has no vision tower"):
        text_only.add([1, 2, 3], images=[_png(28, 28, 1)])


def test_visual_token_eviction_frees_the_image_blocks(glm5_vision_artifact, oracle):
    """evict_images=True: once the prompt has run, the blocks holding only image tokens go back to
    the pool; the prompt's logits and first token are the same as keeping them, the decode rows
    are what the selection without the images gives. What it saves and changes is printed
    (docs/perf.md, "Visual-token eviction")."""
    config = oracle.config
    images = [_png(280, 224, 5)]  # 10x8 tokens: positions 4..83 hold image tokens
    ids = _ids(config, [3, None, 20], seed=7)
    runs = {}
    for evict in (False, True):
        engine = Engine.load(glm5_vision_artifact, evict_images=evict)
        expanded = engine.image_prompt(ids, images)
        rid = engine.add(ids, max_new_tokens=8, images=images, keep_logits=True, stop=())
        tokens, rows, used = [], [], None
        while engine.has_work():
            p = engine.step().get(rid)
            if p is not None:
                tokens, rows = tokens + p.tokens, rows + list(p.logits)
            if used is None and engine.phase(rid) == "decoding":
                used = engine.counters()["blocks_used"]
        runs[evict] = (tokens, np.stack(rows), used, engine.counters())
    size = engine.layout.block_size
    image = np.asarray(expanded) == config.image_token_id
    whole = [b for b in range(len(expanded) // size) if image[b * size : (b + 1) * size].all()]
    assert len(whole) == 4  # blocks 1..4 of 16 positions
    (keep_tokens, keep_rows, keep_used, _), (tokens, rows, used, counters) = runs[False], runs[True]
    assert counters["blocks_evicted"] == len(whole) and used == keep_used - len(whole)
    assert counters["blocks_used"] == 0  # released whole at the end, scratch entries and all
    n = len(expanded)
    np.testing.assert_array_equal(rows[:n], keep_rows[:n])  # the prompt saw its images
    assert tokens[0] == keep_tokens[0]
    assert np.isfinite(rows).all()
    change = float(np.abs(rows[n:] - keep_rows[n:]).max() / np.abs(keep_rows[n:]).max())
    agree = float(np.mean(np.asarray(tokens) == np.asarray(keep_tokens)))
    saved = len(whole) * engine.manifest.paged.block_bytes
    print(
        f"eviction: {len(whole)} blocks ({saved} bytes) of {image.sum()} image tokens freed; decode rows max rel change "
        f"{change:.2e}, greedy agreement {agree:.2f} over {len(tokens)} tokens"
    )


def test_paged_session_with_images_equals_the_dense_one(glm5_vision_artifact):
    """Session over the paged entry points (paged_prefill_mm for the prompt with an image): the
    dense Session's prompt logits and greedy tokens."""
    from day0.runtime.session import Session

    dense, paged = Session.load(glm5_vision_artifact), Session.load(glm5_vision_artifact, paged=True)
    token = dense.vision.image_token_id
    ids = [5, 6, token - 2, token, token - 1, 7, 8]
    images = [_png(112, 140, 4)]
    want = dense.prefill(ids, images=images)
    got = paged.prefill(ids, images=images)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    dense.reset()
    paged.reset()
    assert paged.generate(ids, max_new_tokens=6, images=images) == dense.generate(ids, max_new_tokens=6, images=images)
