"""tools/train: the default model's corpus (the stdlib's docstrings), its tokenizer, the DSA
indexer's KL loss and the training loop, on tiny inputs (the full training: `python -m
day0.tools.train.train`)."""

import json

import numpy as np
import pytest
import torch

from day0.tools.checkpoints.demo import save_tokenizer
from day0.tools.train.corpus import MIN_CHARS, documents, fingerprint, split
from day0.tools.train.indexer_loss import IndexerLoss
from day0.tools.train.tokenizer import train_tokenizer

_DOC = "A docstring long enough to be kept: it says what the function does and why."


def _fake_stdlib(root):
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "a.py").write_text(f'"""{_DOC}"""\n\ndef f():\n    """{_DOC} (f)"""\n\ndef g():\n    """short"""\n')
    (root / "pkg" / "b.py").write_text(f'class C:\n    """{_DOC} (C)"""\n')
    (root / "test" / "test_a.py").write_text(f'"""{_DOC} (a test)"""\n')
    (root / "broken.py").write_text("def (:\n")
    (root / "nodoc.py").write_text("x = 1\n")


def test_the_corpus_is_the_docstrings_of_module_files_in_path_order(tmp_path):
    _fake_stdlib(tmp_path)
    docs = documents(tmp_path)
    assert [d.path for d in docs] == ["a.py", "pkg/b.py"]  # no tests, no broken or empty files
    assert docs[0].text == f"{_DOC}\n\n{_DOC} (f)"  # "short" is under MIN_CHARS
    assert len("short") < MIN_CHARS
    train, held = split(docs)
    assert sorted(d.path for d in train + held) == ["a.py", "pkg/b.py"] and not set(train) & set(held)
    before = fingerprint(docs)
    (tmp_path / "pkg" / "b.py").write_text(f'class C:\n    """{_DOC} (changed)"""\n')
    assert fingerprint(documents(tmp_path))["sha256"] != before["sha256"]
    assert fingerprint(documents(tmp_path))["sha256"] == fingerprint(documents(tmp_path))["sha256"]


def test_the_real_corpus_holds_out_about_one_file_in_twenty():
    train, held = split(documents())
    assert len(train) > 300 and 0.02 < len(held) / (len(train) + len(held)) < 0.1


def test_the_tokenizer_has_bytes_then_specials_then_merges_and_round_trips(tmp_path):
    texts = [_DOC, "Return the sum of the squares of the values."] * 20
    tok = train_tokenizer(texts, 300)
    vocab = tok.get_vocab()
    assert tok.get_vocab_size() == 300 and vocab["<bos>"] == 256 and vocab["<eos>"] == 257
    assert vocab["A"] == ord("A") and vocab["Ġ"] == ord(" ")  # byte ids are the bytes
    assert train_tokenizer(texts, 300).to_str() == tok.to_str()  # deterministic
    for s in (_DOC, "naïve café — 東京 \t\n", ""):
        assert tok.decode(tok.encode(s).ids) == s
    assert len(tok.encode(_DOC).ids) < 0.6 * len(_DOC.encode())  # the merges compress
    save_tokenizer(tok, tmp_path)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tmp_path)
    chat = hf.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<bos><|user|>\nHi<eos>\n<|assistant|>\n"
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<eos>"


def _tiny_model(seed=0):
    import transformers

    from day0.tools.train.train import model_config

    torch.manual_seed(seed)
    cfg = model_config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        index_head_dim=16,
        index_topk=4,
        attn_implementation="eager",
    )
    return transformers.DeepseekV32ForCausalLM(cfg)


def test_the_indexer_loss_trains_the_indexers_alone():
    """The KL between the main attention's distribution and the indexer's softmax reaches the
    indexer's weights only (its inputs are detached), is >= 0, and a few steps on it lower it."""
    model = _tiny_model()
    loss = IndexerLoss(model)
    assert len(loss.indexers) == 2
    ids = torch.randint(0, 300, (2, 12))
    indexer_params = {id(p) for i in loss.indexers for p in i.parameters()}
    opt = torch.optim.Adam([p for i in loss.indexers for p in i.parameters()], lr=1e-2)
    values = []
    for _ in range(8):
        out = model(input_ids=ids, output_attentions=True)
        kl = loss.loss(out.attentions)
        assert kl.item() >= 0
        model.zero_grad(set_to_none=True)
        kl.backward()
        got = {id(p) for p in model.parameters() if p.grad is not None and p.grad.abs().sum() > 0}
        assert got and got <= indexer_params
        opt.step()
        values.append(kl.item())
    assert values[-1] < values[0]
    loss.remove()


def test_training_steps_lower_the_loss_and_restore_the_selection(monkeypatch):
    from day0.tools.train import train

    monkeypatch.setattr(train, "WINDOW", 16)
    monkeypatch.setattr(train, "BATCH", 4)
    monkeypatch.setattr(train, "LOG_EVERY", 1)
    model = _tiny_model(1)
    stream = np.tile(np.arange(40, dtype=np.int64), 50)  # a repeating pattern: learnable
    logged = []
    history = train.train_model(model, stream, steps=30, dense_steps=5, seed=0, lr=1e-2, log=logged.append)
    assert [h["dense"] for h in history[:6]] == [True] * 5 + [False]
    assert history[-1]["lm_loss"] < history[0]["lm_loss"] - 1.0
    assert all(i.index_topk == 4 for i in model.modules() if hasattr(i, "index_topk"))  # restored
    assert not model.training and len(logged) == 30
    with pytest.raises(ValueError, match="vocab_size must be > 258"):
        train_tokenizer(["x"], 258)


def test_a_directory_is_written_whole_or_not_at_all(tmp_path):
    from day0.runtime.files import writing_dir

    out = tmp_path / "ckpt"
    with pytest.raises(RuntimeError, match="interrupted"), writing_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []  # no half-written directory, no temporary left
    with writing_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
    with writing_dir(out) as tmp:  # a second write replaces the first
        (tmp / "model.safetensors").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
