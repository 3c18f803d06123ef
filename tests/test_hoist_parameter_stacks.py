"""hoist-parameter-stacks end to end: a tiny MoE whose per-expert parameters are stacked in two
exported functions (prefill, decode), as the real models do.

    w_gu[e] = cat(gate_e, up_e)  # [E, 2N, K]     w_down = stack(down_e)  # [E, K, N]

After `parameters-to-globals,hoist-parameter-stacks` the module, compiled by IREE (llvm-cpu) with
the parameters read from a safetensors file, computes what numpy computes; and at the flow
phase each distinct stack is ONE global, where without the pass IREE hoists one per function.
"""

import re
from math import prod

import numpy as np
import pytest
import torch
from torch import nn

E, N, K = 4, 6, 8  # experts, rows per projection, model width
STACKS = {"gate_up": E * 2 * N * K, "down": E * K * N}  # elements (N != K: the sizes differ)


class _Expert(nn.Module):
    def __init__(self, g: torch.Generator):
        super().__init__()
        self.gate = nn.Parameter(torch.randn(N, K, generator=g), requires_grad=False)
        self.up = nn.Parameter(torch.randn(N, K, generator=g), requires_grad=False)
        self.down = nn.Parameter(torch.randn(K, N, generator=g), requires_grad=False)


class _Moe(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.experts = nn.ModuleList(_Expert(g) for _ in range(E))

    def stacks(self):
        gate_up = torch.stack([torch.cat([e.gate, e.up]) for e in self.experts])  # [E, 2N, K]
        down = torch.stack([e.down for e in self.experts])  # [E, K, N]
        return gate_up, down


class _Prefill(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm  # export's parameter hook drops the "lm." prefix: keys = state_dict names

    def forward(self, x, e):  # x: [S, K], e: [S] each token's expert -> [S, K]
        gate_up, down = self.lm.stacks()
        h = (gate_up[e] @ x[:, :, None])[..., 0]  # [S, 2N]
        a = torch.relu(h[:, :N]) * h[:, N:]
        return (down[e] @ a[:, :, None])[..., 0]


class _Decode(_Prefill):
    """The same computation at S = 1 (a second function reading the same stacks)."""


def _reference(params: dict[str, np.ndarray], x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The MoE in numpy, token by token: [S, K]."""
    out = []
    for xs, i in zip(x, e):
        g, u, d = (params[f"experts.{i}.{w}"] for w in ("gate", "up", "down"))
        out.append(d @ (np.maximum(g @ xs, 0) * (u @ xs)))
    return np.stack(out)


def _export(lm: _Moe) -> str:
    from torch_mlir import ir as tm_ir
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    from torch_mlir.extras.fx_importer import FxImporter

    from day0.frontend.export import _ParametersAsOps

    context = tm_ir.Context()
    torch_d.register_dialect(context)
    importer = FxImporter(context=context, hooks=_ParametersAsOps())
    seq = torch.export.Dim("seq", min=2, max=16)
    for name, module, args, shapes in (
        ("prefill", _Prefill(lm), (torch.zeros(3, K), torch.zeros(3, dtype=torch.int64)), ({0: seq}, {0: seq})),
        ("decode", _Decode(lm), (torch.zeros(1, K), torch.zeros(1, dtype=torch.int64)), None),
    ):
        program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        importer.import_program(program.run_decompositions(get_decomposition_table()), func_name=name)
    return str(importer.module_op)


def _lower(text: str, pipeline: str) -> str:
    from day0.frontend.ir import new_context, parse_module
    from day0.passes.pipeline import run_pipeline

    with new_context() as ctx:
        m = parse_module(text, ctx)
        run_pipeline(m, pipeline)
        return str(m)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(the model's parameters as numpy, the safetensors file, the exported raw torch IR)."""
    from safetensors.torch import save_file

    lm = _Moe()
    params = {k: v.contiguous() for k, v in lm.state_dict().items()}
    path = tmp_path_factory.mktemp("hoist") / "model.safetensors"
    save_file(params, path)
    return {k: v.numpy() for k, v in params.items()}, path, _export(lm)


def _stacked_globals(flow_ir: str) -> dict[str, int]:
    """Stack name -> number of f32 `util.global`s of its size at the flow phase (any shape: IREE
    may hold the stack before torch's final view, e.g. [E*2N, K])."""
    sizes = []
    for m in re.finditer(r"^\s*util\.global .*: tensor<([\dx]+)xf32>$", flow_ir, re.M):
        sizes.append(prod(int(d) for d in m.group(1).split("x")))
    return {name: sizes.count(n) for name, n in STACKS.items()}


def test_compiled_numerics_match_numpy(moe, tmp_path):
    from day0.lowering.compile import compile_mlir
    from day0.runtime.vm import VmModule

    params, path, text = moe
    ir = _lower(text, "builtin.module(parameters-to-globals,hoist-parameter-stacks)")
    assert "torch.aten.cat" not in ir and "torch.aten.stack" not in ir
    vmfb = tmp_path / "moe.vmfb"
    compile_mlir(ir, "llvm-cpu", vmfb)
    vm = VmModule.load(vmfb, [path])

    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, K)).astype(np.float32)
    e = np.array([0, 3, 1, 1, 2, 0, 3], dtype=np.int64)
    np.testing.assert_allclose(
        np.asarray(vm.function("prefill")(x, e).to_host()), _reference(params, x, e), rtol=1e-5, atol=1e-4
    )
    for i in range(E):
        got = np.asarray(vm.function("decode")(x[:1], e[:1] * 0 + i).to_host())
        np.testing.assert_allclose(got, _reference(params, x[:1], [i]), rtol=1e-5, atol=1e-4)


def test_one_global_per_stack_at_flow(moe):
    from day0.lowering.compile import compile_to_phase

    _, _, text = moe
    before = compile_to_phase(_lower(text, "builtin.module(parameters-to-globals)"), "llvm-cpu", "flow")
    after = compile_to_phase(
        _lower(text, "builtin.module(parameters-to-globals,hoist-parameter-stacks)"), "llvm-cpu", "flow"
    )
    # IREE's own hoisting computes a stack once per function that contains it ...
    assert "__hoisted" in before and all(n >= 2 for n in _stacked_globals(before).values()), _stacked_globals(before)
    # ... the pass computes each once, for both functions, and IREE hoists nothing more.
    assert _stacked_globals(after) == dict.fromkeys(STACKS, 1)
    assert "__hoisted" not in after


def test_the_parameters_a_stack_reads_are_not_kept(moe):
    """The per-expert parameters are read by the stacks' initializer only: IREE loads them there
    and keeps no global for them, so a stack costs no memory beyond its parts (what
    models/layers.linears relies on to fuse projections)."""
    from day0.lowering.compile import compile_to_phase

    _, _, text = moe
    vm = compile_to_phase(
        _lower(text, "builtin.module(parameters-to-globals,hoist-parameter-stacks)"), "llvm-cpu", "vm"
    )
    kept = re.findall(r"vm\.global\.\w+ private (?:mutable )?@(\S+)", vm)
    assert not [g for g in kept if "experts" in g and "gate" in g and "up" not in g], kept
    assert any("gate_up" in g or "all" in g for g in kept), kept
