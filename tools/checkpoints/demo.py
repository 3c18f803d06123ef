"""The built-in demo model: a tiny random DeepSeek-V3.2 checkpoint, written on demand.

`day0 demo` (and any test that needs a real checkpoint directory) calls
`ensure_demo_checkpoint(dir)`. The first call writes, in Hugging Face layout:

    config.json, generation_config.json        DeepseekV32Config (DEMO_CONFIG), float32
    model-0000{1,2}-of-00002.safetensors       random weights in 2 shards (+ the index json),
                                               experts per expert, as real checkpoints store them
    tokenizer.json                             byte-level BPE: 256 byte tokens (id == byte value),
                                               <bos>=256, <eos>=257, a few English merges up to
                                               the model's vocab, so every model id decodes
    tokenizer_config.json, chat_template.jinja  its special tokens and a chat template (`day0
                                               serve`'s chat endpoint), by transformers'
                                               save_pretrained
    .complete                                  marker, written last (see below)

Later calls only check the marker. The weights are a pure function of the seed and the torch
version: two fresh creations give identical bytes (tests/test_demo_checkpoint.py pins it).

Ties. The DSA indexer scores I[t,s] = sum_h w[t,h] * ReLU(q[t,h] . k[s]) and keeps the top-k
per query; compiled and eager code agree on the selection only where the k-th and (k+1)-th
scores differ by more than float rounding. With random weights and few heads many scores can
be exactly 0 (every head's ReLU clipped), i.e. exact ties. The post-init changes in `INITS`
avoid that: 16 indexer heads, a positive bias on the indexer's key LayerNorm
(adds a shared positive component to every key, so most q.k are away from the ReLU kink),
larger indexer projections (scores well above float32 noise), and a small random MoE
`e_score_correction_bias` (no two experts score alike). `selection_margin` measures the
smallest top-k gap on a sequence. Exact ties are then gone, but near-ties are not: the
smallest gap shrinks like 1/(tokens x queries). Measured on the demo (relative to the row's
largest |score|; float32 vs float64 noise of the scores is ~1e-6): ~2e-4 at 40 tokens,
~6e-5 at 128, ~7e-6 at 256, ~1e-6 at 512. Selection parity tests should stay short or
tolerate a flip where the oracle's own gap is below the noise.

Writing is atomic: the directory is built as a temporary sibling and renamed into place,
so an interrupted creation leaves no directory that passes the marker check.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from day0.runtime.files import make_readable
from day0.tools.checkpoints.common import tiny_config, write_seeded

# Bump when anything that changes the written bytes changes (config, tweaks, tokenizer).
DEMO_VERSION = 2  # 2: tokenizer_config.json and a chat template
DEMO_SEED = 0
MARKER = ".complete"

DEMO_CONFIG: dict = dict(
    vocab_size=320,  # 256 bytes + <bos> + <eos> + 62 merges
    hidden_size=64,
    intermediate_size=128,  # dense MLP (layer 0)
    moe_intermediate_size=32,
    num_hidden_layers=2,
    first_k_dense_replace=1,  # layer 0 dense, layer 1 MoE
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    n_routed_experts=8,
    n_shared_experts=1,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    index_n_heads=16,
    index_head_dim=32,
    index_topk=16,  # < prompt lengths of the tests, so selection is really sparse
    max_position_embeddings=512,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    bos_token_id=256,
    eos_token_id=257,
    tie_word_embeddings=False,
)

# Post-init tie-breaking constants (see module docstring; tools/bench/bench_checkpoint.py draws with them too).
INDEXER_K_NORM_BIAS = 0.75
INDEXER_WEIGHT_SCALE = 4.0
ROUTER_BIAS_STD = 0.01
# The tie breakers as post-init changes (common.apply_inits); INDEXER_INITS serves every DSA indexer
# of transformers' form (glm5_next's too).
INDEXER_INITS = {
    "k_norm.bias": ("fill_", INDEXER_K_NORM_BIAS),
    "wq_b.weight": ("mul_", INDEXER_WEIGHT_SCALE),
    "weights_proj.weight": ("mul_", INDEXER_WEIGHT_SCALE),
}
INITS = {
    "DeepseekV32Indexer": INDEXER_INITS,
    "DeepseekV32TopkRouter": {"e_score_correction_bias": ("normal_", 0.0, ROUTER_BIAS_STD)},
}

BOS, EOS = "<bos>", "<eos>"
# A plain role-tagged chat format: <bos><|user|>\nHello<eos>\n<|assistant|>\n
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Merges appended after the specials (ids 258...), each `prefix + last char` of an earlier
# token; a space is the byte-level "Ġ". Only there so the tokenizer covers the model vocab.
_MERGE_WORDS = [
    " t",
    " a",
    "he",
    "in",
    "re",
    "on",
    " th",
    "er",
    " s",
    "at",
    "en",
    "nd",
    " w",
    " o",
    "es",
    " the",
    "or",
    "is",
    "it",
    "ou",
    "an",
    " c",
    " b",
    " f",
    " m",
    " p",
    "ed",
    "ing",
    "ar",
    "al",
    " d",
    "le",
    " h",
    "as",
    "st",
    " i",
    " in",
    "ic",
    " an",
    " and",
    " to",
    " of",
    "ti",
    " l",
    " n",
    " e",
    " r",
    " g",
    "ll",
    "om",
    "ve",
    "ro",
    "ent",
    " be",
    "ly",
    "se",
    " y",
    " ha",
    "ch",
    "ut",
    " is",
    "ay",
]


def tiny_deepseek_v32_config(**overrides):
    """A DeepseekV32Config from DEMO_CONFIG with `overrides` applied (float32)."""
    return tiny_config("DeepseekV32Config", DEMO_CONFIG, overrides)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable char table (the one tokenizers' ByteLevel uses); index = byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def build_byte_tokenizer(vocab_size: int):
    """Byte-level BPE `tokenizers.Tokenizer`: ids 0..255 = bytes, 256 = <bos>, 257 = <eos>,
    then up to `vocab_size - 258` merges. Encoding adds no special tokens."""
    if vocab_size < 258:
        raise ValueError(f"vocab_size must be >= 258 for a byte-level tokenizer, got {vocab_size}")
    byte_chars = _bytes_to_unicode()
    vocab = {c: b for b, c in enumerate(byte_chars)}
    vocab[BOS], vocab[EOS] = 256, 257

    def to_byte_level(word: str) -> str:
        return "".join(byte_chars[b] for b in word.encode("utf-8"))

    merges = []
    for word in _MERGE_WORDS[: vocab_size - 258]:
        token = to_byte_level(word)
        left, right = token[:-1], token[-1]
        assert left in vocab and token not in vocab, word
        merges.append((left, right))
        vocab[token] = len(vocab)

    return byte_level_bpe(vocab, merges)


def byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]):
    """A byte-level BPE `tokenizers.Tokenizer` of `vocab` and `merges` (byte-level characters),
    <bos> and <eos> its special tokens; encoding adds none."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BOS, special=True), AddedToken(EOS, special=True)])
    return tok


