"""hoist-parameter-stacks: compute each stack of checkpoint tensors once, in one module global.

Why: MoE models stack per-expert parameters inside the traced functions, e.g.
    stack(cat(gate_0, up_0), ..., cat(gate_E-1, up_E-1))   # [E, 2N, K/2] u8, from E·2 parameters
IREE's const-expr hoisting turns such an expression into an initializer-computed global, but
once per function that contains it: with @prefill and @decode every stacked expert tensor was
resident twice (16 `__hoisted_tensor` globals for 8 distinct stacks). This pass hoists each
distinct expression itself, so it exists once whatever the number of functions.

Precondition: parameters-to-globals has run, so a parameter reads
    %w = torch_c.from_builtin_tensor (util.global.load @g)    @g = #flow.parameter.named<...>
A parameter stack is a value built only from such parameters by
    torch.aten.cat / torch.aten.stack  (torch.prim.ListConstruct list, torch.constant.int dim)
    torch.aten.view / torch.aten.unsqueeze  (static result type: a reshape)
all with static shapes. (torch.export decomposes `stack` into cat + view, which is what the MoE
models produce.) Each maximal stack with at least `min-operands` parameter reads is rewritten:
    stack(params...) -> torch_c.from_builtin_tensor (util.global.load @stacked)
and each DISTINCT stack (same ops, dims, parameters and types) gets one global, stored once by
an initializer on builtin tensors, placed ahead of the first function:
    util.global private @model.layers.1.mlp.experts.all.gate_proj_up_proj.weight_packed : tensor<E x 2N x K/2 x i8>
    util.initializer {
      cat(a, b, dim d)   -> tensor.empty + tensor.insert_slice of each part at its offset along d
      stack(a, b, dim d) -> tensor.empty + tensor.insert_slice of each part at index i of d
      view / unsqueeze   -> tensor.collapse_shape to 1-D + tensor.expand_shape to the result
      util.global.store, util.return
    }
Stacks that read any non-parameter value are left alone. A stack also used on its own inside a
larger stack is hoisted twice (as itself and inside the larger one); the models do not do this.
The pass emits no diagnostics: what does not match is not a parameter stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

from day0.frontend.ir import FlatSymbolRefAttr, InsertionPoint, Operation, StringAttr, Type, Value, ir
from day0.passes.base import DiagnosticEngine, ModulePass, unique_symbol
from day0.passes.parameters_to_globals import builtin_tensor_type
from day0.passes.torch_ir import defining_op, torch_constant

_CAT, _STACK = "torch.aten.cat", "torch.aten.stack"
_RESHAPES = ("torch.aten.view", "torch.aten.unsqueeze")
_LIST, _INT = "torch.prim.ListConstruct", "torch.constant.int"
# Ops a rewritten stack leaves dead, erased when they have no uses left (marked with _DEAD).
_DEAD = "day0.hoist_parameter_stacks.dead"
_PURE = {_CAT, _STACK, *_RESHAPES, _LIST, _INT, "torch_c.from_builtin_tensor", "util.global.load"}


# ---------------------------------------------------------------------------------------------
# the expression: also the canonical key of a stack (frozen dataclasses: equal <=> same stack)


@dataclass(frozen=True)
class _Param:
    symbol: str
    type: str  # builtin tensor type, e.g. tensor<512x512xi8>


@dataclass(frozen=True)
class _Join:
    """cat (parts joined along `dim`) or stack (parts placed at index i of a new `dim`)."""

    kind: str  # _CAT or _STACK
    dim: int  # normalized to 0 <= dim < rank of the result
    parts: tuple
    type: str


@dataclass(frozen=True)
class _Reshape:
    source: object
    type: str


def _shape(type_text: str) -> list[int]:
    return list(ir.RankedTensorType(Type.parse(type_text)).shape)


def _leaves(e) -> list[_Param]:
    if isinstance(e, _Param):
        return [e]
    if isinstance(e, _Join):
        return [p for part in e.parts for p in _leaves(part)]
    return _leaves(e.source)


def _data(e):
    """The stack without its final reshapes: what the global holds."""
    while isinstance(e, _Reshape):
        e = e.source
    return e


class _Matcher:
    """Which values are parameter stacks; memoized per defining op."""

    def __init__(self, params: set[str]):
        self.params = params
        self.memo: dict[Operation, object | None] = {}

    def expr(self, value: Value):
        op = defining_op(value)
        if op is None:
            return None
        if op not in self.memo:
            self.memo[op] = self._match(op)
        return self.memo[op]

    def _match(self, op: Operation):
        if len(op.results) != 1:
            return None
        rtype = builtin_tensor_type(str(op.result.type))
        if rtype is None:  # not a static-shaped vtensor
            return None
        if op.name == "torch_c.from_builtin_tensor":
            load = defining_op(op.operands[0])
            if load is None or load.name != "util.global.load":
                return None
            symbol = FlatSymbolRefAttr(load.attributes["global"]).value
            return _Param(symbol, str(op.operands[0].type)) if symbol in self.params else None
        rank = len(_shape(rtype))
        if op.name in (_CAT, _STACK):
            lst, dim = defining_op(op.operands[0]), torch_constant(op.operands[1], _INT)
            if lst is None or lst.name != _LIST or dim is None or not -rank <= dim < rank:
                return None
            parts = tuple(self.expr(v) for v in lst.operands)
            if not parts or any(p is None for p in parts):
                return None
            return _Join(op.name, dim % rank, parts, rtype)
        if op.name in _RESHAPES:
            source = self.expr(op.operands[0])
            if source is None or rank == 0 or not _shape(source.type):
                return None
            if prod(_shape(source.type)) != prod(_shape(rtype)):
                return None
            return _Reshape(source, rtype)
        return None


# ---------------------------------------------------------------------------------------------
# the initializer


class _InitBuilder:
    """Emits builtin tensor ops computing an expression into one util.initializer block."""

    def __init__(self, ip: InsertionPoint, loc: ir.Location):
        self.ip, self.loc = ip, loc
        self.memo: dict[object, Value] = {}

    def create(self, name, result: str | None, operands, attrs=None) -> Operation:
        return Operation.create(
            name,
            results=[Type.parse(result)] if result else [],
            operands=operands,
            attributes=attrs or {},
            loc=self.loc,
            ip=self.ip,
        )

    def value(self, e) -> Value:
        if e not in self.memo:
            self.memo[e] = self._build(e)
        return self.memo[e]

    def _build(self, e) -> Value:
        if isinstance(e, _Param):
            return self.create("util.global.load", e.type, [], {"global": FlatSymbolRefAttr.get(e.symbol)}).result
        if isinstance(e, _Join):  # every parameter goes straight to its place in one tensor
            rank = len(_shape(e.type))
            return self._place(e, self.create("tensor.empty", e.type, []).result, [0] * rank, list(range(rank)))
        return self.reshape(self.value(e.source), e.source.type, e.type)

    def reshape(self, x: Value, src_type: str, dst_type: str) -> Value:
        """reshape(x) -> expand_shape(collapse_shape(x) to 1-D): row-major order is kept."""
        src, dst = _shape(src_type), _shape(dst_type)
        if src == dst:
            return x
        flat = re.sub(r"<.*x(\w+)>$", lambda m: f"<{prod(dst)}x{m.group(1)}>", dst_type)
        if len(src) > 1:
            x = self.create("tensor.collapse_shape", flat, [x], {"reassociation": _reassociation(len(src))}).result
        if len(dst) > 1:
            x = self.create(
                "tensor.expand_shape",
                dst_type,
                [x],
                {
                    "reassociation": _reassociation(len(dst)),
                    "static_output_shape": ir.DenseI64ArrayAttr.get(dst),
                },
            ).result
        return x

    def _place(self, e, acc: Value, offsets: list[int], dims: list[int]) -> Value:
        """Insert `e` into `acc` at `offsets`; e's dim j is acc's dim dims[j], the other dims of
        acc are unit (a stack's new dim)."""
        if not isinstance(e, _Join):
            sizes = [1] * len(offsets)
            for j, n in enumerate(_shape(e.type)):
                sizes[dims[j]] = n
            # acc[offsets : offsets + sizes] = e
            return self.create(
                "tensor.insert_slice",
                str(acc.type),
                [self.value(e), acc],
                {
                    "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1, 0, 0, 0]),
                    "static_offsets": ir.DenseI64ArrayAttr.get(offsets),
                    "static_sizes": ir.DenseI64ArrayAttr.get(sizes),
                    "static_strides": ir.DenseI64ArrayAttr.get([1] * len(offsets)),
                },
            ).result
        d = dims[e.dim]
        part_dims = dims if e.kind == _CAT else dims[: e.dim] + dims[e.dim + 1 :]
        at = list(offsets)
        for part in e.parts:
            # cat: part i starts where part i-1 ended along d; stack: part i is index i of d
            acc = self._place(part, acc, at, part_dims)
            at = list(at)
            at[d] += _shape(part.type)[e.dim] if e.kind == _CAT else 1
        return acc


def _reassociation(rank: int) -> ir.Attribute:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, i) for i in range(rank)])])


