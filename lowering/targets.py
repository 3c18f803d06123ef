"""Compilation targets: the iree-compile flags and the runtime device of each.

A `Target` names everything `compile.py` needs beyond the input IR: the flags, the runtime
device an artifact compiled for it runs on by default, and (for targets iree-compile cannot
name by flag) a rewrite that attaches the device target to the module itself.

    llvm-cpu   the host CPU (vmfb not portable to another CPU model: target-cpu=host)
    cuda-sm90  NVIDIA Hopper (H100/H200); compiles on any machine, no GPU needed

Why each llvm-cpu flag (measured with IREE 3.13 on the 2-core dev CPU, see DESIGN.md):
  --iree-opt-level=O3                       the default level is O0-like: it leaves an
                                            index_select over stacked experts as its own
                                            dispatch, O3 fuses it into the matvec
  --iree-dispatch-creation-enable-aggressive-fusion
                                            MXFP4 unpack fuses into the matvec only with it
                                            (O3 implies it; kept explicit so the manifest says so)
  --iree-llvmcpu-reassociate-fp-reductions  the fused MXFP4 matvec is fast only with it
  --iree-opt-data-tiling=false              weights are runtime parameters: data tiling would
                                            repack them on every call
"""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Target:
    """One compilation target.

    `flags` go to iree-compile after `--iree-input-type=torch`; `device` is the runtime device
    (`day0.runtime.vm` name) an artifact for this target runs on by default; `prepare`, when
    set, rewrites the module text before compiling (used to attach a device target that no
    flag can express).
    """

    name: str
    flags: tuple[str, ...]
    device: str
    prepare: Callable[[str], str] | None = field(default=None, compare=False)
    # > 0: artifacts also get `prefill_chunk`, prefill at this static length, which Session runs
    # prompts through (see driver.py); 0: prompts go through the dynamic-length prefill only.
    prefill_chunk: int = 0
    # The position-indexed caches' dtype for models that support bf16 caches (others: float32).
    cache_dtype: str = "float32"

    def prepare_module(self, mlir_text: str) -> str:
        return self.prepare(mlir_text) if self.prepare else mlir_text


# --- CUDA sm_90 -----------------------------------------------------------------------------
# IREE 3.13's `--iree-cuda-target=sm_90` fails with "missing GPU target in
# #hal.executable.target": its known-target table has no sm_90 entry. sm_89 is known, and the
# PTX codegen only needs `arch` to say sm_90, so we take the device target IREE materializes for
# sm_89, replace the arch, and attach it to the module as `hal.device.targets`.

_PROBE_MODULE = (
    "module { func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> "
    "{ return %a : tensor<4xf32> } }\n"
)
# `util.global private @__device_0 = #hal.device.target<...> : !hal.device`
_DEVICE_GLOBAL = re.compile(r"util\.global private @__device_0 = (#hal\.device\.target<.*>) : !hal\.device")


@functools.lru_cache(maxsize=None)
def cuda_device_target_attr(arch: str = "sm_90", probe_arch: str = "sm_89") -> str:
    """The `#hal.device.target<"cuda", ...>` attribute text for `arch`.

    Derived from the compiler itself: iree-compile materializes the device target of
    `probe_arch` (one it knows) at the preprocessing phase of a trivial module; the `arch`
    field is then replaced. Deriving it (rather than pasting a string) keeps the attribute in
    the syntax of whichever IREE is installed.
    """
    from day0.lowering.compile import iree_compile_path

    with tempfile.TemporaryDirectory(prefix="day0-cuda-probe-") as tmp:
        src = Path(tmp) / "probe.mlir"
        src.write_text(_PROBE_MODULE)
        cmd = [
            iree_compile_path(), str(src), "--iree-hal-target-device=cuda",
            f"--iree-cuda-target={probe_arch}", "--compile-to=preprocessing", "-o", "-",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"probing the CUDA {probe_arch} target failed: {proc.stderr.strip()}")
    match = _DEVICE_GLOBAL.search(proc.stdout)
    if match is None:
        raise RuntimeError(f"no CUDA device target found in IREE's output for {probe_arch}")
    attr = match.group(1)
    probe_field = f'arch = "{probe_arch}"'
    if probe_field not in attr:
        raise RuntimeError(f"IREE's {probe_arch} target has no `{probe_field}` field: {attr}")
    return attr.replace(probe_field, f'arch = "{arch}"')


