"""topk-to-radix-select: rewrite `torch.aten.topk` over float32 rows into day0's CUDA radix select.

IREE 3.13 has no usable GPU top-k: `iree_linalg_ext.topk` runs one thread per row (far slower than
PyTorch's: docs/perf.md, "GPU: the H200") and returned wrong indices on masked rows. This pass
replaces each topk with a call to a private function that runs the hand-written kernels of
`lowering/kernels/topk_select.cu` as IREE external dispatches (`flow.dispatch` of a
`hal.executable.source` holding the PTX):

    total0       = linalg.fill(0) : tensor<?x2048xi32>
    cum, total   = flow.dispatch @hist[T, G](n, G, x, total0)       -> (cum, total0 tied)
    hdr, i0, v0, cand = flow.dispatch @collect[T, G](n, G, k, x, total, cum)
    i, v         = flow.dispatch @finish[T](n, k, x, hdr, cand, i0, v0) -> (i0, v0 tied)

with G = ceil(n / 8192) segments per row: a 2048-bin histogram of the top 11 key bits, the
threshold bin, an ordered compaction, then a radix select of the threshold bin's candidates on
the remaining 21 bits. Every step reads the row once; a decode row of 1M scores spreads over 128
CTAs. Rows of at most TOPK_ONE_CTA_ROW (16384: routers, the indexer's rows up to that context),
static or bounded by `row-bound`, take one kernel instead, `day0_topk_small`: one CTA a row runs
the three radix passes and the ordered output, with the row's keys in shared memory up to 8192.
One launch instead of four (a fill and three dispatches) in every decode step's indexer.

The selection is torch.topk's set with ties broken toward the lower position (the same rule as
topk-to-linalg-ext, llvm-cpu's lowering); NaN ranks above +inf, -0.0 equals +0.0. A row shorter than k
fills its missing slots with (INT32_MAX, -inf), as topk-to-linalg-ext does.

Precondition: every `torch.aten.topk` over rows of at least `min-size` keeps the contract of
passes/sites/topk.py (constant k, dim = last, ...) with largest = true and sorted = false (the
result comes in a deterministic order that is not sorted by value), over an f32 input of any rank
(leading dims are rows). Anything else is an error. Afterwards no such `torch.aten.topk` is left;
the module holds one `hal.executable.source @day0_topk_select`, one private function per (k, form)
and one wrapper per input type. The kernels' ABI and grids: lowering/kernel_geometry.py, section
topk_select.cu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from day0.frontend.ir import Operation, Value, ir
from day0.lowering import kernel_geometry as kg
from day0.passes.base import DiagnosticEngine, ModulePass, collect_sites
from day0.passes.extern_dispatch import append_parsed, executable_source_text, tensor_text
from day0.passes.sites.contract import Broken, report
from day0.passes.sites.topk import OP_NAME, TopkSite, static_row_length, topk_site
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE = kg.TOPK_SELECT.executable


def select_function_name(k: int, small: bool = False) -> str:
    return f"day0_topk_{'small' if small else 'radix'}_k{k}"


def small_function_text(k: int) -> str:
    """func @day0_topk_small_k<k>(x: tensor<?x?xf32>) -> (values, indices): one launch, one CTA a
    row holding the row in shared memory (rows of at most TOPK_SMALL_ROW)."""
    return f"""
  func.func private @{select_function_name(k, True)}(%x: tensor<?x?xf32>) -> (tensor<?x{k}xf32>, tensor<?x{k}xi32>) {{
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %t = tensor.dim %x, %c0 : tensor<?x?xf32>
    %n = tensor.dim %x, %c1 : tensor<?x?xf32>
    %n32 = arith.index_cast %n : index to i32
    %k32 = arith.constant {k} : i32
    %idx, %val = flow.dispatch @{EXECUTABLE}::@day0_topk_small[%t](%n32, %k32, %x)
        : (i32, i32, tensor<?x?xf32>{{%t, %n}}) -> (tensor<?x{k}xi32>{{%t}}, tensor<?x{k}xf32>{{%t}})
    return %val, %idx : tensor<?x{k}xf32>, tensor<?x{k}xi32>
  }}"""


def select_function_text(k: int) -> str:
    """func @day0_topk_radix_k<k>(x: tensor<?x?xf32>) -> (values ?xk f32, indices ?xk i32)."""
    e = f"@{EXECUTABLE}"
    return f"""
  func.func private @{select_function_name(k)}(%x: tensor<?x?xf32>) -> (tensor<?x{k}xf32>, tensor<?x{k}xi32>) {{
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %t = tensor.dim %x, %c0 : tensor<?x?xf32>
    %n = tensor.dim %x, %c1 : tensor<?x?xf32>
    %seg = arith.constant {kg.TOPK_SEGMENT} : index
    %g = arith.ceildivui %n, %seg : index
    %n32 = arith.index_cast %n : index to i32
    %g32 = arith.index_cast %g : index to i32
    %k32 = arith.constant {k} : i32
    %zero = arith.constant 0 : i32
    %empty = tensor.empty(%t) : tensor<?x{kg.TOPK_BINS}xi32>
    %total0 = linalg.fill ins(%zero : i32) outs(%empty : tensor<?x{kg.TOPK_BINS}xi32>) -> tensor<?x{kg.TOPK_BINS}xi32>
    %cum, %total = flow.dispatch {e}::@day0_topk_hist[%t, %g](%n32, %g32, %x, %total0)
        : (i32, i32, tensor<?x?xf32>{{%t, %n}}, tensor<?x{kg.TOPK_BINS}xi32>{{%t}})
        -> (tensor<?x?x{kg.TOPK_BINS}xi32>{{%t, %g}}, %total0{{%t}})
    %hdr, %idx0, %val0, %cand = flow.dispatch {e}::@day0_topk_collect[%t, %g](%n32, %g32, %k32, %x, %total, %cum)
        : (i32, i32, i32, tensor<?x?xf32>{{%t, %n}}, tensor<?x{kg.TOPK_BINS}xi32>{{%t}}, tensor<?x?x{kg.TOPK_BINS}xi32>{{%t, %g}})
        -> (tensor<?x4xi32>{{%t}}, tensor<?x{k}xi32>{{%t}}, tensor<?x{k}xf32>{{%t}}, tensor<?x?xi32>{{%t, %n}})
    %idx, %val = flow.dispatch {e}::@day0_topk_finish[%t](%n32, %k32, %x, %hdr, %cand, %idx0, %val0)
        : (i32, i32, tensor<?x?xf32>{{%t, %n}}, tensor<?x4xi32>{{%t}}, tensor<?x?xi32>{{%t, %n}}, tensor<?x{k}xi32>{{%t}}, tensor<?x{k}xf32>{{%t}})
        -> (%idx0{{%t}}, %val0{{%t}})
    return %val, %idx : tensor<?x{k}xf32>, tensor<?x{k}xi32>
  }}"""


def _radix_site(op: Operation) -> TopkSite:
    """The site of a topk that keeps the contract and that the radix select takes (f32 rows,
    largest, unsorted), or Broken."""
    x_v = op.operands[0]
    x = TensorType.of(x_v)
    if x is None or x.dtype != "f32" or not x.dims:
        raise Broken(f"the CUDA radix select takes an f32 !torch.vtensor of rank >= 1, got {x_v.type}")
    site = topk_site(op)
    if not site.largest:
        raise Broken("only largest=true is supported")
    if site.sorted:
        raise Broken(
            "sorted=true is not supported: the radix select returns the selection in position order, "
            "not by value (export the topk with sorted=False)"
        )
    return site


def wrapper_name(dims: tuple[int | None, ...], k: int) -> str:
    return f"{select_function_name(k)}_" + "x".join("q" if d is None else str(d) for d in dims)


def wrapper_text(dims: tuple[int | None, ...], k: int, row_bound: int = 0) -> str:
    """A private function over the site's own tensor type: rows of any rank become the [?, ?] rows
    of select_function_text (expand a rank-1 row, collapse leading dims), and back."""
    rank, n, lead = len(dims), dims[-1], dims[:-1]
    rows = 1 if rank == 1 else (None if None in lead else math.prod(lead))
    x_t, flat_t = tensor_text(dims, "f32"), tensor_text((rows, n), "f32")
    group = ", ".join(str(i) for i in range(max(rank - 1, 1)))
    lines = [
        f"  func.func private @{wrapper_name(dims, k)}(%x: {x_t}) -> "
        f"({tensor_text((*lead, k), 'f32')}, {tensor_text((*lead, k), 'i32')}) {{"
    ]

    sizes = []  # the output's leading dims: SSA values where dynamic
    for i, d in enumerate(dims):
        if d is None and (i < rank - 1 or rank == 1):  # leading dims, or a rank-1 row's length
            lines += [f"    %c{i} = arith.constant {i} : index", f"    %d{i} = tensor.dim %x, %c{i} : {x_t}"]
        if i < rank - 1:
            sizes.append(f"%d{i}" if d is None else str(d))
    if rank == 1:  # one row
        n_text = "%d0" if n is None else str(n)
        lines.append(f"    %flat = tensor.expand_shape %x [[0, 1]] output_shape [1, {n_text}] : {x_t} into {flat_t}")
    elif rank > 2:  # leading dims become rows
        lines.append(f"    %flat = tensor.collapse_shape %x [[{group}], [{rank - 1}]] : {x_t} into {flat_t}")
    src = "x" if rank == 2 else "flat"
    if flat_t != "tensor<?x?xf32>":
        lines.append(f"    %xd = tensor.cast %{src} : {flat_t} to tensor<?x?xf32>")
        src = "xd"
    select = select_function_name(k, kg.topk_is_small(n, row_bound))
    lines.append(
        f"    %v, %i = func.call @{select}(%{src}) : (tensor<?x?xf32>) -> (tensor<?x{k}xf32>, tensor<?x{k}xi32>)"
    )
    results = []
    for name, elem in (("v", "f32"), ("i", "i32")):
        got_t, flat_out, out_t = f"tensor<?x{k}x{elem}>", tensor_text((rows, k), elem), tensor_text((*lead, k), elem)
        value = name
        if flat_out != got_t:
            lines.append(f"    %{name}f = tensor.cast %{name} : {got_t} to {flat_out}")
            value = f"{name}f"
        if rank == 1:
            lines.append(f"    %{name}r = tensor.collapse_shape %{value} [[0, 1]] : {flat_out} into {out_t}")
            value = f"{name}r"
        elif rank > 2:
            lines.append(
                f"    %{name}r = tensor.expand_shape %{value} [[{group}], [{rank - 1}]] output_shape "
                f"[{', '.join(sizes)}, {k}] : {flat_out} into {out_t}"
            )
            value = f"{name}r"
        results.append(f"%{value}")
    lines.append(
        f"    return {', '.join(results)} : {tensor_text((*lead, k), 'f32')}, {tensor_text((*lead, k), 'i32')}"
    )
    lines.append("  }")
    return "\n" + "\n".join(lines)


def _rewrite(site: TopkSite) -> list[Value]:
    """The call of the site's wrapper, before the op; returns the torch (values, indices)."""
    b = TorchBuilder(site.op)
    out = (*site.dims[:-1], site.k)
    xb = b.op("torch_c.to_builtin_tensor", [site.x], tensor_text(site.dims, "f32"))
    fn = ir.FlatSymbolRefAttr.get(wrapper_name(site.dims, site.k))
    vals, idx = b.op_results("func.call", [xb], [tensor_text(out, "f32"), tensor_text(out, "i32")], {"callee": fn})
    values = b.op("torch_c.from_builtin_tensor", [vals], TensorType(out, "f32"))
    idx32 = b.op("torch_c.from_builtin_tensor", [idx], TensorType(out, "si32"))
    indices = b.to_dtype(idx32, TensorType(out, "si64"))
    return [values, indices]


