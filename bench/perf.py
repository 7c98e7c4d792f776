"""``python -m bench.perf``: the same as ``python -m bench perf`` (:mod:`bench.tools.perf`), for scripts that call it so."""

import sys

from bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["perf", *sys.argv[1:]]))
