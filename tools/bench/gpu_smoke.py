"""GPU host check of a cuda-sm90 artifact: correctness against logits recorded on the CPU, then
decode and prefill timings. Runs with only numpy and iree-base-runtime installed (no torch, no
compiler): `python -m day0.tools.bench.gpu_smoke ARTIFACT --checkpoint DIR --expected expected.npz`.

expected.npz (written on the compile machine by `--record`) holds the prompt `ids` and the
teacher-forced logits `prefill` [P, V] and `decode` [D, V] of the CPU artifact.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from day0.tools.bench.timing import median_seconds


def teacher_forced(session, ids: np.ndarray, prompt: int) -> tuple[np.ndarray, np.ndarray]:
    session.reset()
    prefill = session.prefill(ids[:prompt])
    decode = np.stack([session.decode(int(t)) for t in ids[prompt:]])
    return prefill, decode


def main(argv=None) -> int:
    from day0.runtime.session import Session

    p = argparse.ArgumentParser(prog="day0-gpu-smoke")
    p.add_argument("artifact")
    p.add_argument("--checkpoint", default=None, help="where the shards are on this host")
    p.add_argument("--device", default="cuda")
    p.add_argument("--expected", required=True, help="npz of CPU logits (read, or written with --record)")
    p.add_argument("--record", action="store_true", help="write --expected from this device instead")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    t = time.perf_counter()
    s = Session.load(a.artifact, device=a.device, verify=False, checkpoint_dir=a.checkpoint)
    load_s = time.perf_counter() - t
    if a.record:
        ids = np.random.default_rng(0).integers(0, min(256, s.vocab_size), a.prompt + a.steps).astype(np.int64)
        pre, dec = teacher_forced(s, ids, a.prompt)
        np.savez(a.expected, ids=ids, prefill=pre, decode=dec)
        print(f"recorded {a.expected}")
        return 0
    want = np.load(a.expected)
    ids = want["ids"]
    prompt = want["prefill"].shape[0]
    pre, dec = teacher_forced(s, ids, prompt)
    scale = max(np.abs(want["prefill"]).max(), np.abs(want["decode"]).max())
    err = max(np.abs(pre - want["prefill"]).max(), np.abs(dec - want["decode"]).max()) / scale
    s.reset()  # a second turn goes through the general prefill (start > 0)
    half = prompt // 2
    s.prefill(ids[:half])
    turn2_err = float(np.abs(s.prefill(ids[half:prompt]) - want["prefill"][half:]).max() / scale)

    def prefill_once():
        s.reset()
        s.prefill(ids[:prompt])

    prefill_s = median_seconds(prefill_once, 5)
    s.reset()
    s.prefill(ids[:prompt])
    room = s.max_seq_len - s.position  # decode steps the artifact has room for
    decode_s = median_seconds(lambda: s.decode(int(ids[prompt])), max(1, min(50, room - 1)))
    result = {
        "device": a.device,
        "rel_err_vs_cpu": float(err),
        "second_turn_rel_err": turn2_err,
        "load_s": load_s,
        "prefill_ms": prefill_s * 1e3,
        "prefill_tokens": int(prompt),
        "decode_ms_per_step": decode_s * 1e3,
    }
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0 if max(err, turn2_err) < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
