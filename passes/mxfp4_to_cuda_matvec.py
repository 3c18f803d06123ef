"""mxfp4-to-cuda-matvec: run `torch.day0.mxfp4_moe` / `mxfp4_linear` as day0's CUDA MXFP4 kernels
(lowering/kernels/mxfp4_matvec.cu, mxfp4_moe_gemm.cu), IREE external dispatches, on the cuda-sm90
target.

Why not fuse-mxfp4-matmul's linalg form on CUDA: IREE 3.13 fails to compile it there with its
default reduction pipeline ("failed to distribute", every size tried from 256×256 up), and with
that pipeline switched off it compiles but computes wrong results on the H200 (relative error
0.8–1.4 for a 4096×4096 matvec and for the MoE form; correct only at 256×256). The kernels read
each 16-byte MX block (32 codes) with its scale byte and gather the chosen experts' rows
themselves (no gathered weight copy).

Precondition: the mxfp4 ops keep their contract (passes/sites/mxfp4.py: f32 x [M|T, K], ui8
packed/scales with static dims, K a multiple of 32), plus K <= 8192 where the matvec runs (it
caches x in shared memory). Rewrite:
    %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e)    # [T, k, N]
 -> %r = func.call @day0_mxfp4_moe_<E>x<N>x<K>_k<k>(xb, pb, sb, eb)  (builtin tensors, T dynamic)
with the function holding one flow.dispatch of @day0_mxfp4_matvec over the grid (ceil(N/32), T·k):
one (token, slot) row a CTA column, on CUDA cores. That suits decode (T = 1); in prefill every
row re-reads and re-decodes its expert's weights (the largest kernel of a prefill before the GEMM:
docs/perf.md, the e2e section). So a moe site whose T is dynamic, or whose static row count T·k
fills at least one 64-row tile, calls @day0_mxfp4_moe_gemm_<E>x<N>x<K>_k<k> instead: one
flow.dispatch of @day0_mxfp4_moe_gemm over (ceil(N/64), E), push constants K, N, k, E, T·k; a
CTA collects its expert's rows and multiplies 64 of them at a time on tensor cores (x as two
bf16 terms: 16 significant bits, f32 sums). A static site with few rows an expert (a batched
decode step: T·k <= 16·E) calls @day0_mxfp4_moe_gemm_few_<E>x<N>x<K>_k<k>, the same dispatch of
the kernel @day0_mxfp4_moe_gemm_few, which takes the rows 16 at a time with the weights as the
MMA's 16-row side (kernel_geometry.mxfp4_kernel decides). One sequence's decode keeps the matvec:
both of its moe calls have k rows (gate_up T = 1; down takes the k (token, slot) rows as k
tokens with k = 1). The option gemm=false keeps every site on the matvec; few=false sends the
few-rows sites to the 64-row GEMM.
mxfp4_linear is the matvec with one expert: packed [1, N, K/2], experts all 0, k = 1.
mxfp4_moe_swiglu (one token's down projection from its experts' gate_up rows [k, 2K]) calls
@day0_mxfp4_moe_swiglu_<E>x<N>x<K>_k1[_l<limit bits>]: the matvec's dispatch of its entry
@day0_mxfp4_matvec_swiglu, which stages x = silu(min(gate, limit)) · clamp(up, ±limit) from the
row's halves, with the limit's f32 bits a fifth push constant; only sites with fewer than 64
static rows (the matvec's) are taken, the others refused.
Afterwards no mxfp4 op is left. The kernels' ABI and grids: lowering/kernel_geometry.py, sections
mxfp4_matvec.cu and mxfp4_moe_gemm.cu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from day0.frontend.ir import ir
from day0.lowering import kernel_geometry as kg
from day0.passes.extern_dispatch import KernelCallPass, tensor_text
from day0.passes.sites.mxfp4 import OP_NAMES, Mxfp4Site, match_mxfp4
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE, GEMM_EXECUTABLE = kg.MXFP4_MATVEC.executable, kg.MXFP4_MOE_GEMM.executable


def function_name(moe: bool, E: int, N: int, K: int, k: int, kernel: str = "matvec", limit: float | None = None) -> str:
    """limit: an mxfp4_moe_swiglu site's clamp (inf: none); None: not such a site."""
    if kernel != "matvec":
        return f"{_gemm_entry(kernel)}_{E}x{N}x{K}_k{k}"
    if limit is not None:
        clamp = "" if math.isinf(limit) else f"_l{kg.f32_bits(limit) & 0xFFFFFFFF:08x}"
        return f"day0_mxfp4_moe_swiglu_{E}x{N}x{K}_k{k}{clamp}"
    return f"day0_mxfp4_moe_{E}x{N}x{K}_k{k}" if moe else f"day0_mxfp4_linear_{N}x{K}"


def _gemm_entry(kernel: str) -> str:
    return {"gemm": "day0_mxfp4_moe_gemm", "few": "day0_mxfp4_moe_gemm_few"}[kernel]


