"""The host side of a prompt with images, one implementation for Session and Engine.

A caller gives token ids holding ONE `image_token_id` per image (as a user writes `<|image|>`)
and the images (encoded bytes, a file path, or a PIL image). `ImagePrompts.prompt` checks the
placeholders against the images, decodes and preprocesses the images with the artifact's
preprocessor_config.json (runtime/images.py), and expands each placeholder to its image's token
count: nothing runs on the device, so every bad input is refused before any device work.
`ImagePrompts.encode` then runs each image through the artifact's `encode_image_<P>` on its own,
P the smallest compiled patch count holding it (the tower attends within an image; one call per
image keeps the P² scores per image) and returns the
features and feature rows that `prefill_mm` / `paged_prefill_mm` take (models/base.py
CausalLM.mix_features).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from day0.runtime.artifact import ArtifactError, VisionLayout, image_encoder


@dataclass
class ImagePrompt:
    """A checked prompt: `ids` int64, expanded; `pixels` (preprocess's pixel_values [P, patch_dim]
    f32), `grid` [n, 3] and `counts` (image tokens of each image) of its images."""

    ids: np.ndarray
    pixels: np.ndarray
    grid: np.ndarray
    counts: list[int]


class ImagePrompts:
    """The image side of one artifact with a vision tower (manifest `vision`); errors are raised
    as `error` (the caller's error class: SessionError, EngineError)."""

    def __init__(self, artifact_dir: Path, vision: VisionLayout, error: type[Exception]):
        self.vision, self.error = vision, error
        self.config = _image_config(Path(artifact_dir), vision)

    def prompt(self, ids: np.ndarray, images: list) -> ImagePrompt:
        """ids (checked token ids) with one placeholder per image, expanded; the images decoded
        and preprocessed. `error` for placeholders that are not the images in number; ImageError
        (runtime/images.py) for an image that cannot be decoded or is too large."""
        from day0.runtime.images import expand_image_placeholders, image_tokens, preprocess

        token = self.vision.image_token_id
        found = int((ids == token).sum())
        if found != len(images):
            raise self.error(
                f"the prompt has {found} image placeholder token(s) (id {token}) but {len(images)} image(s) "
                f"were given: put one placeholder in the ids for each image, in order (day0 expands it "
                f"to the image's tokens)"
            )
        rgb, sources = zip(*(_rgb(image, i) for i, image in enumerate(images)))
        pixels, grid = preprocess(list(rgb), self.config, sources=list(sources))
        counts = image_tokens(grid, self.vision.merge_size)
        expanded = np.asarray(expand_image_placeholders(ids, token, counts), dtype=np.int64)
        return ImagePrompt(expanded, pixels, grid, counts)

    def features(self, caller, pixels: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """The features [N, hidden] f32 of preprocessed images, each through the encode_image
        bucket holding it on its own (padded: runtime/images.py pad_to_bucket), called with
        `caller` (runtime/step_call.py StepCaller, the caller's own); `error` when they are not
        finite (broken vision weights or config values)."""
        from day0.runtime.images import pad_to_bucket, vision_inputs

        out, at, m2 = [], 0, self.vision.merge_size**2
        for t, h, w in grid.tolist():
            patches = t * h * w
            positions, segments = vision_inputs([[t, h, w]], self.vision.merge_size)
            bucket = self.vision.bucket(patches)
            inputs = pad_to_bucket(pixels[at : at + patches], positions, segments, bucket)
            host, _ = caller.call(image_encoder(bucket), list(inputs), 1, (0,), 1)
            out.append(host[0][: patches // m2])
            at += patches
        features = out[0] if len(out) == 1 else np.concatenate(out)  # (22 MB for a 1024² image: no copy)
        if not np.isfinite(features).all():
            raise self.error(
                "the vision tower's features are not finite (NaN or infinity): the checkpoint's vision weights or "
                "config values are broken"
            )
        return features

    def encode(self, caller, prompt: ImagePrompt) -> tuple[np.ndarray, np.ndarray]:
        """(features [N, hidden] f32, padded to at least 2 rows: the image steps take N >= 2;
        feature_rows [len(prompt.ids)] int64: -1 for a text row, k for the k-th image row)."""
        from day0.runtime.images import image_feature_rows

        features = self.features(caller, prompt.pixels, prompt.grid)
        rows = image_feature_rows(prompt.ids, self.vision.image_token_id, len(features))
        if len(features) < 2:  # an unused zero row
            features = np.concatenate([features, np.zeros((2 - len(features), self.vision.hidden_size), np.float32)])
        return features, rows


def image_list(images, error: type[Exception]) -> list:
    """`images` as a list (None: none); `error` for a single image not in a list (bytes and str
    are iterable: their items are not images)."""
    if images is None:
        return []
    if not isinstance(images, (list, tuple)):
        raise error(
            f"images must be a list (one image per placeholder: bytes, a file path or a PIL image), "
            f"got {type(images).__name__}"
        )
    return list(images)


def _rgb(image, i: int):
    """(the RGB PIL image of `image`: encoded bytes, a path, or a PIL image; its name in errors)."""
    from PIL import Image

    from day0.runtime.images import decode_image, to_rgb

    if isinstance(image, Image.Image):
        name = f"images[{i}]"
        return to_rgb(image, source=name), name
    path = isinstance(image, (str, os.PathLike))
    rgb = decode_image(image, source=None if path else f"images[{i}]")
    return rgb, str(image) if path else f"images[{i}]"


def _image_config(artifact_dir: Path, vision: VisionLayout):
    """The image processor's settings of an artifact with a vision tower (its
    preprocessor_config.json, or runtime/images.py's defaults), checked against the tower's patch
    sizes; ArtifactError otherwise."""
    from day0.runtime.images import ImageConfig, ImageConfigError

    try:
        cfg = ImageConfig.from_file(artifact_dir / vision.image_config) if vision.image_config else ImageConfig()
    except ImageConfigError as e:
        raise ArtifactError(f"artifact {artifact_dir}: {e}") from None
    ours = (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size, cfg.patch_dim)
    theirs = (vision.patch_size, vision.temporal_patch_size, vision.merge_size, vision.patch_dim)
    if ours != theirs:
        raise ArtifactError(
            f"artifact {artifact_dir}: the image processor's patch_size, temporal_patch_size, merge_size, "
            f"patch_dim {ours} are not the vision tower's {theirs} (manifest vision)"
        )
    return cfg
