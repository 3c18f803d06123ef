"""The artifact directory and its manifest: the one contract between compile and runtime.

    <artifact>/manifest.json   a `Manifest` (below), written by the compile driver, read by the runtime
    <artifact>/model.vmfb      the compiled module
    <artifact>/tokenizer.json  when the checkpoint has one
    <artifact>/preprocessor_config.json  the image processor's settings, for a model with a vision
                               tower whose checkpoint has them (`Manifest.vision`)

Weights are not copied: the manifest names the original shards with their sizes and hashes.
Writing is atomic: everything goes to a hidden sibling directory that is renamed into place last,
so an interrupted compile never leaves a directory that `read_manifest` accepts.

The manifest is typed here (dataclasses, no torch) and versioned by `FORMAT_VERSION`: an artifact
written by a day0 with another format is refused by name, never half-read.
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from day0.runtime.files import FileRecordError, MissingFileError, sha256_bytes, sha256_file, verify_file_records

MANIFEST = "manifest.json"
VMFB = "model.vmfb"
# 2: typed manifest; entry points say whether they return the greedy next token; `devices`.
# 3: paged entry points take slots and per-sequence slot tensors (`paged.slots`).
# 4: paged entry points write their logits and next tokens into caller buffers and take `prev`;
#    an artifact with a vision tower adds `vision` (absent otherwise, so text-only manifests are
#    unchanged) and the entry points encode_image and prefill_mm.
# 5: the vision tower at static patch counts, `encode_image_<P>` for each P of `vision.buckets`.
FORMAT_VERSION = 5


class ArtifactError(ValueError):
    pass


class WeightsError(ArtifactError):
    """The checkpoint files an artifact reads are missing (`missing`) or changed since compile."""

    def __init__(self, message: str, missing: bool):
        super().__init__(message)
        self.missing = missing


# the greedy next token an entry point returns when its last logits row is not all finite
NON_FINITE_TOKEN = -1
# the image entry points of an artifact with a vision tower (VisionLayout): image_encoder(P) for each
# bucket P, and IMAGE_PREFILL
IMAGE_ENCODER, IMAGE_PREFILL = "encode_image", "prefill_mm"
PAGED_IMAGE_PREFILL = "paged_prefill_mm"  # the Engine's chunk of a prompt with images


@dataclass(frozen=True)
class FileRecord:
    """A file the artifact depends on: path (relative to its base directory), size, sha256."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class EntryPoint:
    """One exported function. Every entry point but the image encoders takes (ids, start, *state) and
    returns (logits, [next,] *state): `greedy_next` says whether the greedy next token (argmax of
    the last row, lowest id on ties) sits between the logits and the state. `static_len` > 0: ids
    must have exactly that many tokens; else at least `min_len`."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    greedy_next: bool = True
    min_len: int = 1
    static_len: int = 0
    # "dense": (ids, start, *state) over the manifest's `state` (prefill_mm: ids, start, features,
    # feature_rows, *state); "vision": encode_image_<P>, (pixel_values, positions, segments) ->
    # features (VisionLayout), no state; "paged": (ids, positions, tables, slots, prev,
    # logits_out, next_out, *pools, *slot tensors) -> (*pools, *slot tensors) over
    # `paged` (PagedLayout; frontend/export.py, _PagedStep), `batch` sequences of one token each
    # (0: one sequence's prompt chunk)
    layout: str = "dense"
    batch: int = 0


@dataclass(frozen=True)
class StateTensor:
    """One tensor of device state kept between calls (a cache, a recurrent state): what a model's
    `state_specs()` declares and the manifest records."""

    name: str
    kind: str  # e.g. "mla_latent", "indexer_keys", "kda_state", "conv_tail"
    layer: int
    shape: tuple[int, ...]
    dtype: str = "float32"  # or "bfloat16"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def nbytes(self) -> int:
        from day0.runtime.state_file import np_dtype

        n = np_dtype(self.dtype).itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class PagedLayout:
    """The paged entry points' state: every position-indexed state tensor as a pool of blocks of
    `block_size` positions, the block count chosen at load (runtime/blocks.py), and every
    per-sequence one (a recurrent state) in slots, the slot count chosen at load. `pools` hold
    one block's shape ([rows, *row]: rows = block_size, or fewer for pooled keys); a pool of n
    blocks is [n·rows, *row]. `slots` hold one sequence's shape; n slots are [n, *shape]. A
    sequence holds at most `max_blocks` blocks (max_seq_len positions); `batch_sizes`: the
    compiled batched decode steps (paged_decode_<B>). The entry points take the pools, then the
    slot tensors."""

    block_size: int
    max_blocks: int
    batch_sizes: tuple[int, ...]
    pools: tuple[StateTensor, ...]
    slots: tuple[StateTensor, ...] = ()

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across every pool."""
        return sum(p.nbytes for p in self.pools)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one sequence's slot across every slot tensor."""
        return sum(s.nbytes for s in self.slots)