def function_text(moe: bool, E: int, N: int, K: int, k: int, kernel: str = "matvec", limit: float | None = None) -> str:
    """moe: (x ?xK f32, packed ExNxK/2 i8, scales ExNxK/32 i8, experts ?xk i64) -> ?xkxN f32;
    linear: (x ?xK, packed NxK/2, scales NxK/32) -> ?xN. kernel (moe only): "matvec", or one of
    the grouped GEMMs ("gemm", "few"). limit (an mxfp4_moe_swiglu site, the matvec only): x is
    gate_up ?x2K, which the kernel's swiglu entry stages through the SwiGLU clamped at limit."""
    if kernel != "matvec":
        return _gemm_function_text(E, N, K, k, kernel)
    KB, G = K // 2, K // 32
    XK = K if limit is None else 2 * K
    e_dims = (E, N) if moe else (N,)
    head = f"%x: tensor<?x{XK}xf32>, %p: {tensor_text((*e_dims, KB), 'i8')}, %s: {tensor_text((*e_dims, G), 'i8')}" + (
        f", %e: tensor<?x{k}xi64>" if moe else ""
    )
    result = f"tensor<?x{k}x{N}xf32>" if moe else f"tensor<?x{N}xf32>"
    lines = [
        f"  func.func private @{function_name(moe, E, N, K, k, limit=limit)}({head}) -> {result} {{",
        "    %c0 = arith.constant 0 : index",
        f"    %t = tensor.dim %x, %c0 : tensor<?x{XK}xf32>",
        f"    %ck = arith.constant {k} : index",
        "    %rows = arith.muli %t, %ck : index",
        f"    %gx = arith.constant {kg.cdiv(N, kg.MXFP4_ROWS_PER_CTA)} : index",
    ]
    if moe:
        lines.append(f"    %ef = tensor.collapse_shape %e [[0, 1]] : tensor<?x{k}xi64> into tensor<?xi64>")
        pw, sw = "%p", "%s"
    else:  # one expert: weights as [1, N, ...], experts all 0
        lines += [
            f"    %pw = tensor.expand_shape %p [[0, 1], [2]] output_shape [1, {N}, {KB}] : "
            f"tensor<{N}x{KB}xi8> into tensor<1x{N}x{KB}xi8>",
            f"    %sw = tensor.expand_shape %s [[0, 1], [2]] output_shape [1, {N}, {G}] : "
            f"tensor<{N}x{G}xi8> into tensor<1x{N}x{G}xi8>",
            "    %zero = arith.constant 0 : i64",
            "    %ee = tensor.empty(%rows) : tensor<?xi64>",
            "    %ef = linalg.fill ins(%zero : i64) outs(%ee : tensor<?xi64>) -> tensor<?xi64>",
        ]
        pw, sw = "%pw", "%sw"
    ne = E if moe else 1
    lines += [
        f"    %K = arith.constant {K} : i32",
        f"    %N = arith.constant {N} : i32",
        f"    %k = arith.constant {k} : i32",
        f"    %E = arith.constant {ne} : i32",
    ]
    entry, consts, types = "day0_mxfp4_matvec", "%K, %N, %k, %E", "i32, i32, i32, i32"
    if limit is not None:  # the clamp's f32 bits, a fifth push constant
        lines.append(f"    %L = arith.constant {kg.f32_bits(limit)} : i32")
        entry, consts, types = "day0_mxfp4_matvec_swiglu", consts + ", %L", types + ", i32"
    lines.append(
        f"    %o = flow.dispatch @{EXECUTABLE}::@{entry}[%gx, %rows]({consts}, %x, {pw}, {sw}, %ef)"
        f" : ({types}, tensor<?x{XK}xf32>{{%t}}, tensor<{ne}x{N}x{KB}xi8>, "
        f"tensor<{ne}x{N}x{G}xi8>, tensor<?xi64>{{%rows}}) -> tensor<?x{N}xf32>{{%rows}}"
    )
    if moe:
        lines += [
            f"    %r = tensor.expand_shape %o [[0, 1], [2]] output_shape [%t, {k}, {N}] : "
            f"tensor<?x{N}xf32> into {result}",
            f"    return %r : {result}",
        ]
    else:
        lines.append(f"    return %o : {result}")
    lines.append("  }")
    return "\n" + "\n".join(lines)


