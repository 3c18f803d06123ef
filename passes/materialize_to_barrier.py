"""materialize-to-barrier: lower `torch.day0.materialize` (frontend/ops.py materialize) to IREE's
`util.optimization_barrier`, a fusion boundary.

Precondition: every

    %y = torch.operator "torch.day0.materialize"(%x) : (!torch.vtensor<[...],T>) -> !torch.vtensor<[...],T>

has one tensor operand and one result of the same type. Afterwards none is left.

Rewrite:
    xb = torch_c.to_builtin_tensor %x
    yb = util.optimization_barrier xb
    [yb = flow.tensor.tie_shape yb : tensor<...>{tensor.dim xb, i ...}]   (dynamic dims only)
    %y = torch_c.from_builtin_tensor yb

IREE forms no dispatch across the barrier: x is computed into a tensor of its own (a column slice
of a larger result is copied out contiguously), and its users read that tensor. Why a target
wants this: frontend/ops.py materialize, and docs/perf.md ("The default model on the GPU").
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import InsertionPoint, Operation
from day0.passes.base import DiagnosticEngine, ModulePass, collect_ops, operator_name
from day0.passes.torch_ir import TensorType, builtin_type, dynamic_dims, replace_op

OP_NAME = "torch.day0.materialize"


@dataclass(frozen=True)
class MaterializeToBarrier(ModulePass):
    name = "materialize-to-barrier"

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        for op in collect_ops(module_op, lambda o: operator_name(o) == OP_NAME):
            operands, results = list(op.operands), list(op.results)
            t = TensorType.of(operands[0]) if len(operands) == 1 else None
            if t is None or len(results) != 1 or str(results[0].type) != str(operands[0].type):
                diag.error(op, f"{OP_NAME} takes one tensor and returns a tensor of its type")
                continue
            ip, loc = InsertionPoint(op), op.location
            builtin = builtin_type(t)
            xb = Operation.create("torch_c.to_builtin_tensor", [builtin], operands, loc=loc, ip=ip).result
            yb = Operation.create("util.optimization_barrier", [builtin], [xb], loc=loc, ip=ip).result
            dims = dynamic_dims(xb, t, loc, ip)
            if dims:  # the barrier hides its result's dims from IREE's shape reification: tie them
                yb = Operation.create("flow.tensor.tie_shape", [builtin], [yb, *dims], loc=loc, ip=ip).result
            y = Operation.create("torch_c.from_builtin_tensor", [results[0].type], [yb], loc=loc, ip=ip).result
            replace_op(op, [y])
