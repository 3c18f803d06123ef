"""The compile driver: `day0 compile` from checkpoint directory to artifact directory. It is the
one module that imports every stage, and runs them one named stage at a time:

    read     config.json + shard headers, validated against the architecture (no weights loaded)
    export   torch.export of the entry points with uninitialized weights -> raw torch MLIR (frontend/)
    passes   the target's pipeline (passes/, chosen by lowering/targets.py)
    compile  iree-compile for the target -> model.vmfb (lowering/compile.py)
    publish  manifest.json (runtime/artifact.py) + tokenizer.json (+ preprocessor_config.json for a
             model with a vision tower), and an atomic rename into place

Every stage's failure surfaces as a `BuildError` naming the stage; `dump_stages` writes the IR
after each of our stages and after each IREE phase under `<artifact>/stages/`.

The output: day0 replaces only what it wrote. Before any work the output must be absent, an empty
directory, or a day0 artifact holding only day0's files (ARTIFACT_FILES); anything else is refused
by name. The artifact is built in a hidden sibling `.<name>.partial-<pid>-<id>` (one per compile)
and published under an flock on `.<name>.lock` next to it: the check is made again, then the new
directory takes the old one's place in one atomic exchange (renameat2 RENAME_EXCHANGE, where the
filesystem has it), so concurrent compiles to one output each publish whole, the last one staying.
"""

import contextlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from day0.lowering.targets import DEFAULT_DSA_TILE
from day0.runtime.images import CONFIG_FILE as IMAGE_CONFIG_FILE
from day0.runtime.tokenizer import TOKENIZER_FILES

STAGES = ("read", "export", "passes", "compile", "publish")
DEFAULT_MAX_SEQ_LEN = 4096
# --max-seq-len bounds: the export traces a 4-token prompt (frontend/export.py), and no supported
# model has a context longer than 2**20 (kimi_linear, glm5_next: max_position_embeddings 1048576)
MIN_MAX_SEQ_LEN = 4
MAX_MAX_SEQ_LEN = 1 << 20
# what day0 writes into an artifact directory (runtime/artifact.py; stages/: --dump-stages)
ARTIFACT_FILES = ("manifest.json", "model.vmfb", *TOKENIZER_FILES, IMAGE_CONFIG_FILE, "stages")

# What each entry point takes and returns (the manifest's EntryPoint records; frontend/export.py
# emits them). Every one also returns the greedy next token after the logits.
NEXT = "next[1] int64 (argmax of the last row, lowest id on ties; -1 when the row is not all finite)"
PREFILL = {
    "inputs": ("ids[S] int64", "start[1] int64", "*state"),
    "outputs": ("logits[S,V] float32", NEXT, "*state"),
    "min_len": 2,
}
ENTRY_POINTS = {
    "prefill": PREFILL,
    "decode": {
        "inputs": ("token[1] int64", "pos[1] int64", "*state"),
        "outputs": ("logits[1,V] float32", NEXT, "*state"),
    },
    "prefill_first": {**PREFILL, "inputs": ("ids[S] int64", "start[1] int64 (must be 0)", "*state")},
    "prefill_chunk": {
        "inputs": ("ids[C] int64 (C = static_len)", "start[1] int64", "*state"),
        "outputs": ("logits[C,V] float32", NEXT, "*state"),
    },
    # a model with a vision tower (manifest `vision`: runtime/artifact.py VisionLayout)
    # encode_image_<P> (runtime/artifact.py image_encoder), one per vision.buckets entry P
    "encode_image": {
        "inputs": (
            "pixel_values[P,patch_dim] float32 (P = static_len, one of vision.buckets)",
            "positions[P,2] int64 (each patch's row and column in its image)",
            "segments[P] int64 (each patch's image: patches attend within their segment)",
        ),
        "outputs": ("features[P/merge_size²,hidden] float32",),
        "greedy_next": False,
        "layout": "vision",
    },
    "prefill_mm": {
        **PREFILL,
        "inputs": (
            "ids[S] int64",
            "start[1] int64",
            "features[N,hidden] float32 (N >= 2: pad with a zero row)",
            "feature_rows[S] int64 (-1: the token's embedding; k: features[k] instead)",
            "*state",
        ),
    },
}


class BuildError(RuntimeError):
    pass


CACHE_DTYPES = ("float32", "bfloat16")


