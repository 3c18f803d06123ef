"""The default model's training text: the docstrings of the running interpreter's standard library.

Every machine that runs day0 has them, and the PSF license lets them be redistributed (with its
notice). Docstrings rather than source: English prose about programs, which a few-million-parameter
model can learn to continue legibly in minutes, where Python source would teach it indentation.

A document is one module file: its module, class and function docstrings (those of 40 characters
or more), in source order, separated by blank lines. Files are read in sorted path order, test
packages left out; one in HELD_OUT_EVERY (by a hash of the path) is held out for perplexity. The
text depends on the interpreter's version (`fingerprint` names it and hashes the text), so a
checkpoint trained on it records both.
"""

from __future__ import annotations

import ast
import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MIN_CHARS = 40  # shorter docstrings ("Return x.") teach little
HELD_OUT_EVERY = 20  # one file in 20 is held out
_SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class Document:
    path: str  # relative to the standard library's directory, '/'-separated
    text: str

    @property
    def held_out(self) -> bool:
        return int(hashlib.sha256(self.path.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def documents(root: Path | None = None) -> list[Document]:
    """Every module file's docstrings under `root` (default: this interpreter's stdlib)."""
    root = Path(root) if root is not None else stdlib_dir()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_PARTS & set(rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # (a few stdlib files are templates or other encodings)
        docs = [
            doc
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and (doc := ast.get_docstring(node)) is not None
            and len(doc) >= MIN_CHARS
        ]
        if docs:
            out.append(Document(rel.as_posix(), "\n\n".join(docs)))
    return out


def split(docs: list[Document]) -> tuple[list[Document], list[Document]]:
    """(training documents, held-out documents)."""
    return [d for d in docs if not d.held_out], [d for d in docs if d.held_out]


def fingerprint(docs: list[Document]) -> dict:
    """What the text was: the interpreter's version and a hash of every document."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.path.encode() + b"\0" + d.text.encode() + b"\0")
    return {
        "source": "docstrings of the Python standard library (PSF license)",
        "python": ".".join(map(str, sys.version_info[:3])),
        "documents": len(docs),
        "characters": sum(len(d.text) for d in docs),
        "sha256": h.hexdigest(),
    }


def token_stream(tokenizer, docs: list[Document]) -> np.ndarray:
    """Every document's ids (a `tokenizers.Tokenizer`) followed by the tokenizer's <eos>,
    concatenated."""
    eos = tokenizer.token_to_id("<eos>")
    ids = []
    for d in docs:
        ids.extend(tokenizer.encode(d.text).ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)
