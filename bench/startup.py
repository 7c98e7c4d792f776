"""What every MPI tool of the bench checks before it measures anything, alike on every rank:
the ``ALLREDUCE_*`` settings (valid, and the same on every rank) and the files it will write.
A problem is one line from rank 0 and exit 2 on every rank, never a traceback or a hang."""

from algorithms.ending import fail_together
from algorithms.settings import agree_settings
from topology.files import cannot_write, check_writable


def refused(comm, prog, outputs=()):
    """:func:`fail_together` for the settings and for ``outputs`` (paths rank 0 will write)."""
    problem = None
    try:
        agree_settings(comm)
    except ValueError as exc:
        problem = str(exc)
    if problem is None and comm.Get_rank() == 0:
        for path in outputs:
            try:
                check_writable(path)
            except OSError as exc:
                problem = cannot_write(path, exc)
                break
    return fail_together(comm, prog, problem)
