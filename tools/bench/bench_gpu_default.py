"""`make bench-gpu`, piece `default`: the shipped default model (tools/checkpoints/default, issue 16)
compiled for the target, against transformers (float32) on the same device and the same weights:

  as shipped (f32 dense weights): with the target's cache dtype (bf16 on cuda-sm90) and with f32
      caches;
  bf16 dense weights (the shipped ones rounded, as releases ship theirs), where the target splits
      f32 activations into bf16 terms for matmuls against bf16 weights (matmul-to-bf16-terms;
      with f32 weights that pass has nothing to do): the target's caches, 3 and 2 terms.

  perplexity  exp(mean next-token loss) over the held-out text (tools/train/corpus.py) in
              windows of `window` tokens, each run from position 0 (tools/train/evaluate.py's
              definition), and its ratio to transformers' on the same weights; the artifacts'
              static prefill length is the window, so each runs as one chunk (static shapes:
              the path of a prompt of a chunk or more, the one matmul-to-bf16-terms rewrites);
  greedy      `greedy` tokens after each of tools/train/evaluate.PROMPTS (a full forward per
              token for transformers, the Session's decode for day0), and how many agree.

package (compile machine): compiles the artifacts and writes the held-out token ids and the
prompts' ids into the package (the tokenizer and the corpus stay here), with the checkpoints.
run (GPU host): needs numpy, the IREE runtime, torch and transformers.
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


def variants(target: str) -> list[dict]:
    """The builds compared (module docstring): weights, cache dtype, bf16 terms."""
    from day0.lowering.targets import get_target

    t = get_target(target)
    dtypes = [t.cache_dtype] + (["float32"] if t.cache_dtype != "float32" else [])
    shipped = [{"weights": "float32", "cache_dtype": d, "matmul_terms": 3} for d in dtypes]
    if "matmul-to-bf16-terms" not in t.pipeline():
        return shipped
    return shipped + [{"weights": "bfloat16", "cache_dtype": t.cache_dtype, "matmul_terms": n} for n in (3, 2)]


def _name(v: dict) -> str:
    return f"{v['weights']}-{v['cache_dtype']}-terms{v['matmul_terms']}"


def _checkpoint_dir(root: Path, weights: str) -> Path:
    return root / ("checkpoint" if weights == "float32" else f"checkpoint-{weights}")


def bf16_weights(src: Path, dst: Path) -> None:
    """A copy of checkpoint `src` at `dst` with its f32 tensors rounded to bf16 (config dtype too)."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        save_file({k: t.to(torch.bfloat16) if t.dtype == torch.float32 else t for k, t in tensors.items()}, f)
    config = json.loads((dst / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")


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
    builds = variants(target)
    shutil.copytree(_checkpoint(), root / "checkpoint")
    if any(v["weights"] == "bfloat16" for v in builds):
        bf16_weights(_checkpoint(), _checkpoint_dir(root, "bfloat16"))
    np.save(root / "stream.npy", held_out_stream(_checkpoint(), s["tokens"]))
    tok = Tokenizer.from_file(str(_checkpoint() / "tokenizer.json"))
    prompts = [tok.encode(p).ids for p in PROMPTS]
    for v in builds:
        options = BuildOptions(
            target=target,
            max_seq_len=s["window"] + s["greedy"] + 8,
            prefill_chunk=s["window"],  # a window is one static chunk: matmul-to-bf16-terms' matmuls
            cache_dtype=v["cache_dtype"],
            matmul_terms=v["matmul_terms"],
        )
        ckpt = _checkpoint_dir(root, v["weights"])
        compile_checkpoint(ckpt, root / f"artifact-{_name(v)}", options, progress=lambda *_: None)
    bench_e2e.ship_sources(out, SHIPPED)
    return {"config": config, **s, "variants": builds, "prompts": prompts}


def _session_ways(root: Path, spec: dict, weights: str, device: str):
    """(name, logits_of(ids) -> [len(ids), V], greedy(prompt, n) -> ids) per artifact of `weights`."""
    import numpy as np

    from day0.runtime.session import Session

    mine = [v for v in spec["variants"] if v["weights"] == weights]
    for v in mine:
        session = Session.load(
            root / f"artifact-{_name(v)}", device=device, checkpoint_dir=_checkpoint_dir(root, weights)
        )

        def logits_of(ids, s=session):
            s.reset()
            return s.prefill(np.asarray(ids))

        def greedy(prompt, n, s=session):
            s.reset()
            return s.generate(list(prompt), max_new_tokens=n, temperature=0.0)

        terms = f", {v['matmul_terms']} terms" if len({w["matmul_terms"] for w in mine}) > 1 else ""
        yield f"day0 {v['cache_dtype']} caches{terms}", logits_of, greedy


def run(pkg: Path, spec_all: dict, device: str) -> dict:
    import numpy as np
    import torch

    from day0.tools.train.evaluate import greedy as full_forward_greedy
    from day0.tools.train.evaluate import perplexity, transformers_logits

    spec, root = spec_all["default"], pkg / "default"
    dev = "cuda" if device.startswith("cuda") else "cpu"
    stream = np.load(root / "stream.npy")
    rows = []
    for weights in dict.fromkeys(v["weights"] for v in spec["variants"]):
        theirs = transformers_logits(_checkpoint_dir(root, weights), device=dev)
        reference = perplexity(theirs, stream, spec["window"])
        want = [full_forward_greedy(theirs, p, spec["greedy"]) for p in spec["prompts"]]
        del theirs
        if dev == "cuda":
            torch.cuda.empty_cache()
        ways = [("transformers float32", None, None), *_session_ways(root, spec, weights, device)]
        for name, logits_of, greedy in ways:
            if logits_of is None:
                ppl, agree = reference, [spec["greedy"]] * len(want)
            else:
                got = [greedy(p, spec["greedy"]) for p in spec["prompts"]]
                ppl, agree = (
                    perplexity(logits_of, stream, spec["window"]),
                    [_agree(a, b) for a, b in zip(got, want, strict=True)],
                )
            assert math.isfinite(ppl), (weights, name, ppl)
            rows.append(
                {"weights": weights, "way": name, "perplexity": ppl, "ratio": ppl / reference, "greedy_agree": agree}
            )
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
        f"{'weights':<10}{'way':<34}{'perplexity':>12}{'vs transf.':>12}  greedy",
    ]
    for row in r["rows"]:
        agree = ", ".join(f"{a}/{r['greedy']}" for a in row["greedy_agree"])
        lines.append(
            f"{row.get('weights', 'float32'):<10}{row['way']:<34}{row['perplexity']:>12.4f}{row['ratio']:>12.4f}  {agree}"
        )
    return "\n".join(lines)
