"""The ``mpi`` baseline: the MPI library's own ``MPI_Allreduce`` (and, for the other collectives,
``MPI_Reduce_scatter_block`` and ``MPI_Allgather``), timed in a loop compiled from C
(:mod:`.mpi_loop`), without Python's cost of a call; and ``mpi:NAME``, the library told to use
its own algorithm NAME, timed the same way. :class:`LibraryBaseline` is what it shares with
``mpi4py`` (:mod:`.mpi4py`), the same calls made through mpi4py.

``--algo mpi:NAME`` runs ``MPI_Allreduce`` with the library told to use its algorithm NAME. It
reads that once, at ``MPI_Init``, so a run takes one NAME, and ``python -m bench`` sets it
before MPI starts (:meth:`MpiBaseline.environment`):

* MPICH (:data:`MPICH`): ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=NAME``, with
  ``MPIR_CVAR_DEVICE_COLLECTIVES=none``, without which MPICH's shared-memory device collectives
  (``release_gather`` within a node) answer first and NAME is never asked, and
  ``MPIR_CVAR_COLLECTIVE_FALLBACK=print``, so that where NAME cannot run a call (``ring`` needs a
  commutative op, ``reduce_scatter_allgather`` at least as many elements as the largest power
  of two below the rank count) MPICH says so on stderr before it runs its own choice instead (as
  it does for ``reduce_scatter_allgather`` in ``MPI_Init``'s own one-element all-reduce).
* Open MPI (:data:`OPEN_MPI`, under Open MPI's ``mpiexec``): its coll/tuned algorithm number
  (``OMPI_MCA_coll_tuned_allreduce_algorithm``, with ``OMPI_MCA_coll_tuned_use_dynamic_rules=1``
  and ``OMPI_MCA_coll=^han,xhc,acoll``, so that coll/tuned, not a component above it, answers).

The files the library loads to follow the fastest NAME per size are ``python -m bench
mpi-tuning``'s (:mod:`bench.tools.mpi_tuning`). Nothing here imports mpi4py at import time:
the environment is set before MPI starts.
"""


import os
from dataclasses import dataclass, field

from plumbing.cli import comma_names, flag_values

from .base import Baseline
from .mpi_loop import CompiledLoop

PREFIX = "mpi:"


@dataclass(frozen=True, eq=False)  # compared and hashed as the one object per library
class Library:
    """One MPI library's menu: NAME -> the value of ``variable`` that forces it, and what else it needs."""
    name: str
    menu: dict
    variable: str
    forced: dict = field(default_factory=dict)

    def environment(self, algorithm):
        return {self.variable: self.menu[algorithm], **self.forced}


MPICH = Library("MPICH", {n: n for n in ("recursive_doubling", "recursive_multiplying", "reduce_scatter_allgather",
                                         "tree", "recexch", "ring", "k_reduce_scatter_allgather")},
                "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
                {"MPIR_CVAR_DEVICE_COLLECTIVES": "none", "MPIR_CVAR_COLLECTIVE_FALLBACK": "print"})
