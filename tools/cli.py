"""The `day0` command line: compile, generate, inspect, quantize, demo, serve.

Errors the user can fix (bad checkpoint, config, artifact, arguments) print one line naming the
problem and exit with status 2; only bugs produce tracebacks. SIGTERM and SIGHUP stop a command as
Ctrl-C does (the compile driver removes its staging directory, iree-compile is killed) and exit
with 128 + the signal; output into a closed pipe (`day0 inspect ART | head -1`) ends quietly.
"""

import argparse
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path

from day0.runtime.memory_plan import size_arg

# --prompt-ids: token ids separated by commas and/or whitespace ("1,2,3", "1, 2, 3", "1 2 3")
_ID_SEPARATOR = re.compile(r"\s*,\s*|\s+")
_ID = re.compile(r"[0-9]+")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C (every `finally` runs, subprocess.run kills its child)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _user_errors() -> tuple[type[BaseException], ...]:
    from day0.lowering.compile import CompileError
    from day0.lowering.driver import BuildError
    from day0.models.checkpoint import CheckpointError
    from day0.models.config import ConfigError
    from day0.models.mxfp4 import Mxfp4Error
    from day0.passes.base import PassError
    from day0.runtime.artifact import ArtifactError
    from day0.runtime.session import SessionError
    from day0.runtime.tokenizer import TokenizerError
    from day0.runtime.vm import VmError

    return (
        BuildError,
        CompileError,
        CheckpointError,
        ConfigError,
        PassError,
        ArtifactError,
        SessionError,
        TokenizerError,
        Mxfp4Error,
        VmError,
        ValueError,
        OSError,
    )


def _message(e: BaseException) -> str:
    """One line: OSErrors as `path: reason`, the rest as their text with newlines folded."""
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror}" + (f" (-> {e.filename2})" if e.filename2 else "")
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def cmd_compile(a) -> int:
    from day0.lowering.driver import BuildOptions, compile_checkpoint

    opts = BuildOptions(
        target=a.target,
        max_seq_len=a.max_seq_len,
        dump_stages=a.dump_stages,
        extra_flags=tuple(a.iree_flags),
        prefill_chunk=a.prefill_chunk,
        max_batch=a.max_batch,
        block_size=a.block_size,
        devices=a.devices,
        cache_dtype=a.cache_dtype,
        image_buckets=a.image_buckets,
        matmul_terms=a.matmul_terms,
        image_terms=a.image_terms,
    )
    manifest = compile_checkpoint(Path(a.checkpoint), Path(a.output), opts)
    print(f"wrote {a.output} ({manifest.architecture}, target {manifest.target}, max_seq_len {manifest.max_seq_len})")
    return 0


def _token_counts(text: str) -> tuple[int, ...]:
    """'64,256' -> (64, 256): positive integers separated by commas (argparse reports the error)."""
    try:
        counts = tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected image-token counts separated by commas, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive image-token counts, got {text!r}")
    return counts


class ArgumentError(ValueError):
    pass


def parse_ids(text: str, vocab_size: int | None = None) -> list[int]:
    """--prompt-ids: decimal token ids separated by commas and/or whitespace, at least one, each in
    [0, vocab_size); anything else an ArgumentError naming the argument."""
    pieces = _ID_SEPARATOR.split(text.strip())
    if pieces == [""]:
        raise ArgumentError("--prompt-ids is empty: give at least one token id")
    for t in pieces:
        if not _ID.fullmatch(t):
            why = "token ids are >= 0" if re.fullmatch(r"-[0-9]+", t) else "not a decimal integer"
            raise ArgumentError(
                f"--prompt-ids: {t[:40]!r} is not a token id ({why}); give integers separated by "
                f"commas or spaces, e.g. 1,2,3"
            )
    ids = [int(t) for t in pieces]
    if vocab_size is not None:
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            shown = str(bad) if len(str(bad)) <= 24 else f"{str(bad)[:20]}... ({len(str(bad))} digits)"
            raise ArgumentError(f"--prompt-ids: token id {shown} is outside the vocabulary [0, {vocab_size})")
    return ids


def _check_generate_args(a) -> None:
    """The numbers of `generate` that the session does not check itself (it names no argument)."""
    if a.seed is not None and a.seed < 0:
        raise ArgumentError(f"--seed must be >= 0 (got {a.seed})")
    if a.max_new_tokens < 1:
        raise ArgumentError(f"--max-new-tokens must be >= 1 (got {a.max_new_tokens})")
    if a.prompt is not None and not a.prompt:
        raise ArgumentError("--prompt is empty: give some text, or --prompt-ids")


