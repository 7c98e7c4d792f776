"""What the driver asks of a baseline: one class, whose defaults a baseline overrides.

A baseline is what ``--algo`` runs beside our algorithms to compare with: the MPI library's
collectives, NCCL's, PyTorch's gloo. Each module of this package fills in one
:class:`Baseline`, and :data:`bench.baselines.BASELINES` lists them; nothing else in the
benchmark names a baseline. The driver asks, in this order:

1. before MPI starts, :meth:`~Baseline.environment`: the variables a run of these arguments
   needs (a baseline told its own algorithm reads it at ``MPI_Init``);
2. after parsing, on every rank alike, :meth:`~Baseline.names` (what ``--algo`` takes),
   :meth:`~Baseline.in_all` (what ``--algo all`` runs) and :meth:`~Baseline.check` (what
   cannot run with these arguments: one line and exit 2);
3. before the first size, :meth:`~Baseline.start` (collective: a communicator of its own;
   it raises :class:`Unavailable` on every rank when it cannot run), then
   :meth:`~Baseline.skips` (a name it cannot run after all: one ``# NAME skips: WHY`` line
   and the others run; exit 2 when none is left);
4. for each table, :meth:`~Baseline.transport` (the header's ``# Transport:`` line) and
   :meth:`~Baseline.runner` (the function the timing loop calls, or times through: a
   ``loop`` attribute, :func:`bench.core.timing.time_calls`);
5. at the end, :meth:`~Baseline.close`.

Modules here import neither mpi4py nor ``algorithms`` at import time, so that step 1 runs
before MPI starts.
"""


class Unavailable(RuntimeError):
    """A baseline cannot run on some rank; raised alike on every rank, the message says why."""


class Baseline:
    """A baseline named ``family`` on the command line, and ``family:VARIANT`` for its variants."""

    family = ""
    #: its part of ``--algo``'s help
    help = ""

    def names(self, collective):
        """Every ``--algo`` name it takes for ``collective`` ("allreduce", "reducescatter",
        "allgather"); none where it does not run that collective."""
        return [self.family]

    def shown(self, collective):
        """The names an error lists as choices (variants may be shown as one pattern)."""
        return self.names(collective)

    def in_all(self, name, args):
        """Whether ``--algo all`` runs ``name`` with these arguments (by default a baseline runs
        only when named)."""
        return False

    def environment(self, argv, env):
        """The variables (a dict) that ``argv`` needs set before MPI starts, or a problem (text)."""
        return {}

    def lacks(self, name, dtype):
        """Why ``name`` cannot reduce NumPy ``dtype`` (one line), else None; the sweep says it
        once and measures the run's other types."""
        return None

    def check(self, args, chosen):
        """A problem (text) with running ``chosen`` (its names among ``--algo``) with ``args``,
        or None; the same on every rank."""
        return None

    def start(self, comm):
        """Make what it runs on (collective over ``comm``); raise :class:`Unavailable` on every
        rank when it cannot."""

    def skips(self, name):
        """Why ``name`` cannot run after all, found by :meth:`start` (one line, the same on every
        rank), else None."""
        return None

    def runner(self, spec, name, comm, op):
        """``run(send, recv, check=False) -> result`` for ``name`` on collective ``spec``
        (:mod:`bench.core.collectives`) with ``op``; where the calls are timed in a loop of
        its own, ``run.loop(send, recv, iters, agg, blocking, per_iteration) -> (seconds,
        host seconds)`` runs them."""
        raise NotImplementedError

    def transport(self, name, xp):
        """What carries ``name``'s messages, in words, for buffers of array module ``xp``."""
        return name

    def close(self):
        """Let go of what :meth:`start` made (before MPI finalizes)."""
