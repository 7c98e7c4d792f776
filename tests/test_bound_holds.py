"""No committed measurement and no estimate of the cost model beats the lower bound of any
all-reduce (topology.model.lower_bound): every all-reduce time in results/ over the bound of the
network it ran on, and every modelled algorithm at sizes from 8 B to 256 MiB, is at least 1.

The one-node results (2-core VMs) are judged against the probe of the VM they ran on, with its
C-timed floor: results/perf-cpu-probe.json (an Intel Xeon VM) or results/perf-cpu-probe-amd.json
(an AMD EPYC VM), by the CPU the results file names; the lab's against the probe each lab run holds (an older
probe: no floor, so latencies 0 and no limit within a node, always a bound); ``bench bound``'s
compiled rings (another machine) against the fastest copy that file itself measured."""

import glob
import json
import os

import numpy as np
import pytest

from algorithms.costs import SCHEDULES, cost_model
from bench.formats.results import read_results
from topology import BandwidthMatrix, random_heterogeneous, two_level
from topology.model import LowerBound, Network

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBES = {"Intel": os.path.join(ROOT, "results", "perf-cpu-probe.json"),
          "AMD": os.path.join(ROOT, "results", "perf-cpu-probe-amd.json")}
SIZES = [8 << (2 * i) for i in range(13)]  # 8 B to 128 MiB
SLACK = 1 - 1e-9  # floating point only


def path(*parts):
    return os.path.join(ROOT, *parts)


def vendor(name):
    """"AMD" or "Intel": whose CPU the results file ``name`` (under results/) ran on, by its machine header."""
    data = json.load(open(path("results", name)))
    text = json.dumps(data.get("machine") or data.get("allreduce_bench") or data.get("invocations") or "")
    found = [v for v in PROBES if v in text]
    assert len(found) == 1, f"{name}: which CPU it ran on is not said once: {found}"
    return found[0]


def one_node(ranks, name):
    """``ranks`` ranks on the probed node of the machine results file ``name`` ran on, every pair as
    the probe's pair 0-1 (link, latency and floor)."""
    data = json.load(open(PROBES[vendor(name)]))
    pair = lambda rows: [[None if a == b else rows[0][1] for b in range(ranks)] for a in range(ranks)]
    floor = dict(data["measured"]["floor"], mpi_us=pair(data["measured"]["floor"]["mpi_us"]),
                 flag_us=pair(data["measured"]["floor"]["flag_us"]))
    matrix = np.full((ranks, ranks), data["bandwidth_GBps"][0][1])
    latency = np.full((ranks, ranks), data["latency_us"][0][1])
    measured = dict(data["measured"], floor=floor)
    return Network.from_matrix(BandwidthMatrix(matrix, latency, [data["hosts"][0]] * ranks, measured, [0] * ranks))


def copy_only(ranks, copy_GBps):
    """One node whose floor is latency 0 and the copy rate ``copy_GBps``: for results that come
    with their own copies and no probe."""
    zero = [[None if a == b else 0.0 for b in range(ranks)] for a in range(ranks)]
    floor = {"mpi_us": zero, "flag_us": zero, "hosts": {"host": {"copy_GBps": {"any": copy_GBps}}}}
    return Network.from_matrix(BandwidthMatrix(np.full((ranks, ranks), copy_GBps), None, ["host"] * ranks,
                                               {"method": "its own copies", "floor": floor}, [0] * ranks))


def perf_rows(name):
    """(bytes, what, seconds) of every all-reduce time of a bench perf document (each run's rows)."""
    data = json.load(open(path("results", name)))
    for rows in [data["rows"]] + [run["rows"] for run in data.get("runs", [])]:
        for row in rows:
            for key, value in row.items():
                if key == "rounds_s":  # every round's time of every candidate
                    for what, seconds in value.items():
                        if not what.startswith(("copy", "sendrecv")):
                            yield from ((row["bytes"], f"{what} round", s) for s in seconds)
                elif key.endswith("_s") and not key.startswith(("copy", "sendrecv")) and value:
                    yield row["bytes"], key, value
    return data


def sweep_rows(file):
    for r in read_results(file):
        if r.get("collective", "allreduce") == "allreduce":
            for placement in ("out_of_place", "in_place"):
                if isinstance(r.get(placement), dict):
                    yield r["size"], f"{r.get('algorithm')} {placement}", r[placement]["time"] * 1e-6


