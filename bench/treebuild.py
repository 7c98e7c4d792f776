"""``python -m bench.treebuild``: the same as ``python -m bench treebuild`` (:mod:`bench.tools.treebuild`), for scripts that call it so."""

import sys

from bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["treebuild", *sys.argv[1:]]))
