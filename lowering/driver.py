"""The compile driver: `day0 compile` from checkpoint directory to artifact directory. It is the
one module that imports every stage, and runs them one named stage at a time:

    read     config.json + shard headers, validated against the architecture (no weights loaded)
    export   torch.export of the entry points with uninitialized weights -> raw torch MLIR (frontend/)
    passes   the target's pipeline (passes/, chosen by lowering/targets.py)
    compile  iree-compile for the target -> model.vmfb (lowering/compile.py)
    publish  manifest.json (runtime/artifact.py) + tokenizer.json, and an atomic rename into place

Every stage's failure surfaces as a `BuildError` naming the stage; `dump_stages` writes the IR
after each of our stages and after each IREE phase under `<artifact>/stages/`.
"""

import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from day0.lowering.targets import DEFAULT_DSA_TILE

STAGES = ("read", "export", "passes", "compile", "publish")
DEFAULT_MAX_SEQ_LEN = 4096

# What each entry point takes and returns (the manifest's EntryPoint records; frontend/export.py
# emits them). Every one also returns the greedy next token after the logits.
NEXT = "next[1] int64 (argmax of the last row, lowest id on ties)"
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


def _progress_printer(stream=sys.stderr) -> Callable[[str, str], None]:
    started = {}

    def report(stage: str, event: str) -> None:
        i = STAGES.index(stage) + 1
        if event == "start":
            started[stage] = time.perf_counter()
            print(f"[{i}/{len(STAGES)}] {stage} ...", file=stream, flush=True)
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

    from day0.frontend.export import entry_points, export_model
    from day0.frontend.ir import MLIRError, new_context, parse_module
    from day0.lowering.compile import compile_mlir
    from day0.lowering.targets import DsaShape, get_target
    from day0.models.checkpoint import TORCH_DTYPES, Checkpoint
    from day0.models.mxfp4 import check_checkpoint_scales
    from day0.models.registry import architecture
    from day0.passes.pipeline import parse_pipeline
    from day0.runtime.artifact import (
        VMFB,
        EntryPoint,
        FileRecord,
        Manifest,
        Parameters,
        publish,
        staging_dir,
    )

    progress = progress or _progress_printer()
    checkpoint_dir, out_dir = Path(checkpoint_dir).resolve(), Path(out_dir).resolve()
    target = get_target(options.target)  # unknown target: clear error before any work
    if options.max_seq_len < 2:
        raise BuildError(f"--max-seq-len must be at least 2 (got {options.max_seq_len})")
    if options.prefill_chunk is not None and options.prefill_chunk < 0:
        raise BuildError(f"--prefill-chunk must be >= 0 (got {options.prefill_chunk})")

    progress("read", "start")
    ckpt = Checkpoint.open(checkpoint_dir)
    cfg, model_cls = architecture(ckpt.config)
    dtypes = {n: TORCH_DTYPES[t.dtype] for n, t in ckpt.tensors.items() if t.dtype in TORCH_DTYPES}
    with torch.no_grad():
        model = model_cls.empty(cfg, options.max_seq_len, dtypes, cache_dtype=cache_dtype(model_cls, cfg, options))
    ckpt.check_expected(model.parameter_shapes())
    check_checkpoint_scales(ckpt)
    progress("read", "done")

    tmp = staging_dir(out_dir)
    stages = tmp / "stages" if options.dump_stages else None
    if stages:
        stages.mkdir()
    try:
        progress("export", "start")
        chunk = prefill_chunk(model, options)
        exported = export_model(model, options.max_seq_len, keep=target.kept_ops, prefill_chunk=chunk)
        if stages:
            (stages / "00-export.mlir").write_text(exported.mlir)
        progress("export", "done")

        progress("passes", "start")
        width = model.selection_width()
        dsa = DsaShape(width, model.dsa_block(), options.dsa_tile) if width is not None else None
        with new_context():
            module = parse_module(exported.mlir)
            for i, p in enumerate(parse_pipeline(target.pipeline(dsa)), start=1):
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
        result = compile_mlir(
            lowered,
            options.target,
            tmp / VMFB,
            extra_flags=options.extra_flags,
            dump_dir=stages / "iree" if stages else None,
            repro_dir=out_dir.parent / f"{out_dir.name}.repro",
        )
        progress("compile", "done")

        progress("publish", "start")
        tokenizer = checkpoint_dir / "tokenizer.json"
        if tokenizer.exists():
            shutil.copy(tokenizer, tmp / "tokenizer.json")
        manifest = Manifest(
            architecture=cfg.model_type,
            config=ckpt.config,
            target=target.name,
            devices=target.devices,
            max_seq_len=options.max_seq_len,
            vocab_size=cfg.vocab_size,
            eos_token_id=cfg.eos_token_id,
            entry_points={
                name: EntryPoint(**ENTRY_POINTS[name], **({"static_len": chunk} if name == "prefill_chunk" else {}))
                for name in entry_points(model, chunk)
            },
            state=tuple(model.state_specs()),
            parameters=Parameters(
                scope="model",
                base_dir=str(checkpoint_dir),
                files=tuple(FileRecord(**f) for f in ckpt.file_records()),
                count=len(exported.parameters),
            ),
            compile_flags=tuple(result.flags),
            tools=tool_versions(),
        )
        manifest = publish(tmp, out_dir, manifest)
        progress("publish", "done")
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tool_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {
        p: version(p)
        for p in ("torch", "torch-mlir", "iree-base-compiler", "iree-base-runtime", "transformers", "day0")
    }
