"""``python -m bench`` runs the sweep; ``python -m bench NAME ...`` the tools (bench/options.py's
SUBCOMMANDS lists them, and ``python -m bench --help`` shows them).

The sweep and ``perf`` run under mpiexec, so they run together
(:func:`algorithms.ending.run_together`): an error or a signal on one rank ends every rank.
Before MPI starts, what it needs of ``/dev/shm`` is settled (:mod:`topology.shm`).
"""

import importlib
import os
import sys

TOOLS = {"bound": "bench.bound", "compare": "bench.compare", "model": "bench.model", "perf": "bench.perf",
         "plot": "bench.plot", "scaling": "bench.scaling", "treebuild": "bench.treebuild", "lab": "bench.lab.__main__",
         "tune": "bench.tune", "mpi-tuning": "bench.mpi_menu", "nccl-tuning": "bench.nccl_menu"}
UNDER_MPI = {"perf", "tune"}  # tools run on every rank of an MPI job, besides the sweep


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TOOLS:  # the sweep: MPI's or NCCL's own algorithm (--algo mpi:NAME, nccl:ALGO/PROTO), set first
        from bench import mpi_menu, nccl_menu

        for menu in (mpi_menu, nccl_menu):
            wanted = menu.environment_for(argv, os.environ)
            if isinstance(wanted, str):
                print(f"python -m bench: error: {wanted}", file=sys.stderr)
                return 2
            os.environ.update(wanted)
    if argv and argv[0] in TOOLS and argv[0] not in UNDER_MPI:
        return importlib.import_module(TOOLS[argv[0]]).main(argv[1:])
    from topology.shm import settle_before_mpi_init

    refused = settle_before_mpi_init("python -m bench" + (f" {argv[0]}" if argv and argv[0] in UNDER_MPI else ""))
    if refused:
        return refused
    from algorithms.ending import run_together

    if argv and argv[0] in UNDER_MPI:
        return run_together(lambda: importlib.import_module(TOOLS[argv[0]]).main(argv[1:]),
                            f"python -m bench {argv[0]}")
    return run_together(lambda: importlib.import_module("bench.cli").main(argv), "python -m bench")


if __name__ == "__main__":
    sys.exit(main())
