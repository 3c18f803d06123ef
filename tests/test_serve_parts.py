"""The server's parts without a server: incremental text with stop strings (tools/serve/text.py),
the chat template as transformers renders it (chat.py), request validation (protocol.py) and the
log levels per layer (logs.py)."""

import io
import json
import logging

import pytest

from day0.tools.checkpoints.demo import DEMO_CONFIG, write_tokenizer
from day0.tools.serve import logs
from day0.tools.serve.chat import ChatTemplateError, load_chat_template
from day0.tools.serve.protocol import ApiError, ChatRequest, CompletionRequest, validation_error
from day0.tools.serve.text import TextStream


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d, DEMO_CONFIG["vocab_size"])
    return d


@pytest.fixture(scope="module")
def tok(tokdir):
    from day0.runtime.tokenizer import load_tokenizer

    return load_tokenizer(tokdir)


def _stream(tok, text: str, stops=(), per_push: int = 1) -> tuple[str, list[str], bool]:
    ids = tok.encode(text)
    s = TextStream(tok, stops)
    pieces = [s.push(ids[i : i + per_push]) for i in range(0, len(ids), per_push)]
    pieces.append(s.finish())
    return "".join(pieces), pieces, s.stopped


@pytest.mark.parametrize("per_push", [1, 3])
def test_text_streams_whole_characters_and_equals_decode(tok, per_push):
    text = "naïve café — 日本語 ok 🙂 end"
    out, pieces, stopped = _stream(tok, text, per_push=per_push)
    assert out == text and not stopped
    assert all("\ufffd" not in p for p in pieces)  # a multi-byte character is held until whole


def test_stop_strings_end_the_text_before_them_even_across_tokens(tok):
    text = "The quick brown fox jumps over the lazy dog"
    out, _, stopped = _stream(tok, text, stops=["fox ju", "zzz"])
    assert out == "The quick brown " and stopped
    # (released text only grows, so nothing past the stop string ever went out)
    out, _, stopped = _stream(tok, text, stops=["dog!"])  # a prefix at the end is released at the end
    assert out == text and not stopped
    out, _, stopped = _stream(tok, "ab" * 10, stops=["ba"])
    assert out == "a" and stopped


def test_chat_template_renders_as_transformers(tokdir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokdir)
    ours = load_chat_template(tokdir)
    for messages in (
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    ):
        for gen in (True, False):
            assert ours.render(messages, gen) == hf.apply_chat_template(
                messages, add_generation_prompt=gen, tokenize=False
            )


def test_chat_template_sources_and_errors(tmp_path):
    assert load_chat_template(tmp_path) is None  # no template: chat gets its 400 later
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"eos_token": {"content": "</s>"}, "chat_template": [{"name": "default", "template": "{{ eos_token }}"}]}
        )
    )
    assert load_chat_template(tmp_path).render([]) == "</s>"
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}x"
    )
    t = load_chat_template(tmp_path)  # the .jinja file wins over the config's field
    assert t.render([{"role": "user", "content": "a"}]) == "x"
    with pytest.raises(ChatTemplateError, match="refused the messages: one only"):
        t.render([{"role": "user", "content": "a"}] * 2)
    (tmp_path / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja does not parse"):
        load_chat_template(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(ChatTemplateError, match=r"cannot read .*tokenizer_config.json"):
        load_chat_template(tmp_path)


def test_requests_are_checked_strictly_and_name_the_field():
    from pydantic import ValidationError

    def error(cls, body) -> dict:
        try:
            cls.model_validate(body).check_supported()
        except ValidationError as e:
            return validation_error(e.errors()).body()["error"]
        except ApiError as e:
            return e.body()["error"]
        return {}

    assert error(CompletionRequest, {"model": "m", "prompt": "x", "temperature": True})["param"] == "temperature"
    assert error(CompletionRequest, {"model": "m", "prompt": [1, "a"]})["param"] == "prompt"
    assert error(CompletionRequest, {"model": "m", "prompt": "x", "echo": True})["message"].startswith("'echo' = True")
    assert error(CompletionRequest, {"model": "m", "prompt": ["a", "b"]})["param"] == "prompt"
    assert error(ChatRequest, {"model": "m", "messages": [{"role": "user"}], "tools": []})["param"] == "tools"
    assert error(CompletionRequest, {"model": "m", "prompt": "x", "best_of": 1, "logit_bias": {}}) == {}
    r = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stop": ["a", 7], "stop_token_ids": [9]})
    assert r.stops() == (["a"], [7, 9])


def test_log_levels_per_layer():
    assert logs.parse_levels("info", "engine=debug,server=warning") == {
        "server": "warning",
        "engine": "debug",
        "runtime": "info",
    }
    with pytest.raises(ValueError, match="--log-level must be one of"):
        logs.parse_levels("loud", None)
    with pytest.raises(ValueError, match="level of engine must be one of"):
        logs.parse_levels("info", "engine=chatty")
    out = io.StringIO()
    logs.setup(logs.parse_levels("info", "engine=warning"), stream=out)
    logging.getLogger("day0.engine").info("hidden", extra={"request_id": "r1"})
    logging.getLogger("day0.server").info("shown", extra={"request_id": "r2"})
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["logger"], x["message"], x["request_id"]) for x in lines] == [("day0.server", "shown", "r2")]
