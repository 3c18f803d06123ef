"""torch.export of a model's `prefill` and `decode` entry points into one raw torch-dialect module.

Weights never enter the IR: each parameter becomes
    %w = torch.operator "torch.day0.parameter"() {day0.key = "<checkpoint tensor name>"}
which the `parameters-to-globals` pass turns into an IREE parameter global read from the shards at
load time. The model can therefore be exported with uninitialized weights (no checkpoint load).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.export import Dim
from torch.export.graph_signature import InputKind
from torch_mlir import ir as tm_ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_decomp_util import get_decomposition_table
from torch_mlir.extras.fx_importer import FxImporter, FxImporterHooks

import day0.frontend.ops  # noqa: F401  (registers the day0:: ops before tracing)

PARAMETER_OP = "torch.day0.parameter"


class _Prefill(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, start, *state):
        return self.lm.step(ids, start, *state)


class _Decode(_Prefill):
    pass


class _ParametersAsOps(FxImporterHooks):
    """Imports every parameter as a `torch.day0.parameter` op naming its checkpoint tensor."""

    def resolve_input(self, gni, value, info):
        if info.input_spec.kind != InputKind.PARAMETER:
            return None  # buffers (rope tables) are small literals
        key = info.input_spec.target.removeprefix("lm.")
        op = tm_ir.Operation.create(
            "torch.operator", results=[info.ir_type],
            attributes={"name": tm_ir.StringAttr.get(PARAMETER_OP), "day0.key": tm_ir.StringAttr.get(key)})
        return op.result


@dataclass
class ExportedModule:
    mlir: str  # raw torch dialect, functions @prefill and @decode
    parameters: list[str]  # checkpoint tensor names the module reads


def export_model(lm: nn.Module, max_seq_len: int) -> ExportedModule:
    """Export `lm.step` twice: prefill (S in [2, max_seq_len], dynamic) and decode (S = 1)."""
    state = lm.empty_state()
    start = torch.zeros(1, dtype=torch.int64)
    seq = Dim("seq", min=2, max=max_seq_len)
    prefill = torch.export.export(
        _Prefill(lm), (torch.zeros(4, dtype=torch.int64), start, *state),
        dynamic_shapes=({0: seq}, None, (None,) * len(state)), strict=False)
    decode = torch.export.export(_Decode(lm), (torch.zeros(1, dtype=torch.int64), start, *state), strict=False)

    decompositions = get_decomposition_table()  # the aten decompositions torch-mlir expects
    prefill, decode = prefill.run_decompositions(decompositions), decode.run_decompositions(decompositions)
    context = tm_ir.Context()
    torch_d.register_dialect(context)
    importer = FxImporter(context=context, hooks=_ParametersAsOps())
    importer.import_program(prefill, func_name="prefill")
    importer.import_program(decode, func_name="decode")
    params = sorted({s.target.removeprefix("lm.") for p in (prefill, decode)
                     for s in p.graph_signature.input_specs if s.kind == InputKind.PARAMETER})
    return ExportedModule(mlir=str(importer.module_op), parameters=params)
