"""The default model day0 ships: a few-million-parameter deepseek_v32 trained on the Python
standard library's docstrings (tools/train/: `train`, then `package`), its routed experts in
MXFP4. `make demo` compiles it and `day0 serve` examples serve it.

    tools/checkpoints/default/   config.json, model.safetensors, tokenizer.json (+ chat template),
                                 training.json (corpus fingerprint, recipe, losses),
                                 held_out.txt (held-out text for perplexity), NOTICE (PSF)
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_DIR = Path(__file__).parent / "default"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "training.json", "held_out.txt")


def default_checkpoint() -> Path:
    """The shipped checkpoint's directory; a clear error naming what is missing otherwise."""
    missing = [f for f in FILES if not (DEFAULT_DIR / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the default model at {DEFAULT_DIR} lacks {', '.join(missing)}: it ships with day0 "
            f"(rebuild it with python -m day0.tools.train.train and day0.tools.train.package)"
        )
    return DEFAULT_DIR
