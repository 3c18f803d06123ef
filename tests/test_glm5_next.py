"""glm5_next (models/glm5_next.py) against transformers' Glm5NextForConditionalGeneration (text
input) on the tiny checkpoints of tests/parity_configs.py: the k-pool selection itself, shared
indexer layers, multi-turn continuation, KDA's chunked prefill against its recurrence, the state
layout, config errors, MXFP4 experts; and the compiled artifact (llvm-cpu) over several turns.
(tests/test_parity.py runs the teacher-forced logits, eager and compiled, and greedy generation
for these configs like every other.)"""

import json

import numpy as np
import pytest
import torch
from parity_configs import DECODE_STEPS, PARITY, rel_err, sequence

TOL = 1e-3
GLM = sorted(n for n in PARITY if PARITY[n]["arch"] == "glm5_next")


def _expected(reference, name):
    ref = reference(name)
    ids = sequence(name, ref.config.text_config.vocab_size)
    with torch.no_grad():
        return ids, ref(ids[None], use_cache=False).logits[0]


def _model(checkpoint, name):
    from day0.models.registry import build_eager

    return build_eager(checkpoint(name), PARITY[name]["max_seq_len"])


def _run(model, ids, turns, trace=None):
    """Logits of ids fed as consecutive calls of the given lengths (1 = a decode step)."""
    state, rows, at = model.empty_state(), [], 0
    with torch.no_grad():
        for n in turns:
            logits, *state = model.step(ids[at : at + n], torch.tensor([at]), *state, trace=trace)
            rows.append(logits)
            at += n
    return torch.cat(rows), state


def test_configs_exercise_every_feature(reference):
    for name in GLM:
        c, p = reference(name).config.text_config, PARITY[name]["prompt"]
        assert set(c.layer_types) == {"linear_attention", "indexed_attention"}, name
        shared = [
            i
            for i, (t, x) in enumerate(zip(c.layer_types, c.indexer_types))
            if t == "indexed_attention" and x == "shared"
        ]
        assert shared, name
        assert c.hc_mult > 1 and c.index_kpool > 1, name
        assert p + DECODE_STEPS > 64  # longer than one KDA chunk
        assert c.index_topk + c.index_kpool < p  # sparse: the selection is smaller than the prompt
    assert any(PARITY[n].get("experts") == "compressed-tensors" for n in GLM)


@pytest.mark.parametrize("name", GLM)
def test_pool_selection_has_no_ties(name, checkpoint):
    """No pool selection may hang on a tie (or a near-tie within float noise)."""
    from day0.tools.checkpoints.glm5_next import pool_selection_margin

    model = _model(checkpoint, name)
    ids = sequence(name, model.cfg.vocab_size)
    assert pool_selection_margin(model, ids) > 1e-4


