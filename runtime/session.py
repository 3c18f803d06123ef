"""`Session`: a loaded artifact, its device-resident state, and generation.

    s = Session.load(artifact_dir, device="local-task")
    s.prefill(ids)   -> np.float32 [len(ids), vocab]   (appends to the sequence)
    s.decode(token)  -> np.float32 [vocab]             (appends one token)
    s.prefill_greedy(ids) / s.decode_greedy(token) -> int  (the greedy next token, chosen on the device)
    s.generate(ids, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=None) -> list[int]
    s.reset()        -> empty state, same weights
    s.save_state(path) / s.load_state(path)            (the sequence so far, on disk)

Images (an artifact with a vision tower, `manifest.vision`: glm5_next compiled from a checkpoint
with a vision_config): prefill, prefill_greedy and generate take `images=[...]`, one per image
placeholder in ids, in order (encoded bytes, a file path, or a PIL image: runtime/images.py).
ids hold ONE `image_token_id` per image, as a user writes `<|image|>` in a prompt (the chat
template's `<|begin_of_image|>` / `<|end_of_image|>` around it stay as they are); the Session
expands each to the image's token count (runtime/images.py expand_image_placeholders), so the
sequence grows by the expanded length: prefill returns one logits row per expanded token, and
`image_prompt(ids, images)` gives the expanded ids. Each image is preprocessed on the host
(preprocess, with the artifact's preprocessor_config.json), run through its `encode_image_<P>` bucket alone (the
tower attends within an image: one call per image keeps its work per image), and the prompt runs
as one `prefill_mm` call with the features in place of the placeholder rows. Images may come in
any turn. Refused (SessionError), before any device call: images for an artifact without a
vision tower, a placeholder count that is not the image count (placeholders without images
too), a prompt whose image tokens do not fit max_seq_len; an image that cannot be decoded is an
ImageError (runtime/images.py), also a ValueError.

The state (the manifest's state tensors: caches, recurrent states) stays on the device: each call
passes the previous call's returned buffers back in, and IREE updates them in place. One decode
step is one device invocation, made by runtime/step_call.py's StepCaller (the token and position
copied from one pinned buffer, one host wait for the results it reads back: the greedy token
alone, or the logits), as the Engine makes its steps.

The pending token: `generate` returns tokens t1..tn but feeds only t1..t(n-1) to the model (tn's
logits are never needed unless the sequence goes on), so a prompt of P tokens and n new tokens
fits max_seq_len >= P + n - 1. tn is `pending`: the next call that appends tokens (prefill,
decode, generate, their greedy forms) appends it first, so a conversation continues the sequence
the caller saw. `position` counts the tokens in the state, not the pending one; save_state keeps
it; reset drops it.

The dense state is max_seq_len rows per cache, allocated at load, and a decode step scores all of
them: on a long-context artifact a step would cost what max_seq_len costs, not what the sequence
holds (docs/perf.md, 'Long context on the CPU'). So on an artifact with paged entry points
(`--max-batch`) and max_seq_len above PAGED_FROM, the Session runs those instead, for its one
sequence, with pools that grow as it does (runtime/paged_sequence.py); `Session.load(paged=...)`
chooses either way. Same contract, same results (within float order); its state file holds the
sequence's rows only, and either kind of Session loads the other's.

A Session serves one call at a time: a call made while another is running (another thread)
is refused with a SessionError rather than interleaving two updates of one state. Logits that
are not finite (NaN or infinity: bad weights or config) end the call with a SessionError.
"""

import functools
import threading
from pathlib import Path

import numpy as np

from day0.runtime.artifact import IMAGE_PREFILL, NON_FINITE_TOKEN, Manifest
from day0.runtime.image_prompt import ImagePrompts, image_list
from day0.runtime.loading import open_artifact, token_ids
from day0.runtime.paged_sequence import PagedSequence
from day0.runtime.sampling import greedy, make_rng, sample, validate_sampling
from day0.runtime.state_file import np_dtype
from day0.runtime.step_call import StepCaller


class SessionError(ValueError):
    pass


