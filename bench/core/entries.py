"""What ``--algo`` takes: every name resolved once, at parsing, into an :class:`Entry`, the same
shape for our algorithms and the baselines, so that every later question (can it reduce this
dtype, does it need a topology, what carries it, how is it run) is an attribute, not another
look-up of the name.
"""

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import algorithms
from algorithms.from_bandwidth import tree_for

from ..baselines import BASELINES


@dataclass(frozen=True)
class Entry:
    """One ``--algo`` name: ours (``algorithm``, an :class:`algorithms.Algorithm`) or a baseline's
    (``baseline``, a :class:`bench.baselines.Baseline`, which takes the name itself: ``mpi:NAME``)."""

    name: str
    algorithm: Optional[algorithms.Algorithm] = None
    baseline: Optional[Any] = None
    collective: str = "allreduce"  # algorithms' name of what it runs: "allreduce", "reduce_scatter", "all_gather"

    @property
    def needs_topology(self):
        """Whether it cannot run without a bandwidth matrix (bamtree, kmtree, bamring, hier's
        all-reduce across a BAM tree)."""
        return self.algorithm is not None and self.algorithm.wants_bandwidth(self.collective)

    @property
    def uses_topology(self):
        """Whether ``--topology`` goes to it: it needs a matrix, or takes one where given (dring's order)."""
        return self.needs_topology or (self.algorithm is not None and self.algorithm.accepts_bandwidth)

    def in_all(self, args):
        """Whether ``--algo all`` runs it: ours but those run by name only (auto, native), and each
        baseline's that it says can run with these arguments."""
        return self.baseline.in_all(self.name, args) if self.baseline else self.algorithm.in_all

    def lacks(self, dtype):
        """Why it cannot reduce ``dtype`` (one line), else None (native and mpi: MPI has no fp8)."""
        dtype = np.dtype(dtype)
        return self.baseline.lacks(self.name, dtype) if self.baseline else self.algorithm.lacks(dtype)

    def skips(self):
        """Why it cannot run after all (a baseline's word once started), else None."""
        return self.baseline.skips(self.name) if self.baseline else None

    def transport(self, comm, xp):
        """What carries its messages, in words, for its header (collective: every rank calls it)."""
        if self.baseline:
            return self.baseline.transport(self.name, xp)
        return algorithms.transport_in_use(xp, comm, self.name)

    def engine(self, comm, xp):
        """Which engine runs its plan, in words, for its header (collective); None for a baseline."""
        return None if self.baseline else algorithms.engine_in_use(xp, comm, self.name)

    def runner(self, spec, comm, op, topology=None):
        """``run(send, recv, check=False) -> result`` of collective ``spec``; a tree algorithm's tree
        built from ``topology`` (or binomial) once, here; ``topology`` passed to those that use one."""
        if self.baseline:
            return self.baseline.runner(spec, self.name, comm, op)
        method = self.algorithm.tree_method
        if method == "binomial" and topology is None:  # its own tree, as a program calls it: tree= not passed
            return spec.run_ours(self.name, comm, op)
        if method:
            return spec.run_ours(self.name, comm, op, tree=tree_for(method, comm.size, bandwidth=topology,
                                                                    name=self.name))
        return spec.run_ours(self.name, comm, op, bandwidth=topology if self.uses_topology else None)


def entries(spec):
    """{name: :class:`Entry`} of every name ``--algo`` takes for collective ``spec``: ours, then
    each baseline's (its variants included: ``mpi:NAME``), in the order ``--help`` lists them."""
    found = {name: Entry(name, algorithm=algorithms.ALGORITHMS[name], collective=spec.half) for name in spec.ours}
    for baseline in BASELINES:
        found.update({name: Entry(name, baseline=baseline) for name in baseline.names(spec.name)})
    return found


def shown(spec):
    """The names an error lists as choices for collective ``spec`` (variants as one pattern)."""
    return [*spec.ours, *(name for baseline in BASELINES for name in baseline.shown(spec.name))]
