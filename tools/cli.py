"""The `day0` command line: compile, generate, inspect, quantize, demo.

Errors the user can fix (bad checkpoint, config, artifact, arguments) print one line naming the
problem and exit with status 2; only bugs produce tracebacks.
"""

import argparse
import json
import sys
from pathlib import Path


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
    )


def cmd_compile(a) -> int:
    from day0.lowering.driver import BuildOptions, compile_checkpoint

    opts = BuildOptions(
        target=a.target,
        max_seq_len=a.max_seq_len,
        dump_stages=a.dump_stages,
        extra_flags=tuple(a.iree_flags),
        prefill_chunk=a.prefill_chunk,
        cache_dtype=a.cache_dtype,
    )
    manifest = compile_checkpoint(Path(a.checkpoint), Path(a.output), opts)
    print(f"wrote {a.output} ({manifest.architecture}, target {manifest.target}, max_seq_len {manifest.max_seq_len})")
    return 0


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers (got {text!r})") from None


def cmd_generate(a) -> int:
    from day0.runtime.session import Session
    from day0.runtime.tokenizer import TokenizerError, load_tokenizer

    session = Session.load(Path(a.artifact), device=a.device)
    tokenizer = load_tokenizer(Path(a.artifact))
    if a.prompt is not None:
        if tokenizer is None:
            raise TokenizerError(f"{a.artifact} has no tokenizer.json (its checkpoint had none): use --prompt-ids")
        ids = tokenizer.encode(a.prompt)
    else:
        ids = _parse_ids(a.prompt_ids)
    new = session.generate(
        ids, max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed
    )
    if tokenizer is not None and a.prompt is not None:
        print(a.prompt + tokenizer.decode(new))
    else:
        print(",".join(str(t) for t in new))
    return 0


def cmd_inspect(a) -> int:
    from day0.runtime.artifact import read_manifest
    from day0.tools.artifact_summary import summary_json, summary_text

    m = read_manifest(Path(a.artifact), verify=not a.no_verify)
    print(json.dumps(summary_json(m), indent=2) if a.json else summary_text(Path(a.artifact), m))
    return 0


def cmd_demo(a) -> int:
    """Create the built-in demo checkpoint (seeded), compile it, generate from a text prompt."""
    from day0.lowering.driver import BuildOptions, compile_checkpoint
    from day0.runtime.session import Session
    from day0.runtime.tokenizer import load_tokenizer
    from day0.tools.checkpoints.demo import ensure_demo_checkpoint

    work = Path(a.workdir)
    ckpt = ensure_demo_checkpoint(work / "checkpoint")
    artifact = work / "artifact"
    print(f"checkpoint: {ckpt}")
    compile_checkpoint(ckpt, artifact, BuildOptions(max_seq_len=256))
    session = Session.load(artifact)
    tok = load_tokenizer(artifact)
    prompt = "Day-0 adaptation: "
    new = session.generate(tok.encode(prompt), max_new_tokens=24, temperature=0.0, stop_at_eos=False)
    print(f"artifact: {artifact}\nprompt ids: {tok.encode(prompt)}\ngenerated ids: {new}")
    print(f"text: {prompt + tok.decode(new)!r}")
    return 0


def cmd_quantize(a) -> int:
    from day0.models.quantize import quantize_checkpoint

    dst = quantize_checkpoint(Path(a.checkpoint), Path(a.output), a.layout)
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    print(f"wrote {dst} (routed experts in MXFP4, quant_method {qc['quant_method']})")
    return 0


def parser() -> argparse.ArgumentParser:
    from day0.lowering.driver import DEFAULT_MAX_SEQ_LEN
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
    c.add_argument("--max-seq-len", type=int, default=DEFAULT_MAX_SEQ_LEN)
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
    # extra iree-compile flags come after `--` (split off in main: argparse would give the
    # empty-matching positional nothing once the checkpoint is read, then reject the flags)
    c.set_defaults(iree_flags=[])
    c.set_defaults(run=cmd_compile)

    g = sub.add_parser("generate", help="generate tokens with a compiled artifact")
    g.add_argument("artifact")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-ids")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument(
        "--device",
        default=None,
        help="runtime device (local-task, local-sync, cuda); default: the artifact's (its target's first)",
    )
    g.set_defaults(run=cmd_generate)

    i = sub.add_parser("inspect", help="describe an artifact: model, parameters, target, entry points, state")
    i.add_argument("artifact")
    i.add_argument("--no-verify", action="store_true", help="skip the hash checks")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return args.run(args)
    except _user_errors() as e:
        print(f"day0: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
