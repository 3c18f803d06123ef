"""to-device-transfer: place the values of `torch.day0.to_device` (frontend/ops.py to_device) on the
devices of a module compiled for several (`day0 compile --devices N`).

Precondition: parameters-to-globals and hoist-parameter-stacks have run; every

    %y = torch.operator "torch.day0.to_device"(%x, %d) : (!torch.vtensor<[...],T>, !torch.int) -> !torch.vtensor<[...],T>

has a tensor operand, a constant device index d in [0, devices) and a result of the operand's
type. Afterwards none is left.

Rewrite, when x is a module global (x = torch_c.from_builtin_tensor (util.global.load @g), or a
reshape of it: a parameter or a hoisted stack of experts):
    @g gets `stream.affinity = #hal.device.affinity<@__device_d>`, and so does every parameter
    global the initializer storing @g reads (that initializer stores nothing else): the device
    holds the global and loads its parameters itself, no other device holds them. %y is %x.
Otherwise:
    xb = torch_c.to_builtin_tensor %x
    yb = flow.tensor.transfer xb : tensor<...>{dynamic dims} to #hal.device.promise<@__device_d>
    %y = torch_c.from_builtin_tensor yb
IREE runs each dispatch on the device its operands were moved to. @__device_i is the i-th
`--iree-hal-target-device` flag (lowering/compile.py target_flags).

Errors: a global placed on two devices, a device index that is not a constant in [0, devices).
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Attribute, InsertionPoint, Operation
from day0.passes.base import DiagnosticEngine, ModulePass, collect_ops, operator_name
from day0.passes.torch_ir import TensorType, builtin_type, defining_op, dynamic_dims, replace_op, torch_constant

OP_NAME = "torch.day0.to_device"
_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


def _global_read(value) -> str | None:
    """@g when value = torch_c.from_builtin_tensor (util.global.load @g), else None."""
    cast = defining_op(value)
    if cast is None or cast.name != "torch_c.from_builtin_tensor":
        return None
    load = defining_op(cast.operands[0])
    while load is not None and load.name in _RESHAPES:  # hoist-parameter-stacks' views of a stack
        load = defining_op(load.operands[0])
    if load is None or load.name != "util.global.load":
        return None
    return str(load.attributes["global"]).lstrip("@")


@dataclass(frozen=True)
class ToDeviceTransfer(ModulePass):
    name = "to-device-transfer"
    devices: int = 1

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        placed: dict[str, int] = {}
        for op in collect_ops(module_op, lambda o: operator_name(o) == OP_NAME):
            operands, results = list(op.operands), list(op.results)
            t = TensorType.of(operands[0]) if len(operands) == 2 else None
            d = torch_constant(operands[1], "torch.constant.int") if len(operands) == 2 else None
            if t is None or len(results) != 1 or str(results[0].type) != str(operands[0].type):
                diag.error(op, f"{OP_NAME} takes a tensor and a device index and returns a tensor of its type")
                continue
            if not isinstance(d, int) or not 0 <= d < self.devices:
                diag.error(op, f"{OP_NAME}: device {d} is not a constant in [0, {self.devices})")
                continue
            g = _global_read(operands[0])
            if g is not None:
                if placed.setdefault(g, d) != d:
                    diag.error(op, f"{OP_NAME}: global @{g} is placed on device {placed[g]} and on device {d}")
                    continue
                replace_op(op, [operands[0]])
                continue
            ip, loc = InsertionPoint(op), op.location
            builtin = builtin_type(t)
            xb = Operation.create("torch_c.to_builtin_tensor", [builtin], [operands[0]], loc=loc, ip=ip).result
            dims = dynamic_dims(xb, t, loc, ip)
            target = Attribute.parse(f"#hal.device.promise<@__device_{d}>")
            yb = Operation.create(
                "flow.tensor.transfer", [builtin], [xb, *dims], {"target": target}, loc=loc, ip=ip
            ).result
            y = Operation.create("torch_c.from_builtin_tensor", [results[0].type], [yb], loc=loc, ip=ip).result
            replace_op(op, [y])
        if placed:
            _place_globals(module_op, placed)


def _place_globals(module_op: Operation, placed: dict[str, int]) -> None:
    """Give each placed global, and the parameter globals its own initializer reads, its device."""
    body = module_op.regions[0].blocks[0]
    params: dict[str, int] = {}
    for op in body.operations:
        if op.operation.name != "util.initializer":
            continue
        stores = collect_ops(op.operation, lambda o: o.name == "util.global.store")
        stored = {str(s.attributes["global"]).lstrip("@") for s in stores}
        devices = {placed.get(s) for s in stored}
        if len(devices) == 1 and None not in devices:
            (d,) = devices
            for load in collect_ops(op.operation, lambda o: o.name == "util.global.load"):
                params[str(load.attributes["global"]).lstrip("@")] = d
    where = {**params, **placed}
    for op in body.operations:
        o = op.operation
        if o.name == "util.global" and str(o.attributes["sym_name"]).strip('"') in where:
            d = where[str(o.attributes["sym_name"]).strip('"')]
            o.attributes["stream.affinity"] = Attribute.parse(f"#hal.device.affinity<@__device_{d}>")
