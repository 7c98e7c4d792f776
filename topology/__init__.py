"""Topology: bandwidth matrices, matchings and trees as data (the bottleneck-aware matching, BAM, tree), and the probe.

Everything here is pure data except :mod:`topology.probe`, which talks MPI, and
:func:`topology.report.heatmap`, which draws with matplotlib. :mod:`topology.model` is the cost
model of all-reduces on the links. It imports only ``plumbing`` of this project, never
``algorithms`` or ``bench``. :func:`findings` (:mod:`topology.report`) reads a matrix's health.
"""

from .build import METHODS, build_tree, tree_cost
from .matching import bottleneck, bottleneck_matching, bottleneck_matching_reference, max_weight_matching
from .matrix import BandwidthMatrix, as_matrix, random_heterogeneous, seed_example, two_level, uniform
from .report import findings, heatmap
from .trees import Tree, binomial_tree, double_binary_trees

__all__ = [
    "BandwidthMatrix", "METHODS", "Tree", "as_matrix", "binomial_tree", "bottleneck",
    "bottleneck_matching", "bottleneck_matching_reference", "build_tree", "double_binary_trees",
    "findings", "heatmap", "max_weight_matching",
    "random_heterogeneous", "seed_example", "tree_cost", "two_level", "uniform",
]