def _gemm_function_text(E: int, N: int, K: int, k: int, kernel: str) -> str:
    p_t, s_t = tensor_text((E, N, K // 2), "i8"), tensor_text((E, N, K // 32), "i8")
    result = f"tensor<?x{k}x{N}xf32>"
    entry = _gemm_entry(kernel)
    return f"""
  func.func private @{function_name(True, E, N, K, k, kernel)}(%x: tensor<?x{K}xf32>, %p: {p_t}, %s: {s_t},
                                                           %e: tensor<?x{k}xi64>) -> {result} {{
    %c0 = arith.constant 0 : index
    %t = tensor.dim %x, %c0 : tensor<?x{K}xf32>
    %ck = arith.constant {k} : index
    %rows = arith.muli %t, %ck : index
    %gx = arith.constant {kg.cdiv(N, kg.MXFP4_GEMM_COLS_PER_CTA)} : index
    %ge = arith.constant {E} : index
    %ef = tensor.collapse_shape %e [[0, 1]] : tensor<?x{k}xi64> into tensor<?xi64>
    %K = arith.constant {K} : i32
    %N = arith.constant {N} : i32
    %k = arith.constant {k} : i32
    %E = arith.constant {E} : i32
    %R = arith.index_cast %rows : index to i32
    %o = flow.dispatch @{GEMM_EXECUTABLE}::@{entry}[%gx, %ge](%K, %N, %k, %E, %R, %x, %p, %s, %ef)
        : (i32, i32, i32, i32, i32, tensor<?x{K}xf32>{{%t}}, {p_t}, {s_t}, tensor<?xi64>{{%rows}}) -> tensor<?x{N}xf32>{{%rows}}
    %r = tensor.expand_shape %o [[0, 1], [2]] output_shape [%t, {k}, {N}] : tensor<?x{N}xf32> into {result}
    return %r : {result}
  }}"""


@dataclass(frozen=True)
class Mxfp4ToCudaMatvec(KernelCallPass):
    """Options:
    gemm  mxfp4_moe sites with T dynamic or T·k >= 64 run a grouped tensor-core GEMM (default
          true); false keeps every site on the matvec.
    few   static sites with few rows an expert run the few-rows GEMM (default true); false gives
          them the 64-row one.
    """

    name = "mxfp4-to-cuda-matvec"
    gemm: bool = True
    few: bool = True

    op_names = tuple(OP_NAMES)
    match = staticmethod(match_mxfp4)
    function_name = staticmethod(function_name)
    function_text = staticmethod(function_text)

    def key(self, s: Mxfp4Site) -> tuple:
        return (
            s.moe,
            s.E if s.moe else 1,
            s.N,
            s.K,
            s.k if s.moe else 1,
            self.kernel(s),
            s.limit if s.swiglu else None,
        )

    def kernel_sets(self, sites: list) -> tuple:
        """The matvec, the grouped GEMMs or both: those these sites run."""
        gemm = {self.kernel(s) != "matvec" for s in sites}
        return tuple(kg.MXFP4_MOE_GEMM if g else kg.MXFP4_MATVEC for g in sorted(gemm))

    def refuse(self, site: Mxfp4Site) -> str | None:
        """The matvec caches x's row in shared memory: K <= MXFP4_MAX_K where it runs. The SwiGLU
        form has the matvec's entry alone: one token's rows (models/moe.py emits it there)."""
        if self.kernel(site) == "matvec" and site.K > kg.MXFP4_MAX_K:
            return (
                f"{site.label}: K={site.K} is larger than the CUDA matvec "
                f"kernel's {kg.MXFP4_MAX_K} (x is cached in shared memory)"
            )
        if site.swiglu and kg.mxfp4_kernel(True, site.lead, site.k, site.E) != "matvec":
            rows = "a dynamic count of" if site.lead is None else f"{site.lead * site.k}"
            return (
                f"mxfp4_moe_swiglu: {rows} rows; its kernel is the matvec's, for fewer than "
                f"{kg.MXFP4_GEMM_MIN_ROWS} static rows (one token's experts)"
            )
        return None

    def kernel(self, site: Mxfp4Site) -> str:
        """matvec | gemm | few, under this pass's options."""
        kernel = kg.mxfp4_kernel(site.moe, site.lead, site.k, site.E if site.moe else 1)
        if not self.gemm:
            return "matvec"
        return "gemm" if kernel == "few" and not self.few else kernel

    @staticmethod
    def rewrite(site: Mxfp4Site, fn: str) -> None:
        op = site.op
        b = TorchBuilder(op)
        x, packed, scales, *rest = op.operands
        K, N, lead = site.K, site.N, site.lead
        xb = b.op("torch_c.to_builtin_tensor", [x], tensor_text(TensorType.of(x).dims, "f32"))
        if lead is not None:
            xb = b.op("tensor.cast", [xb], f"tensor<?x{2 * K if site.swiglu else K}xf32>")
        args = [xb]
        for v in (packed, scales):
            args.append(b.op("torch_c.to_builtin_tensor", [v], tensor_text(TensorType.of(v).dims, "i8")))
        if site.moe:
            experts = rest[0]
            et = TensorType.of(experts)
            if et.dtype != "si64":
                experts = b.to_dtype(experts, TensorType(et.dims, "si64"))
            eb = b.op("torch_c.to_builtin_tensor", [experts], tensor_text(et.dims, "i64"))
            if lead is not None:
                eb = b.op("tensor.cast", [eb], f"tensor<?x{site.k}xi64>")
            args.append(eb)
            dyn, out_dims = f"tensor<?x{site.k}x{N}xf32>", (lead, site.k, N)
        else:
            dyn, out_dims = f"tensor<?x{N}xf32>", (lead, N)
        y = b.op("func.call", args, dyn, {"callee": ir.FlatSymbolRefAttr.get(fn)})
        if lead is not None:
            y = b.op("tensor.cast", [y], tensor_text(out_dims, "f32"))
        replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType(out_dims, "f32"))])
