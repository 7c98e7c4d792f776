"""The cost model with every algorithm's schedule: what ``auto`` and ``bench model`` both ask.

Each algorithm of the registry that can be modelled has a ``schedule(model, nbytes)``
(how it runs, as phases of concurrent transfers: :mod:`topology.model`); native MPI's has none.
:func:`cost_model` hands them all to a :class:`topology.model.Model` of the links given.
"""

from topology.model import Model

from .hier import ACROSS
from .registry import REGISTERED

#: {name: schedule} of every registered algorithm the model knows how to run
SCHEDULES = {name: algorithm.schedule for name, algorithm in REGISTERED.items() if algorithm.schedule}


def cost_model(links, ports="capacity", across="ring"):
    """A :class:`topology.model.Model` of every algorithm in :data:`SCHEDULES` on ``links``: a
    :class:`topology.BandwidthMatrix` (a probe file's) or a :class:`topology.model.Network`.
    ``ports`` as :class:`topology.model.Model` takes them; ``across``: hier's all-reduce between
    the nodes, one of :data:`algorithms.hier.ACROSS`."""
    if across not in ACROSS:
        raise ValueError(f"hier across {across!r}: choices {', '.join(ACROSS)}")
    return Model(links, SCHEDULES, ports, across)