@dataclass(frozen=True)
class VisionLayout:
    """What a runtime needs to feed images to an artifact with a vision tower (glm5_next with a
    vision_config): its `encode_image_<P>` entry points, one per bucket P (static; multiples of
    merge_size², the last max_patches), take pixel_values [P, patch_dim] f32, positions [P, 2] and
    segments [P] i64, and return features [P / merge_size², hidden_size] f32, which `prefill_mm` puts in place of the
    prompt's `image_token_id` rows. patch_size / temporal_patch_size / merge_size are the tower's,
    which the image processor's settings (`image_config`: the artifact's preprocessor_config.json,
    None: runtime/images.py ImageConfig's defaults) must match."""

    image_token_id: int
    patch_dim: int  # in_channels · temporal_patch_size · patch_size²
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    hidden_size: int
    max_patches: int
    image_config: str | None = None
    # the patch counts encode_image was compiled at, ascending (the last is max_patches): an image
    # of P patches runs as encode_image_<B>, B the first bucket >= P (runtime/images.py image_buckets)
    buckets: tuple[int, ...] = ()

    def bucket(self, patches: int) -> int:
        """The smallest bucket holding `patches` patches; ArtifactError past the largest."""
        for b in self.buckets:
            if b >= patches:
                return b
        raise ArtifactError(
            f"an image of {patches} patches is larger than the largest encode_image bucket "
            f"({self.buckets[-1] if self.buckets else 0} patches)"
        )


def image_encoder(patches: int) -> str:
    """The entry point running the vision tower on `patches` patches (a VisionLayout bucket)."""
    return f"{IMAGE_ENCODER}_{patches}"