def _transformers_selections(ref, ids):
    """Each full indexer's token selection [S, W] (transformers, one forward without cache)."""
    got = []
    handles = [
        m.register_forward_hook(lambda mod, args, out: got.append(out[0]))
        for m in ref.modules()
        if type(m).__name__ == "Glm5NextTextIndexer"
    ]
    try:
        with torch.no_grad():
            ref(ids[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return got


def _as_sets(selection):
    return [sorted(int(i) for i in row if i >= 0) for row in selection]


@pytest.mark.parametrize("name", GLM)
def test_selection_equals_transformers(name, reference, checkpoint):
    """Every full layer selects exactly transformers' positions for every query (as a set: whole
    pools plus the visible tail), over one prefill; and each is block-structured."""
    ref, model = reference(name), _model(checkpoint, name)
    ids = sequence(name, model.cfg.vocab_size)
    want = _transformers_selections(ref, ids)
    trace = []
    _run(model, ids, [len(ids)], trace)
    full = [sel for i, sel in trace if model.layers[i].full_indexer]
    assert len(full) == len(want) > 0
    kpool = model.cfg.index_kpool
    for ours, theirs in zip(full, want):
        assert _as_sets(ours) == _as_sets(theirs)
        pools = ours[:, : ours.shape[1] - (kpool - 1)].reshape(ours.shape[0], -1, kpool)
        starts = pools[..., :1]
        assert torch.equal(torch.where(starts >= 0, starts + torch.arange(kpool), -1), pools)


@pytest.mark.parametrize("name", GLM)
def test_shared_layer_reuses_the_previous_full_selection(name, checkpoint):
    """In prefill and in every decode step, a shared layer attends over exactly the selection the
    full layer before it computed (the same tensor), and has no indexer of its own."""
    model = _model(checkpoint, name)
    ids = sequence(name, model.cfg.vocab_size)
    p = PARITY[name]["prompt"]
    for turns in ([p], [p, 1, 1]):
        trace = []
        _run(model, ids, turns, trace)
        steps = [dict() for _ in turns]
        per_step = len(trace) // len(turns)
        for k, (i, sel) in enumerate(trace):
            steps[k // per_step][i] = sel
        for selections in steps:
            shared = [i for i in selections if not model.layers[i].full_indexer]
            assert shared
            for i in shared:
                assert not hasattr(model.layers[i].self_attn, "indexer")
                assert selections[i] is selections[i - 1] and model.layers[i - 1].full_indexer


@pytest.mark.parametrize("name", GLM)
def test_multi_turn_equals_one_forward(name, reference, checkpoint):
    """prefill, decodes, a second prefill, decodes == transformers' one forward; the turns cut the
    sequence inside pools and KDA chunks."""
    ids, want = _expected(reference, name)
    a, b = 37, PARITY[name]["prompt"]
    got, _ = _run(_model(checkpoint, name), ids, [a, 1, 1, 1, b - a - 3, 1, 1, 1])
    assert rel_err(got, want[: b + 3]) < TOL


@pytest.mark.parametrize("name", ["glm-base", "glm-dsa-first"])
def test_chunked_prefill_equals_decode_steps(name, checkpoint):
    """One prefill (KDA chunked, all pools rewritten) == the same tokens one decode step at a time
    (KDA recurrence, one pool rewritten per step): logits and every state tensor."""
    model = _model(checkpoint, name)
    for layer in model.layers:
        if layer.is_kda:
            layer.self_attn.chunk = 16
    ids = sequence(name, model.cfg.vocab_size)[: PARITY[name]["prompt"]]
    chunked, chunked_state = _run(model, ids, [len(ids)])
    stepped, stepped_state = _run(model, ids, [1] * len(ids))
    assert rel_err(chunked, stepped) < 1e-4
    for spec, a, b in zip(model.state_specs(), chunked_state, stepped_state):
        assert rel_err(a, b) < 1e-4, spec.name


def test_swiglu_clamp_is_reached(reference, checkpoint):
    """The tiny configs' activations reach swiglu_limit: dropping the clamp changes the logits."""
    name = "glm-base"
    ids, want = _expected(reference, name)
    model = _model(checkpoint, name)
    for m in model.modules():
        if hasattr(m, "limit"):
            m.limit = None
    got, _ = _run(model, ids, [len(ids)])
    assert rel_err(got, want) > 10 * TOL


def test_state_specs(checkpoint):
    model = _model(checkpoint, "glm-dsa-first")
    c, t = model.cfg, model.max_seq_len
    d = c.linear_num_heads * c.linear_head_dim
    got = [(s.name, s.kind, s.layer, s.shape) for s in model.state_specs()]
    assert got == [
        ("kv_cache.0", "mla_latent", 0, (t, c.kv_lora_rank)),
        ("index_keys.0", "indexer_keys", 0, (t, 2 * c.index_head_dim)),
        ("index_pools.0", "indexer_pools", 0, (-(-t // c.index_kpool), c.index_head_dim)),
        ("kv_cache.1", "mla_latent", 1, (t, c.kv_lora_rank)),  # shared: no indexer state
        ("conv_tail.2", "conv_tail", 2, (3 * d, c.linear_conv_kernel_dim - 1)),
        ("kda_state.2", "kda_state", 2, (c.linear_num_heads, c.linear_head_dim, c.linear_head_dim)),
    ]
    assert model.selection_width() == c.index_topk + c.index_kpool - 1
    assert not hasattr(model, "rope_cos_hi")  # NoPE: no rope table


def test_mxfp4_experts_stay_packed(checkpoint):
    """The MXFP4 config reads its routed experts as packed u8 (compressed-tensors names) and
    every other weight as stored; the vision tower is in the checkpoint and left unread."""
    from day0.models.checkpoint import Checkpoint

    ckpt, model = Checkpoint.open(checkpoint("glm-mxfp4")), _model(checkpoint, "glm-mxfp4")
    params = dict(model.named_parameters())
    packed = [n for n in params if n.endswith("weight_packed")]
    assert packed and all(params[n].dtype == torch.uint8 for n in packed)
    assert not any(n.endswith(".experts.0.gate_proj.weight") for n in params)
    assert any(n.startswith("model.visual.") for n in ckpt.tensors)


DROP = object()  # a change that removes the field
BAD_CONFIGS = [
    (
        {"layer_types": ["linear_attention", "sliding_attention", "indexed_attention"]},
        "layer_types",
        "sliding_attention",
    ),
    ({"layer_types": ["linear_attention"]}, "layer_types", "one entry per layer"),
    ({"indexer_types": ["full", "full", "sometimes"]}, "indexer_types", "sometimes"),
    ({"indexer_types": ["full", "shared", "full"]}, "indexer_types", "layer 1 is 'shared'"),
    (
        {"layer_types": ["indexed_attention", "linear_attention", "indexed_attention"]},
        "indexer_types",
        "layer 2 is 'shared' but layer 1",
    ),
    ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types", "moe"),
    ({"index_topk": 10}, "index_topk", "multiple of index_kpool"),
    ({"index_kpool": 0}, "index_kpool", "positive"),
    ({"qk_rope_head_dim": 8}, "qk_rope_head_dim", "NoPE"),
    ({"q_lora_rank": None}, "q_lora_rank", "positive int"),
    ({"index_kpool_always_select_tail": False}, "index_kpool_always_select_tail", "only true"),
    ({"num_key_value_heads": 2}, "num_key_value_heads", "MLA"),
    ({"hidden_act": "gelu"}, "hidden_act", "only silu"),
    ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim", "at least 2"),
    ({"hc_mult": 0}, "hc_mult", "positive"),
    ({"n_group": 3}, "n_group", "divide"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok", "must be in"),
]


@pytest.mark.parametrize("change,field,why", BAD_CONFIGS, ids=[b[1] + "-" + b[2][:12] for b in BAD_CONFIGS])
def test_config_errors_name_the_field(change, field, why, checkpoint):
    from day0.models.config import ConfigError
    from day0.models.registry import architecture

    raw = json.loads((checkpoint("glm-base") / "config.json").read_text())
    architecture(raw)  # the checkpoint's own config is accepted
    text = {k: v for k, v in {**raw["text_config"], **change}.items() if v is not DROP}
    with pytest.raises(ConfigError, match=rf"field '{field}'.*{why}"):
        architecture({**raw, "text_config": text})


def test_flat_config_and_unsupported_quantization(checkpoint):
    """A flat (text fields at the top level) config parses to the same text config; MXFP4 in a
    layout other than compressed-tensors is refused naming quantization_config."""
    from day0.models.config import ConfigError
    from day0.models.registry import architecture

    raw = json.loads((checkpoint("glm-base") / "config.json").read_text())
    nested, _ = architecture(raw)
    flat, _ = architecture(
        {"model_type": "glm5_next", **{k: v for k, v in raw["text_config"].items() if k != "model_type"}}
    )
    assert nested.to_dict() == flat.to_dict()
    with pytest.raises(ConfigError, match="field 'quantization_config'"):
        architecture({**raw, "quantization_config": {"quant_method": "mxfp4"}})


def test_compiled_multi_turn(reference, artifact):
    """The artifact: a first prompt shorter than one pool, decodes across pool boundaries, a prompt
    crossing a KDA chunk boundary, decodes == one forward; then an odd-length prompt after reset."""
    from day0.runtime.session import Session

    name = "glm-base"
    ids, want = _expected(reference, name)
    b = PARITY[name]["prompt"]
    s = Session.load(artifact(name))
    rows = [s.prefill(ids[:3].numpy())]
    rows += [s.decode(int(ids[t]))[None] for t in range(3, 9)]
    rows.append(s.prefill(ids[9:b].numpy()))
    rows += [s.decode(int(ids[t]))[None] for t in range(b, b + 3)]
    assert rel_err(np.concatenate(rows), want[: b + 3]) < TOL
    s.reset()
    assert rel_err(s.prefill(ids[:67].numpy()), want[:67]) < TOL


def test_block_tiles_pipeline_on_the_model(checkpoint):
    """The exported model through the llvm-cpu pipeline with pool-sized block tiles (what
    lowering/driver.py builds from model.dsa_block()): every DSA op
    is expanded with one block gather per pool. (Export only, one config, to keep the suite short;
    the block form's numerics are tests/test_dsa_to_gather_tiles.py's.)"""
    name = "glm-dsa-first"
    from day0.frontend.export import export_model
    from day0.frontend.ir import new_context, parse_module
    from day0.lowering.targets import TARGETS, DsaShape
    from day0.passes.pipeline import run_pipeline

    model = _model(checkpoint, name)
    assert model.dsa_block() == model.cfg.index_kpool
    text = export_model(model, model.max_seq_len).mlir
    pipeline = TARGETS["llvm-cpu"].pipeline(DsaShape(model.selection_width(), model.dsa_block(), 64))
    assert f"dsa-to-gather-tiles{{block={model.cfg.index_kpool}}}" in pipeline
    with new_context():
        m = parse_module(text)
        run_pipeline(m, pipeline)
        out = str(m)
    assert "torch.day0.dsa_attention" not in out
    assert "torch.aten.floor_divide.Scalar" in out
