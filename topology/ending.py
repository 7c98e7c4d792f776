"""Ending an MPI job together: an error or a signal on any rank ends every rank within seconds.

MPI alone does not. A rank that raises leaves through ``MPI_Finalize``, which waits for
peers that wait in their next collective for it; and Python runs a signal handler only
between bytecodes, so Ctrl-C never reaches a rank blocked inside an MPI call. Under
:func:`run_together`:

* an uncaught exception prints one line, ``PROG: rank R: Type: message (file:line)``, and
  calls ``MPI_Abort`` with exit code 1;
* SIGINT or SIGTERM (Ctrl-C, ``scancel``, a time limit) prints one line and calls
  ``MPI_Abort`` with 128 + the signal's number (130, 143), from a thread woken by
  :func:`signal.set_wakeup_fd`, which the C-level handler writes to even while the main
  thread waits in MPI;
* :func:`end_job` does the same for any other reason (the driver's ``-T`` timeout);
* what runs inside :func:`uncut` (a result being printed, logged and saved) finishes before
  this rank ends the job (up to :data:`UNCUT_WAIT` seconds), so its files agree;
* :func:`fail_together` turns a problem found on some ranks before any work into one line
  and exit 2 on every rank (:func:`first_problem`, the same problem on every rank, serves
  those that raise instead).

Rank 0 aborts at once, every other rank after :data:`GRACE` seconds: when all ranks fail
alike (a signal forwarded to every rank, the same error everywhere), rank 0's abort ends the
job first and its line is the one printed. ``SystemExit`` passes through, since exit 2 for
bad arguments is decided alike on every rank. Without MPI initialized the process exits
with the same code instead.
"""

import contextlib
import os
import signal
import sys
import threading
import time
import traceback

GRACE = 1.0  # seconds a rank other than 0 waits before it aborts the job itself
FORWARD = 0.2  # seconds between the line and the abort, for the launcher to forward the line
UNCUT_WAIT = 2.0  # seconds the end waits for a section inside uncut() to finish
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_ending = threading.Lock()
_uncut = threading.RLock()


@contextlib.contextmanager
def uncut():
    """A section that this process's own end of the job waits for (see the module docstring);
    once an end is under way, none starts: the caller waits for the abort."""
    if _ending.locked():
        _wait_for_the_end()
    with _uncut:
        yield


def _wait_for_the_end():
    while True:
        time.sleep(3600)


def _mpi():
    """mpi4py's MPI module when MPI is initialized and not yet finalized, else None."""
    module = sys.modules.get("mpi4py.MPI")
    if module is None or not module.Is_initialized() or module.Is_finalized():
        return None
    return module


def rank():
    """This process's rank in MPI_COMM_WORLD (from the launcher's environment before MPI_Init)."""
    mpi = _mpi()
    if mpi is not None:
        return mpi.COMM_WORLD.Get_rank()
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def end_job(code, message):
    """Print ``message`` (one line, stderr) and end every rank with exit ``code``; never returns.

    The first caller in a process wins; a second (the main thread while the signal thread
    is ending the job, say) waits for the end."""
    if not _ending.acquire(blocking=False):
        _wait_for_the_end()
    if rank() != 0:
        time.sleep(GRACE)  # rank 0, failing alike, ends the job first and alone says why
    try:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    time.sleep(FORWARD)  # an abort can overtake the line on its way through the launcher
    _uncut.acquire(timeout=UNCUT_WAIT)
    mpi = _mpi()
    if mpi is not None:
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder of this package


def describe_exception(exc):
    """``Type: message (file:line)``: the exception and the innermost frame of this project's
    code that it passed (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if os.path.abspath(f.filename).startswith(_ROOT + os.sep)] or frames
    where = f" ({os.path.relpath(ours[-1].filename, _ROOT)}:{ours[-1].lineno})" if ours else ""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


def _watch(read_fd, prog):
    """The signal thread: wait for SIGINT or SIGTERM, then end the job."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        for number in data:
            if number in SIGNALS:
                name = signal.Signals(number).name
                end_job(128 + number, f"{prog}: rank {rank()}: interrupted by {name}; ending every rank")


def _nothing(signum, frame):
    """The Python-level handler: the signal thread acts (this one runs only between bytecodes)."""


def watch_signals(prog):
    """End the job on SIGINT and SIGTERM, even while the main thread waits in MPI (main thread only)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for number in SIGNALS:
        signal.signal(number, _nothing)
    threading.Thread(target=_watch, args=(read_fd, prog), name="end-together", daemon=True).start()


def first_problem(comm, problem):
    """The first rank's ``problem`` (text, else None) on every rank of ``comm`` (collective): what
    makes every rank raise, or return, alike when only some found something wrong."""
    return next((p for p in comm.allgather(problem) if p), None)


def raise_together(comm, problem, error=RuntimeError):
    """Raise ``error(the first rank's problem)`` on every rank of ``comm`` when any rank has a
    ``problem`` (collective)."""
    found = first_problem(comm, problem)
    if found:
        raise error(found)


def fail_together(comm, prog, problem):
    """True on every rank of ``comm`` when any rank has a ``problem`` (text, else None), after
    rank 0 printed the first one as ``PROG: error: ...``: a problem found before any work
    (collective), for every rank to return exit 2 alike."""
    found = first_problem(comm, problem)
    if found and comm.Get_rank() == 0:
        sys.stderr.write(f"{prog}: error: {found}\n")
        sys.stderr.flush()
    return found is not None


def run_together(main, prog):
    """``main()``'s return value, with every rank ending together on an error or a signal."""
    watch_signals(prog)
    try:
        result = main()
    except SystemExit:
        _no_end_under_way()
        raise
    except BaseException as exc:  # noqa: BLE001 - every other way out must end every rank
        end_job(1, f"{prog}: rank {rank()}: {describe_exception(exc)}")
    _no_end_under_way()
    return result


def _no_end_under_way():
    """Return only when no thread is ending the job (else wait for its abort), and keep any
    from starting: a timeout that fired as the last size finished must not end in exit 0.
    A signal from here on ends the process the default way."""
    if not _ending.acquire(blocking=False):
        _wait_for_the_end()
    for number in SIGNALS:
        signal.signal(number, signal.SIG_DFL)
