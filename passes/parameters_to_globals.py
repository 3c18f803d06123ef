"""parameters-to-globals: turn `torch.day0.parameter` placeholders into IREE parameter globals.

Precondition: weights appear in raw torch IR as

    %w = torch.operator "torch.day0.parameter"() {day0.key = "model.layers.0.mlp.gate_proj.weight"}
         : () -> !torch.vtensor<[64,32],f32>

(any function, the same key any number of times, always with the same static type). Afterwards
no such op is left; each distinct key is one module-level global read by name at load time

    util.global private @model.layers.0.mlp.gate_proj.weight
        = #flow.parameter.named<"model"::"model.layers.0.mlp.gate_proj.weight"> : tensor<64x32xf32>

and each use site loads it and converts back to the torch type:
    parameter(key) -> torch_c.from_builtin_tensor(util.global.load @sym)
The weights stay out of the vmfb: the runtime binds scope "model" to a file (`.irpa`,
`.safetensors`, `.gguf`) through `iree.runtime.ParameterIndex` / `--parameters=model=FILE`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from day0.frontend.ir import (
    Attribute,
    FlatSymbolRefAttr,
    InsertionPoint,
    Operation,
    StringAttr,
    Type,
    TypeAttr,
)
from day0.passes.base import (
    DiagnosticEngine,
    ModulePass,
    collect_ops,
    file_position,
    loc_string,
    operator_name,
    unique_symbol,
)
from day0.passes.torch_ir import VTENSOR_TYPE

OP_NAME = "torch.day0.parameter"
KEY_ATTR = "day0.key"


def builtin_tensor_type(torch_type: str) -> str | None:
    """`!torch.vtensor<[64,32],si64>` -> `tensor<64x32xi64>` (torch's signed/unsigned ints are
    signless in builtin tensors); None when the type is not a static-shaped vtensor."""
    m = VTENSOR_TYPE.match(torch_type)
    if not m or "?" in m.group(1):
        return None
    dims = [d for d in m.group(1).split(",") if d]
    dtype = re.sub(r"^[su]i(\d+)$", r"i\1", m.group(2))
    return "tensor<" + "".join(f"{d}x" for d in dims) + dtype + ">"


def _symbol_name(key: str, taken: set[str]) -> str:
    """A legal, unused symbol name close to the key (dots are legal in MLIR identifiers)."""
    base = re.sub(r"[^A-Za-z0-9_.$]", "_", key)
    if not re.match(r"[A-Za-z_]", base):
        base = "_" + base
    return unique_symbol(base, taken)


@dataclass(frozen=True)
class ParametersToGlobals(ModulePass):
    """Options:
    scope   the parameter scope the globals name (default "model"): `#flow.parameter.named<"scope"::key>`.
    """

    name = "parameters-to-globals"
    scope: str = "model"

    def __post_init__(self):
        if not self.scope or '"' in self.scope or "\\" in self.scope:
            raise ValueError(f"scope must be a non-empty name without quotes, got {self.scope!r}")

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        sites: list[tuple[Operation, str, str]] = []  # (op, key, builtin tensor type)
        first: dict[str, tuple[Operation, str]] = {}  # key -> (first op, its torch type)

        for op in collect_ops(module_op, lambda op: operator_name(op) == OP_NAME):
            _check(op, first, sites, diag)
        if diag.diagnostics or not sites:
            return

        body = module_op.regions[0].blocks[0]
        taken = {StringAttr(op.attributes["sym_name"]).value for op in body.operations if "sym_name" in op.attributes}
        symbols: dict[str, str] = {}
        anchor = InsertionPoint(body.operations[0])  # globals go first, in order of first use
        for op, key, tensor in sites:
            if key in symbols:
                continue
            symbols[key] = _symbol_name(key, taken)
            initial = f'#flow.parameter.named<"{self.scope}"::"{key}"> : {tensor}'
            Operation.create(
                "util.global",
                attributes={
                    "sym_name": StringAttr.get(symbols[key]),
                    "sym_visibility": StringAttr.get("private"),
                    "type": TypeAttr.get(Type.parse(tensor)),
                    "initial_value": Attribute.parse(initial),
                },
                loc=op.location,
                ip=anchor,
            )
        for op, key, tensor in sites:
            ip = InsertionPoint(op)
            # parameter(key) -> from_builtin_tensor(global.load @key)
            load = Operation.create(
                "util.global.load",
                results=[Type.parse(tensor)],
                attributes={"global": FlatSymbolRefAttr.get(symbols[key])},
                loc=op.location,
                ip=ip,
            )
            value = Operation.create(
                "torch_c.from_builtin_tensor",
                results=[op.result.type],
                operands=[load.result],
                loc=op.location,
                ip=ip,
            )
            op.result.replace_all_uses_with(value.result)
            op.erase()


def _check(op, first, sites, diag: DiagnosticEngine) -> None:
    if len(op.operands) != 0 or len(op.results) != 1:
        return diag.error(op, "parameter: expected no operands and one result")
    if KEY_ATTR not in op.attributes:
        return diag.error(op, f"parameter: missing '{KEY_ATTR}' string attribute")
    try:
        key = StringAttr(op.attributes[KEY_ATTR]).value
    except ValueError:
        return diag.error(op, f"parameter: '{KEY_ATTR}' must be a string, got {op.attributes[KEY_ATTR]}")
    if not key:
        return diag.error(op, f"parameter: '{KEY_ATTR}' is empty")
    if '"' in key or "\\" in key:  # IREE prints parameter keys unescaped: the IR would not reparse
        return diag.error(op, f"parameter key {key!r} must not contain '\"' or '\\'")
    torch_type = str(op.result.type)
    tensor = builtin_tensor_type(torch_type)
    if tensor is None:
        return diag.error(op, f"parameter '{key}': type must be a static-shaped !torch.vtensor, got {torch_type}")
    if key in first and first[key][1] != torch_type:
        where = loc_string(*(file_position(first[key][0].location) or (None, None, None)))
        return diag.error(
            op, f"parameter '{key}' has type {torch_type} here but {first[key][1]} at {where or 'its first use'}"
        )
    first.setdefault(key, (op, torch_type))
    sites.append((op, key, tensor))
