"""`day0 serve` with images: a real server process on the shared glm5_next vision artifact
(conftest glm5_vision_artifact: a tokenizer and a chat template that spells image parts as
<|begin_of_image|><|image|><|end_of_image|>), driven by the `openai` package and curl. A chat
request with image_url parts (data URLs) returns at temperature 0 the tokens of Session.generate
on the same template rendering and images; the usage counts the expanded prompt; bad image parts
get a 400 naming the part while a good request beside them is answered."""

import base64
import io
import json
import subprocess

import numpy as np
import openai
import pytest
from PIL import Image

from day0.runtime.session import Session
from day0.runtime.tokenizer import load_tokenizer
from day0.tools.serve.chat import load_chat_template
from day0.tools.serve.process import MODEL, ServerProcess

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}


def _png(w: int, h: int, seed: int, fmt: str = "PNG") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def _url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def _image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


TRUNCATED = _png(64, 64, 4)[:6000]  # half a PNG


@pytest.fixture(scope="module")
def server(glm5_vision_artifact, tmp_path_factory):
    s = ServerProcess(glm5_vision_artifact, tmp_path_factory.mktemp("serve-images") / "server.log")
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _solo(artifact, messages, images, n):
    """Session.generate's greedy tokens on the template's rendering (image parts as {"type": "image"})."""
    template, tok = load_chat_template(artifact), load_tokenizer(artifact)
    ids = tok.encode(template.render(messages))
    session = Session.load(artifact)
    return (
        ids,
        session.image_prompt(ids, images),
        session.generate(ids, max_new_tokens=n, images=images, stop_at_eos=False),
    )


def test_chat_with_images_equals_session_generate(client, glm5_vision_artifact):
    a, b = _png(84, 56, 1), _png(40, 30, 2, "JPEG")
    content = [
        {"type": "text", "text": "Look: "},
        _image_part(_url(a)),
        {"type": "text", "text": " and "},
        _image_part(_url(b, "jpeg")),
        {"type": "text", "text": " what?"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=6, **GREEDY
    )
    rendered = [{"role": "user", "content": [{"type": "image"} if p["type"] == "image_url" else p for p in content]}]
    ids, expanded, want = _solo(glm5_vision_artifact, rendered, [a, b], 6)
    assert r.choices[0].model_extra["token_ids"] == want
    assert r.usage.prompt_tokens == len(expanded) > len(ids)
    assert r.choices[0].finish_reason == "length"


def test_a_streamed_image_chat_with_curl(server, glm5_vision_artifact):
    a = _png(28, 56, 3)
    content = [_image_part(_url(a)), {"type": "text", "text": "Describe."}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "stream": True}
    body.update(temperature=0, ignore_eos=True, return_token_ids=True)
    out = subprocess.run(
        [
            "curl",
            "-sN",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body),
            server.url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    events = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("data:") and "[DONE]" not in line]
    tokens = [t for e in events for c in e["choices"] for t in c.get("token_ids") or []]
    rendered = [{"role": "user", "content": [{"type": "image"}, content[1]]}]
    assert tokens == _solo(glm5_vision_artifact, rendered, [a], 4)[2]


@pytest.mark.parametrize(
    "url, words",
    [
        ("https://example.com/cat.png", "does not fetch images"),
        ("file:///etc/passwd", "scheme 'file' is not supported"),
        ("data:image/png,rawbytes", "must be base64"),
        ("data:image/png;base64,@@@", "not valid base64"),
        (_url(b"not an image at all"), "not an image Pillow can read"),
        (_url(TRUNCATED), "truncated"),  # its header reads (the server's check), its pixels do not
    ],
)
def test_bad_image_parts_are_400s_naming_the_part(client, url, words):
    content = [{"type": "text", "text": "hi"}, _image_part(url)]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2)
    err = e.value.body
    assert words in err["message"]
    assert err["param"] == "messages.0.content.1.image_url.url" or "truncated" in err["message"]
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_an_image_past_the_context_is_a_400(client):
    big = _png(28 * 12, 28 * 12, 5)  # 144 image tokens; the context is 128
    content = [_image_part(_url(big)), {"type": "text", "text": "x"}]
    with pytest.raises(
        openai.BadRequestError, match=r"with its 1 image\(s\) is \d+ tokens; the model's context is 128"
    ):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2)


def test_evict_images_frees_the_image_blocks(glm5_vision_artifact, tmp_path):
    """`day0 serve --evict-images`: an image request's blocks of image tokens go back to the pool
    after its prompt (Engine evict_images), which /metrics counts; the request is answered."""
    s = ServerProcess(glm5_vision_artifact, tmp_path / "server.log", "--evict-images", "--no-warmup")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        content = [_image_part(_url(_png(280, 224, 6))), {"type": "text", "text": "hi"}]  # 80 image tokens
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=3)
        assert r.choices[0].finish_reason in ("length", "stop") and r.usage.prompt_tokens > 80
        m = s.metrics()
        assert m["day0_kv_blocks_evicted"] >= 4 and m["day0_kv_blocks_used"] == 0  # 80 tokens hold 4 whole blocks of 16
    finally:
        s.close()
