"""The registry: algorithm name -> ``run(coll, sendbuf, recvbuf)``.

Adding an algorithm is one module with such a function plus one line here.
A function with a ``tree_method`` attribute also takes the ``topology.Tree`` to run,
built by that ``topology.build_tree`` method unless the caller passes one. A function with
a ``prepare(size, tree, bandwidth, name)`` attribute checks those arguments itself, and what
it returns, unless None, is passed on as a fourth argument (with a ``digest()`` the ranks agree on).
"""

from . import double_tree, hier, ps, recursive_doubling, ring, tree

ALGORITHMS = {
    "ps": ps.allreduce,
    "ring": ring.allreduce,
    "tree": tree.built_by("binomial"),
    "bamtree": tree.built_by("bam"),
    "kmtree": tree.built_by("km"),
    "dbtree": double_tree.allreduce,
    "rd": recursive_doubling.allreduce,
    "hier": hier.allreduce,
}
