"""iree-compile invocation: torch-dialect MLIR text in, a `.vmfb` out (or the IR at a phase).

iree-compile runs as a subprocess (the venv's binary), never in-process: a crash or a fatal
error in the compiler then cannot take the Python process down, and every failure can be
replayed from a shell. On failure a repro directory is written, as torch-mlir's
`compiler_utils` does:

    <repro>/input.mlir    the exact module given to iree-compile (after the target's rewrite)
    <repro>/command.sh    the exact command line, with paths into <repro>
    <repro>/stderr.log    iree-compile's diagnostics

and `CompileError` is raised naming the stage, the first error line and the repro directory.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from day0.lowering.iree_tool import CompileError, iree_compile_path
from day0.lowering.targets import get_target

# iree-compile's phases, in order (`--compile-to=` values; `--dump-compilation-phases-to`
# writes `<stem>.<i>.<phase>.mlir` for i = 1.. after each of them but `start`/`end`).
PHASES = (
    "input",
    "abi",
    "preprocessing",
    "global-optimization",
    "dispatch-creation",
    "flow",
    "stream",
    "executable-sources",
    "executable-configurations",
    "executable-targets",
    "hal",
    "vm",
)


@dataclass(frozen=True)
class CompileResult:
    """What a successful compile did: the full iree-compile flags (no paths) and wall time."""

    flags: tuple[str, ...]
    seconds: float


def target_flags(target: str, extra_flags: Sequence[str] = (), devices: int = 1) -> tuple[str, ...]:
    """Every flag `compile_mlir` passes for `target` (input type, target flags for `devices`
    devices: Target.flags_for, extras)."""
    return ("--iree-input-type=torch", *get_target(target).flags_for(devices), *extra_flags)


def compile_mlir(
    mlir_text: str,
    target: str,
    output_vmfb: Path,
    extra_flags: Sequence[str] = (),
    dump_dir: Path | None = None,
    *,
    repro_dir: Path | None = None,
    devices: int = 1,
) -> CompileResult:
    """Compile torch-dialect `mlir_text` for `target` into `output_vmfb` (written atomically).

    With `dump_dir`: writes `dump_dir/input.mlir` (the module as given to iree-compile) and
    `dump_dir/phases/input.<i>.<phase>.mlir` after each compilation phase. On failure a repro
    directory is written (`repro_dir`, else `dump_dir/repro`, else a fresh temp directory) and
    `CompileError` raised.
    """
    output_vmfb = Path(output_vmfb)
    flags = target_flags(target, extra_flags, devices)
    text = get_target(target).prepare_module(mlir_text)
    if dump_dir is not None:
        dump_dir = Path(dump_dir)
        shutil.rmtree(dump_dir / "phases", ignore_errors=True)  # stale phases would mislead
        (dump_dir / "phases").mkdir(parents=True)
        flags = (*flags, f"--dump-compilation-phases-to={(dump_dir / 'phases').resolve()}")
    output_vmfb.parent.mkdir(parents=True, exist_ok=True)
    # Temp output next to the destination so the final rename stays on one filesystem; not
    # pre-created (mkstemp's 0600 mode would stick to the vmfb): iree-compile creates it.
    tmp_out = output_vmfb.with_name(f".{output_vmfb.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with tempfile.TemporaryDirectory(prefix="day0-compile-") as work:
            src = Path(dump_dir or work) / "input.mlir"
            src.write_text(text)
            start = time.perf_counter()
            _run(
                src,
                flags,
                tmp_out,
                stage=f"iree-compile --target {target}",
                repro_out=output_vmfb.name,
                dump_dir=dump_dir,
                repro_dir=repro_dir,
            )
            seconds = time.perf_counter() - start
        os.replace(tmp_out, output_vmfb)
    finally:
        tmp_out.unlink(missing_ok=True)
    return CompileResult(flags=flags, seconds=seconds)


def compile_to_phase(
    mlir_text: str,
    target: str,
    phase: str = "flow",
    extra_flags: Sequence[str] = (),
    *,
    repro_dir: Path | None = None,
) -> str:
    """The IR text of `mlir_text` compiled for `target` up to `phase` (`--compile-to=phase`).

    Used to inspect what IREE makes of a module: count `flow.dispatch` ops at "flow", look for
    hoisted initializers at "flow"/"stream", etc.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
    flags = (*target_flags(target, extra_flags), f"--compile-to={phase}")
    text = get_target(target).prepare_module(mlir_text)
    with tempfile.TemporaryDirectory(prefix="day0-compile-") as work:
        src, out = Path(work) / "input.mlir", Path(work) / f"{phase}.mlir"
        src.write_text(text)
        _run(
            src,
            flags,
            out,
            stage=f"iree-compile --target {target} --compile-to={phase}",
            repro_out=out.name,
            dump_dir=None,
            repro_dir=repro_dir,
        )
        return out.read_text()


