"""The single import point of the MLIR Python bindings.

day0 uses the bindings shipped inside `iree-base-compiler`: they register the torch dialects as
well as IREE's own (util, flow, iree_linalg_ext), so one context can hold an imported torch module,
our rewrites, and the IREE ops they emit. Everything else imports MLIR names from here.
"""

from iree.compiler import ir, passmanager  # noqa: F401
from iree.compiler.ir import (  # noqa: F401
    Attribute,
    Block,
    Context,
    DenseElementsAttr,
    FlatSymbolRefAttr,
    FloatAttr,
    FunctionType,
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
from iree.compiler.passmanager import PassManager  # noqa: F401


def new_context() -> Context:
    """A context with every dialect IREE knows (torch included) and unregistered ops allowed off."""
    ctx = Context()
    ctx.allow_unregistered_dialects = False
    return ctx


def parse_module(text: str, ctx: Context | None = None) -> Module:
    ctx = ctx or new_context()
    with ctx:
        return Module.parse(text)