def _moved_hint(e, a) -> str:
    """A WeightsError's message, with where the weights were looked for or how to say where they are."""
    if a.checkpoint_dir is not None:
        return f"{e} (looked in --checkpoint-dir {a.checkpoint_dir})"
    if e.missing:
        return f"{e} (if the checkpoint moved, pass its directory with --checkpoint-dir)"
    return str(e)


def cmd_generate(a) -> int:
    from day0.runtime.tokenizer import TokenizerError, load_tokenizer

    _check_generate_args(a)
    if a.prompt_ids is not None:
        parse_ids(a.prompt_ids)  # its format checked before loading anything
    manifest, vm = _open(a)
    tokenizer = load_tokenizer(Path(a.artifact))
    if a.prompt is not None:
        if tokenizer is None:
            raise TokenizerError(f"{a.artifact} has no tokenizer.json (its checkpoint had none): use --prompt-ids")
        ids = tokenizer.encode(a.prompt)
        if not ids:
            raise ArgumentError(f"--prompt {a.prompt[:40]!r} encodes to no tokens")
    else:
        ids = parse_ids(a.prompt_ids, manifest.vocab_size)
    images = None
    if a.image:
        images, ids = list(a.image), _image_placeholders(manifest, ids, len(a.image))
    sampling = dict(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed, images=images)
    if _paged_generate(manifest, images):
        new = _generate_paged(a, manifest, vm, ids, sampling)
    else:
        from day0.runtime.session import Session

        new = Session(Path(a.artifact), manifest, vm).generate(ids, max_new_tokens=a.max_new_tokens, **sampling)
    if tokenizer is not None and a.prompt is not None:
        print(a.prompt + tokenizer.decode(new))
    else:
        print(",".join(str(t) for t in new))
    return 0


def _open(a):
    """open_artifact, whose missing-weights error says how to point at a moved checkpoint."""
    from day0.runtime.artifact import ArtifactError, WeightsError
    from day0.runtime.loading import open_artifact

    try:
        return open_artifact(Path(a.artifact), a.device, True, a.checkpoint_dir)
    except WeightsError as e:
        raise ArtifactError(_moved_hint(e, a)) from None


def _paged_generate(manifest, images) -> bool:
    """Whether `generate` runs through the Engine: an artifact with paged entry points (and the
    paged image step, for images). Its pool then holds this request's blocks only, where
    Session's dense state is max_seq_len rows, all read by every decode step (docs/perf.md,
    'Long context on the CPU')."""
    from day0.runtime.artifact import PAGED_IMAGE_PREFILL

    return manifest.paged is not None and (not images or PAGED_IMAGE_PREFILL in manifest.entry_points)


