"""Images of a glm5_next (GLM-5.3-Flash) request: bytes -> RGB -> vision patches, and how many
placeholder tokens each image takes in the prompt.

The result equals what transformers' `Glm5NextImageProcessorPil` makes of the same decoded image
(bit for bit: same resize, same float32 arithmetic, same patch order; tests/test_images.py checks
it), but this module imports only Pillow and numpy. The serving host runs the runtime without
PyTorch or transformers (tests/test_runtime_imports.py): importing the transformers class pulls
torch in wherever torch is installed (4-5 s and ~470 MB resident on the 2-core CI machine; 1.2 s
without torch), and the work itself is one Pillow resize and a table look-up (2x faster than
transformers' at 1024x1024), so day0 keeps the model's own part here, as
tools/serve/chat.py does for chat templates: the token budget of `_resize_plan` (transformers'
`smart_resize` and `Glm5NextImageProcessorPil.resize`) and the patch layout. Pillow decodes and
resizes; it is pinned in requirements.txt.

Decoding (`decode_image`):
- formats: PNG, JPEG, WEBP and GIF (what OpenAI's API takes); Pillow's other decoders, rarely
  used and a larger attack surface, are not tried. A GIF's first frame is the image.
- the EXIF orientation is applied (as transformers' `load_image` does), so a camera JPEG is upright.
- modes: 1, L, P, RGB, RGBX, CMYK, YCbCr convert to RGB as Pillow converts them; LA, PA, RGBA
  and any image with a transparency key are composited onto white (transformers' `convert_to_rgb`:
  a transparent pixel becomes white, half-transparent ones blend). Note that transformers'
  `load_image` (a path, URL or base64 given to the processor) instead drops alpha and keeps the
  colour under it; day0 follows the image processor, whose result does not depend on what lies
  under transparent pixels. 16-bit, 32-bit and float images (modes I;16, I, F: 16-bit grayscale
  PNGs) are refused: Pillow's conversion clips them at 255, which makes them nearly all white.
- limits: an image of more than `max_pixels` pixels (default MAX_PIXELS, 8192x8192) is refused
  from its header, before its pixels are decoded (a decompression bomb: a few KB of PNG can
  declare gigapixels). Pillow's own guard (DecompressionBombError) is reported the same way.

Every problem is an `ImageError` (a ValueError) whose message names the image (`source`) and
the problem; a preprocessor_config.json that day0 cannot follow is an `ImageConfigError`.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_PIXELS = 1 << 26  # 8192 x 8192: any camera's photo; 192 MiB as RGB
# modes Pillow converts to RGB faithfully (alpha handled by `to_rgb`)
RGB_MODES = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr"})
HIGH_DEPTH_MODES = {"I": "32-bit integer", "I;16": "16-bit", "I;16B": "16-bit", "I;16L": "16-bit", "F": "float"}
CONFIG_FILE = "preprocessor_config.json"
IMAGE_PROCESSOR_TYPES = ("Glm5NextImageProcessor", "Glm5NextImageProcessorPil")
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers.image_utils' constants
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}  # PIL's filters

ImageInput = bytes | bytearray | memoryview | str | os.PathLike
"""Encoded image bytes, or the path of an image file."""


class ImageError(ValueError):
    """An image that cannot be used; the message names the image and the problem."""


class ImageConfigError(ValueError):
    """A preprocessor config that day0 cannot follow; the message names the field."""


def decode_image(data: ImageInput, *, source: str | None = None, max_pixels: int = MAX_PIXELS):
    """The RGB `PIL.Image.Image` of `data` (encoded bytes, or a file path), upright per its EXIF
    orientation, alpha composited onto white. `source` names the image in errors (default: the
    path, or "image" for bytes). Raises ImageError for empty, unidentifiable, corrupt or
    truncated data, a zero-size image, a mode with no sensible RGB, or more than `max_pixels`."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(data, (bytes, bytearray, memoryview)):
        name = source or "image"
        raw = bytes(data)
    elif isinstance(data, (str, os.PathLike)):
        path = str(data) if len(str(data)) <= 200 else str(data)[:200] + "..."  # not a data URL in a log line
        name = source or path
        try:
            raw = Path(data).read_bytes()
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            raise ImageError(f"image {name}: cannot read {path!r}: {getattr(e, 'strerror', None) or e}") from None
    else:
        raise ImageError(f"image {source or '?'}: expected bytes or a file path, got {type(data).__name__}")
    if not raw:
        raise ImageError(f"image {name}: empty (0 bytes)")

    try:
        image = Image.open(io.BytesIO(raw), formats=FORMATS)
    except UnidentifiedImageError:
        raise ImageError(
            f"image {name}: not a {', '.join(FORMATS[:-1])} or {FORMATS[-1]} image "
            f"(unrecognised or damaged header, {len(raw)} bytes)"
        ) from None
    except Image.DecompressionBombError as e:
        raise ImageError(f"image {name}: too large to decode (decompression-bomb guard): {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:  # Pillow reports bad headers in all of these
        raise ImageError(f"image {name}: corrupt or truncated image header: {e}") from None

    kind = image.format or "image"
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(f"image {name}: zero size ({width}x{height})")
    if width * height > max_pixels:
        raise ImageError(
            f"image {name}: {width}x{height} is {width * height} pixels, over the limit of {max_pixels} "
            "(decompression-bomb guard)"
        )
    _check_mode(image.mode, name)
    try:
        image.load()
        image = ImageOps.exif_transpose(image)
    except Image.DecompressionBombError as e:
        raise ImageError(f"image {name}: too large to decode (decompression-bomb guard): {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, KeyError, TypeError) as e:
        raise ImageError(f"image {name}: corrupt or truncated {kind} data: {e}") from None
    return to_rgb(image, source=name)


def to_rgb(image, *, source: str = "image"):
    """`image` (a PIL image) as RGB, the way transformers' `convert_to_rgb` does it: an image with
    an alpha band or a transparency key is composited onto opaque white, any other converts as
    Pillow converts it. ImageError for a zero-size image or an unsupported mode."""
    from PIL import Image

    if image.width <= 0 or image.height <= 0:
        raise ImageError(f"image {source}: zero size ({image.width}x{image.height})")
    _check_mode(image.mode, source)
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _check_mode(mode: str, source: str) -> None:
    if mode in RGB_MODES:
        return
    if mode in HIGH_DEPTH_MODES:
        raise ImageError(
            f"image {source}: {HIGH_DEPTH_MODES[mode]} pixels (mode {mode}) are not supported: converting them to "
            "8-bit RGB would clip them; save the image with 8 bits per channel"
        )
    raise ImageError(f"image {source}: pixel mode {mode} is not supported (supported: {', '.join(sorted(RGB_MODES))})")


@dataclass(frozen=True)
class ImageConfig:
    """The image processor's settings, named as in a checkpoint's preprocessor_config.json; the
    defaults are `Glm5NextImageProcessorPil`'s class attributes (transformers 5.23)."""

    patch_size: int = 14  # pixels per patch side
    temporal_patch_size: int = 2  # frames per patch: a still image is repeated this many times
    merge_size: int = 2  # merge_size x merge_size patches become one token
    min_image_tokens: int = 16  # the resize budget, in placeholder tokens
    max_image_tokens: int = 8000
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL.Image.Resampling.BICUBIC

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: 3 channels x temporal x patch x patch."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_dict(cls, config: dict, *, origin: str = CONFIG_FILE) -> ImageConfig:
        """The settings of a preprocessor_config.json dict; fields it lacks keep the defaults.
        Keys that do not change glm5_next's result (size, patch_expand_factor, processor_class,
        ...) are ignored, as transformers' glm5_next processor ignores them. ImageConfigError names
        the field when a value is out of range, a step day0 always runs is switched off
        (do_resize/do_rescale/do_normalize/do_convert_rgb false), or the config is another model's."""
        if not isinstance(config, dict):
            raise ImageConfigError(f"{origin}: expected a JSON object, got {type(config).__name__}")
        kind = config.get("image_processor_type")
        if kind is not None and kind not in IMAGE_PROCESSOR_TYPES:
            raise ImageConfigError(
                f"{origin}: image_processor_type {kind!r} is not glm5_next's {IMAGE_PROCESSOR_TYPES}"
            )
        for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if flag in config and config[flag] is not True:
                raise ImageConfigError(f"{origin}: {flag}={config[flag]!r}: day0 supports only {flag}=true")

        values = {}
        for f in fields(cls):
            if f.name not in config:
                continue
            v, where = config[f.name], f"{origin}: {f.name}"
            if f.name in ("image_mean", "image_std"):
                values[f.name] = _channel_triple(v, where, positive=f.name == "image_std")
            elif f.name == "rescale_factor":
                if not _is_number(v) or not math.isfinite(v) or v <= 0:
                    raise ImageConfigError(f"{where}={v!r}: expected a positive number")
                values[f.name] = float(v)
            elif f.name == "resample":
                if not _is_int(v) or v not in RESAMPLE:
                    raise ImageConfigError(f"{where}={v!r}: expected a PIL filter number {sorted(RESAMPLE)}")
                values[f.name] = int(v)
            else:
                if not _is_int(v) or v < 1:
                    raise ImageConfigError(f"{where}={v!r}: expected a positive integer")
                values[f.name] = int(v)
        cfg = cls(**values)
        if cfg.min_image_tokens > cfg.max_image_tokens:
            raise ImageConfigError(
                f"{origin}: min_image_tokens={cfg.min_image_tokens} is over max_image_tokens={cfg.max_image_tokens}"
            )
        return cfg

    @classmethod
    def from_file(cls, path) -> ImageConfig:
        """The settings of a preprocessor_config.json file (or of the one in directory `path`)."""
        import json

        path = Path(path)
        if path.is_dir():
            path = path / CONFIG_FILE
        try:
            config = json.loads(path.read_text())
        except OSError as e:
            raise ImageConfigError(f"{path}: cannot read: {e.strerror or e}") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ImageConfigError(f"{path}: not JSON: {e}") from None
        return cls.from_dict(config, origin=str(path))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _channel_triple(v, where: str, positive: bool) -> tuple[float, float, float]:
    """One number per RGB channel; a single number applies to all three (as transformers does)."""
    values = [v] * 3 if _is_number(v) else v
    if not isinstance(values, (list, tuple)) or len(values) != 3 or not all(_is_number(x) for x in values):
        raise ImageConfigError(f"{where}={v!r}: expected 3 numbers (R, G, B)")
    if not all(math.isfinite(x) for x in values) or (positive and not all(x > 0 for x in values)):
        raise ImageConfigError(f"{where}={v!r}: expected finite{' positive' if positive else ''} numbers")
    return tuple(float(x) for x in values)


def _resize_plan(height: int, width: int, cfg: ImageConfig) -> tuple[int, int, int, int]:
    """(content_h, content_w, target_h, target_w): the image is resized to the content size and
    zero-padded at the bottom and right to the target size, a multiple of patch_size * merge_size
    whose token count lies in [min_image_tokens, max_image_tokens]. An image already small enough
    is only padded, never enlarged, unless it is under min_image_tokens. This is transformers'
    `smart_resize` + `Glm5NextImageProcessorPil.resize` step for step (same float operations), so
    the sizes agree exactly."""
    factor = cfg.patch_size * cfg.merge_size
    frames = cfg.temporal_patch_size  # a still image counts as temporal_patch_size frames
    pixels_per_token = frames * factor**2
    min_pixels = cfg.min_image_tokens * pixels_per_token
    max_pixels = cfg.max_image_tokens * pixels_per_token

    def align(value):
        return math.ceil(value / factor) * factor

    aligned_frames = max(frames, round(frames / frames) * frames)
    target_h, target_w = align(height), align(width)
    if aligned_frames * target_h * target_w < min_pixels:
        scale = math.sqrt(min_pixels / (frames * height * width))
        target_h = align(max(1, math.ceil(height * scale)))
        target_w = align(max(1, math.ceil(width * scale)))
    if aligned_frames * target_h * target_w > max_pixels:
        # the largest aligned canvas within budget, by binary search over the content height
        low, high = 1, height
        target_h, target_w = factor, factor
        while low <= high:
            content = (low + high) // 2
            h, w = align(content), align(max(1, math.floor(width * content / height)))
            if aligned_frames * h * w <= max_pixels:
                target_h, target_w = h, w
                low = content + 1
            else:
                high = content - 1

    scale = min(target_h / height, target_w / width)
    if frames * height * width >= pixels_per_token * cfg.min_image_tokens:
        scale = min(1.0, scale)
    content_h = max(1, min(target_h, math.floor(height * scale)))
    content_w = max(1, min(target_w, math.floor(width * scale)))
    return content_h, content_w, target_h, target_w


def image_grid(height: int, width: int, cfg: ImageConfig) -> tuple[int, int, int]:
    """(t, h, w) in patches of an image of `height` x `width` pixels: its row of grid_thw, known
    from the size alone (before the pixels are decoded, for admission control). t is 1: a still
    image's temporal_patch_size copies share one patch row."""
    if height < 1 or width < 1:
        raise ImageError(f"image size {width}x{height}: zero size")
    _, _, target_h, target_w = _resize_plan(height, width, cfg)
    return 1, target_h // cfg.patch_size, target_w // cfg.patch_size


def _value_table(cfg: ImageConfig) -> np.ndarray:
    """[3, 256] float32: the normalised value of each 8-bit level per channel, computed with
    transformers' operations (rescale in float64 then cast, normalise in float32)."""
    levels = (np.arange(256, dtype=np.float64) * cfg.rescale_factor).astype(np.float32)
    mean = np.array(cfg.image_mean, dtype=np.float32)[:, None]
    std = np.array(cfg.image_std, dtype=np.float32)[:, None]
    return (levels[None, :] - mean) / std


def preprocess(images: Sequence, cfg: ImageConfig, *, sources: Sequence[str] | None = None):
    """(pixel_values, grid_thw) of `images` (PIL images, normally `decode_image`'s): pixel_values
    float32 [total patches, 3 * temporal_patch_size * patch_size**2], the images' patches one after
    the other; grid_thw int64 [len(images), 3], each row (1, h, w) in patches. Equal to
    transformers' Glm5NextImageProcessorPil output for the same images. Inside an image the
    patches go in merge_size x merge_size blocks (row-major blocks, row-major inside a block), and
    each patch row is channel-major: (C, temporal, patch_y, patch_x), the image repeated over the
    temporal axis. No images gives empty arrays."""
    from PIL import Image

    sources = list(sources) if sources is not None else [str(i) for i in range(len(images))]
    if len(sources) != len(images):
        raise ImageError(f"preprocess: {len(images)} images but {len(sources)} sources")
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size

    plans = []
    for image, source in zip(images, sources):
        if not isinstance(image, Image.Image):
            raise ImageError(f"image {source}: expected a PIL image, got {type(image).__name__}")
        rgb = to_rgb(image, source=source)
        plans.append((rgb, _resize_plan(rgb.height, rgb.width, cfg)))

    total = sum((th // p) * (tw // p) for _, (_, _, th, tw) in plans)
    pixel_values = np.empty((total, 3, t, p * p), dtype=np.float32)
    grid_thw = np.zeros((len(plans), 3), dtype=np.int64)
    table = _value_table(cfg)
    row = 0
    for i, (rgb, (content_h, content_w, target_h, target_w)) in enumerate(plans):
        if (content_h, content_w) != (rgb.height, rgb.width):
            rgb = rgb.resize((content_w, content_h), resample=cfg.resample)
        canvas = np.zeros((target_h, target_w, 3), dtype=np.uint8)  # zero padding, as transformers pads
        canvas[:content_h, :content_w] = np.asarray(rgb)
        gh, gw = target_h // p, target_w // p
        # (gh/m, m, p, gw/m, m, p, C) -> (gh/m, gw/m, m, m, C, p, p): transformers' patch order
        levels = canvas.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
        levels = levels.reshape(gh * gw, 3, p * p)
        out = pixel_values[row : row + gh * gw]
        for c in range(3):
            np.take(table[c], levels[:, c], out=out[:, c, 0])
        out[:, :, 1:] = out[:, :, :1]
        grid_thw[i] = (1, gh, gw)
        row += gh * gw
    return pixel_values.reshape(total, cfg.patch_dim), grid_thw


def image_tokens(
    grid_thw, merge_size: int, *, max_image_tokens: int | None = None, sources: Sequence[str] | None = None
) -> list[int]:
    """Placeholder tokens of each image: t * h * w // merge_size**2 for its grid_thw row (one token
    per merge_size x merge_size patches, as Glm5NextProcessor counts). ImageError naming the image
    and the limit when one needs more than `max_image_tokens` (the serving host's limit, e.g. what
    its vision tower or context can take; None: no limit)."""
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    counts = [int(t * h * w) // merge_size**2 for t, h, w in grid]
    if max_image_tokens is not None:
        names = list(sources) if sources is not None else [str(i) for i in range(len(counts))]
        for count, name, (_t, h, w) in zip(counts, names, grid):
            if count > max_image_tokens:
                raise ImageError(
                    f"image {name}: needs {count} image tokens ({h}x{w} patches), over the limit "
                    f"max_image_tokens={max_image_tokens}"
                )
    return counts


def expand_image_placeholders(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> list[int]:
    """`ids` with the i-th `image_token_id` repeated counts[i] times: Glm5NextProcessor's
    expansion done on token ids. The processor replaces each `<|image|>` in the text by
    `<|image|>` * count and adds nothing else: the `<|begin_of_image|>` / `<|end_of_image|>` around
    it come from the chat template and are left as they are. ImageError when the prompt's
    placeholders and the images differ in number (the processor refuses that too)."""
    ids = [int(i) for i in ids]
    found = ids.count(image_token_id)
    if found != len(counts):
        raise ImageError(
            f"the prompt has {found} image placeholder token(s) (id {image_token_id}) but {len(counts)} "
            f"image(s) were given: each image needs exactly one placeholder"
        )
    for i, count in enumerate(counts):
        if not (_is_int(count) or isinstance(count, np.integer)) or count < 1:
            raise ImageError(f"image {i}: placeholder count {count!r} is not a positive integer")
    out: list[int] = []
    images = iter(counts)
    for token in ids:
        if token == image_token_id:
            out.extend([token] * int(next(images)))
        else:
            out.append(token)
    return out


def vision_inputs(grid_thw, spatial_merge_size: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(positions [P, 2] int64, segments [P] int64) for images/videos of `grid_thw` [N, 3] (t, h, w
    in patches; a list of triples, an array or a tensor), in transformers' patch order: the vision
    tower's inputs beside pixel_values (models/vision.py, the `encode_image` entry point).

    positions: per patch its (h, w) in its frame, block-major over the m×m merge blocks, each frame
    of a video repeating its image's (transformers' get_vision_position_ids). segments: the index
    of the patch's frame over all frames of all entries, since transformers attends within each
    frame separately (get_vision_cu_seqlens, merge_temporal=False): for images, the image index."""
    grids = np.asarray(grid_thw.tolist() if hasattr(grid_thw, "tolist") else grid_thw)
    if grids.ndim != 2 or grids.shape[1] != 3 or grids.shape[0] == 0 or not np.issubdtype(grids.dtype, np.integer):
        raise ValueError(f"grid_thw must be a non-empty [N, 3] array of integers (got shape {grids.shape})")
    m = spatial_merge_size
    positions, segments, frame = [], [], 0
    for i, (t, h, w) in enumerate(grids.tolist()):
        if t < 1 or h < 1 or w < 1 or h % m or w % m:
            raise ValueError(
                f"grid_thw[{i}] = ({t}, {h}, {w}): t, h, w must be >= 1 and h, w multiples of the "
                f"spatial merge size {m}"
            )
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (h // m, m, w // m, m)
        hw = np.stack(
            [rows.reshape(block).transpose(0, 2, 1, 3).ravel(), cols.reshape(block).transpose(0, 2, 1, 3).ravel()], -1
        )
        positions.append(np.tile(hw, (t, 1)))
        segments.append(np.repeat(np.arange(frame, frame + t), h * w))
        frame += t
    return np.concatenate(positions).astype(np.int64), np.concatenate(segments).astype(np.int64)


def image_feature_rows(ids: Sequence[int], image_token_id: int, feature_count: int) -> np.ndarray:
    """feature_rows [len(ids)] int64 of an expanded prompt (expand_image_placeholders) whose images
    gave `feature_count` feature rows (the vision tower's output for them, in order): -1 where the
    token is text, k at the k-th `image_token_id`, whose embedding the model replaces by feature row
    k (transformers' masked_scatter; models/base.py CausalLM.mix_features). A prompt prefilled in
    pieces passes every piece the same features and its own slice of these rows. ImageError when
    the placeholder rows and the feature rows differ in number."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    placeholders = ids == image_token_id
    found = int(placeholders.sum())
    if found != feature_count:
        raise ImageError(
            f"the prompt has {found} image placeholder row(s) (id {image_token_id}) but the images gave "
            f"{feature_count} feature row(s): each image needs as many placeholders as its feature rows "
            "(image_tokens, expand_image_placeholders)"
        )
    rows = np.full(ids.shape, -1, dtype=np.int64)
    rows[placeholders] = np.arange(found, dtype=np.int64)
    return rows


def image_buckets(min_tokens: int, max_tokens: int, merge_size: int, tokens: Sequence[int] = ()) -> tuple[int, ...]:
    """The patch counts an artifact compiles the vision tower at (`encode_image_<P>`), ascending:
    `tokens` (image-token counts) if given, else 2^k and 3·2^(k-1) (16, 24, 32, 48, 64, ...) from
    the first holding `min_tokens` up to `max_tokens`, and `max_tokens` itself; each times
    merge_size² patches.

    Why static sizes: IREE compiles the tower's attention for a dynamic patch count into
    much slower dispatches than for a fixed one (docs/perf.md, images). An image runs at the first
    bucket holding it, padded with patches of a segment of their own that no image patch attends
    to (pad_to_bucket): steps of at most 1.5x cost at most 1.5x the MLP's work and 2.25x the
    attention's (doubling steps, up to 4x the attention's, measured slower in the same section),
    and two functions an octave cover every size. ValueError for tokens outside [1, max_tokens]."""
    if tokens:
        bad = [t for t in tokens if not 1 <= int(t) <= max_tokens]
        if bad:
            raise ValueError(f"image bucket(s) {bad} outside [1, {max_tokens}] image tokens")
        counts = sorted({int(t) for t in tokens} | {max_tokens})
    else:
        steps = sorted({b for k in range(1, max_tokens.bit_length() + 1) for b in (2**k, 3 * 2 ** (k - 1))})
        counts = [b for b in steps if min(min_tokens, max_tokens) <= b < max_tokens] + [max_tokens]
    return tuple(t * merge_size**2 for t in counts)


def pad_to_bucket(
    pixels: np.ndarray, positions: np.ndarray, segments: np.ndarray, bucket: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vision tower's inputs for P patches grown to `bucket` patches: zero pixels at position
    (0, 0) in a segment past every real one, so real patches attend exactly as without them
    (masked scores are -inf, their weights exactly 0) and the padding's feature rows, which
    follow the real ones, are dropped by the caller."""
    extra = bucket - len(pixels)
    if extra == 0:
        return pixels, positions, segments
    pad = np.full(extra, segments.max() + 1, dtype=np.int64)
    return (
        np.concatenate([pixels, np.zeros((extra, pixels.shape[1]), pixels.dtype)]),
        np.concatenate([positions, np.zeros((extra, 2), np.int64)]),
        np.concatenate([segments, pad]),
    )
