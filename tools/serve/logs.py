"""Structured logs: one JSON object a line on stderr (python-json-logger), a level per layer.

Layers are loggers: `day0.server` (HTTP: one access line per request, errors), `day0.engine` (the
engine thread: admissions, finishes, step failures), `day0.runtime` (loading, warm-up). Every line
about a request carries its `request_id` (the `X-Request-Id` the client sent, or the id the server
gave it, which is also the completion's `id`). uvicorn's own lines go through the same handler.

    --log-level info                       every layer
    --log-levels server=debug,engine=warning   per layer, over --log-level
"""

from __future__ import annotations

import logging
import sys

LAYERS = ("server", "engine", "runtime")
LEVELS = ("debug", "info", "warning", "error", "critical")


def parse_levels(default: str, per_layer: str | None) -> dict[str, str]:
    """{layer: level} from --log-level and --log-levels 'layer=level,...'; ValueError naming the bad part."""
    if default.lower() not in LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}, got {default!r}")
    out = dict.fromkeys(LAYERS, default.lower())
    for item in filter(None, (per_layer or "").split(",")):
        layer, _, level = item.strip().partition("=")
        if layer not in LAYERS:
            raise ValueError(f"--log-levels: unknown layer {layer!r} (layers: {', '.join(LAYERS)})")
        if level.lower() not in LEVELS:
            raise ValueError(f"--log-levels: level of {layer} must be one of {', '.join(LEVELS)}, got {level!r}")
        out[layer] = level.lower()
    return out


def setup(levels: dict[str, str], stream=None) -> None:
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],  # uvicorn's terminal copy of the message
        )
    )
    for layer in LAYERS:
        log = logging.getLogger(f"day0.{layer}")
        log.handlers[:] = [handler]
        log.setLevel(levels[layer].upper())
        log.propagate = False
    for name in ("uvicorn", "uvicorn.error"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(levels["server"].upper())
        log.propagate = False
