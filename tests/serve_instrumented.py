"""`day0 serve` with two test instruments, started as its own process by tests/test_serve_faults.py:

- every engine step first sleeps STEP_DELAY_S (or $DAY0_TEST_STEP_DELAY_S), so that a test can
  act while an answer is still being generated (disconnect mid-answer, a full queue, warm-up);
- a request with seed FAULT_SEED raises inside its handler once its first tokens arrive: an
  internal error in one request, which must stay that request's 500.

Everything else is the real server (`python -m day0.tools.serve`).
"""

import os
import sys
import time

from day0.runtime.engine import Engine
from day0.tools.serve import __main__ as serve_main
from day0.tools.serve import generate

STEP_DELAY_S = float(os.environ.get("DAY0_TEST_STEP_DELAY_S", "0.02"))
FAULT_SEED = 666

_step = Engine.step
_advance = generate.Generation._advance


def _slow_step(self):
    time.sleep(STEP_DELAY_S)
    return _step(self)


def _faulty_advance(self, p):
    if self.job.params.get("seed") == FAULT_SEED:
        raise RuntimeError("injected fault")
    return _advance(self, p)


Engine.step = _slow_step
generate.Generation._advance = _faulty_advance

if __name__ == "__main__":
    sys.exit(serve_main.main())
