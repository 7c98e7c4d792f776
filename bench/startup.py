"""What every MPI tool of the bench checks before it measures anything, alike on every rank:
the ``ALLREDUCE_*`` settings (valid, and the same on every rank) and the files it will write.
A problem is one line from rank 0 and exit 2 on every rank, never a traceback or a hang."""

import sys

from algorithms.settings import agree_settings
from topology.files import check_writable


def fail_together(comm, prog, problem):
    """True on every rank when any rank has a ``problem`` (text, else None); rank 0 prints
    the first one, as an argument parser does."""
    found = next((p for p in comm.allgather(problem) if p), None)
    if found and comm.Get_rank() == 0:
        sys.stderr.write(f"{prog}: error: {found}\n")
        sys.stderr.flush()
    return found is not None


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
                problem = f"{path}: cannot write there: {exc.strerror or exc}"
                break
    return fail_together(comm, prog, problem)
