"""Check 4, the machine: ``/dev/shm`` against what the sweep's shared windows will need,
transparent huge pages, the CPU frequency governor, and on GPUs (``nvidia-smi``) the clock
event reasons, persistence mode, peer access between a node's GPUs and PCIe links below their
rated width or generation; each GPU check says "not checked: no GPU" where there is none.

``/dev/shm``, per node of R ranks, once MPI has started (its own file is in use already):
the shared-memory transport's slots, :data:`SLOTS` of ``ALLREDUCE_SHM_SLOT_BYTES`` from each
rank to each rank, R x 4 x 256 KiB a rank; ``oneshot``'s and ``twoshot``'s two boxes a rank of
``ALLREDUCE_ONESHOT_BYTES`` and ``ALLREDUCE_TWOSHOT_BYTES``; with ``-R 1`` five registered
vectors a rank of the largest size (docs/transports.md, docs/benchmark.md); against the free
space less the 1 MiB a rank the suite keeps for MPI's own file, as the windows are checked.
"""

from algorithms.runtime.transports.shm_window import SLOTS
from algorithms.runtime.transports.shared_windows import RESERVE_PER_RANK, whole_pages
from algorithms.settings import setting, size_text
from bench.core.memory import REGISTERED_COPIES
from plumbing.shm import SHM_FIX, SHM_PATH, mib

from .finding import Finding, Unchecked

CHECK = "machine"
#: clock event reasons (NVML's nvmlClocksEventReasons) that mean the GPU slowed itself down
SLOWDOWNS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
             0x80: "hardware power brake"}
GPU_CHECKS = ("GPU clock event reasons", "GPU persistence mode", "peer access between GPUs", "GPU PCIe links")


def shm_need(ranks, largest, registered):
    """{what: bytes} the sweep's shared windows take from a node's ``/dev/shm`` beside MPI's own:
    nothing for one rank a node (private memory)."""
    if ranks < 2:
        return {}
    need = {"the transport's slots": ranks * SLOTS * setting("ALLREDUCE_SHM_SLOT_BYTES") * ranks,
            "oneshot's and twoshot's boxes": ranks * 2 * (setting("ALLREDUCE_ONESHOT_BYTES")
                                                           + setting("ALLREDUCE_TWOSHOT_BYTES"))}
    if registered:
        need["-R 1's registered vectors"] = ranks * REGISTERED_COPIES * whole_pages(largest)
    return need


def _shm(job, node, largest, registered):
    facts = job.ranks[node[0]]
    if facts["shm_total"] is None:
        return [Finding(CHECK, f"no {SHM_PATH}", "high", node, f"{SHM_PATH} does not exist on this node",
                        "MPI and the shared-memory transport cannot share memory between the node's ranks",
                        "mount a tmpfs on /dev/shm", job.hosts(node))]
    need = shm_need(len(node), largest, registered)
    free = min(job.ranks[r]["shm_free"] or 0 for r in node)
    kept = RESERVE_PER_RANK * len(node)  # what the suite leaves free for MPI's own file as it fills
    free -= kept
    if sum(need.values()) <= free:
        return []
    slots, boxes = need["the transport's slots"], need["oneshot's and twoshot's boxes"]
    if slots >= free:  # the window holds counters besides the slots
        severity, cost = "high", ("the slots do not fit: every message within the node goes through MPI instead "
                                  "(2-5x slower from 32 KiB, docs/transports.md)")
    elif slots + boxes > free:
        severity, cost = "medium", ("the slots fit, not every box of oneshot and twoshot: one without its box "
                                    "runs recursive doubling (oneshot) or the ring (twoshot) instead")
    else:
        severity, cost = "medium", "-R 1 refuses at that size: its registered vectors do not fit"
    return [Finding(CHECK, f"{SHM_PATH} too small for the sweep", severity, node,
                    f"{SHM_PATH} is {mib(facts['shm_total'])}, {mib(free + kept)} free with MPI started, {mib(kept)} of "
                    f"it kept for MPI's own file; {len(node)} ranks "
                    f"at -e {size_text(largest)}{' -R 1' if registered else ''} need {mib(sum(need.values()))}: "
                    + ", ".join(f"{what} {mib(nbytes)}" for what, nbytes in need.items()), cost, SHM_FIX,
                    job.hosts(node))]


def _thp(job, node):
    mode = job.ranks[node[0]]["thp"]
    if mode == "unavailable":
        return [], [Unchecked(CHECK, "transparent huge pages", "no THP setting readable", job.hosts(node))]
    if mode != "never":
        return [], []
    return [Finding(CHECK, "transparent huge pages off", "medium", node,
                    "/sys/kernel/mm/transparent_hugepage/enabled is [never]",
                    "MPI's kernel copy of a large message within a node pins 4 KiB pages one at a time: 6-9 GB/s "
                    "against 18-28 GB/s from huge pages on a 2-core VM (results/perf-cpu-notes.md)",
                    "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (root; NumPy asks for huge pages "
                    "for arrays of 4 MiB and more)", job.hosts(node))], []


