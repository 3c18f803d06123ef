"""The runtime loads and runs an artifact without importing PyTorch or the compiler: a GPU host
may have neither, and torch alone costs hundreds of MB of resident memory."""

import subprocess
import sys


def test_session_does_not_import_torch_or_the_compiler(artifact):
    code = (
        "import sys\nfrom day0.runtime.session import Session\n"
        f"s = Session.load({str(artifact('ds-sparse'))!r})\ns.generate([1, 2, 3], max_new_tokens=2)\n"
        "bad = sorted(m for m in ('torch', 'iree.compiler', 'torch_mlir', 'transformers') if m in sys.modules)\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