def prefill_chunk(model, options: "BuildOptions") -> int:
    """The artifact's static prefill length (0: none). Session runs a prompt of n >= C tokens as
    chunks of C, the last one overlapping the one before (its tokens recomputed: the same rows are
    written again), which is exact only for state indexed by position; models with a recurrent
    state (KDA) get none."""
    from day0.lowering.targets import get_target

    c = get_target(options.target).prefill_chunk if options.prefill_chunk is None else options.prefill_chunk
    if not model.position_indexed_state:
        return 0
    return min(c, options.max_seq_len) if c >= 2 else 0


def cache_dtype(model_cls, cfg, options: "BuildOptions") -> str:
    """The artifact's cache dtype: the option, else the target's where the model supports it."""
    from day0.lowering.targets import get_target
    from day0.models.base import CACHE_DTYPES

    dtype = options.cache_dtype
    if dtype is None:
        dtype = get_target(options.target).cache_dtype if model_cls.supports_bf16_cache else "float32"
    if dtype not in CACHE_DTYPES:
        raise BuildError(f"--cache-dtype '{dtype}' is not supported (choose from {', '.join(CACHE_DTYPES)})")
    if dtype != "float32" and not model_cls.supports_bf16_cache:
        raise BuildError(f"--cache-dtype {dtype} is not supported for {cfg.model_type} (its caches are float32 only)")
    return dtype


BATCH_SIZES = (1, 4, 16, 64, 256)  # the batched decode steps compiled below --max-batch, then it
DEFAULT_BLOCK_SIZE = 64
MAX_DEVICES = 64


@dataclass
class BuildOptions:
    target: str = "llvm-cpu"
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    dump_stages: bool = False
    extra_flags: tuple[str, ...] = ()
    dsa_tile: int = DEFAULT_DSA_TILE  # preferred tile; the largest divisor of the selection width <= it is used
    prefill_chunk: int | None = None  # static prefill length; None: the target's, 0: none
    # the position-indexed caches' dtype, float32 or bfloat16; None: the target's for models that
    # support bf16 caches, else float32
    cache_dtype: str | None = None
    # > 0: also the paged entry points (runtime Engine) with batched decode steps for up to
    # max_batch sequences, over pools of block_size-position blocks
    max_batch: int = 0
    block_size: int = DEFAULT_BLOCK_SIZE
    # devices the artifact spans: > 1 splits the routed experts among them (expert parallel;
    # models/moe.py split_experts), on local devices for llvm-cpu
    devices: int = 1
    # image-token counts to compile the vision tower at (runtime/images.py image_buckets); empty:
    # 2^k and 3·2^(k-1) up to the image processor's max_image_tokens (or max_seq_len, if lower)
    image_buckets: tuple[int, ...] = ()
    # cuda-sm90: bf16 terms each f32 activation is split into for the prefill matmuls against bf16
    # weights (matmul-to-bf16-terms); 3: f32 accuracy, 2: a product fewer; None: the target's (2 on
    # cuda-sm90: docs/perf.md, default model)
    matmul_terms: int | None = None
    # the same for the vision tower's matmuls and attention (1: bf16 products and a bf16 flash
    # attention, as a bf16 tower computes; 2, 3: more exact; the attention takes at most 2);
    # None: the target's (1 on cuda-sm90: docs/perf.md, images)
    image_terms: int | None = None


def _progress_printer(stream=sys.stderr) -> Callable[[str, str], None]:
    started = {}

    def report(stage: str, event: str) -> None:
        i = STAGES.index(stage) + 1
        if event == "start":
            started[stage] = time.perf_counter()
            print(f"[{i}/{len(STAGES)}] {stage} ...", file=stream, flush=True)
        elif event != "done":  # a note on the way
            print(f"[{i}/{len(STAGES)}] {stage}: {event}", file=stream, flush=True)
        else:
            print(
                f"[{i}/{len(STAGES)}] {stage} done in {time.perf_counter() - started[stage]:.1f} s",
                file=stream,
                flush=True,
            )

    return report


