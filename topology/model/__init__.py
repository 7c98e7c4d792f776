"""The cost model: what an all-reduce costs on a network of links, ports and uplinks.

* :mod:`.network`: the links, ports, racks and rank memory (:class:`Network`);
* :mod:`.phases`: one phase of concurrent transfers, max-min fair (:class:`Phase`);
* :mod:`.model`: an algorithm's time from its schedule (:class:`Model`); the schedules live
  with the algorithms, which hand them in (``algorithms.costs.cost_model``);
* :mod:`.lower_bound`: what no all-reduce can beat on a network (:class:`LowerBound`), and no
  reduce-scatter or all-gather (:class:`HalfBound`);
* :mod:`.one_device`: what no all-reduce can beat among ranks that share one device's memory.
"""

from .lower_bound import Bound, HalfBound, LowerBound, lower_bound
from .model import Estimate, Model
from .network import Network
from .phases import Limit, Phase, PhaseTime

__all__ = ["Bound", "Estimate", "HalfBound", "Limit", "LowerBound", "Model", "Network", "Phase", "PhaseTime",
           "lower_bound"]
