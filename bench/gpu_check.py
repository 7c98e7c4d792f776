"""``python -m bench.gpu_check``: the same as ``python -m bench gpu-check`` (:mod:`bench.tools.gpu_check`), for scripts that call it so."""

import sys

from bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["gpu-check", *sys.argv[1:]]))