@dataclass(frozen=True)
class Parameters:
    """Where the weights are read at load time: the checkpoint's own shards under `base_dir`,
    named in the vmfb as `scope::<tensor name>`; `count` tensors in all."""

    scope: str
    base_dir: str
    files: tuple[FileRecord, ...]
    count: int

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Manifest:
    architecture: str  # the checkpoint's model_type
    config: dict  # the checkpoint's config.json, as read
    target: str  # the compile target (lowering/targets.py)
    devices: tuple[str, ...]  # runtime devices the vmfb runs on, the default first
    max_seq_len: int
    vocab_size: int
    eos_token_id: int | list[int] | None
    entry_points: dict[str, EntryPoint]
    state: tuple[StateTensor, ...]
    parameters: Parameters
    compile_flags: tuple[str, ...]
    tools: dict[str, str]  # package -> version
    vmfb: FileRecord | None = None  # filled in by `seal`
    paged: PagedLayout | None = None  # the paged entry points' pools, when compiled with them
    format_version: int = FORMAT_VERSION
    # the image entry points (encode_image_<P>, prefill_mm), for a model with a vision tower; absent
    # from a text-only artifact's manifest.json
    vision: VisionLayout | None = None
    # the parameter bytes each device of the module holds (`day0 compile --devices N`: device d
    # the routed experts [d·E/N, (d+1)·E/N) of every MoE layer, device 0 also everything else);
    # empty, and absent from manifest.json, for a one-device artifact
    device_bytes: tuple[int, ...] = ()

    @property
    def device_count(self) -> int:
        """How many devices the module spans (runtime/vm.py get_devices)."""
        return max(1, len(self.device_bytes))

    @property
    def prefill_chunk(self) -> int:
        """The static prefill length (0: the artifact has none)."""
        return self.static_len("prefill_chunk")

    @property
    def paged_prefill_chunk(self) -> int:
        """The static length of the paged prompt chunk (0: the artifact has none)."""
        return self.static_len("paged_prefill_chunk")

    def static_len(self, entry_point: str) -> int:
        """The static token count of an entry point (0: absent, or not static)."""
        entry = self.entry_points.get(entry_point)
        return entry.static_len if entry else 0

    @property
    def eos_token_ids(self) -> frozenset[int]:
        eos = self.eos_token_id
        return frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def state_bytes(self) -> dict[str, int]:
        """Bytes of device state per kind (mla_latent, indexer_keys, kda_state, conv_tail, ...)."""
        out: dict[str, int] = {}
        for s in self.state:
            out[s.kind] = out.get(s.kind, 0) + s.nbytes
        return out

    def to_json(self) -> dict:
        data = asdict(self)
        if data["vision"] is None:  # a text-only artifact's manifest is what it always was
            del data["vision"]
        if not data["device_bytes"]:  # and a one-device artifact's
            del data["device_bytes"]
        return data

    @classmethod
    def from_json(cls, data: dict, where: str = MANIFEST) -> Manifest:
        """The manifest in `data`; ArtifactError naming `where` and the field when it is not one
        (a missing or unknown field, or a value of the wrong type)."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{where}: not a JSON object")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ArtifactError(
                f"{where}: artifact format version {version} is not this day0's "
                f"{FORMAT_VERSION}; compile the checkpoint again with this day0"
            )
        try:
            top = _plain(cls, data, "")
            entries, params = top["entry_points"], _plain(Parameters, top["parameters"], "parameters.")
            return cls(
                **{
                    **top,
                    "entry_points": {
                        k: EntryPoint(**_plain(EntryPoint, e, f"entry_points.{k}.")) for k, e in entries.items()
                    },
                    "state": tuple(
                        StateTensor(**_plain(StateTensor, t, f"state[{i}].")) for i, t in enumerate(top["state"])
                    ),
                    "parameters": Parameters(
                        **{
                            **params,
                            "files": tuple(
                                FileRecord(**_plain(FileRecord, f, "parameters.files[].")) for f in params["files"]
                            ),
                        }
                    ),
                    "vmfb": FileRecord(**_plain(FileRecord, top["vmfb"], "vmfb.")) if top.get("vmfb") else None,
                    "paged": _paged(top["paged"]) if top.get("paged") else None,
                    "vision": VisionLayout(**_plain(VisionLayout, top["vision"], "vision."))
                    if top.get("vision")
                    else None,
                    "device_bytes": tuple(top.get("device_bytes", ())),
                }
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ArtifactError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None


def _paged(data) -> PagedLayout:
    fields_ = _plain(PagedLayout, data, "paged.")
    tensors = {
        key: tuple(
            StateTensor(**_plain(StateTensor, t, f"paged.{key}[{i}].")) for i, t in enumerate(fields_.get(key, ()))
        )
        for key in ("pools", "slots")
    }
    return PagedLayout(**{**fields_, **tensors})


def _plain(cls, data, path: str) -> dict:
    """The fields of `cls` in `data` (a JSON object), each checked against its annotation; JSON
    lists become tuples. A missing required field raises KeyError, an unknown or mistyped one
    TypeError, each naming the field's path."""
    if not isinstance(data, dict):
        raise TypeError(f"field '{path.rstrip('.')}' must be a JSON object, got {data!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise TypeError(f"unknown field(s) {', '.join(path + u for u in sorted(unknown))}")
    hints = get_type_hints(cls)
    out = {}
    for name, f in known.items():
        if name not in data:
            if f.default is MISSING:
                raise KeyError(f"missing field '{path}{name}'")
            continue
        value = data[name]
        if not _fits(value, hints[name]):
            raise TypeError(f"field '{path}{name}' is {value!r}, not {_type_name(hints[name])}")
        out[name] = tuple(value) if isinstance(value, list) and get_origin(hints[name]) is tuple else value
    return out


def _fits(value, hint) -> bool:
    """Whether a JSON value can stand for `hint` (nested dataclasses: an object, checked later)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool, float):
        return isinstance(value, hint)
    if origin in (Union, UnionType):
        return any(_fits(value, a) for a in args)
    if origin in (tuple, list):
        return isinstance(value, (list, tuple)) and all(_fits(v, args[0]) for v in value)
    if origin is dict or hint is dict or is_dataclass(hint):
        return isinstance(value, dict)
    return True


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def seal(artifact_dir: Path, manifest: Manifest) -> Manifest:
    """Complete a built artifact directory: record its vmfb (size, sha256) in the manifest and
    write the manifest, the file that makes the directory an artifact, last; returns it. Putting
    the directory in place is the compile driver's (lowering/driver.py, publish_replacing)."""
    vmfb = Path(artifact_dir) / VMFB
    manifest = replace(manifest, vmfb=FileRecord(VMFB, vmfb.stat().st_size, sha256_file(vmfb)))
    (Path(artifact_dir) / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2))
    return manifest