def _exclusive(method):
    """One call at a time per Session: a second thread's call is refused, not interleaved."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if not self._busy.acquire(blocking=False):
            raise SessionError(
                f"Session.{method.__name__}: the session is in use by another thread's call "
                f"(a Session holds one sequence: use one Session per thread)"
            )
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy.release()

    return call


PAGED_FROM = 16384  # max_seq_len above which a Session prefers the paged entry points (module docstring)
PROMPT_PIECE = 512  # the most prompt tokens one paged call takes where every row's logits are wanted


class Session:
    def __init__(self, artifact_dir: Path, manifest: Manifest, vm, paged: bool | None = None):
        self.artifact_dir, self.manifest, self._vm = Path(artifact_dir), manifest, vm
        if paged is None:
            paged = manifest.paged is not None and manifest.max_seq_len > PAGED_FROM
        elif paged and manifest.paged is None:
            raise SessionError("paged=True: this artifact has no paged entry points (compile it with --max-batch)")
        # the sequence's state over the paged entry points (None: the dense ones)
        self._paged = PagedSequence(manifest, vm, SessionError) if paged else None
        self._busy = threading.RLock()  # re-entrant: generate calls prefill_greedy on its thread
        self.max_seq_len: int = manifest.max_seq_len
        self.vocab_size: int = manifest.vocab_size
        self.eos_token_ids = set(manifest.eos_token_ids)
        entries = manifest.entry_points
        # the first turn (position 0) may have a form that scores only the prompt's own keys
        first = "prefill_first" if "prefill_first" in entries else "prefill"

        def entry(name: str):
            """(entry point, how many outputs sit between the logits and the state)"""
            return name, int(entries[name].greedy_next)

        self._prefill, self._decode, self._prefill_first = (entry(n) for n in ("prefill", "decode", first))
        # prompts of at least this many tokens run through the static-length prefill
        self._chunk_len = manifest.prefill_chunk
        self._chunk = entry("prefill_chunk") if self._chunk_len else None
        self._caller = StepCaller(vm, [max(self.max_seq_len, self._chunk_len or 0), 1])  # ids, position
        # images: the vision tower's layout and the image processor's settings (None: text only)
        self.vision = manifest.vision
        self._images = ImagePrompts(self.artifact_dir, self.vision, SessionError) if self.vision is not None else None
        self.reset()

    @classmethod
    def load(
        cls,
        artifact_dir,
        device: str | None = None,
        verify: bool = True,
        checkpoint_dir=None,
        paged: bool | None = None,
    ) -> "Session":
        """Load and verify an artifact (hashes of the vmfb and the shards it reads, unless
        verify=False), then bind its parameters from the original shards — found where the
        compile read them, or in `checkpoint_dir` when the checkpoint has moved (another host).
        `device`: one of the artifact's devices (its target's; None: the first, e.g. local-task
        for llvm-cpu, cuda for cuda-sm90); another is refused before the runtime is asked.
        `paged`: run the paged entry points (True), the dense ones (False), or choose by
        max_seq_len (None: module docstring)."""
        manifest, vm = open_artifact(artifact_dir, device, verify, checkpoint_dir)
        return cls(artifact_dir, manifest, vm, paged)

    @property
    def paged(self) -> bool:
        """Whether the Session runs the paged entry points (module docstring)."""
        return self._paged is not None

    # -- state ----------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Number of tokens in the state so far (the pending token not counted)."""
        return self._pos

    @property
    def pending(self) -> int | None:
        """The last token `generate` returned, not yet in the state (module docstring), or None."""
        return self._pending

    @_exclusive
    def reset(self) -> None:
        self._pos, self._pending = 0, None
        if self._paged is not None:
            self._paged.reset()
            return
        self._state = [self._vm.to_device(np.zeros(s.shape, dtype=np_dtype(s.dtype))) for s in self.manifest.state]

    @_exclusive
    def save_state(self, path) -> Path:
        """Write the sequence so far (position, pending token, every state tensor) to `path`
        (.npz); a later `load_state` on a Session of an artifact of the same model and weights
        continues it exactly."""
        from day0.runtime import state_file

        if self._paged is not None:
            held = self._paged.host_state(self._pos)
            arrays = [held[s.name] for s in self.manifest.state]
        else:
            arrays = [_host_copy(b) for b in self._state]
        return state_file.write(path, self.manifest, self._pos, arrays, self._pending)

    @_exclusive
    def load_state(self, path) -> None:
        """Replace the state with one `save_state` wrote; refused (StateFileError naming the first
        difference) when it was saved by an artifact of another architecture, config, weights or
        max_seq_len."""
        from day0.runtime import state_file

        position, pending, arrays = state_file.read(path, self.manifest)
        if self._paged is not None:
            self._paged.load_host_state(position, {s.name: a for s, a in zip(self.manifest.state, arrays)})
        else:
            self._state = [self._vm.to_device(_padded(a, s.shape)) for s, a in zip(self.manifest.state, arrays)]
        self._pos, self._pending = position, pending

    def state_bytes(self) -> dict[str, int]:
        """Bytes of device state per kind (e.g. mla_latent, indexer_keys, kda_state, conv_tail):
        the dense state's, or what the paged pools and slot hold now."""
        if self._paged is not None:
            return self._paged.state_bytes()
        return self.manifest.state_bytes()

    # -- calls ----------------------------------------------------------------------------------
    def _check_ids(self, ids) -> np.ndarray:
        """ids as int64, after checking them and that they (and the pending token) fit."""
        arr = token_ids(ids, self.vocab_size, SessionError)
        self._check_room(arr.size)
        return arr

    def _check_room(self, new: int) -> None:
        total = self._pos + (self._pending is not None) + new
        if total > self.max_seq_len:
            pending = " and the pending token" if self._pending is not None else ""
            raise SessionError(
                f"sequence would reach {total} tokens ({self._pos} in the state{pending} + {new} new), more "
                f"than the artifact's max_seq_len {self.max_seq_len} (compile with a larger --max-seq-len)"
            )

    def _take_pending(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(ids with the pending token first, how many leading rows are not the caller's)."""
        if self._pending is None:
            return ids, 0
        ids, self._pending = np.concatenate([np.array([self._pending], dtype=np.int64), ids]), None
        return ids, 1

    def _run(self, entry, ids: np.ndarray, want: str | None):
        """Run an entry point on ids at the current position (the state stays on the device).
        want: "logits" returns them ([len(ids), vocab] on the host); "next" returns the greedy
        next token (an int) when the artifact chooses it on the device, else the logits; None
        reads nothing back."""
        if self._paged is not None:
            return self._run_paged(ids, want)
        name, extra = entry
        if want == "next" and not extra:
            want = "logits"
        read = {"logits": (0,), "next": (1,), None: ()}[want]
        pos = np.array([self._pos], dtype=np.int64)
        host, self._state = self._caller(name, [ids, pos], self._state, read, outputs=1 + extra)
        self._pos += ids.size
        if want == "next":
            return int(host[0].reshape(-1)[0])
        return host[0] if host else None

    def _run_paged(self, ids: np.ndarray, want: str | None, extra=()):
        """_run over the paged entry points (one call: PagedSequence.run)."""
        host, nxt = self._paged.run(ids, self._pos, want == "logits", extra)
        self._pos += ids.size
        return nxt if want == "next" else host  # (host: None unless the logits were asked for)

    def _paged_pieces(self, ids: np.ndarray, want: str | None) -> list:
        """_run_prompt's dynamic pieces over the paged entry points, at most PROMPT_PIECE tokens
        each (a long prompt's logits never in one call)."""
        cuts = list(range(0, ids.size, max(PROMPT_PIECE, self._paged.static_chunk)))
        if len(cuts) > 1 and ids.size - cuts[-1] == 1:  # no lone last token: it would run as a decode step
            cuts[-1] -= 1
        pieces = []
        for i, start in enumerate(cuts):
            end = cuts[i + 1] if i + 1 < len(cuts) else ids.size
            last = end == ids.size
            pieces.append((self._run_paged(ids[start:end], want if last or want == "logits" else None), 0))
        return pieces

    def _run_prompt(self, ids: np.ndarray, want: str | None) -> list:
        """Append a prompt; returns [(result, k)] of _run's results (`want` of the last piece;
        every piece's logits for "logits"): rows k.. of each piece's logits, in order, are the
        prompt's. With a static prefill length C and n >= C tokens the prompt runs in chunks of
        C; the last chunk ends at the prompt's end and so re-runs the tokens it shares with the
        one before at their own positions, rewriting the same state rows (exact for
        position-indexed state, the only kind such artifacts have). Over the paged entry points
        the pools are grown first (or the call refused) and the static chunk runs only when the
        last row alone is wanted; the rest runs in _paged_pieces."""
        c = self._chunk_len
        if self._paged is not None:
            self._paged.ensure(self._pos + ids.size)  # grown (or refused) before any piece runs
            c = self._paged.static_chunk if want != "logits" else 0
        if c and ids.size >= c:
            pieces, done = [], 0
            while done < ids.size:
                start = min(done, ids.size - c)
                self._pos -= done - start  # back to the first re-run token's position
                last = start + c >= ids.size
                piece_want = want if last or want == "logits" else None
                pieces.append((self._run(self._chunk, ids[start : start + c], piece_want), done - start))
                done = start + c
            return pieces
        if self._paged is not None:
            return self._paged_pieces(ids, want)
        if ids.size == 1:  # prefill is exported for S >= 2; one token is a decode step
            return [(self._run(self._decode, ids, want), 0)]
        return [(self._run(self._prefill_first if self._pos == 0 else self._prefill, ids, want), 0)]

    def _append(self, prompt: "_Prompt", want: str | None) -> list:
        """Append the pending token (if any) and a checked prompt (`_prompt`, `_text`); returns
        _run_prompt's pieces with the pending token's row dropped."""
        if prompt.pixels is not None:
            features, rows = self._images.encode(self._caller, prompt)
            ids, skip = self._take_pending(prompt.ids)
            rows = np.concatenate([np.full(skip, -1, dtype=np.int64), rows])
            return [(self._run_images(ids, features, rows, want), skip)]
        ids, skip = self._take_pending(prompt.ids)
        pieces = self._run_prompt(ids, want)
        return [(pieces[0][0], pieces[0][1] + skip), *pieces[1:]]

    def _logits(self, prompt: "_Prompt") -> np.ndarray:
        """_append the prompt; its logits [len(prompt.ids), vocab], checked finite."""
        rows = np.concatenate([logits[k:] for logits, k in self._append(prompt, "logits")])
        return self._finite(rows.reshape(-1, self.vocab_size))

    def _next(self, prompt: "_Prompt") -> int:
        """_append the prompt; the greedy next token (only its id read back where the device
        computes it)."""
        return self._greedy_next(self._append(prompt, "next")[-1][0])

    def _text(self, token) -> "_Prompt":
        """One token to decode, checked: any id of the vocabulary, the image placeholder too (a
        decoded token is never an image)."""
        return _Prompt(self._check_ids([token]))

    # -- images ---------------------------------------------------------------------------------
    def _prompt(self, ids, images) -> "_Prompt":
        """ids checked (token ids; with images, placeholders and room too) and, with images, expanded
        and the images preprocessed; nothing runs on the device and the state is untouched."""
        arr = token_ids(ids, self.vocab_size, SessionError)
        images = image_list(images, SessionError)
        if images and self.vision is None:
            raise SessionError(
                f"{len(images)} image(s) given, but this artifact ({self.manifest.architecture}) has no vision "
                f"tower: compile a checkpoint with a vision_config (and its image_token_id in the vocabulary) "
                f"to give images"
            )
        if self.vision is None or not images and not (arr == self.vision.image_token_id).any():
            self._check_room(arr.size)
            return _Prompt(arr)
        p = self._images.prompt(arr, images)
        total = self._pos + (self._pending is not None) + p.ids.size
        if total > self.max_seq_len:
            pending = " and the pending token" if self._pending is not None else ""
            raise SessionError(
                f"the prompt's {arr.size - len(images)} text token(s) and {len(images)} image(s) of "
                f"{' + '.join(map(str, p.counts))} image tokens make {p.ids.size} tokens; with {self._pos} in the "
                f"state{pending} the sequence would reach {total}, more than the artifact's max_seq_len "
                f"{self.max_seq_len} (fewer or smaller images, a smaller max_image_tokens in the artifact's "
                f"preprocessor_config.json, or compile with a larger --max-seq-len)"
            )
        if p.ids.size + (self._pending is not None) < 2:
            raise SessionError("a prompt with images needs at least 2 tokens (prefill_mm's shortest prompt)")
        return _Prompt(p.ids, p.pixels, p.grid)

    def _run_images(self, ids: np.ndarray, features: np.ndarray, rows: np.ndarray, want: str | None):
        """prefill_mm on ids (the pending token first, if any) at the current position; `want` as _run."""
        if self._paged is not None:
            return self._run_paged(ids, want, (self._vm.to_device(features), self._vm.to_device(rows)))
        read = {"logits": (0,), "next": (1,), None: ()}[want]
        pos = np.array([self._pos], dtype=np.int64)
        host, self._state = self._caller.call(
            IMAGE_PREFILL, [ids, pos, features, rows, *self._state], 2 + len(self._state), read, 2
        )
        self._pos += ids.size
        if want == "next":
            return int(host[0].reshape(-1)[0])
        return host[0] if host else None

    @_exclusive
    def image_features(self, images) -> np.ndarray:
        """The vision tower's features [N, hidden] f32 of `images` (a list, as prefill's), in
        order: what prefill_mm puts in place of their N placeholder rows. The state is untouched."""
        if self.vision is None:
            raise SessionError(f"this artifact ({self.manifest.architecture}) has no vision tower")
        images = image_list(images, SessionError)
        if not images:
            raise SessionError("image_features: no images given")
        p = self._images.prompt(np.full(len(images), self.vision.image_token_id, dtype=np.int64), images)
        if max(p.counts) > self.max_seq_len:
            raise SessionError(
                f"an image of {max(p.counts)} image tokens is more than the artifact's max_seq_len {self.max_seq_len}"
            )
        return self._images.features(self._caller, p.pixels, p.grid)

    @_exclusive
    def encode_pixels(self, pixels, grid) -> np.ndarray:
        """The vision tower's features [N, hidden] f32 of images already preprocessed
        (runtime/images.py preprocess: pixel values [patches, patch_dim] f32, grids [images, 3] of
        (t, h, w) patches): image_features without decoding and preprocessing on the host (what
        a benchmark of the device's part times). The state is untouched."""
        if self.vision is None:
            raise SessionError(f"this artifact ({self.manifest.architecture}) has no vision tower")
        pixels, grid = np.asarray(pixels, dtype=np.float32), np.asarray(grid)
        if pixels.ndim != 2 or pixels.shape[1] != self.vision.patch_dim:
            raise SessionError(f"pixels must be [patches, {self.vision.patch_dim}], got {list(pixels.shape)}")
        if grid.ndim != 2 or grid.shape[1] != 3 or not grid.size or grid.min() < 1:
            raise SessionError(f"grid must be [images, 3] of positive (t, h, w), got {grid.tolist()}")
        patches = grid.prod(axis=1)
        if int(patches.sum()) != pixels.shape[0]:
            raise SessionError(f"grid holds {int(patches.sum())} patches, pixels {pixels.shape[0]}")
        m2 = self.vision.merge_size**2
        if (patches % m2).any() or int(patches.max()) > self.vision.max_patches:
            raise SessionError(
                f"each image's patches must be a multiple of {m2} and at most max_patches "
                f"{self.vision.max_patches}, got {patches.tolist()}"
            )
        return self._images.features(self._caller, pixels, grid.astype(np.int64))

    @_exclusive
    def image_prompt(self, ids, images) -> list[int]:
        """The ids `prefill(ids, images)` would append: each image placeholder expanded to its
        image's token count (the images are decoded and preprocessed, not encoded)."""
        return self._prompt(ids, images).ids.tolist()

    def _finite(self, rows: np.ndarray) -> np.ndarray:
        if not np.isfinite(rows).all():
            self._not_finite()
        return rows

    def _not_finite(self):
        raise SessionError(
            f"the model's logits up to position {self._pos} are not finite (NaN or infinity): the "
            f"checkpoint's weights or config values are broken; reset() before reusing this session"
        )

    @_exclusive
    def prefill(self, ids, images=None) -> np.ndarray:
        """Append ids (after the pending token, if any); returns their logits [len(ids), vocab].
        `images`: one per image placeholder in ids (module docstring); the logits then have one
        row per token of the expanded prompt."""
        return self._logits(self._prompt(ids, images))

    def _greedy_next(self, result) -> int:
        """The greedy token from the last piece's result: its id when the artifact chose it on
        the device, else the argmax of the logits' last row."""
        if not isinstance(result, int):
            return greedy(self._finite(result[-1].reshape(-1)))
        if result == NON_FINITE_TOKEN:
            self._not_finite()
        return result

    @_exclusive
    def decode(self, token: int) -> np.ndarray:
        """Append one token (after the pending one, if any); returns its logits [vocab]."""
        logits, _ = self._append(self._text(token), "logits")[-1]
        return self._finite(logits[-1].reshape(-1))

    @_exclusive
    def decode_greedy(self, token: int) -> int:
        """Append one token; return the greedy next token, reading back only its id when the
        artifact computes it on the device (else the argmax of the logits)."""
        return self._next(self._text(token))

    @_exclusive
    def prefill_greedy(self, ids, images=None) -> int:
        """Append ids (with `images`, as prefill); return the greedy next token (only its id is
        read back: the time to first token of greedy generation does not include copying
        [len(ids), vocab] logits)."""
        return self._next(self._prompt(ids, images))

    @_exclusive
    def generate(
        self,
        ids,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_at_eos: bool = True,
        images=None,
    ) -> list[int]:
        """Prefill ids (after the pending token, if any; with `images`, as prefill), then sample
        up to max_new_tokens; returns the new tokens, the last of which becomes the pending token.
        Needs room for the prompt (expanded, with images) and max_new_tokens - 1 more (the last
        token is not fed)."""
        validate_sampling(temperature, top_k, top_p)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise SessionError(f"max_new_tokens must be a non-negative int (got {max_new_tokens!r})")
        prompt = self._prompt(ids, images)
        ids = prompt.ids
        fed = (self._pending is not None) + ids.size + max(max_new_tokens - 1, 0)
        if self._pos + fed > self.max_seq_len:
            raise SessionError(
                f"prompt ({ids.size} tokens, {self._pos} already in the sequence"
                f"{', 1 pending' if self._pending is not None else ''}) + max_new_tokens {max_new_tokens} "
                f"needs {self._pos + fed} positions, more than max_seq_len {self.max_seq_len}"
            )
        rng = make_rng(seed)
        is_greedy = temperature == 0 or top_k == 1
        if is_greedy:
            token = self._next(prompt)
        else:
            token = sample(self._logits(prompt)[-1], temperature, top_k, top_p, rng)
        out: list[int] = []
        for i in range(max_new_tokens):
            out.append(token)
            if (stop_at_eos and token in self.eos_token_ids) or i + 1 == max_new_tokens:
                break
            if is_greedy:  # the next token is chosen on the device; the logits stay there
                token = self.decode_greedy(token)
            else:
                token = sample(self.decode(token), temperature, top_k, top_p, rng)
        self._pending = out[-1] if out else None
        return out


class _Prompt:
    """A checked prompt (Session._prompt): `ids` int64 (expanded, with images); with images their
    `pixels` (preprocess's pixel_values [P, patch_dim] f32) and `grid` [n, 3]."""

    def __init__(self, ids: np.ndarray, pixels: np.ndarray | None = None, grid: np.ndarray | None = None):
        self.ids, self.pixels, self.grid = ids, pixels, grid


def _padded(array: np.ndarray, shape: tuple) -> np.ndarray:
    """`array` zero-padded to `shape` along its first axis (a state file's truncated tensor)."""
    if array.shape == tuple(shape):
        return array
    out = np.zeros(shape, dtype=array.dtype)
    out[: array.shape[0]] = array
    return out


def _host_copy(array) -> np.ndarray:
    """An owned host copy: on host-visible devices `to_host()` maps the device buffer, which IREE
    reuses for later results, so a returned view would change under the caller."""
    return np.array(array.to_host(), copy=True)
