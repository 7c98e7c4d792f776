"""The baselines ``--algo`` runs beside our algorithms, one module each, listed once here.

Each is a :class:`.base.Baseline` (what the driver asks of it, in order, is there): the MPI
library's own collectives timed in a compiled loop (:mod:`.mpi`) and called through mpi4py
(:mod:`.mpi4py`), NCCL's (:mod:`.nccl`), PyTorch's gloo (:mod:`.gloo`).
A new baseline is one module with such a class and one entry of :data:`BASELINES`.
"""

from .base import Baseline, Unavailable
from .gloo import GlooBaseline
from .mpi import MpiBaseline
from .mpi4py import Mpi4pyBaseline
from .nccl import NcclBaseline

#: every baseline, in the order --algo's help and --algo all list them
BASELINES = (MpiBaseline(), Mpi4pyBaseline(), NcclBaseline(), GlooBaseline())


__all__ = ["BASELINES", "Baseline", "Unavailable"]
