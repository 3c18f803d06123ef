"""moe-route-to-cuda-kernel: run `torch.day0.moe_route` (DeepSeek's group-limited sigmoid routing
after the router's linear) as day0's CUDA kernel (lowering/kernels/moe_route.cu), one IREE external
dispatch, on the cuda-sm90 target.

Only the CUDA pipeline sees the op: export decomposes it for every other target into its
reference (sigmoid, a top-2 per group, two top-k's, masks, a gather, the normalization), which
IREE made about eight dispatches a layer, three of them top-k kernels. A decode step is bound by
its launches (~5 µs of host time each; docs/perf.md, "The Engine at real size on the H200").

Precondition: every

    %w, %e = torch.operator "torch.day0.moe_route"(%logits, %bias, %groups, %topk_group, %top_k,
                                                   %normalize, %scaling)
         : (!torch.vtensor<[S,E],f32>, !torch.vtensor<[E],f32>, !torch.int, !torch.int, !torch.int,
            !torch.bool, !torch.float) -> (!torch.vtensor<[S,k],f32>, !torch.vtensor<[S,k],si64>)

keeps the op's contract (passes/sites/moe_route.py: static E, S static or dynamic, the scalars
constants) and the kernel's limits (kernel_geometry.moe_route_limits: E <= 1024, at most 32
groups of at least two experts, top_k <= 32).
Rewrite: a call of @day0_moe_route_E<E>_G<groups>_g<topk_group>_k<top_k>_n<0|1>_s<scale bits>
whose body is one flow.dispatch of day0_moe_route over ceil(S / 8) CTAs (a warp a token).

Numerics: the kernel's sigmoid is 1 / (1 + expf(-x)), IREE's the same expression; the selection is
the reference's set with ties to the lower expert index (as topk-to-linalg-ext and the radix
select); the chosen experts come out largest first; the normalizing sum adds in a warp's
butterfly order, so weights may differ from IREE's in the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import ir
from day0.lowering import kernel_geometry as kg
from day0.passes.extern_dispatch import KernelCallPass, scale_tag, tensor_text
from day0.passes.sites.moe_route import OP_NAME, MoeRouteSite, match_moe_route
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE = kg.MOE_ROUTE.executable
ENTRY = kg.MOE_ROUTE.entries[0].name


def function_name(E: int, groups: int, topk_group: int, top_k: int, normalize: bool, scaling: float) -> str:
    return f"{ENTRY}_E{E}_G{groups}_g{topk_group}_k{top_k}_n{int(normalize)}_{scale_tag(scaling)}"


def function_text(E: int, groups: int, topk_group: int, top_k: int, normalize: bool, scaling: float) -> str:
    x_t, b_t = f"tensor<?x{E}xf32>", f"tensor<{E}xf32>"
    w_t, e_t = f"tensor<?x{top_k}xf32>", f"tensor<?x{top_k}xi64>"
    return f"""
  func.func private @{function_name(E, groups, topk_group, top_k, normalize, scaling)}(%x: {x_t}, %b: {b_t}) -> ({w_t}, {e_t}) {{
    %c0 = arith.constant 0 : index
    %s = tensor.dim %x, %c0 : {x_t}
    %per = arith.constant {kg.MOE_ROUTE_ROWS_PER_CTA} : index
    %gx = arith.ceildivui %s, %per : index
    %S = arith.index_cast %s : index to i32
    %E = arith.constant {E} : i32
    %G = arith.constant {groups} : i32
    %g = arith.constant {topk_group} : i32
    %k = arith.constant {top_k} : i32
    %n = arith.constant {int(normalize)} : i32
    %scaling = arith.constant {kg.f32_bits(scaling)} : i32
    %w, %e = flow.dispatch @{EXECUTABLE}::@{ENTRY}[%gx](%S, %E, %G, %g, %k, %n, %scaling, %x, %b)
        : (i32, i32, i32, i32, i32, i32, i32, {x_t}{{%s}}, {b_t}) -> ({w_t}{{%s}}, {e_t}{{%s}})
    return %w, %e : {w_t}, {e_t}
  }}"""


@dataclass(frozen=True)
class MoeRouteToCudaKernel(KernelCallPass):
    """No options."""

    name = "moe-route-to-cuda-kernel"

    op_names = (OP_NAME,)
    kernels = (kg.MOE_ROUTE,)
    match = staticmethod(match_moe_route)
    function_name = staticmethod(function_name)
    function_text = staticmethod(function_text)

    def key(self, site: MoeRouteSite) -> tuple:
        return (site.E, site.groups, site.topk_group, site.top_k, site.normalize, site.scaling)

    @staticmethod
    def refuse(site: MoeRouteSite) -> str | None:
        why = kg.moe_route_limits(site.E, site.groups, site.topk_group, site.top_k)
        return None if why is None else f"moe_route: the CUDA kernel takes {why}"

    @staticmethod
    def rewrite(site: MoeRouteSite, fn: str) -> None:
        """The call of `fn` on the logits (rows cast to dynamic) and the bias."""
        op = site.op
        b = TorchBuilder(op)
        S, E, k = site.S, site.E, site.top_k
        x = b.op("torch_c.to_builtin_tensor", [op.operands[0]], tensor_text((S, E), "f32"))
        if S is not None:
            x = b.op("tensor.cast", [x], tensor_text((None, E), "f32"))
        bias = b.op("torch_c.to_builtin_tensor", [op.operands[1]], tensor_text((E,), "f32"))
        results = [tensor_text((None, k), "f32"), tensor_text((None, k), "i64")]
        w, e = b.op_results("func.call", [x, bias], results, {"callee": ir.FlatSymbolRefAttr.get(fn)})
        if S is not None:
            w = b.op("tensor.cast", [w], tensor_text((S, k), "f32"))
            e = b.op("tensor.cast", [e], tensor_text((S, k), "i64"))
        replace_op(
            op,
            [
                b.op("torch_c.from_builtin_tensor", [w], TensorType((S, k), "f32")),
                b.op("torch_c.from_builtin_tensor", [e], TensorType((S, k), "si64")),
            ],
        )