#: coll/tuned's all-reduce algorithms 1-6 (ompi_info --param coll tuned --level 9 lists them); Open MPI 5.0
#: refuses 7 (allgather_reduce, of later versions) with a warning and runs its default instead
OPEN_MPI = Library("Open MPI", {"basic_linear": "1", "nonoverlapping": "2", "recursive_doubling": "3", "ring": "4",
                                "segmented_ring": "5", "rabenseifner": "6"},
                   "OMPI_MCA_coll_tuned_allreduce_algorithm",
                   {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll": "^han,xhc,acoll"})
MENU = tuple(MPICH.menu)  # MPICH's, the library this suite installs


def launched_by(env):
    """The library whose launcher started this process: Open MPI's sets ``OMPI_COMM_WORLD_SIZE``."""
    return OPEN_MPI if "OMPI_COMM_WORLD_SIZE" in env else MPICH


def library_of(version):
    """The :class:`Library` of an ``MPI_Get_library_version`` text, or None."""
    return MPICH if version.startswith("MPICH") else OPEN_MPI if version.startswith("Open MPI") else None


def algo_entries(argv, prefix):
    """The entries of ``--algo`` in ``argv`` that start with ``prefix``, in order, read before
    ``MPI_Init`` as the parser reads them after (:func:`plumbing.cli.comma_names`)."""
    return [name for value in flag_values(argv, "--algo") for name in comma_names(value) if name.startswith(prefix)]


def requested(argv):
    """The NAMEs of the ``mpi:NAME`` entries of ``--algo`` in ``argv``, in order."""
    return [a[len(PREFIX):] for a in algo_entries(argv, PREFIX)]


def environment_for(argv, env):
    """The variables a run of ``argv`` needs, set before ``MPI_Init``, or a problem in words."""
    names = requested(argv)
    if not names:
        return {}
    library = launched_by(env)
    unknown = [n for n in names if n not in library.menu]
    if unknown:
        return f"unknown {library.name} all-reduce algorithm {', '.join(unknown)}; choices: {', '.join(library.menu)}"
    if len(set(names)) > 1:
        return (f"one mpi:NAME per run ({', '.join(PREFIX + n for n in dict.fromkeys(names))} given): {library.name} "
                f"reads {library.variable} once, at MPI_Init")
    wanted = library.environment(names[0])
    clashes = [f"{k}={env[k]}" for k, v in wanted.items() if env.get(k, v) != v]
    if clashes:
        return f"--algo {PREFIX}{names[0]} sets {', '.join(f'{k}={v}' for k, v in wanted.items())}, but {', '.join(clashes)} is set"
    return wanted


def current_library():
    """The :class:`Library` of the MPI this process runs, or None (neither MPICH nor Open MPI)."""
    from mpi4py import MPI  # once MPI runs: this module is read before MPI starts (module docstring)

    return library_of(MPI.Get_library_version())


class LibraryBaseline(Baseline):
    """The MPI library's own collectives, on host buffers or a CUDA-aware MPI's device buffers;
    ``avg`` is ``MPI_SUM`` divided by the rank count (MPI has no average)."""

    #: how the calls are made, in the header's transport line
    how = ""

    def in_all(self, name, args):
        return name == self.family and (args.device == "cpu" or args.cuda_aware)

    def check(self, args, chosen):
        told = [entry.name for entry in args.algos if entry.name.startswith(PREFIX)]
        if told and self.family in chosen:
            return (f"--algo {self.family} with {told[0]}: in this run MPI_Allreduce is {told[0]}; time "
                    f"{self.family} in a run of its own")
        if self.family in chosen and args.device == "gpu" and not args.cuda_aware:
            return (f"--algo {self.family} with --device gpu needs a CUDA-aware MPI (MPIX_Query_cuda_support says "
                    "no; ALLREDUCE_CUDA_AWARE=1 overrides)")
        return None

    def lacks(self, name, dtype):
        from algorithms.catalog.native import no_mpi_type  # once MPI runs (module docstring)

        return no_mpi_type(dtype)

    def transport(self, name, xp):
        return (f"the MPI library's own collective, {self.how}"
                + (" on device buffers (CUDA-aware MPI)" if xp.__name__ != "numpy" else ""))


class MpiBaseline(LibraryBaseline):
    """``mpi``: the library's own collective; ``mpi:NAME``: the library told to use its algorithm
    NAME; both timed in the compiled loop, which :meth:`start` builds (or says why it cannot)."""

    family = "mpi"
    how = "timed in a compiled loop (avg: MPI_SUM calls, divided by the rank count once after them)"
    help = (f"mpi (the MPI library's own MPI_Allreduce, timed in a loop compiled from C with the MPI's mpicc, "
            f"without Python's cost of a call; avg: MPI_SUM calls timed, divided by the rank count once after; "
            f"mpi:NAME: the library's own algorithm NAME, one per run: with MPICH {','.join(MENU)}, with Open MPI "
            f"{','.join(OPEN_MPI.menu)})")
    loop = problem = None

    def names(self, collective):
        library = current_library() if collective == "allreduce" else None
        return ["mpi", *(f"{PREFIX}{name}" for name in (library.menu if library else ()))]

    def environment(self, argv, env):
        return environment_for(argv, env)

    def check(self, args, chosen):
        told = [a for a in chosen if a.startswith(PREFIX)]
        if told and "mpi" not in chosen:
            library = current_library()
            if len(set(told)) > 1 or os.environ.get(library.variable) != library.menu[told[0][len(PREFIX):]]:
                return (f"--algo {','.join(told)}: one mpi:NAME per run, through python -m bench, which sets "
                        f"{library.variable} before MPI starts")
        return super().check(args, chosen)

    def start(self, comm):
        self.loop, self.problem = CompiledLoop.start(comm)

    def skips(self, name):
        return self.problem

    def runner(self, spec, name, comm, op):
        return self.loop.runner(spec, comm, op)  # mpi:NAME: the library was told its algorithm at MPI_Init

    def transport(self, name, xp):
        if name.startswith(PREFIX):
            library, algorithm = current_library(), name[len(PREFIX):]
            return f"{library.name}'s own {algorithm} ({library.variable}={library.menu[algorithm]}), {self.how}"
        return super().transport(name, xp)
