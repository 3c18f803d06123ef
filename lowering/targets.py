"""Compilation targets: everything that differs between the machines day0 compiles for.

A `Target` is the one place a target is described: its iree-compile flags, its optimization level,
its pass pipeline (`pipeline()`), the day0 ops its passes lower to day0's own kernels (kept whole
by export), the runtime devices its vmfb runs on, and its defaults (static prefill chunk, cache
dtype). The CLI's choices, the compile driver, the benchmarks and the checks all ask `TARGETS`.

    llvm-cpu   the host CPU (vmfb not portable to another CPU model: target-cpu=host)
    cuda-sm90  NVIDIA Hopper (H100/H200); compiles on any machine, no GPU needed

Adding a target: one entry in TARGETS (and, if it lowers an op its own way, that pass in its
`passes`); nothing else names targets.
"""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DSA_TILE = 64
DEVICE_FLAG = "--iree-hal-target-device="

# One pipeline entry: (role, pass). The roles let a tool that compiles a module of one op take the
# target's lowering of that op alone (`Target.pipeline(roles=...)`):
#   weights  checkpoint tensors become IREE parameters; stacked experts are built once
#   indexer  the DSA indexer's scores (targets that keep day0::indexer_scores whole)
#   router   day0::moe_route (targets that keep it whole)
#   topk     aten.topk
#   mxfp4    day0::mxfp4_linear / day0::mxfp4_moe
#   dsa      day0::dsa_attention (the pass text is a function of the model's DSA shape, DsaShape)
#   vision   day0::vision_attention (targets that keep it whole)
#   matmul   the remaining matmuls
#   fusion   day0::materialize (targets that keep it: a fusion boundary, frontend/ops.py)
#   devices  day0::to_device (a module over several devices: `day0 compile --devices N`)
ROLES = ("weights", "indexer", "router", "topk", "mxfp4", "dsa", "vision", "matmul", "fusion", "devices")


@dataclass(frozen=True)
class DsaShape:
    """What the DSA lowering depends on: the selection width K (the indexer's top-k), the block
    size of a block-structured selection (glm5_next's k-pool; 0: token-level) and the preferred
    gather tile."""

    width: int
    block: int = 0
    preferred_tile: int = DEFAULT_DSA_TILE
    keys: int = 0  # the longest key range a step scores (max_seq_len; 0: not known)

    @property
    def selection_row(self) -> int:
        """The longest row the indexer's top-k may see (the key range plus its `width` padding
        columns: models/dsa_indexer.py), 0 when the key range is not known."""
        return self.keys + self.width if self.keys else 0

    @property
    def tile(self) -> int:
        """The largest tile <= preferred_tile that divides K."""
        return max(t for t in range(1, min(self.preferred_tile, self.width) + 1) if self.width % t == 0)


def _gather_tiles(dsa: DsaShape | None) -> str | None:
    # a block-structured selection gathers whole blocks; a token-level one tiles of `tile` slots
    if dsa is None:
        return None
    return f"dsa-to-gather-tiles{{block={dsa.block}}}" if dsa.block else f"dsa-to-gather-tiles{{tile={dsa.tile}}}"


@dataclass(frozen=True)
class PassInputs:
    """What a target's pass text may depend on (Target.pipeline): the model's DSA shape (None: no
    DSA op), the bf16 terms of the matmuls outside and inside the vision tower, and the devices
    the module spans."""

    dsa: DsaShape | None
    matmul_terms: int
    image_terms: int
    devices: int = 1


