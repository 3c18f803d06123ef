"""Read a Hugging Face checkpoint directory (config.json + safetensors shards), failing loudly.

Opening a checkpoint parses only the shard headers (8-byte little-endian length + JSON), never the
tensor data, so it is cheap even for shards of tens of GB. Every inconsistency found on the way
(missing files, bad JSON, truncated shards, sizes that disagree with dtype*shape, a tensor in two
shards, a weight of the wrong shape) raises CheckpointError with a message naming the file, the
tensor and the field, with expected vs found values.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from day0.runtime import files

INDEX_NAME = "model.safetensors.index.json"

# Bits per element of every dtype string safetensors writes (sub-byte types pack several a byte).
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "U16": 16,
    "I16": 16,
    "U32": 32,
    "I32": 32,
    "U64": 64,
    "I64": 64,
    "F16": 16,
    "BF16": 16,
    "F32": 32,
    "F64": 64,
    "C64": 64,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "F4": 4,
}
TORCH_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "U16": torch.uint16,
    "I16": torch.int16,
    "U32": torch.uint32,
    "I32": torch.int32,
    "U64": torch.uint64,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}


class CheckpointError(ValueError):
    """A checkpoint is unusable; the message names the file / tensor / field concerned."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its shard header describes it.

    dtype: safetensors dtype string ("F32", "BF16", "U8", ...); shape: tuple of ints;
    data_offsets: (begin, end) byte offsets, absolute in `file` (header already added).
    """

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]


def _read_json(path: Path, what: str):
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {what} {path}: {e.strerror or e}") from None
    problem = files.utf8_problem(data)
    if problem:
        raise CheckpointError(f"{what} {path} {problem}; JSON files are UTF-8")
    try:
        return json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, nesting too deep
        raise CheckpointError(f"{what} {path} is not valid JSON: {e}") from None


def read_shard_header(path: Path) -> dict[str, TensorInfo]:
    """Parse one safetensors file's header (no tensor data is read) and validate every entry."""
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"shard {path} has {file_size} bytes, too short for the 8-byte header length")
        (header_len,) = struct.unpack("<Q", prefix)
        if 8 + header_len > file_size:
            raise CheckpointError(
                f"shard {path}: header length {header_len} is larger than the "
                f"file ({file_size} bytes); not a safetensors file or truncated"
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"shard {path}: header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"shard {path}: header is a JSON {type(header).__name__}, expected an object")
    data_start = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":  # free-form string map (e.g. {"format": "pt"}): not a tensor
            continue
        where = f"shard {path}: tensor {name}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: header entry is not an object: {entry!r}")
        dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise CheckpointError(f"{where}: unknown or missing field 'dtype' ({dtype!r})")
        if not (
            isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise CheckpointError(f"{where}: field 'shape' is not a list of non-negative ints ({shape!r})")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) for o in offs)
            and 0 <= offs[0] <= offs[1]
        ):
            raise CheckpointError(
                f"{where}: field 'data_offsets' is not [begin, end] with 0 <= begin <= end ({offs!r})"
            )
        begin, end = data_start + offs[0], data_start + offs[1]
        if end > file_size:
            raise CheckpointError(
                f"truncated shard {path}: tensor {name} needs bytes up to {end} but the file has {file_size}"
            )
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits != 8 * (end - begin):
            raise CheckpointError(
                f"{where}: holds {end - begin} bytes but dtype {dtype} x shape {tuple(shape)} needs {bits / 8:g}"
            )
        out[name] = TensorInfo(name, path, dtype, tuple(shape), (begin, end))
    _check_layout(path, out.values(), data_start, file_size)
    return out


def _check_layout(path: Path, tensors: Iterable[TensorInfo], data_start: int, file_size: int) -> None:
    """The format's rule (and the reference reader's): the tensors' byte ranges, in order, tile the
    data region exactly: no overlap (two names reading the same bytes), no hole, nothing after."""
    at = data_start
    for t in sorted(tensors, key=lambda t: t.data_offsets):
        begin, end = t.data_offsets
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves a hole of {begin - at} bytes before it"
            raise CheckpointError(
                f"shard {path}: tensor {t.name}: data_offsets [{begin - data_start}, {end - data_start}] {what} "
                f"(the tensors' byte ranges must tile the data region; invalid offset)"
            )
        at = end
    if at != file_size:
        raise CheckpointError(
            f"shard {path}: {file_size - at} bytes after the last tensor's data (the tensors' byte ranges "
            f"must cover the data region exactly)"
        )


def _matches(name: str, pattern: str) -> bool:
    """allow_unused patterns are globs ("*.rotary_emb.*") or full-match regexes ("mtp\\..*")."""
    if fnmatch.fnmatchcase(name, pattern):
        return True
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:  # a glob like "*.bias" is not a valid regex: glob semantics only
        return False


