"""Size + sha256 records of files an artifact depends on (its vmfb, the checkpoint's shards), and
their verification; directories written atomically. Torch-free: the runtime loads artifacts
without importing PyTorch."""

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

HASH_CHUNK = 16 << 20


class FileRecordError(ValueError):
    pass


class MissingFileError(FileRecordError):
    """A recorded file is not there at all (as opposed to changed)."""


def utf8_problem(data: bytes) -> str | None:
    """Why `data` is not UTF-8 text, naming the first bad byte and its offset; None if it is."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text (byte 0x{data[e.start]:02X} at offset {e.start})"
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_record(path: Path, base_dir: Path | None = None) -> dict:
    """{"path", "size", "sha256"}; path relative to base_dir when given."""
    path = Path(path)
    return {
        "path": str(path.relative_to(base_dir) if base_dir else path.resolve()),
        "size": path.stat().st_size,
        "sha256": sha256_file(path),
    }


def verify_file_records(records: Iterable[dict], base_dir: str | Path, hashes: bool = True) -> None:
    """Raise FileRecordError naming the first recorded file that is missing, changed size or
    (with hashes) changed content. Relative paths resolve against base_dir. Sizes are all checked
    before any hash, so the common kind of change is reported without reading tens of GB."""
    records, base = list(records), Path(base_dir)
    paths = []
    for i, r in enumerate(records):
        for field in ("path", "size", "sha256"):
            if field not in r:
                raise FileRecordError(f"file record {i} lacks field '{field}': {r!r}")
        p = base / r["path"]  # an absolute r["path"] replaces base
        if not p.is_file():
            raise MissingFileError(f"weight file {p} is missing (recorded at compile time)")
        if p.stat().st_size != r["size"]:
            raise FileRecordError(
                f"weight file {p} changed after compile: size is {p.stat().st_size}, recorded {r['size']}"
            )
        paths.append(p)
    for p, r in zip(paths, records) if hashes else ():
        digest = sha256_file(p)
        if digest != r["sha256"]:
            raise FileRecordError(f"weight file {p} changed after compile: sha256 is {digest}, recorded {r['sha256']}")


def make_readable(path: Path) -> None:
    """mkdtemp and the safetensors writer create owner-only modes; use the umask's instead."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    for f in path.iterdir():
        f.chmod(0o666 & ~umask)


@contextlib.contextmanager
def writing_dir(out: Path):
    """Build directory `out` atomically: yields a temporary sibling to fill; when the block ends
    without an error it replaces `out` (made readable as the umask allows), else it is removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        make_readable(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
