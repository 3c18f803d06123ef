"""tools/checkpoints/demo.py: deterministic, sharded, loadable, atomic, tie-free selection."""

import hashlib
import json

import pytest
import torch

from day0.runtime.tokenizer import load_tokenizer
from day0.tools.checkpoints import demo as dc

PROMPT = "The quick brown fox jumps over the lazy dog; naïve café, 42."


def file_hashes(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return dc.ensure_demo_checkpoint(tmp_path_factory.mktemp("a") / "demo")


@pytest.fixture(scope="module")
def model(demo):
    from transformers import DeepseekV32ForCausalLM

    return DeepseekV32ForCausalLM.from_pretrained(demo, dtype=torch.float32).eval()


def prompt_ids(demo, n=40):
    ids = load_tokenizer(demo).encode(PROMPT * 2)[:n]
    assert len(ids) == n
    return torch.tensor([ids])


def test_creation_is_deterministic(demo, tmp_path):
    again = dc.ensure_demo_checkpoint(tmp_path / "demo")
    assert file_hashes(again) == file_hashes(demo)
    assert dc.is_complete(demo) and dc.is_complete(again)


def test_layout(demo):
    shards = sorted(demo.glob("*.safetensors"))
    assert len(shards) >= 2
    index = json.loads((demo / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [s.name for s in shards]
    # The tie-breaking tweaks are in the saved weights, not only in memory.
    from safetensors import safe_open

    found = {}
    for shard in shards:
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                if name.endswith("indexer.k_norm.bias") or name.endswith("e_score_correction_bias"):
                    found[name] = f.get_tensor(name)
    biases = [t for n, t in found.items() if n.endswith("k_norm.bias")]
    routers = [t for n, t in found.items() if n.endswith("e_score_correction_bias")]
    assert len(biases) == dc.DEMO_CONFIG["num_hidden_layers"] and len(routers) == 1
    assert all(torch.all(b == dc.INDEXER_K_NORM_BIAS) for b in biases)
    assert all(len(set(r.tolist())) == r.numel() for r in routers)  # distinct per expert


def test_config_and_forward(demo, model):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(demo)
    assert config.model_type == "deepseek_v32"
    assert config.vocab_size >= load_tokenizer(demo).vocab_size
    assert (config.bos_token_id, config.eos_token_id) == (256, 257)
    for key, value in dc.DEMO_CONFIG.items():
        if key != "rope_parameters":
            assert getattr(config, key) == value, key
    ids = prompt_ids(demo)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_writing_does_not_touch_global_rng(tmp_path):
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    dc.write_tiny_checkpoint(tmp_path / "c", dc.tiny_deepseek_v32_config(num_hidden_layers=1), seed=1, tokenizer=False)
    assert torch.equal(torch.rand(3), expected)
    assert not (tmp_path / "c" / "tokenizer.json").exists()


def test_interrupted_creation_is_redone(demo, tmp_path):
    good = file_hashes(demo)
    target = tmp_path / "demo"
    # A crash after some files were written but before the marker.
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model-00001-of-00002.safetensors").write_bytes(b"half")
    assert not dc.is_complete(target)
    assert file_hashes(dc.ensure_demo_checkpoint(target)) == good
    # A truncated shard under an intact marker.
    shard = target / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    assert not dc.is_complete(target)
    assert file_hashes(dc.ensure_demo_checkpoint(target)) == good
    # A marker from another version.
    marker = json.loads((target / dc.MARKER).read_text())
    (target / dc.MARKER).write_text(json.dumps({**marker, "demo_version": -1}))
    assert not dc.is_complete(target)
    assert file_hashes(dc.ensure_demo_checkpoint(target)) == good
    # No temporary siblings are left behind.
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]


def test_complete_checkpoint_is_not_rewritten(demo):
    before = {f.name: f.stat().st_mtime_ns for f in demo.iterdir()}
    assert dc.ensure_demo_checkpoint(demo) == demo
    assert {f.name: f.stat().st_mtime_ns for f in demo.iterdir()} == before


def test_indexer_recompute_matches_transformers(demo, model):
    # selection_margin is only meaningful if its scores are the indexer's: same top-k sets.
    ids = prompt_ids(demo)
    k = model.config.index_topk
    layers = dc.indexer_scores(model, ids)
    assert len(layers) == model.config.num_hidden_layers
    for scores, indices in layers:
        for t in range(ids.shape[1]):
            visible = min(k, t + 1)
            ours = set(torch.topk(scores[t], visible).indices.tolist())
            assert ours == set(indices[t, :visible].tolist()), t
        assert torch.isinf(scores.triu(1)[scores.triu(1) != 0]).all()  # causal: -inf above diag


def test_selection_margin(demo, model):
    margin = dc.selection_margin(model, prompt_ids(demo))
    print(f"demo selection margin (relative) = {margin:.3e}")
    # float32 vs float64 index scores of the demo differ by ~1e-6 of the row max; a margin
    # 10x above that means any float32 implementation selects the same keys as transformers.
    # (Measured: 1.96e-4 on this prompt with torch 2.13 / transformers 5.23.)
    assert margin > 1e-5


def test_selection_margin_sees_ties():
    # Sanity check of the measure itself: a zero key projection makes every score equal.
    from transformers import DeepseekV32ForCausalLM

    torch.manual_seed(0)
    model = DeepseekV32ForCausalLM(dc.tiny_deepseek_v32_config(num_hidden_layers=1)).eval()
    for m in model.modules():
        if type(m).__name__ == "DeepseekV32Indexer":
            m.wk.weight.data.zero_()  # LayerNorm(0) = bias: the same key at every position...
            m.k_norm.bias.data.fill_(1.0)
            m.k_norm.bias.data[: m.qk_rope_head_dim] = 0.0  # ...with nothing for RoPE to rotate
    assert dc.selection_margin(model, torch.arange(30)[None]) == 0.0