class Checkpoint:
    """A checkpoint directory: `config` (dict), `dir` (Path), `files` (shard Paths, sorted by
    name), `tensors` (name -> TensorInfo). Build it with Checkpoint.open(path)."""

    def __init__(self, dir: Path, config: dict, files: list[Path], tensors: dict[str, TensorInfo]):
        self.dir, self.config, self.files, self.tensors = dir, config, files, tensors

    @classmethod
    def open(cls, path: str | Path) -> Checkpoint:
        d = Path(path)
        if not d.is_dir():
            raise CheckpointError(f"checkpoint {d} is not a directory")
        config_path = d / "config.json"
        if not config_path.is_file():
            raise CheckpointError(f"checkpoint {d} has no config.json (looked for {config_path})")
        config = _read_json(config_path, "config")
        if not isinstance(config, dict):
            raise CheckpointError(f"config {config_path} is a JSON {type(config).__name__}, expected an object")

        index_path = d / INDEX_NAME
        weight_map = None
        if index_path.exists():
            index = _read_json(index_path, "shard index")
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(
                    f"shard index {index_path}: field 'weight_map' is missing, empty or not an object"
                )
            files = [d / name for name in sorted(set(weight_map.values()))]
            for f in files:
                if not f.is_file():
                    users = sorted(n for n, s in weight_map.items() if d / s == f)
                    raise CheckpointError(
                        f"shard {f} named in {index_path} does not exist "
                        f"(it should hold {len(users)} tensors, e.g. {users[0]})"
                    )
        else:
            files = sorted(d.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"checkpoint {d} has no {INDEX_NAME} and no *.safetensors files")

        tensors: dict[str, TensorInfo] = {}
        for f in files:
            for name, info in read_shard_header(f).items():
                if name in tensors:
                    raise CheckpointError(f"tensor {name} is in two shards: {tensors[name].file} and {f}")
                tensors[name] = info
        if weight_map is not None:
            for name, shard in weight_map.items():
                info = tensors.get(name)
                if info is None or info.file != d / shard:
                    found = f" (found in {info.file} instead)" if info else ""
                    raise CheckpointError(
                        f"tensor {name} is listed in {index_path} under shard "
                        f"{shard}, but that shard's header lacks it{found}"
                    )
        return cls(d, config, files, tensors)

    def info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise CheckpointError(f"missing tensor {name} in checkpoint {self.dir}")
        return self.tensors[name]

    def torch_dtype(self, name: str) -> torch.dtype:
        """The torch dtype of tensor `name` as stored (e.g. "BF16" -> torch.bfloat16)."""
        info = self.info(name)
        if info.dtype not in TORCH_DTYPES:
            raise CheckpointError(f"tensor {name} in {info.file} has dtype {info.dtype}, which has no torch equivalent")
        return TORCH_DTYPES[info.dtype]

    def check_expected(
        self, expected: dict[str, tuple[tuple[int, ...], set[str] | None]], allow_unused: Iterable[str] = ()
    ) -> None:
        """Check the checkpoint against the model's needs: name -> (shape, allowed dtype strings
        or None for any). Every problem found (missing, wrong shape, wrong dtype, unexpected
        tensors not matched by an allow_unused glob/regex) is reported in one CheckpointError."""
        problems = []
        for name, (shape, dtypes) in expected.items():
            shape = tuple(shape)
            info = self.tensors.get(name)
            if info is None:
                problems.append(f"missing tensor {name} (expected shape {shape}) in checkpoint {self.dir}")
                continue
            if info.shape != shape:
                problems.append(f"tensor {name} in {info.file} has shape {info.shape}, expected {shape}")
            if dtypes is not None and info.dtype not in dtypes:
                problems.append(
                    f"tensor {name} in {info.file} has dtype {info.dtype}, expected one of {sorted(dtypes)}"
                )
        # a model may name checkpoint tensors it never reads (e.g. a vision tower a text-only model
        # skips) on the dict it returns: `ParameterShapes.allow_unused` (models/base.py)
        patterns = list(allow_unused) + list(getattr(expected, "allow_unused", ()))
        unexpected = [n for n in self.tensors if n not in expected and not any(_matches(n, p) for p in patterns)]
        if unexpected:
            more = f", ... ({len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
            problems.append(
                f"{len(unexpected)} unexpected tensors in checkpoint {self.dir} "
                f"(not used by the model, not matched by allow_unused): "
                f"{', '.join(unexpected[:5])}{more}"
            )
        if problems:
            raise CheckpointError(
                f"checkpoint {self.dir} does not fit the model ({len(problems)} problems):\n  " + "\n  ".join(problems)
            )

    def load_into(self, module_state: dict[str, torch.Tensor]) -> None:
        """Copy every tensor named in `module_state` from the shards into that preallocated
        destination (in place, casting to its dtype). Shapes are checked from the headers before
        any data is read; then shards are streamed one at a time and one tensor at a time, so peak
        memory is the destinations plus one source tensor. Checkpoint tensors not in
        `module_state` are skipped (check_expected is the place that reports them)."""
        by_file: dict[Path, list[str]] = {}
        for name, dest in module_state.items():
            info = self.info(name)
            if tuple(dest.shape) != info.shape:
                raise CheckpointError(
                    f"tensor {name} in {info.file} has shape {info.shape}, "
                    f"but the destination has shape {tuple(dest.shape)}"
                )
            by_file.setdefault(info.file, []).append(name)
        from safetensors import safe_open  # local: only loading needs the library

        for f in (f for f in self.files if f in by_file):  # shard order: sequential reads
            names = by_file[f]
            with safe_open(str(f), "pt") as shard, torch.no_grad():
                for name in names:
                    module_state[name].copy_(shard.get_tensor(name))

    def file_records(self, relative: bool = True) -> list[dict]:
        """[{"path", "size", "sha256"}] per shard, for the artifact manifest. Paths are relative
        to the checkpoint dir (relative=True) or absolute. Reads every byte: seconds per GB."""
        return [files.file_record(f, self.dir if relative else None) for f in self.files]


def verify_file_records(records: Iterable[dict], base_dir: str | Path) -> None:
    """day0.runtime.files.verify_file_records, failing with a CheckpointError."""
    try:
        files.verify_file_records(records, base_dir)
    except files.FileRecordError as e:
        raise CheckpointError(str(e)) from None
