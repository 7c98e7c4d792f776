"""What every MPI tool of the bench checks before it measures anything, alike on every rank:
the ``ALLREDUCE_*`` settings (valid, and the same on every rank), the tuning table that
``algorithm="auto"`` will read, and the files it will write. A problem is one line from rank 0
and exit 2 on every rank, never a traceback or a hang."""

from algorithms.auto import load_table
from algorithms.settings import agree_settings, setting
from plumbing.ending import fail_together
from plumbing.files import cannot_write, check_writable


def tuning_problem():
    """What is wrong with the file ``ALLREDUCE_TUNING_FILE`` names (missing, unreadable, not
    JSON, not a tuning table), or None when it is unset or good."""
    path = setting("ALLREDUCE_TUNING_FILE")
    if not path:
        return None
    try:
        load_table(path)
    except ValueError as exc:
        return f"ALLREDUCE_TUNING_FILE: {exc}"
    return None


def refused(comm, prog, outputs=(), tuning=False):
    """:func:`fail_together` for the settings, for the tuning table where ``tuning`` (the tool
    runs ``auto``) and for ``outputs`` (paths rank 0 will write)."""
    problem = None
    try:
        agree_settings(comm)
    except ValueError as exc:
        problem = str(exc)
    if problem is None and tuning and comm.Get_rank() == 0:
        problem = tuning_problem()
    if problem is None and comm.Get_rank() == 0:
        for path in outputs:
            try:
                check_writable(path)
            except OSError as exc:
                problem = cannot_write(path, exc)
                break
    return fail_together(comm, prog, problem)