def _generate_paged(a, manifest, vm, ids: list[int], sampling: dict) -> list[int]:
    """One request through an Engine whose pool is sized to it: the prompt (each image counted
    at the tower's largest image) and the new tokens, at most max_seq_len, and the scratch block."""
    from day0.runtime.blocks import blocks_for
    from day0.runtime.engine import Engine

    paged, v = manifest.paged, manifest.vision
    n = len(ids) + a.max_new_tokens - 1
    if sampling["images"]:
        n += len(sampling["images"]) * (v.max_patches // v.merge_size**2 - 1)
    blocks = blocks_for(min(n, manifest.max_seq_len), paged.block_size) + 1  # and the scratch block
    engine = Engine(manifest, vm, blocks, None, None, max_running=1, artifact_dir=Path(a.artifact))
    rid = engine.add(ids, max_new_tokens=a.max_new_tokens, **sampling)
    new: list[int] = []
    while engine.has_work():
        progress = engine.step().get(rid)
        new += progress.tokens if progress else []
    return new


def _image_placeholders(manifest, ids: list[int], images: int) -> list[int]:
    """ids with a placeholder for each --image: the prompt's own (`<|image|>` in --prompt, the
    image_token_id in --prompt-ids), else one per image before the prompt."""
    if manifest.vision is None:
        raise ArgumentError(
            f"--image: this artifact ({manifest.architecture}) has no vision tower; compile a checkpoint "
            f"with a vision_config to give images"
        )
    if manifest.vision.image_token_id in ids:
        return ids  # the Session or Engine checks that they are the images in number
    return [manifest.vision.image_token_id] * images + list(ids)


def cmd_inspect(a) -> int:
    from day0.runtime.artifact import ArtifactError, WeightsError, read_manifest
    from day0.tools.artifact_summary import summary_json, summary_text

    try:
        m = read_manifest(Path(a.artifact), verify=not a.no_verify, checkpoint_dir=a.checkpoint_dir)
    except WeightsError as e:
        raise ArtifactError(_moved_hint(e, a)) from None
    if a.memory is not None and m.paged is None:
        raise ArtifactError(f"--memory: {a.artifact} has no paged state (compile it with --max-batch)")
    print(json.dumps(summary_json(m, a.memory), indent=2) if a.json else summary_text(Path(a.artifact), m, a.memory))
    return 0


def cmd_demo(a) -> int:
    """Compile the default model (tools/checkpoints/default.py: trained on the standard library's
    docstrings) and continue a few prompts with it, greedily."""
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.runtime.session import Session
    from day0.runtime.tokenizer import load_tokenizer
    from day0.tools.checkpoints.default import default_checkpoint

    work = Path(a.workdir)
    ckpt = default_checkpoint()
    artifact = work / "artifact"
    print(f"checkpoint: {ckpt}")
    compile_checkpoint(ckpt, artifact, BuildOptions(max_seq_len=256))
    session = Session.load(artifact)
    tok = load_tokenizer(artifact)
    print(f"artifact: {artifact}")
    for prompt in DEMO_PROMPTS:
        session.reset()
        new = session.generate(tok.encode(prompt), max_new_tokens=32, temperature=0.0, stop_at_eos=True)
        print(f"\n{prompt}{tok.decode(new)}")
    return 0


DEMO_PROMPTS = ("Return the number of", "This module provides", "If the file does not exist,")


def cmd_serve(a) -> int:
    """Serve an artifact compiled with --max-batch over OpenAI's HTTP API (tools/serve/)."""
    from day0.tools.serve.server import serve_from_args

    serve_from_args(a)
    return 0


def cmd_quantize(a) -> int:
    from day0.models.quantize import quantize_checkpoint

    dst = quantize_checkpoint(Path(a.checkpoint), Path(a.output), a.layout)
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    print(f"wrote {dst} (routed experts in MXFP4, quant_method {qc['quant_method']})")
    return 0


_CHECKPOINT_DIR_HELP = (
    "the checkpoint's directory, when it is no longer where it was compiled from (its shards are "
    "checked against the sizes and hashes recorded at compile time)"
)


def parser() -> argparse.ArgumentParser:
    from day0.lowering.driver import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_SEQ_LEN, MAX_MAX_SEQ_LEN, MIN_MAX_SEQ_LEN
    from day0.lowering.targets import TARGETS
    from day0.models.base import CACHE_DTYPES

    p = argparse.ArgumentParser(prog="day0", description="Day-0 adaptation: checkpoint in, compiled artifact out.")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser(
        "compile",
        help="compile a checkpoint directory into an artifact directory",
        usage="day0 compile CHECKPOINT -o OUTPUT [options] [-- IREE_COMPILE_FLAGS ...]",
    )
    c.add_argument("checkpoint")
    c.add_argument("-o", "--output", required=True)
    c.add_argument(
        "--target",
        default="llvm-cpu",
        choices=list(TARGETS),
        help="; ".join(f"{t.name}: {t.description}" for t in TARGETS.values()),
    )
    c.add_argument(
        "--max-seq-len",
        type=int,
        default=DEFAULT_MAX_SEQ_LEN,
        help=f"longest sequence (prompt + generated) the artifact serves, {MIN_MAX_SEQ_LEN}..{MAX_MAX_SEQ_LEN}",
    )
    c.add_argument("--dump-stages", action="store_true", help="write the IR after each stage to OUTPUT/stages/")
    c.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="static prefill length prompts run in (default: the target's; 0: none)",
    )
    c.add_argument(
        "--cache-dtype",
        default=None,
        choices=list(CACHE_DTYPES),
        help="dtype of the latent / indexer caches (bfloat16: deepseek_v32); default: the "
        "target's for models that support bf16 caches, else float32",
    )
    c.add_argument(
        "--matmul-terms",
        type=int,
        default=None,
        choices=(2, 3),
        help="cuda-sm90: bf16 terms per f32 activation in prefill matmuls against bf16 weights "
        "(3: f32 accuracy; 2, the default: a third fewer tensor-core products, 2^-18 relative error)",
    )
    c.add_argument(
        "--image-terms",
        type=int,
        default=None,
        choices=(1, 2, 3),
        help="cuda-sm90: the same for the vision tower's matmuls and attention (1, the default: bf16 "
        "products and a bf16 flash attention, as a bf16 tower computes; 2: ~2^-16 relative error; "
        "the attention takes at most 2)",
    )
    c.add_argument(
        "--max-batch",
        type=int,
        default=0,
        help="also compile the paged entry points of the batched Engine, decode steps for up to this "
        "many sequences (default 0: none)",
    )
    c.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="positions per paged cache block")
    c.add_argument(
        "--devices",
        type=int,
        default=1,
        help="split the model over this many devices: each holds and reads its share of the routed "
        "experts (MXFP4), device 0 the rest (llvm-cpu: N local devices; default 1)",
    )
    c.add_argument(
        "--image-buckets",
        type=_token_counts,
        default=(),
        help="image-token counts to compile the vision tower at, e.g. 64,256,1024 (an image runs at the "
        "first one holding it, padded; the largest allowed is always added); default: 2^k and "
        "3*2^(k-1) up to the image processor's max_image_tokens",
    )
    # extra iree-compile flags come after `--` (split off in main: argparse would give the
    # empty-matching positional nothing once the checkpoint is read, then reject the flags)
    c.set_defaults(iree_flags=[])
    c.set_defaults(run=cmd_compile)

    g = sub.add_parser("generate", help="generate tokens with a compiled artifact")
    g.add_argument("artifact")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-ids", help="token ids separated by commas or spaces, e.g. 1,2,3")
    g.add_argument(
        "--image",
        action="append",
        metavar="PATH",
        help="an image file (PNG, JPEG, ...; repeat for several) for an artifact with a vision tower: each goes "
        "at an <|image|> of the prompt, in order, or before the prompt when it has none",
    )
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None, help="sampling seed (>= 0); default: from the OS")
    g.add_argument(
        "--device",
        default=None,
        help="runtime device (local-task, local-sync, cuda); default: the artifact's (its target's first)",
    )
    g.add_argument("--checkpoint-dir", default=None, help=_CHECKPOINT_DIR_HELP)
    g.set_defaults(run=cmd_generate)

    i = sub.add_parser("inspect", help="describe an artifact: model, parameters, target, entry points, state")
    i.add_argument("artifact")
    i.add_argument("--no-verify", action="store_true", help="skip the hash checks")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.add_argument("--checkpoint-dir", default=None, help=_CHECKPOINT_DIR_HELP)
    i.add_argument(
        "--memory",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="device memory for the paged caches (80GiB, 141GB, bytes): how many sequences of each length "
        "and how long one context fit",
    )
    i.set_defaults(run=cmd_inspect)

    q = sub.add_parser("quantize", help="write a copy of a checkpoint with its routed experts in MXFP4")
    q.add_argument("checkpoint")
    q.add_argument("-o", "--output", required=True)
    q.add_argument(
        "--layout",
        choices=["gpt-oss", "compressed-tensors"],
        default=None,
        help="default: gpt-oss for gpt_oss checkpoints, compressed-tensors otherwise",
    )
    q.set_defaults(run=cmd_quantize)

    from day0.tools.serve.server import add_arguments

    v = sub.add_parser("serve", help="serve an artifact (compiled with --max-batch) over OpenAI's HTTP API")
    add_arguments(v, _CHECKPOINT_DIR_HELP)
    v.set_defaults(run=cmd_serve)

    d = sub.add_parser("demo", help="build the seeded demo model, compile it, generate")
    d.add_argument("--workdir", default=".cache/demo")
    d.set_defaults(run=cmd_demo)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """argv parsed; for `compile`, everything after the first `--` is iree-compile flags."""
    extra = []
    if argv[:1] == ["compile"] and "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = parser().parse_args(argv)
    if argv[:1] == ["compile"]:
        args.iree_flags = extra
    return args


def _terminate(signum, frame):
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    raise Terminated(signum)


def _silence_broken_pipe() -> None:
    """stdout/stderr went to a reader that has gone: point them at /dev/null, so that neither the
    rest of the output nor the interpreter's final flush raises again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    handled = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) == signal.SIG_DFL]
    try:
        for s in handled:
            signal.signal(s, _terminate)
    except ValueError:  # not the main thread (main() called from a library): leave signals alone
        handled = []
    try:
        try:
            rc = args.run(args)
            sys.stdout.flush()
            return rc
        except _user_errors() as e:
            if isinstance(e, BrokenPipeError):
                raise
            print(f"day0: error: {_message(e)}", file=sys.stderr)
            return 2
        except Terminated as e:
            print(f"day0: stopped by {signal.Signals(e.signum).name}", file=sys.stderr)
            return 128 + e.signum
        except KeyboardInterrupt:
            print("day0: interrupted", file=sys.stderr)
            return 128 + signal.SIGINT
    except BrokenPipeError:
        _silence_broken_pipe()
        return 128 + signal.SIGPIPE
    finally:
        for s in handled:
            signal.signal(s, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