def read_manifest(artifact_dir: Path, verify: bool = True, checkpoint_dir=None, vmfb_hash: bool = True) -> Manifest:
    """The manifest of a complete artifact: the vmfb and the shards must exist with their recorded
    sizes and, with verify, hashes. `checkpoint_dir` replaces the recorded shard directory (the
    checkpoint moved, e.g. regenerated on another host). vmfb_hash=False leaves the vmfb's hash to
    the caller that reads it anyway (read_vmfb, when loading it)."""
    artifact_dir = Path(artifact_dir)
    path = artifact_dir / MANIFEST
    if not artifact_dir.is_dir():
        raise ArtifactError(f"{artifact_dir}: no such artifact directory")
    if not path.exists():
        raise ArtifactError(
            f"{artifact_dir}: no {MANIFEST}; not a day0 artifact, or its compile was interrupted — compile again"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read it ({e.strerror})") from None
    manifest = Manifest.from_json(data, str(path))
    if manifest.vmfb is None:
        raise ArtifactError(f"{path}: no vmfb record; compile again")
    if checkpoint_dir is not None:
        manifest = replace(
            manifest, parameters=replace(manifest.parameters, base_dir=str(Path(checkpoint_dir).resolve()))
        )
    try:  # without verify, still every file present with its recorded size (no data read)
        verify_file_records([asdict(manifest.vmfb)], artifact_dir, hashes=verify and vmfb_hash)
    except FileRecordError as e:
        raise ArtifactError(f"artifact {artifact_dir}: {e}") from None
    try:
        verify_file_records([asdict(f) for f in manifest.parameters.files], manifest.parameters.base_dir, hashes=verify)
    except FileRecordError as e:
        raise WeightsError(f"artifact {artifact_dir}: {e}", isinstance(e, MissingFileError)) from None
    return manifest


_VTENSOR = re.compile(r"!torch\.v?tensor<\[([^\]]*)\],(\w+)>")  # tensor: a mutated argument
_DTYPES = {"f32": "float32", "bf16": "bfloat16", "si64": "int64"}


def _tensor_types(text: str) -> list[tuple[tuple[int | None, ...], str]]:
    """[(dims, manifest dtype)] of the `!torch.vtensor` types in `text`, in order (None: dynamic)."""
    return [
        (tuple(None if d == "?" else int(d) for d in dims.split(",") if d), _DTYPES.get(dtype, dtype))
        for dims, dtype in _VTENSOR.findall(text)
    ]


def check_signatures(manifest: Manifest, reflection: dict[str, dict[str, str]], where: str) -> None:
    """The manifest agrees with the module it describes: every entry point exists with the
    signature the compiled function records (frontend/export.py): its state tensors' shapes and
    dtypes, the vocabulary, a static prompt length, max_seq_len. ArtifactError naming the first
    difference otherwise (a hand-edited manifest, or a vmfb from another compile)."""
    # prefill_mm's and paged_prefill_mm's image inputs: features [N, hidden], feature_rows [S]
    features = [((None, manifest.vision.hidden_size), "float32"), ((None,), "int64")] if manifest.vision else []
    if manifest.vision:
        buckets = manifest.vision.buckets
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[-1] != manifest.vision.max_patches:
            raise ArtifactError(
                f"{where}: vision.buckets {list(buckets)} must ascend to vision.max_patches "
                f"({manifest.vision.max_patches})"
            )
        missing = [image_encoder(b) for b in buckets if image_encoder(b) not in manifest.entry_points]
        if missing:
            raise ArtifactError(f"{where}: vision.buckets name entry points the manifest lacks: {', '.join(missing)}")
    for name, entry in manifest.entry_points.items():
        r = reflection.get(name)
        if r is None:
            raise ArtifactError(f"{where}: the module has no function '{name}' that the manifest lists")
        if "day0.signature" not in r:
            raise ArtifactError(f"{where}: function '{name}' records no day0 signature; compile the checkpoint again")
        inputs, _, outputs = r["day0.signature"].partition("->")
        args, results = _tensor_types(inputs), _tensor_types(outputs)
        if (entry.layout == "vision" or name in (IMAGE_PREFILL, PAGED_IMAGE_PREFILL)) and manifest.vision is None:
            raise ArtifactError(f"{where}: image entry point '{name}' but no vision layout in the manifest")
        if entry.layout == "vision":  # encode_image_<P>: no state, the features its one result
            v, p = manifest.vision, entry.static_len
            if name != image_encoder(p) or p not in v.buckets:
                raise ArtifactError(f"{where}: image encoder '{name}' is not one of vision.buckets {list(v.buckets)}")
            expected_args = [((p, v.patch_dim), "float32"), ((p, 2), "int64"), ((p,), "int64")]
            problem = _first_difference("argument", args, expected_args)
            rows = p // v.merge_size**2
            problem = problem or _first_difference("result", results, [((rows, v.hidden_size), "float32")])
            if problem:
                raise ArtifactError(
                    f"{where}: function '{name}': {problem} (edited manifest, or another compile's vmfb?)"
                )
            continue
        if entry.layout == "paged":
            if manifest.paged is None:
                raise ArtifactError(f"{where}: paged entry point '{name}' but no paged layout in the manifest")
            state = [((None, *p.shape[1:]), p.dtype) for p in manifest.paged.pools]
            state += [((None, *s.shape), s.dtype) for s in manifest.paged.slots]
            n, g = entry.batch or entry.static_len or None, entry.batch or 1
            rows = 1 if entry.static_len else n
            expected_args = [((n,), "int64"), ((n,), "int64"), ((g, None), "int64"), ((g,), "int64")]
            expected_args += [((max(manifest.paged.batch_sizes),), "int64"), ((rows, manifest.vocab_size), "float32")]
            expected_args += [((g,), "int64"), *state]
            if name == PAGED_IMAGE_PREFILL:  # after next_out
                expected_args[7:7] = features
        else:
            state = [(tuple(s.shape), s.dtype) for s in manifest.state]
            ids_len = entry.static_len or None
            expected_args = [((ids_len if name != "decode" else 1,), "int64"), ((1,), "int64"), *state]
            if name == IMAGE_PREFILL:  # after ids and start
                expected_args[2:2] = features
        problem = None
        if r.get("day0.max_seq_len") != str(manifest.max_seq_len):
            problem = (
                f"max_seq_len is {r.get('day0.max_seq_len')} in the module, {manifest.max_seq_len} in the manifest"
            )
        problem = problem or _first_difference("argument", args, expected_args)
        if entry.layout != "paged":  # (the paged steps write theirs into arguments)
            logits = results[:1]
            expected_logits = [((results[0][0][0] if results else None, manifest.vocab_size), "float32")]
            problem = problem or _first_difference("logits", logits, expected_logits)
            results = results[1 + entry.greedy_next :]
        problem = problem or _first_difference("state result", results, state)
        if problem:
            raise ArtifactError(f"{where}: function '{name}': {problem} (edited manifest, or another compile's vmfb?)")


def _first_difference(what: str, found: list, expected: list) -> str | None:
    if len(found) != len(expected):
        return f"the module has {len(found)} {what}s, the manifest describes {len(expected)}"
    for i, ((dims, dtype), (want_dims, want_dtype)) in enumerate(zip(found, expected)):
        if dims != want_dims or dtype != want_dtype:
            return f"{what} {i} is {_spell(dtype, dims)} in the module, {_spell(want_dtype, want_dims)} in the manifest"
    return None


def _spell(dtype: str, dims) -> str:
    return f"{dtype}[{', '.join('?' if d is None else str(d) for d in dims)}]"


def read_vmfb(artifact_dir: Path, manifest: Manifest, verify: bool = True) -> bytes:
    """The artifact's module, read once and checked against the manifest's record (size, and
    with verify the sha256), so that the bytes loaded are the bytes verified."""
    path = Path(artifact_dir) / VMFB
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"artifact {artifact_dir}: cannot read {path} ({e.strerror})") from None
    record = manifest.vmfb
    if len(data) != record.size:
        raise ArtifactError(
            f"artifact {artifact_dir}: {path} changed after compile: size is {len(data)}, recorded {record.size}"
        )
    digest = sha256_bytes(data) if verify else record.sha256
    if digest != record.sha256:
        raise ArtifactError(
            f"artifact {artifact_dir}: {path} changed after compile: sha256 is {digest}, recorded {record.sha256}"
        )
    return data
