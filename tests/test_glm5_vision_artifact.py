"""A glm5_next artifact with a vision tower, llvm-cpu: the tiny checkpoint with a tower
(tools/checkpoints/glm5_next.py, vision=True) compiled once (max_seq_len 128), which gives it the
`encode_image` and `prefill_mm` entry points, the manifest's `vision` and the checkpoint's
preprocessor_config.json. Session with images (`prefill` / `generate(..., images=[...])`, one
placeholder per image in the ids, expanded by the Session) against transformers'
Glm5NextForConditionalGeneration teacher-forced over the whole conversation: one image, two in one
prompt, an image in the second turn (after a generate, so the pending token goes first), and
generate with an image; images given as PNG bytes, a PIL image and a file path. encode_image's
features against transformers' vision model. And the errors: images for an artifact without a
tower, placeholders that are not the images in number, image tokens past max_seq_len, a single
image not in a list, a preprocessor config whose patches are not the tower's. A text-only
checkpoint gives a text-only artifact; cuda-sm90 keeps the tower."""

import dataclasses
import io
import json
import re
import shutil

import numpy as np
import pytest
import torch
from parity_configs import rel_err
from PIL import Image

from day0.runtime.images import ImageConfig, ImageError, expand_image_placeholders, image_tokens, preprocess
from day0.runtime.session import Session, SessionError

TOL = 1e-3  # logits, the bound (measured: ~1e-5)
FEATURE_TOL = 1e-4  # encode_image's features (measured: ~2e-6)
MAX_SEQ_LEN = 128
SEED = 3
SIZES = {"wide": (84, 56), "square": (28, 28), "tall": (42, 70)}  # PIL sizes (w, h)
IMAGE = object()  # a placeholder in a turn's parts


@pytest.fixture(scope="module")
def ckpt(glm5_vision_checkpoint):
    return glm5_vision_checkpoint


@pytest.fixture(scope="module")
def art(glm5_vision_artifact):
    return glm5_vision_artifact


@pytest.fixture(scope="module")
def session(art):
    return Session.load(art)


@pytest.fixture(scope="module")
def oracle(ckpt):
    from transformers import Glm5NextForConditionalGeneration

    return Glm5NextForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _image(name: str) -> Image.Image:
    w, h = SIZES[name]
    pixels = np.random.default_rng(len(name) * w + h).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _given(name: str, tmp_path):
    """The image as the Session is given it: PNG bytes (wide), a PIL image (square), a file (tall)."""
    if name == "square":
        return _image(name)
    buf = io.BytesIO()
    _image(name).save(buf, format="PNG")
    if name == "wide":
        return buf.getvalue()
    path = tmp_path / f"{name}.png"
    path.write_bytes(buf.getvalue())
    return str(path)


class Turn:
    """A prompt of `parts` (text lengths, IMAGE) with `images` (names of SIZES), then `decode`
    greedy tokens: prefill and decode steps (their logits compared), or with `generate` one
    Session.generate (its tokens compared)."""

    def __init__(self, parts, images=(), decode=3, generate=False):
        self.parts, self.images, self.decode, self.generate = parts, list(images), decode, generate

    def ids(self, config, seed: int) -> list[int]:
        """The prompt as a user writes it: one placeholder per image, between its start/end tokens."""
        g = torch.Generator().manual_seed(seed)
        ids = []
        for p in self.parts:
            if p is IMAGE:
                ids += [config.image_start_token_id, config.image_token_id, config.image_end_token_id]
            else:
                ids += torch.randint(0, config.image_start_token_id, (p,), generator=g).tolist()
        return ids


