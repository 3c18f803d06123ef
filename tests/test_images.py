"""runtime/images.py against transformers' glm5_next image processor: real image files written
with Pillow (PNG RGB/RGBA/palette/L/LA/1-bit, JPEG RGB/CMYK/EXIF-rotated, GIF, WEBP; odd and large
sizes) give bit-identical pixel_values and grid_thw, the placeholder expansion equals
Glm5NextProcessor's input_ids, and each bad input fails with a message naming the image and the
problem."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps

from day0.runtime.images import (
    MAX_PIXELS,
    ImageConfig,
    ImageConfigError,
    ImageError,
    decode_image,
    expand_image_placeholders,
    image_grid,
    image_tokens,
    preprocess,
)


@pytest.fixture(scope="module")
def reference():
    """transformers' processor, as AutoImageProcessor picks it without torchvision."""
    from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil

    return Glm5NextImageProcessorPil()


def _pixels(w: int, h: int, channels: int, seed: int = 0) -> np.ndarray:
    """A gradient plus noise: resizing it is not trivial, neighbouring pixels still correlate."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = (x * 255 // max(w - 1, 1) + y * 128 // max(h - 1, 1))[..., None] + np.arange(channels) * 60
    return ((base + rng.integers(0, 40, (h, w, channels))) % 256).astype(np.uint8)


def _rgba(w, h):
    a = _pixels(w, h, 4, seed=1)
    a[: h // 3, :, 3] = 0  # fully transparent band (its colour must not matter), then graded alpha
    a[h // 3 :, :, 3] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    return Image.fromarray(a, "RGBA")


def _palette(w, h, transparent: bool):
    im = Image.fromarray(_pixels(w, h, 3, seed=2)).quantize(colors=16)
    if transparent:
        im.info["transparency"] = 3
    return im


def _exif_rotated(w, h):
    im = Image.fromarray(_pixels(w, h, 3, seed=3))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    return im, {"exif": exif.tobytes()}


# name -> (file name, PIL image, save options); sizes odd on purpose
FILES = {
    "png-rgb-97x61": ("a.png", lambda: Image.fromarray(_pixels(97, 61, 3)), {}),
    "png-rgba-64x40": ("b.png", lambda: _rgba(64, 40), {}),
    "png-palette-transparent-50x33": ("c.png", lambda: _palette(50, 33, True), {}),
    "png-palette-31x77": ("d.png", lambda: _palette(31, 77, False), {}),
    "png-gray-45x200": ("e.png", lambda: Image.fromarray(_pixels(45, 200, 1)[..., 0], "L"), {}),
    "png-gray-alpha-40x40": ("f.png", lambda: Image.fromarray(_pixels(40, 40, 2), "LA"), {}),
    "png-1bit-33x17": ("g.png", lambda: Image.fromarray(_pixels(33, 17, 1)[..., 0] > 128), {}),
    "png-1x1": ("h.png", lambda: Image.fromarray(_pixels(1, 1, 3)), {}),
    "jpeg-300x517": ("i.jpg", lambda: Image.fromarray(_pixels(300, 517, 3)), {"quality": 90}),
    "jpeg-1500x900": ("j.jpg", lambda: Image.fromarray(_pixels(1500, 900, 3)), {}),
    "jpeg-cmyk-70x50": ("k.jpg", lambda: Image.fromarray(_pixels(70, 50, 4), "CMYK"), {}),
    "jpeg-exif-rotated-120x70": ("l.jpg", lambda: _exif_rotated(120, 70)[0], _exif_rotated(120, 70)[1]),
    "gif-palette-60x45": ("m.gif", lambda: _palette(60, 45, False), {}),
    "webp-rgba-90x30": ("n.webp", lambda: _rgba(90, 30), {"lossless": True}),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    paths = {}
    for name, (file, make, options) in FILES.items():
        make().save(d / file, **options)
        paths[name] = d / file
    return paths


def _same(ours, ref):
    pv, grid = ours
    assert pv.dtype == np.float32 and grid.dtype == np.int64
    assert pv.shape == ref["pixel_values"].shape and np.array_equal(grid, ref["image_grid_thw"])
    np.testing.assert_array_equal(pv, ref["pixel_values"])  # bit for bit


@pytest.mark.parametrize("name", FILES)
def test_each_file_preprocesses_as_transformers(files, reference, name):
    path = files[name]
    image = decode_image(path)
    assert image.mode == "RGB"
    ours = preprocess([image], ImageConfig())
    # the processor given the decoded file upright (transformers' load_image applies EXIF too)
    _same(ours, reference(ImageOps.exif_transpose(Image.open(path))))
    assert tuple(ours[1][0]) == image_grid(image.height, image.width, ImageConfig())
    assert ours[1][0, 1] * ours[1][0, 2] == reference.get_number_of_image_patches(image.height, image.width)


def test_without_alpha_it_equals_the_processor_given_the_path(files, reference):
    """For an opaque image day0's decode is transformers' load_image (EXIF included); with alpha
    load_image would drop it, day0 composites onto white as the image processor does."""
    from transformers.image_utils import load_image

    for name in ("png-rgb-97x61", "jpeg-300x517", "jpeg-exif-rotated-120x70", "png-palette-31x77"):
        _same(preprocess([decode_image(files[name])], ImageConfig()), reference(load_image(str(files[name]))))
    rotated = decode_image(files["jpeg-exif-rotated-120x70"])
    assert rotated.size == (70, 120)


def test_alpha_is_composited_onto_white(files):
    image = decode_image(files["png-rgba-64x40"])
    assert np.all(np.asarray(image)[: 40 // 3] == 255)  # the transparent band is white whatever its colour


def test_a_batch_concatenates_in_order_with_one_grid_row_each(files, reference):
    names = ["jpeg-1500x900", "png-1x1", "png-rgba-64x40", "jpeg-300x517"]
    images = [decode_image(files[n]) for n in names]
    ours = preprocess(images, ImageConfig())
    _same(ours, reference([ImageOps.exif_transpose(Image.open(files[n])) for n in names]))
    assert ours[1].shape == (4, 3) and np.all(ours[1][:, 0] == 1)
    empty = preprocess([], ImageConfig())
    assert empty[0].shape == (0, 1176) and empty[1].shape == (0, 3)


def test_a_checkpoint_config_is_followed_as_transformers_follows_it(files, reference):
    """Non-default budget (downscaling 1500x900 and upscaling 1x1), mean/std and filter."""
    config = {
        "image_processor_type": "Glm5NextImageProcessor",
        "min_image_tokens": 40,
        "max_image_tokens": 300,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.25, 0.5, 0.75],
        "resample": 2,
        "size": {"longest_edge": 1},
        "patch_expand_factor": 1,
    }
    cfg = ImageConfig.from_dict(config)
    kwargs = {k: v for k, v in config.items() if k not in ("image_processor_type", "size")}
    for name in ("jpeg-1500x900", "png-1x1", "png-rgb-97x61"):
        image = decode_image(files[name])
        pv, grid = preprocess([image], cfg)
        _same((pv, grid), reference(image, **kwargs))
        assert 40 <= image_tokens(grid, cfg.merge_size)[0] <= 300


def test_config_defaults_are_the_processor_class_defaults(reference, tmp_path):
    cfg = ImageConfig()
    for field in ("patch_size", "temporal_patch_size", "merge_size", "min_image_tokens", "max_image_tokens"):
        assert getattr(cfg, field) == getattr(reference, field), field
    assert list(cfg.image_mean) == list(reference.image_mean) and list(cfg.image_std) == list(reference.image_std)
    assert cfg.rescale_factor == reference.rescale_factor and cfg.resample == int(reference.resample)
    assert ImageConfig.from_dict({}) == cfg
    (tmp_path / "preprocessor_config.json").write_text('{"max_image_tokens": 1024}')
    assert ImageConfig.from_file(tmp_path).max_image_tokens == 1024


@pytest.mark.parametrize(
    "config, message",
    [
        ({"patch_size": 0}, "patch_size=0: expected a positive integer"),
        ({"merge_size": True}, "merge_size=True: expected a positive integer"),
        ({"image_mean": [0.5, 0.5]}, "image_mean=[0.5, 0.5]: expected 3 numbers"),
        ({"image_std": [1, 0, 1]}, "image_std=[1, 0, 1]: expected finite positive numbers"),
        ({"resample": 9}, "resample=9: expected a PIL filter number"),
        ({"min_image_tokens": 500, "max_image_tokens": 100}, "min_image_tokens=500 is over max_image_tokens=100"),
        ({"do_normalize": False}, "do_normalize=False: day0 supports only do_normalize=true"),
        ({"image_processor_type": "Qwen2VLImageProcessor"}, "'Qwen2VLImageProcessor' is not glm5_next's"),
    ],
)
def test_bad_configs_name_the_field(config, message):
    with pytest.raises(ImageConfigError, match="preprocessor_config.json") as e:
        ImageConfig.from_dict(config)
    assert message in str(e.value)


def _png_header(width: int, height: int) -> bytes:
    """A PNG declaring width x height (RGB) with no real pixel data."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def _png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