def _stack_name(e, taken: set[str]) -> str:
    """A readable unused symbol: the parameters' dotted names, with the components that differ
    joined (`gate_proj_up_proj`) or, when they are all numbers (expert indices), `all`."""
    names = [p.symbol.split(".") for p in _leaves(e)]
    if len({len(n) for n in names}) == 1:
        parts = []
        for column in zip(*names):
            values = list(dict.fromkeys(column))
            parts.append(
                values[0] if len(values) == 1 else "all" if all(v.isdigit() for v in values) else "_".join(values)
            )
        base = ".".join(parts)
    else:
        base = "stacked." + names[0][0]
    return unique_symbol(base, taken)


# ---------------------------------------------------------------------------------------------
# the pass


@dataclass(frozen=True)
class HoistParameterStacks(ModulePass):
    """Options:
    min-operands  hoist only stacks that read at least this many parameters (default 2); a
                  single reshaped parameter costs no memory and stays where it is.
    """

    name = "hoist-parameter-stacks"
    option_minimums = {"min_operands": 1}
    min_operands: int = 2

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        body = module_op.regions[0].blocks[0]
        top = [op.operation for op in body.operations]  # (an OpView's .name may be its symbol)
        params = {
            StringAttr(op.attributes["sym_name"]).value
            for op in top
            if op.name == "util.global"
            and "initial_value" in op.attributes
            and str(op.attributes["initial_value"]).startswith("#flow.parameter.named")
        }
        funcs = [op for op in top if op.name == "func.func"]
        if not params or not funcs:
            return
        roots: list[tuple[Operation, object]] = []  # (op, its stack), every function, in order
        for func in funcs:
            roots += self._roots(func, _Matcher(params))
        if not roots:
            return

        taken = {StringAttr(op.attributes["sym_name"]).value for op in top if "sym_name" in op.attributes}
        symbols: dict[object, str] = {}  # data (a stack without its final reshapes) -> global
        anchor = InsertionPoint(funcs[0])  # after the parameter globals, ahead of the functions
        for op, e in roots:
            if (data := _data(e)) not in symbols:
                symbols[data] = _stack_name(data, taken)
                _emit_global(symbols[data], data, op.location, anchor)
        for op, _ in roots:
            _mark_tree(op)
        for op, e in roots:
            # stack(params...) -> from_builtin_tensor(global.load @stacked), reshaped in place:
            # a view of the stack in one function and the bare stack in another share one global
            data = _data(e)
            b = _InitBuilder(InsertionPoint(op), op.location)
            load = b.create("util.global.load", data.type, [], {"global": FlatSymbolRefAttr.get(symbols[data])})
            x = b.reshape(load.result, data.type, e.type)
            value = b.create("torch_c.from_builtin_tensor", str(op.result.type), [x])
            op.result.replace_all_uses_with(value.result)
        _erase_dead(funcs)

    def _roots(self, func: Operation, m: _Matcher) -> list[tuple[Operation, object]]:
        """The maximal stacks in `func`: stack ops used by anything but a larger stack."""
        stacks: list[tuple[Operation, object]] = []

        def collect(op):
            op = op.operation
            if op.name in (_CAT, _STACK, *_RESHAPES):
                e = m.expr(op.result)
                # a reshaped parameter is no stack: nothing to compute once
                if e is not None and isinstance(_data(e), _Join) and len(_leaves(e)) >= self.min_operands:
                    stacks.append((op, e))
            return ir.WalkResult.ADVANCE

        func.walk(collect)
        inner: set[Operation] = set()  # ops that only feed a larger stack: the stack ops, their lists
        for op, _ in stacks:
            inner.add(op)
            if op.name in (_CAT, _STACK):
                inner.add(defining_op(op.operands[0]))
        # a stack is a root when some use is outside the stacks (walk order: operands first)
        return [
            (op, e)
            for op, e in stacks
            if any(getattr(u.owner, "operation", u.owner) not in inner for u in op.result.uses)
        ]


