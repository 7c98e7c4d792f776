"""The registry: every all-reduce algorithm's record (:class:`.algorithm.Algorithm`), the only list of them.

Adding an algorithm is one module that ends with its record plus one line here; the entry point
(:mod:`.collectives`), ``auto``'s candidates (:mod:`.auto`, a selector over this registry, not in
it), the cost model (:mod:`.costs`), the benchmark's ``--algo`` and its tools read it.
:data:`REGISTERED` is the registry's own; ``algorithms.ALGORITHMS`` is every name ``algorithm=``
takes, these and ``auto``.
"""

from .catalog import bamring, double_tree, dring, hier, native, oneshot, ps, rabenseifner, recursive_doubling, ring, tree, twoshot

#: name -> :class:`.algorithm.Algorithm`, in the order the benchmark lists them
REGISTERED = {algorithm.name: algorithm for algorithm in (
    ps.ALGORITHM,
    ring.ALGORITHM,
    bamring.ALGORITHM,
    dring.ALGORITHM,
    tree.built_by("tree", "binomial"),
    tree.built_by("bamtree", "bam"),
    tree.built_by("kmtree", "km"),
    double_tree.ALGORITHM,
    recursive_doubling.ALGORITHM,
    rabenseifner.ALGORITHM,
    hier.ALGORITHM,
    oneshot.ALGORITHM,
    twoshot.ALGORITHM,
    native.ALGORITHM,
)}
