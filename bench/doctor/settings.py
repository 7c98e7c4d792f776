"""Check 1, leftover settings: variables that switch off a fast path or force a slow one, and
variables that differ between ranks. Each rule cites the library's own documentation of the
variable (docs/troubleshooting.md lists the sources):

* NCCL (NCCL's "Environment Variables" page): ``NCCL_P2P_DISABLE``, ``NCCL_P2P_LEVEL=LOC``,
  ``NCCL_SHM_DISABLE``, ``NCCL_IB_DISABLE``, ``NCCL_SOCKET_IFNAME`` naming only a loopback,
  docker or virtual bridge, a forced ``NCCL_ALGO`` or ``NCCL_PROTO``, ``NCCL_MAX_NCHANNELS``
  (or ``NCCL_MAX_NRINGS``) below 4;
* MPICH (its CVARs, ``mpivars``): ``MPIR_CVAR_NOLOCAL``/``MPIR_CVAR_CH3_NOLOCAL``, which treat
  every rank as on another node, on a node of several ranks; libfabric's ``FI_PROVIDER`` (the
  ``fi_provider`` man page) naming ``sockets``, or a socket provider where an RDMA device is present;
* Open MPI (its ``--mca`` parameters): ``OMPI_MCA_btl`` without (or excluding) its
  shared-memory BTL, ``OMPI_MCA_pml=ob1`` beside an RDMA device, ``OMPI_MCA_btl_tcp_if_include``
  naming only a loopback, docker or virtual bridge;
* UCX (``ucx_info -f``, "UCX_TLS"): a list without a shared-memory transport on a node of
  several ranks, or without an RDMA one beside an RDMA device;
* the suite's ``ALLREDUCE_*`` (:data:`algorithms.settings.WIRE`): a value it refuses, a
  transport other than shared memory within a node, the Python engine, and any other value away
  from its default;
* ``CUDA_VISIBLE_DEVICES`` giving two ranks of a node the same first GPU;
* ``OMP_NUM_THREADS`` unset where PyTorch is installed and the node's ranks, each starting a
  thread per CPU it may run on (PyTorch's default, which follows the rank's binding), would run
  more threads than the node has CPUs.
"""

import re

from algorithms.settings import WIRE

from .finding import Finding, ranks_text

CHECK = "settings"
VIRTUAL = re.compile(r"^(lo|docker|virbr|br-)")  # a loopback, docker's bridges, libvirt's
SHM_TLS = {"all", "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem"}
RDMA_TLS = {"all", "rc", "rc_v", "rc_x", "rc_verbs", "rc_mlx5", "ud", "ud_v", "ud_x", "ud_verbs", "ud_mlx5", "dc",
            "dc_x", "dc_mlx5", "ib"}
#: variables that name this node's interfaces or devices: alike only within a node
PER_NODE = {"FI_TCP_IFACE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "NCCL_IB_HCA",
            "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_btl_tcp_if_exclude", "MPIR_CVAR_CH4_OFI_IFNAME"}
PER_RANK = {"CUDA_VISIBLE_DEVICES"}  # its own check: two ranks of a node on one GPU
UNSET = "unset it (and look for where it is set: a module file, ~/.bashrc, the job script, the container image)"


def _on(value):
    return (value or "").strip().lower() in ("1", "true", "yes", "on", "enable", "enabled")


def _names(value):
    """An interface list's names and whether it excludes them (a leading ``^``)."""
    text = (value or "").strip()
    exclude = text.startswith("^")
    return [n.strip().lstrip("=") for n in text.lstrip("^").split(",") if n.strip()], exclude


def _only_virtual(value):
    names, exclude = _names(value)
    return bool(names) and not exclude and all(VIRTUAL.match(n) for n in names)


def _rdma(facts):
    return any(i.get("rdma") for i in facts["interfaces"])