def _emit_global(symbol: str, e, loc: ir.Location, anchor: InsertionPoint) -> None:
    Operation.create(
        "util.global",
        attributes={
            "sym_name": StringAttr.get(symbol),
            "sym_visibility": StringAttr.get("private"),
            "type": ir.TypeAttr.get(Type.parse(e.type)),
        },
        loc=loc,
        ip=anchor,
    )
    init = Operation.create(
        "util.initializer",
        attributes={
            "function_type": ir.TypeAttr.get(ir.FunctionType.get([], [])),
        },
        regions=1,
        loc=loc,
        ip=anchor,
    )
    block = init.regions[0].blocks.append()
    ip = InsertionPoint(block)
    value = _InitBuilder(ip, loc).value(e)
    Operation.create(
        "util.global.store", operands=[value], attributes={"global": FlatSymbolRefAttr.get(symbol)}, loc=loc, ip=ip
    )
    Operation.create("util.return", loc=loc, ip=ip)


def _mark_tree(op: Operation) -> None:
    """Mark the pure ops `op` is computed from (itself included) as erasable once unused."""
    if op.name in _PURE and _DEAD not in op.attributes:
        op.attributes[_DEAD] = ir.UnitAttr.get()
        for v in op.operands:
            if (p := defining_op(v)) is not None:
                _mark_tree(p)


def _erase_dead(funcs: list[Operation]) -> None:
    """Erase the marked ops left without uses, sweep after sweep; unmark the rest (still used
    elsewhere). Each sweep erases only ops found by that sweep's walk: no op is erased twice."""
    while True:
        dead: list[Operation] = []

        def collect(op):
            op = op.operation
            if _DEAD in op.attributes and not any(list(r.uses) for r in op.results):
                dead.append(op)
            return ir.WalkResult.ADVANCE

        for func in funcs:
            func.walk(collect)
        if not dead:
            break
        for op in dead:
            op.erase()

    def unmark(op):
        if _DEAD in op.attributes:
            del op.attributes[_DEAD]
        return ir.WalkResult.ADVANCE

    for func in funcs:
        func.walk(unmark)
