"""Held-out perplexity and greedy continuations of a trained checkpoint, three ways: transformers
(the oracle), day0's eager model, and a compiled artifact through `Session`.

    python -m day0.tools.train.evaluate CHECKPOINT [--artifact DIR] [--tokens N]

Perplexity is exp of the mean next-token loss over the held-out documents (tools/train/corpus.py)
in consecutive windows of WINDOW tokens, each run from position 0 (a prompt of its own), so that
every way computes the same quantity.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

WINDOW = 256
PROMPTS = ("Return the number of", "This module provides", "The default value is")


def held_out_stream(checkpoint: Path, tokens: int) -> np.ndarray:
    """The first `tokens` ids of the held-out documents, tokenized by the checkpoint's tokenizer."""
    from tokenizers import Tokenizer

    from day0.tools.train.corpus import documents, split, token_stream

    tok = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
    return token_stream(tok, split(documents())[1])[: tokens + 1]


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    x = logits.astype(np.float64)
    m = x.max(-1, keepdims=True)
    logz = m[:, 0] + np.log(np.exp(x - m).sum(-1))
    return float((logz - x[np.arange(len(targets)), targets]).sum())


def perplexity(logits_of, stream: np.ndarray, window: int = WINDOW) -> float:
    """exp(mean NLL) with `logits_of(ids) -> [len(ids), V]` over windows of `stream`."""
    total, count = 0.0, 0
    for s in range(0, stream.size - 1, window):
        chunk = stream[s : s + window + 1]
        if chunk.size < 2:
            break
        total += _nll(np.asarray(logits_of(chunk[:-1])), chunk[1:])
        count += chunk.size - 1
    return math.exp(total / count)


def transformers_logits(checkpoint: Path, device: str = "cpu"):
    """transformers' logits (the model on torch `device`); a checkpoint with MXFP4 experts is read
    dequantized (exact in f32: transformers needs the compressed-tensors package for it, which
    day0 does not install)."""
    import json
    import tempfile

    import transformers

    from day0.models.quantize import dequantize_checkpoint

    with tempfile.TemporaryDirectory(prefix="day0-dequantized-") as work:
        if "quantization_config" in json.loads((Path(checkpoint) / "config.json").read_text()):
            checkpoint = dequantize_checkpoint(checkpoint, Path(work) / "checkpoint")
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    return model_logits(model.to(device).eval())


def model_logits(model):
    """`logits_of(ids) -> [len(ids), V]` of a transformers causal LM in memory."""
    device = next(model.parameters()).device

    @torch.no_grad()
    def logits_of(ids):
        ids = torch.from_numpy(np.asarray(ids, dtype=np.int64))[None].to(device)
        return model(input_ids=ids).logits[0].float().cpu().numpy()

    return logits_of


def eager_logits(checkpoint: Path, max_seq_len: int = WINDOW):
    from day0.models.registry import build_eager

    model = build_eager(checkpoint, max_seq_len)

    @torch.no_grad()
    def logits_of(ids):
        logits, *_ = model.step(torch.from_numpy(np.asarray(ids)), torch.tensor([0]), *model.empty_state())
        return logits.float().numpy()

    return logits_of


def artifact_logits(artifact: Path, device: str | None = None):
    from day0.runtime.session import Session

    session = Session.load(artifact, device=device)

    def logits_of(ids):
        session.reset()
        return session.prefill(np.asarray(ids))

    return logits_of


def greedy(logits_of, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt`, each from a full forward (no cache: the plain definition)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(logits_of(np.asarray(ids))[-1])))
    return ids[len(prompt) :]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-evaluate-default-model")
    p.add_argument("checkpoint")
    p.add_argument("--artifact", default=None)
    p.add_argument("--tokens", type=int, default=8192)
    a = p.parse_args(argv)
    ckpt = Path(a.checkpoint)
    stream = held_out_stream(ckpt, a.tokens)
    ways = {"transformers": transformers_logits(ckpt), "day0 eager": eager_logits(ckpt)}
    if a.artifact:
        ways["day0 compiled"] = artifact_logits(Path(a.artifact))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    out = {}
    for name, fn in ways.items():
        out[name] = {"perplexity": round(perplexity(fn, stream), 4)}
        out[name]["continuations"] = [tok.decode(greedy(fn, tok.encode(q).ids, 16)) for q in PROMPTS]
    print(json.dumps({"held_out_tokens": int(stream.size - 1), **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
