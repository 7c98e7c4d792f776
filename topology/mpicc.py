"""C built against the MPI this process runs: a source file built at first use into a shared
library by the MPI's own ``mpicc``, once per node, kept in one cache and loaded with ctypes, the
one builder of every such library (the ``mpi`` baseline's timed loop, ``bench/probes/mpi_loop.c``;
the lower bound's floor, ``topology/probes/floor.c``).

The compiler is ``$MPICC`` when set (an explicit choice wins), else the ``mpicc`` beside this
Python (the MPI wheel's, next to its ``mpiexec``), else ``mpicc`` on PATH. The library goes
into ``$XDG_CACHE_HOME/allreduce-bench/`` (``~/.cache/allreduce-bench/``), its name keyed by a
hash of the source, the compiler's path and ``MPI_Get_library_version``, written under a
temporary name and renamed, so that a rank never loads half a file; one rank per node builds it
while the others wait. It must link the very libmpi this process loaded (``ldd`` against the
memory map): a second MPI in the process would be one that was never initialized.
"""

import ctypes
import hashlib
import os
import re
import shutil
import secrets
import subprocess
import sys

from plumbing.ending import first_problem

FLAGS = ["-O2", "-shared", "-fPIC"]
LIBMPI = re.compile(r"/libmpi(ch|_abi)?\.so[.\d]*$")  # MPICH's libmpi.so.12 (libmpich, libmpi_abi), Open MPI's .so.40


def compiler():
    """``(path, None)`` of the mpicc to build with, or ``(None, why there is none)``."""
    named = os.environ.get("MPICC")
    if named:
        found = shutil.which(named)
        return (os.path.abspath(found), None) if found else (None, f"no C compiler: MPICC={named} is not an executable")
    beside = os.path.join(os.path.dirname(sys.executable), "mpicc")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpicc")
    if found:
        return found, None
    return None, f"no C compiler: no mpicc beside {sys.executable} nor on PATH (set MPICC)"


def cache_folder():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "allreduce-bench")


def library_file(source, cc, version):
    """Where the library built from ``source`` by ``cc`` for MPI ``version`` is kept."""
    digest = hashlib.sha256()
    with open(source, "rb") as f:
        digest.update(f.read())
    for part in (os.path.realpath(cc), version):
        digest.update(b"\0" + part.encode())
    stem = os.path.splitext(os.path.basename(source))[0]
    return os.path.join(cache_folder(), f"{stem}-{digest.hexdigest()[:16]}.so")


def build(source, cc, target):
    """Compile ``source`` into ``target`` (atomically); None, or what went wrong in one line."""
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    # a name of its own, made by the linker itself (the umask's mode)
    temporary = os.path.join(folder, f".building-{os.getpid()}-{secrets.token_hex(4)}-{os.path.basename(target)}")
    try:
        done = subprocess.run([cc, *FLAGS, "-o", temporary, source], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            detail = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "")
            return f"{cc} could not build {source} (exit {done.returncode}): {detail}"
        os.replace(temporary, target)
        return None
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def loaded_libmpi():
    """The libmpi files this process has mapped (real paths), or None where it cannot tell."""
    try:
        with open("/proc/self/maps") as maps:
            return {os.path.realpath(line.split()[-1]) for line in maps if LIBMPI.search(line.strip())}
    except OSError:
        return None


def linked_libmpi(library):
    """The libmpi files ``ldd`` resolves for ``library`` (real paths; a name it cannot find as
    itself), or None without ``ldd``."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    done = subprocess.run([ldd, library], capture_output=True, text=True, timeout=60)
    found = set()
    for line in done.stdout.splitlines():
        name, _, where = line.strip().partition(" => ")
        if re.match(r"libmpi(ch|_abi)?\.so", name):
            path = where.split(" (")[0].strip()
            found.add(os.path.realpath(path) if path.startswith("/") else f"{name} ({path})")
    return found


def second_mpi(library):
    """Why ``library`` would bring a second MPI into this process (text), else None."""
    loaded, linked = loaded_libmpi(), linked_libmpi(library)
    if not loaded or linked is None:  # no memory map or no ldd here: nothing to compare
        return None
    if not linked or not linked <= loaded:
        return (f"{library} links {', '.join(sorted(linked)) or 'no shared libmpi'}, not {', '.join(sorted(loaded))} "
                "that mpi4py loaded (set MPICC to the mpicc of that MPI)")
    return None


def prepare(source):
    """``(problem, path)``: the library of ``source`` for this MPI, built unless it is cached and
    checked against the libmpi this process loaded."""
    from mpi4py import MPI  # once MPI runs: the baselines are read before MPI starts

    cc, missing = compiler()
    if missing:
        return missing, None
    target = library_file(source, cc, MPI.Get_library_version())
    try:
        problem = None if os.path.exists(target) else build(source, cc, target)
        return problem or second_mpi(target), target
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot build {source} into {os.path.dirname(target)}: {exc}", None


def load(comm, source):
    """``(ctypes.CDLL, None)`` of the library built from ``source``, or ``(None, problem)``, the
    first rank's problem in one line, alike on every rank of ``comm`` (collective). One rank per
    node builds it; the others wait."""
    from .machine import node_comm  # once MPI runs: the baselines import this module before it starts

    local = node_comm(comm)
    try:
        problem, path = local.bcast(prepare(source) if local.Get_rank() == 0 else None, root=0)
    finally:
        local.Free()
    library = None
    if problem is None:
        try:
            library = ctypes.CDLL(path)
        except OSError as exc:
            problem = f"cannot load {path}: {exc}"
    problem = first_problem(comm, problem and " ".join(problem.split()))
    return (None, problem) if problem else (library, None)
