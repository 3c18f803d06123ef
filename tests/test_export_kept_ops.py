"""Export keeps a decomposable day0 op whole only for targets that lower it themselves
(the target's kept_ops, lowering/targets.py); elsewhere it becomes its reference aten body. The CUDA pipeline
with the indexer kernel switched on compiles."""

import pytest

from day0.frontend.export import DECOMPOSABLE, export_model
from day0.lowering.targets import TARGETS


def kept_ops(target: str) -> tuple[str, ...]:
    return TARGETS[target].kept_ops


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    from day0.models.registry import build_eager
    from day0.tools.checkpoints.demo import ensure_demo_checkpoint

    return build_eager(ensure_demo_checkpoint(tmp_path_factory.mktemp("demo") / "ckpt"), 64)


@pytest.fixture(scope="module")
def exported(demo_model):
    """export_model(demo_model, 64, keep=keep).mlir, once per `keep` in this module."""
    cache = {}

    def get(keep=()):
        if keep not in cache:
            cache[keep] = export_model(demo_model, 64, keep=keep).mlir
        return cache[keep]

    return get


def test_a_kept_op_stays_whole_and_others_get_its_body(demo_model, exported):
    assert kept_ops("llvm-cpu") == ()
    assert kept_ops("cuda-sm90") == (
        "indexer_scores",
        "moe_route",
        "materialize",
        "vision_attention",
        "mxfp4_moe_swiglu",
    )
    layers, funcs = demo_model.cfg.num_hidden_layers, 3  # prefill, decode, prefill_first
    kept = exported(("indexer_scores",))
    # every step of the dense entry points has one key range for its queries: the causal form
    assert kept.count('torch.operator "torch.day0.indexer_scores_causal"') == layers * funcs
    cpu = exported(kept_ops("llvm-cpu"))
    assert "torch.day0.indexer_scores" not in cpu
    assert cpu.count("torch.aten.relu") == layers * funcs  # the reference body's ReLU


def test_unknown_kept_op_is_refused(demo_model):
    with pytest.raises(
        ValueError,
        match=r"cannot keep \['nope'\].*\['indexer_scores', 'materialize', 'moe_route', 'mxfp4_moe_swiglu', 'vision_attention'\]",
    ):
        export_model(demo_model, 64, keep=("nope",))
    assert set(DECOMPOSABLE) == {"indexer_scores", "moe_route", "materialize", "vision_attention", "mxfp4_moe_swiglu"}


def test_the_router_is_one_op_where_kept(demo_model, exported):
    """Kept, each MoE layer's routing after its linear is one `day0::moe_route` (no router top-k's
    left: only the indexer's); elsewhere its reference body, three top-k's a MoE layer."""
    cfg = demo_model.cfg
    funcs = 3  # prefill, decode, prefill_first
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    assert moe_layers > 0
    kept = exported(("moe_route",))
    assert kept.count('torch.operator "torch.day0.moe_route"') == moe_layers * funcs
    cpu = exported(())
    assert "torch.day0.moe_route" not in cpu
    assert cpu.count("torch.aten.topk") - kept.count("torch.aten.topk") == 3 * moe_layers * funcs


def test_one_tokens_expert_down_projection_takes_the_swiglu_op_where_kept(workdir):
    """Kept, the decode step's (one token) down projection of every MXFP4 MoE layer is one
    `day0::mxfp4_moe_swiglu` from its experts' gate_up rows; the prompt functions' stay
    mxfp4_moe after a SwiGLU of their own. (Not kept, the op is its reference body:
    test_the_swiglu_op_is_its_reference.)"""
    from conftest import shared_checkpoint

    from day0.models.registry import build_eager

    model = build_eager(shared_checkpoint(workdir, "ds-sparse-mxfp4"), 64)
    cfg = model.cfg
    moe_layers, funcs = cfg.num_hidden_layers - cfg.first_k_dense_replace, 3  # prefill, decode, prefill_first
    assert moe_layers > 0 and cfg.day0_expert_format == "mxfp4"
    kept = export_model(model, 64, keep=("mxfp4_moe_swiglu",)).mlir
    assert kept.count('torch.operator "torch.day0.mxfp4_moe_swiglu"') == moe_layers  # decode only
    # gate_up everywhere, down in the prompt functions
    assert kept.count('torch.operator "torch.day0.mxfp4_moe"') == (2 * funcs - 1) * moe_layers


