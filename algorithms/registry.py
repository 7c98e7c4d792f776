"""The registry: algorithm name -> ``run(coll, sendbuf, recvbuf)``.

Adding an algorithm is one module with such a function plus one line here.
A function with a ``tree_method`` attribute also takes the ``topology.Tree`` to run,
built by that ``topology.build_tree`` method unless the caller passes one. A function with
a ``prepare(size, tree, bandwidth, name)`` attribute checks those arguments itself, and what
it returns, unless None, is passed on as a fourth argument (with a ``digest()`` the ranks agree on);
its ``needs_bandwidth()``, when it has one, says whether it needs ``bandwidth=`` as things stand,
and ``needs_plan`` that it never runs without what ``prepare`` returns. A ``bind(coll, count, dtype)``
attribute returns ``run(sendbuf, recvbuf)`` for vectors of that shape with what every such call
repeats done once; the entry point keeps one per shape and calls it on the repeats. A
``setup(private)`` attribute makes what the algorithm keeps on a communicator now (collective)
and returns a note for its description (:func:`.collectives.transport_in_use`), or None.
"""

from . import auto, bamring, double_tree, hier, native, oneshot, ps, recursive_doubling, ring, tree

ALGORITHMS = {
    "ps": ps.allreduce,
    "ring": ring.allreduce,
    "bamring": bamring.allreduce,
    "tree": tree.built_by("binomial"),
    "bamtree": tree.built_by("bam"),
    "kmtree": tree.built_by("km"),
    "dbtree": double_tree.allreduce,
    "rd": recursive_doubling.allreduce,
    "hier": hier.allreduce,
    "oneshot": oneshot.allreduce,
    "native": native.allreduce,
    "auto": auto.allreduce,
}


def needs_bandwidth(name):
    """Whether algorithm ``name`` builds what it runs on from a bandwidth matrix (``bandwidth=``):
    the matched trees, bamring, and hier with ALLREDUCE_HIER_ACROSS=bamtree."""
    run = ALGORITHMS[name]
    method = getattr(run, "tree_method", None)
    if method is not None:
        return method != "binomial"
    wants = getattr(run, "needs_bandwidth", None)
    return bool(wants and wants())
