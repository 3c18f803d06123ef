"""day0-opt: run day0's Python passes on an .mlir file, the way mlir-opt runs C++ ones.

    day0-opt FILE.mlir --pass-pipeline='builtin.module(dsa-to-gather-tiles{tile=64})' [-o OUT]
             [--split-input-file] [--verify-diagnostics] [--mlir-print-op-generic]

`--split-input-file` processes each `// -----` chunk as its own module (line numbers stay those
of FILE). `--verify-diagnostics` checks the errors against `// expected-error @+N {{text}}`
annotations like mlir-opt: every expected error must be emitted at its line (the text is a
substring of the message), no other error may be; exit code 0 iff all match.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass

from day0.frontend.ir import ir, new_context
from day0.passes.base import Diagnostic, PassError, PipelineError, file_position
from day0.passes.pipeline import parse_pipeline, run_pipeline
from day0.runtime.files import utf8_problem

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.MULTILINE)
EXPECTED = re.compile(r"expected-(error|warning|note|remark)\s*(?:@(above|below|[+-]\d+))?\s*\{\{(.*?)\}\}")


@dataclass
class Expected:
    severity: str
    line: int  # 1-based line in FILE the diagnostic must point at
    text: str
    annotation_line: int
    seen: bool = False


def split_chunks(text: str, split: bool) -> list[tuple[int, str]]:
    """[(first line number - 1, chunk text padded with newlines so line numbers match FILE)]."""
    if not split:
        return [(0, text)]
    chunks, start = [], 0
    for m in SPLIT_MARKER.finditer(text):
        chunks.append(text[start : m.start()])
        start = m.end()
    chunks.append(text[start:])
    out, offset = [], 0
    for chunk in chunks:
        out.append((offset, "\n" * offset + chunk))
        offset += chunk.count("\n")
    return out


def expected_diagnostics(chunk: str) -> list[Expected]:
    found = []
    for lineno, line in enumerate(chunk.splitlines(), start=1):
        for m in EXPECTED.finditer(line):
            where = m.group(2)
            if where is None:
                target = lineno
            elif where == "above":
                target = lineno - 1
            elif where == "below":
                target = lineno + 1
            else:
                target = lineno + int(where)
            found.append(Expected(m.group(1), target, m.group(3), lineno))
    return found


def _mlir_error_diagnostics(e: Exception) -> list[Diagnostic]:
    diags = []
    for info in getattr(e, "error_diagnostics", []) or []:
        pos = file_position(info.location)
        diags.append(Diagnostic(info.message, *pos) if pos else Diagnostic(f"{info.message} ({info.location})"))
    return diags or [Diagnostic(str(e))]


def wrap_in_module(chunk: str) -> str:
    """Give top-level ops an explicit `module {}` as mlir-opt's implicit module does.

    `Operation.parse` (the parser entry that takes a file name for locations) wants one top-level
    op. `module {` goes at the end of the chunk's last padding line, so no line number moves.
    """
    code = re.sub(r"//[^\n]*", "", chunk)
    if re.match(r"\s*module\b", code):
        return chunk
    head = len(chunk) - len(chunk.lstrip("\n"))
    if head:
        return chunk[: head - 1] + "module {\n" + chunk[head:] + "\n}\n"
    return "module {" + chunk + "\n}\n"


def process_chunk(chunk: str, filename: str, passes, generic: bool) -> tuple[str | None, list[Diagnostic]]:
    """Parse, run the passes, verify: (printed module or None, errors)."""
    ctx = new_context()
    with ctx, ir.Location.unknown():
        try:
            module = ir.Operation.parse(wrap_in_module(chunk), source_name=filename)
        except ir.MLIRError as e:
            return None, _mlir_error_diagnostics(e)
        try:
            run_pipeline(module, passes)
        except PassError as e:
            return None, e.diagnostics
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            return None, _mlir_error_diagnostics(e)
        return module.operation.get_asm(print_generic_op_form=generic, assume_verified=True), []


def verify(diags: list[Diagnostic], expected: list[Expected], filename: str) -> list[str]:
    """mlir-opt's -verify-diagnostics: the messages describing every mismatch (empty = pass)."""
    problems = []
    for d in diags:
        match = next(
            (
                x
                for x in expected
                if not x.seen and x.severity == d.severity and x.line == d.line and x.text in d.message
            ),
            None,
        )
        if match is None:
            problems.append(f"{d}\n  (unexpected {d.severity})")
        else:
            match.seen = True
    for x in expected:
        if not x.seen:
            problems.append(
                f'{filename}:{x.annotation_line}: error: expected {x.severity} "{x.text}" '
                f"was not produced (at line {x.line})"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="day0-opt", description=__doc__.split("\n")[0])
    ap.add_argument("input", nargs="?", default="-", help="input .mlir file ('-' = stdin)")
    ap.add_argument("--pass-pipeline", default="", help="e.g. 'builtin.module(dsa-to-gather-tiles{tile=64})'")
    ap.add_argument("-o", dest="output", default="-", help="output file ('-' = stdout)")
    ap.add_argument("--split-input-file", action="store_true", help="process each '// -----' chunk separately")
    ap.add_argument("--verify-diagnostics", action="store_true", help="check expected-error annotations")
    ap.add_argument("--mlir-print-op-generic", action="store_true", help="print ops in generic form")
    args = ap.parse_args(argv)

    try:
        passes = parse_pipeline(args.pass_pipeline) if args.pass_pipeline.strip() else []
    except PipelineError as e:
        print(f"day0-opt: {e}", file=sys.stderr)
        return 2
    filename = "<stdin>" if args.input == "-" else args.input
    try:
        text = read_input(args.input)
    except InputError as e:
        print(f"day0-opt: {e}", file=sys.stderr)
        return 2

    outputs, failed = [], False
    for _, chunk in split_chunks(text, args.split_input_file):
        printed, diags = process_chunk(chunk, filename, passes, args.mlir_print_op_generic)
        if printed is not None:
            outputs.append(printed)
        if args.verify_diagnostics:
            problems = verify(diags, expected_diagnostics(chunk), filename)
            for p in problems:
                print(p, file=sys.stderr)
            failed |= bool(problems)
        else:
            for d in diags:
                print(d, file=sys.stderr)
            failed |= bool(diags)

    result = "// -----\n".join(outputs)
    try:
        if args.output == "-":
            sys.stdout.write(result)
            sys.stdout.flush()
        else:
            with open(args.output, "w") as f:
                f.write(result)
    except BrokenPipeError:  # `day0-opt F | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1 if failed else 0
    except OSError as e:
        print(f"day0-opt: cannot write {args.output}: {e.strerror}", file=sys.stderr)
        return 2
    return 1 if failed else 0


class InputError(ValueError):
    pass


def read_input(path: str) -> str:
    """The text of `path` ('-': stdin): UTF-8 MLIR, or an InputError naming the file in one line."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise InputError(f"cannot read {name}: {e.strerror}") from None
    problem = utf8_problem(data)
    if problem:
        raise InputError(f"{name} {problem}: not an MLIR file")
    text = data.decode("utf-8")
    if "\0" in text:
        raise InputError(f"{name} holds a NUL byte (offset {text.index(chr(0))}): not an MLIR file")
    return text


if __name__ == "__main__":
    sys.exit(main())