@dataclass(frozen=True)
class Target:
    """One compilation target (see the module docstring).

    `flags` (device flags, then `--iree-opt-level`, then codegen flags) go to iree-compile after
    `--iree-input-type=torch`; `prepare`, when set, rewrites the module text before compiling (it
    attaches a device target that no flag can express).
    """

    name: str
    description: str
    devices: tuple[str, ...]  # runtime devices (day0.runtime.vm names) the vmfb runs on, default first
    device_flags: tuple[str, ...]
    opt_level: str
    codegen_flags: tuple[str, ...]
    # (role, pass text, or a function of the PassInputs giving the pass text, or None to leave the
    # pass out)
    passes: tuple[tuple[str, str | Callable[[PassInputs], str | None]], ...]
    kept_ops: tuple[str, ...] = ()  # day0 ops export keeps whole for this target's kernels
    # > 0: artifacts also get `prefill_chunk`, prefill at this static length, which Session runs
    # prompts through (lowering/driver.py); 0: prompts go through the dynamic-length prefill only.
    prefill_chunk: int = 0
    # Flags for whole-model artifacts only (lowering/driver.py), not for the single-op modules of
    # tests and GPU checks, which are called through iree.runtime's own invoker: ABI changes.
    artifact_flags: tuple[str, ...] = ()
    # The position-indexed caches' dtype for models that support bf16 caches (others: float32).
    cache_dtype: str = "float32"
    # Whether a model's vision tower is compiled (encode_image, prefill_mm: lowering/driver.py);
    # where not, an artifact of a checkpoint with one is text only, and the compile says so.
    images: bool = False
    # bf16 terms per f32 activation in matmul-to-bf16-terms, where the passes run it (BuildOptions
    # matmul_terms overrides)
    matmul_terms: int = 3
    # the same in the vision tower's functions (encode_image_<P>), and the terms of q, k, v and the
    # probabilities in its attention kernel (at most 2; BuildOptions image_terms overrides)
    image_terms: int = 3
    prepare: Callable[[str], str] | None = field(default=None, compare=False)

    @property
    def device(self) -> str:
        """The runtime device an artifact for this target runs on by default."""
        return self.devices[0]

    @property
    def flags(self) -> tuple[str, ...]:
        return (*self.device_flags, f"--iree-opt-level={self.opt_level}", *self.codegen_flags)

    @property
    def spans_devices(self) -> bool:
        """Whether a module for this target may span several devices (`day0 compile --devices N`):
        its device is one `--iree-hal-target-device` flag, which flags_for repeats (cuda-sm90's
        travels inside the module instead: _attach_cuda_sm90)."""
        return sum(f.startswith(DEVICE_FLAG) for f in self.device_flags) == 1

    def flags_for(self, devices: int) -> tuple[str, ...]:
        """`flags` for a module over `devices` devices: the device flag once for each, `kind[0]` ..
        `kind[N-1]`. IREE names them @__device_0 .. @__device_<N-1> (where the to-device-transfer
        pass places values) and maps them to the first N devices the runtime gives it
        (runtime/vm.py get_devices)."""
        if devices == 1:
            return self.flags
        if not self.spans_devices:
            raise ValueError(f"target {self.name} does not compile for several devices (--devices {devices})")
        (named,) = (f for f in self.flags if f.startswith(DEVICE_FLAG))
        i, kind = self.flags.index(named), named[len(DEVICE_FLAG) :]
        return (*self.flags[:i], *(f"{DEVICE_FLAG}{kind}[{d}]" for d in range(devices)), *self.flags[i + 1 :])

    def prepare_module(self, mlir_text: str) -> str:
        return self.prepare(mlir_text) if self.prepare else mlir_text

    def pipeline(
        self,
        dsa: DsaShape | None = None,
        roles: tuple[str, ...] | None = None,
        matmul_terms: int | None = None,
        image_terms: int | None = None,
        devices: int = 1,
    ) -> str:
        """This target's pass pipeline for a model whose DSA op has shape `dsa` (None: no DSA op);
        `roles`: only the passes of those roles (ROLES), in pipeline order; `matmul_terms`,
        `image_terms`: the bf16 terms of matmul-to-bf16-terms outside and inside the vision tower
        (the latter also vision-attention-to-cuda-kernel's, at most 2), where the target runs them
        (None: the target's)."""
        inputs = PassInputs(
            dsa,
            self.matmul_terms if matmul_terms is None else matmul_terms,
            self.image_terms if image_terms is None else image_terms,
            devices,
        )
        unknown = set(roles or ()) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown pass role(s) {', '.join(sorted(unknown))}; roles: {', '.join(ROLES)}")
        chosen = []
        for role, p in self.passes:
            if roles is not None and role not in roles:
                continue
            if callable(p):
                p = p(inputs)
            if p is not None:
                chosen.append(p)
        return f"builtin.module({','.join(chosen)})"


