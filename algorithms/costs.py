"""The cost model with every algorithm's schedule: what ``auto`` and ``bench model`` both ask.

Each algorithm of the registry that can be modelled carries a ``schedule(model, nbytes)``
(how it runs, as phases of concurrent transfers: :mod:`topology.model`); native MPI's has none.
:func:`cost_model` hands them all to a :class:`topology.model.Model` of the links given.
"""

from topology.model import Model

from .registry import ALGORITHMS

#: {name: schedule} of every registered algorithm the model knows how to run
SCHEDULES = {name: run.schedule for name, run in ALGORITHMS.items() if getattr(run, "schedule", None)}


def cost_model(links, ports="capacity", across="ring"):
    """A :class:`topology.model.Model` of every algorithm in :data:`SCHEDULES` on ``links``: a
    :class:`topology.BandwidthMatrix` (a probe file's) or a :class:`topology.model.Network`.
    ``ports`` and ``across`` as :class:`topology.model.Model` takes them."""
    return Model(links, SCHEDULES, ports, across)
