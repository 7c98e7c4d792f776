"""Double binary tree all-reduce, NCCL's "Tree" algorithm (Sanders, Speck and Traeff, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 35, 2009).

Two binary trees over the same ranks (:func:`topology.double_binary_trees`) each carry half
of the vector, pipelined, at the same time (:func:`.tree.steps`). A rank that is an
inner node of one tree is a leaf of the other (for an even rank count), so every rank
reduces and forwards about half the vector, where one tree leaves that all to its inner
nodes: with 2 ranks one tree's root reduces the whole vector, and each of two trees' roots
half of it, as in the ring. Time: a pipelined tree's, each tree on M/2, where the two
trees' links differ (the cost model adds up a link both use: :func:`schedule`).
"""

import functools

import numpy as np

from topology import double_binary_trees

from ..runtime import engine
from . import tree
from ..algorithm import Algorithm
from ..runtime.layout import SEGMENT_BYTES


@functools.lru_cache(maxsize=16)
def _trees(size):
    return tuple(double_binary_trees(size))


def steps(size, rank, count, itemsize):
    """The plan of :func:`.tree.steps` over the two trees."""
    return tree.steps(size, rank, count, itemsize, _trees(size))


def allreduce(coll, sendbuf, recvbuf):
    engine.run(coll, steps, sendbuf, recvbuf)


def bind(coll, count, dtype):
    return engine.bound(coll, steps, count, dtype)


def _edges(size):
    return [np.array([pair for level in t.levels for pair in level], dtype=np.int64).reshape(-1, 2)
            for t in _trees(size)]


def schedule(model, m):
    """Each tree on M/2 in S segments, pipelined: S + 2H - 1 periods (H the taller tree's
    height), in each every edge of both trees carrying a segment both ways."""
    return model.pipelined(("dbtree",), _edges(model.n), m / 2, SEGMENT_BYTES)


ALGORITHM = Algorithm("dbtree", allreduce, schedule=schedule, bind=bind, steps=steps)