def flow_dispatches(flow: str, function: str) -> list[str]:
    """The dispatches one call of `function` launches, in order, from IREE's flow phase text
    (`compile_to_phase(..., "flow")` or a `--dump-stages` artifact's stages/iree/phases/*.flow.mlir):
    each `flow.dispatch @executable::@entry`'s entry name, in the body of the function's
    `$async` form (its synchronous wrapper only waits on it)."""
    head = re.search(r"util\.func public @" + re.escape(function) + r"\$async\(", flow)
    if head is None:
        raise ValueError(f"no function {function!r} in the flow text")
    end = re.search(r"\n  (util\.func|util\.initializer|flow\.executable|util\.global)\b", flow[head.end() :])
    body = flow[head.end() : head.end() + end.start()] if end else flow[head.end() :]
    return re.findall(r"flow\.dispatch @[\w$]+::@([\w$]+)", body)


def _run(
    src: Path,
    flags: Sequence[str],
    out: Path,
    *,
    stage: str,
    repro_out: str,
    dump_dir: Path | None,
    repro_dir: Path | None,
) -> None:
    """Run iree-compile on `src`; on failure write the repro (output named `repro_out`)."""
    cmd = [iree_compile_path(), str(src), *flags, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return
    stage = _with_failed_phase(stage, dump_dir)
    repro = _write_repro(src, flags, repro_out, dump_dir, repro_dir)
    # Diagnostics name the (temporary) input path: point them at the repro's copy instead.
    stderr = proc.stderr.replace(str(src), str(repro / "input.mlir"))
    (repro / "stderr.log").write_text(stderr)
    raise CompileError(stage, _first_error(stderr, proc.returncode), repro)


def _first_error(stderr: str, returncode: int) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line:
            return line
    return lines[0] if lines else f"iree-compile exited with status {returncode} and no output"


def _with_failed_phase(stage: str, dump_dir: Path | None) -> str:
    """Name the phase that failed when phase dumps show how far compilation got."""
    if dump_dir is None:
        return stage
    # Dumps are `<stem>.<i>.<phase>.mlir`, written after each phase that completed.
    done = {p.name.split(".")[-2] for p in (dump_dir / "phases").glob("*.mlir")}
    reached = [i for i, phase in enumerate(PHASES) if phase in done]
    failed = PHASES[min(max(reached) + 1, len(PHASES) - 1)] if reached else PHASES[0]
    return f"{stage}, phase {failed!r}"


REPRO_HEADER = "#!/bin/sh\n# Reproduces the failed day0 compile.\n"
REPRO_FILES = {"input.mlir", "command.sh", "stderr.log"}


def _reusable_repro_dir(path: Path) -> bool:
    """Absent, empty, or a repro day0 wrote (its files only, command.sh with day0's header)."""
    if not path.exists():
        return True
    if not path.is_dir():
        return False
    names = {p.name for p in path.iterdir()}
    if not names:
        return True
    try:
        ours = (path / "command.sh").read_text(encoding="utf-8").startswith(REPRO_HEADER)
    except (OSError, ValueError):
        return False
    return ours and names <= REPRO_FILES


def _write_repro(src: Path, flags: Sequence[str], out_name: str, dump_dir: Path | None, repro_dir: Path | None) -> Path:
    """Copy the input and write command.sh into the repro directory; return it. A `repro_dir`
    that exists and holds anything but an earlier day0 repro is left alone (a fresh temp directory
    is used instead): its files may be the user's."""
    if repro_dir is not None and not _reusable_repro_dir(Path(repro_dir)):
        repro_dir = None
    if repro_dir is None:
        repro_dir = dump_dir / "repro" if dump_dir else Path(tempfile.mkdtemp(prefix="day0-repro-"))
    repro_dir = Path(repro_dir).resolve()
    repro_dir.mkdir(parents=True, exist_ok=True)
    repro_src = repro_dir / "input.mlir"
    if src.resolve() != repro_src:
        repro_src.write_text(src.read_text())
    cmd = [iree_compile_path(), str(repro_src), *flags, "-o", str(repro_dir / out_name)]
    script = repro_dir / "command.sh"
    script.write_text(REPRO_HEADER + shlex.join(cmd) + "\n")
    script.chmod(0o755)
    return repro_dir
