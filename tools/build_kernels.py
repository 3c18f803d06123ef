"""Regenerate the PTX of day0's hand-written CUDA kernels (lowering/kernels/*.cu) with nvcc.

    python -m day0.tools.build_kernels [--check]

The PTX is committed beside its source so that compiling for `cuda-sm90` needs no CUDA toolkit;
`--check` exits 1 if a committed file differs from what this nvcc produces.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "lowering" / "kernels"
ARCH = "sm_90"
NVCC_FLAGS = ("-ptx", f"-arch={ARCH}", "-O3")


def nvcc() -> str | None:
    return shutil.which("nvcc")


def nvcc_release() -> str:
    """nvcc's `Cuda compilation tools, release X, VY` line (the PTX header carries the same)."""
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("Cuda compilation tools"))


def ptx_path(source: Path) -> Path:
    return source.with_name(f"{source.stem}.{ARCH}.ptx")


def compile_ptx(source: Path, out: Path) -> None:
    cmd = [nvcc(), *NVCC_FLAGS, str(source), "-o", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source}:\n{p.stderr}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="day0-build-kernels")
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    a = p.parse_args(argv)
    if nvcc() is None:
        print("nvcc not found: install the CUDA toolkit to rebuild the kernels", file=sys.stderr)
        return 2
    stale = []
    for source in sorted(KERNELS.glob("*.cu")):
        target = ptx_path(source)
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / target.name
            compile_ptx(source, fresh)
            if a.check:
                if not target.exists() or target.read_bytes() != fresh.read_bytes():
                    stale.append(target.name)
            else:
                shutil.copyfile(fresh, target)
                print(f"wrote {target}")
    if stale:
        print(f"stale PTX (run python -m day0.tools.build_kernels): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
