"""The layering of day0's folders, read from the sources (every `import`, at module level or inside a
function):

    runtime/           imports nothing from the other folders (a GPU host has numpy + the IREE runtime)
    models/, frontend/ nothing from passes/, lowering/ or tools/
    passes/            nothing from models/ or tools/
    tools/             imported by nothing but tools/
and no cycle among the modules' imports (lazy ones inside functions included)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("frontend", "passes", "lowering", "runtime", "models", "tools")
FORBIDDEN = {
    "runtime": {"frontend", "passes", "lowering", "models", "tools"},
    "models": {"passes", "lowering", "tools"},
    "frontend": {"passes", "lowering", "tools"},
    "passes": {"models", "tools"},
    "lowering": {"tools"},
}


def _modules() -> dict[str, Path]:
    """day0 module name -> source file, for every product folder."""
    out = {}
    for folder in FOLDERS:
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("day0", *parts))
            out[name.removesuffix(".__init__")] = f
    return out


def _imports(path: Path, name: str, top_level_only: bool) -> set[str]:
    """The day0 modules (or packages) `path` imports."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("day0.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("day0"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from day0.x import module`
    return found


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else None


def test_the_folders_import_only_downwards():
    bad = []
    for name, path in _modules().items():
        here = _folder(name)
        for imported in _imports(path, name, top_level_only=False):
            there = _folder(imported)
            if there is None or there == here:
                continue
            if there in FORBIDDEN.get(here, ()) or (there == "tools" and here != "tools"):
                bad.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not bad, "layering broken:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    modules = _modules()
    # `from day0.runtime import state_file` inside day0.runtime.session names its own package: not an edge
    graph = {
        n: {m for m in _imports(p, n, top_level_only=False) if m in modules and m != n and not n.startswith(m + ".")}
        for n, p in modules.items()
    }
    done, path = set(), []

    def visit(n):
        if n in path:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(n) :] + [n]))
        if n in done:
            return
        path.append(n)
        for m in sorted(graph[n]):
            visit(m)
        path.pop()
        done.add(n)

    for n in sorted(graph):
        visit(n)


def test_the_checker_sees_a_violation(tmp_path):
    # the rules above must be able to fail: a runtime module importing the models is reported
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from day0.models.base import CausalLM\n")
    assert _folder(next(iter(_imports(src, "day0.runtime.x", top_level_only=False)))) == "models"
    assert _imports(src, "day0.runtime.x", top_level_only=True) == set()
