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


def local_facts():
    """``(problem, PCI bus id)`` of this rank: why it cannot run NCCL (text; None where it can),
    and the bus id of its GPU (None where it has none). CuPy imports ``cupy.cuda.nccl`` even
    without NCCL's library, saying so only in ``available``: that is checked here, on every
    rank, not found out by rank 0 alone while the others wait."""
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception as exc:  # ImportError, CUDA driver errors
        return f"--algo nccl needs CuPy with NCCL and a GPU: {type(exc).__name__}: {exc}", None
    if not getattr(nccl, "available", False) or not hasattr(nccl, "get_unique_id"):
        return ("--algo nccl: CuPy cannot load NCCL's library (libnccl.so.2; pip install nvidia-nccl-cu12 or "
                "nvidia-nccl-cu13, as CuPy's CUDA version)"), None
    try:
        return None, cupy.cuda.runtime.deviceGetPCIBusId(cupy.cuda.Device().id)
    except Exception as exc:  # CUDA driver errors
        return f"--algo nccl needs a GPU: {type(exc).__name__}: {exc}", None


def judge(comm, problem, bus_id):
    """Raise :class:`Unavailable` on every rank of ``comm`` with one message when any rank has a
    ``problem``, or when two ranks of one node drive the same GPU (the same PCI ``bus_id``: NCCL
    puts no two ranks of a communicator on one GPU). The bus ids, not each rank's count of GPUs,
    tell: a rank that sees one GPU (``CUDA_VISIBLE_DEVICES`` per task, Slurm's
    ``--gpus-per-task=1``) has its own. Collective."""
    from topology.machine import node_comm  # once MPI runs: this module is read before MPI starts (module docstring)

    node = node_comm(comm)
    try:
        members = node.allgather((comm.Get_rank(), bus_id))
    finally:
        node.Free()
    if problem is None:
        ranks_on = {}
        for rank, bus in members:
            if bus is not None:
                ranks_on.setdefault(bus, []).append(rank)
        shared = next(((bus, ranks) for bus, ranks in ranks_on.items() if len(ranks) > 1), None)
        if shared is not None:
            bus, ranks = shared
            problem = (f"--algo nccl needs one GPU per rank: ranks {', '.join(map(str, ranks))} drive the GPU at PCI "
                       f"{bus} (NCCL refuses two ranks of one communicator on one GPU)")
    raise_together(comm, problem, Unavailable)


def in_place_chunk(whole, rank, count):
    """Rank ``rank``'s chunk of ``count`` elements of the whole vector ``whole``: where NCCL's in-place
    reduce-scatter leaves its result and where its in-place all-gather finds its input
    (``recvbuff == sendbuff + rank * recvcount``)."""
    return whole[rank * count:(rank + 1) * count]


class NcclBaseline(Baseline):
    """NCCL's own collectives (``cupy.cuda.nccl``), one communicator over every rank. Needs one GPU
    per rank: ranks sharing a GPU cannot form an NCCL communicator. Calls are enqueued on CuPy's
    current stream and timed as ours are (:func:`bench.core.timing.rule`)."""

    family = "nccl"
    help = (f"nccl (NCCL, --device gpu; nccl:ALGO/PROTO: NCCL told its algorithm ({','.join(NCCL_ALGOS)}) and "
            f"protocol ({','.join(PROTOCOLS)}), one pair per run)")
    _OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN", "avg": "NCCL_AVG"}
    #: NumPy's name -> ncclDataType_t (NCCL 2.10+; bfloat16 is CuPy 14's ml_dtypes.bfloat16 on the device)
    TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7,
             "float64": 8, "bfloat16": 9}
    comm = None

    def names(self, collective):
        return ["nccl", *NAMES]

    def shown(self, collective):
        return ["nccl", f"{PREFIX}ALGO/PROTO"]

    def in_all(self, name, args):
        return name == "nccl" and args.device == "gpu"

    def environment(self, argv, env):
        return environment_for(argv, env)

    def lacks(self, name, dtype):
        if dtype.name in self.TYPES:
            return None
        return f"NCCL has no {dtype.name} type; it reduces {', '.join(self.TYPES)}"

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
        """Every rank's facts judged together (:func:`judge`), then NCCL's communicator. A failure
        inside NCCL's own initialisation on one rank leaves the others in it, as in nccl-tests;
        ``-T`` ends such a run."""
        problem, bus_id = local_facts()
        judge(comm, problem, bus_id)
        import cupy
        from cupy.cuda import nccl

        uid = problem = None
        if comm.Get_rank() == 0:
            try:
                uid = nccl.get_unique_id()
            except Exception as exc:  # NcclError
                problem = f"NCCL: {exc}"
        raise_together(comm, problem, Unavailable)
        self.nccl, self.cupy, self.rank, self.size = nccl, cupy, comm.Get_rank(), comm.Get_size()
        self.comm = nccl.NcclCommunicator(self.size, comm.bcast(uid), self.rank)

    def runner(self, spec, name, comm, op):
        """``run(send, recv, check=False)``: the call enqueued on the current stream, which only a
        check (``check=True``) waits for; in place NCCL's way (:func:`in_place_chunk`)."""
        collective, cupy, rank, size = spec.name, self.cupy, self.rank, self.size
        reduce_op = self._OPS.get(op) and getattr(self.nccl, self._OPS[op])

        def run(send, recv, check=False):
            stream = cupy.cuda.get_current_stream()
            out = recv
            if collective == "allreduce":
                self.comm.allReduce(send.data.ptr, recv.data.ptr, send.size, self.TYPES[send.dtype.name], reduce_op,
                                    stream.ptr)
            elif collective == "reducescatter":
                per = send.size // size
                out = in_place_chunk(send, rank, per) if recv is send else recv
                self.comm.reduceScatter(send.data.ptr, out.data.ptr, per, self.TYPES[send.dtype.name], reduce_op,
                                        stream.ptr)
            else:
                per = recv.size // size
                source = in_place_chunk(recv, rank, per) if recv is send else send
                self.comm.allGather(source.data.ptr, recv.data.ptr, per, self.TYPES[recv.dtype.name], stream.ptr)
            if check:
                stream.synchronize()
            return out
        return run

    def transport(self, name, xp):
        if name.startswith(PREFIX):
            return "NCCL told " + " ".join(f"{k}={os.environ.get(k)}" for k in ("NCCL_ALGO", "NCCL_PROTO"))
        return "NCCL"

    def close(self):
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
