"""The engine thread: the one place the `Engine` is called, and its bridge to the event loop.

The HTTP handlers run on asyncio; the Engine (numpy + IREE, not thread-safe) runs on one thread
of its own, in a loop: take the commands that arrived (add a request, abort one), run one
`Engine.step()`, hand every request's new tokens to its handler in one callback on the event
loop. A request joins the running batch at the next step (continuous batching), and a long
prompt runs a chunk a step between decode steps (the Engine's scheduler).

Admission control: a request is refused with 429 (and Retry-After) when `max_waiting` requests
are already waiting for admission, rather than queueing without bound.

Failures: a request the Engine refuses at `add` (too long for the artifact or the pool) gets its
400; an exception inside a step fails the requests that were running (500 each, their blocks
freed) and the loop goes on with the ones that arrive after.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from day0.runtime.engine import EngineError
from day0.tools.serve.protocol import ApiError

log = logging.getLogger("day0.engine")
runtime_log = logging.getLogger("day0.runtime")
RETRY_AFTER_S = 1
IDLE_WAIT_S = 0.5  # how long the idle loop sleeps between looks at its stop flag


@dataclass
class Job:
    """One accepted request. `events` (on the event loop) receives Progress objects, or an
    ApiError when the engine failed it."""

    request_id: str
    ids: list[int]
    params: dict  # Engine.add keyword arguments
    kind: str = "text"
    rid: int | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    done: bool = False


class EngineWorker:
    def __init__(self, engine, metrics, max_waiting: int, warmup: bool = True):
        self.engine, self.metrics, self.max_waiting = engine, metrics, max_waiting
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs: dict[int, Job] = {}  # engine id -> job (engine thread only)
        self._pending = 0  # adds sent, not yet answered (event loop only)
        self._waiting = 0  # the engine's waiting count after the last command batch (engine thread writes)
        self._warmup = warmup
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- event-loop side ----------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="day0-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)

    async def submit(self, job: Job) -> None:
        """Hand `job` to the engine; returns once it is queued there (job.rid set). ApiError 429
        when the waiting queue is full, 400 when the engine refuses the request."""
        if self._waiting + self._pending >= self.max_waiting:
            raise ApiError(
                429,
                f"the server is at its queue limit ({self.max_waiting} requests waiting): retry later",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        future = self._loop.create_future()
        self._pending += 1
        try:
            self._commands.put(("add", job, future))
            await future
        finally:
            self._pending -= 1

    def cancel(self, job: Job) -> None:
        """Abort `job` in the engine (frees its blocks at once); harmless when it already ended."""
        if not job.done:
            job.done = True
            self._commands.put(("abort", job))

    # -- engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        if self._warmup:
            self._warm_up()
        self.ready.set()
        self.metrics.ready.set(1)
        while not self._stop.is_set():
            self._take_commands(block=not self.engine.has_work())
            if self.engine.has_work():
                self._step()
            self.metrics.engine_counters(self.engine.counters())

    def _take_commands(self, block: bool) -> None:
        try:
            commands = [self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()]
        except queue.Empty:
            return
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        answers = []
        for command in commands:
            if command[0] == "add":
                answers.append(self._add(command[1], command[2]))
            elif command[0] == "abort":
                job = command[1]
                if job.rid is not None and self._jobs.pop(job.rid, None) is not None:
                    self.engine.abort(job.rid)
                    log.info("aborted", extra={"request_id": job.request_id})
        self._waiting = self.engine.counters()["waiting"]  # before the adders learn their ids
        for future, value in answers:
            self._loop.call_soon_threadsafe(_settle, future, value)

    def _add(self, job: Job, future) -> tuple:
        try:
            rid = self.engine.add(job.ids, kind=job.kind, **job.params)
        except (EngineError, ValueError) as e:
            return future, ApiError(400, str(e), "max_tokens" if "max_tokens" in str(e) else "prompt")
        job.rid = rid  # here, so that an abort queued behind this add finds it
        self._jobs[rid] = job
        log.info("queued", extra={"request_id": job.request_id, "prompt_tokens": len(job.ids), "kind": job.kind})
        return future, rid

    def _step(self) -> None:
        try:
            progress = self.engine.step()
        except Exception:
            log.exception("engine step failed; failing the running requests", extra={"running": len(self._jobs)})
            failed = list(self._jobs.items())
            self._jobs.clear()
            for rid, _ in failed:
                self.engine.abort(rid)
            error = ApiError(500, "internal error in the engine step (see the server log)")
            self._loop.call_soon_threadsafe(_deliver, [(job, error) for _, job in failed])
            return
        self.metrics.steps.inc()
        out = []
        for rid, p in progress.items():
            job = self._jobs.get(rid)
            if job is None:  # aborted while the step ran
                continue
            if p.finished is not None:
                del self._jobs[rid]
                log.info("finished", extra={"request_id": job.request_id, "finish_reason": p.finished})
            out.append((job, p))
        if out:
            self._loop.call_soon_threadsafe(_deliver, out)

    def _warm_up(self) -> None:
        """Run requests that touch every entry point and batch size before /health says ready:
        as many sequences as may run at once, a prompt of a chunk and a token, decoding long
        enough that the decode batches grow through every compiled size."""
        eng, t0 = self.engine, time.perf_counter()
        n = eng.max_running
        prompt = min(eng.chunk + 1, eng.max_seq_len // 2)
        new = max(1, min(n + 1, eng.max_seq_len - prompt))
        ids = []
        for i in range(n):
            try:
                ids.append(eng.add([(7 * i + j) % eng.vocab_size for j in range(prompt)], max_new_tokens=new, stop=()))
            except EngineError:  # a pool smaller than one such request: warm up with what fits
                break
        steps = 0
        while eng.has_work():
            eng.step()
            steps += 1
        runtime_log.info(
            "warm-up done",
            extra={"requests": len(ids), "steps": steps, "seconds": round(time.perf_counter() - t0, 3)},
        )


def _settle(future: asyncio.Future, value) -> None:
    if future.done():
        return
    if isinstance(value, Exception):
        future.set_exception(value)
    else:
        future.set_result(value)


def _deliver(items) -> None:
    for job, p in items:
        job.events.put_nowait(p)
