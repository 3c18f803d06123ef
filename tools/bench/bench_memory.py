"""`python -m day0.tools.bench.bench_memory`: memory of an MXFP4 deepseek_v32 checkpoint through day0.

Builds (seeded, once) a deepseek_v32 checkpoint whose routed experts dominate its size, quantizes
them with `day0 quantize --layout compressed-tensors`, then measures in fresh processes:
  compile   peak RSS of `day0 compile` (export runs on uninitialized weights: no weight loads)
  load      anonymous RSS a loaded Session adds (copies the runtime made: the hoisted u8 expert
            stacks, the state) and file-backed RSS (shard pages mapped by IREE's parameter index),
            after the first token
against the packed expert bytes and the whole checkpoint on disk. Goal (issue 3): resident expert
bytes == packed bytes on disk; peak of compile + first token < 1.2 × checkpoint + 1 GiB.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from day0.tools.bench.deepseek_v32_configs import CONFIGS

_PROBE = r"""
import json, resource, sys, numpy as np
import torch, day0.models.checkpoint  # imported before measuring: their own memory is not the model's
from day0.runtime.session import Session
def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    kb = lambda k: int(fields[k].split()[0]) * 1024
    return {"anon": kb("RssAnon"), "file": kb("RssFile")}
before = rss()
s = Session.load(sys.argv[1], verify=False)
s.prefill(np.arange(8) % 256)
after = rss()
print(json.dumps({"before": before, "after": after, "state": sum(s.state_bytes().values()),
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _peak_rss_of(cmd: list[str]) -> tuple[int, str]:
    """Run cmd in a child; its own peak RSS in bytes (wait4's rusage of that child alone) and
    its stdout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return usage.ru_maxrss * 1024, out


def main(argv=None) -> int:
    from day0.models.checkpoint import Checkpoint
    from day0.models.quantize import quantize_checkpoint
    from day0.tools.checkpoints.demo import tiny_deepseek_v32_config, write_tiny_checkpoint

    p = argparse.ArgumentParser(prog="day0-bench-memory")
    p.add_argument("--workdir", default=".cache/bench-memory")
    p.add_argument("--json", default=None)
    p.add_argument("--make-checkpoint", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    work = Path(a.workdir)
    if a.make_checkpoint:
        # the demo config with the fields of the `memory` column of the deepseek_v32 benchmark table
        config = tiny_deepseek_v32_config(**CONFIGS["memory"])
        write_tiny_checkpoint(work / "ckpt-f32", config, seed=0, max_shard_size="200MB", tokenizer=False)
        quantize_checkpoint(work / "ckpt-f32", work / "ckpt-mxfp4", "compressed-tensors")
        return 0
    packed = work / "ckpt-mxfp4"
    if not packed.exists():
        # In a child: building the model here would leave this process large, and children forked
        # from a large process report its size as their own peak (ru_maxrss survives exec).
        subprocess.run(
            [sys.executable, "-m", "day0.tools.bench.bench_memory", "--workdir", str(work), "--make-checkpoint"],
            check=True,
        )
    ckpt = Checkpoint.open(packed)
    expert_bytes = sum(t.nbytes for n, t in ckpt.tensors.items() if ".mlp.experts." in n)
    total_bytes = sum(f.stat().st_size for f in ckpt.files)

    bindir = Path(sys.executable).parent
    artifact = work / "artifact"
    compile_peak, _ = _peak_rss_of(
        [str(bindir / "day0"), "compile", str(packed), "-o", str(artifact), "--max-seq-len", "256"]
    )
    _, out = _peak_rss_of([sys.executable, "-c", _PROBE, str(artifact)])
    probe = json.loads(out)
    load_peak = probe["peak"]
    added_anon = probe["after"]["anon"] - probe["before"]["anon"]
    added_file = probe["after"]["file"] - probe["before"]["file"]
    result = {
        "checkpoint_bytes": total_bytes,
        "packed_expert_bytes": expert_bytes,
        "compile_peak_rss": compile_peak,
        "load_first_token_peak_rss": load_peak,
        "session_added_anon": added_anon,
        "session_added_file": added_file,
        "state_bytes": probe["state"],
        "budget": 1.2 * total_bytes + (1 << 30),
    }
    mib = lambda b: f"{b / 2**20:9.1f} MiB"  # noqa: E731
    print(f"checkpoint on disk {mib(total_bytes)}  (packed routed experts {mib(expert_bytes)})")
    print(
        f"compile peak RSS   {mib(compile_peak)}   load + first token peak RSS {mib(load_peak)}"
        f"   budget 1.2×ckpt+1GiB {mib(result['budget'])}"
    )
    print(f"session adds anon  {mib(added_anon)} (state {mib(probe['state'])}), file-backed {mib(added_file)}")
    resident = added_anon - probe["state"]  # what the runtime holds for the weights
    print(
        f"weights resident (anon beyond state) ÷ checkpoint bytes on disk = {resident / total_bytes:.2f}; "
        f"goal 1.00 (packed experts {expert_bytes / 2**20:.1f} MiB are held once, as u8 stacks)"
    )
    out_path = Path(a.json) if a.json else work / "bench-memory.json"
    out_path.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
