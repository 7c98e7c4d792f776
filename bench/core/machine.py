"""What a result was measured on: machine, MPI library, commit, the settings that matter."""

import os
import platform
import socket
import subprocess
import sys

import numpy
from mpi4py import MPI

from algorithms.ops import kernels
from algorithms.runtime.transports.pages import thp_mode
from plumbing.ending import thread_level_name
from plumbing.shm import free_bytes, mib, total_bytes
from topology.machine import cpu_name, crowding, node_numbers

from ..formats.results import now


def relevant_env():
    """The settings that change what is measured (malloc tuning, transport, MPICH and UCX knobs)."""
    names = sorted(k for k in os.environ if k.startswith(("MALLOC_", "ALLREDUCE_", "MPIR_CVAR_", "UCX_", "OMP_")))
    return " ".join(f"{k}={os.environ[k]}" for k in names) or "(none set)"


def commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def shm_text():
    """``/dev/shm``'s size and free space ("64.0 MiB, 52.3 MiB free"), or "none"."""
    total = total_bytes()
    return "none" if total is None else f"{mib(total)}, {mib(free_bytes() or 0)} free"


def describe():
    """A dict for results files: host, CPU, cores, Python, MPI library, commit, the settings
    that matter (environment; transparent huge pages, which set the speed of MPI's kernel copy:
    `algorithms.runtime.transports.pages`; the size of /dev/shm, which holds the shared windows; the kernel
    that reduces each dtype on the CPU: `algorithms.ops.kernels`)."""
    return {
        "host": socket.gethostname(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "thread_level": thread_level_name(),  # what MPI_Init gave: MPI_THREAD_SINGLE, or more where a tool asked
        "commit": commit(),
        "env": relevant_env(),
        "transparent_hugepages": thp_mode(),
        "dev_shm": shm_text(),
        "kernels": kernels(),
    }


def oversubscription(comm):
    """"R ranks on C cores of HOST" where some machine has more ranks than cores (:func:`crowding`),
    else None (collective)."""
    found = crowding(comm, 1)
    return found and f"{found[0]} ranks on {found[1]} cores of {found[2]}"


def results_header(tool, version=None, comm=None, argv=None, ranks=None):
    """The header every results file a tool writes starts with: which ``benchmark`` (``tool``) of
    which ``version`` wrote it, the ``command``, the ``date`` (:func:`now`), the ``machine``
    (:func:`describe`: host, MPI library, its thread level, commit, settings), the ``ranks`` and
    ``nodes``, and whether the ranks outnumbered the cores (``oversubscribed``: the
    :func:`oversubscription` text, else None). Collective over ``comm`` where given; without it,
    ``ranks`` processes on this machine (a tool that starts its own)."""
    argv = sys.argv[1:] if argv is None else argv
    header = {"benchmark": tool, "version": version, "command": " ".join(["python -m bench", *argv]),
              "date": now(), "machine": describe()}
    if comm is not None:
        header.update(ranks=comm.Get_size(), nodes=len(set(node_numbers(comm))), oversubscribed=oversubscription(comm))
    else:
        cores = len(os.sched_getaffinity(0))
        header.update(ranks=ranks, nodes=1, oversubscribed=(f"{ranks} ranks on {cores} cores of "
                                                            f"{socket.gethostname()}" if ranks and ranks > cores
                                                            else None))
    return header


def tuning_path(comm):
    """Where ``python -m bench tune`` writes the tuning table of ``comm`` by default:
    ``results/tuning-<host>-<N>r.json`` (``<host>-<K>nodes`` when the ranks span K nodes; collective)."""
    nodes = len(set(node_numbers(comm)))
    host = socket.gethostname() if nodes == 1 else f"{socket.gethostname()}-{nodes}nodes"
    return os.path.join("results", f"tuning-{host}-{comm.Get_size()}r.json")
