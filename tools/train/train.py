"""Train day0's default model: a few-million-parameter deepseek_v32 on the standard library's
docstrings (tools/train/corpus.py), on the CPU, seeded.

    python -m day0.tools.train.train OUT [--steps N] [--dense-steps N] [--seed S]

Writes OUT as a transformers checkpoint directory (save_pretrained: config.json, safetensors,
tokenizer.json with its chat template) plus `training.json`: the corpus fingerprint, the
arguments, and the losses every LOG_EVERY steps. Written atomically (a temporary sibling renamed
into place).

The recipe (DeepSeek-V3.2's two stages, shortened):
  1. dense warm-up (`--dense-steps`): every key is selected (the indexers' top-k covers the whole
     window), the model learns from the language-model loss and each indexer from its KL loss
     against the main attention (tools/train/indexer_loss.py);
  2. sparse training: the indexers select `index_topk` keys (fewer than the window), the main
     attention sees only those, and both losses go on.
AdamW with a linear warm-up and cosine decay; windows of WINDOW tokens drawn from the
concatenated training documents (each ended by <eos>).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from day0.runtime.files import writing_dir
from day0.tools.checkpoints.demo import save_tokenizer
from day0.tools.train.corpus import documents, fingerprint, split, token_stream
from day0.tools.train.evaluate import model_logits, perplexity
from day0.tools.train.indexer_loss import IndexerLoss
from day0.tools.train.tokenizer import train_tokenizer

VOCAB = 2048
WINDOW = 256  # tokens a training sequence
BATCH = 8
LOG_EVERY = 25
INDEXER_WEIGHT = 1.0  # the KL loss's weight beside the language-model loss (it trains other weights)

CONFIG: dict = dict(
    vocab_size=VOCAB,
    hidden_size=192,
    intermediate_size=512,  # the dense MLP of layer 0
    moe_intermediate_size=128,
    num_hidden_layers=4,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=96,
    kv_lora_rank=64,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    n_routed_experts=8,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    num_experts_per_tok=2,
    index_n_heads=4,
    index_head_dim=32,
    index_topk=64,  # < WINDOW: the sparse stage really selects
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    bos_token_id=256,
    eos_token_id=257,
    tie_word_embeddings=False,
)


def model_config(**overrides):
    import transformers

    return transformers.DeepseekV32Config(**{**CONFIG, **overrides})


def _lr(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


def train_model(
    model, stream: np.ndarray, steps: int, dense_steps: int, seed: int, lr: float = 2e-3, log=print
) -> list[dict]:
    """Train `model` (a transformers DeepseekV32ForCausalLM, eager attention) in place on windows
    of `stream`; returns the log (step, language-model loss, indexer loss)."""
    rng = np.random.default_rng(seed)
    indexer = IndexerLoss(model)
    topk = [i.index_topk for i in indexer.indexers]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    history, t0 = [], time.perf_counter()
    try:
        for step in range(steps):
            dense = step < dense_steps
            for i, k in zip(indexer.indexers, topk):
                i.index_topk = WINDOW if dense else k
            starts = rng.integers(0, stream.size - WINDOW - 1, BATCH)
            batch = torch.from_numpy(np.stack([stream[s : s + WINDOW] for s in starts]))
            for g in opt.param_groups:
                g["lr"] = _lr(step, steps, lr, max(steps // 20, 1))
            out = model(input_ids=batch, labels=batch, output_attentions=True)
            idx_loss = indexer.loss(out.attentions)
            (out.loss + INDEXER_WEIGHT * idx_loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % LOG_EVERY == 0 or step == steps - 1:
                row = {
                    "step": step,
                    "lm_loss": round(out.loss.item(), 4),
                    "indexer_kl": round(float(idx_loss.detach()), 4),
                    "dense": dense,
                    "seconds": round(time.perf_counter() - t0, 1),
                }
                history.append(row)
                log(json.dumps(row))
    finally:
        for i, k in zip(indexer.indexers, topk):
            i.index_topk = k
        indexer.remove()
    model.eval()
    return history


def build(out: Path, steps: int, dense_steps: int, seed: int, log=print) -> Path:
    """Train from scratch and write the checkpoint directory `out` (module docstring)."""
    import transformers

    torch.manual_seed(seed)
    docs = documents()
    train_docs, held_out = split(docs)
    tokenizer = train_tokenizer((d.text for d in train_docs), VOCAB)
    stream = token_stream(tokenizer, train_docs)
    model = transformers.DeepseekV32ForCausalLM(model_config(attn_implementation="eager"))
    history = train_model(model, stream, steps, dense_steps, seed, log=log)
    held = token_stream(tokenizer, held_out)
    ppl = perplexity(model_logits(model), held)
    log(f"held-out perplexity {ppl:.3f} ({held.size} tokens)")
    with writing_dir(Path(out)) as tmp:
        model.config._attn_implementation = "eager"
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)
        record = {
            "corpus": fingerprint(docs),
            "held_out_documents": len(held_out),
            "steps": steps,
            "dense_steps": dense_steps,
            "seed": seed,
            "window": WINDOW,
            "batch": BATCH,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "held_out_perplexity": round(ppl, 4),
            "log": history,
        }
        (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-train-default-model")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--dense-steps", type=int, default=250)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    build(Path(a.out), a.steps, a.dense_steps, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
