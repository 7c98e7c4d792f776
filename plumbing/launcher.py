"""What the launcher tells each rank before ``MPI_Init``: its place in the job and on its node.

MPICH's Hydra, Open MPI's ``mpirun``, PMIx and Slurm's ``srun`` each set their own variables;
this is the one table of them, read before MPI starts (sizing ``/dev/shm``) and by threads that
may not call MPI (ending a job). Slurm writes per-node counts as ``4(x2)`` or ``4,2``; the first
number is this node's.
"""

import os

#: this rank's place in the job
WORLD_RANK = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
#: the ranks on this node, and this rank's place among them
LOCAL_SIZE = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
LOCAL_RANK = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "SLURM_LOCALID")
#: set in every rank a launcher starts (a process without any of them runs alone: singleton MPI)
LAUNCHED = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_ID", "MPI_LOCALRANKID")


def number(names, default, env=os.environ):
    """The first of ``names`` set to a number in ``env`` (Slurm's ``4(x2)`` read as 4), else ``default``."""
    for name in names:
        digits = env.get(name, "").split("(")[0].split(",")[0]
        if digits.isdigit():
            return int(digits)
    return default


def world_rank(env=os.environ):
    """This rank's place in the job (0 where no launcher says)."""
    return number(WORLD_RANK, 0, env)


def local_rank(env=os.environ):
    """This rank's place among the ranks of its node (0 where no launcher says)."""
    return number(LOCAL_RANK, 0, env)


def local_size(env=os.environ):
    """The ranks on this node (1 where no launcher says)."""
    return number(LOCAL_SIZE, 1, env)


def launched(env=os.environ):
    """Whether a launcher (mpiexec, mpirun, srun) started this process."""
    return any(name in env for name in LAUNCHED)
