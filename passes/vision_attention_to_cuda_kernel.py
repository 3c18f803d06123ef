"""vision-attention-to-cuda-kernel: run `torch.day0.vision_attention` (the vision tower's attention
within segments) as day0's flash-style CUDA kernel (lowering/kernels/vision_attention.cu), on the
cuda-sm90 target.

Why: IREE 3.13 runs this attention, fused (iree_linalg_ext.attention) or decomposed, at 4-9× the
time of PyTorch's bf16 SDPA in bf16 and 8-30× in f32, and the masked dense form computes all P²
scores of several images side by side (docs/perf.md, "Images"). The kernel visits only the keys
of each query tile's segments, on tensor cores.

Precondition: every vision_attention keeps the op's contract (passes/sites/vision_attention.py:
q, k, v [P, H, D] f32, segments [P] si64, static shapes) with D one of the kernel's head dims
(kernel_geometry.VISION_HEAD_DIMS; export keeps the op only there).
Rewrite:
    %o = torch.operator "torch.day0.vision_attention"(%q, %k, %v, %seg, %scale)
 -> %o = func.call @day0_vision_attention_P<P>_H<H>_D<D>_t<terms>_s<scale bits>(qb, kb, vb, segb)
whose body splits q, k and v into `terms` bf16 terms (one linalg.generic each, stacked [terms,
P, H, D]: matmul_to_bf16_terms.stacked_terms, which IREE fuses into their producers) and
dispatches @day0_vision_attention::@day0_vision_attention_d<D>_t<terms> over (ceil(P / 128), H)
with push constants P, H and the scale's bits. The result is f32.

Option terms: 1 (default: q, k, v and P in bf16, FlashAttention's accuracy, as transformers'
bf16 tower computes) or 2 (~2^-16 of each factor left out).
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import ir
from day0.lowering import kernel_geometry as kg
from day0.passes.extern_dispatch import KernelCallPass, scale_tag, tensor_text
from day0.passes.matmul_to_bf16_terms import stacked_terms
from day0.passes.sites.vision_attention import OP_NAME, VisionAttentionSite, match_vision_attention
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE = kg.VISION_ATTENTION.executable


def function_name(P: int, H: int, D: int, terms: int, scale: float) -> str:
    return f"day0_vision_attention_P{P}_H{H}_D{D}_t{terms}_{scale_tag(scale)}"


def function_text(P: int, H: int, D: int, terms: int, scale: float) -> str:
    x_t, s_t = tensor_text((P, H, D), "f32"), tensor_text((P,), "i64")
    t_t = tensor_text((terms, P, H, D), "bf16")
    split = "\n".join(
        line
        for name in ("q", "k", "v")
        for line in stacked_terms(f"%{name}", (P, H, D), 0, terms, f"{name}s", collapse=False)
    )
    gx, gy, _ = kg.vision_grid(P, H)
    return f"""
  func.func private @{function_name(P, H, D, terms, scale)}(%q: {x_t}, %k: {x_t}, %v: {x_t}, %seg: {s_t}) -> {x_t} {{
{split}
    %gx = arith.constant {gx} : index
    %gy = arith.constant {gy} : index
    %P = arith.constant {P} : i32
    %H = arith.constant {H} : i32
    %scale = arith.constant {kg.f32_bits(scale)} : i32
    %o = flow.dispatch @{EXECUTABLE}::@{kg.vision_entry(D, terms)}[%gx, %gy](%P, %H, %scale, %qs, %ks, %vs, %seg)
        : (i32, i32, i32, {t_t}, {t_t}, {t_t}, {s_t}) -> {x_t}
    return %o : {x_t}
  }}"""


@dataclass(frozen=True)
class VisionAttentionToCudaKernel(KernelCallPass):
    """Options:
    terms  bf16 terms of q, k, v and the probabilities: 1 (default) or 2 (module docstring).
    """

    name = "vision-attention-to-cuda-kernel"
    terms: int = 1

    op_names = (OP_NAME,)
    kernels = (kg.VISION_ATTENTION,)
    match = staticmethod(match_vision_attention)
    function_name = staticmethod(function_name)
    function_text = staticmethod(function_text)

    def __post_init__(self):
        if self.terms not in kg.VISION_TERMS:
            raise ValueError(f"terms must be one of {', '.join(map(str, kg.VISION_TERMS))}, got {self.terms}")
        super().__post_init__()

    def key(self, site: VisionAttentionSite) -> tuple:
        return (site.P, site.H, site.D, self.terms, site.scale)

    @staticmethod
    def refuse(site: VisionAttentionSite) -> str | None:
        """What the kernel cannot take: a head dim without an entry."""
        if site.D not in kg.VISION_HEAD_DIMS:
            dims = ", ".join(map(str, kg.VISION_HEAD_DIMS))
            return f"vision_attention: the CUDA kernel takes head dims {dims}, got D={site.D}"
        return None

    @staticmethod
    def rewrite(site: VisionAttentionSite, fn: str) -> None:
        op = site.op
        b = TorchBuilder(op)
        dims = (site.P, site.H, site.D)
        args = [b.op("torch_c.to_builtin_tensor", [v], tensor_text(dims, "f32")) for v in op.operands[:3]]
        args.append(b.op("torch_c.to_builtin_tensor", [op.operands[3]], tensor_text(dims[:1], "i64")))
        y = b.op("func.call", args, tensor_text(dims, "f32"), {"callee": ir.FlatSymbolRefAttr.get(fn)})
        replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType(dims, "f32"))])
