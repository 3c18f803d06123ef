"""A glm5_next prompt with images, eager: day0's vision tower (models/vision.py) gives the features,
the text model (models/glm5_next.py) takes them in place of the placeholder rows' embeddings
(`features` / `feature_rows`: CausalLM.mix_features), against transformers'
Glm5NextForConditionalGeneration(input_ids, pixel_values, image_grid_thw) on a tiny checkpoint with
a vision tower (tools/checkpoints/glm5_next.py, vision=True). Images are small PIL images through
runtime/images.py (preprocess, image_tokens, expand_image_placeholders, image_feature_rows).

Teacher-forced logits over every prefill row and the greedy decode steps after each turn, in the
dense step and in the paged one (blocks scattered over a pool, a KDA slot: the Engine's form): one
image, two in one prompt, an image in the second turn (a prefill at start > 0), images in both
turns, and a prompt prefilled in chunks with an image straddling the boundary. And the errors: a
placeholder count that is not the feature count, bad feature rows or shapes."""

import numpy as np
import pytest
import torch
from parity_configs import rel_err
from PIL import Image

from day0.models.registry import build_eager
from day0.models.vision import load_vision_tower, vision_inputs
from day0.runtime.images import (
    ImageConfig,
    ImageError,
    expand_image_placeholders,
    image_feature_rows,
    image_tokens,
    preprocess,
)

TOL = 1e-3  # the bound; ~1e-5 measured
MAX_SEQ_LEN = 128
SEED = 3
BLOCK, BLOCKS = 4, 40  # the paged form: blocks of one k-pool (4), a pool of 40
SIZES = {"wide": (84, 56), "square": (28, 28), "tall": (42, 70)}  # PIL sizes (w, h) -> grids (1,8,10) (1,8,8) ...
IMAGE = object()  # a placeholder in a prompt's parts


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

    return write_tiny_glm5_next_checkpoint(tmp_path_factory.mktemp("glm5-vision") / "ckpt", seed=SEED, vision=True)


@pytest.fixture(scope="module")
def oracle(ckpt):
    from transformers import Glm5NextForConditionalGeneration

    return Glm5NextForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def model(ckpt):
    return build_eager(ckpt, MAX_SEQ_LEN)


@pytest.fixture(scope="module")
def tower(ckpt):
    return load_vision_tower(ckpt)


def _image(name: str) -> Image.Image:
    w, h = SIZES[name]
    pixels = np.random.default_rng(len(name) * w + h).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


class Turn:
    """One prompt: `parts` (text lengths and IMAGE), its `images` (names of SIZES, one per IMAGE),
    prefilled in chunks ending at `cuts` (offsets into the expanded prompt; none: one prefill),
    then `decode` greedy tokens. `ids` (expanded), `pixel_values`, `grid` after `build`."""

    def __init__(self, parts, images=(), cuts=(), decode=3):
        self.parts, self.images, self.cuts, self.decode = parts, list(images), list(cuts), decode

    def build(self, config, seed: int):
        g = torch.Generator().manual_seed(seed)
        text_vocab = config.image_start_token_id  # the special tokens are the vocabulary's last six
        ids = []
        for p in self.parts:
            if p is IMAGE:
                ids += [config.image_start_token_id, config.image_token_id, config.image_end_token_id]
            else:
                ids += torch.randint(0, text_vocab, (p,), generator=g).tolist()
        if self.images:
            pixels, self.grid = preprocess([_image(n) for n in self.images], ImageConfig())
            self.pixel_values = torch.from_numpy(pixels)
            self.counts = image_tokens(self.grid, config.vision_config.spatial_merge_size)
        else:
            self.pixel_values, self.grid, self.counts = None, np.zeros((0, 3), np.int64), []
        self.ids = expand_image_placeholders(ids, config.image_token_id, self.counts)
        return self


def _features(tower, turn: Turn) -> torch.Tensor | None:
    if not turn.images:
        return None
    positions, segments = vision_inputs(turn.grid, tower.merge)
    with torch.no_grad():
        return tower(turn.pixel_values, torch.from_numpy(positions), torch.from_numpy(segments))


class Dense:
    """model.step over the model's own dense state."""

    def __init__(self, model):
        self.model, self.state = model, model.empty_state()

    def __call__(self, ids, at: int, **images) -> torch.Tensor:
        logits, *self.state = self.model.step(ids, torch.tensor([at]), *self.state, **images)
        return logits


