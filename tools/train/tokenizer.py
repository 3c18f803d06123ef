"""The default model's tokenizer: byte-level BPE trained with `tokenizers` on the training text.

Ids 0..255 are the bytes (GPT-2's byte-to-character table, as tools/checkpoints/demo.py's
tokenizer), 256 = <bos>, 257 = <eos>, then the learned merges up to `vocab_size`: every string
encodes, and every id decodes. `save_tokenizer` (tools/checkpoints/demo.py) writes it as
transformers' save_pretrained does, with the demo's role-tagged chat template.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from day0.tools.checkpoints.demo import BOS, EOS, _bytes_to_unicode, byte_level_bpe


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """A `tokenizers.Tokenizer` of `vocab_size` ids trained on `texts` (deterministic for the
    same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size <= 258:
        raise ValueError(f"vocab_size must be > 258 (bytes and two specials), got {vocab_size}")
    byte_chars = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 2,  # the two specials are added after the bytes below
        initial_alphabet=byte_chars,
        special_tokens=[],
        show_progress=False,
        min_frequency=2,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Renumbered: the bytes first in byte order (id = byte), then the specials, then the learned
    # pieces in the order the trainer made them; the merges stay as learned.
    vocab = {c: b for b, c in enumerate(byte_chars)}
    vocab[BOS], vocab[EOS] = 256, 257
    for piece, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [
        tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]
    ]
    return byte_level_bpe(vocab, merges)
