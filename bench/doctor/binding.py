"""Check 2, binding: where each rank may run against the cores, hyperthreads and NUMA nodes of
its machine (the kernel's ``thread_siblings_list`` and ``/sys/devices/system/node``), and the
NUMA node of its NIC and GPU (the PCI device's ``numa_node``).

* more ranks on a machine than CPUs (the scheduler then shares them: every timing measures it),
  or than cores (two ranks share a core's hyperthreads);
* ranks not bound: two or more ranks of a machine, each free to run on all its CPUs;
* bound ranks whose CPUs overlap, or that hold two hyperthreads of one core;
* a bound rank whose CPUs lie on NUMA nodes other than that of the NIC that carries the
  node's traffic (every physical NIC that is up, where none is known) or of its GPU.
"""

from .finding import Finding, Unchecked, ranks_text

CHECK = "binding"
BIND = "bind each rank to cores of its own: mpiexec -bind-to core (MPICH), mpirun --bind-to core (Open MPI), srun --cpu-bind=cores"


def _core(facts, cpu):
    return tuple(facts["cores"].get(cpu, [cpu]))


def _numa_of(facts, cpus):
    return sorted({node for node, members in facts["numa"].items() if set(members) & set(cpus)})


def _crowding(job, machine):
    facts = job.ranks[machine[0]]
    cpus, cores = len(facts["cores"]), len({_core(facts, c) for c in facts["cores"]})
    if len(machine) > cpus:
        return [Finding(CHECK, "more ranks than CPUs", "high", machine,
                        f"{len(machine)} ranks on the {cpus} CPUs of one machine",
                        f"the ranks take turns on the CPUs: a rank waiting for a message may not run for a "
                        f"scheduler's time slice; busbw measures the scheduler (timings oversubscribed {len(machine)}:{cpus})",
                        f"at most {cpus} ranks a machine (mpiexec -n, srun --ntasks-per-node)", job.hosts(machine),
                        len(machine) / cpus)]
    if len(machine) > cores:
        return [Finding(CHECK, "more ranks than cores", "medium", machine,
                        f"{len(machine)} ranks on the {cores} cores ({cpus} hyperthreads) of one machine",
                        "two ranks share one core's execution units and caches", f"at most {cores} ranks a machine",
                        job.hosts(machine))]
    return []


def _binding(job, machine):
    facts = job.ranks[machine[0]]
    everything = set(facts["cores"])
    loose = [r for r in machine if set(job.ranks[r]["affinity"]) >= everything and len(everything) > 1]
    found = []
    if len(machine) > 1 and loose:
        found.append(Finding(CHECK, "ranks not bound", "low", loose,
                             f"{ranks_text(loose)} may each run on all {len(everything)} CPUs of the machine",
                             "the scheduler may put two ranks on one core and move a rank away from its caches and "
                             "its memory's NUMA node; a cost that comes and goes between runs", BIND, job.hosts(loose)))
    bound = [r for r in machine if r not in loose]
    shared, siblings = [], []
    for i, a in enumerate(bound):
        for b in bound[i + 1:]:
            mine, theirs = set(job.ranks[a]["affinity"]), set(job.ranks[b]["affinity"])
            if mine & theirs:
                shared.append((a, b, sorted(mine & theirs)))
            elif {_core(facts, c) for c in mine} & {_core(facts, c) for c in theirs}:
                siblings.append((a, b, sorted({_core(facts, c) for c in mine} & {_core(facts, c) for c in theirs})))
    if shared:
        ranks = sorted({r for a, b, _ in shared for r in (a, b)})
        found.append(Finding(CHECK, "ranks bound to the same CPUs", "high", ranks,
                             "; ".join(f"ranks {a} and {b} on CPU {','.join(map(str, cpus))}" for a, b, cpus in shared[:6]),
                             "the ranks take turns on those CPUs while others stay idle", BIND, job.hosts(ranks)))
    if siblings:
        ranks = sorted({r for a, b, _ in siblings for r in (a, b)})
        found.append(Finding(CHECK, "ranks on two hyperthreads of one core", "medium", ranks,
                             "; ".join(f"ranks {a} and {b} on the hyperthreads of core {'/'.join(map(str, cores[0]))}"
                                       for a, b, cores in siblings[:6]),
                             "the two ranks share one core's execution units and caches",
                             BIND + " (a whole core each, not a hyperthread)", job.hosts(ranks)))
    return found


def _devices(job, rank, carriers):
    """[(what, NUMA node)] of the NIC(s) and GPU of ``rank`` whose NUMA node is known."""
    facts = job.ranks[rank]
    nics = [i for i in facts["interfaces"] if i["physical"] and i["state"] in ("up", "active")
            and i["numa_node"] is not None and i["numa_node"] >= 0]
    named = [i for i in nics if i["name"] in carriers.get(rank, ())]
    devices = [(f"NIC {i['name']}", i["numa_node"]) for i in (named or nics)]
    gpus = facts["gpus"] or []
    visible = (job.env(rank, "CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    index = visible if visible.isdigit() else str(facts["local_rank"] % len(gpus)) if gpus else None
    devices += [(f"GPU {g['index']}", g["numa_node"]) for g in gpus
                if g["index"] == index and g["numa_node"] is not None and g["numa_node"] >= 0]
    return devices


def _numa(job, machine, carriers):
    facts = job.ranks[machine[0]]
    if len(facts["numa"]) < 2:
        return [], [Unchecked(CHECK, "NUMA placement of ranks, NICs and GPUs",
                              f"{len(facts['numa']) or 'no'} NUMA node: nothing to mismatch", job.hosts(machine))]
    found = []
    for rank in machine:
        mine = _numa_of(job.ranks[rank], job.ranks[rank]["affinity"])
        if len(mine) != 1:
            continue  # not bound within one NUMA node: "ranks not bound" says so where it matters
        for what, node in _devices(job, rank, carriers):
            if node not in mine:
                found.append(Finding(CHECK, f"rank on another NUMA node than its {what.split()[0]}", "medium", [rank],
                                     f"rank {rank}'s CPUs are on NUMA node {mine[0]}, its {what} on node {node}",
                                     "every byte between the rank and the device crosses the link between the sockets",
                                     f"bind the rank to cores of NUMA node {node} (mpiexec -bind-to numa with the "
                                     "ranks ordered by device, srun --cpu-bind=ldoms, or a rank file)",
                                     job.hosts([rank])))
    return found, []


def check(job, carriers=None):
    """Check 2's findings and what it could not check; ``carriers``: {rank: the interfaces that
    carried its node's traffic}, where the interface check found them."""
    found, unchecked = [], []
    for machine in job.machines:
        found += _crowding(job, machine) + _binding(job, machine)
        if all(len(siblings) == 1 for siblings in job.ranks[machine[0]]["cores"].values()):
            unchecked.append(Unchecked(CHECK, "ranks on two hyperthreads of one core", "one hyperthread a core",
                                       job.hosts(machine)))
        more, missing = _numa(job, machine, carriers or {})
        found += more
        unchecked += missing
    return found, unchecked
