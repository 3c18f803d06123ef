"""Torch-dialect helpers every day0 pass shares: the `!torch.vtensor` type, an op builder that
shares constants, constant-operand lookup, builtin tensor types and their dynamic dims, and dim
formatting for diagnostics."""

from __future__ import annotations

import re
from dataclasses import dataclass

from day0.frontend.ir import (
    Attribute,
    FloatAttr,
    IndexType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Operation,
    Type,
    Value,
)

VTENSOR_TYPE = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],(\w+)>$")
# torch ScalarType codes (the dtype operand of aten.to.dtype and aten.view.dtype)
SCALAR_TYPE = {"si32": 3, "si64": 4, "f16": 5, "f32": 6, "bf16": 15}


@dataclass(frozen=True)
class TensorType:
    """A `!torch.vtensor` type: dims (None = dynamic) and dtype spelling (f32, si64, i1...)."""

    dims: tuple[int | None, ...]
    dtype: str

    @staticmethod
    def of(value: Value) -> TensorType | None:
        m = VTENSOR_TYPE.match(str(value.type))
        if not m:
            return None
        dims = tuple(None if d == "?" else int(d) for d in m.group(1).split(",") if d)
        return TensorType(dims, m.group(2))

    def mlir(self) -> Type:
        dims = ",".join("?" if d is None else str(d) for d in self.dims)
        return Type.parse(f"!torch.vtensor<[{dims}],{self.dtype}>")


class TorchBuilder:
    """Builds torch dialect ops before one op, at that op's location (constants are shared)."""

    def __init__(self, before: Operation):
        self.ip = InsertionPoint(before)
        self.loc = before.location
        self._consts: dict[tuple[str, object], Value] = {}

    def op(self, name: str, operands: list[Value], result: TensorType | str, attrs=None) -> Value:
        """One op of any dialect with one result (a TensorType or a type's text)."""
        return self.op_results(name, operands, [result], attrs)[0]

    def op_results(self, name: str, operands: list[Value], results: list[TensorType | str], attrs=None) -> list[Value]:
        types = [r.mlir() if isinstance(r, TensorType) else Type.parse(r) for r in results]
        op = Operation.create(name, results=types, operands=operands, attributes=attrs or {}, loc=self.loc, ip=self.ip)
        return list(op.results)

    def _const(self, kind: str, value: object, make) -> Value:
        key = (kind, value)
        if key not in self._consts:
            self._consts[key] = make()
        return self._consts[key]

    def int(self, v: int) -> Value:
        attr = {"value": IntegerAttr.get(IntegerType.get_signless(64), v)}
        return self._const("int", v, lambda: self.op("torch.constant.int", [], "!torch.int", attr))

    def float(self, v: float) -> Value:
        attr = {"value": FloatAttr.get_f64(v)}
        return self._const("float", v, lambda: self.op("torch.constant.float", [], "!torch.float", attr))

    def bool(self, v: bool) -> Value:
        attr = {"value": Attribute.parse("true" if v else "false")}
        return self._const("bool", v, lambda: self.op("torch.constant.bool", [], "!torch.bool", attr))

    def none(self) -> Value:
        return self._const("none", None, lambda: self.op("torch.constant.none", [], "!torch.none"))

    def to_dtype(self, value: Value, result: TensorType) -> Value:
        """aten.to.dtype of `value` to result.dtype (non_blocking and copy false, no memory format)."""
        return self.op(
            "torch.aten.to.dtype",
            [value, self.int(SCALAR_TYPE[result.dtype]), self.bool(False), self.bool(False), self.none()],
            result,
        )

    def ints(self, vs: list[int]) -> Value:
        items = [self.int(v) for v in vs]
        return self.op("torch.prim.ListConstruct", items, "!torch.list<int>")


def defining_op(value: Value) -> Operation | None:
    """The op that makes `value`; None for a block argument."""
    owner = getattr(value.owner, "operation", value.owner)  # a block argument's owner is a Block
    return owner if isinstance(owner, Operation) else None


def replace_op(op: Operation, values: list[Value]) -> None:
    """Replace op's results with `values` and erase it, then erase the torch constants it read
    that nothing reads any more (one constant may feed several of its operands)."""
    read: list[Value] = []
    for v in op.operands:
        if v not in read:
            read.append(v)
    for result, value in zip(op.results, values, strict=True):
        result.replace_all_uses_with(value)
    op.erase()
    for v in read:
        owner = defining_op(v)
        if owner is not None and owner.name.startswith("torch.constant.") and not list(v.uses):
            owner.erase()


def torch_constant(value: Value, op_name: str) -> object | None:
    """The Python value of `value` when it is produced by the constant op `op_name`
    (e.g. torch.constant.int), else None."""
    owner = defining_op(value)
    if owner is None or owner.name != op_name:
        return None
    attr = owner.attributes["value"]
    return bool(attr.value) if op_name == "torch.constant.bool" else attr.value


def builtin_type(t: TensorType) -> Type:
    """The builtin tensor type of a torch one (`torch_c.to_builtin_tensor`'s result): dynamic dims
    as `?`, torch's signed/unsigned ints signless."""
    dtype = {"si64": "i64", "si32": "i32", "si8": "i8", "ui8": "i8"}.get(t.dtype, t.dtype)
    return Type.parse(f"tensor<{'x'.join('?' if d is None else str(d) for d in t.dims)}{'x' if t.dims else ''}{dtype}>")


def dynamic_dims(builtin: Value, t: TensorType, loc, ip: InsertionPoint) -> list[Value]:
    """`tensor.dim` of each dynamic dim of `builtin` (a builtin tensor of torch type t), in order:
    the operands an op taking a dynamically shaped tensor (flow.tensor.tie_shape,
    flow.tensor.transfer) lists after it."""
    index = IndexType.get()
    dims = []
    for i, d in enumerate(t.dims):
        if d is None:
            at = Operation.create("arith.constant", [index], [], {"value": IntegerAttr.get(index, i)}, loc=loc, ip=ip)
            dims.append(Operation.create("tensor.dim", [index], [builtin, at.result], loc=loc, ip=ip).result)
    return dims


def fmt_dim(d: int | None) -> str:
    return "?" if d is None else str(d)


def fmt_dims(dims) -> str:
    """[2,?,8] for diagnostics."""
    return "[" + ",".join(fmt_dim(d) for d in dims) + "]"
