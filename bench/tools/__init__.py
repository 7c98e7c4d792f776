"""``python -m bench NAME ...``: the tools beside the sweep, one module each, listed once here.

:data:`TOOLS` is read by ``bench/__main__.py``, which runs them and hands the sweep their
:func:`listing` for its ``--help``. A new tool is one module with a ``main(argv)`` and one entry here. Nothing
here imports a tool: each is imported when it runs.

Each tool runs MPI at the thread level ``MPI_Init`` gives a C program, ``MPI_THREAD_SINGLE``,
unless its ``thread_level(argv)`` asks for more (``bench/__main__.py`` sets it before MPI starts).
"""

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from plumbing.cli import comma_names
from plumbing.ending import THREAD_LEVEL


def single(argv):
    """The level of a tool whose MPI calls all come from its main thread."""
    return THREAD_LEVEL


def overlapping(argv):
    """``"serialized"`` when ``bench train``'s ``--overlap`` list holds ``on`` (its DDP hook then
    calls MPI from a communication thread, :class:`algorithms.torch.HookState`), else ``"single"``;
    read from argv as train's own parser reads it, before MPI starts."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--overlap", default="off")
    try:
        known, _ = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit):  # train's parser says what is wrong
        return single(argv)
    return "serialized" if "on" in comma_names(known.overlap) else single(argv)


@dataclass(frozen=True)
class Tool:
    module: str      # the module whose main(argv) runs it
    help: str        # a line for python -m bench --help
    under_mpi: bool  # run on every rank of an MPI job, each rank ending with the others
    thread_level: Callable = single  # argv -> the mpi4py.rc.thread_level it runs at


TOOLS = {
    "compare": Tool("bench.tools.compare", "busbw of several runs and vendor nccl-tests logs side by side", False),
    "model": Tool("bench.tools.model", "the alpha-beta model's time and busbw per algorithm, beside measured results",
                  False),
    "plan": Tool("bench.tools.plan", "an algorithm's plan: each rank's steps, priced by the model, or as JSON",
                 False),
    "plan-fit": Tool("bench.tools.plan_fit", "each algorithm's time at small sizes against its plan's price, from one "
                     "message's time through the same engine (under mpiexec)", True),
    "plot": Tool("bench.tools.plot", "busbw against message size, as a PNG", False),
    "scaling": Tool("bench.tools.scaling",
                    "data-parallel training step time and efficiency per algorithm and rank count", False),
    "perf": Tool("bench.tools.perf", "the CPU performance targets measured in one run (under mpiexec, 2 ranks)", True),
    "train": Tool("bench.train.tool", "what communication costs a PyTorch DDP or FSDP training step, per algorithm, "
                  "bucket size and dtype, measured and modelled (under mpiexec; needs torch)", True, overlapping),
    "tune": Tool("bench.tools.tune", "time every candidate per size and write the tuning table algorithm=\"auto\" "
                 "follows (under mpiexec)", True),
    "mpi-tuning": Tool("bench.tools.mpi_tuning", "the MPI library's fastest algorithm per size from runs of --algo "
                       "mpi:NAME, as the file it loads", False),
    "nccl-tuning": Tool("bench.tools.nccl_tuning", "NCCL's fastest algorithm and protocol per size from --algo "
                        "nccl:ALGO/PROTO runs or nccl-tests logs, as the CSV file of NCCL's example tuner plugin", False),
    "bound": Tool("bench.tools.bound", "what compiled 2-rank rings and trees reach against a memory copy (no MPI)",
                  False),
    "treebuild": Tool("bench.tools.treebuild", "how long building the matched trees takes for 64-16384 ranks", False),
    "gpu-check": Tool("bench.tools.gpu_check", "every algorithm and transport on GPU buffers against the device's copy "
                      "bandwidth and NCCL (bench/gpu_check.sh runs it)", False),
    "doctor": Tool("bench.doctor.tool", "what makes busbw low here: leftover settings, binding, interfaces, the "
                   "machine, busbw against the probed links, each finding with its evidence and fix (under mpiexec)",
                   True),
    "lab": Tool("bench.lab.__main__", "the network lab: namespaces with shaped links on one machine (root)", False),
}


def listing():
    """The tools, a line each, for the end of ``python -m bench --help``."""
    return "Subcommands (python -m bench NAME --help):\n" + "\n".join(
        f"  {name:11s} {tool.help}" for name, tool in TOOLS.items())
