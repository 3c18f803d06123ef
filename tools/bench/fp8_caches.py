"""What FP8 caches would cost in accuracy (issue 18), measured on day0's eager deepseek_v32 before
any artifact stores them: the layouts the reference systems use, against f32 and bf16 caches.

    python -m day0.tools.bench.fp8_caches [CHECKPOINT] [--tokens N] [--prompt P] [--json OUT]

CHECKPOINT: a deepseek_v32 checkpoint directory (default: the shipped default model, trained, with
its held-out text as the token stream; another checkpoint gets seeded random ids).

Layouts (a row is quantized once, when it is written, and read back as value × scale):
  fp8-index   indexer keys as DeepSeek-V3.2 keeps them: 128 (d_I) FP8 E4M3 values and one f32
              scale a token, scale = max |k| / 448.
  fp8-latent  the MLA latent as FlashMLA's FP8 cache keeps it (656 B a token at rank 512): the
              latent in tiles of 128 values, each tile FP8 E4M3 with its own f32 scale, and the
              rope part in bf16.
  fp8-both    both.
The others: bf16 (day0's `--cache-dtype bfloat16`, the cuda-sm90 default) and f32 (the
reference every row is compared with).

For each layout, teacher-forced over a prompt and then one token at a time (the decode steps):
the logits' max |Δ| ÷ max |f32| over all rows, the share of rows whose greedy token equals f32's,
and the indexer's selection overlap with f32's (|chosen ∩ chosen_f32| ÷ |chosen_f32|, averaged
over layers, steps and queries; rows where the selection holds every visible key count as 1).
Results: docs/perf.md, "FP8 caches: what they would cost".
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import numpy as np
import torch

FP8_MAX = 448.0  # largest finite E4M3 value
LATENT_TILE = 128  # FlashMLA's tile of latent values under one scale
LAYOUTS = ("f32", "bf16", "fp8-index", "fp8-latent", "fp8-both")


def fp8_rows(x: torch.Tensor, tile: int) -> torch.Tensor:
    """x [..., n] stored as FP8 E4M3 in tiles of `tile` values along the last dim, each tile with
    the f32 scale max |x| / 448 (a zero tile keeps scale 1), and read back: what the cache holds."""
    shape = x.shape
    t = x.reshape(*shape[:-1], shape[-1] // tile, tile)
    scale = t.abs().amax(-1, keepdim=True) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return ((t / scale).to(torch.float8_e4m3fn).float() * scale).reshape(shape)


@contextlib.contextmanager
def fp8_storage(index: bool, latent: bool, selections: list | None = None):
    """Within: the eager deepseek_v32 (models/mla.py) writes its indexer keys and/or latent rows
    through fp8_rows, and `selections` (when given) collects every indexer selection [S, k]."""
    from day0.models import dsa_indexer, mla

    keys, row, select = dsa_indexer.Indexer.keys, mla.cache_row, dsa_indexer.Indexer.select

    def fp8_keys(self, projected, cos, sin):
        k = keys(self, projected, cos, sin)
        return fp8_rows(k, k.shape[-1]) if index else k

    def fp8_cache_row(compressed, norm, rotated):
        r = row(compressed, norm, rotated)
        if not latent:
            return r
        rank = norm.weight.shape[0]
        lat = fp8_rows(r[:, :rank], min(LATENT_TILE, rank))
        return torch.cat([lat, r[:, rank:].to(torch.bfloat16).float()], -1)

    def recording_select(self, *args, **kwargs):
        out = select(self, *args, **kwargs)
        if selections is not None:
            selections.append(out.clone())
        return out

    dsa_indexer.Indexer.keys, mla.cache_row, dsa_indexer.Indexer.select = fp8_keys, fp8_cache_row, recording_select
    try:
        yield
    finally:
        dsa_indexer.Indexer.keys, mla.cache_row, dsa_indexer.Indexer.select = keys, row, select


def teacher_forced(checkpoint: Path, layout: str, ids: torch.Tensor, prompt: int, max_seq_len: int):
    """(logits [len(ids), V], selections) of the eager model over ids: the prompt in one step, then
    one token a step, with the caches of `layout`."""
    from day0.models.registry import build_eager

    model = build_eager(checkpoint, max_seq_len, cache_dtype="bfloat16" if layout == "bf16" else "float32")
    selections: list = []
    with (
        torch.no_grad(),
        fp8_storage(layout in ("fp8-index", "fp8-both"), layout in ("fp8-latent", "fp8-both"), selections),
    ):
        logits, *state = model.step(ids[:prompt], torch.tensor([0]), *model.empty_state())
        rows = [logits]
        for t in range(prompt, len(ids)):
            logits, *state = model.step(ids[t : t + 1], torch.tensor([t]), *state)
            rows.append(logits)
    return torch.cat(rows).float(), selections


def overlap(got: list, want: list) -> float:
    """Mean over selection rows of |got ∩ want| ÷ |want| (slots < 0 are empty and not counted)."""
    shares = []
    for g, w in zip(got, want, strict=True):
        for gr, wr in zip(g.tolist(), w.tolist(), strict=True):
            ws = {s for s in wr if s >= 0}
            shares.append(len(ws & {s for s in gr if s >= 0}) / len(ws) if ws else 1.0)
    return float(np.mean(shares))


def measure(checkpoint: Path, ids: torch.Tensor, prompt: int) -> dict:
    """Every layout's logits, greedy agreement and selection overlap against f32 caches."""
    max_seq_len = len(ids) + 1
    ref, ref_sel = teacher_forced(checkpoint, "f32", ids, prompt, max_seq_len)
    out = {"tokens": len(ids), "prompt": prompt, "layouts": {}}
    for layout in LAYOUTS[1:]:
        got, sel = teacher_forced(checkpoint, layout, ids, prompt, max_seq_len)
        out["layouts"][layout] = {
            "logits_rel": float((got - ref).abs().max() / ref.abs().max()),
            "greedy_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
            "selection_overlap": overlap(sel, ref_sel),
        }
    return out