def test_the_swiglu_op_is_its_reference():
    """The op's eager kernel (what the CUDA kernel is checked against: gpu_kernel_times `moe`) is
    swiglu then mxfp4_moe, clamped or not."""
    import torch

    from day0.frontend import ops
    from day0.models.layers import swiglu

    g = torch.Generator().manual_seed(0)
    gate_up = 4 * torch.randn(3, 128, generator=g)
    packed = torch.randint(0, 256, (4, 16, 32), dtype=torch.uint8, generator=g)
    scales = torch.randint(120, 130, (4, 16, 2), dtype=torch.uint8, generator=g)
    experts = torch.tensor([[2], [0], [3]])
    for limit in (None, 7.0):
        want = torch.ops.day0.mxfp4_moe(swiglu(*gate_up.chunk(2, -1), limit), packed, scales, experts)
        got = ops.mxfp4_moe_swiglu(gate_up, packed, scales, experts, limit)
        with ops.keeping(("mxfp4_moe_swiglu",)):
            kept = ops.mxfp4_moe_swiglu(gate_up, packed, scales, experts, limit)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(kept, want, rtol=0, atol=0)
    assert not torch.equal(ops.mxfp4_moe_swiglu(gate_up, packed, scales, experts, 7.0), want.new_zeros(3, 1, 16))


def test_the_router_op_is_its_reference():
    """The custom op's eager kernel is the reference body, tie-breaking included."""
    import torch

    from day0.frontend import ops

    g = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(5, 16, generator=g), torch.randn(16, generator=g) * 0.1
    logits[0, 3] = logits[0, 4]  # a tie inside a group
    args = (logits, bias, 4, 2, 3, True, 2.5)
    w, e = torch.ops.day0.moe_route(*args)
    ref_w, ref_e = ops.moe_route_reference(*args)
    torch.testing.assert_close((w, e), (ref_w, ref_e))
    assert w.shape == (5, 3) and e.dtype == torch.int64
    chosen_groups = (e // 4).tolist()
    assert all(len(set(row)) <= 2 for row in chosen_groups)  # within topk_group=2 groups
    torch.testing.assert_close(w.sum(-1), torch.full((5,), 2.5))


def test_keeping_does_not_leak_between_exports(demo_model, exported):
    """Exports after others that kept ops (this module's, cached) are the same text again."""
    assert "torch.day0.indexer_scores" in exported(("indexer_scores",))
    assert export_model(demo_model, 64).mlir == exported(())
    assert export_model(demo_model, 64, keep=("indexer_scores",)).mlir == exported(("indexer_scores",))


def test_batched_decode_steps_keep_the_rows_form(demo_model):
    """Every paged decode step (one key range per query), of one sequence too, scores through the
    pool's rows (`day0::indexer_scores_rows`): no gather of the sequence's keys; a prompt chunk
    (one key range for all of its queries) reads the pool through its slots' rows, masked by the
    op (`day0::indexer_scores_causal`): no gathered key range, no [S, L] mask or masked copy."""
    from day0.frontend.export import PagedExport

    layers = demo_model.cfg.num_hidden_layers
    mlir = export_model(demo_model, 64, keep=("indexer_scores",), paged=PagedExport(4, (1, 3))).mlir
    assert mlir.count('torch.operator "torch.day0.indexer_scores_rows"') == 2 * layers  # decode_1, decode_3
    assert mlir.count('torch.operator "torch.day0.indexer_scores_causal"(') >= layers  # the prompt chunk
    assert 'torch.operator "torch.day0.indexer_scores"(' not in mlir  # no gathered key range left
    # (a target that keeps nothing gets the reference bodies: test_a_kept_op_stays_whole_and_others_get_its_body)


def test_the_rows_form_is_the_gathered_form():
    import torch

    from day0.frontend import ops

    g = torch.Generator().manual_seed(0)
    q, w = torch.randn(3, 4, 16, generator=g), torch.randn(3, 4, generator=g)
    pool = torch.randn(40, 16, generator=g).to(torch.bfloat16)
    rows = torch.randint(0, 40, (3, 9), generator=g)
    got = ops.indexer_scores(q, pool, w, 0.25, rows)
    with ops.keeping(("indexer_scores",)):
        kept = ops.indexer_scores(q, pool, w, 0.25, rows)
    for s in range(3):
        want = ops.indexer_scores_reference(q[s : s + 1], pool[rows[s]], w[s : s + 1], 0.25)
        torch.testing.assert_close(got[s : s + 1], want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kept, got)


def test_vision_attention_is_kept_at_the_kernels_head_dims():
    """frontend/ops.py keeps day0::vision_attention at the head dims the CUDA kernel has entries for
    (the frontend imports nothing from lowering/, so the two lists are kept equal here)."""
    from day0.frontend import ops
    from day0.lowering import kernel_geometry as kg

    assert ops.VISION_HEAD_DIMS == kg.VISION_HEAD_DIMS
