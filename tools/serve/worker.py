"""The engine process: the one place the `Engine` runs, and its bridge to the server's event loop.

The HTTP handlers run on asyncio in the server process; the Engine (numpy + IREE) runs in a
process of its own, forked before the server starts any thread, so that neither waits for the
other's GIL: measured on this project's CPU machine, a busy Python thread beside the Engine made
its step 2-6x slower (docs/perf.md, 'day0 serve'). The engine process loops: take the commands
that arrived over its pipe (add a request, abort one), run one `Engine.step()`, send every
request's new tokens back in one message with the Engine's counters. A request joins the running
batch at the next step (continuous batching), and a long prompt runs a chunk a step between
decode steps (the Engine's scheduler). The server reads the messages on its event loop
(`add_reader` on the pipe) and hands each request its progress.

Admission control: a request is refused with 429 (and Retry-After) when `max_waiting` requests
are already waiting for admission, rather than queueing without bound.

Failures: a request the Engine refuses at `add` (too long for the artifact or the pool) gets its
400; an exception inside a step fails the requests that were running (a 500 each, their blocks
freed) and the engine goes on with the ones after; an engine process that dies fails every
request in flight and /health turns 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import signal
import time
from dataclasses import dataclass, field

from day0.tools.serve.protocol import ApiError

log = logging.getLogger("day0.engine")
runtime_log = logging.getLogger("day0.runtime")
RETRY_AFTER_S = 1
IDLE_WAIT_S = 0.5  # how long an idle engine waits on its pipe before looking again
LOAD_TIMEOUT_S = 1800  # loading a large artifact (hashing its shards) takes a while


class ServeError(ValueError):
    """The engine could not be started (the message names why: artifact, device, pool)."""


@dataclass
class EngineInfo:
    """What the server needs to know of the loaded Engine."""

    max_seq_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_running: int
    architecture: str
    target: str
    block_size: int
    blocks: int
    # images (an artifact that runs them: Engine.vision): the placeholder id, the image
    # processor's settings (runtime/images.py ImageConfig) and the merge size; None otherwise
    image_token_id: int | None = None
    image_config: object = None
    merge_size: int = 2


@dataclass
class Job:
    """One accepted request. `events` (on the event loop) receives Progress-like records
    (tokens, finished, logprobs), or an ApiError when the engine failed it."""

    request_id: str
    ids: list[int]
    params: dict  # Engine.add keyword arguments
    kind: str = "text"
    key: int = -1  # the server's id for it, set at submit
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    added: asyncio.Future | None = None  # settled when the engine has queued it (or refused it)
    done: bool = False


@dataclass
class Update:
    tokens: list[int]
    finished: str | None
    logprobs: list


class EngineWorker:
    def __init__(self, engine_args: dict, metrics, max_waiting: int, warmup: bool = True):
        """Fork the engine process and wait until it has loaded the artifact (ServeError if not)."""
        self.metrics, self.max_waiting = metrics, max_waiting
        ctx = multiprocessing.get_context("fork")  # before any thread: the child inherits a clean process
        self._commands, child_commands = ctx.Pipe()
        self._results, child_results = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_engine_main, args=(engine_args, warmup, child_commands, child_results), name="day0-engine"
        )
        self._proc.daemon = True
        self._proc.start()
        child_commands.close()
        child_results.close()
        if not self._results.poll(LOAD_TIMEOUT_S):
            self._proc.kill()
            raise ServeError(f"the engine did not load the artifact within {LOAD_TIMEOUT_S} s")
        try:
            kind, payload = self._results.recv()
        except EOFError:
            raise ServeError(f"the engine process exited while loading (exit code {self._proc.exitcode})") from None
        if kind == "error":
            self._proc.join(10)
            raise ServeError(payload)
        self.info: EngineInfo = payload
        self.ready = False
        self.dead = False
        self._jobs: dict[int, Job] = {}
        self._keys = itertools.count()
        self._waiting = 0  # requests the engine holds that are not admitted yet
        self._pending = 0  # adds sent, not yet answered
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    # -- event-loop side ----------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._results.fileno(), self._on_message)

    def stop(self, timeout: float = 10.0) -> None:
        """End the engine process (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self._loop is not None and not self.dead and not self._loop.is_closed():
            self._loop.remove_reader(self._results.fileno())
        with contextlib.suppress(OSError):  # an engine process that has died already
            self._commands.send(("stop",))
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout)

    async def submit(self, job: Job) -> None:
        """Hand `job` to the engine; returns once it is queued there. ApiError 429 when the
        waiting queue is full, 400 when the engine refuses the request, 503 when it is gone."""
        if self.dead:
            raise ApiError(503, "the engine has stopped; the server cannot answer", code="engine_stopped")
        if self._waiting + self._pending >= self.max_waiting:
            raise ApiError(
                429,
                f"the server is at its queue limit ({self.max_waiting} requests waiting): retry later",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        job.key = next(self._keys)
        job.added = self._loop.create_future()
        self._jobs[job.key] = job
        self._pending += 1
        try:
            self._commands.send(("add", job.key, job.request_id, job.ids, job.params, job.kind))
            await job.added
        except asyncio.CancelledError:  # the client left before the engine took it: end it there too
            self.cancel(job)
            raise
        finally:
            self._pending -= 1

    def cancel(self, job: Job) -> None:
        """Abort `job` in the engine (frees its blocks at once); harmless when it already ended."""
        if not job.done:
            job.done = True
            self._jobs.pop(job.key, None)
            if not self.dead:
                self._commands.send(("abort", job.key))

    def _on_message(self) -> None:
        try:
            while self._results.poll():
                self._handle(*self._results.recv())
        except (EOFError, OSError):
            self._engine_died()

    def _handle(self, kind: str, payload) -> None:
        if kind == "ready":
            self.ready = True
            self.metrics.ready.set(1)
        elif kind == "added":
            for key, error in payload:
                job = self._jobs.get(key)
                if job is None or job.added.done():
                    continue
                if error is None:
                    job.added.set_result(None)
                else:
                    self._jobs.pop(key, None)
                    param = "max_tokens" if "max_tokens" in error else "messages" if job.kind == "image" else "prompt"
                    job.added.set_exception(ApiError(400, error, param))
        elif kind == "step":
            updates, counters = payload
            self.metrics.steps.inc()
            self.metrics.engine_counters(counters)
            self._waiting = counters["waiting"]
            for key, tokens, finished, logprobs in updates:
                job = self._jobs.get(key)
                if job is not None:
                    if finished is not None:
                        self._jobs.pop(key)
                    job.events.put_nowait(Update(tokens, finished, logprobs))
        elif kind == "failed":
            keys, counters = payload
            self.metrics.engine_counters(counters)
            error = ApiError(500, "internal error in the engine step (see the server log)")
            for key in keys:
                job = self._jobs.pop(key, None)
                if job is not None:
                    job.events.put_nowait(error)

    def _engine_died(self) -> None:
        self.dead = True
        self._loop.remove_reader(self._results.fileno())
        self._proc.join(1)
        log.critical("the engine process ended", extra={"exit_code": self._proc.exitcode})
        self.metrics.ready.set(0)
        error = ApiError(500, "the engine process ended (see the server log)")
        for job in self._jobs.values():
            if not job.added.done():
                job.added.set_exception(error)
            else:
                job.events.put_nowait(error)
        self._jobs.clear()


# -- the engine process ---------------------------------------------------------------------------
def _engine_main(engine_args: dict, warmup: bool, commands, results) -> None:
    """The engine process: load, warm up, then command batches and steps until told to stop."""
    from day0.runtime.engine import Engine

    for s in (signal.SIGINT, signal.SIGTERM):  # the server stops us (a "stop" command)
        signal.signal(s, signal.SIG_IGN)
    try:
        engine = Engine.load(**engine_args)
    except Exception as e:  # any failure to load is the user's to read, in one line
        from day0.runtime.artifact import WeightsError

        hint = " (if the checkpoint moved, pass --checkpoint-dir)" if isinstance(e, WeightsError) else ""
        text = " ".join(str(e).split()) or type(e).__name__
        results.send(
            ("error", (f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.strerror else text) + hint)
        )
        return
    c = engine.counters()
    results.send(
        (
            "loaded",
            EngineInfo(
                engine.max_seq_len,
                engine.vocab_size,
                tuple(engine.eos_token_ids),
                engine.max_running,
                engine.manifest.architecture,
                engine.manifest.target,
                engine.layout.block_size,
                c["blocks_free"] + c["blocks_used"],
                **(
                    {}
                    if engine.vision is None
                    else dict(
                        image_token_id=engine.vision.image_token_id,
                        image_config=engine.image_config,
                        merge_size=engine.vision.merge_size,
                    )
                ),
            ),
        )
    )
    if warmup:
        _warm_up(engine)
    results.send(("ready", None))
    rids: dict[int, int] = {}  # server key -> engine id
    keys: dict[int, tuple[int, str]] = {}  # engine id -> (server key, request id)
    while True:
        if not engine.has_work() and not commands.poll(IDLE_WAIT_S):
            continue
        added = []
        while commands.poll():
            command = commands.recv()
            if command[0] == "stop":
                return
            if command[0] == "add":
                _, key, request_id, ids, params, kind = command
                try:
                    rid = engine.add(ids, kind=kind, **params)
                except ValueError as e:  # EngineError, ImageError and the sampling checks
                    added.append((key, str(e)))
                    continue
                rids[key], keys[rid] = rid, (key, request_id)
                added.append((key, None))
                log.info("queued", extra={"request_id": request_id, "prompt_tokens": len(ids), "kind": kind})
            elif command[0] == "abort" and command[1] in rids:
                rid = rids.pop(command[1])
                engine.abort(rid)
                log.info("aborted", extra={"request_id": keys.pop(rid)[1]})
        if added:
            results.send(("added", added))
        if not engine.has_work():
            results.send(("step", ([], engine.counters())))
            continue
        try:
            progress = engine.step()
        except Exception:
            running = [rid for rid in keys if engine.phase(rid) not in (None, "waiting")]
            log.exception("engine step failed; failing the running requests", extra={"running": len(running)})
            for rid in running:
                engine.abort(rid)
                rids.pop(keys[rid][0], None)
            results.send(("failed", ([keys.pop(rid)[0] for rid in running], engine.counters())))
            continue
        updates = []
        for rid, p in progress.items():
            if rid not in keys:
                continue
            key, request_id = keys[rid]
            if p.finished is not None:
                del keys[rid]
                rids.pop(key, None)
                log.info("finished", extra={"request_id": request_id, "finish_reason": p.finished})
            updates.append((key, p.tokens, p.finished, p.logprobs))
        results.send(("step", (updates, engine.counters())))


def _warm_up(engine) -> None:
    """Run requests that touch every entry point and batch size before /health says ready:
    as many sequences as may run at once, a prompt of a chunk and a token, decoding long
    enough that the decode batches grow through every compiled size."""
    from day0.runtime.engine import EngineError

    t0 = time.perf_counter()
    n = engine.max_running
    prompt = min(engine.chunk + 1, engine.max_seq_len // 2)
    new = max(1, min(n + 1, engine.max_seq_len - prompt))
    added = 0
    for i in range(n):
        try:
            engine.add([(7 * i + j) % engine.vocab_size for j in range(prompt)], max_new_tokens=new, stop=())
            added += 1
        except EngineError:  # a pool smaller than one such request: warm up with what fits
            break
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    runtime_log.info(
        "warm-up done", extra={"requests": added, "steps": steps, "seconds": round(time.perf_counter() - t0, 3)}
    )