def bytes_per_token(cfg: dict) -> dict:
    """Cache bytes a token a layer in each layout (indexer keys, latent + rope)."""
    d, rank, rope = cfg["index_head_dim"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    tiles = -(-rank // LATENT_TILE)
    return {
        "f32": {"index": 4 * d, "latent": 4 * (rank + rope)},
        "bf16": {"index": 2 * d, "latent": 2 * (rank + rope)},
        "fp8": {"index": d + 4, "latent": rank + 4 * tiles + 2 * rope},
    }


def _stream(checkpoint: Path | None, tokens: int) -> tuple[Path, torch.Tensor]:
    from day0.tools.checkpoints.default import default_checkpoint

    if checkpoint is None:
        from tokenizers import Tokenizer

        checkpoint = default_checkpoint()
        tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        ids = tok.encode((checkpoint / "held_out.txt").read_text()).ids[:tokens]
        return checkpoint, torch.tensor(ids, dtype=torch.int64)
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    return checkpoint, torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", nargs="?", type=Path, default=None)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--prompt", type=int, default=192)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    ckpt, ids = _stream(a.checkpoint, a.tokens)
    cfg = json.loads((ckpt / "config.json").read_text())
    if cfg.get("model_type") != "deepseek_v32":
        raise SystemExit(f"fp8_caches: {ckpt} is a {cfg.get('model_type')} checkpoint; it measures deepseek_v32")
    if not 0 < a.prompt < len(ids):
        raise SystemExit(f"fp8_caches: --prompt {a.prompt} must be in [1, {len(ids) - 1}] ({len(ids)} tokens)")
    res = {"checkpoint": str(ckpt), **measure(ckpt, ids, a.prompt), "bytes_per_token_layer": bytes_per_token(cfg)}
    print(f"{'layout':<11}{'logits rel':>12}{'greedy':>9}{'overlap':>9}")
    for name, r in res["layouts"].items():
        print(f"{name:<11}{r['logits_rel']:>12.2e}{r['greedy_agree']:>9.1%}{r['selection_overlap']:>9.1%}")
    print("bytes a token a layer:", res["bytes_per_token_layer"])
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
