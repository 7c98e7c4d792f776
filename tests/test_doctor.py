"""``python -m bench doctor`` on real faults: the variables set in the launch (on every rank and
on one), ranks bound by the launcher's flags, more ranks than CPUs, a small ``/dev/shm`` in a
mount namespace, transparent huge pages switched off; a bound, clean run that finds nothing
and says what this machine cannot show (GPUs, several NUMA nodes, hyperthreads). The
interfaces and the probe's health report are tested in the network lab (tests/test_lab.py)."""

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, mpiexec

PYTHON = [sys.executable, "-m", "bench", "doctor"]
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def doctor(launch, args, tmp_path, timeout=120):
    """(exit status, output, the -J document) of ``mpiexec LAUNCH python -m bench doctor ARGS``."""
    out = tmp_path / "doctor.json"
    proc = subprocess.run([mpiexec(), *launch, *PYTHON, *args, "-J", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    document = json.loads(out.read_text()) if out.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, document


def titles(document):
    return [(f["check"], f["title"], tuple(f["ranks"]), f["evidence"]) for f in document["findings"]]


def test_a_bound_clean_run_finds_nothing_and_says_what_it_cannot_see(tmp_path):
    code, out, document = doctor(["-bind-to", "core", "-n", "2"], [], tmp_path=tmp_path)
    assert code == 0, out
    assert document["findings"] == [] and out.rstrip().endswith("# 0 findings: nothing found"), out
    missing = {(u["check"], u["what"]): u["why"] for u in document["not_checked"]}
    if shutil.which("nvidia-smi") is None:
        for what in ("GPU clock event reasons", "GPU persistence mode", "peer access between GPUs", "GPU PCIe links"):
            assert missing[("machine", what)] == "no GPU (no nvidia-smi)", missing
    if len(glob.glob("/sys/devices/system/node/node[0-9]*")) < 2:
        assert "NUMA node: nothing to mismatch" in missing[("binding", "NUMA placement of ranks, NICs and GPUs")]
    if not glob.glob("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"):
        assert ("machine", "CPU frequency governor") in missing
    assert missing[("interfaces", "the interface between nodes")] == "one node: no traffic leaves it"
    # one node: the ring is timed and shown, and not judged against the model of the probed links
    rows = document["measured"]
    assert [r["bytes"] for r in rows][:1] == [16384] and all(r["busbw_GBps"]["median"] > 0 for r in rows)
    assert not any(r["judged"] for r in rows) and ("measured", "busbw against the probed links") in missing
    assert document["ranks"] == 2 and document["oversubscribed"] is None


LEFTOVERS = {"NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "docker0", "NCCL_ALGO": "Tree",
             "NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "1", "MPIR_CVAR_NOLOCAL": "1", "FI_PROVIDER": "sockets",
             "OMPI_MCA_btl": "tcp,self", "UCX_TLS": "tcp", "ALLREDUCE_TRANSPORT": "direct",
             "CUDA_VISIBLE_DEVICES": "0"}


def test_leftover_settings_on_every_rank_and_on_one_and_ranks_beyond_the_cpus(tmp_path):
    """Three ranks, unbound, on this machine's CPUs: the variables above on all, NCCL_P2P_DISABLE
    on rank 0 alone (MPMD), OMP_NUM_THREADS unset."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(LEFTOVERS)
    launch = ["-n", "1", "env", "NCCL_P2P_DISABLE=1", *PYTHON, "--checks", "settings,binding", "-J",
              str(tmp_path / "doctor.json"), ":", "-n", "2", *PYTHON, "--checks", "settings,binding"]
    proc = subprocess.run([mpiexec(), *launch], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    document = json.loads((tmp_path / "doctor.json").read_text())
    found = {(check, title): (ranks, evidence) for check, title, ranks, evidence in titles(document)}
    everyone = (0, 1, 2)
    expected = {
        "NCCL's shared-memory transport is off": "NCCL_SHM_DISABLE='1'",
        "NCCL's InfiniBand/RoCE transport is off": "NCCL_IB_DISABLE='1'",
        "NCCL_SOCKET_IFNAME names only a loopback, docker or virtual bridge": "NCCL_SOCKET_IFNAME='docker0'",
        "NCCL_ALGO forces NCCL's algorithm": "NCCL_ALGO='Tree'",
        "NCCL_PROTO forces NCCL's protocol": "NCCL_PROTO='Simple'",
        "NCCL limited to 1 channel": "NCCL_MAX_NCHANNELS='1'",
        "MPICH's shared memory is off (every rank treated as on another node)": "MPIR_CVAR_NOLOCAL='1'",
        "libfabric forced onto its sockets provider": "FI_PROVIDER='sockets'",
        "Open MPI's shared-memory BTL is off": "OMPI_MCA_btl='tcp,self'",
        "UCX_TLS leaves out shared memory": "UCX_TLS='tcp'",
        "the suite's shared-memory transport is off": "ALLREDUCE_TRANSPORT='direct'",
    }
    for title, evidence in expected.items():
        assert found.get(("settings", title)) == (everyone, evidence), (title, found)
    assert found[("settings", "NCCL's peer-to-peer transport is off")] == ((0,), "NCCL_P2P_DISABLE='1'")
    ranks, evidence = found[("settings", "NCCL_P2P_DISABLE differs between ranks")]
    assert ranks == everyone and evidence == "'1' on rank 0; unset on ranks 1-2"
    ranks, evidence = found[("settings", "3 ranks of a node on one GPU")]
    assert ranks == everyone and "GPU 0" in evidence
    cpus = len(os.sched_getaffinity(0))
    if importlib.util.find_spec("torch") is not None:
        ranks, evidence = found[("settings", "OMP_NUM_THREADS unset where PyTorch is installed")]
        assert ranks == everyone and f"start {3 * cpus} threads on its {cpus} CPUs" in evidence
    assert found[("binding", "ranks not bound")][0] == everyone
    if cpus < 3:
        assert found[("binding", "more ranks than CPUs")] == (everyone, f"3 ranks on the {cpus} CPUs of one machine")
    severities = [f["severity"] for f in document["findings"]]
    assert severities == sorted(severities, key=("high", "medium", "low").index)  # worst first
    assert "1. [high] " in proc.stdout and f"# {len(severities)} findings" in proc.stdout


def test_ranks_bound_to_one_cpu_by_the_launcher(tmp_path):
    code, out, document = doctor(["-bind-to", "user:0,0", "-n", "2"], ["--checks", "binding"], tmp_path=tmp_path)
    assert code == 1, out
    assert titles(document) == [("binding", "ranks bound to the same CPUs", (0, 1), "ranks 0 and 1 on CPU 0")]


def _can_mount_shm():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount_shm(), reason="needs root and unshare (a tmpfs on /dev/shm in a mount namespace)")
def test_a_small_dev_shm_in_a_mount_namespace(tmp_path):
    """8 MiB, as a container can get: MPI starts (UCX's shared memory off); doctor says the
    transport's slots of 2 ranks (4 MiB) do not fit beside MPI's own files, and a sweep in the
    same /dev/shm does run through MPI."""
    out = tmp_path / "doctor.json"
    sweep = [mpiexec(), "-n", "2", sys.executable, "-m", "bench", "--algo", "ring", "-b", "64K", "-e", "64K",
             "-n", "1", "-w", "0", "--log", "none"]
    shell = ('mount -t tmpfs -o size=8m tmpfs /dev/shm && "$@"; echo "doctor: $?"; '
             + " ".join(sweep) + ' 2>/dev/null | grep "^# Transport:"')
    proc = subprocess.run(["unshare", "-m", "sh", "-c", shell, "sh", mpiexec(), "-n", "2", *PYTHON, "--checks",
                           "machine", "-J", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "doctor: 1" in proc.stdout, proc.stdout + proc.stderr
    (found,) = [f for f in json.loads(out.read_text())["findings"] if "/dev/shm" in f["title"]]
    assert (found["title"], found["severity"], found["ranks"]) == ("/dev/shm too small for the sweep", "high", [0, 1])
    assert found["evidence"].startswith("/dev/shm is 8.0 MiB") and "the transport's slots 4.0 MiB" in found["evidence"]
    assert "every message within the node goes through MPI" in found["cost"] and "--shm-size" in found["fix"]
    assert "# Transport: MPI; no shared memory" in proc.stdout, proc.stdout  # what the sweep then does


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(THP, os.W_OK), reason="needs root to switch THP")
def test_transparent_huge_pages_off(tmp_path):
    before = open(THP).read().split("[")[1].split("]")[0]
    try:
        with open(THP, "w") as f:
            f.write("never")
        code, out, document = doctor(["-n", "1"], ["--checks", "machine"], tmp_path=tmp_path)
    finally:
        with open(THP, "w") as f:
            f.write(before)
    assert code == 1, out
    found = [t for t in titles(document) if t[1] == "transparent huge pages off"]
    assert found == [("machine", "transparent huge pages off", (0,), f"{THP} is [never]")]


@pytest.mark.parametrize("args, words", [(["--checks", "settings,bogus"], "unknown --checks bogus; choices: "),
                                         (["-J", "/proc/doctor.json"], "/proc/doctor.json: cannot write there")])
def test_bad_arguments_exit_2_with_one_line(args, words):
    proc = subprocess.run([*PYTHON, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and proc.stdout == "", proc.stderr


def test_the_rules_for_what_this_machine_cannot_show():
    """Hyperthreads, NUMA nodes and GPUs, which this machine lacks (the real files say so above),
    over the facts of a two-socket machine written out by hand: CPUs 0-3 and their hyperthreads
    4-7, NUMA node 0 holding cores 0-1, node 1 cores 2-3, the NIC and GPU 1 on node 1."""
    from bench.doctor import binding, host
    from bench.doctor.facts import Job

    cores = {c: [c % 4, c % 4 + 4] for c in range(8)}
    numa = {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}
    nic = {"name": "ib0", "state": "up", "speed_mbit": 100000, "numa_node": 1, "physical": True, "loopback": False,
           "addresses": []}
    gpu = {"persistence_mode": "Enabled", "clocks_event_reasons.active": "0x0", "pcie.link.gen.current": "4",
           "pcie.link.gen.max": "4", "pcie.link.width.current": "16", "pcie.link.width.max": "16"}
    gpus = [{**gpu, "index": "0", "pci.bus_id": "00000000:3B:00.0", "numa_node": 0,
             "clocks_event_reasons.active": "0x0000000000000040", "pcie.link.width.current": "8"},
            {**gpu, "index": "1", "pci.bus_id": "00000000:AF:00.0", "numa_node": 1, "persistence_mode": "Disabled"}]

    def rank(cpus, local):
        return {"host": "node07", "kernel": "k", "local_rank": local, "env": {}, "affinity": cpus, "cores": cores,
                "numa": numa, "interfaces": [nic], "shm_total": 1 << 34, "shm_free": 1 << 34, "thp": "madvise",
                "governors": {c: "powersave" for c in cpus}, "torch": False, "gpus": gpus if local == 0 else None,
                "peer_access": {"0,1": "OK", "1,0": "CNS"} if local == 0 else None}

    found, _ = binding.check(Job([rank([0], 0), rank([4], 1)]), {0: {"ib0"}, 1: {"ib0"}})
    assert {(f.title, tuple(f.ranks), f.evidence) for f in found} == {
        ("ranks on two hyperthreads of one core", (0, 1), "ranks 0 and 1 on the hyperthreads of core 0/4"),
        ("rank on another NUMA node than its NIC", (0,), "rank 0's CPUs are on NUMA node 0, its NIC ib0 on node 1"),
        ("rank on another NUMA node than its NIC", (1,), "rank 1's CPUs are on NUMA node 0, its NIC ib0 on node 1"),
        ("rank on another NUMA node than its GPU", (1,), "rank 1's CPUs are on NUMA node 0, its GPU 1 on node 1")}
    found, _ = binding.check(Job([rank([2], 0), rank([3], 1)]), {})  # each on a core of its own, beside NIC and GPU 1
    assert [(f.title, f.ranks) for f in found] == [("rank on another NUMA node than its GPU", [0])]  # GPU 0 is on node 0
    found, unchecked = host.check(Job([rank([2], 0), rank([3], 1)]), 32 << 20, False)
    assert sorted((f.title, f.severity) for f in found) == [
        ("CPU frequency governor other than performance", "low"), ("GPU PCIe link below its rated width", "high"),
        ("GPU clocks held down", "high"), ("GPU persistence mode off", "low"),
        ("no peer access between some GPUs", "medium")] and unchecked == []
    width = next(f for f in found if f.title == "GPU PCIe link below its rated width")
    assert "GPU 0" in width.evidence and "x8" in width.evidence and "x16" in width.evidence and width.factor == 2
