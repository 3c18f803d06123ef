"""Pieces every site matcher uses: a broken contract as an exception, reported once at the op, and
reading operand types and constant operands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from day0.frontend.ir import Operation, Value
from day0.passes.base import DiagnosticEngine
from day0.passes.torch_ir import TensorType, torch_constant

Site = TypeVar("Site")


class Broken(Exception):
    """An op breaks its contract; the message says how (without the op's name)."""


def report(op: Operation, diag: DiagnosticEngine, what: str, site: Callable[[Operation], Site]) -> Site | None:
    """site(op), or None after one error at `op`, "<what>: <message>", when it raises Broken (what:
    the op's short name, e.g. dsa_attention)."""
    try:
        return site(op)
    except Broken as e:
        diag.error(op, f"{what}: {e}")
        return None


def operands(op: Operation, names: Sequence[str]) -> list[Value]:
    """The operands (named `names`) of an op with one result; Broken for another arity."""
    if len(op.operands) != len(names) or len(op.results) != 1:
        raise Broken(f"expected {len(names)} operands ({', '.join(names)}) and 1 result")
    return list(op.operands)


def ranked_vtensors(named: Sequence[tuple[str, Value, int]]) -> list[TensorType]:
    """The !torch.vtensor types of (name, value, rank) triples; Broken at the first value that is
    not a vtensor of its rank."""
    types = []
    for name, value, rank in named:
        t = TensorType.of(value)
        if t is None:
            raise Broken(f"{name} must be a !torch.vtensor, got {value.type}")
        if len(t.dims) != rank:
            raise Broken(f"{name} must have rank {rank}, got rank {len(t.dims)}")
        types.append(t)
    return types


def constant(value: Value, op_name: str, what: str):
    """The Python value of an operand made by the constant op `op_name` (torch.constant.int, ...);
    Broken when another op makes it."""
    c = torch_constant(value, op_name)
    if c is None:
        raise Broken(f"{what} must come from {op_name}")
    return c
