"""Pass name -> pass class, imported lazily so that listing passes costs no imports."""

from __future__ import annotations

import importlib

from day0.passes.base import ModulePass, PipelineError

# name -> (module, class); one pass per file, file named after the pass.
_PASSES: dict[str, tuple[str, str]] = {
    "parameters-to-globals": ("day0.passes.parameters_to_globals", "ParametersToGlobals"),
    "hoist-parameter-stacks": ("day0.passes.hoist_parameter_stacks", "HoistParameterStacks"),
    "dsa-to-gather-tiles": ("day0.passes.dsa_to_gather_tiles", "DsaToGatherTiles"),
    "topk-to-linalg-ext": ("day0.passes.topk_to_linalg_ext", "TopkToLinalgExt"),
    "topk-to-radix-select": ("day0.passes.topk_to_radix_select", "TopkToRadixSelect"),
    "indexer-scores-to-cuda-kernel": ("day0.passes.indexer_scores_to_cuda_kernel", "IndexerScoresToCudaKernel"),
    "dsa-to-cuda-kernel": ("day0.passes.dsa_to_cuda_kernel", "DsaToCudaKernel"),
    "mxfp4-to-cuda-matvec": ("day0.passes.mxfp4_to_cuda_matvec", "Mxfp4ToCudaMatvec"),
    "fuse-mxfp4-matmul": ("day0.passes.fuse_mxfp4_matmul", "FuseMxfp4Matmul"),
    "moe-route-to-cuda-kernel": ("day0.passes.moe_route_to_cuda_kernel", "MoeRouteToCudaKernel"),
    "vision-attention-to-cuda-kernel": ("day0.passes.vision_attention_to_cuda_kernel", "VisionAttentionToCudaKernel"),
    "matmul-to-cuda-linear": ("day0.passes.matmul_to_cuda_linear", "MatmulToCudaLinear"),
    "matmul-to-bf16-terms": ("day0.passes.matmul_to_bf16_terms", "MatmulToBf16Terms"),
    "materialize-to-barrier": ("day0.passes.materialize_to_barrier", "MaterializeToBarrier"),
    "to-device-transfer": ("day0.passes.to_device_transfer", "ToDeviceTransfer"),
}


def pass_names() -> list[str]:
    return sorted(_PASSES)


def get_pass_class(name: str) -> type[ModulePass]:
    if name not in _PASSES:
        raise PipelineError(f"unknown pass '{name}' (known: {', '.join(pass_names())})")
    module, cls = _PASSES[name]
    pass_cls = getattr(importlib.import_module(module), cls)
    assert pass_cls.name == name, f"{module}.{cls}.name is '{pass_cls.name}', registered as '{name}'"
    return pass_cls