def _converse(session, config, turns, tmp_path):
    """Run the turns on a reset session: (the whole sequence, {position: day0's logits row},
    the positions whose next token day0 chose greedily, every image in order)."""
    session.reset()
    seq, rows, generating, images = [], {}, [], []
    for i, turn in enumerate(turns):
        ids = turn.ids(config, seed=10 + i)
        given = [_given(n, tmp_path) for n in turn.images]
        expanded = session.image_prompt(ids, given)
        pixels, grid = preprocess([_image(n) for n in turn.images], ImageConfig()) if turn.images else (None, None)
        if turn.images:  # the Session's expansion is the processor's
            counts = image_tokens(grid, config.vision_config.spatial_merge_size)
            assert expanded == expand_image_placeholders(ids, config.image_token_id, counts)
            images.append((pixels, grid))
        else:
            assert expanded == ids
        start = len(seq)  # the pending token of a generate, if any, is already in seq
        if turn.generate:
            out = session.generate(ids, max_new_tokens=turn.decode, images=given or None)
            seq += expanded
            generating += range(len(seq) - 1, len(seq) - 1 + len(out))
            seq += out
            continue
        logits = session.prefill(ids, images=given or None)
        assert logits.shape == (len(expanded), config.text_config.vocab_size)
        rows.update(zip(range(start, start + len(expanded)), logits))
        seq += expanded
        assert session.position == len(seq)
        for _ in range(turn.decode):
            token = int(rows[len(seq) - 1].argmax())
            generating.append(len(seq) - 1)
            rows[len(seq)] = session.decode(token)
            seq.append(token)
    return seq, rows, generating, images


def _oracle(oracle, seq, images) -> torch.Tensor:
    kwargs = {}
    if images:
        kwargs = dict(
            pixel_values=torch.from_numpy(np.concatenate([p for p, _ in images])),
            image_grid_thw=torch.from_numpy(np.concatenate([g for _, g in images])),
        )
    with torch.no_grad():
        return oracle(torch.tensor(seq)[None], use_cache=False, **kwargs).logits[0]


CASES = {
    "one image": [Turn([4, IMAGE, 6], ["wide"], decode=4)],
    "two images": [Turn([3, IMAGE, 2, IMAGE, 5], ["wide", "square"], decode=4)],
    # turn 1 ends in a generate: its last token is pending, prefilled before turn 2's image prompt
    "second turn": [Turn([7], decode=3, generate=True), Turn([2, IMAGE, 4], ["square"], decode=3)],
    "generate": [Turn([1, IMAGE, 5, IMAGE], ["tall", "wide"], decode=5, generate=True)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_session_with_images_equals_transformers(case, session, oracle, tmp_path):
    config = oracle.config
    seq, rows, generating, images = _converse(session, config, CASES[case], tmp_path)
    assert config.image_token_id in seq
    want = _oracle(oracle, seq, images)
    # greedy identical: transformers' argmax at every row day0 generated from is day0's token
    assert want[generating].argmax(-1).tolist() == [seq[p + 1] for p in generating]
    if rows:
        at = sorted(rows)
        got = torch.from_numpy(np.stack([rows[p] for p in at]))
        err = rel_err(got, want[at])
        print(f"{case}: {len(at)} logits rows, max rel err {err:.2e}")
        assert err < TOL
        zero = _oracle(oracle, [config.image_start_token_id if t == config.image_token_id else t for t in seq], [])
        assert rel_err(got, zero[at]) > 0.01  # the images matter


def test_encode_image_equals_transformers_vision_model(session, oracle, tmp_path):
    """Session.image_features (encode_image, one call per image) against transformers' vision model
    over all three images at once (its attention is per image too)."""
    names = list(SIZES)
    got = session.image_features([_given(n, tmp_path) for n in names])
    pixels, grid = preprocess([_image(n) for n in names], ImageConfig())
    with torch.no_grad():
        want = oracle.model.visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid)).pooler_output
    assert got.shape == tuple(want.shape) == (sum(image_tokens(grid, 2)), oracle.config.text_config.hidden_size)
    err = rel_err(got, want)
    print(f"encode_image: {got.shape[0]} feature rows, max rel err {err:.2e}")
    assert err < FEATURE_TOL
    # the same features from the preprocessed pixels (Session.encode_pixels: what benchmarks time)
    assert np.array_equal(session.encode_pixels(pixels, grid), got)


def test_encode_pixels_names_bad_shapes(session):
    v = session.vision
    pixels, grid = np.zeros((16, v.patch_dim), np.float32), np.array([[1, 4, 4]])
    assert session.encode_pixels(pixels, grid).shape[0] == 16 // v.merge_size**2
    for bad_pixels, bad_grid, message in [
        (pixels[:, :-1], grid, rf"pixels must be \[patches, {v.patch_dim}\], got \[16, {v.patch_dim - 1}\]"),
        (pixels, [[1, 4, 2]], r"grid holds 8 patches, pixels 16"),
        (pixels, [[1, 4]], r"grid must be \[images, 3\]"),
        (pixels[:6], [[1, 2, 3]], r"a multiple of 4 and at most max_patches"),
    ]:
        with pytest.raises(SessionError, match=message):
            session.encode_pixels(bad_pixels, bad_grid)


