"""One request's generation as the handlers see it: engine progress -> text deltas -> OpenAI objects.

`Generation` follows one submitted Job: it reads the engine's Progress events, turns tokens into
text (tools/serve/text.py: incremental decoding and stop strings), keeps the token ids and
log-probabilities, records the request's latencies in the metrics, and ends the engine request
when a stop string is found. The completions and chat handlers share it and differ only in the
objects they build (`completion_*`, `chat_*` below).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from day0.tools.serve.protocol import ApiError
from day0.tools.serve.text import TextStream

# the Engine's finish reasons -> OpenAI's (a non-finite logits row is an error, not a finish)
FINISH = {"length": "length", "stop": "stop", "abort": "abort"}


@dataclass
class Delta:
    """What one engine step added to a request's answer."""

    text: str
    token_ids: list[int]
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    finish_reason: str | None = None


class Generation:
    def __init__(self, worker, job, tokenizer, metrics, stop_strings, arrival: float):
        self.worker, self.job, self.tok, self.metrics = worker, job, tokenizer, metrics
        self.stream = TextStream(tokenizer, stop_strings) if tokenizer is not None else None
        self.arrival = arrival
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self._last: float | None = None

    async def deltas(self):
        """Async iterator of Delta until the answer ends; ApiError when the engine failed it.
        Leaving early (a client gone) aborts the engine request (`close`)."""
        try:
            while self.finish_reason is None:
                p = _merge(await self.job.events.get(), self.job.events)
                if isinstance(p, ApiError):
                    self.job.done = True
                    raise p
                yield self._advance(p)
        finally:
            self.close()

    def close(self) -> None:
        """End the engine request if it still runs (client gone, stop string): frees its blocks."""
        if not self.job.done:
            self.worker.cancel(self.job)
            if self.finish_reason is None:
                self.finish_reason = "abort"
                self.metrics.finished.labels(finish_reason="abort").inc()

    def _advance(self, p) -> Delta:
        now = time.perf_counter()
        if p.tokens:
            self.metrics.generation_tokens.inc(len(p.tokens))
            if self._last is None:
                self.metrics.ttft.observe(now - self.arrival)
            else:  # a step brings one token a sequence; k tokens would share the gap
                for _ in p.tokens:
                    self.metrics.itl.observe((now - self._last) / len(p.tokens))
            self._last = now
        if p.finished == "nonfinite":
            self.job.done = True
            self.metrics.errors.labels(status="500").inc()
            raise ApiError(500, "the model produced non-finite logits for this request", code="nonfinite_logits")
        shown = p.tokens[:-1] if p.finished == "stop" else p.tokens  # a stop token is not text
        self.token_ids.extend(p.tokens)
        text = ""
        if self.stream is not None:
            text = self.stream.push(shown)
            if p.finished is not None or self.stream.stopped:
                text += self.stream.finish()
        reason = "stop" if self.stream is not None and self.stream.stopped else FINISH.get(p.finished)
        if reason is not None:
            self.job.done = self.job.done or p.finished is not None
            self.finish_reason = reason
            self.close()  # a stop string: the engine request still runs
            self.metrics.finished.labels(finish_reason=reason).inc()
            self.metrics.e2e.observe(now - self.arrival)
        return Delta(text, list(p.tokens), list(p.logprobs), reason)

    def token_text(self, token: int) -> str:
        return self.tok.decode([token], skip_special_tokens=False) if self.tok is not None else ""


def _merge(first, queue):
    """`first` and every update already waiting behind it as one: when the handler falls behind
    the engine (a slow client, a busy host), it sends one chunk for several steps instead of a
    backlog of one-token chunks. An error anywhere wins."""
    if queue.empty() or isinstance(first, ApiError):
        return first
    tokens, logprobs, finished = list(first.tokens), list(first.logprobs), first.finished
    while not queue.empty() and finished is None:
        p = queue.get_nowait()
        if isinstance(p, ApiError):
            return p
        tokens += p.tokens
        logprobs += p.logprobs
        finished = p.finished
    return type(first)(tokens, finished, logprobs)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_logprobs(gen: Generation, delta: Delta, offset: int) -> dict:
    """The legacy completions form: parallel lists (text_offset counts characters before each token)."""
    tokens = [gen.token_text(t) for t in delta.token_ids[: len(delta.logprobs)]]
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp for lp, _ in delta.logprobs],
        "top_logprobs": [{gen.token_text(i): v for i, v in top} for _, top in delta.logprobs],
        "text_offset": offsets,
    }


def chat_logprobs(gen: Generation, delta: Delta) -> dict:
    def entry(token: int, lp: float) -> dict:
        text = gen.token_text(token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
            for t, (lp, top) in zip(delta.token_ids, delta.logprobs)
        ]
    }