class Paged:
    """model.step_paged: the sequence's rows in scattered blocks of a pool, its KDA state in slot 2
    of 3; prompt pieces as one-sequence chunks, decode steps as a batched step of one."""

    def __init__(self, model):
        self.model = model
        pools, slots = model.paged_state(BLOCK)
        self.pools = [torch.zeros(BLOCKS * p.shape[0], *p.shape[1:]) for p in pools]
        self.slots = [torch.randn(3, *s.shape, generator=torch.Generator().manual_seed(1)) for s in slots]
        self.table = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(2))[None, : MAX_SEQ_LEN // BLOCK]

    def __call__(self, ids, at: int, **images) -> torch.Tensor:
        end = at + ids.shape[0]
        logits, *state = self.model.step_paged(
            ids,
            torch.arange(at, end),
            self.table[:, : -(-end // BLOCK)],
            torch.tensor([2]),
            *self.pools,
            *self.slots,
            block=BLOCK,
            batched=ids.shape[0] == 1 and not images,
            **images,
        )
        self.pools, self.slots = state[: len(self.pools)], state[len(self.pools) :]
        return logits


def _day0(model, tower, turns: list[Turn], form, image_token_id: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """(logits of every row, the whole sequence, the rows whose argmax was generated): each turn's
    prompt in its pieces (every piece the turn's features and its slice of the feature rows), then
    its greedy decode steps."""
    step, rows, seq, generating = form(model), [], [], []
    with torch.no_grad():
        for turn in turns:
            features, ids = _features(tower, turn), torch.tensor(turn.ids)
            feature_rows = None
            if features is not None:
                feature_rows = torch.from_numpy(image_feature_rows(turn.ids, image_token_id, len(features)))
            for a, b in zip([0, *turn.cuts], [*turn.cuts, len(ids)]):
                images = {} if features is None else {"features": features, "feature_rows": feature_rows[a:b]}
                rows.append(step(ids[a:b], len(seq) + a, **images))
            seq += turn.ids
            for _ in range(turn.decode):
                generating.append(len(seq) - 1)
                token = int(rows[-1][-1].argmax())
                rows.append(step(torch.tensor([token]), len(seq)))
                seq.append(token)
    return torch.cat(rows), seq, generating


def _oracle(oracle, turns: list[Turn], seq: list[int]) -> torch.Tensor:
    """transformers' logits of the whole sequence in one forward, with every turn's images."""
    images = [t for t in turns if t.images]
    kwargs = {}
    if images:
        kwargs = dict(
            pixel_values=torch.cat([t.pixel_values for t in images]),
            image_grid_thw=torch.from_numpy(np.concatenate([t.grid for t in images])),
        )
    with torch.no_grad():
        return oracle(torch.tensor(seq)[None], use_cache=False, **kwargs).logits[0]


CASES = {
    "one image": [Turn([4, IMAGE, 6], ["wide"], decode=4)],
    "two images": [Turn([3, IMAGE, 2, IMAGE, 5], ["wide", "square"], decode=4)],
    "second turn": [Turn([7], decode=3), Turn([2, IMAGE, 4], ["square"], decode=3)],
    "both turns": [Turn([2, IMAGE, 3], ["tall"], decode=2), Turn([1, IMAGE, 5], ["wide"], decode=3)],
    # pieces 0-3 (text only, given the features anyway), 3-15 (the image's start and 11 of its 20
    # rows), 15-end (its other 9 rows and the text after it)
    "straddling chunks": [Turn([3, IMAGE, 5], ["wide"], cuts=[3, 15], decode=3)],
}


@pytest.mark.parametrize("form", [Dense, Paged], ids=["dense", "paged"])
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_with_image_features_equals_transformers(case, form, model, tower, oracle):
    turns = [t.build(oracle.config, seed=10 + i) for i, t in enumerate(CASES[case])]
    got, seq, generating = _day0(model, tower, turns, form, oracle.config.image_token_id)
    want = _oracle(oracle, turns, seq)
    assert got.shape == want.shape == (len(seq), oracle.config.text_config.vocab_size)
    assert rel_err(got, want) < TOL
    # greedy identical: transformers' argmax at each generating row is the token day0 generated
    assert want[generating].argmax(-1).tolist() == [seq[r + 1] for r in generating]
    assert got[-1].argmax() == want[-1].argmax()


def test_cases_are_what_they_claim(model, tower, oracle):
    """The images change the logits (zero features are far off), the chunked case's cut falls inside
    its image, the second-turn image starts past position 0, and no pool selection of any case hangs
    on a near-tie (the whole sequence as one prefill, every image's features)."""
    from day0.tools.checkpoints.glm5_next import pool_selection_margin

    token = oracle.config.image_token_id
    straddle = CASES["straddling chunks"][0].build(oracle.config, seed=10)
    inside = [i for i, t in enumerate(straddle.ids) if t == token]
    assert inside[0] < straddle.cuts[1] <= inside[-1]
    second = CASES["second turn"]
    first_len = len(second[0].build(oracle.config, seed=10).ids) + second[0].decode
    assert first_len > 0 and token in second[1].build(oracle.config, seed=11).ids
    for case, turns in CASES.items():
        turns = [t.build(oracle.config, seed=10 + i) for i, t in enumerate(turns)]
        _, seq, _ = _day0(model, tower, turns, Dense, token)
        features = torch.cat([f for f in (_features(tower, t) for t in turns) if f is not None])
        rows = torch.from_numpy(image_feature_rows(seq, token, len(features)))
        ids = torch.tensor(seq)
        margin = pool_selection_margin(model, ids, features=features, feature_rows=rows)
        assert margin > 1e-4, case
        with torch.no_grad():
            want = _oracle(oracle, turns, seq)
            one, *_ = model.step(ids, torch.tensor([0]), *model.empty_state(), features=features, feature_rows=rows)
            zero, *_ = model.step(
                ids, torch.tensor([0]), *model.empty_state(), features=torch.zeros_like(features), feature_rows=rows
            )
        assert rel_err(one, want) < TOL, case  # the whole conversation as one prefill
        assert rel_err(zero, want) > 0.1, case


def test_no_feature_rows_is_the_text_step(model, tower, oracle):
    """Features given but every row -1 is exactly the text-only step."""
    turn = CASES["one image"][0].build(oracle.config, seed=10)
    ids = torch.tensor([t for t in turn.ids if t != oracle.config.image_token_id])
    features = _features(tower, turn)
    with torch.no_grad():
        plain, *plain_state = model.step(ids, torch.tensor([0]), *model.empty_state())
        mixed, *mixed_state = model.step(
            ids, torch.tensor([0]), *model.empty_state(), features=features, feature_rows=torch.full_like(ids, -1)
        )
    assert torch.equal(plain, mixed)
    assert all(torch.equal(a, b) for a, b in zip(plain_state, mixed_state))


def test_placeholder_and_feature_counts_must_agree(tower, oracle):
    """A prompt expanded for one image but given two images' features (or the other way round) is
    refused before any step, naming both counts."""
    config = oracle.config
    one = Turn([2, IMAGE, 3], ["wide"]).build(config, seed=1)
    two = Turn([2, IMAGE, 3, IMAGE], ["wide", "square"]).build(config, seed=1)
    with pytest.raises(ImageError, match=r"20 image placeholder row\(s\) \(id 126\) but the images gave 36 feature"):
        image_feature_rows(one.ids, config.image_token_id, len(_features(tower, two)))
    with pytest.raises(ImageError, match=r"36 image placeholder row\(s\) .* gave 20 feature row\(s\)"):
        image_feature_rows(two.ids, config.image_token_id, len(_features(tower, one)))
    rows = image_feature_rows(one.ids, config.image_token_id, 20)
    assert rows.dtype == np.int64 and rows[rows >= 0].tolist() == list(range(20))
    assert [i for i, r in enumerate(rows) if r >= 0] == [i for i, t in enumerate(one.ids) if t == config.image_token_id]


def test_bad_features_are_named(model):
    ids, hidden = torch.tensor([1, 126, 126, 2]), model.cfg.hidden_size
    features, rows = torch.randn(2, hidden), torch.tensor([-1, 0, 1, -1])
    state = model.empty_state()
    cases = [
        (
            dict(features=features, feature_rows=torch.tensor([-1, 0, 2, -1])),
            r"feature_rows\[2\] = 2: .* the 2 feature rows",
        ),
        (dict(features=features, feature_rows=torch.tensor([-2, 0, 1, -1])), r"feature_rows\[0\] = -2"),
        (dict(features=torch.randn(2, hidden + 1), feature_rows=rows), rf"features must be \[N, {hidden}\]"),
        (dict(features=features, feature_rows=rows[:3]), r"feature_rows must be int64 \[4\]"),
        (dict(features=features, feature_rows=rows.int()), r"feature_rows must be int64"),
        (dict(features=features), "give both or neither"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model.step(ids, torch.tensor([0]), *state, **kwargs)


def test_mix_features_exports_without_data_dependence(model):
    """The mixing traces with a dynamic token count and feature count (no guard on the values,
    nothing data-dependent): the exported program gives the eager rows, -1 rows untouched."""
    from torch.export import Dim

    class Mix(torch.nn.Module):
        def forward(self, x, features, feature_rows):
            return model.mix_features(x, features, feature_rows)

    hidden = model.cfg.hidden_size
    s, n = Dim("s", min=2, max=64), Dim("n", min=2, max=64)
    args = (torch.randn(5, hidden), torch.randn(3, hidden), torch.tensor([-1, 0, 1, 2, -1]))
    program = torch.export.export(Mix(), args, dynamic_shapes=({0: s}, {0: n}, {0: s}), strict=False)
    x, features, rows = torch.randn(7, hidden), torch.randn(4, hidden), torch.tensor([3, -1, -1, 0, 1, 2, -1])
    got = program.module()(x, features, rows)
    assert torch.equal(got, Mix()(x, features, rows))
    assert torch.equal(got[rows < 0], x[rows < 0]) and torch.equal(got[0], features[3])
