"""The sweep, ``mpiexec -n N python -m bench``: its command line (:mod:`.options`), what each
collective measures (:mod:`.collectives`), the timing loop (:mod:`.timing`), the checks of the
results (:mod:`.check`) and of what fits before the first size (:mod:`.memory`, :mod:`.startup`),
the machine it ran on (:mod:`.machine`, :mod:`.device`, :mod:`.pages`), and the sweep itself
(:mod:`.sweep`)."""
