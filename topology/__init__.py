"""Topology: trees as data (and, later, bandwidth matrices, probes and matchings).

Pure data; never imports ``algorithms`` or ``bench``.
"""

from .trees import Tree, binomial_tree

__all__ = ["Tree", "binomial_tree"]
