"""Parse and run pass pipelines written as MLIR writes them: `builtin.module(a{x=1 y=2},b)`.

Grammar (the subset day0 needs; every pass here is a module pass):
    pipeline := "builtin.module(" passes ")" | passes
    passes   := pass ("," pass)*
    pass     := NAME ("{" (KEY "=" VALUE)* "}")?
A VALUE is a bare word or a quoted string ("..." or '...').
"""

from __future__ import annotations

import re

from day0.frontend.ir import Module, Operation
from day0.passes.base import ModulePass, PipelineError
from day0.passes.registry import get_pass_class

_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_BARE_VALUE = re.compile(r"[^\s{}(),=\"']+")


class _Reader:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def accept(self, ch: str) -> bool:
        if self.peek() == ch:
            self.pos += 1
            return True
        return False

    def expect(self, ch: str) -> None:
        if not self.accept(ch):
            self.fail(f"expected '{ch}'")

    def match(self, pattern: re.Pattern, what: str) -> str:
        self.skip_space()
        m = pattern.match(self.text, self.pos)
        if not m:
            self.fail(f"expected {what}")
        self.pos = m.end()
        return m.group(0)

    def value(self) -> str:
        quote = self.peek()
        if quote in ("'", '"'):
            end = self.text.find(quote, self.pos + 1)
            if end < 0:
                self.fail("unterminated quoted option value")
            value = self.text[self.pos + 1 : end]
            self.pos = end + 1
            return value
        return self.match(_BARE_VALUE, "an option value")

    def fail(self, message: str) -> None:
        shown = self.text[: self.pos] + " <here> " + self.text[self.pos :]
        raise PipelineError(f"bad pass pipeline: {message} at column {self.pos + 1}: {shown}")


def _parse_pass(r: _Reader) -> ModulePass:
    name = r.match(_NAME, "a pass name")
    if r.peek() == "(":
        r.fail(f"nested pipeline '{name}(...)' is not supported (day0 passes are module passes)")
    options: dict[str, str] = {}
    if r.accept("{"):
        while not r.accept("}"):
            key = r.match(_NAME, "an option name")
            r.expect("=")
            if key in options:
                r.fail(f"option '{key}' given twice")
            options[key] = r.value()
    return get_pass_class(name).from_options(options)


def parse_pipeline(text: str) -> list[ModulePass]:
    """`builtin.module(a{x=1},b)` (or just `a{x=1},b`) -> the configured passes, in order."""
    r = _Reader(text)
    wrapped = False
    save = r.pos
    if r.peek() and _NAME.match(r.text, r.pos):
        head = r.match(_NAME, "a pass name")
        if head == "builtin.module" and r.accept("("):
            wrapped = True
        else:
            r.pos = save
    passes: list[ModulePass] = []
    if not (wrapped and r.peek() == ")"):
        passes.append(_parse_pass(r))
        while r.accept(","):
            passes.append(_parse_pass(r))
    if wrapped:
        r.expect(")")
    if r.peek():
        r.fail("unexpected text")
    return passes


def run_pipeline(module: Module | Operation, pipeline: str | list[ModulePass]) -> None:
    """Run the passes on `module` in place; the first pass that emits errors raises `PassError`."""
    passes = parse_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    for p in passes:
        p.run(module)
