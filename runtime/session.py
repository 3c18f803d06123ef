"""`Session`: a loaded artifact, its device-resident state, and generation.

    s = Session.load(artifact_dir, device="local-task")
    s.prefill(ids)   -> np.float32 [len(ids), vocab]   (appends to the sequence)
    s.decode(token)  -> np.float32 [vocab]             (appends one token)
    s.prefill_greedy(ids) / s.decode_greedy(token) -> int  (the greedy next token, chosen on the device)
    s.generate(ids, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=None) -> list[int]
    s.reset()        -> empty state, same weights
    s.save_state(path) / s.load_state(path)            (the sequence so far, on disk)

The state (the manifest's state tensors: caches, recurrent states) stays on the device: each call
passes the previous call's returned buffers back in, and IREE updates them in place. One decode
step is one device invocation.
"""

from pathlib import Path

import numpy as np

from day0.runtime.artifact import VMFB, Manifest, read_manifest
from day0.runtime.sampling import greedy, make_rng, sample, validate_sampling
from day0.runtime.state_file import np_dtype


class SessionError(ValueError):
    pass


class Session:
    def __init__(self, artifact_dir: Path, manifest: Manifest, vm):
        self.artifact_dir, self.manifest, self._vm = Path(artifact_dir), manifest, vm
        self.max_seq_len: int = manifest.max_seq_len
        self.vocab_size: int = manifest.vocab_size
        self.eos_token_ids = set(manifest.eos_token_ids)
        entries = manifest.entry_points
        # the first turn (position 0) may have a form that scores only the prompt's own keys
        first = "prefill_first" if "prefill_first" in entries else "prefill"

        def entry(name: str):
            """(function, how many outputs sit between the logits and the state)"""
            return vm.function(name), int(entries[name].greedy_next)

        self._prefill, self._decode, self._prefill_first = (entry(n) for n in ("prefill", "decode", first))
        # prompts of at least this many tokens run through the static-length prefill
        self._chunk_len = manifest.prefill_chunk
        self._chunk = entry("prefill_chunk") if self._chunk_len else None
        self.reset()

    @classmethod
    def load(cls, artifact_dir, device: str | None = None, verify: bool = True, checkpoint_dir=None) -> "Session":
        """Load and verify an artifact (hashes of the vmfb and the shards it reads, unless
        verify=False), then bind its parameters from the original shards — found where the
        compile read them, or in `checkpoint_dir` when the checkpoint has moved (another host).
        `device`: one of the artifact's devices (its target's; None: the first, e.g. local-task
        for llvm-cpu, cuda for cuda-sm90); another is refused before the runtime is asked."""
        from day0.runtime.vm import VmModule

        manifest = read_manifest(Path(artifact_dir), verify=verify, checkpoint_dir=checkpoint_dir)
        device = manifest.devices[0] if device is None else device
        if device not in manifest.devices:
            raise SessionError(
                f"artifact {artifact_dir} was compiled for target {manifest.target}, which runs on "
                f"{' or '.join(manifest.devices)}, not on device '{device}' (compile it with "
                f"--target for that device)"
            )
        params = manifest.parameters
        files = [Path(params.base_dir) / f.path for f in params.files]
        vm = VmModule.load(Path(artifact_dir) / VMFB, files, device=device, scope=params.scope)
        return cls(artifact_dir, manifest, vm)

    # -- state ----------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Number of tokens in the sequence so far."""
        return self._pos

    def reset(self) -> None:
        self._pos = 0
        self._next = None
        self._state = [self._vm.to_device(np.zeros(s.shape, dtype=np_dtype(s.dtype))) for s in self.manifest.state]

    def save_state(self, path) -> Path:
        """Write the sequence so far (position + every state tensor) to `path` (.npz); a later
        `load_state` on a Session of an artifact of the same model continues it exactly."""
        from day0.runtime import state_file

        return state_file.write(path, self.manifest, self._pos, [_host_copy(b) for b in self._state])

    def load_state(self, path) -> None:
        """Replace the state with one `save_state` wrote; refused (StateFileError naming the first
        difference) when it was saved by an artifact of another architecture, config or
        max_seq_len."""
        from day0.runtime import state_file

        position, arrays = state_file.read(path, self.manifest)
        self._state = [self._vm.to_device(a) for a in arrays]
        self._pos, self._next = position, None

    def state_bytes(self) -> dict[str, int]:
        """Bytes of device state per kind (e.g. mla_latent, indexer_keys, kda_state, conv_tail)."""
        return self.manifest.state_bytes()

    # -- calls ----------------------------------------------------------------------------------
    def _check_ids(self, ids) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise SessionError(
                f"token ids must be a non-empty 1-D list of integers (got shape {arr.shape}, dtype {arr.dtype})"
            )
        bad = arr[(arr < 0) | (arr >= self.vocab_size)]
        if bad.size:
            raise SessionError(f"token id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size})")
        if self._pos + arr.size > self.max_seq_len:
            raise SessionError(
                f"sequence would reach {self._pos + arr.size} tokens, more than the artifact's "
                f"max_seq_len {self.max_seq_len} (compile with a larger --max-seq-len)"
            )
        return arr.astype(np.int64)

    def _run(self, entry, ids: np.ndarray):
        """Run an entry point; returns the device logits (and stores the state). The greedy next
        token stays on the device in self._next (None when the artifact has none)."""
        fn, extra = entry
        out = fn(ids, np.array([self._pos], dtype=np.int64), *self._state)
        logits, self._next = out[0], (out[1] if extra else None)
        self._state = list(out[1 + extra :])
        self._pos += ids.size
        return logits

    def _run_prompt(self, ids: np.ndarray) -> list:
        """Append a prompt; returns [(device logits, k)]: rows k.. of each piece, in order, are the
        prompt's logits. With a static prefill length C and n >= C tokens the prompt runs in
        chunks of C; the last chunk ends at the prompt's end and so re-runs the tokens it shares
        with the one before at their own positions, rewriting the same state rows (exact for
        position-indexed state, the only kind such artifacts have)."""
        c = self._chunk_len
        if c and ids.size >= c:
            pieces, done = [], 0
            while done < ids.size:
                start = min(done, ids.size - c)
                self._pos -= done - start  # back to the first re-run token's position
                pieces.append((self._run(self._chunk, ids[start : start + c]), done - start))
                done = start + c
            return pieces
        if ids.size == 1:  # prefill is exported for S >= 2; one token is a decode step
            return [(self._run(self._decode, ids), 0)]
        return [(self._run(self._prefill_first if self._pos == 0 else self._prefill, ids), 0)]

    def prefill(self, ids) -> np.ndarray:
        ids = self._check_ids(ids)
        rows = [_host_copy(logits)[k:] for logits, k in self._run_prompt(ids)]
        return np.concatenate(rows).reshape(ids.size, -1)

    def _greedy_next(self, logits) -> int:
        """The greedy token after the last call: its id read back alone when the artifact chose
        it on the device, else the argmax of the logits' last row."""
        if self._next is None:
            return greedy(_host_copy(logits)[-1].reshape(-1))
        return int(np.asarray(self._next.to_host()).reshape(-1)[0])

    def decode(self, token: int) -> np.ndarray:
        ids = self._check_ids([token])
        return _host_copy(self._run(self._decode, ids)).reshape(-1)

    def decode_greedy(self, token: int) -> int:
        """Append one token; return the greedy next token, reading back only its id when the
        artifact computes it on the device (else the argmax of the logits)."""
        return self._greedy_next(self._run(self._decode, self._check_ids([token])))

    def prefill_greedy(self, ids) -> int:
        """Append ids; return the greedy next token (only its id is read back: the time to first
        token of greedy generation does not include copying [len(ids), vocab] logits)."""
        return self._greedy_next(self._run_prompt(self._check_ids(ids))[-1][0])

    def generate(
        self,
        ids,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_at_eos: bool = True,
    ) -> list[int]:
        """Prefill ids, then sample up to max_new_tokens; returns the new tokens."""
        validate_sampling(temperature, top_k, top_p)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise SessionError(f"max_new_tokens must be a non-negative int (got {max_new_tokens!r})")
        ids = self._check_ids(ids)
        if self._pos + ids.size + max_new_tokens > self.max_seq_len:
            raise SessionError(
                f"prompt ({ids.size} tokens, {self._pos} already in the sequence) + "
                f"max_new_tokens {max_new_tokens} exceeds max_seq_len {self.max_seq_len}"
            )
        rng = make_rng(seed)
        is_greedy = temperature == 0 or top_k == 1
        if is_greedy:
            token = self.prefill_greedy(ids)
        else:
            token = sample(self.prefill(ids)[-1], temperature, top_k, top_p, rng)
        out: list[int] = []
        for i in range(max_new_tokens):
            out.append(token)
            if (stop_at_eos and token in self.eos_token_ids) or i + 1 == max_new_tokens:
                break
            if is_greedy:  # the next token is chosen on the device; the logits stay there
                token = self.decode_greedy(token)
            else:
                token = sample(self.decode(token), temperature, top_k, top_p, rng)
        return out


def _host_copy(array) -> np.ndarray:
    """An owned host copy: on host-visible devices `to_host()` maps the device buffer, which IREE
    reuses for later results, so a returned view would change under the caller."""
    return np.array(array.to_host(), copy=True)
