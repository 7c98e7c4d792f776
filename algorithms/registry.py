"""The registry: algorithm name -> ``run(coll, sendbuf, recvbuf)``, the only list of the algorithms.

Adding an algorithm is one module with such a function plus one line here; the entry point
(:mod:`.collectives`), ``auto``'s candidates (:mod:`.auto`, a selector over this registry, not
in it), the cost model (:mod:`.costs`), the benchmark's ``--algo`` and its tools read it.
A function with a ``tree_method`` attribute also takes the ``topology.Tree`` to run,
built by that ``topology.build_tree`` method unless the caller passes one. A function with
a ``prepare(size, tree, bandwidth, name)`` attribute checks those arguments itself, and what
it returns, unless None, is passed on as a fourth argument (with a ``digest()`` the ranks agree on);
its ``needs_bandwidth()``, when it has one, says whether it needs ``bandwidth=`` as things stand,
``accepts_bandwidth`` that it uses one where given (the benchmark then passes its ``--topology``),
and ``needs_plan`` that it never runs without what ``prepare`` returns. A ``bind(coll, count, dtype)``
attribute returns ``run(sendbuf, recvbuf)`` for vectors of that shape with what every such call
repeats done once; the entry point keeps one per shape and calls it on the repeats. A
``describe(private, transport)`` attribute says in words what carries the algorithm on a
communicator, given the transport's own words (:func:`.collectives.transport_in_use`;
collective: it may make what the algorithm keeps there). ``by_name_only`` marks one that the
benchmark's ``--algo all`` leaves out (native MPI through our entry point), ``one_node_only``
one that runs another algorithm across nodes (so ``auto`` does not choose it there), and
``lacks(dtype)`` says why it cannot reduce a dtype (native MPI: bfloat16 and fp8). A
``schedule(model, nbytes)`` attribute says how it runs, as phases of concurrent transfers, for
the cost model (:mod:`topology.model.model`); without one it is not modelled.
"""

from . import bamring, double_tree, dring, hier, native, oneshot, ps, rabenseifner, recursive_doubling, ring, tree, twoshot

ALGORITHMS = {
    "ps": ps.allreduce,
    "ring": ring.allreduce,
    "bamring": bamring.allreduce,
    "dring": dring.allreduce,
    "tree": tree.built_by("binomial"),
    "bamtree": tree.built_by("bam"),
    "kmtree": tree.built_by("km"),
    "dbtree": double_tree.allreduce,
    "rd": recursive_doubling.allreduce,
    "rabenseifner": rabenseifner.allreduce,
    "hier": hier.allreduce,
    "oneshot": oneshot.allreduce,
    "twoshot": twoshot.allreduce,
    "native": native.allreduce,
}


def needs_bandwidth(name):
    """Whether algorithm ``name`` builds what it runs on from a bandwidth matrix (``bandwidth=``):
    the matched trees, bamring, and hier with ALLREDUCE_HIER_ACROSS=bamtree."""
    run = ALGORITHMS.get(name)  # auto, not in the registry, needs none
    method = getattr(run, "tree_method", None)
    if method is not None:
        return method != "binomial"
    wants = getattr(run, "needs_bandwidth", None)
    return bool(wants and wants())
