"""The cost model with every algorithm's schedule: what ``auto`` and ``bench model`` both ask.

Each algorithm of the registry that can be modelled has a ``schedule(model, nbytes)`` per
collective it runs (how it runs, as phases of concurrent transfers: :mod:`topology.model`);
native MPI's has none. :func:`cost_model` hands those of one collective to a
:class:`topology.model.Model` of the links given; for the reduce-scatter and the all-gather
``nbytes`` is the whole vector, N chunks (nccl-tests' size).
"""

from topology.model import Model

from .catalog.hier import ACROSS
from .registry import REGISTERED

COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")

#: {collective: {name: schedule}} of every registered algorithm the model knows how to run
SCHEDULES_OF = {collective: {name: algorithm.schedule_of(collective) for name, algorithm in REGISTERED.items()
                             if algorithm.schedule_of(collective)} for collective in COLLECTIVES}
#: the all-reduce's
SCHEDULES = SCHEDULES_OF["allreduce"]


def cost_model(links, ports="capacity", across="ring", collective="allreduce"):
    """A :class:`topology.model.Model` of every algorithm in :data:`SCHEDULES_OF` ``[collective]``
    on ``links``: a :class:`topology.BandwidthMatrix` (a probe file's) or a
    :class:`topology.model.Network`. ``ports`` as :class:`topology.model.Model` takes them;
    ``across``: hier's all-reduce between the nodes, one of :data:`algorithms.catalog.hier.ACROSS`."""
    if across not in ACROSS:
        raise ValueError(f"hier across {across!r}: choices {', '.join(ACROSS)}")
    if collective not in SCHEDULES_OF:
        raise ValueError(f"collective {collective!r}: choices {', '.join(COLLECTIVES)}")
    return Model(links, SCHEDULES_OF[collective], ports, across)
