"""The pass framework: a pass is a small frozen dataclass with a `name` and typed options.

    @dataclass(frozen=True)
    class MyPass(ModulePass):
        name = "my-pass"
        option_minimums = {"tile": 1}   # `my-pass{tile=0}` is refused
        tile: int = 64            # set as `my-pass{tile=32}`

        def apply(self, module_op, diag): ...

`apply` rewrites the `builtin.module` operation in place. Malformed input is reported through
`diag.error(op, message)` (the diagnostic points at the op's location); after `apply` returns,
collected errors are raised together as one `PassError`, the way a failing MLIR pass ends the
pipeline after emitting its diagnostics.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_type_hints

from day0.frontend.ir import Location, Module, Operation, StringAttr, ir

# ---------------------------------------------------------------------------------------------
# diagnostics


@dataclass(frozen=True)
class Diagnostic:
    """One error at a source position (`file:line:col` when the op has a file location)."""

    message: str
    filename: str | None = None
    line: int | None = None
    col: int | None = None
    severity: str = "error"

    def __str__(self) -> str:
        where = loc_string(self.filename, self.line, self.col)
        return f"{where}: {self.severity}: {self.message}" if where else f"{self.severity}: {self.message}"


def loc_string(filename: str | None, line: int | None, col: int | None) -> str:
    if filename is None:
        return ""
    return f"{filename}:{line}:{col}"


def file_position(loc: Location) -> tuple[str, int, int] | None:
    """The first file:line:col inside `loc` (through name, call-site and fused locations)."""
    if hasattr(loc, "start_line"):  # FileLineColLoc
        return loc.filename, loc.start_line, loc.start_col
    if hasattr(loc, "child_loc"):  # NameLoc
        return file_position(loc.child_loc)
    if hasattr(loc, "caller"):  # CallSiteLoc: the callee is where the op was written
        return file_position(loc.callee)
    for inner in getattr(loc, "locations", ()):  # FusedLoc
        pos = file_position(inner)
        if pos is not None:
            return pos
    return None


class PassError(Exception):
    """A pass found malformed input; `diagnostics` holds every error it emitted."""

    def __init__(self, pass_name: str, diagnostics: list[Diagnostic]):
        self.pass_name = pass_name
        self.diagnostics = diagnostics
        lines = "\n".join(str(d) for d in diagnostics)
        super().__init__(f"pass '{pass_name}' failed:\n{lines}")


class PipelineError(ValueError):
    """A pipeline string or pass option that cannot be parsed or does not name a known pass."""


@dataclass
class DiagnosticEngine:
    """Collects the errors a pass emits; each points at the op it concerns."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, op: Operation, message: str) -> None:
        op = getattr(op, "operation", op)
        pos = file_position(op.location)
        if pos is None:
            self.diagnostics.append(Diagnostic(f"{message} (at {op.location})"))
        else:
            self.diagnostics.append(Diagnostic(message, *pos))


# ---------------------------------------------------------------------------------------------
# passes


def _parse_bool(text: str) -> bool:
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise ValueError(f"expected true or false, got '{text}'")


_OPTION_PARSERS = {int: int, float: float, str: str, bool: _parse_bool}


@dataclass(frozen=True)
class ModulePass:
    """Base of every day0 pass. Subclasses are frozen dataclasses whose fields are the options."""

    name: ClassVar[str] = ""
    # option (field name) -> its least value, checked when the pass is built
    option_minimums: ClassVar[dict[str, int]] = {}

    def __post_init__(self):
        for option, least in self.option_minimums.items():
            value = getattr(self, option)
            if value < least:
                raise ValueError(f"{option.replace('_', '-')} must be >= {least}, got {value}")

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        raise NotImplementedError

    def run(self, module: Module | Operation) -> None:
        """Apply the pass to a module; raise `PassError` if it emitted errors."""
        op = module.operation if isinstance(module, Module) else getattr(module, "operation", module)
        diag = DiagnosticEngine()
        self.apply(op, diag)
        if diag.diagnostics:
            raise PassError(self.name, diag.diagnostics)

    # options ---------------------------------------------------------------------------------

    @classmethod
    def option_types(cls) -> dict[str, type]:
        """Option name as written in a pipeline (dashes) -> Python type."""
        hints = get_type_hints(cls)
        return {f.name.replace("_", "-"): hints[f.name] for f in dataclasses.fields(cls)}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> ModulePass:
        """Build the pass from `{opt=value ...}` text values, checking names and types."""
        types = cls.option_types()
        kwargs: dict[str, Any] = {}
        for key, text in options.items():
            if key not in types:
                known = ", ".join(sorted(types)) or "none"
                raise PipelineError(f"pass '{cls.name}' has no option '{key}' (options: {known})")
            typ = types[key]
            try:
                kwargs[key.replace("-", "_")] = _OPTION_PARSERS[typ](text)
            except ValueError:
                raise PipelineError(f"pass '{cls.name}': option '{key}' expects {typ.__name__}, got '{text}'") from None
        try:
            return cls(**kwargs)
        except ValueError as e:  # __post_init__ range checks
            raise PipelineError(f"pass '{cls.name}': {e}") from None


# ---------------------------------------------------------------------------------------------
# helpers every pass uses


def operator_name(op: Operation) -> str | None:
    """The `name` of a `torch.operator` (e.g. "torch.day0.dsa_attention"), else None."""
    if op.name != "torch.operator" or "name" not in op.attributes:
        return None
    return StringAttr(op.attributes["name"]).value


def collect_ops(module_op: Operation, match) -> list[Operation]:
    """Every op under module_op (pre-order) for which match(op) is true, gathered before any
    rewrite so that rewriting cannot disturb the walk."""
    found: list[Operation] = []

    def visit(op):
        op = op.operation
        if match(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    return found


def collect_sites(module_op: Operation, is_site, match, diag: DiagnosticEngine, refuse=None) -> list:
    """The sites of the ops for which is_site(op) is true, gathered (pre-order) before any rewrite:
    match(op, diag) returns an op's site or reports how it breaks its op's contract (passes/sites/);
    refuse(site), the pass's own limits, returns None or an error, reported at the site's op, whose
    site is then dropped."""
    sites = []
    for op in collect_ops(module_op, is_site):
        site = match(op, diag)
        if site is None:
            continue
        message = refuse(site) if refuse else None
        if message:
            diag.error(op, message)
            continue
        sites.append(site)
    return sites


def unique_symbol(base: str, taken: set[str]) -> str:
    """base, or base_1, base_2, … — the first not in taken (which then holds it)."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name
