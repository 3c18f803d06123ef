"""The default model day0 ships (tools/checkpoints/default/): trained, so it predicts held-out text
far better than chance; its compiled CPU artifact has transformers' held-out perplexity within
0.5% and the same greedy continuations; and the checkpoint is what the issue allows (size,
record of its training)."""

import json

import numpy as np
import pytest
import torch

from day0.tools.checkpoints.default import DEFAULT_DIR, default_checkpoint
from day0.tools.cli import DEMO_PROMPTS
from day0.tools.train.evaluate import perplexity

TOKENS = 1024  # held-out tokens the perplexities are measured on (4 windows of 256)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(default_checkpoint() / "tokenizer.json"))


@pytest.fixture(scope="module")
def held_out(tokenizer) -> np.ndarray:
    text = (default_checkpoint() / "held_out.txt").read_text()
    return np.asarray(tokenizer.encode(text).ids[: TOKENS + 1], dtype=np.int64)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """transformers on the checkpoint with its MXFP4 experts dequantized (exact in f32)."""
    import transformers

    from day0.models.quantize import dequantize_checkpoint

    path = dequantize_checkpoint(default_checkpoint(), tmp_path_factory.mktemp("default") / "dequantized")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    @torch.no_grad()
    def logits_of(ids):
        return model(input_ids=torch.as_tensor(np.asarray(ids))[None]).logits[0].float().numpy()

    return logits_of


@pytest.fixture(scope="module")
def compiled(demo_cli):
    """The default model as the CLI compiles it (conftest demo_cli: 256 positions, dense and paged
    entry points), run through Session."""
    from day0.runtime.session import Session

    session = Session.load(demo_cli[1])

    def logits_of(ids):
        session.reset()
        return session.prefill(np.asarray(ids))

    return session, logits_of


def test_the_checkpoint_is_small_trained_and_says_how(held_out, tokenizer):
    size = sum(f.stat().st_size for f in DEFAULT_DIR.iterdir())
    assert size <= 20 * 2**20
    record = json.loads((DEFAULT_DIR / "training.json").read_text())
    assert record["corpus"]["source"].startswith("docstrings of the Python standard library")
    assert record["steps"] > record["dense_steps"] > 0
    cfg = json.loads((DEFAULT_DIR / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v32" and cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert cfg["index_topk"] < 256  # the DSA selection is really sparse at the tests' window
    assert held_out.size == TOKENS + 1 and tokenizer.get_vocab_size() == cfg["vocab_size"]
    assert "Python Software Foundation" in (DEFAULT_DIR / "NOTICE").read_text()


def test_compiled_perplexity_is_transformers_within_half_a_percent(oracle, compiled, held_out):
    want = perplexity(oracle, held_out)
    got = perplexity(compiled[1], held_out)
    assert want < 60, want  # trained: chance is the vocabulary's 2048
    assert abs(got / want - 1) < 0.005, (got, want)


def test_greedy_continuations_are_token_identical(oracle, compiled, tokenizer):
    from day0.tools.train.evaluate import greedy

    session, _ = compiled
    for prompt in DEMO_PROMPTS:
        ids = tokenizer.encode(prompt).ids
        want = greedy(oracle, ids, 16)
        session.reset()
        got = session.generate(ids, max_new_tokens=16, temperature=0.0, stop_at_eos=False)
        assert got == want, (prompt, tokenizer.decode(got), tokenizer.decode(want))