def compile_checkpoint(
    checkpoint_dir: Path,
    out_dir: Path,
    options: BuildOptions | None = None,
    progress: Callable[[str, str], None] | None = None,
):
    """Build the artifact; returns its manifest (runtime.artifact.Manifest). Nothing is left at
    out_dir on failure."""
    import torch

    options = options or BuildOptions()

    from day0.frontend.export import entry_points, export_model, takes_images
    from day0.frontend.ir import MLIRError, new_context, parse_module
    from day0.lowering.targets import DsaShape, get_target
    from day0.models.checkpoint import TORCH_DTYPES, Checkpoint
    from day0.models.moe import split_experts
    from day0.models.mxfp4 import check_checkpoint_scales
    from day0.models.registry import architecture
    from day0.passes.pipeline import parse_pipeline
    from day0.runtime.artifact import (
        VMFB,
        EntryPoint,
        FileRecord,
        Manifest,
        Parameters,
        image_encoder,
    )

    progress = progress or _progress_printer()
    checkpoint_dir, out_dir = Path(checkpoint_dir).resolve(), Path(out_dir).resolve()
    check_options(options)
    check_output(out_dir)  # before any work: never replace what day0 did not write
    target = get_target(options.target)

    progress("read", "start")
    ckpt = Checkpoint.open(checkpoint_dir)
    cfg, model_cls = architecture(ckpt.config)
    dtypes = {n: TORCH_DTYPES[t.dtype] for n, t in ckpt.tensors.items() if t.dtype in TORCH_DTYPES}
    with torch.no_grad():
        model = model_cls.empty(cfg, options.max_seq_len, dtypes, cache_dtype=cache_dtype(model_cls, cfg, options))
    ckpt.check_expected(model.parameter_shapes())
    try:
        experts = split_experts(model, options.devices)
    except ValueError as e:
        raise BuildError(str(e)) from None
    check_checkpoint_scales(ckpt)
    for note in model_cls.compile_notes(ckpt.config, cfg):
        progress("read", note)
    vision = vision_layout(model, ckpt, options)
    buckets = vision.buckets if vision else ()
    if takes_images(model) and vision is None:
        progress("read", f"the vision tower is left out (text only): target {target.name} does not run images yet")
    progress("read", "done")

    tmp = _staging_dir(out_dir)
    stages = tmp / "stages" if options.dump_stages else None
    if stages:
        stages.mkdir()
    try:
        progress("export", "start")
        chunk = prefill_chunk(model, options)
        paged = paged_export(model, options, images=vision is not None)
        exported = export_model(
            model,
            options.max_seq_len,
            keep=target.kept_ops,
            prefill_chunk=chunk,
            paged=paged,
            images=buckets,
        )
        if stages:
            (stages / "00-export.mlir").write_text(exported.mlir)
        progress("export", "done")

        progress("passes", "start")
        width = model.selection_width()
        dsa = DsaShape(width, model.dsa_block(), options.dsa_tile, options.max_seq_len) if width is not None else None
        pipeline = target.pipeline(
            dsa, matmul_terms=options.matmul_terms, image_terms=options.image_terms, devices=options.devices
        )
        with new_context():
            module = parse_module(exported.mlir)
            for i, p in enumerate(parse_pipeline(pipeline), start=1):
                p.run(module)
                try:
                    module.operation.verify()
                except MLIRError as e:  # a pass bug, not a user error: say which pass
                    raise BuildError(f"pass '{p.name}' produced invalid IR: {e}") from None
                if stages:
                    (stages / f"{i:02d}-{p.name}.mlir").write_text(str(module))
            lowered = str(module)
        progress("passes", "done")

        progress("compile", "start")
        result = _compile_artifact(lowered, target, options, tmp / VMFB, stages, out_dir, progress)
        progress("compile", "done")

        progress("publish", "start")
        for name in TOKENIZER_FILES:
            if (checkpoint_dir / name).exists():
                shutil.copy(checkpoint_dir / name, tmp / name)
        if vision is not None and vision.image_config:
            shutil.copy(checkpoint_dir / vision.image_config, tmp / vision.image_config)
        manifest = Manifest(
            architecture=cfg.model_type,
            config=ckpt.config,
            target=target.name,
            devices=target.devices,
            max_seq_len=options.max_seq_len,
            vocab_size=cfg.vocab_size,
            eos_token_id=cfg.eos_token_id,
            entry_points={
                **{
                    name: EntryPoint(**ENTRY_POINTS[name], **({"static_len": chunk} if name == "prefill_chunk" else {}))
                    for name in entry_points(model, chunk)
                },
                **{image_encoder(p): EntryPoint(**ENTRY_POINTS["encode_image"], static_len=p) for p in buckets},
                **({"prefill_mm": EntryPoint(**ENTRY_POINTS["prefill_mm"])} if vision else {}),
                **paged_entry_points(paged),
            },
            state=tuple(model.state_specs()),
            paged=paged_layout(model, options, paged),
            device_bytes=device_bytes(ckpt, exported.parameters, experts, options.devices),
            parameters=Parameters(
                scope="model",
                base_dir=str(checkpoint_dir),
                files=tuple(FileRecord(**f) for f in ckpt.file_records()),
                count=len(exported.parameters),
            ),
            compile_flags=tuple(result.flags),
            tools=tool_versions(),
            vision=vision,
        )
        manifest = publish_replacing(tmp, out_dir, manifest)
        progress("publish", "done")
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def vision_layout(model, ckpt, options: BuildOptions):
    """The manifest's `vision` (runtime/artifact.py VisionLayout) for a model with a vision tower
    (frontend/export.py takes_images) on a target that runs images (Target.images), None
    otherwise. The checkpoint's preprocessor_config.json, when it has one, must be one day0
    follows (runtime/images.py ImageConfig) and cut patches of the tower's sizes; the artifact
    gets a copy. BuildError naming the field otherwise."""
    from day0.frontend.export import takes_images
    from day0.lowering.targets import get_target
    from day0.runtime.artifact import VisionLayout
    from day0.runtime.images import ImageConfig, ImageConfigError, image_buckets

    if not takes_images(model) or not get_target(options.target).images:
        return None
    tower = model.vision.cfg
    path = ckpt.dir / IMAGE_CONFIG_FILE
    try:
        image = ImageConfig.from_file(path) if path.is_file() else ImageConfig()
    except ImageConfigError as e:
        raise BuildError(f"the checkpoint's image processor settings: {e}") from None
    for field, ours, theirs in (
        ("patch_size", image.patch_size, tower.patch_size),
        ("temporal_patch_size", image.temporal_patch_size, tower.temporal_patch_size),
        ("merge_size", image.merge_size, tower.spatial_merge_size),
    ):
        if ours != theirs:
            where = path if path.is_file() else f"the default image processor settings (no {path})"
            raise BuildError(
                f"{where}: {field} is {ours}, but the vision tower's (config.json vision_config) is {theirs}: "
                f"the image processor must cut the patches the tower takes"
            )
    cap = min(image.max_image_tokens, options.max_seq_len)
    try:
        buckets = image_buckets(image.min_image_tokens, cap, tower.spatial_merge_size, options.image_buckets)
    except ValueError as e:
        raise BuildError(
            f"--image-buckets: {e} (max_image_tokens {image.max_image_tokens}, max_seq_len {options.max_seq_len})"
        ) from None
    if tower.in_channels != 3:
        raise BuildError(
            f"config.json: field 'vision_config.in_channels': {tower.in_channels} is not supported (images are RGB: 3)"
        )
    return VisionLayout(
        image_token_id=int(ckpt.config["image_token_id"]),
        patch_dim=model.vision.patch_dim(),
        patch_size=tower.patch_size,
        temporal_patch_size=tower.temporal_patch_size,
        merge_size=tower.spatial_merge_size,
        hidden_size=model.cfg.hidden_size,
        max_patches=buckets[-1],
        image_config=IMAGE_CONFIG_FILE if path.is_file() else None,
        buckets=buckets,
    )


