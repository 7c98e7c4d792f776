"""The heterogeneous network lab (bench/lab, jobs/lab): real namespaces, veths, HTB and MPI
over TCP between them. Needs root and 'ip netns'; skips with the reason otherwise."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bench.lab import network

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REASON = network.requirements()
needs_lab = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def lab_cli(*args, tag, timeout=600, owner=None):
    env = {**os.environ, **({"ALLREDUCE_LAB_OWNER": owner} if owner else {})}
    return subprocess.run([sys.executable, "-m", "bench.lab", "--tag", tag, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def leftovers(tag):
    """Namespaces and links whose names this lab's tag would make."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found = [n for n in ns if n.startswith(f"{tag}-")]
    found += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()
              if line.split(":")[1].strip().startswith(f"{tag}-")]
    return found


def test_rates_are_validated():
    with pytest.raises(network.LabError, match="K x K with K >= 2"):
        network.validate_rates([[0.0]])
    with pytest.raises(network.LabError, match="positive"):
        network.validate_rates([[0, 100], [-5, 0]])
    with pytest.raises(network.LabError, match="positive"):
        network.validate_rates([[0, float("nan")], [100, 0]])
    assert network.validate_rates([[0, 100], [200, 0]])[1, 0] == 200


def test_names_fit_linux_interface_names():
    names = network.names("arlab", 64)
    assert all(len(n) <= 15 for n in [names["bridge"], *names["host_veths"], *names["veths"]])


@needs_lab
def test_the_small_lab_finds_the_links_and_the_matched_tree_wins(tmp_path):
    """K = 4 (the seed's 2x2 example in a level), one size: probe accuracy, HTB counters,
    correct results, and BAM (bottleneck 200 Mbit/s) ahead of KM (150) and binomial (50)."""
    tag = f"t{os.getpid() % 100000}"
    proc = lab_cli("run", "--only", "seed4", "--sizes", "8M", "--out", str(tmp_path), tag=tag)
    assert leftovers(tag) == []
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "seed4.json").read_text())
    assert record["htb"]["ok"], record["htb"]
    errors = [abs(link["error"]) for link in record["links"]]
    assert len(errors) == 12 and max(errors) <= 0.10, record["links"]
    runs = {r["algorithm"]: r for r in record["runs"]}
    assert set(runs) == {"bamtree", "kmtree", "tree", "ring", "ps"}
    assert all(r["wrong"] == 0 for r in runs.values())
    trees = record["trees"]
    assert trees["bamtree"]["bottleneck_GBps"] > trees["kmtree"]["bottleneck_GBps"] > trees["tree"]["bottleneck_GBps"]
    assert runs["bamtree"]["time_us"] < runs["kmtree"]["time_us"] < runs["tree"]["time_us"], runs
    assert (tmp_path / "summary.md").read_text().startswith("# Heterogeneous network lab")
    assert (tmp_path / "busbw.png").read_bytes()[:4] == b"\x89PNG"


@needs_lab
def test_up_refuses_taken_names_and_leaves_them_alone():
    tag = f"r{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", f"{tag}-ns1"], check=True)
    try:
        proc = lab_cli("up", "--generator", "uniform", "--k", "3", tag=tag, timeout=60)
        assert proc.returncode == 2 and f"refusing to start, already in use: {tag}-ns1" in proc.stderr
        assert leftovers(tag) == [f"{tag}-ns1"]  # ours, untouched; nothing else was made
        assert "removed nothing" in lab_cli("down", tag=tag, timeout=60).stdout
        assert leftovers(tag) == [f"{tag}-ns1"]
    finally:
        subprocess.run(["ip", "netns", "delete", f"{tag}-ns1"])


@needs_lab
def test_up_exec_down_and_another_owner_cannot_take_it_down():
    tag = f"u{os.getpid() % 100000}"
    proc = lab_cli("up", "--generator", "random", "--k", "3", "--low", "200", "--high", "300", tag=tag,
                   owner="mine", timeout=60)
    try:
        assert proc.returncode == 0, proc.stderr
        assert len(leftovers(tag)) == 3 + 1 + 3  # namespaces, bridge, host veths
        assert lab_cli("down", tag=tag, owner="someone-else", timeout=60).stdout.endswith("nothing (not up)\n")
        script = ("from mpi4py import MPI; import os; c = MPI.COMM_WORLD; total = c.allreduce(1); "
                  "names = c.gather(os.environ['FI_TCP_IFACE']); c.rank or print(total, *names)")
        ran = lab_cli("exec", "--", "-c", script, tag=tag, timeout=120)
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert ran.stdout == f"3 {tag}-v0 {tag}-v1 {tag}-v2\n"
        sent = network.load(tag).class_bytes()
        assert np.count_nonzero(sent) > 0  # MPI's TCP traffic went through the shaped classes
    finally:
        down = lab_cli("down", tag=tag, owner="mine", timeout=60)
    assert down.returncode == 0 and leftovers(tag) == []


@needs_lab
def test_an_interrupted_run_leaves_nothing_behind(tmp_path):
    tag = f"k{os.getpid() % 100000}"
    shm_before = {p for p in os.listdir("/dev/shm") if p.startswith("mpich_shm_")}
    env = {**os.environ, "TAG": tag, "VENV": os.path.dirname(os.path.dirname(sys.executable)), "OUT": str(tmp_path)}
    proc = subprocess.Popen([os.path.join(ROOT, "jobs/lab/run-lab.sh"), "--only", "het8"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(leftovers(tag)) < 8:
            time.sleep(0.2)
        assert len(leftovers(tag)) >= 8, "the lab did not come up"
        time.sleep(2)  # the probe is running now
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, output[-2000:]
    assert leftovers(tag) == []
    assert {p for p in os.listdir("/dev/shm") if p.startswith("mpich_shm_")} - shm_before == set(), output[-2000:]
    assert not os.path.exists(os.path.join(network.STATE_DIR, f"{tag}.json"))
