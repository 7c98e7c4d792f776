"""Ending an MPI job together: an error or a signal on any rank ends every rank within seconds.

MPI alone does not. A rank that raises leaves through ``MPI_Finalize``, which waits for
peers that wait in their next collective for it; and Python runs a signal handler only
between bytecodes, so Ctrl-C never reaches a rank blocked inside an MPI call. Under
:func:`run_together`:

* an uncaught exception prints one line, ``PROG: rank R: Type: message (file:line)``, and
  calls ``MPI_Abort`` with exit code 1;
* SIGINT or SIGTERM (Ctrl-C, ``scancel``, a time limit) prints one line and ends the job with
  128 + the signal's number (130, 143), from a thread woken by :func:`signal.set_wakeup_fd`,
  which the C-level handler writes to even while the main thread waits in MPI;
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

Which thread ends the job. The suite runs MPI at ``MPI_THREAD_SINGLE`` (:data:`THREAD_LEVEL`,
:func:`ask_thread_level`), where only the main thread may call MPI. The main thread calls
``MPI_Abort`` itself (an uncaught exception) at every level; another thread (the signal thread,
the ``-T`` timer) calls it only at ``MPI_THREAD_MULTIPLE``. Below that, the thread hands the
end to the main thread: it interrupts it with SIGINT, whose handler here ends the job the
next time the main thread runs Python (after the :func:`uncut` section it is in), and so does
any wait for the end in the main thread. When the main thread does not take it within
:data:`HANDOVER` seconds (it waits inside a long MPI call, or hangs there), the thread prints
the line and ends this process alone with the code (``os._exit``); the launcher then ends the
other ranks (mpiexec and srun kill them when a rank exits without ``MPI_Finalize``; the jobs'
``srun`` runs with ``--kill-on-bad-exit``), and its own exit status is the launcher's choice
(docs/benchmark.md says what each launcher reports).
"""

import contextlib
import os
import signal
import sys
import threading
import time
import traceback

import mpi4py

from .launcher import world_rank

GRACE = 1.0  # seconds a rank other than 0 waits before it aborts the job itself
FORWARD = 0.2  # seconds between the line and the abort, for the launcher to forward the line
UNCUT_WAIT = 2.0  # seconds the end waits for a section inside uncut() to finish
HANDOVER = 1.0  # seconds a thread that may not call MPI waits for the main thread to end the job
SIGNALS = (signal.SIGINT, signal.SIGTERM)
THREAD_LEVEL = "single"  # what the suite's entry points ask MPI_Init for: what a C program's MPI_Init gets

_ending = threading.Lock()  # held once an end is under way in this process
_last = threading.Lock()  # held by the thread that prints the line and ends the process
_uncut = threading.RLock()
_request = None  # (code, message): the end a thread handed to the main thread
_main_uncut = 0  # how deep the main thread is in uncut() sections


def ask_thread_level(level=THREAD_LEVEL):
    """Have ``MPI_Init`` ask for ``level`` (a name of ``mpi4py.rc.thread_level``: "single",
    "funneled", "serialized", "multiple"); call before ``mpi4py.MPI`` is imported, when MPI
    starts. Afterwards it changes nothing."""
    mpi4py.rc.thread_level = level


def thread_level_name(level=None):
    """``"MPI_THREAD_SINGLE"`` and the like: the name of ``level`` (an ``MPI.THREAD_*`` value;
    None: the level MPI runs at), or None before MPI starts."""
    mpi = sys.modules.get("mpi4py.MPI")
    if level is None:
        if _mpi() is None:
            return None
        level = mpi.Query_thread()  # callable from any thread
    names = {getattr(mpi, f"THREAD_{n}"): f"MPI_THREAD_{n}" for n in ("SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE")}
    return names.get(level, str(level))


@contextlib.contextmanager
def uncut():
    """A section that this process's own end of the job waits for (see the module docstring);
    once an end is under way, none starts: the caller waits for the abort (the main thread
    ends the job itself when a thread handed the end to it)."""
    global _main_uncut
    if _ending.locked():
        _wait_for_the_end()
    main = threading.current_thread() is threading.main_thread()
    with _uncut:
        _main_uncut += main
        try:
            yield
        finally:
            _main_uncut -= main
            if main and not _main_uncut and _request is not None:
                _take_over()


def _wait_for_the_end():
    """Wait for this process's end; in the main thread, end the job when a thread hands it over."""
    while True:
        if _request is not None and threading.current_thread() is threading.main_thread():
            _take_over()
        time.sleep(0.05)


def _mpi():
    """mpi4py's MPI module when MPI is initialized and not yet finalized, else None."""
    module = sys.modules.get("mpi4py.MPI")
    if module is None or not module.Is_initialized() or module.Is_finalized():
        return None
    return module


def _may_call_mpi():
    """Whether this thread may call MPI: the main thread, or any at MPI_THREAD_MULTIPLE."""
    mpi = _mpi()
    return threading.current_thread() is threading.main_thread() or mpi.Query_thread() == mpi.THREAD_MULTIPLE


def rank():
    """This process's rank in MPI_COMM_WORLD (from the launcher's environment before MPI_Init,
    and in a thread that may not call MPI)."""
    mpi = _mpi()
    if mpi is not None and _may_call_mpi():
        return mpi.COMM_WORLD.Get_rank()
    return world_rank()


def end_job(code, message):
    """Print ``message`` (one line, stderr) and end every rank with exit ``code``; never returns.

    The first caller in a process wins; a second (the main thread while the signal thread
    is ending the job, say) waits for the end. A thread that may not call MPI hands the end to
    the main thread, and ends this process alone after :data:`HANDOVER` seconds (see the
    module docstring)."""
    if not _ending.acquire(blocking=False):
        _wait_for_the_end()
    if rank() != 0:
        time.sleep(GRACE)  # rank 0, failing alike, ends the job first and alone says why
    if _mpi() is None or _may_call_mpi():
        _finish(code, message, abort=True)
    _hand_over(code, message)


def _hand_over(code, message):
    """A thread that may not call MPI: ask the main thread to end the job; end this process
    alone if it does not within HANDOVER seconds."""
    global _request
    _request = (code, message)
    if signal.getsignal(signal.SIGINT) is _on_signal:  # interrupts a sleep or a read, not an MPI call
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    deadline = time.monotonic() + HANDOVER
    while time.monotonic() < deadline and not _last.locked():
        time.sleep(0.01)
    _finish(code, message, abort=False)


def _take_over():
    """The main thread: end the job as a thread asked (:func:`_hand_over`)."""
    _finish(*_request, abort=True)


def _finish(code, message, abort):
    """Print the line and end: ``MPI_Abort`` where ``abort`` and MPI runs, else ``os._exit``.
    Only one thread gets here; another waits for the end."""
    if not _last.acquire(blocking=False):
        while True:
            time.sleep(3600)
    try:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stream, or a write the handler interrupted: end all the same
        pass
    time.sleep(FORWARD)  # an abort can overtake the line on its way through the launcher
    _uncut.acquire(timeout=UNCUT_WAIT)
    mpi = _mpi()
    if abort and mpi is not None:
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


def _on_signal(signum, frame):
    """The Python-level handler (main thread, between bytecodes): the signal thread acts on the
    signal; this one takes over an end it handed over, unless inside an uncut() section, whose
    end takes it over instead."""
    if _request is not None and not _main_uncut and not _last.locked():
        _take_over()


def watch_signals(prog):
    """End the job on SIGINT and SIGTERM, even while the main thread waits in MPI (main thread only)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for number in SIGNALS:
        signal.signal(number, _on_signal)
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
