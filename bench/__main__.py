"""``python -m bench`` runs the sweep; ``python -m bench bound|compare|model|perf|plot|scaling ...`` the tools."""

import importlib
import sys

TOOLS = {"bound": "bench.bound", "compare": "bench.compare", "model": "bench.model", "perf": "bench.perf", "plot": "bench.plot",
         "scaling": "bench.scaling"}


def main(argv):
    if argv and argv[0] in TOOLS:
        return importlib.import_module(TOOLS[argv[0]]).main(argv[1:])
    from bench.cli import main as sweep

    return sweep(argv)


sys.exit(main(sys.argv[1:]))