def test_manifest_and_artifact_files(art, ckpt):
    from day0.runtime.artifact import read_manifest

    m = read_manifest(art)
    # the tower at static patch counts: the fixture's 32 image tokens and max_seq_len's 128, 4
    # patches a token
    encoders = ["encode_image_128", "encode_image_512"]
    dense = ["prefill", "decode", *encoders, "prefill_mm"]
    assert list(m.entry_points) == dense + ["paged_prefill", "paged_prefill_mm", "paged_decode_1", "paged_decode_2"]
    assert [(m.entry_points[e].layout, m.entry_points[e].static_len) for e in encoders] == [
        ("vision", 128),
        ("vision", 512),
    ]
    paged_mm = m.entry_points["paged_prefill_mm"]
    assert paged_mm.layout == "paged" and paged_mm.min_len == 2 and paged_mm.inputs[7].startswith("features[N,hidden]")
    v = m.vision
    assert (v.image_token_id, v.patch_dim, v.merge_size, v.hidden_size) == (324, 1176, 2, 32)
    assert v.buckets == (128, 512) and v.max_patches == MAX_SEQ_LEN * 4
    assert v.image_config == "preprocessor_config.json"
    assert (art / v.image_config).read_bytes() == (ckpt / v.image_config).read_bytes()
    data = json.loads((art / "manifest.json").read_text())
    assert data["vision"]["image_token_id"] == 324
    # a text-only manifest has no `vision` key at all (what it was before images)
    text = dataclasses.replace(
        m, vision=None, paged=None, entry_points={k: m.entry_points[k] for k in ("prefill", "decode")}
    )
    assert "vision" not in text.to_json()
    assert type(m).from_json(json.loads(json.dumps(m.to_json()))) == m


def _drop_entry(m, name):
    del m["entry_points"][name]


@pytest.mark.parametrize(
    "edit,cause",
    [
        (lambda m: m["vision"].update(buckets=[128]), r"vision.buckets \[128\] must ascend to .* \(512\)"),
        (
            lambda m: _drop_entry(m, "encode_image_128"),
            r"vision.buckets name entry points the manifest lacks: encode_image_128",
        ),
        (
            lambda m: m["entry_points"]["encode_image_128"].update(static_len=512),
            r"image encoder 'encode_image_128' is not one of vision.buckets",
        ),
        (
            lambda m: m["vision"].update(buckets=[128, 300, 512]),
            r"vision.buckets name entry points the manifest lacks: encode_image_300",
        ),
    ],
    ids=["max", "missing-entry", "static-len", "extra-bucket"],
)
def test_edited_buckets_are_refused(art, tmp_path, edit, cause):
    """The manifest's image encoders and its vision.buckets must describe each other and the module."""
    from day0.runtime.artifact import ArtifactError

    edited = shutil.copytree(art, tmp_path / "edited")
    m = json.loads((edited / "manifest.json").read_text())
    edit(m)
    (edited / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=cause):
        Session.load(edited)