def _governor(job, node):
    governors = {}
    for rank in node:
        for cpu, governor in job.ranks[rank]["governors"].items():
            governors.setdefault(governor, set()).add(cpu)
    if not governors:
        return [], [Unchecked(CHECK, "CPU frequency governor", "no cpufreq in /sys (a VM, or a kernel without it)",
                              job.hosts(node))]
    slow = {g: cpus for g, cpus in governors.items() if g != "performance"}
    if not slow:
        return [], []
    evidence = "; ".join(f"{g} on CPU {','.join(map(str, sorted(c)[:8]))}{'...' if len(c) > 8 else ''}"
                         for g, c in slow.items())
    return [Finding(CHECK, "CPU frequency governor other than performance", "low", node, evidence,
                    "the cores run below their rated clock until load raises it: short collectives, which leave "
                    "the cores idle between them, run at the lower clocks",
                    "cpupower frequency-set -g performance (root), or the cluster's performance profile",
                    job.hosts(node))], []


def _events(text):
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except (AttributeError, ValueError):
        return 0


def _gpus(job, node):
    facts = job.ranks[node[0]]
    host = job.hosts(node)[0]
    gpus = facts["gpus"]
    if not gpus:
        why = "no GPU (no nvidia-smi)" if gpus is None else "no GPU (nvidia-smi lists none)"
        return [], [Unchecked(CHECK, what, why, [host]) for what in GPU_CHECKS]
    found = []
    for gpu in gpus:
        where = f"GPU {gpu['index']} ({gpu.get('pci.bus_id')})"
        events = _events(gpu.get("clocks_event_reasons.active", "0"))
        slow = [name for bit, name in SLOWDOWNS.items() if events & bit]
        if slow:
            found.append(Finding(CHECK, "GPU clocks held down", "high", node,
                                 f"{where}: clock event reasons {gpu['clocks_event_reasons.active']}: {', '.join(slow)}",
                                 "the GPU runs below its clocks: its reductions and copies slow down, and the whole ring "
                                 "waits for it", "check the GPU's cooling and power (nvidia-smi -q -d PERFORMANCE)",
                                 [host]))
        if gpu.get("persistence_mode", "").lower() == "disabled":
            found.append(Finding(CHECK, "GPU persistence mode off", "low", node, f"{where}: persistence mode Disabled",
                                 "the driver tears the GPU down when no process holds it: each job's first CUDA call "
                                 "waits for it to start again (a second or more)",
                                 "nvidia-smi -pm 1 (root), or run nvidia-persistenced", [host]))
        for now, most, what in (("pcie.link.width.current", "pcie.link.width.max", "width x"),
                                ("pcie.link.gen.current", "pcie.link.gen.max", "generation ")):
            cur, top = gpu.get(now, ""), gpu.get(most, "")
            if cur.isdigit() and top.isdigit() and int(cur) < int(top):
                found.append(Finding(CHECK, f"GPU PCIe link below its rated {what.split()[0].strip()}", "high", node,
                                     f"{where}: PCIe {what}{cur} while the GPU and slot allow {what}{top} "
                                     "(read while the GPU copied, so not an idle link's power saving)",
                                     f"every byte between the GPU and the host or NIC moves at {cur}/{top} of the rate",
                                     "reseat the card or check the slot and BIOS settings", [host], int(top) / int(cur)))
    refused = {pair: why for pair, why in (facts["peer_access"] or {}).items() if why != "OK"}
    if refused:
        found.append(Finding(CHECK, "no peer access between some GPUs", "medium", node,
                             "nvidia-smi topo -p2p r: " + "; ".join(f"GPU {p.replace(',', ' -> GPU ')}: {w}"
                                                                    for p, w in sorted(refused.items())[:6]),
                             "bytes between those GPUs go through host memory (NCCL's SHM transport)",
                             "check the IOMMU and ACS settings (NCCL's troubleshooting guide, PCI Access Control "
                             "Services)", [host]))
    elif facts["peer_access"] is None and len(gpus) > 1:
        return found, [Unchecked(CHECK, "peer access between GPUs", "nvidia-smi topo -p2p r failed", [host])]
    return found, []


def check(job, largest, registered):
    """Check 4's findings and what it could not check, per node (largest: -e; registered: -R)."""
    found, unchecked = [], []
    for node in job.nodes:
        found += _shm(job, node, largest, registered)
        for part in (_thp, _governor, _gpus):
            more, missing = part(job, node)
            found += more
            unchecked += missing
    return found, unchecked
