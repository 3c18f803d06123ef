"""`make bench-gpu`, piece `default`: the shipped default model (tools/checkpoints/default, issue 16)
compiled for the target, once with the target's cache dtype (bf16 on cuda-sm90) and once with f32
caches, against transformers (float32) on the same device and the same weights:

  perplexity  exp(mean next-token loss) over the held-out text (tools/train/corpus.py) in
              windows of `window` tokens, each run from position 0 (tools/train/evaluate.py's
              definition), and its ratio to transformers';
  greedy      `greedy` tokens after each of tools/train/evaluate.PROMPTS (a full forward per
              token for transformers, the Session's decode for day0), and how many agree.

package (compile machine): compiles the artifacts and writes the held-out token ids and the
prompts' ids into the package (the tokenizer and the corpus stay here), with a copy of the
checkpoint. run (GPU host): needs numpy, the IREE runtime, torch and transformers.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

SETTINGS = {
    "full": {"tokens": 4096, "window": 256, "greedy": 24},
    "tiny": {"tokens": 64, "window": 32, "greedy": 4},
}
SHIPPED = ["tools/bench/bench_gpu_default.py", "tools/train/__init__.py", "tools/train/evaluate.py"]


def _checkpoint() -> Path:
    return Path(__file__).resolve().parents[1] / "checkpoints" / "default"


def cache_dtypes(target: str) -> list[str]:
    """The target's cache dtype for this model, then float32 if that differs."""
    from day0.lowering.targets import get_target

    first = get_target(target).cache_dtype
    return [first] + (["float32"] if first != "float32" else [])


def package(out: Path, config: str, target: str) -> dict:
    import numpy as np
    from tokenizers import Tokenizer

    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.tools.bench import bench_e2e
    from day0.tools.train.evaluate import PROMPTS, held_out_stream

    s = SETTINGS[config]
    root = out / "default"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shutil.copytree(_checkpoint(), root / "checkpoint")
    np.save(root / "stream.npy", held_out_stream(_checkpoint(), s["tokens"]))
    tok = Tokenizer.from_file(str(_checkpoint() / "tokenizer.json"))
    prompts = [tok.encode(p).ids for p in PROMPTS]
    for dtype in cache_dtypes(target):
        options = BuildOptions(target=target, max_seq_len=s["window"] + s["greedy"] + 8, cache_dtype=dtype)
        compile_checkpoint(root / "checkpoint", root / f"artifact-{dtype}", options, progress=lambda *_: None)
    bench_e2e.ship_sources(out, SHIPPED)
    return {"config": config, **s, "cache_dtypes": cache_dtypes(target), "prompts": prompts}


def _day0_ways(root: Path, spec: dict, device: str):
    """(name, logits_of(ids) -> [len(ids), V], greedy(prompt, n) -> ids) per compiled artifact."""
    import numpy as np

    from day0.runtime.session import Session

    for dtype in spec["cache_dtypes"]:
        session = Session.load(root / f"artifact-{dtype}", device=device, checkpoint_dir=root / "checkpoint")

        def logits_of(ids, s=session):
            s.reset()
            return s.prefill(np.asarray(ids))

        def greedy(prompt, n, s=session):
            s.reset()
            return s.generate(list(prompt), max_new_tokens=n, temperature=0.0)

        yield f"day0 {dtype} caches", logits_of, greedy


def run(pkg: Path, spec_all: dict, device: str) -> dict:
    import numpy as np
    import torch

    from day0.tools.train.evaluate import greedy as full_forward_greedy
    from day0.tools.train.evaluate import perplexity, transformers_logits

    spec, root = spec_all["default"], pkg / "default"
    dev = "cuda" if device.startswith("cuda") else "cpu"
    stream = np.load(root / "stream.npy")
    theirs = transformers_logits(root / "checkpoint", device=dev)
    reference = perplexity(theirs, stream, spec["window"])
    want = [full_forward_greedy(theirs, p, spec["greedy"]) for p in spec["prompts"]]
    rows = [{"way": "transformers float32", "perplexity": reference, "greedy_agree": [spec["greedy"]] * len(want)}]
    if dev == "cuda":
        torch.cuda.empty_cache()
    for name, logits_of, greedy in _day0_ways(root, spec, device):
        got = [greedy(p, spec["greedy"]) for p in spec["prompts"]]
        ppl = perplexity(logits_of, stream, spec["window"])
        rows.append(
            {
                "way": name,
                "perplexity": ppl,
                "greedy_agree": [_agree(a, b) for a, b in zip(got, want, strict=True)],
            }
        )
    for r in rows:
        r["ratio"] = r["perplexity"] / reference
        assert math.isfinite(r["perplexity"]), r
    return {
        "piece": "default",
        "tokens": int(stream.size - 1),
        "window": spec["window"],
        "greedy": spec["greedy"],
        "rows": rows,
    }


def _agree(got: list[int], want: list[int]) -> int:
    """How many leading greedy tokens agree (after the first difference the prefixes differ)."""
    n = 0
    for a, b in zip(got, want):
        if a != b:
            break
        n += 1
    return n


def table(r: dict) -> str:
    lines = [
        f"default model: held-out perplexity over {r['tokens']} tokens (windows of {r['window']}), "
        f"greedy agreement of {r['greedy']} tokens after each prompt",
        f"{'way':<26}{'perplexity':>12}{'vs transf.':>12}  greedy",
    ]
    for row in r["rows"]:
        agree = ", ".join(f"{a}/{r['greedy']}" for a in row["greedy_agree"])
        lines.append(f"{row['way']:<26}{row['perplexity']:>12.4f}{row['ratio']:>12.4f}  {agree}")
    return "\n".join(lines)
