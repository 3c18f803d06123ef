"""runtime/tokenizer.py on the demo's byte-level tokenizer: exact round trips, special ids."""

import json

import pytest

from day0.runtime.tokenizer import REPLACEMENT, TokenizerError, load_tokenizer
from day0.tools.checkpoints.demo import DEMO_CONFIG, build_byte_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    build_byte_tokenizer(DEMO_CONFIG["vocab_size"]).save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  \n\ttabs\r\n",
    "naïve café — “quotes” ¿qué? ß",
    "日本語のテキスト, 中文, 한국어",
    "emoji 🙂👍🏽 and a ZWJ family 👨‍👩‍👧",
    "\x00\x01\x7f control bytes",
    "the the the and and you",  # merged tokens
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_exact(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_empty(tok):
    assert tok.encode("") == []
    assert tok.decode([]) == ""


def test_bytes_are_their_own_ids(tok):
    # One token per byte where no merge applies: id == byte value.
    assert tok.encode("Q") == [ord("Q")]
    assert tok.encode("é") == list("é".encode())
    assert tok.encode("\x00") == [0]


def test_merges_shorten_english(tok):
    text = "the cat and the dog"
    assert len(tok.encode(text)) < len(text.encode("utf-8"))


def test_special_tokens(tok):
    assert tok.token_to_id("<bos>") == DEMO_CONFIG["bos_token_id"] == 256
    assert tok.token_to_id("<eos>") == DEMO_CONFIG["eos_token_id"] == 257
    assert tok.id_to_token(256) == "<bos>"
    assert tok.vocab_size == DEMO_CONFIG["vocab_size"]  # every model id decodes
    # encode adds none (the runtime decides about <bos>); written out, they are recognized...
    assert 256 not in tok.encode("hi")
    assert tok.encode("<bos>hi") == [256, *tok.encode("hi")]
    # ...decode skips them unless asked.
    hi = tok.encode("hi")
    assert tok.decode([256, *hi, 257]) == "hi"
    assert tok.decode([256, *hi, 257], skip_special_tokens=False) == "<bos>hi<eos>"


def test_unknown_ids_decode_to_replacement(tok):
    a, b = tok.encode("a"), tok.encode("é")
    assert tok.decode([*a, tok.vocab_size + 5, *b]) == "a" + REPLACEMENT + "é"
    assert tok.decode([-1]) == REPLACEMENT


def test_numpy_ids(tok):
    np = pytest.importorskip("numpy")
    ids = tok.encode("naïve")
    assert tok.decode(np.array(ids, dtype=np.int64)) == "naïve"


def test_no_tokenizer_json_is_none(tmp_path):
    assert load_tokenizer(tmp_path) is None


def test_file_path_and_artifact_dir(tok_dir, tmp_path):
    # A path to the file itself, and a tokenizer copied next to an artifact, both load.
    assert load_tokenizer(tok_dir / "tokenizer.json").encode("x") == [ord("x")]
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    assert load_tokenizer(tmp_path).decode([ord("x")]) == "x"


def test_errors_are_clear(tmp_path):
    with pytest.raises(TokenizerError, match="no such"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Nonsense"}}))
    with pytest.raises(TokenizerError, match=str(tmp_path / "tokenizer.json")):
        load_tokenizer(tmp_path)


def test_encode_rejects_non_str(tok):
    with pytest.raises(TokenizerError, match="str"):
        tok.encode(b"bytes")


def test_small_vocab_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        build_byte_tokenizer(200)
