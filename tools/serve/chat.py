"""The checkpoint's own chat template, rendered as transformers renders it.

A Hugging Face checkpoint ships its template as `chat_template.jinja` (transformers 5) or as the
`chat_template` field of `tokenizer_config.json` (a string, or a list of named templates of which
"default" is used); `day0 compile` copies both files into the artifact. The environment is the one
transformers' `apply_chat_template` uses (jinja2's immutable sandbox, trim_blocks and
lstrip_blocks, loop controls, `tojson`, `raise_exception`, `strftime_now`), with the special
tokens of tokenizer_config.json (`bos_token`, `eos_token`, ...) as variables. The rendered text
already holds the template's special tokens: it is encoded without adding any.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """A template that cannot be read or rendered; the message names the file or the cause."""


class ChatTemplate:
    def __init__(self, source: str, origin: str, special: dict[str, str]):
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template in {origin} does not parse: {e}") from None
        self.origin, self.special = origin, special

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text of `messages` ([{"role", "content"}]); ChatTemplateError when the
        template refuses them (its raise_exception) or fails."""
        from jinja2 import TemplateError

        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **self.special)
        except _Refused as e:
            raise ChatTemplateError(f"the chat template refused the messages: {e}") from None
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as e:
            raise ChatTemplateError(f"the chat template in {self.origin} failed on these messages: {e}") from None


def load_chat_template(directory) -> ChatTemplate | None:
    """The template shipped in `directory` (an artifact or a checkpoint); None when it has none."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    config: dict = {}
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as e:
            raise ChatTemplateError(f"cannot read {config_path}: {e}") from None
        if not isinstance(config, dict):
            raise ChatTemplateError(f"{config_path} is not a JSON object")
    special = {k: _token_text(config[k]) for k in SPECIAL if config.get(k) is not None}
    file = directory / TEMPLATE_FILE
    if file.exists():
        try:
            return ChatTemplate(file.read_text(), str(file), special)
        except OSError as e:
            raise ChatTemplateError(f"cannot read {file}: {e}") from None
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None:
        return None
    if not isinstance(source, str):
        raise ChatTemplateError(f"{config_path}: 'chat_template' must be a string or a list of named templates")
    return ChatTemplate(source, f"{config_path} (chat_template)", special)


class _Refused(Exception):
    pass


def _raise(message):
    raise _Refused(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _token_text(token) -> str:
    """A special token as tokenizer_config.json stores it: a string or {"content": ...}."""
    return token.get("content", "") if isinstance(token, dict) else str(token)
