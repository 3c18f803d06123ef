"""lowering/: the target table, iree-compile invocation, repro on failure, phase dumps."""

import os
import re
import subprocess

import pytest

from day0.lowering.compile import PHASES, CompileError, compile_mlir, compile_to_phase
from day0.lowering.targets import (
    TARGETS,
    attach_device_targets,
    cuda_device_target_attr,
    get_target,
)

# y = x @ w.T + b with w, b runtime parameters (the form our models take after export).
LINEAR = """
module {
  util.global private @w = #flow.parameter.named<"model"::"layer.weight"> : tensor<8x4xf32>
  util.global private @b = #flow.parameter.named<"model"::"layer.bias"> : tensor<8xf32>
  func.func @main(%x: !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,8],f32> {
    %w = util.global.load @w : tensor<8x4xf32>
    %wt = torch_c.from_builtin_tensor %w : tensor<8x4xf32> -> !torch.vtensor<[8,4],f32>
    %b = util.global.load @b : tensor<8xf32>
    %bt = torch_c.from_builtin_tensor %b : tensor<8xf32> -> !torch.vtensor<[8],f32>
    %y = torch.aten.linear %x, %wt, %bt : !torch.vtensor<[2,4],f32>, !torch.vtensor<[8,4],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[2,8],f32>
    return %y : !torch.vtensor<[2,8],f32>
  }
}
"""

# torch-mlir's raw-to-linalg lowering has no 3-D x 1-D matmul: fails in the `input` phase.
UNLOWERABLE = """
module {
  func.func @main(%a: !torch.vtensor<[2,8,4],f32>, %x: !torch.vtensor<[4],f32>) -> !torch.vtensor<[2,8],f32> {
    %y = torch.aten.matmul %a, %x : !torch.vtensor<[2,8,4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[2,8],f32>
    return %y : !torch.vtensor<[2,8],f32>
  }
}
"""
UNLOWERABLE_ERROR = "error: failed to legalize operation 'torch.aten.matmul'"


