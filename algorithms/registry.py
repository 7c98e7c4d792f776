"""The registry: algorithm name -> ``run(coll, sendbuf, recvbuf)``.

Adding an algorithm is one module with such a function plus one line here.
A function with ``uses_tree = True`` also takes ``tree=`` (a ``topology.Tree``).
"""

from . import ps, ring, tree

ALGORITHMS = {
    "ps": ps.allreduce,
    "ring": ring.allreduce,
    "tree": tree.allreduce,
}