def write_tiny_checkpoint(path, config, seed: int, max_shard_size=None, tokenizer: bool = True) -> Path:
    """Write a random `DeepseekV32ForCausalLM(config)` (float32, tie-breaking tweaks applied)
    to the directory `path` with `save_pretrained` (safetensors). `max_shard_size` None = one
    shard; `tokenizer` adds a byte-level tokenizer.json. Not atomic: see ensure_demo_checkpoint."""
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    path = write_seeded(path, "DeepseekV32ForCausalLM", config, seed, INITS, **kwargs)
    if tokenizer:
        write_tokenizer(path, config.vocab_size)
    return path


def write_tokenizer(path, vocab_size: int) -> None:
    """tokenizer.json, tokenizer_config.json (bos/eos) and chat_template.jinja, as transformers'
    save_pretrained writes them for a checkpoint."""
    save_tokenizer(build_byte_tokenizer(vocab_size), path)


def save_tokenizer(tokenizer, path) -> None:
    """A `tokenizers.Tokenizer` into `path` as transformers' save_pretrained writes it:
    tokenizer.json, tokenizer_config.json (<bos>/<eos>) and chat_template.jinja (CHAT_TEMPLATE)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(path))


def _stamp() -> dict:
    return {"demo_version": DEMO_VERSION, "seed": DEMO_SEED, "config": DEMO_CONFIG, "torch": torch.__version__}


def _write_marker(path: Path) -> None:
    """The marker lists every file with its size and sha256; it is written last."""
    files = {}
    for f in sorted(p for p in path.iterdir() if p.name != MARKER):
        files[f.name] = {"size": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    (path / MARKER).write_text(json.dumps({**_stamp(), "files": files}, indent=1, sort_keys=True) + "\n")


def is_complete(path) -> bool:
    """True when `path` holds a finished demo checkpoint of this version: the marker exists,
    matches this version / seed / config / torch, and every file it lists has its size
    (sizes only: hashing on every call would cost more than the check is worth)."""
    path = Path(path)
    try:
        marker = json.loads((path / MARKER).read_text())
        files = marker.pop("files")
        return marker == json.loads(json.dumps(_stamp())) and all(
            (path / name).stat().st_size == entry["size"] for name, entry in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def ensure_demo_checkpoint(path) -> Path:
    """Return `path`, creating the demo checkpoint there first unless it is already complete.
    An incomplete or outdated directory at `path` is replaced; a concurrent creator that
    finishes first wins."""
    path = Path(path)
    if is_complete(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        total = sum(p.numel() * p.element_size() for p in _demo_model_param_shapes())
        # Shard limit a bit above half the weights: save_pretrained then writes exactly 2 shards.
        write_tiny_checkpoint(tmp, tiny_deepseek_v32_config(), DEMO_SEED, max_shard_size=int(total * 0.6))
        make_readable(tmp)
        _write_marker(tmp)
        try:
            os.replace(tmp, path)  # atomic when `path` does not exist (or is an empty dir)
        except OSError:
            if is_complete(path):
                return path  # another process created it meanwhile
            # A stale or half-written directory: move it aside, then swap the new one in.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / path.name)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _demo_model_param_shapes():
    from transformers import DeepseekV32ForCausalLM

    with torch.device("meta"):
        model = DeepseekV32ForCausalLM(tiny_deepseek_v32_config())
    return list(model.state_dict().values())


@torch.no_grad()
def _indexer_scores(indexer, hidden_states, q_resid, position_embeddings, attention_mask):
    """Recompute DeepseekV32Indexer.forward's index scores (transformers 5.23, no cache).
    Returns I: [B, S, T] float32 with masked positions at -inf."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    B, S, _ = hidden_states.shape
    cos, sin = position_embeddings
    r = indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(B, S, indexer.n_heads, indexer.head_dim)  # [B, S, H, D]
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)  # [B, S, 1, D]
    q_rot, k_rot = apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q[..., r:]], dim=-1)
    k = torch.cat([k_rot, k[..., r:]], dim=-1).squeeze(2)  # [B, S, D]
    scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale)
    w = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float() * indexer.n_heads**-0.5
    index_scores = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]
    if attention_mask.dtype == torch.bool:
        visible = attention_mask
    else:
        visible = attention_mask == 0
    return index_scores.masked_fill(~visible, float("-inf"))