# The first top-level `module` header: `module`, optional `@name`, optional `attributes {`.
_MODULE_HEADER = re.compile(r"^module\b(?:\s+@[\w$.\-]+)?(\s*attributes\s*\{)?", re.MULTILINE)


def attach_device_targets(mlir_text: str, device_target_attr: str) -> str:
    """`mlir_text` with `hal.device.targets = [<attr>]` on its top-level module.

    Handles `module {`, `module @name {`, `module attributes {...} {` and IR with no explicit
    module (wrapped in one). A module that already names its device targets is an error.
    """
    if "hal.device.targets" in mlir_text:
        raise ValueError("module already has hal.device.targets; refusing to attach another")
    entry = f"hal.device.targets = [{device_target_attr}]"
    match = _MODULE_HEADER.search(mlir_text)
    if match is None:
        return f"module attributes {{{entry}}} {{\n{mlir_text}\n}}\n"
    if match.group(1):  # existing attribute dictionary: prepend our entry inside it
        return mlir_text[: match.end()] + entry + ", " + mlir_text[match.end():]
    return mlir_text[: match.end()] + f" attributes {{{entry}}}" + mlir_text[match.end():]


def _attach_cuda_sm90(mlir_text: str) -> str:
    return attach_device_targets(mlir_text, cuda_device_target_attr("sm_90"))


# --- the table --------------------------------------------------------------------------------

TARGETS: dict[str, Target] = {
    "llvm-cpu": Target(
        name="llvm-cpu",
        flags=(
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host",
            "--iree-opt-level=O3",
            "--iree-dispatch-creation-enable-aggressive-fusion",
            "--iree-llvmcpu-reassociate-fp-reductions",
            "--iree-opt-data-tiling=false",
        ),
        device="local-task",
    ),
    # No device flags: the device target travels inside the module (see _attach_cuda_sm90).
    # O3: on the 12-layer e2e model it takes a decode step from 823 to 679 kernel launches (6.93
    # -> 6.58 ms a token on the H200) with outputs bitwise equal to the default level's
    # (docs/perf.md). It had made the matmul-form indexer 4-45x slower; the indexer is a day0
    # kernel now.
    # MXFP4 matmuls do not reach IREE's codegen here (mxfp4-to-cuda-matvec): its reduction
    # pipeline fails on the fused form, and the fallback pipeline miscompiled it on the H200.
    # Prefill in static chunks of 512: with a dynamic row count IREE's CUDA matmul configuration
    # is the matvec one (one workgroup reduces one output element: no reuse of either operand),
    # a static count gets tiled matmuls (TileAndFuse, 32x128 tiles); docs/perf.md, e2e.
    "cuda-sm90": Target(
        name="cuda-sm90",
        flags=("--iree-opt-level=O3", "--iree-opt-data-tiling=false"),
        device="cuda",
        prepare=_attach_cuda_sm90,
        prefill_chunk=512,
        # bf16 latent and indexer caches take the tensor-core attention and indexer kernels: the
        # 4.9B e2e model's decode 6.1 -> 4.4 ms a token at 1K on the H200 (docs/perf.md, e2e)
        cache_dtype="bfloat16",
    ),
}


def get_target(name: str) -> Target:
    """The target called `name`; ValueError listing the known ones otherwise."""
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(TARGETS))
        raise ValueError(f"unknown target {name!r}; known targets: {known}") from None