def paged_export(model, options: BuildOptions, images: bool = False):
    """The paged entry points to export (frontend/export.py PagedExport), None without --max-batch;
    `images`: with the image chunk step (the artifact runs images)."""
    from day0.frontend.export import PagedExport

    if not options.max_batch:
        return None
    multiple = model.paged_block_multiple()
    if options.block_size % multiple:
        raise BuildError(
            f"--block-size {options.block_size} is not a multiple of {multiple}: a block must hold whole "
            f"k-pools of the indexer (index_kpool = {multiple} in config.json)"
        )
    sizes = tuple(b for b in BATCH_SIZES if b < options.max_batch) + (options.max_batch,)
    return PagedExport(options.block_size, sizes, prefill_chunk(model, options), images)


def _compile_artifact(lowered: str, target, options: BuildOptions, vmfb: Path, stages, out_dir: Path, progress):
    """iree-compile the lowered module, with the target's artifact flags (lowering/targets.py).
    Those change the ABI, not the results, and IREE 3.13 rejects them for some modules (caller
    transients where a dynamic-length prefill runs a while loop: KDA's chunk loop, "operand #0
    does not dominate this use"): then the module is compiled without them (the runtime reads
    which ABI each entry point has from the module), and the manifest's flags say which."""
    from day0.lowering.compile import compile_mlir
    from day0.lowering.iree_tool import CompileError

    dump = stages / "iree" if stages else None
    repro = out_dir.parent / f"{out_dir.name}.repro"
    if target.artifact_flags:
        first = Path(str(vmfb) + ".repro")
        try:
            return compile_mlir(
                lowered,
                options.target,
                vmfb,
                extra_flags=(*target.artifact_flags, *options.extra_flags),
                dump_dir=dump,
                repro_dir=first,
                devices=options.devices,
            )
        except CompileError as e:
            why = e.first_error.split("error: ", 1)[-1][:160]  # (the location is in the repro, removed)
            progress("compile", f"again without {' '.join(target.artifact_flags)} (iree-compile: {why})")
        finally:
            shutil.rmtree(first, ignore_errors=True)
    return compile_mlir(
        lowered,
        options.target,
        vmfb,
        extra_flags=options.extra_flags,
        dump_dir=dump,
        repro_dir=repro,
        devices=options.devices,
    )


