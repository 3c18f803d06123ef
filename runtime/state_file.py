"""A sequence's state on disk: what `Session.save_state` writes and `Session.load_state` reads.

One `.npz` (numpy's zip of .npy arrays; no pickle) holding every state tensor under its manifest
name (e.g. `kv_cache.0`, `kda_state.3`) and `__day0_state__`, a JSON header: the format version,
the position (tokens in the sequence), the pending token (returned by `generate` but not yet in the
state), and what the state belongs to — the architecture, the checkpoint's config, the weights
(each shard's sha256), max_seq_len and the state layout. Loading checks all of them against the
artifact first, so a state saved by another model, config, weights or max_seq_len is refused with
an error naming the first difference instead of decoding garbage. Written atomically (temp file +
rename).

A position-indexed tensor may be stored with only its first rows (`rows` in the header: name ->
row count; the rest are zero): a Session over the paged entry points (runtime/paged_sequence.py)
saves the rows its sequence holds, not max_seq_len of them. `read` returns such a tensor as
stored; the reader places or pads it. Either kind of Session reads what the other wrote.
"""

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

FORMAT = 3
HEADER = "__day0_state__"


class StateFileError(ValueError):
    pass


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a manifest dtype name ("bfloat16" through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def identity(manifest) -> dict:
    """What a state belongs to (`manifest`: runtime.artifact.Manifest): it is valid exactly for
    artifacts with the same identity."""
    return {
        "architecture": manifest.architecture,
        "config": manifest.config,
        "weights": sorted(f.sha256 for f in manifest.parameters.files),
        "max_seq_len": manifest.max_seq_len,
        "state": [
            {"name": s.name, "kind": s.kind, "layer": s.layer, "shape": list(s.shape), "dtype": s.dtype}
            for s in manifest.state
        ],
    }


def write(path: Path, manifest, position: int, arrays: list[np.ndarray], pending: int | None = None) -> Path:
    """Write `arrays` (manifest.state's order; a tensor with fewer rows than its shape is stored
    truncated, module docstring) atomically."""
    path = Path(path)
    rows = {s.name: int(a.shape[0]) for s, a in zip(manifest.state, arrays) if a.shape != s.shape}
    header = {"format": FORMAT, "position": position, "pending": pending, "rows": rows, **identity(manifest)}
    # bf16 (ml_dtypes) has no .npy description: stored as its uint16 bits (the header has the dtype)
    named = {s.name: a.view(np.uint16) if s.dtype == "bfloat16" else a for s, a in zip(manifest.state, arrays)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{HEADER: np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}, **named)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _difference(saved: dict, here: dict) -> str | None:
    """The first way `saved` differs from `here` (both `identity` dicts), in words."""
    if saved["architecture"] != here["architecture"]:
        return f"architecture is '{saved['architecture']}' there, '{here['architecture']}' here"
    for key in sorted(set(saved["config"]) | set(here["config"])):
        a, b = saved["config"].get(key, "<absent>"), here["config"].get(key, "<absent>")
        if a != b:
            return f"config field '{key}' is {json.dumps(a)} there, {json.dumps(b)} here"
    if saved["weights"] != here["weights"]:
        return "the weights differ (the checkpoint's shards have other contents)"
    if saved["max_seq_len"] != here["max_seq_len"]:
        return f"max_seq_len is {saved['max_seq_len']} there, {here['max_seq_len']} here"
    if saved["state"] != here["state"]:
        return "the state layout differs (artifacts compiled by different day0 versions)"
    return None


def read(path: Path, manifest) -> tuple[int, int | None, list[np.ndarray]]:
    """(position, pending token, arrays in manifest order: a truncated tensor as stored, see the
    module docstring) of a state file saved for an artifact like this one."""
    path = Path(path)
    if not path.is_file():
        raise StateFileError(f"state file {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            if HEADER not in z.files:
                raise StateFileError(f"state file {path}: not a day0 state file (no {HEADER} entry)")
            header = json.loads(bytes(z[HEADER]).decode())
            if not isinstance(header, dict):
                raise StateFileError(f"state file {path}: its header is not a JSON object")
            if header.get("format") != FORMAT:
                raise StateFileError(f"state file {path}: format {header.get('format')}, this day0 reads {FORMAT}")
            diff = _difference(header, identity(manifest))
            if diff:
                raise StateFileError(f"state file {path} was saved by an artifact of a different model: {diff}")
            arrays, rows = [], header.get("rows", {})
            if not isinstance(rows, dict):
                raise StateFileError(f"state file {path}: its header's rows is not an object")
            for s in manifest.state:
                if s.name not in z.files:
                    raise StateFileError(f"state file {path}: tensor '{s.name}' is missing")
                a = z[s.name]
                if s.dtype == "bfloat16" and a.dtype == np.uint16:
                    a = a.view(np_dtype("bfloat16"))
                want = s.shape
                if s.name in rows:
                    n = rows[s.name]
                    if not _is_int(n) or not 0 <= n <= s.shape[0]:
                        raise StateFileError(
                            f"state file {path}: tensor '{s.name}' stores {n!r} rows, outside [0, {s.shape[0]}]"
                        )
                    want = (n, *s.shape[1:])
                if a.shape != want or a.dtype != np_dtype(s.dtype):
                    raise StateFileError(
                        f"state file {path}: tensor '{s.name}' is {a.dtype}{list(a.shape)}, "
                        f"expected {s.dtype}{list(want)}"
                    )
                arrays.append(a)
    except StateFileError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError, TypeError, AttributeError) as e:
        raise StateFileError(f"state file {path}: unreadable or malformed ({type(e).__name__}: {e})") from None
    position, pending = header.get("position"), header.get("pending")
    if not _is_int(position) or not 0 <= position <= manifest.max_seq_len:
        raise StateFileError(f"state file {path}: position {position!r} outside [0, {manifest.max_seq_len}]")
    if pending is not None and (not _is_int(pending) or not 0 <= pending < manifest.vocab_size):
        raise StateFileError(f"state file {path}: pending token {pending!r} outside [0, {manifest.vocab_size})")
    if pending is not None and position >= manifest.max_seq_len:
        raise StateFileError(f"state file {path}: a pending token at position {position} has no room")
    return position, pending, arrays


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
