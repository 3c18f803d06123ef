"""`day0 serve`: the OpenAI-compatible HTTP service on the Engine (FastAPI + uvicorn).

    POST /v1/completions        prompt as text or token ids; stream with SSE (sse-starlette)
    POST /v1/chat/completions   messages through the checkpoint's chat template (tools/serve/chat.py)
    GET  /v1/models             the one served model
    GET  /health                200 once warm-up is done, 503 before
    GET  /metrics               Prometheus (tools/serve/metrics.py)

Every answer other than 200 is OpenAI's error object naming the field at fault (protocol.py); an
exception while serving one request is a 500 for that request alone, logged with its request id
and never shown to the client as a traceback. A client that goes away (a closed stream, or a
closed connection while a non-streamed answer is computed) ends its engine request at once, which
frees its blocks. The engine runs in a process of its own (worker.py); the handlers only wait on it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from dataclasses import dataclass

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from day0.runtime.loading import token_ids
from day0.tools.serve.chat import ChatTemplateError
from day0.tools.serve.generate import Generation, chat_logprobs, completion_logprobs, usage
from day0.tools.serve.protocol import ApiError, ChatRequest, CompletionRequest, validation_error
from day0.tools.serve.worker import Job

log = logging.getLogger("day0.server")
DEFAULT_CHAT_MAX_TOKENS = 512  # a chat request without max_tokens: at most this many, within the context
REQUEST_ID_HEADER = "x-request-id"


@dataclass
class ServeOptions:
    model_name: str
    graceful_s: float = 30.0  # on SIGTERM, how long running streams may go on (uvicorn's own limit)


class Service:
    """What the handlers share: the engine worker, the tokenizer and template, the metrics."""

    def __init__(self, worker, tokenizer, chat_template, options: ServeOptions):
        self.worker, self.tok, self.template, self.options = worker, tokenizer, chat_template, options
        self.engine = worker.info  # max_seq_len, vocab_size, eos_token_ids, ...
        self.metrics = worker.metrics
        self.created = int(time.time())

    # -- request -> job -----------------------------------------------------------------------
    async def read(self, request: Request, model):
        """The request's body as `model`, checked: JSON, fields, the model's name, support."""
        req = await _body(request, model)
        self.check_model(req.model)
        req.check_supported()
        return req

    def check_model(self, model: str) -> None:
        if model != self.options.model_name:
            raise ApiError(
                400,
                f"model '{model}' is not served here (this server serves '{self.options.model_name}')",
                "model",
                "model_not_found",
            )

    def encode(self, text: str, param: str) -> list[int]:
        if self.tok is None:
            raise ApiError(400, "this artifact has no tokenizer: send the prompt as token ids", param)
        return self.tok.encode(text)

    def job(
        self,
        request_id: str,
        ids: list[int],
        req,
        max_tokens: int | None,
        param: str,
        logprobs: int | None,
        images: list[tuple[bytes, int]] = (),
    ):
        """The engine job of a request (its checks as 400s naming the field); `images`: (encoded
        image, its image tokens) of each image placeholder in ids, in order. The length checks
        count the prompt as the engine runs it, each placeholder expanded. Returns (job, stop
        strings, the prompt's length)."""
        limit = self.engine.max_seq_len
        # the runtime's own check (empty, outside the vocabulary), as a 400 naming this request's field
        token_ids(ids, self.engine.vocab_size, lambda message: ApiError(400, message, param))
        n = len(ids)
        if images:
            found = ids.count(self.engine.image_token_id)
            if found != len(images):
                raise ApiError(
                    400,
                    f"the chat template put {found} image placeholder(s) in the prompt for {len(images)} image "
                    f"part(s): this model's template must render each image part as one placeholder",
                    param,
                )
            n += sum(count - 1 for _, count in images)
        images_note = f" with its {len(images)} image(s)" if images else ""
        if n >= limit:
            raise ApiError(
                400,
                f"the prompt{images_note} is {n} tokens; the model's context is {limit} (room for at most "
                f"{limit - 1} prompt tokens and one new token)",
                param,
            )
        if max_tokens is None:
            max_tokens = min(limit - n, DEFAULT_CHAT_MAX_TOKENS)
        elif n + max_tokens - 1 > limit:
            raise ApiError(
                400,
                f"the prompt{images_note} ({n} tokens) + max_tokens {max_tokens} needs {n + max_tokens - 1} "
                f"positions, more than the model's context of {limit}: max_tokens may be at most "
                f"{limit - n + 1}",
                "max_tokens",
            )
        strings, stop_ids = req.stops()
        stops = set(stop_ids) | (set() if req.ignore_eos else set(self.engine.eos_token_ids))
        params = dict(
            max_new_tokens=max_tokens,
            temperature=float(req.temperature),
            top_k=max(req.top_k, 0),
            top_p=float(req.top_p),
            seed=req.seed,
            stop=tuple(sorted(stops)),
            logprobs=logprobs,
        )
        if images:
            params["images"] = [data for data, _ in images]
            return Job(request_id, ids, params, kind="image"), strings, n
        return Job(request_id, ids, params), strings, n

    async def start(self, job: Job, strings: list[str]) -> Generation:
        arrival = time.perf_counter()
        await self.worker.submit(job)
        return Generation(self.worker, job, self.tok, self.metrics, strings, arrival)

    def chat_prompt(self, req: ChatRequest) -> tuple[str, list[tuple[bytes, int]]]:
        """The prompt text of the messages (the checkpoint's template) and the images of their
        image parts, in order, each with its image token count (tools/serve/images.py). Messages
        with images reach the template as content parts ({"type": "text", "text"}, {"type":
        "image"}), as transformers' apply_chat_template passes them; the others as strings."""
        if self.template is None:
            raise ApiError(
                400,
                "this model's checkpoint ships no chat template: use /v1/completions",
                "messages",
                "no_chat_template",
            )
        from day0.tools.serve.images import image_bytes, image_token_count

        messages, images = [], []
        for i, m in enumerate(req.messages):
            content = m.content
            if isinstance(content, list):
                if not any(part.type == "image_url" for part in content):
                    content = "".join(part.text for part in content)
                elif self.engine.image_token_id is None:
                    raise ApiError(
                        400,
                        "image inputs need an artifact with a vision tower; this one has none",
                        f"messages.{i}.content",
                        "images_not_supported",
                    )
                else:
                    parts = []
                    for j, part in enumerate(content):
                        if part.type == "text":
                            parts.append({"type": "text", "text": part.text})
                            continue
                        param = f"messages.{i}.content.{j}.image_url.url"
                        data = image_bytes(part.image_url.url, param)
                        count = image_token_count(data, self.engine.image_config, self.engine.merge_size, param)
                        images.append((data, count))
                        parts.append({"type": "image"})
                    content = parts
            messages.append({"role": m.role, "content": content or "", **({"name": m.name} if m.name else {})})
        try:
            return self.template.render(messages, add_generation_prompt=req.add_generation_prompt), images
        except ChatTemplateError as e:
            raise ApiError(400, str(e), "messages") from None


def create_app(worker, tokenizer, chat_template, options: ServeOptions) -> FastAPI:
    """The app over a started EngineWorker (worker.py)."""
    svc = Service(worker, tokenizer, chat_template, options)

    async def lifespan(app):
        svc.worker.start(asyncio.get_running_loop())
        yield
        svc.worker.stop()

    app = FastAPI(title="day0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = svc

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        svc.metrics.errors.labels(status=str(e.status)).inc()
        log.info("refused", extra={"request_id": _rid(request), "status": e.status, "error": e.message})
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.get("/health")
    async def health():
        if svc.worker.dead:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        if svc.worker.ready:
            return {"status": "ok"}
        return JSONResponse({"status": "warming up"}, status_code=503)

    @app.get("/metrics")
    async def metrics():
        body, kind = svc.metrics.exposition()
        return Response(body, media_type=kind)

    @app.get("/v1/models")
    async def models():
        card = {
            "id": options.model_name,
            "object": "model",
            "created": svc.created,
            "owned_by": "day0",
            "max_model_len": svc.engine.max_seq_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    @_guarded
    async def completions(request: Request):
        req = await svc.read(request, CompletionRequest)
        prompt = req.prompt_one()
        ids = svc.encode(prompt, "prompt") if isinstance(prompt, str) else list(prompt)

        def choice(gen, delta, offset, streaming):
            c = {"index": 0, "text": delta.text, "logprobs": None, "finish_reason": delta.finish_reason}
            if req.logprobs is not None:
                c["logprobs"] = completion_logprobs(gen, delta, offset)
            return c

        kinds = ("text_completion", "text_completion")
        return await _answer(svc, request, req, ids, "prompt", req.max_tokens, req.logprobs, kinds, choice)

    @app.post("/v1/chat/completions")
    @_guarded
    async def chat(request: Request):
        req = await svc.read(request, ChatRequest)
        text, images = svc.chat_prompt(req)
        ids = svc.encode(text, "messages")
        top = (req.top_logprobs or 0) if req.logprobs else None

        def choice(gen, delta, offset, streaming):
            c = {"index": 0, "logprobs": chat_logprobs(gen, delta) if req.logprobs else None}
            c["delta" if streaming else "message"] = (
                {"content": delta.text} if streaming else {"role": "assistant", "content": delta.text}
            )
            c["finish_reason"] = delta.finish_reason
            return c

        opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        kinds = ("chat.completion", "chat.completion.chunk")
        return await _answer(svc, request, req, ids, "messages", req.limit(), top, kinds, choice, opening, images)

    app.add_middleware(RequestIdMiddleware)
    return app


async def _answer(
    svc: Service, request: Request, req, ids, param, limit, logprobs, kinds, choice, opening=None, images=()
):
    """Run one request and answer it, as one JSON object or as a stream: `kinds` the objects'
    names (whole, chunk); `choice(gen, delta, text offset, streaming)` builds a choice of the
    endpoint's form (token ids are added here when asked for); `opening`: a first stream chunk;
    `images`: Service.job's. The usage counts the prompt's tokens as the engine runs them."""
    job, strings, prompt_tokens = svc.job(_rid(request), ids, req, limit, param, logprobs, images)
    gen = await svc.start(job, strings)
    svc.metrics.prompt_tokens.inc(prompt_tokens)

    def full_choice(delta, offset, streaming=False):
        c = choice(gen, delta, offset, streaming)
        if req.return_token_ids:
            c["token_ids"] = delta.token_ids
        return c

    head = {"id": job.request_id, "object": kinds[req.stream], "created": int(time.time()), "model": req.model}
    if req.stream:
        return _sse(svc.options, gen, req, prompt_tokens, head, lambda d, off: full_choice(d, off, True), opening)
    delta = await _collect(request, gen)
    body = {**head, "choices": [full_choice(delta, 0)], "usage": usage(prompt_tokens, len(gen.token_ids))}
    if req.return_token_ids:
        body["prompt_token_ids"] = ids
    return body


async def _body(request: Request, model):
    from pydantic import ValidationError

    raw = await request.body()
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(obj).__name__}")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


async def _collect(request: Request, gen: Generation):
    """The whole answer as one Delta; a client that closes its connection meanwhile ends it."""
    from day0.tools.serve.generate import Delta

    async def gather():
        out = Delta("", [], [])
        async for d in gen.deltas():
            out.text += d.text
            out.token_ids += d.token_ids
            out.logprobs += d.logprobs
            out.finish_reason = d.finish_reason
        return out

    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.ensure_future(gather()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            gen.close()
    if not work.done() or work.cancelled():
        log.info("client went away", extra={"request_id": gen.job.request_id})
        return Response(status_code=499)
    return work.result()


def _sse(
    options: ServeOptions, gen: Generation, req, prompt_tokens: int, head: dict, choice, opening=None
) -> EventSourceResponse:
    """The answer as server-sent events: a chunk a step that added something (text, a finish
    reason, log-probabilities or token ids when asked for), the usage chunk when asked for, then
    `data: [DONE]`. An error after the stream began is one `data: {"error": ...}` event. On
    SIGTERM a running stream goes on to its end, within the graceful-shutdown period (a stream
    still running then is cut, and its request aborted)."""
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def events():
        offset = 0
        try:
            if opening is not None:
                yield {"data": json.dumps({**head, "choices": [opening]})}
            async for delta in gen.deltas():
                extra = delta.logprobs or (req.return_token_ids and delta.token_ids)
                if not (delta.text or delta.finish_reason or extra):
                    continue
                yield {"data": json.dumps({**head, "choices": [choice(delta, offset)]})}
                offset += len(delta.text)
            if include_usage:
                yield {"data": json.dumps({**head, "choices": [], "usage": usage(prompt_tokens, len(gen.token_ids))})}
        except ApiError as e:
            yield {"data": json.dumps(e.body())}
        except Exception:
            log.exception("internal error while streaming", extra={"request_id": gen.job.request_id})
            yield {"data": json.dumps(ApiError(500, f"internal error (request {gen.job.request_id})").body())}
        finally:
            gen.close()
        yield {"data": "[DONE]"}

    return EventSourceResponse(
        events(),
        ping=15,
        headers={"X-Request-Id": gen.job.request_id},
        shutdown_event=anyio.Event(),  # we finish the answer instead of watching for it
        shutdown_grace_period=max(options.graceful_s - 1, 0),
    )


def _guarded(handler):
    """An unexpected exception in a handler: logged with the request id and its traceback, and
    answered as a 500 for that request alone (no traceback to the client)."""

    @functools.wraps(handler)
    async def run(request: Request):
        try:
            return await handler(request)
        except (ApiError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("internal error", extra={"request_id": _rid(request)})
            raise ApiError(500, f"internal error (request {_rid(request)})", code="internal_error") from None

    return run


def _rid(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id", "-")


class RequestIdMiddleware:
    """Gives every request an id (the client's X-Request-Id, or a new one), returns it as a
    header, and writes one access line with it when the response is done (pure ASGI, so that
    streaming and disconnects pass through untouched)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", [])).get(REQUEST_ID_HEADER.encode())
        rid = given.decode("latin-1")[:128] if given else f"cmpl-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = rid
        t0, status = time.perf_counter(), [0]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != REQUEST_ID_HEADER.encode()]
                message = {**message, "headers": [*headers, (REQUEST_ID_HEADER.encode(), rid.encode("latin-1"))]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log.info(
                "access",
                extra={
                    "request_id": rid,
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status[0],
                    "seconds": round(time.perf_counter() - t0, 4),
                },
            )