def harness_rows(name):
    def walk(node):
        if isinstance(node, dict):
            if "size_bytes" in node:
                for key, value in node.items():
                    if key.endswith(("_us", "_us_median")):
                        for v in value if isinstance(value, list) else [value]:
                            yield node["size_bytes"], key, v * 1e-6
            else:
                for v in node.values():
                    yield from walk(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(v)
    return walk(json.load(open(path("results", name)))["rows"])


def tuning_rows():
    for dtype, sizes in json.load(open(path("results", "tuning-vm-2r.json")))["measured_us"].items():
        for size, times in sizes.items():
            for algorithm, us in times.items():
                yield int(size), f"{dtype} {algorithm}", us * 1e-6


def train_rows(file):
    for run in json.load(open(file))["runs"]:
        for bucket in run.get("buckets", []):
            if bucket.get("allreduce_ms"):
                yield bucket["bytes"], f"{run['algorithm']} {run['dtype']} {run['bucket_mb']} MB", \
                    bucket["allreduce_ms"] * 1e-3


def lab_rows(file):
    for run in json.load(open(file))["runs"]:
        for key in ("time_us", "in_place_time_us"):
            if run.get(key):
                yield run["bytes"], f"{run['algorithm']} {key}", run[key] * 1e-6


def lab_network(name, per_node=True):
    matrix = BandwidthMatrix.from_json(json.load(open(path("results", "lab", f"{name}.json")))["probe"]["matrix"])
    return Network.from_matrix(matrix if per_node else matrix.node_matrix())


def ring_bound_rows():
    data = json.load(open(path("results", "ring-bound-cpu.json")))
    fastest = max(v["busbw_GBps"] for row in data["rows"] for n, v in row["variants"].items()
                  if n.startswith("copy"))
    rows = [(row["bytes"], name, v["time_s"]) for row in data["rows"] for name, v in row["variants"].items()
            if not name.startswith("copy")]
    return copy_only(2, fastest), rows


def cases():
    """(name, network, rows): every committed file with all-reduce times, on its network."""
    found = []
    for name in ("perf-cpu.json", "perf-cpu-4r.json"):
        ranks = json.load(open(path("results", name)))["ranks"]
        found.append((name, one_node(ranks, name), list(perf_rows(name))))
    for file in sorted(glob.glob(path("results", "mpich", "*-2r.json")) + glob.glob(path("results", "openmpi", "*-2r.json"))):
        rows = list(sweep_rows(file))
        if rows:
            found.append((os.path.relpath(file, ROOT), one_node(2, os.path.relpath(file, path("results"))), rows))
    for name in ("mpi-c-harness.json", "mpi-c-harness-notes.json"):
        found.append((name, one_node(2, name), list(harness_rows(name))))
    found.append(("tuning-vm-2r.json", one_node(2, "tuning-vm-2r.json"), list(tuning_rows())))
    for file in sorted(glob.glob(path("results", "train-cpu*.json"))):
        found.append((os.path.basename(file), one_node(2, os.path.basename(file)), list(train_rows(file))))
    for name in ("het8", "nodes", "racks", "seed4", "slownic", "twonodes"):
        found.append((f"lab/{name}.json", lab_network(name), list(lab_rows(path("results", "lab", f"{name}.json")))))
    found.append(("lab/train-twonodes.json", lab_network("twonodes", per_node=False),
                  list(train_rows(path("results", "lab", "train-twonodes.json")))))
    network, rows = ring_bound_rows()
    found.append(("ring-bound-cpu.json", network, rows))
    return found


CASES = cases()


def least_ratio(network, rows):
    """(the least measured time over its bound, its row)."""
    bound = LowerBound(network)
    return min((seconds / bound.at(size).seconds, (size, what)) for size, what, seconds in rows
               if bound.at(size).seconds > 0)


@pytest.mark.parametrize("name,network,rows", CASES, ids=[c[0] for c in CASES])
def test_no_committed_time_beats_the_bound(name, network, rows):
    assert rows, f"{name}: no all-reduce times found"
    ratio, row = least_ratio(network, rows)
    assert ratio >= SLACK, f"{name}: {row} at {ratio:.3f}x the bound"


@pytest.mark.parametrize("probe", sorted(PROBES.values()))
def test_the_committed_probes_hold_the_floor(probe):
    """The probes behind the one-node results have their C-timed latencies and copies (a bound of
    them, not one with 0 in their place)."""
    matrix = BandwidthMatrix.load(probe)
    floor = matrix.floor()
    assert floor and not floor["problem"] and np.isfinite(floor["copy_GBps"]).all()
    assert LowerBound(Network.from_matrix(matrix)).missing is None
    assert matrix.measured["machine"]["cores"] == 2


def model_networks():
    lab = [lab_network(name) for name in ("het8", "nodes", "racks", "seed4", "slownic", "twonodes")]
    files = [Network.from_matrix(BandwidthMatrix.load(f)) for f in sorted(glob.glob(path("tests", "data", "topology", "*.json")))]
    synthetic = [Network.from_matrix(m) for m in (random_heterogeneous(6, seed=1), two_level(3, 2, intra=100, inter=5))]
    uniform = [Network.uniform(8, 400, 10), Network.uniform(8, 25, 5, ranks_per_node=8),
               Network.uniform(16, 25, 5, ranks_per_node=4, intra_GBps=200)]
    return lab + files + synthetic + uniform + [one_node(2, "perf-cpu.json"), one_node(8, "perf-cpu.json")]


@pytest.mark.parametrize("index", range(len(model_networks())))
def test_no_modelled_algorithm_beats_the_bound_at_any_size(index):
    network = model_networks()[index]
    model = cost_model(network.matrix if network.has_matrix else network)
    bound = LowerBound(network)
    for size in SIZES:
        for algorithm in SCHEDULES:
            try:
                t = model.time(algorithm, size)
            except ValueError:
                continue
            assert t >= bound.at(size).seconds * SLACK, (algorithm, size, t / bound.at(size).seconds)
