"""The ground floor: what every layer above needs of the process, the node and the files, and
nothing of all-reduce. It imports no other package of the project, and nothing here needs MPI
to have started.

* :mod:`.ending`: an error or a signal on any rank ends every rank within seconds
  (``run_together``), and the thread level MPI is asked for;
* :mod:`.launcher`: the launcher's variables (a rank's place in the job and on its node);
* :mod:`.shm`: what ``MPI_Init`` and our shared memory need of the node's ``/dev/shm``;
* :mod:`.files`: files and pictures written atomically;
* :mod:`.units`: message sizes as nccl-tests writes them (``64K``, ``128M``).
"""
