"""The OpenAI request bodies `day0 serve` accepts, and the error object it answers with.

Bodies are validated strictly (pydantic, strict mode, unknown fields refused), so a wrong type
or an unknown parameter is a 400 that names the field, never a silent coercion or a parameter
quietly ignored. Parameters the engine cannot honour (n > 1, echo, best_of, penalties,
logit_bias, tools, response formats) are refused by name rather than ignored.

Extensions beside OpenAI's fields (vLLM spells them the same way): `top_k`, `stop_token_ids`,
`ignore_eos`, and `return_token_ids` (the choice then carries `token_ids`, the generated ids, and
the response `prompt_token_ids`).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

MAX_STOP = 16  # stop strings or ids a request may give
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound for the legacy completions API
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat


class ApiError(Exception):
    """An answer other than 200: the HTTP status and OpenAI's error object
    {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 500: "internal_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        kind = self.TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


Number = StrictInt | StrictFloat


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    """What completions and chat share."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: StrictStr
    temperature: Annotated[Number, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[Number, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=-1)] = 0  # 0 or -1: off
    seed: Annotated[StrictInt, Field(ge=0, lt=2**63)] | None = None
    stop: StrictStr | Annotated[list[StrictStr | StrictInt], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=MAX_STOP)] | None = None
    ignore_eos: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1)] = 1
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    return_token_ids: StrictBool = False

    # parameter -> the values day0 serve supports, the first as the message shows it (any
    # other value is refused by name)
    _ONLY: ClassVar[dict] = {
        "n": (1,),
        "presence_penalty": (0,),
        "frequency_penalty": (0,),
        "logit_bias": ("none", None, {}),
    }

    def check_supported(self) -> None:
        for name, allowed in self._ONLY.items():
            got = getattr(self, name)
            if got not in allowed[1:] and got != allowed[0]:
                raise ApiError(
                    400, f"'{name}' = {_short(got)} is not supported by day0 serve (only {allowed[0]})", name
                )

    def stops(self) -> tuple[list[str], list[int]]:
        """(stop strings, stop token ids) from `stop` (strings and ids mixed) and `stop_token_ids`."""
        items = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        strings = [s for s in items if isinstance(s, str)]
        if any(s == "" for s in strings):
            raise ApiError(400, "stop strings must not be empty", "stop")
        ids = [i for i in items if isinstance(i, int)] + list(self.stop_token_ids or [])
        if any(i < 0 for i in ids):
            raise ApiError(400, "stop token ids must be >= 0", "stop")
        return strings, ids


PromptIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_Sampling):
    prompt: StrictStr | PromptIds | Annotated[list[StrictStr | PromptIds], Field(min_length=1, max_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    _ONLY: ClassVar[dict] = {**_Sampling._ONLY, "echo": (False,), "best_of": (1, None), "suffix": ("none", None)}

    def prompt_one(self) -> str | list[int]:
        """The one prompt: a string or token ids (a one-element batch is unwrapped)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return p[0]
        return p


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ImageUrl(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    url: StrictStr
    detail: StrictStr | None = None


class ImagePart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["image_url"]
    image_url: ImageUrl


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[Part] | None = None
    name: StrictStr | None = None


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    add_generation_prompt: StrictBool = True  # extension (vLLM's name): end with the assistant's turn

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def validation_error(errors: list[dict]) -> ApiError:
    """A 400 naming the first field pydantic (or the JSON decoder) refused."""
    e = errors[0] if errors else {"loc": (), "msg": "invalid request body", "type": ""}
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    if e.get("type") == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e['msg'])}")
    if e.get("type") == "model_attributes_type" or not loc:
        return ApiError(400, f"the request body must be a JSON object: {e.get('msg')}")
    # pydantic names union members in the location (e.g. `prompt.str`); keep the field path
    param = ".".join(p for p in loc if not _is_member_tag(p))
    tag = next((i for i, p in enumerate(loc) if _is_member_tag(p)), None)
    if tag and loc[tag - 1] in UNION_HINTS:  # a field of several forms: say which forms it takes
        param = ".".join(loc[:tag])
        return ApiError(400, f"'{param}' must be {UNION_HINTS[loc[tag - 1]]}", param)
    if e.get("type") == "extra_forbidden":
        return ApiError(400, f"unknown or unsupported parameter '{param}'", param)
    if e.get("type") == "missing":
        return ApiError(400, f"'{param}' is required", param)
    return ApiError(400, f"'{param}': {e.get('msg')} (got {_short(e.get('input'))})", param)


# what a field of several accepted forms takes, for its error message
UNION_HINTS = {
    "prompt": "a string, a list of token ids, or a one-element list of either",
    "stop": "a string or a list of strings and token ids",
    "content": "a string or a list of content parts ({'type': 'text', 'text': ...})",
}


def _is_member_tag(part: str) -> bool:
    return part.startswith(("str", "int", "float", "list[", "function-", "constrained", "union[", "tagged-union"))


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