def test_errors(session, oracle, art, tmp_path):
    """Refused before any device call, the sequence untouched."""
    config = oracle.config
    token, start = config.image_token_id, config.image_start_token_id
    wide, square = _given("wide", tmp_path), _given("square", tmp_path)
    session.reset()
    session.prefill([1, 2, 3])
    cases = [
        (dict(ids=[1, token, 2], images=[wide, square]), r"1 image placeholder token\(s\) \(id 324\) but 2 image"),
        (dict(ids=[1, token, token], images=[wide]), r"has 2 image placeholder .* but 1 image"),
        (dict(ids=[1, token, 2]), r"has 1 image placeholder .* but 0 image"),
        (dict(ids=[1, 2], images=[wide]), r"has 0 image placeholder .* but 1 image"),
        (dict(ids=[1, token], images=wide), "images must be a list .* got bytes"),
    ]
    for kwargs, message in cases:
        with pytest.raises(SessionError, match=message):
            session.prefill(**kwargs)
        with pytest.raises(SessionError, match=message):
            session.generate(**kwargs, max_new_tokens=2)
    big = Image.fromarray(np.zeros((280, 280, 3), np.uint8))  # 20x20 patches: 100 image tokens
    with pytest.raises(
        SessionError, match=r"26 text token\(s\) and 1 image\(s\) of 100 image tokens make 126 .* reach 129"
    ):
        session.prefill([1] * 25 + [start, token], images=[big])
    session.prefill([1] * 24 + [token], images=[big])  # 3 + 24 + 100 = 127: fits
    with pytest.raises(ImageError, match=r"image images\[0\]: not a PNG"):
        session.prefill([1, token], images=[b"not an image"])
    assert session.position == 127

    # the same artifact described as text-only: images refused, the placeholder an ordinary token
    text = Session(art, dataclasses.replace(session.manifest, vision=None), session._vm)
    with pytest.raises(SessionError, match=r"1 image\(s\) given, but this artifact \(glm5_next\) has no vision tower"):
        text.prefill([1, token, 2], images=[wide])
    assert text.prefill([1, token, 2]).shape == (3, config.text_config.vocab_size)


def test_preprocessor_config_must_cut_the_towers_patches(ckpt, tmp_path):
    from day0.lowering.driver import BuildError, BuildOptions, compile_checkpoint

    other = tmp_path / "ckpt"
    shutil.copytree(ckpt, other)
    cfg = json.loads((other / "preprocessor_config.json").read_text())
    (other / "preprocessor_config.json").write_text(json.dumps({**cfg, "patch_size": 16}))
    with pytest.raises(BuildError, match=r"patch_size is 16, but the vision tower's .* is 14"):
        compile_checkpoint(other, tmp_path / "art", BuildOptions(max_seq_len=MAX_SEQ_LEN), progress=lambda *_: None)
    assert not (tmp_path / "art").exists()


def test_cuda_keeps_the_tower(ckpt, tmp_path):
    """cuda-sm90 compiles the tower too (Target.images), its attention on day0's kernel: the
    export keeps one day0::vision_attention a block and encode_image entry, the pass turns each
    into a dispatch of the kernel at one bf16 term (the target's image_terms), and iree-compile
    takes it (the GPU run of the kernel: tools/bench/gpu_vision_attention_check.py, docs/perf.md).
    It is also tests/test_cuda_target.py's KDA check for glm5_next (KDA, k-pool DSA): the KDA
    loop's dynamic-length prefill takes no caller transients (the driver says so and compiles
    without them) and no static prefill chunk."""
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.lowering.targets import get_target
    from day0.runtime.artifact import read_manifest

    notes = []
    assert get_target("cuda-sm90").images and get_target("cuda-sm90").image_terms == 1
    options = BuildOptions(target="cuda-sm90", max_seq_len=64, image_buckets=(16,), dump_stages=True)
    compile_checkpoint(ckpt, tmp_path / "a", options, progress=lambda stage, event: notes.append(event))
    assert not any("left out" in event for event in notes), notes
    stages = tmp_path / "a" / "stages"
    exported = (stages / "00-export.mlir").read_text()
    (after,) = stages.glob("*-vision-attention-to-cuda-kernel.mlir")
    depth, buckets = 2, 2  # the tiny tower's blocks; encode_image_64 and the largest, _256
    assert exported.count('torch.operator "torch.day0.vision_attention"') == depth * buckets
    calls = re.findall(r"call @(day0_vision_attention_\w+)\(", after.read_text())
    assert sorted(set(calls)) == [
        "day0_vision_attention_P256_H2_D16_t1_s3e800000",
        "day0_vision_attention_P64_H2_D16_t1_s3e800000",
    ]
    assert len(calls) == depth * buckets
    vmfb = (tmp_path / "a" / "model.vmfb").read_bytes()
    assert b"day0_vision_attention_d16_t1" in vmfb
    # glm5_next's text model on CUDA
    again = [e for e in notes if e.startswith("again without --iree-torch-externalize-transients")]
    assert len(again) == 1 and "does not dominate" in again[0]
    manifest = read_manifest(tmp_path / "a", verify=False)
    assert "--iree-torch-externalize-transients" not in manifest.compile_flags
    assert "prefill_chunk" not in manifest.entry_points
    assert {s.kind for s in manifest.state} >= {"kda_state", "conv_tail"}
    assert b".target sm_90" in vmfb and b"day0_topk_small" in vmfb and b"transients_size" not in vmfb