SRC = "messages[0].content[1]"


@pytest.mark.parametrize(
    "data, message",
    [
        (lambda: _png_bytes(Image.fromarray(_pixels(64, 64, 3)))[:3000], "corrupt or truncated PNG data"),
        (lambda: _png_bytes(Image.fromarray(_pixels(64, 64, 3)))[:20], "corrupt or truncated image header"),
        (lambda: np.random.default_rng(5).bytes(2000), "not a PNG, JPEG, WEBP or GIF image"),
        (lambda: b"", "empty (0 bytes)"),
        (lambda: _png_header(0, 5), "not a PNG, JPEG, WEBP or GIF image"),  # Pillow refuses a zero-width PNG
        (lambda: _png_header(9000, 9000), f"9000x9000 is 81000000 pixels, over the limit of {MAX_PIXELS}"),
        (lambda: _png_header(100000, 100000), "decompression-bomb guard"),
        (lambda: _png_bytes(Image.fromarray(_pixels(8, 8, 1)[..., 0].astype(np.uint16) * 200)), "16-bit pixels"),
        (lambda: _bmp(), "not a PNG, JPEG, WEBP or GIF image"),
    ],
    ids=["truncated", "truncated-header", "random", "empty", "zero-width", "too-large", "bomb", "16-bit", "bmp"],
)
def test_bad_bytes_fail_naming_the_image_and_the_problem(data, message):
    with pytest.raises(ImageError) as e:
        decode_image(data(), source=SRC)
    assert str(e.value).startswith(f"image {SRC}: ") and message in str(e.value)


