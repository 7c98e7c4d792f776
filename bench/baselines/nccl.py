"""The ``nccl`` baseline: NCCL's own collectives through CuPy (``--device gpu``, one GPU per rank);
and ``nccl:ALGO/PROTO``, NCCL told its algorithm and protocol.

``--algo nccl:ALGO/PROTO`` runs NCCL told to use algorithm ALGO with protocol PROTO:
``python -m bench`` sets ``NCCL_ALGO`` and ``NCCL_PROTO`` before NCCL starts
(:meth:`NcclBaseline.environment`), one pair per run. NCCL reads both when a communicator is
made, and it may refuse a pair that cannot run on the machine (NVLS without NVLink SHARP,
CollNet without a CollNet network): it then says so with ``NCCL_DEBUG=WARN`` and runs its own
choice. The tuner file that makes NCCL follow the fastest pair per size is ``python -m bench
nccl-tuning``'s (:mod:`bench.tools.nccl_tuning`). Nothing here imports CuPy unless NCCL runs.
"""


import os

from plumbing.ending import raise_together

from .base import Baseline, Unavailable
from .mpi import algo_entries

PREFIX = "nccl:"
#: the tuner CSV's algorithm names -> NCCL_ALGO's, in NCCL's order (NCCL_ALGO_TREE = 0 ...)
NCCL_ALGOS = {"tree": "Tree", "ring": "Ring", "collnet_direct": "CollNetDirect", "collnet_chain": "CollNetChain",
              "nvls": "NVLS", "nvls_tree": "NVLSTree", "pat": "PAT"}
#: the tuner CSV's protocol names -> NCCL_PROTO's, in NCCL's order (NCCL_PROTO_LL = 0 ...)
PROTOCOLS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
NAMES = tuple(f"{PREFIX}{a}/{p}" for a in NCCL_ALGOS for p in PROTOCOLS)
def split(name):
    """``(algorithm, protocol)`` of ``nccl:ALGO/PROTO``, or None when it is not one of :data:`NAMES`."""
    if name not in NAMES:
        return None
    algorithm, protocol = name[len(PREFIX):].split("/")
    return algorithm, protocol


def environment(name):
    """The variables that force ``nccl:ALGO/PROTO``."""
    algorithm, protocol = split(name)
    return {"NCCL_ALGO": NCCL_ALGOS[algorithm], "NCCL_PROTO": PROTOCOLS[protocol]}


def environment_for(argv, env):
    """The variables a run of ``argv`` needs, set before NCCL starts, or a problem in words."""
    names = algo_entries(argv, PREFIX)
    if not names:
        return {}
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        return (f"unknown NCCL algorithm/protocol {', '.join(unknown)}: nccl:ALGO/PROTO with ALGO one of "
                f"{', '.join(NCCL_ALGOS)} and PROTO one of {', '.join(PROTOCOLS)}")
    if len(set(names)) > 1:
        return (f"one nccl:ALGO/PROTO per run ({', '.join(dict.fromkeys(names))} given): NCCL reads NCCL_ALGO and "
                "NCCL_PROTO when its communicator is made")
    wanted = environment(names[0])
    clashes = [f"{k}={env[k]}" for k, v in wanted.items() if env.get(k, v) != v]
    if clashes:
        return f"--algo {names[0]} sets {', '.join(f'{k}={v}' for k, v in wanted.items())}, but {', '.join(clashes)} is set"
    return wanted


class NcclBaseline(Baseline):
    """NCCL's own collectives (``cupy.cuda.nccl``), one communicator over every rank. Needs one GPU
    per rank: ranks sharing a GPU cannot form an NCCL communicator."""

    family = "nccl"
    help = (f"nccl (NCCL, --device gpu; nccl:ALGO/PROTO: NCCL told its algorithm ({','.join(NCCL_ALGOS)}) and "
            f"protocol ({','.join(PROTOCOLS)}), one pair per run)")
    _OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN", "avg": "NCCL_AVG"}
    _TYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
              "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16",
              "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}

    def names(self, collective):
        return ["nccl", *NAMES]

    def shown(self, collective):
        return ["nccl", f"{PREFIX}ALGO/PROTO"]

    def in_all(self, name, args):
        return name == "nccl" and args.device == "gpu"

    def environment(self, argv, env):
        return environment_for(argv, env)

    def check(self, args, chosen):
        forced = [a for a in chosen if a.startswith(PREFIX)]
        if forced and (len(set(forced)) > 1 or "nccl" in chosen
                       or any(os.environ.get(k) != v for k, v in environment(forced[0]).items())):
            listed = dict.fromkeys(["nccl", *forced] if "nccl" in chosen else forced)
            return (f"--algo {','.join(listed)}: one nccl:ALGO/PROTO per run, alone among the NCCL runs, through "
                    "python -m bench, which sets NCCL_ALGO and NCCL_PROTO before NCCL starts")
        if chosen and args.device != "gpu":
            return f"--algo {chosen[0]} needs --device gpu"
        return None

    def start(self, comm):
        from mpi4py import MPI  # once MPI runs: this module is read before MPI starts (module docstring)

        problem, count = None, 0
        try:
            import cupy
            from cupy.cuda import nccl

            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # ImportError, CUDA driver errors
            problem = f"--algo nccl needs CuPy with NCCL and a GPU: {exc}"
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        sharing = local.Get_size() > count
        local.Free()
        if problem is None and sharing:
            problem = f"--algo nccl needs one GPU per rank, but {count} GPU(s) serve more ranks on one node"
        raise_together(comm, problem, Unavailable)
        uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        self.nccl, self.cupy, self.size = nccl, cupy, comm.Get_size()
        self.comm = nccl.NcclCommunicator(comm.Get_size(), comm.bcast(uid), comm.Get_rank())

    def runner(self, spec, name, comm, op):
        collective, nccl, stream = spec.name, self.nccl, self.cupy.cuda.get_current_stream()

        def dtype_of(buf):
            found = self._TYPES.get(buf.dtype.name)
            if found is None:
                raise Unavailable(f"NCCL has no {buf.dtype.name}")
            return getattr(nccl, found)

        def run(send, recv, check=False):
            out = recv
            if collective == "allreduce":
                self.comm.allReduce(send.data.ptr, recv.data.ptr, send.size, dtype_of(send),
                                    getattr(nccl, self._OPS[op]), stream.ptr)
            elif collective == "reducescatter":
                per = send.size // self.size
                out = send[:per] if recv is send else recv
                self.comm.reduceScatter(send.data.ptr, out.data.ptr, per, dtype_of(send),
                                        getattr(nccl, self._OPS[op]), stream.ptr)
            else:
                per = recv.size // self.size
                src = recv[self.comm.rank_id() * per:] if recv is send else send
                self.comm.allGather(src.data.ptr, recv.data.ptr, per, dtype_of(recv), stream.ptr)
            stream.synchronize()
            return out
        return run

    def transport(self, name, xp):
        if name.startswith(PREFIX):
            return "NCCL told " + " ".join(f"{k}={os.environ.get(k)}" for k in ("NCCL_ALGO", "NCCL_PROTO"))
        return "NCCL"