@torch.no_grad()
def indexer_scores(model, input_ids) -> list:
    """Index scores of every layer for one forward pass over `input_ids` [1, S] (no cache):
    a list (per layer) of (scores [S, S] float32 with -inf above the diagonal, the indexer's
    own top-k indices [S, k] int32)."""
    captured = []
    handles = []

    def hook(module, args, kwargs, output):
        names = ["hidden_states", "q_resid", "position_embeddings", "attention_mask"]
        inputs = dict(zip(names, args)) | {n: kwargs[n] for n in names if n in kwargs}
        captured.append((_indexer_scores(module, **inputs)[0], output[0]))

    for module in model.modules():
        if type(module).__name__ == "DeepseekV32Indexer":
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        model(input_ids=input_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return captured


def selection_margin(model, input_ids) -> float:
    """Smallest relative top-k gap of the indexer over all layers and queries of one forward
    pass over `input_ids` [1, S]: min over queries t with more than k visible keys of
    (I_k - I_(k+1)) / max_s |I[t, s]| (scores sorted descending, k = index_topk).
    0 means an exact tie decides the selection somewhere; inf when no query has > k keys."""
    k = model.config.index_topk
    margin = float("inf")
    for scores, _ in indexer_scores(model, input_ids):
        for t in range(k, scores.shape[0]):  # query t sees t + 1 > k keys
            row = scores[t, : t + 1].double()
            top = torch.topk(row, k + 1).values
            gap = (top[k - 1] - top[k]).item()
            margin = min(margin, gap / max(row.abs().max().item(), 1e-30))
    return margin