def _rules(name, value, facts, shared):
    """(severity, title, cost, fix) for one variable of one rank, or None; ``shared``: whether
    the rank's node holds other ranks."""
    v = value.strip()
    if name == "NCCL_P2P_DISABLE" and _on(v) or name == "NCCL_P2P_LEVEL" and v.upper() in ("LOC", "0"):
        return ("high", "NCCL's peer-to-peer transport is off",
                "GPUs of a node exchange through host memory instead of NVLink or PCIe peer copies: about half "
                "the busbw within a node, far less beside NVLink", UNSET)
    if name == "NCCL_SHM_DISABLE" and _on(v):
        return ("medium", "NCCL's shared-memory transport is off",
                "where GPUs of a node cannot reach each other directly, their bytes take the network instead "
                "of host memory", UNSET)
    if name == "NCCL_IB_DISABLE" and _on(v):
        if _rdma(facts):
            return ("high", "NCCL's InfiniBand/RoCE transport is off beside an RDMA device",
                    "NCCL falls back to IP sockets between nodes: a fraction of the RDMA link's rate", UNSET)
        return ("low", "NCCL's InfiniBand/RoCE transport is off",
                "nothing on this node, which has no RDMA device; it will on one that has", UNSET)
    if name in ("NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include") and _only_virtual(v):
        return ("high", f"{name} names only a loopback, docker or virtual bridge",
                "traffic between nodes is sent where it cannot leave the node, or through a virtual bridge: "
                "1-2 GB/s where a fabric gives 50 (or the job fails to connect)",
                f"name the fabric's interface ({name}=ib0, or eth0), or exclude the virtual ones "
                f"({name}=^docker0,lo)")
    if name in ("NCCL_ALGO", "NCCL_PROTO") and v:
        return ("medium", f"{name} forces NCCL's {'algorithm' if name == 'NCCL_ALGO' else 'protocol'}",
                "NCCL's tuner picks per size; forced, small messages take the large-message path or the "
                "reverse (compare with python -m bench --algo nccl:ALGO/PROTO runs)", UNSET)
    if name in ("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS") and v.isdigit() and int(v) < 4:
        return ("medium", f"NCCL limited to {v} channel{'s' if int(v) != 1 else ''}",
                "each channel is one CUDA block on one path: with fewer channels than links, links stay idle "
                "and large messages reach a fraction of the bandwidth", UNSET)
    if name in ("MPIR_CVAR_NOLOCAL", "MPIR_CVAR_CH3_NOLOCAL") and _on(v) and shared:
        return ("high", "MPICH's shared memory is off (every rank treated as on another node)",
                "messages between ranks of a node go through the network module instead of shared memory",
                UNSET)
    if name == "FI_PROVIDER":
        provider = v.lower().split(";")[0]
        if provider in ("tcp", "udp", "sockets", "tcp;ofi_rxm") and _rdma(facts):
            return ("high", f"libfabric forced onto {provider} beside an RDMA device",
                    "bytes between nodes go through the kernel's sockets, not the RDMA device", UNSET)
        if provider == "sockets":
            return ("medium", "libfabric forced onto its sockets provider",
                    "the sockets provider is libfabric's development provider, slower than tcp", "FI_PROVIDER=tcp, or unset it")
    if name == "OMPI_MCA_btl" and shared:
        names, exclude = _names(v)
        if exclude and {"sm", "vader"} & set(names) or not exclude and not {"sm", "vader"} & set(names):
            return ("high", "Open MPI's shared-memory BTL is off",
                    "messages between ranks of a node go through a network BTL instead of shared memory", UNSET)
    if name == "OMPI_MCA_pml" and v == "ob1" and _rdma(facts):
        return ("high", "Open MPI forced onto its ob1 PML beside an RDMA device",
                "InfiniBand is reached through UCX's PML; ob1 sends between nodes over TCP", UNSET)
    if name == "UCX_TLS" and not v.startswith("^"):
        tls = {t.strip().split(":")[0] for t in v.split(",")}
        if shared and not tls & SHM_TLS:
            return ("high", "UCX_TLS leaves out shared memory",
                    "messages UCX carries between ranks of a node go through a network transport", "add sm to UCX_TLS, or unset it")
        if _rdma(facts) and not tls & RDMA_TLS:
            return ("high", "UCX_TLS leaves out the RDMA transports beside an RDMA device",
                    "bytes between nodes go over TCP instead of the RDMA device", "add rc (or ib) to UCX_TLS, or unset it")
    if name in WIRE:
        return _suite(name, v, shared)
    return None


def _suite(name, value, shared):
    try:
        parsed = WIRE[name].parse(name, value)
    except ValueError as exc:
        return ("high", f"{name} is not valid", f"every collective of the suite refuses to run: {exc}", UNSET)
    if parsed == WIRE[name].default:
        return None
    if name == "ALLREDUCE_TRANSPORT" and parsed in ("direct", "staged") and shared:
        return ("high", "the suite's shared-memory transport is off",
                "messages within a node go through MPI: 2-5x slower from 32 KiB on a 2-core VM "
                "(docs/transports.md)", UNSET)
    if name == "ALLREDUCE_ENGINE" and parsed == "python":
        return ("medium", "the suite's compiled engine is off",
                "small messages within a node run step by step in Python (docs/transports.md)", UNSET)
    return ("low", f"{name} set away from its default",
            f"the suite's algorithms run with {name}={value}, not as measured in docs/ with the defaults", UNSET)


