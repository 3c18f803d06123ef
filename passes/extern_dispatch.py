"""Helpers for passes that call day0's hand-written CUDA kernels as IREE external dispatches: the
PTX shipped in lowering/kernels/, the `hal.executable.source` declaring a kernel set, the private
functions that dispatch it, parsing module-level text into a module, and `KernelCallPass`, the
shape every kernel pass shares (its sites, each rewritten into a call of a function per shape).

A kernel set's ABI (entries, bindings, push constants, workload = grid dims) and launch geometry
live in day0.lowering.kernel_geometry, which the GPU-host tools read too.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import ClassVar

from day0.frontend.ir import Module, Operation
from day0.lowering.kernel_geometry import KernelSet, f32_bits
from day0.passes.base import DiagnosticEngine, ModulePass, collect_sites, operator_name


@cache
def kernel_ptx(name: str) -> bytes:
    """The committed PTX `lowering/kernels/<name>` (regenerate with tools/build_kernels.py)."""
    return resources.files("day0.lowering").joinpath("kernels", name).read_bytes()


def _binding(read_only: bool) -> str:
    return "#hal.pipeline.binding<storage_buffer, ReadOnly>" if read_only else "#hal.pipeline.binding<storage_buffer>"


def _export(name: str, ordinal: int, read_only, constants: int, workload: int, threads: int) -> str:
    bindings = ", ".join(_binding(r) for r in read_only)
    args = ", ".join(f"%w{i}: index" for i in range(workload))
    grid = ", ".join([f"%w{i}" for i in range(workload)] + ["%one"] * (3 - workload))
    layout = f"#hal.pipeline.layout<constants = {constants}, bindings = [{bindings}]>"
    # Generic form: the custom assembly of these ops has changed between IREE releases.
    return f"""
    "hal.executable.export"() <{{layout = {layout}, ordinal = {ordinal} : index, sym_name = "{name}",
        sym_visibility = "public", workgroup_size = [{threads} : index, 1 : index, 1 : index]}}> ({{
    ^bb0(%device: !hal.device, {args}):
      %one = arith.constant 1 : index
      "hal.return"({grid}) : (index, index, index) -> ()
    }}, {{}}) : () -> ()"""


def executable_source_text(kernels: KernelSet) -> str:
    """`hal.executable.source @<kernels.executable>` exporting the set's entries in ordinal order,
    with its PTX embedded."""
    exports = "".join(
        _export(name, i, read_only, constants, workload, kernels.threads)
        for i, (name, read_only, constants, workload) in enumerate(kernels.entries)
    )
    symbol, ptx = kernels.executable, kernel_ptx(kernels.ptx)
    data = f'dense<"0x{ptx.hex().upper()}"> : vector<{len(ptx)}xi8>'
    target = '#hal.executable.target<"cuda", "cuda-nvptx-fb">'
    # `path` names the file for readers; IREE uses the embedded `data` (IREE 3.13 also prints an
    # object without a path unparseably, as `<{, data = ...}>`).
    obj = f'#hal.executable.object<{{path = "{kernels.ptx}", data = {data}}}>'
    objects = f"#hal.executable.objects<{{{target} = [{obj}]}}>"
    return f"""
  "hal.executable.source"() <{{sym_name = "{symbol}", sym_visibility = "private", objects = {objects}}}> ({{{exports}
    "hal.executable.source_end"() : () -> ()
  }}) : () -> ()"""


def scale_tag(scale: float) -> str:
    """`s<8 hex digits>`: the f32 bits of a scale, for function names."""
    return f"s{f32_bits(scale) & 0xFFFFFFFF:08x}"


def tensor_text(dims, elem: str) -> str:
    """tensor<...> spelling of dims (None = dynamic) and an element type."""
    return f"tensor<{'x'.join(['?' if d is None else str(d) for d in dims] + [elem])}>"


def call_kernels(
    module_op: Operation, sites, key_of, function_name, function_text, rewrite, executable_text: str
) -> None:
    """Rewrite each site (`rewrite(site, fn)`, under the site op's location) into a call of the
    private function `function_name(*key_of(site))`, one function per distinct key, then append
    `executable_text` (the kernels' executable) and those functions to the module."""
    functions = {}
    for site in sites:
        key = key_of(site)
        functions[function_name(*key)] = key
        with site.op.location:
            rewrite(site, function_name(*key))
    append_parsed(module_op, executable_text + "".join(function_text(*functions[n]) for n in sorted(functions)))


def append_parsed(module_op: Operation, text: str) -> None:
    """Parse `text` (module-level ops) in the module's context and move them to its end."""
    parsed = Module.parse(f"module {{{text}\n}}", module_op.context)
    body = module_op.regions[0].blocks[0]
    for op in list(parsed.body.operations):
        body.append(op)


class KernelCallPass(ModulePass):
    """A pass that runs each site of a `day0::` op on hand-written kernels: every site that keeps
    the op's contract (`match`, passes/sites/) and the kernels' limits (`refuse`) is rewritten
    (`rewrite(site, fn)`) into a call of the private function `function_name(*key(site))`, one per
    distinct key, whose body (`function_text(*key)`) dispatches the kernel sets `kernel_sets(sites)`.

    A subclass is a frozen dataclass (its fields are the pass's options) that sets `op_names` and
    the callables below; module-level functions are given as staticmethods."""

    op_names: ClassVar[tuple[str, ...]] = ()
    kernels: ClassVar[tuple[KernelSet, ...]] = ()  # the kernel sets the functions dispatch
    match = refuse = function_name = function_text = rewrite = None

    def key(self, site) -> tuple:
        raise NotImplementedError

    def kernel_sets(self, sites: list) -> tuple[KernelSet, ...]:
        """The kernel sets these sites' functions dispatch (by default all of `kernels`)."""
        return self.kernels

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        sites = collect_sites(module_op, lambda op: operator_name(op) in self.op_names, self.match, diag, self.refuse)
        if not sites or diag.diagnostics:
            return
        executables = "".join(executable_source_text(k) for k in self.kernel_sets(sites))
        call_kernels(module_op, sites, self.key, self.function_name, self.function_text, self.rewrite, executables)
