"""The named pass pipelines day0 runs on an exported module, per target."""

# parameters-to-globals: checkpoint tensors become IREE parameters (no weights in the vmfb).
# topk-to-linalg-ext: aten.topk becomes iree_linalg_ext.topk (lower index wins ties); the default
#   lowering sorts whole rows, is slow, and miscompiles two topks over a shared causal mask.
# dsa-to-gather-tiles: sparse attention becomes gathered tiles + online softmax.
TARGETS = ("llvm-cpu", "cuda-sm90")
DEFAULT_DSA_TILE = 64


def dsa_tile(selection_width: int, preferred: int = DEFAULT_DSA_TILE) -> int:
    """The largest tile <= preferred that divides the indexer's selection width K."""
    return max(t for t in range(1, min(preferred, selection_width) + 1) if selection_width % t == 0)


def pipeline_for(target: str, selection_width: int, preferred_tile: int = DEFAULT_DSA_TILE) -> str:
    if target not in TARGETS:
        raise ValueError(f"no pass pipeline for target '{target}' (known: {', '.join(TARGETS)})")
    tile = dsa_tile(selection_width, preferred_tile)
    return f"builtin.module(parameters-to-globals,topk-to-linalg-ext,dsa-to-gather-tiles{{tile={tile}}})"