def _bmp() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "BMP")
    return buf.getvalue()


def test_files_fail_naming_the_path(files, tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match=f"image {empty}: empty"):
        decode_image(empty)
    with pytest.raises(ImageError, match="cannot read"):
        decode_image(tmp_path / "missing.png")
    with pytest.raises(
        ImageError, match=f"image {files['png-rgb-97x61']}: 97x61 is 5917 pixels, over the limit of 5000"
    ):
        decode_image(files["png-rgb-97x61"], max_pixels=5000)
    with pytest.raises(ImageError, match=r"image 1: zero size \(0x5\)"):
        preprocess([Image.new("RGB", (4, 4)), Image.new("RGB", (0, 5))], ImageConfig())
    with pytest.raises(ImageError, match="image 0: float pixels"):
        preprocess([Image.new("F", (4, 4))], ImageConfig())


def test_image_tokens_and_their_limit(files):
    images = [decode_image(files[n]) for n in ("jpeg-1500x900", "png-rgb-97x61")]
    _, grid = preprocess(images, ImageConfig())
    assert grid.tolist() == [[1, 66, 108], [1, 8, 12]]
    assert image_tokens(grid, 2) == [66 * 108 // 4, 24]
    assert image_tokens(grid, 2, max_image_tokens=1782) == [1782, 24]
    with pytest.raises(
        ImageError,
        match=r"image big.jpg: needs 1782 image tokens \(66x108 patches\), over the limit max_image_tokens=1000",
    ):
        image_tokens(grid, 2, max_image_tokens=1000, sources=["big.jpg", "small.png"])


def test_placeholders_expand_as_the_processor_expands_them(files, reference, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.glm5_next.processing_glm5_next import Glm5NextProcessor

    specials = [
        "<|image|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|video|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
    ]
    vocab = {w: i for i, w in enumerate(["[UNK]", "look", "at", "this", "and", "that", ".", *specials])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    # the class check looks up the video processor class, which needs torchvision
    monkeypatch.setattr(Glm5NextProcessor, "check_argument_for_proper_class", lambda self, name, arg: None)
    processor = Glm5NextProcessor(image_processor=reference, tokenizer=tok)

    text = "look at <|begin_of_image|><|image|><|end_of_image|> and <|image|> ."
    images = [decode_image(files[n]) for n in ("png-rgb-97x61", "png-1x1")]
    expected = processor(text=text, images=images)
    pv, grid = preprocess(images, ImageConfig())
    ids = expand_image_placeholders(tk.encode(text).ids, vocab["<|image|>"], image_tokens(grid, 2))
    assert ids == expected["input_ids"][0]
    assert ids.count(vocab["<|image|>"]) == 24 + 16  # 8x12 and 8x8 patches, 4 patches a token
    np.testing.assert_array_equal(pv, expected["pixel_values"])


def test_placeholder_count_must_match_the_images():
    with pytest.raises(ImageError, match=r"the prompt has 2 image placeholder token\(s\) \(id 7\) but 1 image\(s\)"):
        expand_image_placeholders([1, 7, 2, 7], 7, [4])
    with pytest.raises(ImageError, match=r"the prompt has 1 image placeholder token\(s\) \(id 7\) but 2 image\(s\)"):
        expand_image_placeholders([1, 7, 2], 7, [4, 4])
    with pytest.raises(ImageError, match="placeholder count 0 is not a positive integer"):
        expand_image_placeholders([7], 7, [0])
    assert expand_image_placeholders([1, 2], 7, []) == [1, 2]
    assert expand_image_placeholders([7, 1, 7], 7, [2, 3]) == [7, 7, 1, 7, 7, 7]
