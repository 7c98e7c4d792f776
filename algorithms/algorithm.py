"""What an all-reduce declares about itself, once, beside its code: :class:`Algorithm`.

Each algorithm module ends with its record (``ALGORITHM = Algorithm("ring", allreduce, ...)``),
and the registry (:mod:`.registry`) lists the records; every other part of the suite (the entry
point, ``auto``, the cost model, the benchmark and its tools) asks a record, never a loose
attribute, so a misspelt property is an error where it is declared, not a silent default.
"""

from dataclasses import dataclass
from typing import Callable, Optional


def relayed(n, nbytes):
    """``(reduced, copied)`` bytes all ranks receive in an all-reduce that relays every rank's
    vector once along the edges of a spanning structure, reducing on the way in and copying on the
    way out: (N-1) M each, whichever structure (a ring's 2(N-1) steps of M/N on every rank, a
    tree's N-1 edges carrying M up and M down, a parameter server, their halved and pipelined
    forms)."""
    return (n - 1) * nbytes, (n - 1) * nbytes


@dataclass(frozen=True)
class Algorithm:
    """One all-reduce.

    * ``allreduce(coll, sendbuf, recvbuf[, plan])``: it runs, talking through the executor's
      ``coll`` (:class:`.executor.Collective`); ``plan`` is what ``prepare`` returned, or the
      ``topology.Tree`` of a tree algorithm.
    * ``schedule(model, nbytes)``: how it runs, as phases of concurrent transfers, for the cost
      model (:mod:`topology.model`); None: not modelled.
    * ``steps(size, rank, count, itemsize[, plan])``: rank ``rank``'s steps (:mod:`.plan`) in an
      all-reduce of ``count`` elements of ``itemsize`` bytes on ``size`` ranks (``plan`` as for
      ``allreduce``), which :mod:`.engine` runs and ``python -m bench plan`` prints; None: it
      runs its own code.
    * ``plan_input(size, matrix, nodes)``: what its ``steps`` take as ``plan``, made from a
      ``topology.BandwidthMatrix`` (None: uniform links) and the node of each rank, so that its
      plan can be made without MPI (``python -m bench plan``); None: its steps take nothing more.
    * ``bind(coll, count, dtype)``: ``run(sendbuf, recvbuf)`` for vectors of that shape, with what
      every such call repeats done once; the entry point keeps one per shape.
    * ``prepare(size, tree, bandwidth, name)``: checks ``tree=`` and ``bandwidth=`` itself; what it
      returns, unless None, is the ``plan`` (with a ``digest()`` the ranks agree on).
    * ``tree_method``: it runs a ``topology.Tree`` built by that ``topology.build_tree`` method
      unless the caller passes one.
    * ``needs_bandwidth()``: whether it needs ``bandwidth=`` as things stand (its settings);
      ``accepts_bandwidth``: it uses one where given (the benchmark then passes ``--topology``);
      ``needs_plan``: it never runs without what ``prepare`` returns.
    * ``describe(private, transport)``: what carries it on a communicator, in words, given the
      transport's own (collective: it may make what it keeps there).
    * ``lacks(dtype)``: why it cannot reduce ``dtype`` (one line), else None.
    * ``in_all``: whether the benchmark's ``--algo all`` runs it; ``one_node_only``: across nodes
      it runs another algorithm (so ``auto`` does not choose it there).
    * ``reduce_scatter(coll, src, partial, result[, plan])`` and ``all_gather(coll, whole[, plan])``:
      its two halves, where it is built of them and they are usable alone (``plan`` as for
      ``allreduce``). Both keep the one chunk layout of :func:`.layout.chunk_offsets`: the
      reduce-scatter leaves chunk r of the reduction of ``src`` (read only, unless ``partial``
      is ``src``) in ``result`` on rank r; ``partial``, a whole-length vector it may write its
      partial results to (``src`` itself in place), or None (it takes scratch); the all-gather
      starts from ``whole`` holding this rank's chunk at its place and leaves it whole.
    * ``reduce_scatter_schedule(model, nbytes)`` and ``all_gather_schedule(model, nbytes)``: how
      each half runs for the cost model, ``nbytes`` the whole vector (nccl-tests' size).
    * ``plan_when_compiled``: its ``steps`` run only on the compiled engine, where it runs plans
      of that size; elsewhere (longer vectors, the Python engine) its own ``allreduce`` runs.
    * ``across_nodes``: the registered algorithm that runs in its place where the ranks span
      nodes (an algorithm of one node's shared memory; ``bench plan-fit`` prices that one's plan).
    * ``halves_take_no_plan``: its halves use nothing ``prepare`` makes (hier: rings across nodes
      whatever ``ALLREDUCE_HIER_ACROSS``), so they need no ``bandwidth=``; one given is checked.
    * ``received(n, nbytes)``: ``(reduced, copied)``, the bytes of the messages that all ``n``
      ranks together receive in one all-reduce of ``nbytes`` a rank, as it runs on device
      buffers: those reduced into a partial result and those copied into place (what ranks that
      share one GPU's memory must read and write: the one-GPU bound, docs/gpu.md); None where
      not known (MPI's own). By default a relay's, :func:`relayed`; tests/mpi/test_correctness.py
      counts them.
    """

    name: str
    allreduce: Callable
    schedule: Optional[Callable] = None
    bind: Optional[Callable] = None
    steps: Optional[Callable] = None
    plan_input: Optional[Callable] = None
    prepare: Optional[Callable] = None
    tree_method: Optional[str] = None
    needs_bandwidth: Callable[[], bool] = lambda: False
    accepts_bandwidth: bool = False
    needs_plan: bool = False
    describe: Optional[Callable] = None
    lacks: Callable = lambda dtype: None
    in_all: bool = True
    one_node_only: bool = False
    reduce_scatter: Optional[Callable] = None
    all_gather: Optional[Callable] = None
    reduce_scatter_schedule: Optional[Callable] = None
    all_gather_schedule: Optional[Callable] = None
    halves_take_no_plan: bool = False
    received: Optional[Callable] = relayed
    plan_when_compiled: bool = False
    across_nodes: Optional[str] = None

    def runs(self, collective):
        """Whether it runs ``collective`` ("allreduce", "reduce_scatter" or "all_gather")."""
        return getattr(self, collective) is not None

    def schedule_of(self, collective):
        """Its cost schedule for ``collective``, or None."""
        return self.schedule if collective == "allreduce" else getattr(self, f"{collective}_schedule")

    def wants_bandwidth(self, collective="allreduce"):
        """Whether it builds what it runs ``collective`` on from a bandwidth matrix as things stand:
        the matched trees, bamring, and hier's all-reduce with ``ALLREDUCE_HIER_ACROSS=bamtree``."""
        if collective != "allreduce" and self.halves_take_no_plan:
            return False
        if self.tree_method is not None:
            return self.tree_method != "binomial"
        return self.needs_bandwidth()

    @property
    def treeless(self):
        """Whether it runs with nothing but the vectors (no tree, no plan)."""
        return self.tree_method is None and not self.needs_plan
