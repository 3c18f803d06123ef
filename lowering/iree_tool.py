"""The installed iree-compile binary, and the error every failed use of it raises.

Its own module so that the target table (which probes the compiler for the CUDA device target)
and the compile invocation (which asks the target table) both use it without importing each other.
"""

import os
import sys
from pathlib import Path


class CompileError(RuntimeError):
    """iree-compile failed. `stage`, `first_error` and `repro_dir` are also attributes."""

    def __init__(self, stage: str, first_error: str, repro_dir: Path | None):
        self.stage, self.first_error, self.repro_dir = stage, first_error, repro_dir
        where = f"; repro: {repro_dir}/command.sh" if repro_dir else ""
        super().__init__(f"{stage} failed: {first_error}{where}")


def iree_compile_path() -> str:
    """The iree-compile binary of the installed iree-base-compiler."""
    try:
        from iree.compiler.tools.binaries import find_tool

        return os.path.realpath(find_tool("iree-compile"))
    except Exception:  # fall back to the venv's bin/ (console script next to python)
        candidate = Path(sys.executable).parent / "iree-compile"
        if candidate.exists():
            return str(candidate)
        raise CompileError(
            "locating iree-compile",
            "iree-compile not found (is iree-base-compiler installed in this environment?)",
            None,
        ) from None
