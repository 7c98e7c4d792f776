"""Double binary tree all-reduce, NCCL's "Tree" algorithm (Sanders, Speck and Traeff, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 35, 2009).

Two binary trees over the same ranks (:func:`topology.double_binary_trees`) each carry half
of the vector, pipelined, at the same time (:func:`.tree.allreduce`). A rank that is an
inner node of one tree is a leaf of the other (for an even rank count), so every rank
reduces and forwards about half the vector, where one tree leaves that all to its inner
nodes: with 2 ranks one tree's root reduces the whole vector, and each of two trees' roots
half of it, as in the ring. Time: a pipelined tree's, each tree on M/2, where the two
trees' links differ (``bench.model`` adds up a link both use).
"""

import functools

from topology import double_binary_trees

from . import tree


@functools.lru_cache(maxsize=16)
def _trees(size):
    return list(double_binary_trees(size))


def allreduce(coll, sendbuf, recvbuf):
    tree.allreduce(coll, sendbuf, recvbuf, _trees(coll.size))