@dataclass(frozen=True)
class TopkToRadixSelect(ModulePass):
    """Options:
    min-size  rewrite only topk's whose static row length is >= min-size (default 0: all); a
              dynamic row length counts as long enough. Shorter rows are left to a later pass
              (topk-to-linalg-ext). The cuda-sm90 pipeline keeps 0: IREE's CUDA lowering of
              iree_linalg_ext.topk returned out-of-range indices on the MoE routers' -inf-masked
              rows (lowering/targets.py), and short rows take the one-kernel form here.
    row-bound the longest a dynamic row can be (the driver's max_seq_len plus the indexer's k
              padding columns; 0, the default: unknown). Only the choice of form depends on it:
              the one-CTA kernel is exact at any length, only slower than the segmented one on
              long rows.
    """

    name = "topk-to-radix-select"
    option_minimums = {"min_size": 0, "row_bound": 0}
    min_size: int = 0
    row_bound: int = 0

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        def long_enough(op) -> bool:  # a topk over rows of at least min-size (or of dynamic length)
            if op.name != OP_NAME:
                return False
            n = static_row_length(op)
            return n is None or n >= self.min_size

        sites = collect_sites(module_op, long_enough, lambda op, d: report(op, d, "topk", _radix_site), diag)
        if not sites or diag.diagnostics:
            return
        for site in sites:
            with site.op.location:
                replace_op(site.op, _rewrite(site))
        text = executable_source_text(kg.TOPK_SELECT)
        # (k, one-kernel form) pairs in use
        forms = {(s.k, kg.topk_is_small(s.dims[-1], self.row_bound)) for s in sites}
        text += "".join(small_function_text(k) if small else select_function_text(k) for k, small in sorted(forms))
        wrappers = {wrapper_name(s.dims, s.k): (s.dims, s.k) for s in sites}
        text += "".join(wrapper_text(*wrappers[name], self.row_bound) for name in sorted(wrappers))
        append_parsed(module_op, text)