def paged_entry_points(paged) -> dict:
    """The paged entry points' manifest records (frontend/export.py, _PagedStep): their logits and
    next tokens are written into caller buffers; the functions return only the state."""
    from day0.runtime.artifact import EntryPoint

    if paged is None:
        return {}
    state = "*pools, *slots (paged.pools, blocks chosen at load; paged.slots, slots chosen at load)"
    most = max(paged.batch_sizes)
    prev = f"prev[{most}] int64 (an earlier step's next; ids < 0 read prev[-1 - id])"

    def entry(n: str, g: int, rows: str, next_: str, extra: tuple = (), **kw) -> EntryPoint:
        ins = (f"ids[{n}] int64", f"positions[{n}] int64", f"tables[{g},nb] int64", f"slots[{g}] int64", prev)
        outs = (f"logits_out[{rows},V] float32 (written)", f"next_out[{g}] int64 (written): {next_}")
        return EntryPoint((*ins, *outs, *extra, state), (state,), layout="paged", **kw)

    out = {"paged_prefill": entry("S", 1, "S", NEXT, min_len=2)}
    if paged.chunk:
        out["paged_prefill_chunk"] = entry(
            str(paged.chunk), 1, "1", NEXT + ", the logits of the last row only", static_len=paged.chunk
        )
    if paged.images:  # a chunk of a prompt with images: prefill_mm's features and rows
        out["paged_prefill_mm"] = entry("S", 1, "S", NEXT, ENTRY_POINTS["prefill_mm"]["inputs"][2:4], min_len=2)
    for b in paged.batch_sizes:
        out[f"paged_decode_{b}"] = entry(str(b), b, str(b), "per row, -1 where not finite", batch=b)
    return out