def test_text_only_checkpoint_is_unchanged(tmp_path):
    """A checkpoint whose tower no token can feed (the tiny text checkpoints: transformers' image
    token id is past their vocabulary) is the text model alone: no tower, no image entry points,
    its model.visual.* tensors unused."""
    from day0.frontend.export import entry_points
    from day0.models.checkpoint import Checkpoint
    from day0.models.registry import architecture
    from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

    path = write_tiny_glm5_next_checkpoint(tmp_path / "ckpt", seed=SEED)
    ckpt = Checkpoint.open(path)
    assert any(n.startswith("model.visual.") for n in ckpt.tensors)
    assert not (path / "preprocessor_config.json").exists()
    cfg, cls = architecture(ckpt.config)
    model = cls.empty(cfg, MAX_SEQ_LEN)
    assert model.vision is None and cfg.day0_vision is None
    assert cls.compile_notes(ckpt.config, cfg) == [
        "the vision tower is left out (text only): image_token_id 154854 is not an id of the text vocabulary (128)"
    ]
    shapes = model.parameter_shapes()
    assert not any(n.startswith("model.visual.") for n in shapes)
    ckpt.check_expected(shapes)
    assert entry_points(model) == ["prefill", "decode"]


def _day0(*args):
    import subprocess
    import sys
    from pathlib import Path

    day0 = Path(sys.executable).parent / "day0"
    return subprocess.run([str(day0), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_generate_cli_with_images_equals_the_session(session, art, tmp_path):
    """`day0 generate ART --image PATH ...`: the images go at the prompt's <|image|> placeholders,
    or before the prompt when it has none; the tokens are Session.generate's."""
    from day0.runtime.tokenizer import load_tokenizer

    paths = [_given(n, tmp_path) for n in ("tall",)] + [str(tmp_path / "wide.png")]
    _image("wide").save(paths[1])
    tok = load_tokenizer(art)
    token = session.vision.image_token_id
    prompt = "Look: <|image|> and <|image|>, what?"
    ids = tok.encode(prompt)
    assert ids.count(token) == 2
    session.reset()
    want = session.generate(ids, max_new_tokens=5, images=paths)
    r = _day0("generate", art, "--prompt", prompt, "--image", paths[0], "--image", paths[1], "--max-new-tokens", 5)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == prompt + tok.decode(want)
    # no placeholder in the ids: the image goes first
    session.reset()
    want = session.generate([token, 5, 6, 7], max_new_tokens=4, images=paths[:1])
    r = _day0("generate", art, "--prompt-ids", "5,6,7", "--image", paths[0], "--max-new-tokens", 4)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ",".join(map(str, want))


def test_generate_cli_image_errors(art, artifact, tmp_path):
    r = _day0("generate", art, "--prompt-ids", "5,6,7", "--image", tmp_path / "missing.png")
    assert r.returncode != 0 and "missing.png" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    r = _day0("generate", art, "--prompt-ids", "5,6,7", "--image", bad)
    assert r.returncode != 0 and "bad.png" in r.stderr and "Traceback" not in r.stderr
    png = _given("tall", tmp_path)
    r = _day0("generate", artifact("ds-sparse"), "--prompt-ids", "5,6,7", "--image", png)
    assert r.returncode != 0 and "has no vision tower" in r.stderr and "Traceback" not in r.stderr


def test_compile_cli_image_bucket_errors(ckpt, tmp_path):
    """--image-buckets out of range, or not numbers: an error naming the option, no artifact."""
    out = tmp_path / "art"
    r = _day0("compile", ckpt, "-o", out, "--max-seq-len", MAX_SEQ_LEN, "--image-buckets", "16,500")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--image-buckets: image bucket(s) [500] outside [1, 128] image tokens" in r.stderr
    r = _day0("compile", ckpt, "-o", out, "--image-buckets", "16,big")
    assert r.returncode != 0 and "expected image-token counts separated by commas, got '16,big'" in r.stderr
    assert not out.exists()
