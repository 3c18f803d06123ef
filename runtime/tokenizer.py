"""Text <-> token ids for `day0 generate`, from a Hugging Face `tokenizer.json`.

The file is looked up in a checkpoint directory or in an artifact directory (the compile step
copies it next to `model.vmfb`); a path to the file itself works too. A checkpoint without a
tokenizer is legal: `load_tokenizer` then returns None and the caller uses `--prompt-ids`.

Byte-level tokenizers (the demo's, DeepSeek's, GPT-2 style) round-trip any UTF-8 text exactly.
`encode` adds no special tokens (the runtime decides about <bos>); `decode` drops special
tokens and renders ids outside the tokenizer's vocabulary (a model vocab is often padded past
it) as U+FFFD, so printing what a random model generates never fails.
"""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
# what a checkpoint ships about its text that an artifact keeps (the compile step copies those that
# exist): the tokenizer, its special tokens, the chat template
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "chat_template.jinja")
REPLACEMENT = "\ufffd"


class TokenizerError(Exception):
    """A tokenizer.json that cannot be read or used."""


class Tokenizer:
    """Thin wrapper over `tokenizers.Tokenizer` with day0's encode/decode conventions."""

    def __init__(self, tok, path: Path):
        self._tok = tok
        self.path = path
        self.vocab_size: int = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens skipped by default, unknown ids become U+FFFD."""
        out, run = [], []
        for i in ids:
            i = int(i)
            if 0 <= i < self.vocab_size:
                run.append(i)
                continue
            # Decode known runs whole: a multi-byte character may span several byte tokens.
            if run:
                out.append(self._tok.decode(run, skip_special_tokens=skip_special_tokens))
                run = []
            out.append(REPLACEMENT)
        if run:
            out.append(self._tok.decode(run, skip_special_tokens=skip_special_tokens))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


def load_tokenizer(path) -> Tokenizer | None:
    """The tokenizer in `path` (a checkpoint or artifact directory, or a tokenizer.json file);
    None when a directory has no tokenizer.json. Raises TokenizerError when the file exists
    but cannot be loaded, or `path` does not exist."""
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(path)
    if path.is_dir():
        file = path / TOKENIZER_FILE
        if not file.exists():
            return None
    elif path.is_file():
        file = path
    else:
        raise TokenizerError(f"no such checkpoint or artifact directory: {path}")
    try:
        tok = HFTokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises bare Exception subclasses for parse errors
        raise TokenizerError(f"cannot load tokenizer {file}: {e}") from e
    return Tokenizer(tok, file)
