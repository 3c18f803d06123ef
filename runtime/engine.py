"""`Engine`: many sequences at once over paged caches (an artifact compiled with --max-batch).

    eng = Engine.load(artifact_dir, num_blocks=None, memory_bytes=None, chunk=None, max_running=None)
    rid = eng.add([1, 2, 3], max_new_tokens=16, temperature=0.0, stop=(2,))   # a request id
    done = eng.step()        # {rid: Progress(tokens=[...], finished=None | "length" | "stop" | ...)}
    eng.abort(rid)
    eng.counters()           # running, waiting, blocks used and free

The caches live in pools of blocks shared by every sequence (models/paging.py); a sequence's
block table (runtime/blocks.py) maps its positions to blocks. Per-sequence state (KDA's recurrent
state and conv tails) lives in slots, one per running sequence. Both counts are chosen here, at
load: at most `max_running` sequences run at once (default: the largest compiled batch), each
with a slot; the pools get `num_blocks` blocks, or as many as `memory_bytes` holds beside the
slots, or by default enough for each running sequence to reach max_seq_len, within
DEFAULT_MEMORY_BYTES. The Engine logs its pools at load (`cache pools`: what they hold; the
plan of any budget: runtime/memory_plan.py).

Requests are of a kind, "text" or "image" (image-bearing: their prefill also runs the vision
tower), and each kind waits in its own queue, so that neither kind stalls the other.

Images (an artifact with a vision tower and `paged_prefill_mm`: glm5_next with a vision_config,
compiled with --max-batch): `add(ids, images=[...])` takes one image placeholder per image in ids,
as Session.prefill does (runtime/image_prompt.py); the images are decoded, preprocessed and the
placeholders expanded at `add`, so a bad image is refused there and nothing else is touched. The
request's first prompt chunk runs each image through its `encode_image_<P>` and keeps the features on the
device until its prompt has run; every chunk holding image rows runs `paged_prefill_mm` with the
features and its slice of the feature rows (the others `paged_prefill`). An image row never runs
as a decode row: an image request's pieces are at least 2 tokens (a step's chunk may run one
token over) and leave no lone last row.

Visual-token eviction (`evict_images=True`, off by default; the reference deployment's opt-in
policy): when an image request's prompt has run, each block of its table that holds only image
tokens goes back to the pool and its table entry becomes the scratch block, whose positions no
step sees (models/paging.py): the decode steps' DSA selection (and any attention) leaves the
images' rows out, and the blocks serve other requests. The first token is the prompt's, images
included; what eviction changes after it is measured in docs/perf.md.

One `step`:
 1. Admission: a queue's head is admitted when the pool can reserve its whole need (prompt +
    max_new_tokens - 1 positions) and a slot is free, so a running sequence never waits for a
    block, and a request that could never fit is refused at `add` with the numbers. The older
    head of the two queues goes first; a head that does not fit blocks its own queue only (FIFO
    within a kind, so a large request is not starved by smaller ones behind it).
 2. One prompt chunk: the oldest admitted sequence still in its prompt runs its next `chunk`
    tokens; when both kinds have prompts to run, the kinds take turns step by step. A long prompt
    delays the running sequences by at most one chunk per step. Where the artifact has a static
    prompt chunk of C tokens (`paged_prefill_chunk`: models whose state is all indexed by
    position, `--prefill-chunk`, 512 on cuda-sm90) and the chunk has room for C, the prompt runs
    in pieces of exactly C, the last one ending at the prompt's end and overlapping the piece
    before it (the overlap rewrites the same rows), like Session's static chunks; only its last
    row's logits are computed. A static row count is what puts IREE's matmuls on the tensor cores
    (docs/perf.md). Prompts shorter than C, chunks smaller than C, and requests that keep every
    logits row run `paged_prefill` (a dynamic length; a 1-token remainder runs as a decode row).
 3. One decode step for every sequence past its prompt: one token each, in batches of the
    compiled sizes (`paged_decode_<B>`; rows beyond the batch point at the scratch block).
 4. Lookahead: before reading this step's decode, the next step's is submitted, its rows taking
    their tokens from this one's on the device (the step's `prev` argument: frontend/export.py,
    _PagedStep), so that the host builds, records and submits step N+1 while the GPU runs step N
    instead of the GPU waiting for the host between steps (docs/perf.md). When the next step
    comes its decode is already running: rows of sequences that ended meanwhile (a stop token, an
    abort) are dropped. Only when every row is greedy (a sampled token is known only once the
    step is read) and the rows fit one batch; otherwise the next step submits its own. The
    tokens are those of running each step to its end (`lookahead=False`).
Greedy requests take the device's next token (only ids are read back); the others sample on the
host from their own generator, so a seeded request gives the same tokens whatever runs beside
it. A request finishes at max_new_tokens ("length"), at a stop token ("stop"), by `abort`
("abort"), or when its logits are not finite ("nonfinite"); its blocks are freed at once.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from dataclasses import dataclass, field

import numpy as np

from day0.runtime.artifact import NON_FINITE_TOKEN, PAGED_IMAGE_PREFILL, Manifest
from day0.runtime.blocks import SCRATCH_BLOCK, BlockPool
from day0.runtime.image_prompt import ImagePrompt, ImagePrompts, image_list
from day0.runtime.loading import open_artifact, token_ids
from day0.runtime.sampling import logprobs, make_rng, sample, validate_sampling
from day0.runtime.state_file import np_dtype
from day0.runtime.step_call import PagedCaller, Pending, StepCaller

SCRATCH_SLOT = 0  # the slot padding rows of a batched step use; never a sequence's
KINDS = ("text", "image")  # request kinds, each with its own waiting queue
MAX_LOGPROBS = 20  # the most alternatives a request may ask for per token
# the pools' bytes when Engine.load is given neither num_blocks nor memory_bytes, at most: every
# running sequence at max_seq_len if that fits, else as many blocks as this holds (a 1M-position
# artifact with 64 sequences would otherwise ask for 64M positions of cache at load)
DEFAULT_MEMORY_BYTES = 16 << 30
log = logging.getLogger("day0.engine")
DEFAULT_CHUNK = 64  # prompt tokens a step, for an artifact without a static prompt chunk


class EngineError(ValueError):
    pass


@dataclass
class Progress:
    """What one step did for a request: the tokens it generated (in order), and why it finished
    (None while it runs). With keep_logits, `logits` holds the rows it computed this step. With
    logprobs=N, `logprobs` holds one (chosen token's log-probability, [(id, log-probability)] of
    the N most likely) per token in `tokens`."""

    tokens: list[int] = field(default_factory=list)
    finished: str | None = None
    logits: list[np.ndarray] = field(default_factory=list)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)


@dataclass
class _Images:
    """A prompt's images (add(..., images=...)): preprocessed at add, encoded by the sequence's
    first prompt chunk (`features` on the device, dropped once the prompt has run); `rows` [prompt]
    int64: the feature row of each prompt position, -1 for text."""

    prompt: ImagePrompt
    features: object = None  # DeviceArray [N, hidden] f32, N >= 2
    rows: np.ndarray | None = None


@dataclass
class _Sequence:
    id: int
    prompt: np.ndarray
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop: frozenset[int]
    keep_logits: bool
    rng: np.random.Generator
    logprobs: int | None = None
    kind: str = "text"
    images: _Images | None = None
    slot: int = SCRATCH_SLOT  # its per-sequence state's slot, once admitted
    fed: int = 0  # tokens in the cache (prompt first, then generated ones)
    out: list[int] = field(default_factory=list)
    finished: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def needs_row(self) -> bool:
        """Whether its logits row must come to the host (sampling, logits or logprobs)."""
        return self.keep_logits or self.logprobs is not None or not self.greedy

    @property
    def need(self) -> int:
        """Positions the sequence may fill: the prompt and every new token but the last."""
        return self.prompt.size + max(self.max_new_tokens - 1, 0)

    @property
    def in_prompt(self) -> bool:
        return self.fed < self.prompt.size


@dataclass
class _Decode:
    """A submitted decode step: its sequences, one row each in order, and the pending call."""

    seqs: list[_Sequence]
    pending: Pending
    prompt_token: bool = False


class Engine:
    def __init__(
        self,
        manifest: Manifest,
        vm,
        num_blocks: int | None,
        memory_bytes: int | None,
        chunk: int | None,
        max_running: int | None = None,
        lookahead: bool = True,
        artifact_dir=None,
        evict_images: bool = False,
    ):
        """Engine.load's arguments, as there (`artifact_dir`: where the artifact's image processor
        settings are, for an artifact that runs images)."""
        if manifest.paged is None:
            raise EngineError("the artifact has no paged entry points: compile it with --max-batch N for the Engine")
        self.layout = manifest.paged
        if max_running is None:
            max_running = max(self.layout.batch_sizes)
        elif isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
            raise EngineError(f"max_running must be an integer >= 1, got {max_running!r}")
        num_blocks = _block_count(manifest, num_blocks, memory_bytes, max_running)
        self.manifest, self._vm, self.max_running = manifest, vm, max_running
        self.static_chunk = manifest.paged_prefill_chunk  # C, or 0: none
        self.chunk = chunk or self.static_chunk or DEFAULT_CHUNK
        self.blocks = BlockPool(num_blocks, self.layout.block_size)
        pool_bytes = num_blocks * self.layout.block_bytes + (max_running + 1) * self.layout.slot_bytes
        longest = min(self.blocks.capacity * self.layout.block_size, manifest.max_seq_len)
        log.info(
            "cache pools",
            extra={
                "blocks": num_blocks,
                "block_size": self.layout.block_size,
                "pool_bytes": pool_bytes,
                "slots": max_running,
                "bytes_per_token": self.layout.block_bytes / self.layout.block_size,
                "longest_context": longest,
                "max_seq_len": manifest.max_seq_len,
                "sequences_at_max_seq_len": min(
                    self.blocks.capacity // self.blocks.blocks_for(manifest.max_seq_len), max_running
                ),
            },
        )
        self.vocab_size, self.max_seq_len = manifest.vocab_size, manifest.max_seq_len
        self.eos_token_ids = manifest.eos_token_ids
        # the pools, then the slot tensors (slot 0: scratch), as the entry points take them
        shapes = [(num_blocks * p.shape[0], *p.shape[1:], p.dtype) for p in self.layout.pools]
        shapes += [(max_running + 1, *t.shape, t.dtype) for t in self.layout.slots]
        self._state = [vm.to_device(np.zeros(shape, dtype=np_dtype(dtype))) for *shape, dtype in shapes]
        self._free_slots = list(range(max_running, SCRATCH_SLOT, -1))  # pop() hands out low numbers first
        self._prefill = "paged_prefill"
        self._prefill_static = "paged_prefill_chunk" if self.static_chunk else None
        self._decode = {b: f"paged_decode_{b}" for b in self.layout.batch_sizes}
        most = max(self.layout.batch_sizes)
        tokens, blocks = max(self.chunk, most), self.blocks.blocks_for(self.max_seq_len)
        # ids, positions, tables, slots
        self._caller = PagedCaller(vm, [tokens, tokens, most * blocks, most], most, self.vocab_size)
        self.lookahead = lookahead
        self._ahead: _Decode | None = None  # the next step's decode, submitted by this one
        # at the latest when the Engine goes (or the interpreter exits): no submission left running
        self._drain = weakref.finalize(self, self._caller.drain)
        # images: an artifact with a vision tower and the paged image step (None: text only)
        self.vision = manifest.vision if PAGED_IMAGE_PREFILL in manifest.entry_points else None
        self._images = ImagePrompts(artifact_dir, self.vision, EngineError) if self.vision is not None else None
        self._encoder = StepCaller(vm, [1]) if self.vision is not None else None  # encode_image_<P>, synchronous
        if not isinstance(evict_images, bool):
            raise EngineError(f"evict_images must be True or False, got {evict_images!r}")
        self.evict_images = evict_images
        self.evicted_blocks = 0  # blocks evict_images has returned to the pool, all requests
        self._ids = itertools.count()
        self._waiting: dict[str, list[_Sequence]] = {k: [] for k in KINDS}
        self._running: dict[int, _Sequence] = {}
        self._last_prompt_kind = KINDS[-1]

    @classmethod
    def load(
        cls,
        artifact_dir,
        device: str | None = None,
        num_blocks: int | None = None,
        memory_bytes: int | None = None,
        chunk: int | None = None,
        verify: bool = True,
        checkpoint_dir=None,
        max_running: int | None = None,
        lookahead: bool = True,
        evict_images: bool = False,
    ) -> Engine:
        """Load an artifact compiled with --max-batch. At most `max_running` sequences run at
        once (default: the largest compiled batch); the pools get `num_blocks` blocks, or as many
        as `memory_bytes` holds beside the running sequences' slots, or (neither) enough for each
        running sequence to reach max_seq_len within DEFAULT_MEMORY_BYTES. `chunk`: the most prompt tokens one step runs
        (default: the artifact's static prompt chunk, else DEFAULT_CHUNK). `lookahead`: submit
        the next step's decode before reading this one's (module docstring); False runs every
        step to its end before the next begins (the same tokens, later). `evict_images`: once an
        image request's prompt has run, the blocks holding only its image tokens leave its table
        and return to the pool (module docstring)."""
        if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
            raise EngineError(f"chunk must be an integer >= 1, got {chunk!r}")
        manifest, vm = open_artifact(artifact_dir, device, verify, checkpoint_dir)
        return cls(manifest, vm, num_blocks, memory_bytes, chunk, max_running, lookahead, artifact_dir, evict_images)

    # -- requests -------------------------------------------------------------------------------
    def add(
        self,
        ids,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: tuple[int, ...] | None = None,
        keep_logits: bool = False,
        logprobs: int | None = None,
        kind: str = "text",
        images=None,
    ) -> int:
        """Queue a request; returns its id. `stop`: token ids that end it (default: the model's
        EOS ids; () for none). `logprobs`: report each new token's log-probability and the
        `logprobs` most likely alternatives (0: the chosen token's only; None: nothing). `kind`:
        "text" or "image", the queue it waits in. `images`: a list, one per image placeholder
        (image_token_id) in ids, as Session.prefill's (each placeholder expanded to its image's
        tokens; the request is then of kind "image"). Refused (EngineError, or ImageError for an
        image that cannot be decoded) when it could never run: longer than max_seq_len, more
        blocks than the whole pool, images for a text-only artifact, placeholders that are not the
        images in number."""
        validate_sampling(temperature, top_k, top_p)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be an integer >= 1 (got {max_new_tokens!r})")
        if logprobs is not None and (
            isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_LOGPROBS
        ):
            raise EngineError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got {logprobs!r}")
        if kind not in KINDS:
            raise EngineError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        prompt = token_ids(ids, self.vocab_size, EngineError)
        prompt, images = self._image_prompt(prompt, image_list(images, EngineError))
        if images is not None:
            kind = "image"
        seq = _Sequence(
            next(self._ids),
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            frozenset(self.eos_token_ids if stop is None else stop),
            keep_logits,
            make_rng(seed),
            logprobs,
            kind,
            images,
        )
        if seq.need > self.max_seq_len:
            raise EngineError(
                f"request of {prompt.size} prompt tokens + max_new_tokens {max_new_tokens} needs {seq.need} "
                f"positions, more than the artifact's max_seq_len {self.max_seq_len}"
            )
        blocks = self.blocks.blocks_for(seq.need)
        if blocks > self.blocks.capacity:
            raise EngineError(
                f"request needs {blocks} blocks of {self.layout.block_size} positions, more than the whole "
                f"pool's {self.blocks.capacity} (load the Engine with more: memory_bytes or num_blocks; day0 serve "
                f"--kv-memory or --num-blocks)"
            )
        self._waiting[kind].append(seq)
        return seq.id

    def _image_prompt(self, prompt: np.ndarray, images: list) -> tuple[np.ndarray, _Images | None]:
        """(the prompt, expanded, and its images) of a request; nothing runs on the device."""
        if images and self._images is None:
            why = (
                "has no vision tower"
                if self.manifest.vision is None
                else f"has no paged image step ({PAGED_IMAGE_PREFILL}): compile it again"
            )
            raise EngineError(f"{len(images)} image(s) given, but this artifact ({self.manifest.architecture}) {why}")
        if self._images is None or not images and not (prompt == self.vision.image_token_id).any():
            return prompt, None
        p = self._images.prompt(prompt, images)
        if p.ids.size < 2:
            raise EngineError("a prompt with images needs at least 2 tokens (the image step's shortest chunk)")
        return p.ids, _Images(p)

    @property
    def image_config(self):
        """The image processor's settings (runtime/images.py ImageConfig), None when text only."""
        return None if self._images is None else self._images.config

    def image_prompt(self, ids, images) -> list[int]:
        """The prompt `add(ids, images=images)` would run: each image placeholder expanded to its
        image's token count (the images are decoded and preprocessed, not encoded)."""
        prompt, _ = self._image_prompt(token_ids(ids, self.vocab_size, EngineError), image_list(images, EngineError))
        return prompt.tolist()

    def abort(self, rid: int) -> bool:
        """Stop a waiting or running request and free its blocks; False if it is not known."""
        for queue in self._waiting.values():
            for seq in queue:
                if seq.id == rid:
                    queue.remove(seq)
                    return True
        if rid not in self._running:
            return False
        self._retire(rid)
        return True

    def close(self) -> None:
        """Wait for the step submitted ahead (module docstring, lookahead), if any, and drop it:
        after this nothing of the Engine's runs on the device. Steps may follow (the next one
        submits its own decode). Also done when the Engine is collected or the interpreter exits."""
        self._ahead = None
        self._caller.drain()

    def counters(self) -> dict[str, int]:
        return {
            "running": len(self._running),
            "waiting": sum(map(len, self._waiting.values())),
            **{f"waiting_{k}": len(q) for k, q in self._waiting.items()},
            "blocks_used": self.blocks.used,
            "blocks_evicted": self.evicted_blocks,
            "blocks_free": self.blocks.free,
            "slots_free": len(self._free_slots),
        }

    def phase(self, rid: int) -> str | None:
        """ "waiting", "prompt" (admitted, prompt not all run), "decoding", or None (finished,
        aborted or unknown)."""
        seq = self._running.get(rid)
        if seq is not None:
            return "prompt" if seq.in_prompt else "decoding"
        return "waiting" if any(s.id == rid for q in self._waiting.values() for s in q) else None

    def has_work(self) -> bool:
        return bool(self._running or any(self._waiting.values()))

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> dict[int, Progress]:
        """Admit, run one prompt chunk and one decode step (module docstring); returns what each
        request that moved did."""
        progress: dict[int, Progress] = {}
        self._admit()
        prompt = self._next_prompt()
        if prompt is not None:
            self._run_prompt_chunk(prompt, progress)
        decoding = [s for s in self._running.values() if not s.in_prompt and s.finished is None and s is not prompt]
        decodes, self._ahead = ([self._ahead] if self._ahead else []), None
        covered = {s.id for d in decodes for s in d.seqs}
        rest = [s for s in decoding if s.id not in covered]  # (none, when the lookahead ran)
        largest = max(self._decode)
        decodes += [self._submit_decode(rest[i : i + largest]) for i in range(0, len(rest), largest)]
        if self.lookahead and len(decodes) == 1:
            ready = [s for s in self._running.values() if not s.in_prompt and s.finished is None]
            self._ahead = self._submit_ahead(decodes[0], ready)
        for d in decodes:
            self._finish_decode(d, progress)
        for rid, p in progress.items():
            if p.finished is not None and rid in self._running:
                self._retire(rid)
        return progress

    def _admit(self) -> None:
        """Admit queue heads, the older first; a head that does not fit blocks its own queue only."""
        heads = sorted((q for q in self._waiting.values() if q), key=lambda q: q[0].id)
        for queue in heads:
            while queue and self._free_slots and self.blocks.reserve(queue[0].id, queue[0].need):
                seq = queue.pop(0)
                seq.slot = self._free_slots.pop()
                self._running[seq.id] = seq

    def _next_prompt(self) -> _Sequence | None:
        """The oldest sequence still in its prompt, of the other kind than last time if one is."""
        first: dict[str, _Sequence] = {}
        for s in self._running.values():
            if s.in_prompt:
                first.setdefault(s.kind, s)
        if not first:
            return None
        turn = KINDS[(KINDS.index(self._last_prompt_kind) + 1) % len(KINDS)]
        seq = first.get(turn) or next(iter(first.values()))
        self._last_prompt_kind = seq.kind
        return seq

    def _retire(self, rid: int) -> None:
        """Free a running sequence's blocks and slot (its slot's state is stale from now: the
        next sequence there starts at position 0, where the step ignores what a slot holds)."""
        seq = self._running.pop(rid)
        self.blocks.release(rid)
        self._free_slots.append(seq.slot)

    def _call(self, name: str, ids, positions, tables, slots, logits: bool, extra=()):
        """One paged step over the Engine's state, run to its end; returns (the logits rows on the
        host, or None unless `logits`; the device's next tokens on the host)."""
        pending = self._submit(name, ids, positions, tables, slots, logits, extra=extra)
        return self._caller.finish(pending)

    def _submit(
        self, name: str, ids, positions, tables, slots, logits: bool, prev: Pending | None = None, extra=()
    ) -> Pending:
        rows = 1 if name == self._prefill_static else len(ids)
        pending, self._state = self._caller.submit(
            name, [ids, positions, tables, slots], self._state, rows, logits, prev, extra
        )
        return pending

    def _evict_image_blocks(self, seq: _Sequence) -> None:
        """Return the blocks of `seq` whose positions are all image tokens of its prompt to the
        pool (evict_images): the decode steps then select none of their positions."""
        size, image = self.layout.block_size, seq.images.rows >= 0
        whole = [b for b in range(seq.prompt.size // size) if image[b * size : (b + 1) * size].all()]
        self.evicted_blocks += self.blocks.evict(seq.id, whole)

    def _encode(self, seq: _Sequence, progress: dict[int, Progress]) -> bool:
        """Run `seq`'s images through the vision tower (encode_image_<P>, one call per image) and keep
        their features on the device; False (the request finished "nonfinite") when they are not
        finite."""
        try:
            features, rows = self._images.encode(self._encoder, seq.images.prompt)
        except EngineError:
            seq.finished = progress.setdefault(seq.id, Progress()).finished = "nonfinite"
            return False
        seq.images.features, seq.images.rows = self._vm.to_device(features), rows
        return True

    def _prompt_pieces(self, seq: _Sequence) -> list[tuple[int, int, bool]]:
        """This step's calls for `seq`'s prompt, (start, end, static), at most `chunk` tokens of
        work in all (module docstring)."""
        n, at, budget, c = seq.prompt.size, seq.fed, self.chunk, self.static_chunk
        static = c and n >= c and not seq.keep_logits and seq.images is None
        pieces = []
        while at < n and budget > 0:
            if static and budget >= c:
                start = min(at, n - c)  # the last piece overlaps the one before it
                pieces.append((start, start + c, True))
                budget, at = budget - c, start + c
                continue
            take = min(budget, n - at)
            if seq.images is not None:  # pieces of >= 2 rows: an image row never runs as a decode row
                if take < 2:
                    if pieces:
                        break
                    take = min(2, n - at)
                if n - at - take == 1:  # and none leaves a lone last row
                    take = take - 1 if take > 2 else take + 1
            pieces.append((at, at + take, False))
            budget, at = budget - take, at + take
        return pieces

    def _run_prompt_chunk(self, seq: _Sequence, progress: dict[int, Progress]) -> None:
        if seq.images is not None and seq.images.features is None and not self._encode(seq, progress):
            return
        for start, end, static in self._prompt_pieces(seq):
            if end - start == 1:  # the prefill steps take >= 2 tokens; one runs as a decode row
                self._run_decode([seq], progress, prompt_token=True)
                continue
            fn, extra = self._prefill_static if static else self._prefill, ()
            if seq.images is not None and (seq.images.rows[start:end] >= 0).any():
                fn, extra = PAGED_IMAGE_PREFILL, (seq.images.features, self._vm.to_device(seq.images.rows[start:end]))
            positions = np.arange(start, end, dtype=np.int64)
            table = np.array(self._table(seq, end), dtype=np.int64)[None, :]
            slot = np.array([seq.slot], dtype=np.int64)
            host, nxt = self._call(fn, seq.prompt[start:end], positions, table, slot, seq.needs_row, extra)
            seq.fed = end
            if seq.images is not None and not seq.in_prompt:
                if self.evict_images:
                    self._evict_image_blocks(seq)
                seq.images = None  # the features' device memory goes
            p = progress.setdefault(seq.id, Progress())
            if seq.keep_logits:  # never a static piece: its rows are all there
                p.logits.extend(host)
            if not seq.in_prompt:
                token = int(nxt[0]) if seq.greedy else None
                self._emit(seq, p, token, None if host is None else host[-1])

    def _run_decode(self, seqs: list[_Sequence], progress: dict[int, Progress], prompt_token: bool = False) -> None:
        self._finish_decode(self._submit_decode(seqs, prompt_token), progress)

    def _submit_decode(
        self, seqs: list[_Sequence], prompt_token: bool = False, ahead_of: _Decode | None = None
    ) -> _Decode:
        """Submit one decode step of `seqs` (one row each, at its next position). `ahead_of`: a
        decode not yet finished whose rows' tokens some of `seqs` continue from on the device
        (those rows read its next tokens through `prev`, one position further on)."""
        size = min(b for b in self._decode if b >= len(seqs))
        ids = np.zeros(size, dtype=np.int64)
        positions = np.zeros(size, dtype=np.int64)
        slots = np.full(size, SCRATCH_SLOT, dtype=np.int64)
        rows_of = {s.id: r for r, s in enumerate(ahead_of.seqs)} if ahead_of else {}
        for r, s in enumerate(seqs):
            if s.id in rows_of:
                ids[r], positions[r] = -1 - rows_of[s.id], s.fed + 1
            else:
                ids[r], positions[r] = s.prompt[s.fed] if prompt_token else s.out[-1], s.fed
            slots[r] = s.slot
        rows = [self._table(s, int(positions[r]) + 1) for r, s in enumerate(seqs)]  # blocks to the new position
        tables = np.full((size, max(map(len, rows))), SCRATCH_BLOCK, dtype=np.int64)
        for r, row in enumerate(rows):
            tables[r, : len(row)] = row
        logits = any(s.needs_row for s in seqs)
        prev = ahead_of.pending if ahead_of else None
        pending = self._submit(self._decode[size], ids, positions, tables, slots, logits, prev)
        return _Decode(seqs, pending, prompt_token)

    def _submit_ahead(self, d: _Decode, ready: list[_Sequence]) -> _Decode | None:
        """The next step's decode, submitted now, before `d` is read: `d`'s rows that go on (each
        continuing from its token on the device) and the other `ready` sequences (past their
        prompt: their last token is on the host). None when a row of `d` samples on the host (its
        token is not known before `d` is read) or the rows exceed the largest batch."""
        live = [s for s in d.seqs if self._running.get(s.id) is s and s.finished is None]
        if d.prompt_token or not all(s.greedy for s in live):
            return None
        going_on = [s for s in live if len(s.out) + 1 < s.max_new_tokens]  # the others end by length
        live_ids = {s.id for s in live}
        rows = going_on + [s for s in ready if s.id not in live_ids]
        if not rows or len(rows) > max(self._decode):
            return None
        return self._submit_decode(rows, ahead_of=d)

    def _finish_decode(self, d: _Decode, progress: dict[int, Progress]) -> None:
        """Read decode `d` and emit its tokens; rows of sequences that have ended since it was
        submitted (a stop token, an abort) are dropped (what they wrote is in their freed blocks)."""
        host, tokens = self._caller.finish(d.pending)
        for r, s in enumerate(d.seqs):
            if self._running.get(s.id) is not s or s.finished is not None:
                continue
            s.fed += 1
            p = progress.setdefault(s.id, Progress())
            if s.keep_logits:
                p.logits.append(host[r])
            if d.prompt_token and s.in_prompt:
                continue
            self._emit(s, p, int(tokens[r]) if s.greedy else None, None if host is None else host[r])

    def _emit(self, seq: _Sequence, p: Progress, device_token: int | None, row: np.ndarray | None) -> None:
        """The next token of `seq` from the device (greedy) or sampled from its logits row."""
        if device_token is not None:
            token = device_token
        elif np.isfinite(row).all():
            token = sample(row, seq.temperature, seq.top_k, seq.top_p, seq.rng)
        else:
            token = NON_FINITE_TOKEN
        if token == NON_FINITE_TOKEN:
            seq.finished = p.finished = "nonfinite"
            return
        seq.out.append(token)
        p.tokens.append(token)
        if seq.logprobs is not None:
            p.logprobs.append(logprobs(row, token, seq.logprobs))
        if token in seq.stop:
            seq.finished = p.finished = "stop"
        elif len(seq.out) >= seq.max_new_tokens:
            seq.finished = p.finished = "length"

    def _table(self, seq: _Sequence, positions: int) -> list[int]:
        """`seq`'s blocks holding its first `positions` positions."""
        return self.blocks.table(seq.id)[: self.blocks.blocks_for(positions)]


def _block_count(manifest: Manifest, num_blocks: int | None, memory_bytes: int | None, running: int) -> int:
    paged = manifest.paged

    def held(budget: int) -> int:
        """Blocks `budget` bytes hold beside the running sequences' slots and the scratch slot."""
        return max(budget - (running + 1) * paged.slot_bytes, 0) // paged.block_bytes

    if num_blocks is not None and memory_bytes is not None:
        raise EngineError("give num_blocks or memory_bytes, not both")
    if memory_bytes is not None:
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 0:
            raise EngineError(f"memory_bytes must be an integer >= 0, got {memory_bytes!r}")
        num_blocks = held(memory_bytes)
        if num_blocks < 2:
            raise EngineError(
                f"memory_bytes {memory_bytes} holds {num_blocks} blocks of {paged.block_bytes} bytes beside "
                f"{running + 1} slots of {paged.slot_bytes} bytes; the Engine needs at least 2 blocks "
                f"(a scratch block and one for a sequence)"
            )
    elif num_blocks is None:
        num_blocks = max(min(running * paged.max_blocks + 1, held(DEFAULT_MEMORY_BYTES)), 2)
    elif isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
        raise EngineError(f"num_blocks must be an integer >= 2 (a scratch block and one more), got {num_blocks!r}")
    return num_blocks
