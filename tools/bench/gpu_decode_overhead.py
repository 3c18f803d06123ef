"""Where a decode step's time goes on a GPU host: the full `Session.decode`, the bare device
invocation with every argument already on the device, and the logits read-back, under IREE's
CUDA stream and graph command-buffer modes.

    python -m day0.tools.bench.gpu_decode_overhead ARTIFACT --checkpoint DIR [--cuda-graphs] [--json F]

Runs with numpy and iree-base-runtime only. The state is left as the prefill made it; every timed
step decodes at the same position, so the numbers are per-step costs, not a generation.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from day0.tools.bench.timing import median_seconds


def _median_us(fn, reps: int) -> float:
    return median_seconds(fn, reps) * 1e6


def measure(artifact: str, checkpoint: str | None, device: str, reps: int, prompt: int) -> dict:
    from day0.runtime.session import Session

    s = Session.load(artifact, device=device, verify=False, checkpoint_dir=checkpoint)
    ids = np.arange(prompt, dtype=np.int64) % s.vocab_size
    s.prefill(ids)
    pos = s.position
    state = list(s._state)
    vm, (name, extra) = s._vm, s._decode
    decode = vm.function(name)
    tok = vm.to_device(np.array([1], np.int64))
    first_state = 1 + extra  # decode returns logits, [next token], *state
    at = vm.to_device(np.array([pos], np.int64))

    def bare():  # every argument resident; results stay on the device
        out = decode(tok, at, *state)
        state[:] = out[first_state:]
        return out

    def bare_readback():
        return bare()[0].to_host()

    def host_args():  # ids and position passed as numpy arrays (uploaded per call)
        out = decode(np.array([1], np.int64), np.array([pos], np.int64), *state)
        state[:] = out[first_state:]
        return out

    def greedy_token():  # Session.decode_greedy: only the next token's id is read back
        s._pos = pos
        s._state = state
        out = s.decode_greedy(1)
        state[:] = s._state
        return out

    def full():  # Session.decode: checks, upload, run, owned host copy of the logits
        s._pos = pos
        s._state = state
        out = s.decode(1)
        state[:] = s._state
        return out

    return {
        "artifact": artifact,
        "device": device,
        "prompt": prompt,
        "bare_invoke_us": _median_us(bare, reps),
        "bare_invoke_plus_logits_readback_us": _median_us(bare_readback, reps),
        "numpy_args_invoke_us": _median_us(host_args, reps),
        "session_decode_us": _median_us(full, reps),
        "session_decode_greedy_us": _median_us(greedy_token, reps),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-gpu-decode-overhead")
    p.add_argument("artifact")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--cuda-graphs", action="store_true", help="IREE CUDA graph command buffers")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import iree.runtime as rt

    if a.cuda_graphs:
        rt.flags.parse_flags("--cuda_use_streams=false")
    res = measure(a.artifact, a.checkpoint, a.device, a.reps, a.prompt)
    res["cuda_graphs"] = a.cuda_graphs
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