def stacked_experts_module(num_experts: int = 4, n: int = 16, k: int = 8) -> str:
    """out[i] = stack(experts)[idx[i]] @ x[i]: per-expert parameters stacked, then selected."""
    vt = f"!torch.vtensor<[{n},{k}],f32>"
    lines = ["module {"]
    lines += [
        f'  util.global private @e{e} = #flow.parameter.named<"model"::"experts.{e}.weight"> : tensor<{n}x{k}xf32>'
        for e in range(num_experts)
    ]
    lines.append(
        f"  func.func @main(%x: !torch.vtensor<[2,{k},1],f32>, %idx: !torch.vtensor<[2],si64>)"
        f" -> !torch.vtensor<[2,{n},1],f32> {{"
    )
    for e in range(num_experts):
        lines.append(f"    %l{e} = util.global.load @e{e} : tensor<{n}x{k}xf32>")
        lines.append(f"    %t{e} = torch_c.from_builtin_tensor %l{e} : tensor<{n}x{k}xf32> -> {vt}")
    experts = ", ".join(f"%t{e}" for e in range(num_experts))
    lines += [
        "    %int0 = torch.constant.int 0",
        f"    %list = torch.prim.ListConstruct {experts} : ({', '.join([vt] * num_experts)}) -> !torch.list<vtensor>",
        f"    %stack = torch.aten.stack %list, %int0 : !torch.list<vtensor>, !torch.int"
        f" -> !torch.vtensor<[{num_experts},{n},{k}],f32>",
        f"    %sel = torch.aten.index_select %stack, %int0, %idx : !torch.vtensor<[{num_experts},{n},{k}],f32>,"
        f" !torch.int, !torch.vtensor<[2],si64> -> !torch.vtensor<[2,{n},{k}],f32>",
        f"    %y = torch.aten.bmm %sel, %x : !torch.vtensor<[2,{n},{k}],f32>, !torch.vtensor<[2,{k},1],f32>"
        f" -> !torch.vtensor<[2,{n},1],f32>",
        f"    return %y : !torch.vtensor<[2,{n},1],f32>",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def test_unknown_target_lists_known_ones():
    with pytest.raises(ValueError, match="unknown target 'tpu'.*cuda-sm90, llvm-cpu"):
        get_target("tpu")
    with pytest.raises(ValueError, match="known targets"):
        compile_to_phase(LINEAR, "sm_90")


def test_llvm_cpu_flags():
    flags = TARGETS["llvm-cpu"].flags
    assert "--iree-llvmcpu-target-cpu=host" in flags
    assert "--iree-llvmcpu-reassociate-fp-reductions" in flags
    assert "--iree-opt-data-tiling=false" in flags
    assert TARGETS["llvm-cpu"].device == "local-task"
    assert TARGETS["cuda-sm90"].device == "cuda"


def test_tiny_compile_writes_vmfb_atomically(tmp_path):
    out = tmp_path / "art" / "model.vmfb"
    result = compile_mlir(LINEAR, "llvm-cpu", out)
    assert out.stat().st_size > 0
    assert result.flags[0] == "--iree-input-type=torch"
    assert "--iree-opt-level=O3" in result.flags and result.seconds > 0
    assert os.listdir(out.parent) == ["model.vmfb"]  # no temp file left behind


def test_failing_compile_writes_repro(tmp_path):
    out = tmp_path / "model.vmfb"
    repro = tmp_path / "repro"
    with pytest.raises(CompileError) as info:
        compile_mlir(UNLOWERABLE, "llvm-cpu", out, repro_dir=repro)
    err = info.value
    message = str(err)
    assert message.startswith("iree-compile --target llvm-cpu failed: ")
    assert UNLOWERABLE_ERROR in message
    assert str(repro / "command.sh") in message
    assert "Traceback" not in message and "\n" not in message  # one line, no library guts
    assert err.repro_dir == repro.resolve()
    assert not out.exists() and os.listdir(tmp_path) == ["repro"]
    assert sorted(os.listdir(repro)) == ["command.sh", "input.mlir", "stderr.log"]
    assert UNLOWERABLE_ERROR in (repro / "stderr.log").read_text()
    assert "torch.aten.matmul" in (repro / "input.mlir").read_text()
    # command.sh alone reproduces the same failure.
    proc = subprocess.run(["sh", str(repro / "command.sh")], capture_output=True, text=True)
    assert proc.returncode != 0 and UNLOWERABLE_ERROR in proc.stderr
    assert "--iree-llvmcpu-reassociate-fp-reductions" in (repro / "command.sh").read_text()


def test_dump_dir_gets_input_and_every_phase(tmp_path):
    dump = tmp_path / "dump"
    compile_mlir(LINEAR, "llvm-cpu", tmp_path / "m.vmfb", dump_dir=dump)
    assert "torch.aten.linear" in (dump / "input.mlir").read_text()
    phases = {p.name.split(".")[-2] for p in (dump / "phases").glob("*.mlir")}
    assert phases == set(PHASES)
    assert "flow.dispatch" in next((dump / "phases").glob("*.flow.mlir")).read_text()


def test_failure_with_dump_dir_names_the_failing_phase(tmp_path):
    dump = tmp_path / "dump"
    compile_mlir(LINEAR, "llvm-cpu", tmp_path / "m.vmfb", dump_dir=dump)  # stale phases...
    with pytest.raises(CompileError, match=r"phase 'input' failed: .*failed to legalize"):
        compile_mlir(UNLOWERABLE, "llvm-cpu", tmp_path / "m2.vmfb", dump_dir=dump)  # ...cleared
    assert (dump / "repro" / "command.sh").exists()


def test_compile_to_phase_counts_dispatches():
    flow = compile_to_phase(LINEAR, "llvm-cpu", "flow")
    assert len(re.findall(r"flow\.dispatch @", flow)) == 1
    with pytest.raises(ValueError, match="unknown phase"):
        compile_to_phase(LINEAR, "llvm-cpu", "linalg")


def test_stacked_experts_are_hoisted_into_an_initializer():
    """The MoE relies on this: stack(experts) is built once at load, not on every call."""
    flow = compile_to_phase(stacked_experts_module(), "llvm-cpu", "flow")
    init, main = flow.split("util.func public @main$async", 1)
    assert "util.initializer" in init and "util.global.store" in init
    assert "flow.tensor.update" not in main  # no per-call stacking copies
    assert len(re.findall(r"flow\.dispatch @", main)) == 1  # gather fused into the matvec
    # With hoisting off, the stack is rebuilt inside every call.
    flow_off = compile_to_phase(stacked_experts_module(), "llvm-cpu", "flow", ["--iree-opt-const-expr-hoisting=false"])
    assert "util.initializer" not in flow_off
    assert "flow.tensor.update" in flow_off.split("util.func public @main$async", 1)[1]


def test_attach_device_targets_module_forms():
    entry = "hal.device.targets = [#t]"
    assert attach_device_targets("module {\n}\n", "#t").startswith(f"module attributes {{{entry}}} {{")
    assert (
        attach_device_targets("#map = affine_map<(d0) -> (d0)>\nmodule @m {\n}\n", "#t").splitlines()[1]
        == f"module @m attributes {{{entry}}} {{"
    )
    assert attach_device_targets("module attributes {torch.x = 1} {\n}\n", "#t").startswith(
        f"module attributes {{{entry}, torch.x = 1}} {{"
    )
    assert attach_device_targets("func.func @f() {\n  return\n}\n", "#t").startswith(
        f"module attributes {{{entry}}} {{\nfunc.func @f()"
    )
    with pytest.raises(ValueError, match="already"):
        attach_device_targets(f"module attributes {{{entry}}} {{\n}}\n", "#t")


def test_cuda_sm90_compiles_without_a_gpu(tmp_path):
    attr = cuda_device_target_attr("sm_90")
    assert attr.startswith('#hal.device.target<"cuda"') and 'arch = "sm_90"' in attr
    out = tmp_path / "m.vmfb"
    result = compile_mlir(LINEAR, "cuda-sm90", out)
    assert not any(f.startswith("--iree-cuda-target") for f in result.flags)
    assert b".target sm_90" in out.read_bytes()  # the PTX inside is for Hopper
