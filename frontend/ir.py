"""The single import point of the MLIR Python bindings.

day0 uses the bindings shipped inside `iree-base-compiler`: they register the torch dialects as
well as IREE's own (util, flow, iree_linalg_ext), so one context can hold an imported torch module,
our rewrites, and the IREE ops they emit. Everything else imports MLIR names from here.
"""

from iree.compiler import ir  # noqa: F401
from iree.compiler.ir import (  # noqa: F401
    Attribute,
    Context,
    FlatSymbolRefAttr,
    FloatAttr,
    FunctionType,
    IndexType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Location,
    Module,
    Operation,
    RankedTensorType,
    StringAttr,
    Type,
    TypeAttr,
    Value,
)

MLIRError = ir.MLIRError


def new_context() -> Context:
    """A context with every dialect IREE knows (torch included); unregistered dialects are refused."""
    ctx = Context()
    ctx.allow_unregistered_dialects = False
    return ctx


def parse_module(text: str, ctx: Context | None = None) -> Module:
    """Parse into `ctx`, else the context of the enclosing `with`, else a new one. (Parsing into a
    fresh context inside a `with` would let passes mix types of two contexts: invalid IR that
    only prints in generic form.)"""
    if ctx is None:
        try:
            ctx = Context.current
        except ValueError:
            ctx = new_context()
    with ctx:
        return Module.parse(text)
