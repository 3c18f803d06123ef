"""matmul-to-bf16-terms: an f32 matmul one of whose operands is a bf16 value widened to f32 runs
on bf16 tensor cores, as a sum of bf16 products accumulated in f32, at f32 accuracy.

The models compute in f32, and their weights are stored in bf16 and widened where they are used
(models/layers.py). IREE 3.13 compiles such an f32 matmul for sm_90 as a SIMT f32 kernel, many
times slower than bf16 products on `mma.sync` for a prefill chunk's projections and lm_head
(measured: docs/perf.md, "End to end: the 4.9B deepseek_v32 benchmark model"). The widened
operand is exact in bf16; the f32 operand x is split into bf16 terms,

    t0 = x rounded to bf16 (to nearest even, on the bits)   t1 = bf16(x - t0)   t2 = bf16(x - t0 - t1)

(each difference exact in f32), and x·w = Σ tj·w with every product exact in f32. Three terms
(the pass's default; cuda-sm90 runs two, lowering/targets.py) leave x - t0 - t1 - t2 below 2^-27 |x|: the result is as accurate as an f32
matmul's. Two terms leave 2^-18 |x| (3.5e-6 of the output's max on a 2048-long row): on the
random-weight 4.9B model that moved enough router and indexer near-ties to change greedy
tokens on 1.4% of a 4K prompt's rows against the f32 eager model (docs/perf.md). The rounding
is done on the bits, not with truncf/extf: IREE's CPU conversion of bf16 arithmetic folds an
f32→bf16→f32 round trip that lands in one dispatch (see dsa-to-gather-tiles).

Matched: `torch.aten.mm` and `torch.aten.bmm` with an f32 result of static shape whose two
output dims (rows M and columns N) are both at least `min-rows`, where an operand is, through
layout ops only (permute, view, reshape, slice, transpose, t, unsqueeze, squeeze, select,
expand), a bf16 → f32 conversion (prims.convert_element_type, aten.to.dtype, aten._to_copy).
The layout ops are rebuilt on the bf16 value and the matmul becomes, between torch_c
conversions, the split (one linalg.generic per term) and one linalg.matmul /
linalg.batch_matmul per term with bf16 inputs, accumulating into one f32 result. When both
operands are widened bf16, one product is exact. Matvecs (decode, M or N below min-rows) are
left alone: they are bound by the weight's bytes, which every further product reads again.
Nothing else changes; the pass reports no errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Module, Operation, Value, ir
from day0.passes.base import DiagnosticEngine, ModulePass, collect_ops
from day0.passes.torch_ir import TensorType, TorchBuilder, defining_op, replace_op

MATMULS = ("torch.aten.mm", "torch.aten.bmm")
WIDENS = ("torch.prims.convert_element_type", "torch.aten.to.dtype", "torch.aten._to_copy")
# ops that move or select values without changing them; operand 0 is the tensor
LAYOUT = (
    "torch.aten.permute",
    "torch.aten.view",
    "torch.aten.reshape",
    "torch.aten.slice.Tensor",
    "torch.aten.transpose.int",
    "torch.aten.t",
    "torch.aten.unsqueeze",
    "torch.aten.squeeze.dim",
    "torch.aten.select.int",
    "torch.aten.expand",
)


@dataclass(frozen=True)
class Widened:
    """An f32 operand that is the bf16 value `src`, widened by `widen`, then moved by `chain`
    (layout ops, innermost first)."""

    src: Value
    widen: Operation
    chain: list[Operation]


def widened_chain(v: Value) -> Widened | None:
    """How `v` is a widened bf16 value, or None."""
    chain: list[Operation] = []
    op = defining_op(v)
    while op is not None and op.name in LAYOUT:
        chain.append(op)
        op = defining_op(op.operands[0])
    if op is None or op.name not in WIDENS:
        return None
    src = TensorType.of(op.operands[0])
    out = TensorType.of(op.results[0])
    if src is None or out is None or src.dtype != "bf16" or out.dtype != "f32":
        return None
    return Widened(op.operands[0], op, chain[::-1])


def _shape(dims) -> str:
    return "x".join(str(d) for d in dims)


def _maps(rank: int) -> str:
    d = ", ".join(f"d{i}" for i in range(rank))
    m = f"affine_map<({d}) -> ({d})>"
    return f"[{m}, {m}]"


def _round(r: str, j: int) -> str:
    """Lines computing %h{j} = the f32 value `r` rounded to bf16 precision (to nearest even, on
    the bits; its low 16 bits are zero)."""
    return f"""
      %i{j} = arith.bitcast {r} : f32 to i32
      %s{j} = arith.shrui %i{j}, %c16 : i32
      %lsb{j} = arith.andi %s{j}, %one : i32
      %a{j} = arith.addi %i{j}, %half : i32
      %b{j} = arith.addi %a{j}, %lsb{j} : i32
      %m{j} = arith.andi %b{j}, %mask : i32
      %h{j} = arith.bitcast %m{j} : i32 to f32"""


def _split(name: str, src: str, dims, term: int) -> str:
    """`name` = bf16 term `term` (0-based) of the f32 tensor `src`: with r0 = x, term j is r_j
    rounded to bf16 and r_{j+1} = r_j - term j (exact in f32)."""
    rank, sh = len(dims), _shape(dims)
    lines = _round("%x", 0)
    for j in range(1, term + 1):
        lines += f"\n      %r{j} = arith.subf {'%x' if j == 1 else f'%r{j - 1}'}, %h{j - 1} : f32" + _round(f"%r{j}", j)
    iters = ", ".join(['"parallel"'] * rank)
    return f"""
  %{name}_e = tensor.empty() : tensor<{sh}xbf16>
  %{name} = linalg.generic {{indexing_maps = {_maps(rank)}, iterator_types = [{iters}]}} ins({src} : tensor<{sh}xf32>) outs(%{name}_e : tensor<{sh}xbf16>) {{
    ^bb0(%x: f32, %o: bf16):
      %c16 = arith.constant 16 : i32
      %one = arith.constant 1 : i32
      %half = arith.constant 32767 : i32
      %mask = arith.constant -65536 : i32{lines}
      %t = arith.truncf %h{term} : f32 to bf16
      linalg.yield %t : bf16
  }} -> tensor<{sh}xbf16>"""


@dataclass(frozen=True)
class _Site:
    op: Operation
    widened: tuple[Widened | None, Widened | None]  # per operand


def stacked_terms(src: str, dims, axis: int, terms: int, name: str = "xs", collapse: bool = True) -> list[str]:
    """Lines computing %<name>: the `terms` bf16 terms of the f32 tensor `src` stacked along `axis`
    (term j at [j·n, (j+1)·n) of it), in one linalg.generic: its domain has a terms dim before
    `axis` (linalg.index picks the term), and a collapse_shape merges the two (collapse=False:
    %<name> is the generic's result, the terms dim kept). One dispatch, where a generic per term
    and an insert_slice each took launches of their own."""
    rank = len(dims)
    dom = [f"d{i}" for i in range(rank + 1)]
    in_map = f"affine_map<({', '.join(dom)}) -> ({', '.join(d for i, d in enumerate(dom) if i != axis)})>"
    out_map = f"affine_map<({', '.join(dom)}) -> ({', '.join(dom)})>"
    dims3 = [*dims[:axis], terms, *dims[axis:]]
    big = list(dims)
    big[axis] *= terms
    body = _round("%x", 0)
    for j in range(1, terms):
        body += f"\n      %r{j} = arith.subf {'%x' if j == 1 else f'%r{j - 1}'}, %h{j - 1} : f32" + _round(f"%r{j}", j)
    body += "".join(f"\n      %tb{j} = arith.truncf %h{j} : f32 to bf16" for j in range(terms))
    body += f"\n      %ti = linalg.index {axis} : index"
    pick = f"%tb{terms - 1}"
    for j in range(terms - 2, -1, -1):
        body += (
            f"\n      %ci{j} = arith.constant {j} : index"
            f"\n      %eq{j} = arith.cmpi eq, %ti, %ci{j} : index"
            f"\n      %pk{j} = arith.select %eq{j}, %tb{j}, {pick} : bf16"
        )
        pick = f"%pk{j}"
    groups = [[i] for i in range(axis)] + [[axis, axis + 1]] + [[i] for i in range(axis + 2, rank + 1)]
    reassoc = "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"
    iters = ", ".join(['"parallel"'] * (rank + 1))
    full = name if not collapse else f"{name}3"
    lines = [
        f"  %{full}_e = tensor.empty() : tensor<{_shape(dims3)}xbf16>",
        f"  %{full} = linalg.generic {{indexing_maps = [{in_map}, {out_map}], iterator_types = [{iters}]}} "
        f"ins({src} : tensor<{_shape(dims)}xf32>) outs(%{full}_e : tensor<{_shape(dims3)}xbf16>) {{\n"
        "    ^bb0(%x: f32, %o: bf16):\n"
        "      %c16 = arith.constant 16 : i32\n"
        "      %one = arith.constant 1 : i32\n"
        "      %half = arith.constant 32767 : i32\n"
        f"      %mask = arith.constant -65536 : i32{body}\n"
        f"      linalg.yield {pick} : bf16\n"
        f"  }} -> tensor<{_shape(dims3)}xbf16>",
    ]
    if collapse:
        lines.append(
            f"  %{name} = tensor.collapse_shape %{full} {reassoc} : tensor<{_shape(dims3)}xbf16> into tensor<{_shape(big)}xbf16>"
        )
    return lines


def _stacked(f32_side: int, src: str, dims, out_dims, terms: int, other: str, kind: str) -> list[str]:
    """Lines computing %r from the terms of the f32 operand `src` stacked along its free axis (rows
    of a, columns of b; stacked_terms): one product reading the widened operand once, then the
    sum of its `terms` slices."""
    axis = len(dims) - 2 + f32_side  # the free axis, of the same size and place in the output
    n = dims[axis]
    big, big_out = list(dims), list(out_dims)
    big[axis] = big_out[axis] = n * terms
    xs_t, ys_t, out_b = (
        f"tensor<{_shape(big)}xbf16>",
        f"tensor<{_shape(big_out)}xf32>",
        f"tensor<{_shape(out_dims)}xf32>",
    )
    ones = ", ".join(["1"] * len(dims))

    def offsets(j: int) -> str:
        return ", ".join(str(j * n) if i == axis else "0" for i in range(len(dims)))

    lines = stacked_terms(src, dims, axis, terms)
    prev = "%xs"
    pair = f"{prev}, %bb : {xs_t}, {other}" if f32_side == 0 else f"%ab, {prev} : {other}, {xs_t}"
    lines += [
        f"  %ys_e = tensor.empty() : {ys_t}",
        f"  %ys0 = linalg.fill ins(%zero : f32) outs(%ys_e : {ys_t}) -> {ys_t}",
        f"  %ys = {kind} ins({pair}) outs(%ys0 : {ys_t}) -> {ys_t}",
    ]
    for j in range(terms):
        lines.append(
            f"  %p{j} = tensor.extract_slice %ys[{offsets(j)}] [{', '.join(map(str, out_dims))}] "
            f"[{ones}] : {ys_t} to {out_b}"
        )
    rank = len(out_dims)
    d = ", ".join(f"d{i}" for i in range(rank))
    ident = f"affine_map<({d}) -> ({d})>"
    maps = ", ".join([ident] * (terms + 1))
    iters = ", ".join(['"parallel"'] * rank)
    args = ", ".join(f"%v{j}: f32" for j in range(terms))
    total = "%v0"
    adds = []
    for j in range(1, terms):
        adds.append(f"      %sum{j} = arith.addf {total}, %v{j} : f32")
        total = f"%sum{j}"
    lines.append(
        f"  %r = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{iters}]}} "
        f"ins({', '.join(f'%p{j}' for j in range(terms))} : {', '.join([out_b] * terms)}) outs(%acc : {out_b}) {{\n"
        f"    ^bb0({args}, %o: f32):\n" + "\n".join(adds) + f"\n      linalg.yield {total} : f32\n  }} -> {out_b}"
    )
    return lines


def _template(site: _Site, terms: int, stack: bool = False) -> str:
    """A function (a, b) -> result of torch types, a and b as the matmul takes them but with the
    widened operands in bf16; its body replaces the matmul. stack: the terms as one product
    (_stacked), else one product per term accumulating into one result."""
    a_t, b_t = (TensorType.of(v) for v in site.op.operands)
    out = TensorType.of(site.op.results[0])
    types = [TensorType(t.dims, "bf16" if w else "f32") for t, w in zip((a_t, b_t), site.widened)]
    torch_t = [f"!torch.vtensor<[{','.join(map(str, t.dims))}],{t.dtype}>" for t in types]
    out_torch = f"!torch.vtensor<[{','.join(map(str, out.dims))}],f32>"
    builtin = [f"tensor<{_shape(t.dims)}x{t.dtype}>" for t in types]
    bf = [f"tensor<{_shape(t.dims)}xbf16>" for t in types]  # the matmuls' operand types
    out_b = f"tensor<{_shape(out.dims)}xf32>"
    kind = "linalg.matmul" if len(out.dims) == 2 else "linalg.batch_matmul"
    body = [
        f"  %ab = torch_c.to_builtin_tensor %a : {torch_t[0]} -> {builtin[0]}",
        f"  %bb = torch_c.to_builtin_tensor %b : {torch_t[1]} -> {builtin[1]}",
        "  %zero = arith.constant 0.000000e+00 : f32",
        f"  %acc_e = tensor.empty() : {out_b}",
        f"  %acc = linalg.fill ins(%zero : f32) outs(%acc_e : {out_b}) -> {out_b}",
    ]
    if all(site.widened):
        body.append(f"  %r = {kind} ins(%ab, %bb : {bf[0]}, {bf[1]}) outs(%acc : {out_b}) -> {out_b}")
    else:
        f32_side = 0 if site.widened[0] is None else 1
        src, dims = ("%ab", a_t.dims) if f32_side == 0 else ("%bb", b_t.dims)
        if stack:
            body += _stacked(f32_side, src, dims, out.dims, terms, bf[1 - f32_side], kind)
        else:
            body += [_split(f"x{j}", src, dims, j) for j in range(terms)]
            pair = (lambda t: f"%{t}, %bb") if f32_side == 0 else (lambda t: f"%ab, %{t}")
            acc = "%acc"
            for j in range(terms):
                r = "%r" if j == terms - 1 else f"%y{j}"
                body.append(f"  {r} = {kind} ins({pair(f'x{j}')} : {bf[0]}, {bf[1]}) outs({acc} : {out_b}) -> {out_b}")
                acc = r
    body.append(f"  %y = torch_c.from_builtin_tensor %r : {out_b} -> {out_torch}")
    return (
        f"func.func @t(%a: {torch_t[0]}, %b: {torch_t[1]}) -> {out_torch} {{\n"
        + "\n".join(body)
        + f"\n  return %y : {out_torch}\n}}"
    )


def _free_dim(site: _Site) -> int | None:
    """The f32 operand's free dim (rows of a, columns of b); None when both operands are widened."""
    if all(site.widened):
        return None
    side = 0 if site.widened[0] is None else 1
    dims = TensorType.of(site.op.operands[side]).dims
    return dims[len(dims) - 2 + side]


def _rebuild(b: TorchBuilder, src: Value, chain: list[Operation]) -> Value:
    """The layout ops of `chain` applied to the bf16 value `src`."""
    v = src
    for op in chain:
        dims = TensorType.of(op.results[0]).dims
        v = b.op(op.name, [v, *list(op.operands)[1:]], TensorType(dims, "bf16"))
    return v


def _rewrite(site: _Site, terms: int, stack: bool) -> None:
    op = site.op
    b = TorchBuilder(op)
    args = [op.operands[i] if w is None else _rebuild(b, w.src, w.chain) for i, w in enumerate(site.widened)]
    template = Module.parse(_template(site, terms, stack), op.context)
    block = template.body.operations[0].regions[0].blocks[0]
    for arg, real in zip(block.arguments, args):
        arg.replace_all_uses_with(real)
    ops = list(block.operations)
    for inner in ops[:-1]:
        inner.move_before(op)
    replace_op(op, [ops[-1].operands[0]])


def _erase_dead(ops: list[Operation]) -> None:
    """Erase the ops of the old f32 chains that nothing reads any more (outermost first)."""
    changed = True
    while changed:
        changed = False
        for op in list(ops):
            if all(not list(r.uses) for r in op.results):
                ops.remove(op)
                op.erase()
                changed = True


# The vision tower's entry points (runtime/artifact.py IMAGE_ENCODER: encode_image_<P>), whose
# matmuls take `image-terms`.
IMAGE_FUNCTIONS = "encode_image"


def enclosing_function(op: Operation) -> str:
    """The symbol name of the func.func holding `op` ('' at module level)."""
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        parent = parent.parent
    return "" if parent is None else ir.StringAttr(parent.attributes["sym_name"]).value


@dataclass(frozen=True)
class MatmulToBf16Terms(ModulePass):
    """Options:
    min-rows  rewrite only matmuls whose output rows M and columns N are both static and at least
              this (default 64): matvecs stay f32 (bound by the widened operand's bytes).
    terms     bf16 terms the f32 operand is split into: 3 (default; x - terms < 2^-27 |x|, as
              exact as an f32 product), 2 (< 2^-18 |x|; one product less) or 1 (x rounded to
              bf16: a bf16 product with f32 accumulation, as a bf16 model computes).
    image-terms  terms for the matmuls of the vision tower's functions (`encode_image_<P>`);
              0 (default): `terms`. cuda-sm90 runs the tower at one term (lowering/targets.py).
    stack-rows  when the f32 operand's free dim (rows of a, columns of b) times `terms` is at most
              this (default 256: a batched decode step's 64 rows, not a 512-token prefill chunk),
              the terms are stacked along it into one product that reads the widened operand
              once, and the product's slices are summed. IREE 3.13's bf16 matmul on sm_90 took
              about as long for 64 rows as for 512 (a grid of few workgroups; docs/perf.md,
              "The Engine at real size on the H200"), so three products of 64 rows cost three
              times one of 192.
    """

    name = "matmul-to-bf16-terms"
    option_minimums = {"min_rows": 1, "stack_rows": 0}
    min_rows: int = 64
    terms: int = 3
    image_terms: int = 0
    stack_rows: int = 256

    def __post_init__(self):
        if self.terms not in (1, 2, 3):
            raise ValueError(f"terms must be 1, 2 or 3, got {self.terms}")
        if self.image_terms not in (0, 1, 2, 3):
            raise ValueError(f"image-terms must be 0 (terms), 1, 2 or 3, got {self.image_terms}")
        super().__post_init__()

    def terms_at(self, op: Operation) -> int:
        """The terms for the matmul `op`: image-terms inside the tower's functions."""
        if self.image_terms and enclosing_function(op).startswith(IMAGE_FUNCTIONS):
            return self.image_terms
        return self.terms

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        sites = []
        for op in collect_ops(module_op, lambda o: o.name in MATMULS):
            types = [TensorType.of(v) for v in (*op.operands, op.results[0])]
            if any(t is None or t.dtype != "f32" or None in t.dims for t in types):
                continue
            if min(types[-1].dims[-2:]) < self.min_rows:
                continue
            widened = tuple(widened_chain(v) for v in op.operands)
            if any(widened):
                sites.append(_Site(op, widened))
        dead: list[Operation] = []
        for site in sites:
            for w in filter(None, site.widened):
                dead += [o for o in [*reversed(w.chain), w.widen] if o not in dead]
            free = _free_dim(site)
            terms = self.terms_at(site.op)
            with site.op.location:
                _rewrite(site, terms, free is not None and free * terms <= self.stack_rows)
        _erase_dead(dead)
