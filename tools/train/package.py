"""Turn a trained checkpoint (tools/train/train.py) into the default model day0 ships.

    python -m day0.tools.train.package TRAINED OUT

OUT gets the checkpoint with its routed experts in MXFP4 (`day0 quantize`, compressed-tensors
layout, as the target family's checkpoints ship them), its tokenizer and chat template,
`training.json`, and `held_out.txt`: the first HELD_OUT_CHARS characters of the held-out
documents, so that the perplexity tests read the same text on every machine (the corpus itself
depends on the interpreter's version), with the PSF notice the docstrings come under (NOTICE).
Written atomically.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from day0.runtime.files import writing_dir

HELD_OUT_CHARS = 24_000
NOTICE = """The default model was trained on, and held_out.txt quotes, docstrings of the Python
standard library (CPython {python}). They are Copyright (c) 2001 Python Software Foundation, all
rights reserved, and are used under the Python Software Foundation License Version 2
(https://docs.python.org/3/license.html).
"""


def held_out_text(chars: int = HELD_OUT_CHARS) -> str:
    """The held-out documents joined by blank lines, cut at a document boundary near `chars`."""
    from day0.tools.train.corpus import documents, split

    out, size = [], 0
    for d in split(documents())[1]:
        if size >= chars:
            break
        out.append(d.text)
        size += len(d.text) + 2
    return "\n\n".join(out)


def package(trained: Path, out: Path) -> Path:
    import json

    from day0.models.quantize import quantize_checkpoint

    trained, out = Path(trained), Path(out)
    with writing_dir(out) as tmp:
        q = quantize_checkpoint(trained, tmp / "q")
        for f in q.iterdir():
            os.replace(f, tmp / f.name)
        q.rmdir()
        shutil.copyfile(trained / "training.json", tmp / "training.json")
        python = json.loads((trained / "training.json").read_text())["corpus"]["python"]
        (tmp / "held_out.txt").write_text(held_out_text())
        (tmp / "NOTICE").write_text(NOTICE.format(python=python))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-package-default-model")
    p.add_argument("trained")
    p.add_argument("out")
    a = p.parse_args(argv)
    print(package(Path(a.trained), Path(a.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
