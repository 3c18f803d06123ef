"""`make bench-gpu`, piece `vision`: GLM-5.3-Flash's vision tower at its release shapes
(transformers' Glm5NextVisionConfig defaults: 24 blocks, hidden 1024, 16 heads of 64, MLP 4096,
merger 10240; out_hidden_size 4096, the text hidden size) with random bf16 weights from a seed
(tools/bench/bench_checkpoint.py's writer), in front of a small text model of hidden 4096
(tools/checkpoints/glm5_next.TINY_TEXT), compiled for the target with an image bucket per
benchmarked image size, against transformers (Glm5NextForConditionalGeneration) on the same device
and the same weights:

  encode  one preprocessed image through the tower, median of `repeats` after a warm-up: day0's
          encode_image bucket that holds it exactly (pixels uploaded, features read back, as
          Session.image_features does after preprocessing); transformers' model.visual in bf16
          with attn_implementation "eager" (the goal's baseline, issue 17) and "sdpa", inputs
          already on the device;
  check   day0's features against transformers' float32 tower (max |Δ| ÷ max |want|);
  terms   on a target that runs the tower's products in bf16 terms (cuda-sm90: one by default,
          Target.image_terms), encode and check again with two (BuildOptions image_terms=2,
          artifact-terms2): what the bf16 tower's speed costs in accuracy;
  ttft    a prompt with one image of the first size, image bytes in to the first greedy token
          (day0: Session.prefill_greedy, preprocessing included; transformers bf16 sdpa: its
          processor's output, one forward). The text model is small: this is the image's part
          of a release model's time to first token, not all of it.

package (compile machine): writes the checkpoint, compiles it into out/vision/artifact.
run (GPU host): writes the same checkpoint from the seed (needs Pillow, transformers), measures.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

SETTINGS = {
    "full": {"sides": [448, 1024], "repeats": 5, "max_seq_len": 2048, "tower": "release"},
    "tiny": {"sides": [112, 168], "repeats": 1, "max_seq_len": 96, "tower": "tiny"},
}
SEED = 0
TEXT = 16  # text tokens on each side of the image placeholder in the ttft prompt
SHIPPED = [
    "tools/bench/bench_gpu_vision.py",
    "tools/bench/bench_checkpoint.py",
    "tools/bench/deepseek_v32_configs.py",
    "tools/checkpoints/__init__.py",
    "tools/checkpoints/common.py",
    "tools/checkpoints/demo.py",
    "tools/checkpoints/glm5_next.py",
    "runtime/images.py",
    "runtime/image_prompt.py",
]
# the tower's fields a checkpoint takes from transformers' Glm5NextVisionConfig (release) or from
# the tiny test tower
_TOWER_FIELDS = (
    "depth",
    "hidden_size",
    "num_heads",
    "intermediate_size",
    "projection_intermediate_size",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "in_channels",
    "swiglu_limit",
)


def raw_config(config: str) -> tuple[dict, list]:
    """config.json and the tensor list (bench_checkpoint._tensors) of the benchmark checkpoint."""
    import transformers

    from day0.tools.bench.bench_checkpoint import _tensors
    from day0.tools.checkpoints.glm5_next import TINY_VISION_TOWER, tiny_glm5_next_config

    if SETTINGS[config]["tower"] == "release":
        release = transformers.Glm5NextVisionConfig().to_dict()
        cfg = tiny_glm5_next_config(vision={k: release[k] for k in _TOWER_FIELDS}, hidden_size=4096)
    else:
        cfg = tiny_glm5_next_config(vision=dict(TINY_VISION_TOWER))
    raw = cfg.to_dict()
    raw.pop("transformers_version", None)
    raw["architectures"] = ["Glm5NextForConditionalGeneration"]
    return raw, _tensors(raw)


def write_checkpoint(path: Path, config: str, seed: int) -> Path:
    """The seeded checkpoint and its image processor settings (transformers' processor with the
    tower's patch sizes), the same bytes on every machine."""
    import transformers

    from day0.tools.bench import bench_checkpoint

    raw, tensors = raw_config(config)
    path = bench_checkpoint.write(path, f"vision-{config}", seed, spec=(raw, tensors))
    v = raw["vision_config"]
    transformers.Glm5NextImageProcessorPil(
        patch_size=v["patch_size"], temporal_patch_size=v["temporal_patch_size"], merge_size=v["spatial_merge_size"]
    ).save_pretrained(path)
    return path


def image_png(side: int, seed: int = SEED) -> bytes:
    """A side×side RGB PNG of smooth random colour fields (deterministic)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng([seed, side])
    coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((side, side), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def image_tokens(side: int, ckpt: Path) -> int:
    from day0.runtime.images import ImageConfig, image_grid

    cfg = ImageConfig.from_file(ckpt)
    t, h, w = image_grid(side, side, cfg)
    return t * h * w // cfg.merge_size**2


def variants(target: str) -> list[int]:
    """The image_terms of the extra artifacts (artifact-terms<N>): two where the target's tower
    runs fewer (the pass's knob), none elsewhere."""
    from day0.lowering.targets import get_target

    t = get_target(target)
    runs = any(role == "vision" for role, _ in t.passes)  # the tower's attention on day0's kernel
    return [2] if runs and t.image_terms < 2 else []


def package(out: Path, config: str, target: str, cache: Path) -> dict:
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.lowering.targets import get_target
    from day0.tools.bench import bench_e2e

    s = SETTINGS[config]
    ckpt = write_checkpoint(cache / f"ckpt-vision-{config}-{SEED}", config, SEED)
    tokens = [image_tokens(side, ckpt) for side in s["sides"]]
    extra = variants(target)
    for terms in [None, *extra]:
        art = out / "vision" / ("artifact" if terms is None else f"artifact-terms{terms}")
        if art.exists():
            shutil.rmtree(art)
        options = BuildOptions(
            target=target, max_seq_len=s["max_seq_len"], image_buckets=tuple(sorted(set(tokens))), image_terms=terms
        )
        compile_checkpoint(ckpt, art, options)
    bench_e2e.ship_sources(out, SHIPPED)
    terms = get_target(target).image_terms
    return {"config": config, "seed": SEED, **s, "image_tokens": tokens, "image_terms": terms, "variants": extra}


def _timed(fn, repeats: int, sync, warmup: bool = True) -> float:
    """Median wall seconds of fn() then sync() (timing.median_seconds)."""
    from day0.tools.bench.timing import median_seconds

    return median_seconds(lambda: (fn(), sync()), repeats, warmup)


def run(pkg: Path, spec_all: dict, device: str) -> dict:
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    from day0.runtime.images import ImageConfig, preprocess
    from day0.runtime.session import Session

    spec, root = spec_all["vision"], pkg / "vision"
    dev = "cuda" if device.startswith("cuda") else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    ckpt = write_checkpoint(pkg / f"ckpt-vision-{spec['config']}-{spec['seed']}", spec["config"], spec["seed"])
    names = ["artifact", *(f"artifact-terms{t}" for t in spec.get("variants", []))]
    sessions = {n: Session.load(root / n, device=device, verify=False, checkpoint_dir=ckpt) for n in names}
    session = sessions["artifact"]
    cfg = ImageConfig.from_file(ckpt)
    cls = transformers.Glm5NextForConditionalGeneration
    # the float32 reference in float32: cuDNN runs the patch embedding's Conv3d in TF32 by default
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    reference = cls.from_pretrained(ckpt, dtype=torch.float32).to(dev).eval()
    rows, inputs = [], {}
    with torch.no_grad():
        for side in spec["sides"]:
            png = image_png(side)
            pixels, grid = preprocess([Image.open(io.BytesIO(png)).convert("RGB")], cfg)
            inputs[side] = (png, pixels, grid)
            want = reference.model.visual(torch.from_numpy(pixels).to(dev), grid_thw=torch.from_numpy(grid).to(dev))
            want = want.pooler_output.float().cpu().numpy()
            row = {"side_px": side, "patches": int(pixels.shape[0])}
            for name, sess in sessions.items():
                got = sess.encode_pixels(pixels, grid)  # also the warm-up
                ms = _timed(lambda s=sess, p=pixels, g=grid: s.encode_pixels(p, g), spec["repeats"], sync, False)
                check = float(np.abs(got - want).max() / np.abs(want).max())
                if name == "artifact":
                    row.update(image_tokens=int(got.shape[0]), day0_ms=ms * 1e3, check=check)
                else:
                    row[name] = {"day0_ms": ms * 1e3, "check": check}
            rows.append(row)
    del reference
    torch.backends.cudnn.allow_tf32 = True  # torch's default again, for the timed bf16 runs
    if dev == "cuda":
        torch.cuda.empty_cache()
    token = session.vision.image_token_id
    ids = [*range(5, 5 + TEXT), token, *range(5 + TEXT, 5 + 2 * TEXT)]
    first = spec["sides"][0]
    png = inputs[first][0]

    def day0_ttft():
        session.reset()
        session.prefill_greedy(ids, images=[png])

    ttft = {"side_px": first, "day0_ms": _timed(day0_ttft, spec["repeats"], sync) * 1e3}
    processor = transformers.Glm5NextImageProcessorPil.from_pretrained(ckpt)
    expanded = torch.tensor(session.image_prompt(ids, [png]), device=dev)[None]
    for attn in ("eager", "sdpa"):
        model = cls.from_pretrained(ckpt, dtype=torch.bfloat16, attn_implementation=attn).to(dev).eval()
        with torch.no_grad():
            for row in rows:
                _, pixels, grid = inputs[row["side_px"]]
                pv, g = torch.from_numpy(pixels).to(dev, torch.bfloat16), torch.from_numpy(grid).to(dev)
                row[f"transformers_{attn}_ms"] = (
                    _timed(lambda pv=pv, g=g, m=model: m.model.visual(pv, grid_thw=g), spec["repeats"], sync) * 1e3
                )
            if attn == "sdpa":

                def theirs_ttft(m=model):
                    out = processor(images=[Image.open(io.BytesIO(png)).convert("RGB")], return_tensors="pt")
                    pv = out["pixel_values"].to(dev, torch.bfloat16)
                    logits = m(expanded, pixel_values=pv, image_grid_thw=out["image_grid_thw"].to(dev), use_cache=False)
                    return int(logits.logits[0, -1].argmax())

                ttft["transformers_sdpa_ms"] = _timed(theirs_ttft, spec["repeats"], sync) * 1e3
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
    terms = {"image_terms": spec.get("image_terms"), "variants": spec.get("variants", [])}
    return {"piece": "vision", "config": spec["config"], **terms, "rows": rows, "ttft": ttft}


def table(r: dict) -> str:
    terms = f" at {r['image_terms']} term(s)" if r.get("image_terms") else ""
    lines = [
        f"vision tower ({r['config']} shapes): encode ms, day0{terms} vs transformers bf16 (eager, sdpa); "
        "check: features vs transformers f32",
        f"{'image':>8}{'patches':>9}{'tokens':>8}{'day0':>9}{'eager':>9}{'sdpa':>9}{'eager/day0':>12}{'check':>10}",
    ]
    for row in r["rows"]:
        lines.append(
            f"{row['side_px']:>6}px{row['patches']:>9}{row['image_tokens']:>8}{row['day0_ms']:>9.2f}"
            f"{row['transformers_eager_ms']:>9.2f}{row['transformers_sdpa_ms']:>9.2f}"
            f"{row['transformers_eager_ms'] / row['day0_ms']:>12.2f}{row['check']:>10.2e}"
        )
    for n in r.get("variants", []):
        for row in r["rows"]:
            v = row[f"artifact-terms{n}"]
            lines.append(
                f"  {n} terms: {row['side_px']}px day0 {v['day0_ms']:.2f} ms, eager/day0 "
                f"{row['transformers_eager_ms'] / v['day0_ms']:.2f}, check {v['check']:.2e}"
            )
    t = r["ttft"]
    lines.append(
        f"time to first token, one {t['side_px']}px image + {2 * TEXT} text tokens: day0 {t['day0_ms']:.2f} ms, "
        f"transformers sdpa {t['transformers_sdpa_ms']:.2f} ms"
    )
    return "\n".join(lines)
