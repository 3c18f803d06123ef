"""lit configuration for day0's pass tests: `day0-opt` + the Python `filecheck` package.

Both tools come from the environment that runs lit (the venv: `.venv/bin/lit -v tests/lit`), so
its bin directory goes first on PATH.
"""

import os
import sys

import lit.formats

config.name = "day0"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.excludes = ["lit.cfg.py", "Output"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.test_source_root, "Output")

bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join([bin_dir, config.environment.get("PATH", os.environ.get("PATH", ""))])
for tool in ("day0-opt", "filecheck"):
    if not os.path.exists(os.path.join(bin_dir, tool)):
        lit_config.fatal(f"{tool} not found next to {sys.executable}: install day0 with its test extras")
