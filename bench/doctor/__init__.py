"""``python -m bench doctor``: the checklist for a low busbw, run on the job's own ranks.

Every rank gathers what it can see of itself (:mod:`.facts`); rank 0 runs the checks over
all of it and prints one :class:`.finding.Finding` per problem, worst first, each with the
ranks and nodes it concerns, its evidence, what it costs and the fix:

* :mod:`.settings`: variables left over that switch off fast paths or force slow ones (NCCL,
  MPICH, libfabric, Open MPI, UCX, the suite's ``ALLREDUCE_*``, ``CUDA_VISIBLE_DEVICES``,
  ``OMP_NUM_THREADS``), and any such variable that differs between ranks;
* :mod:`.binding`: ranks not bound, sharing a core or two hyperthreads of one, more ranks than
  cores, a rank's cores on a NUMA node other than its NIC's or GPU's;
* :mod:`.interfaces`: the interface that carries the traffic to each peer node against the
  fastest one that reaches it, both measured;
* :mod:`.host`: ``/dev/shm`` against what the sweep needs, transparent huge pages, the CPU
  frequency governor, and on GPUs clock events, persistence mode, peer access and PCIe links;
* :mod:`.measured`: a short probe and a small sweep, busbw against the cost model and the
  lower bound of the probed links, and the probe's health report.

What a check cannot see here it says, as "not checked: ... (why)".
"""
