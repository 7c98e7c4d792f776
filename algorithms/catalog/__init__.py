"""The algorithms, one module each: each says how to build its plan, the steps every rank takes
(:mod:`algorithms.runtime.plan`), and declares its record (:class:`algorithms.algorithm.Algorithm`);
``algorithms/registry.py`` lists them. ``oneshot`` and ``twoshot`` post rounds into the node's
boxes instead, and ``native`` calls the MPI library's own all-reduce."""