def _leftovers(job):
    grouped = {}
    for rank, facts in enumerate(job.ranks):
        shared = len(job.node_of(rank)) > 1
        for name, value in facts["env"].items():
            found = _rules(name, value, facts, shared)
            if found:
                grouped.setdefault((name, value, found), []).append(rank)
    return [Finding(CHECK, title, severity, ranks, f"{name}={value!r}", cost, fix, job.hosts(ranks))
            for (name, value, (severity, title, cost, fix)), ranks in grouped.items()]


def _differing(job):
    found = []
    names = sorted({n for f in job.ranks for n in f["env"]} - PER_RANK)
    for name in names:
        groups = [list(range(len(job.ranks)))] if name not in PER_NODE else job.nodes
        for group in groups:
            values = {}
            for rank in group:
                values.setdefault(job.env(rank, name), []).append(rank)
            if len(values) < 2:
                continue
            evidence = "; ".join(f"{'unset' if v is None else repr(v)} on {ranks_text(rs)}" for v, rs in values.items())
            wire = name in WIRE or name.startswith("NCCL_")
            found.append(Finding(
                CHECK, f"{name} differs between ranks{' of one node' if name in PER_NODE else ''}",
                "high" if wire else "medium", group, evidence,
                "ranks that read different settings cut, route or tune the same messages differently: "
                + ("NCCL can hang, and the suite refuses to run" if wire else "the slowest setting sets the pace"),
                f"set {name} alike for every rank (in the job script, before mpiexec or srun), or unset it",
                job.hosts(group)))
    return found


def _gpu_sharing(job):
    found = []
    for node in job.nodes:
        first = {}
        for rank in node:
            value = job.env(rank, "CUDA_VISIBLE_DEVICES")
            if value and value.split(",")[0].strip() not in ("", "-1"):
                first.setdefault(value.split(",")[0].strip(), []).append(rank)
        for device, ranks in first.items():
            if len(ranks) > 1:
                found.append(Finding(
                    CHECK, f"{len(ranks)} ranks of a node on one GPU", "high", ranks,
                    f"CUDA_VISIBLE_DEVICES gives each of them GPU {device} first "
                    f"({', '.join(repr(job.env(r, 'CUDA_VISIBLE_DEVICES')) for r in ranks)})",
                    "the ranks share one GPU's time and memory, and NCCL refuses two ranks on one device",
                    "give each rank of a node its own GPU (srun --gpus-per-task=1 --gpu-bind=single:1), or leave "
                    "CUDA_VISIBLE_DEVICES unset: python -m bench picks one per local rank", job.hosts(ranks)))
    return found


def _count(value):
    return int(value) if (value or "").strip().isdigit() else 1


def _threads(job):
    found = []
    for node in job.nodes:
        facts = job.ranks[node[0]]
        unset = [r for r in node if job.env(r, "OMP_NUM_THREADS") is None and job.ranks[r]["torch"]]
        threads = sum(len(job.ranks[r]["affinity"]) if r in unset else _count(job.env(r, "OMP_NUM_THREADS"))
                      for r in node)
        cpus = len(facts["cores"])
        if unset and threads > cpus:
            found.append(Finding(
                CHECK, "OMP_NUM_THREADS unset where PyTorch is installed", "medium", unset,
                f"{len(unset)} ranks of a node whose PyTorch would start {threads} threads on its {cpus} CPUs "
                "(a thread per CPU a rank may run on)",
                "PyTorch's threads of one rank take the cores of the others: a training step's compute and the "
                "all-reduce's reductions slow down together",
                "OMP_NUM_THREADS=1 for mpiexec runs (as torchrun sets it), or bind each rank to its own cores "
                "(mpiexec -bind-to core, srun --cpu-bind=cores)", job.hosts(unset)))
    return found


def check(job):
    """Check 1's findings over every rank's facts (a :class:`.facts.Job`)."""
    return _leftovers(job) + _differing(job) + _gpu_sharing(job) + _threads(job)
