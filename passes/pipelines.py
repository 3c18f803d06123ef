"""The named pass pipelines day0 runs on an exported module, per target.

    parameters-to-globals  checkpoint tensors become IREE parameters (no weights in the vmfb)
    hoist-parameter-stacks stacked expert weights are computed once, in one global, instead of
                           once per function by IREE's const-expr hoisting
    topk-to-linalg-ext     (llvm-cpu) aten.topk becomes iree_linalg_ext.topk (lower index wins
                           ties); the default lowering sorts whole rows, is slow, and miscompiles
                           two topks over a shared causal mask
    indexer-scores-to-cuda-kernel (cuda-sm90; export keeps day0::indexer_scores whole for the
                           targets in KEPT_OPS) the DSA indexer's scores as day0's kernel
    topk-to-radix-select   (cuda-sm90) every topk becomes day0's radix-select kernels (same
                           selection and tie rule); IREE's GPU topk is slow and produced
                           out-of-range indices on masked rows
    fuse-mxfp4-matmul      (llvm-cpu) MXFP4 expert matmuls unpack inside the matmul (one dispatch each)
    mxfp4-to-cuda-matvec   (cuda-sm90) MXFP4 matmuls run day0's MXFP4 kernels: the matvec for
                           decode, the grouped-by-expert tensor-core GEMM for prefill (IREE's
                           CUDA codegen fails on, or miscompiles, the fused linalg form)
    dsa-to-gather-tiles    (llvm-cpu) sparse attention becomes gathered tiles + online softmax
    dsa-to-cuda-kernel     (cuda-sm90) sparse attention runs day0's split-K kernel (the unrolled
                           tiles are a latency-bound dispatch chain on the GPU)
    matmul-to-bf16-terms   (cuda-sm90) prefill matmuls against bf16 weights run on bf16 tensor
                           cores as three bf16 products (f32 accuracy); IREE's f32 matmuls are SIMT
"""

TARGETS = ("llvm-cpu", "cuda-sm90")
DEFAULT_DSA_TILE = 64
# CUDA: every topk takes the radix select. IREE's CUDA lowering of iree_linalg_ext.topk returned
# out-of-range expert indices for the MoE routers' short -inf-masked rows, and the expert gather
# then faulted the device (prefill aborted in `hal.device.queue.dealloca`; H200, IREE 3.13).
RADIX_MIN_ROW = 0


# Targets whose pipeline lowers a decomposable day0 op to its own kernel. CUDA: the indexer
# kernel (f32 FMAs, one lane per head) against IREE's lowering of the model's einsum form, DSA
# decode step on the H200 at 32K / 128K / 1M keys: 265 / 396 / 1137 µs against 861 / 2877 /
# 21089 µs. (A plain matmul + sum form measured 222 / 273 / 455 µs through IREE; a tensor-core
# kernel is the next step.)
KEPT_OPS: dict[str, tuple[str, ...]] = {"cuda-sm90": ("indexer_scores",)}


def kept_ops(target: str) -> tuple[str, ...]:
    """day0 ops this target's pipeline lowers to its own kernels, so export keeps them whole
    (frontend.export.DECOMPOSABLE); other targets get their reference aten body."""
    return KEPT_OPS.get(target, ())


def dsa_tile(selection_width: int, preferred: int = DEFAULT_DSA_TILE) -> int:
    """The largest tile <= preferred that divides the indexer's selection width K."""
    return max(t for t in range(1, min(preferred, selection_width) + 1) if selection_width % t == 0)


def pipeline_for(target: str, selection_width: int | None, preferred_tile: int = DEFAULT_DSA_TILE,
                 dsa_block: int = 0) -> str:
    """The pipeline for a model on `target`; selection_width is the DSA op's K (None: no DSA);
    dsa_block > 0: the model's selection is block-structured in blocks of that many positions
    (CausalLM.dsa_block(), glm5_next's k-pool), so llvm-cpu gathers pool-sized tiles."""
    if target not in TARGETS:
        raise ValueError(f"no pass pipeline for target '{target}' (known: {', '.join(TARGETS)})")
    cuda = target == "cuda-sm90"
    passes = ["parameters-to-globals", "hoist-parameter-stacks"]
    if "indexer_scores" in kept_ops(target):
        passes.append("indexer-scores-to-cuda-kernel")
    if cuda:
        passes.append(f"topk-to-radix-select{{min-size={RADIX_MIN_ROW}}}")
    passes += ["topk-to-linalg-ext", "mxfp4-to-cuda-matvec" if cuda else "fuse-mxfp4-matmul"]
    if selection_width is not None:
        passes.append("dsa-to-cuda-kernel" if cuda
                      else f"dsa-to-gather-tiles{{block={dsa_block}}}" if dsa_block
                      else f"dsa-to-gather-tiles{{tile={dsa_tile(selection_width, preferred_tile)}}}")
    if cuda:
        passes.append("matmul-to-bf16-terms")
    return f"builtin.module({','.join(passes)})"