def paged_layout(model, options: BuildOptions, paged):
    from day0.runtime.artifact import PagedLayout

    if paged is None:
        return None
    pools, slots = model.paged_state(paged.block)
    return PagedLayout(
        paged.block, -(-options.max_seq_len // paged.block), paged.batch_sizes, tuple(pools), tuple(slots)
    )


def device_bytes(ckpt, names, experts: int, devices: int) -> tuple[int, ...]:
    """The bytes of the parameters `names` (read from checkpoint `ckpt`) each device holds when
    the model's `experts` routed experts are split among `devices` (models/moe.py
    expert_device); () for one device."""
    from day0.models.moe import expert_device

    if devices == 1:
        return ()
    out = [0] * devices
    for n in names:
        out[expert_device(n, experts, devices)] += ckpt.tensors[n].nbytes
    return tuple(out)


def check_options(options: BuildOptions) -> None:
    """The options' values in range, or a BuildError naming the option (no work done)."""
    from day0.lowering.targets import TARGETS, get_target

    target = get_target(options.target)  # an unknown target names the known ones
    n = options.max_seq_len
    if type(n) is not int or not MIN_MAX_SEQ_LEN <= n <= MAX_MAX_SEQ_LEN:
        raise BuildError(f"--max-seq-len must be an integer in [{MIN_MAX_SEQ_LEN}, {MAX_MAX_SEQ_LEN}] (got {n})")
    c = options.prefill_chunk
    if c is not None and (type(c) is not int or c < 0):
        raise BuildError(f"--prefill-chunk must be an integer >= 0 (got {c})")
    if type(options.max_batch) is not int or not 0 <= options.max_batch <= 1024:
        raise BuildError(f"--max-batch must be an integer in [0, 1024] (got {options.max_batch})")
    if type(options.block_size) is not int or not 1 <= options.block_size <= 4096:
        raise BuildError(f"--block-size must be an integer in [1, 4096] (got {options.block_size})")
    if options.matmul_terms not in (None, 2, 3):
        raise BuildError(f"--matmul-terms must be 2 or 3 (got {options.matmul_terms})")
    if options.image_terms not in (None, 1, 2, 3):
        raise BuildError(f"--image-terms must be 1, 2 or 3 (got {options.image_terms})")
    if type(options.devices) is not int or not 1 <= options.devices <= MAX_DEVICES:
        raise BuildError(f"--devices must be an integer in [1, {MAX_DEVICES}] (got {options.devices})")
    if options.devices > 1 and not target.spans_devices:
        spanning = ", ".join(t.name for t in TARGETS.values() if t.spans_devices)
        raise BuildError(
            f"--devices {options.devices}: artifacts over several devices are built for {spanning} (local devices) "
            f"so far, not for {options.target}"
        )


def is_artifact(path: Path) -> bool:
    """Whether `path` holds a manifest.json that day0 wrote (any format version)."""
    try:
        data = json.loads((Path(path) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and {"format_version", "architecture", "entry_points"} <= data.keys()


def check_output(out_dir: Path) -> None:
    """A BuildError naming `out_dir` unless compiling there loses nothing day0 did not write: it
    is absent (under a directory), an empty directory, or a day0 artifact with only day0's files."""
    out_dir = Path(out_dir)
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise BuildError(f"output {out_dir} exists and is not a directory; refusing to replace it")
    if not out_dir.exists():
        parent = next((p for p in out_dir.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise BuildError(f"output {out_dir}: {parent} is not a directory")
        return
    try:
        names = sorted(p.name for p in out_dir.iterdir())
    except OSError as e:
        raise BuildError(f"output {out_dir}: cannot list it ({e.strerror})") from None
    if not names:
        return
    if not is_artifact(out_dir):
        raise BuildError(
            f"output {out_dir} is a non-empty directory that is not a day0 artifact (no manifest.json "
            f"written by day0); refusing to replace it: choose another -o or empty it"
        )
    foreign = [n for n in names if n not in ARTIFACT_FILES]
    if foreign:
        raise BuildError(
            f"output {out_dir} is a day0 artifact but also holds {', '.join(foreign[:3])}"
            f"{' ...' if len(foreign) > 3 else ''}, which day0 did not write; refusing to replace it"
        )


def _staging_dir(out_dir: Path) -> Path:
    """A fresh hidden sibling of out_dir, unique to this compile (process and call)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


@contextlib.contextmanager
def output_lock(out_dir: Path):
    """An exclusive flock on `.<name>.lock` next to out_dir, held for the block (released when
    the process dies). The lock file stays: removing it would let two holders lock two files."""
    import fcntl

    with open(out_dir.parent / f".{out_dir.name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories a and b in one atomic step; False where the system cannot."""
    import ctypes
    import errno

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish_replacing(tmp: Path, out_dir: Path, manifest):
    """Seal the built directory `tmp` (runtime/artifact.py `seal`: the manifest written last) and
    put it in out_dir's place, under output_lock; returns the manifest. An existing out_dir is
    checked again (check_output), swapped out atomically, then removed."""
    from day0.runtime.artifact import seal

    out_dir = Path(out_dir)
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with output_lock(out_dir):
        check_output(out_dir)  # the output may have changed while we compiled
        manifest = seal(tmp, manifest)
        try:
            if not out_dir.exists():
                os.rename(tmp, out_dir)
            elif not _exchange(tmp, out_dir):  # two renames: out_dir is briefly absent
                os.rename(out_dir, old)
                os.rename(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # the replaced artifact after a swap, or ours on failure
            shutil.rmtree(old, ignore_errors=True)
    return manifest


def tool_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {
        p: version(p)
        for p in ("torch", "torch-mlir", "iree-base-compiler", "iree-base-runtime", "transformers", "day0")
    }
