"""Image content parts of chat requests (`{"type": "image_url", "image_url": {"url": ...}}`).

The server takes images inline only, as `data:image/...;base64,...` URLs: it never fetches a
remote URL or reads a file, and says so in the 400. For the request's length checks it needs each
image's token count before the engine sees the request: the image's size is read from its header
alone (Pillow opens lazily) and runtime/images.py's image_grid gives the tokens the resize will
make, so admission costs no decoding on the event loop. The engine process decodes and
preprocesses the pixels (Engine.add), and refuses an image whose pixels are broken there (a 400
for that request only).
"""

from __future__ import annotations

import base64
import binascii
import io

from day0.tools.serve.protocol import ApiError


def image_bytes(url: str, param: str) -> bytes:
    """The encoded image of a data URL; ApiError (400) naming `param` for any other URL."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else url[:16]
        raise ApiError(
            400,
            f"image URL scheme '{scheme}' is not supported: this server does not fetch images; send each image "
            f"inline as a data:image/...;base64,... URL",
            param,
            "image_url_not_supported",
        )
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise ApiError(400, "an image data URL must be base64: data:image/<format>;base64,<data>", param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ApiError(400, f"the image data URL is not valid base64 ({e})", param) from None
    if not data:
        raise ApiError(400, "the image data URL holds no bytes", param)
    return data


def image_token_count(data: bytes, config, merge_size: int, param: str) -> int:
    """The image tokens the image of `data` becomes (from its header's size: image_grid);
    ApiError (400) naming `param` when it is not an image Pillow can open."""
    from PIL import Image, UnidentifiedImageError

    from day0.runtime.images import ImageError, image_grid, image_tokens

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
        grid = image_grid(height, width, config)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
        why = str(e) if isinstance(e, ImageError) else f"not an image Pillow can read ({type(e).__name__})"
        raise ApiError(400, f"the image cannot be used: {why}", param) from None
    return image_tokens([grid], merge_size)[0]
