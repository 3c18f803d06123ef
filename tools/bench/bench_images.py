"""`make bench`, images part: the glm5_next vision path on this CPU, day0's compiled artifact vs
transformers eager (float32) on the same tiny checkpoint (tools/checkpoints/glm5_next.py,
vision=True: a 2-block tower, hidden 32), in one run:

    encode   one image through the vision tower (day0: Session.image_features, i.e. preprocess
             + encode_image; transformers: the processor's pixel values through model.visual)
    ttft     a prompt of 8 text tokens around one image, to the greedy first token (day0:
             Session.prefill_greedy with the image; transformers: one forward with pixel values)

at square images of 112, 224 and 336 px (16, 64 and 144 image tokens). The tiny tower says what
the host-side work and the compiled path cost, not what a real tower's FLOPs do (the H200
numbers with GLM-5.3-Flash's tower shapes are the issue's other half). Results: docs/perf.md,
"Images: the glm5_next vision path".
"""

import argparse
import io
import json
from pathlib import Path

import numpy as np
import torch

from day0.tools.bench.timing import median_seconds

SIZES = (112, 224, 336)
MAX_SEQ_LEN = 256
TEXT = 8


def _png(side: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def main(argv=None) -> int:
    from PIL import Image
    from transformers import Glm5NextForConditionalGeneration

    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.runtime.images import ImageConfig, preprocess
    from day0.runtime.session import Session
    from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

    p = argparse.ArgumentParser(prog="day0-bench-images")
    p.add_argument("--workdir", default=".cache/bench-images")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    work = Path(a.workdir)
    ckpt, art = work / "checkpoint", work / "artifact"
    if not (ckpt / "config.json").exists():
        write_tiny_glm5_next_checkpoint(ckpt, seed=3, vision=True, tokenizer=True)
    if not (art / "manifest.json").exists():
        compile_checkpoint(ckpt, art, BuildOptions(max_seq_len=MAX_SEQ_LEN))
    session = Session.load(art)
    model = Glm5NextForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    token = session.vision.image_token_id
    ids = [5, 6, 7, token, 8, 9, 10, 11, 12]  # TEXT text tokens around one placeholder
    rows = []
    for side in SIZES:
        data = _png(side)
        pixels, grid = preprocess([Image.open(io.BytesIO(data)).convert("RGB")], ImageConfig())
        pv, g = torch.from_numpy(pixels), torch.from_numpy(grid)
        expanded = torch.tensor(session.image_prompt(ids, [data]))[None]

        def day0_ttft():
            session.reset()
            session.prefill_greedy(ids, images=[data])

        with torch.no_grad():
            ours_encode = median_seconds(lambda: session.image_features([data]), a.repeats)  # noqa: B023
            theirs_encode = median_seconds(lambda: model.model.visual(pv, grid_thw=g), a.repeats)  # noqa: B023
            ours_ttft = median_seconds(day0_ttft, a.repeats)
            theirs_ttft = median_seconds(
                lambda: model(expanded, pixel_values=pv, image_grid_thw=g, use_cache=False),  # noqa: B023
                a.repeats,
            )
        rows.append(
            {
                "side_px": side,
                "image_tokens": int(expanded.shape[1]) - TEXT,
                "encode_ms": ours_encode * 1e3,
                "encode_ms_transformers": theirs_encode * 1e3,
                "ttft_ms": ours_ttft * 1e3,
                "ttft_ms_transformers": theirs_ttft * 1e3,
            }
        )
    print(f"\nglm5_next tiny vision (2 blocks, hidden 32), CPU local-task, median of {a.repeats}")
    print(f"{'image':>8}{'tokens':>8}{'encode ms':>11}{'(hf)':>9}{'x':>6}{'ttft ms':>10}{'(hf)':>9}{'x':>6}")
    for r in rows:
        print(
            f"{r['side_px']:>6}px{r['image_tokens']:>8}{r['encode_ms']:>11.2f}{r['encode_ms_transformers']:>9.2f}"
            f"{r['encode_ms_transformers'] / r['encode_ms']:>6.1f}{r['ttft_ms']:>10.2f}"
            f"{r['ttft_ms_transformers']:>9.2f}{r['ttft_ms_transformers'] / r['ttft_ms']:>6.1f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