def _radix_select(dsa: DsaShape | None) -> str:
    # every topk (min-size=0); the indexer's rows, of dynamic length, are at most row-bound long
    bound = dsa.selection_row if dsa is not None else 0
    return f"topk-to-radix-select{{min-size=0 row-bound={bound}}}"


# --- CUDA sm_90 -----------------------------------------------------------------------------
# IREE 3.13's `--iree-cuda-target=sm_90` fails with "missing GPU target in
# #hal.executable.target": its known-target table has no sm_90 entry. sm_89 is known, and the
# PTX codegen only needs `arch` to say sm_90, so we take the device target IREE materializes for
# sm_89, replace the arch, and attach it to the module as `hal.device.targets`.

_PROBE_MODULE = "module { func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> } }\n"
# `util.global private @__device_0 = #hal.device.target<...> : !hal.device`
_DEVICE_GLOBAL = re.compile(r"util\.global private @__device_0 = (#hal\.device\.target<.*>) : !hal\.device")


@functools.cache
def cuda_device_target_attr(arch: str = "sm_90", probe_arch: str = "sm_89") -> str:
    """The `#hal.device.target<"cuda", ...>` attribute text for `arch`.

    Derived from the compiler itself: iree-compile materializes the device target of
    `probe_arch` (one it knows) at the preprocessing phase of a trivial module; the `arch`
    field is then replaced. Deriving it (rather than pasting a string) keeps the attribute in
    the syntax of whichever IREE is installed.
    """
    from day0.lowering.iree_tool import iree_compile_path

    with tempfile.TemporaryDirectory(prefix="day0-cuda-probe-") as tmp:
        src = Path(tmp) / "probe.mlir"
        src.write_text(_PROBE_MODULE)
        cmd = [
            iree_compile_path(),
            str(src),
            "--iree-hal-target-device=cuda",
            f"--iree-cuda-target={probe_arch}",
            "--compile-to=preprocessing",
            "-o",
            "-",
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
        return mlir_text[: match.end()] + entry + ", " + mlir_text[match.end() :]
    return mlir_text[: match.end()] + f" attributes {{{entry}}}" + mlir_text[match.end() :]


def _attach_cuda_sm90(mlir_text: str) -> str:
    return attach_device_targets(mlir_text, cuda_device_target_attr("sm_90"))


# --- the table --------------------------------------------------------------------------------

_WEIGHTS = (("weights", "parameters-to-globals"), ("weights", "hoist-parameter-stacks"))

TARGETS: dict[str, Target] = {
    # --iree-opt-level=O3: the default level leaves an index_select over stacked experts as its own
    #   dispatch; O3 fuses it into the matvec.
    # --iree-dispatch-creation-enable-aggressive-fusion: MXFP4 unpack fuses into the matvec only
    #   with it (O3 implies it; kept explicit so the manifest says so).
    # --iree-llvmcpu-reassociate-fp-reductions: the fused MXFP4 matvec is fast only with it.
    # --iree-opt-data-tiling=false: weights are runtime parameters; data tiling would repack them
    #   on every call.
    # (each measured with IREE 3.13 on the 2-core CI CPU)
    "llvm-cpu": Target(
        name="llvm-cpu",
        description="the host CPU (IREE llvm-cpu, target-cpu=host)",
        devices=("local-task", "local-sync"),
        device_flags=(
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host",
        ),
        opt_level="O3",
        codegen_flags=(
            "--iree-dispatch-creation-enable-aggressive-fusion",
            "--iree-llvmcpu-reassociate-fp-reductions",
            "--iree-opt-data-tiling=false",
        ),
        passes=(
            *_WEIGHTS,
            ("devices", lambda i: f"to-device-transfer{{devices={i.devices}}}" if i.devices > 1 else None),
            # IREE's default lowering of aten.topk sorts whole rows (slow), and miscompiles two
            # topks over a shared causal mask; iree_linalg_ext.topk keeps the lower index on ties
            ("topk", "topk-to-linalg-ext"),
            ("mxfp4", "fuse-mxfp4-matmul"),
            ("dsa", lambda i: _gather_tiles(i.dsa)),
        ),
        images=True,
    ),
    # No device flags: the device target travels inside the module (see _attach_cuda_sm90).
    # O3: fewer kernel launches a decode step, outputs bitwise equal to the default level's.
    # day0's own kernels replace IREE's lowering where it is slow or wrong on sm_90 (docs/perf.md):
    #   indexer scores, DSA attention and the vision tower's attention (tensor-core kernels), the MoE router (one kernel where
    #   IREE made ~8 dispatches), every topk (radix select: IREE's GPU
    #   topk is slow and produced out-of-range indices on -inf-masked router rows, min-size=0 sends
    #   every row to it), MXFP4 matmuls (IREE's CUDA codegen fails on or miscompiles the fused
    #   form); the remaining prefill matmuls against bf16 weights run as bf16 tensor-core products
    #   (IREE compiles f32 matmuls for sm_90 as SIMT code), and a batched decode step's linears of
    #   2-64 rows run on day0's linear kernel (IREE's stacked three-term products took 5-17x their
    #   weight bytes' time).
    # Prefill in static chunks of 512: with a dynamic row count IREE's CUDA matmul configuration
    # is the matvec one; a static count gets tiled matmuls.
    # bf16 latent and indexer caches: what the tensor-core attention and indexer kernels read.
    # --iree-torch-externalize-transients (artifacts only): every entry point of an artifact takes
    #   its transient memory from the caller (runtime/step_call.py). IREE's CUDA driver runs a
    #   call's queue_alloca/dealloca on the calling thread and waits there for their fences, so an
    #   allocating step blocks the host until its inputs arrive and again until it ends; with
    #   caller transients and the paged steps' results written into caller buffers
    #   (frontend/export.py, _PagedStep), a paged step is one submission and the Engine overlaps
    #   the next step's host work with it. (Not on
    #   llvm-cpu: IREE 3.13 rejects it for a dynamic-length prefill there, "explicit execution
    #   regions must only contain explicit ops"; a CPU step has no launch latency to hide.)
    "cuda-sm90": Target(
        name="cuda-sm90",
        description="NVIDIA Hopper (H100/H200); compiles on any machine, no GPU or CUDA toolkit needed",
        devices=("cuda",),
        device_flags=(),
        opt_level="O3",
        codegen_flags=("--iree-opt-data-tiling=false",),
        artifact_flags=("--iree-torch-externalize-transients",),
        passes=(
            *_WEIGHTS,
            ("indexer", "indexer-scores-to-cuda-kernel"),
            ("router", "moe-route-to-cuda-kernel"),
            ("topk", lambda i: _radix_select(i.dsa)),
            ("topk", "topk-to-linalg-ext"),
            ("mxfp4", "mxfp4-to-cuda-matvec"),
            ("dsa", lambda i: None if i.dsa is None else "dsa-to-cuda-kernel"),
            ("vision", lambda i: f"vision-attention-to-cuda-kernel{{terms={min(i.image_terms, 2)}}}"),
            ("matmul", "matmul-to-cuda-linear"),
            ("matmul", lambda i: f"matmul-to-bf16-terms{{terms={i.matmul_terms} image-terms={i.image_terms}}}"),
            ("fusion", "materialize-to-barrier"),
        ),
        kept_ops=("indexer_scores", "moe_route", "materialize", "vision_attention", "mxfp4_moe_swiglu"),
        prefill_chunk=512,
        cache_dtype="bfloat16",
        # two terms (2^-18 |x| left out): on the trained default model held-out perplexity and
        # greedy tokens equal three terms' (docs/perf.md, default model), ~8% faster 4K prefill
        matmul_terms=2,
        # the vision tower at one term: bf16 products with f32 accumulation and a bf16 flash
        # attention, as transformers' bf16 tower computes (docs/perf.md, images)
        image_terms=1,
        prepare=_attach_cuda_sm90,
        # the vision tower at static buckets, its attention on day0's kernel
        # (vision-attention-to-cuda-kernel; docs/perf.md, images)
        images=True,
    ),
}


def get_target(name: str) -> Target:
    """The target called `name`; ValueError listing the known ones otherwise."""
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(TARGETS))
        raise ValueError(f"unknown target {name!r}; known targets: {known}") from None
