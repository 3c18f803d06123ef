"""`python -m day0.tools.serve ARTIFACT [options]`: `day0 serve` without the compiler's CLI, for a
GPU host that has only the runtime and the server's packages. Errors as the CLI's: one line, exit 2."""

import argparse
import sys

from day0.tools.serve.server import add_arguments, serve_from_args


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m day0.tools.serve", description="day0 serve")
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        serve_from_args(a)
    except (ValueError, OSError) as e:
        print(f"day0: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
