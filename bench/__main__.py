"""``python -m bench`` runs the sweep; ``python -m bench NAME ...`` the tools (:data:`bench.tools.TOOLS`
lists them, and ``python -m bench --help`` shows them).

The sweep, and the tools that run under mpiexec, run together
(:func:`plumbing.ending.run_together`): an error or a signal on one rank ends every rank.
Before MPI starts, what it needs of ``/dev/shm`` is settled (:mod:`plumbing.shm`), and so is
what a baseline told its own algorithm reads at ``MPI_Init`` (:meth:`bench.baselines.Baseline.environment`),
and the thread level ``MPI_Init`` asks for: ``MPI_THREAD_SINGLE``, what a C program's ``MPI_Init``
gets, for the sweep and every tool, more only where a tool's ``thread_level`` asks for it
(``bench train --overlap on``: ``MPI_THREAD_SERIALIZED``).
"""

import importlib
import os
import sys

from bench.baselines import BASELINES
from bench.tools import TOOLS, listing
from plumbing.ending import THREAD_LEVEL, ask_thread_level, run_together
from plumbing.launcher import world_rank
from plumbing.shm import settle_before_mpi_init


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    tool = TOOLS.get(argv[0]) if argv else None
    ask_thread_level(tool.thread_level(argv[1:]) if tool else THREAD_LEVEL)
    if tool is not None and not tool.under_mpi:
        return importlib.import_module(tool.module).main(argv[1:])
    prog = "python -m bench" + (f" {argv[0]}" if tool else "")
    refused = settle_before_mpi_init(prog)
    if refused:
        return refused
    if tool is None:  # the sweep: what the baselines named in --algo read at MPI_Init, set first
        for baseline in BASELINES:
            wanted = baseline.environment(argv, os.environ)
            if isinstance(wanted, str):  # every rank reads the same argv: rank 0 says it
                if world_rank() == 0:
                    print(f"python -m bench: error: {wanted}", file=sys.stderr)
                return 2
            os.environ.update(wanted)
    if tool is not None:
        return run_together(lambda: importlib.import_module(tool.module).main(argv[1:]), prog)
    return run_together(lambda: importlib.import_module("bench.core.sweep").main(argv, listing()), prog)


if __name__ == "__main__":
    sys.exit(main())
