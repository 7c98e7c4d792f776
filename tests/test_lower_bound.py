"""The lower bound on any all-reduce (topology.model.lower_bound): its closed forms (bytes and
latencies), its minimum cut against every subset by brute force, and no modelled algorithm below it."""

import itertools
import json
import os

import numpy as np
import pytest

from algorithms.costs import SCHEDULES, cost_model
from topology import BandwidthMatrix, random_heterogeneous, two_level
from topology.model import LowerBound, Network
from topology.model.lower_bound import Capacities, lower_bound

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M = 64 << 20


def test_equal_ports_give_the_rings_volume():
    """N ranks, ports beta: the ranks send 2(N-1)M together at N beta at most: 2(N-1)/N M/beta,
    which the ring's bandwidth term meets."""
    for n in (2, 3, 8):
        network = Network.uniform(n, 10.0, 0.0)
        bound = lower_bound(network, M)
        assert bound.seconds == pytest.approx(2 * (n - 1) / n * M / 10e9)
        assert cost_model(network).time("ring", M) == pytest.approx(bound.seconds)


def test_nodes_are_bound_by_their_ports():
    """4 nodes of 4 ranks, ports 10 GB/s, 200 GB/s inside: the nodes send 2(K-1)M through
    their ports: 2(K-1)/K M/beta, far above the ranks' own bound."""
    network = Network.uniform(16, 10.0, 0.0, ranks_per_node=4, intra_GBps=200.0)
    bound = lower_bound(network, M)
    assert bound.kind == "traffic" and bound.detail == "the nodes' ports"
    assert bound.seconds == pytest.approx(2 * 3 / 4 * M / 10e9)


def test_one_slow_port_is_the_cut():
    """Node 2 of 4 (2 ranks each) sends at 1 GB/s, the others at 10: at least M must leave it."""
    matrix = BandwidthMatrix.load(os.path.join(ROOT, "tests", "data", "topology", "slow-nic-4x2.json"))
    slow = int(np.argmin(matrix.ports["egress"]))
    bound = lower_bound(Network.from_matrix(matrix), M)
    assert bound.kind == "cut" and bound.detail == f"the egress of node {slow}"
    # a synthetic file: within a node no latency known (0), so the last byte's latency is 0
    assert bound.seconds == pytest.approx(M / (matrix.ports["egress"][slow] * 1e9))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 100])
def test_small_messages_are_bound_by_log2_n_latencies(n):
    """alpha 10 us, 400 GB/s: at 8 B the bound is ceil(log2 N) latencies (recursive doubling's
    own time where N is a power of two); at 64 MiB the bytes plus one latency."""
    network = Network.uniform(n, 400.0, 10.0)
    hops = int(np.ceil(np.log2(n)))
    bound = lower_bound(network, 8)
    if n == 2:  # one latency: the bytes' bound plus a latency is the larger
        assert bound.kind == "traffic" and bound.seconds == pytest.approx(10e-6 + 8 / 400e9)
    else:
        assert bound.kind == "latency" and bound.seconds == pytest.approx(hops * 10e-6)
        assert bound.detail == f"ceil(log2 {n}) = {hops} network latencies of 10 us (a rank takes one message at a time)"
    if n & (n - 1) == 0:
        assert cost_model(network).time("rd", 8) == pytest.approx(bound.seconds, rel=1e-3)
    big = lower_bound(network, M)
    assert big.kind == "traffic" and big.seconds == pytest.approx(2 * (n - 1) / n * M / 400e9 + 10e-6)


def test_the_least_latency_of_any_link_counts():
    """One fast pair among slow links: the bound uses the fastest latency, as a message can take it."""
    b = np.full((4, 4), 10.0)
    latency = np.full((4, 4), 50.0)
    latency[0, 1] = latency[1, 0] = 2.0
    bound = lower_bound(Network.from_matrix(BandwidthMatrix(b, latency)), 1)
    assert bound.kind == "latency" and bound.seconds == pytest.approx(2 * 2e-6)


def brute_force_cut(w):
    """The least bandwidth out of, or into, any set of ranks but all: every subset."""
    n = len(w)
    best = np.inf
    for size in range(1, n):
        for subset in itertools.combinations(range(n), size):
            inside = np.zeros(n, dtype=bool)
            inside[list(subset)] = True
            best = min(best, w[np.ix_(inside, ~inside)].sum(), w[np.ix_(~inside, inside)].sum())
    return best


@pytest.mark.parametrize("n", [2, 3, 5, 7])
def test_the_minimum_cut_is_the_least_over_every_subset(n):
    """Links only (no ports): the max-flow minimum cut equals brute force over all 2^N sets."""
    rng = np.random.default_rng(n)
    for _ in range(5):
        w = rng.uniform(0.1, 10, size=(n, n)) * (rng.random((n, n)) < 0.8)
        np.fill_diagonal(w, 0.0)
        network = Network.from_matrix(BandwidthMatrix(w), ports="file")
        assert Capacities(network).min_cut()[0] == pytest.approx(brute_force_cut(w) * 1e9)


def lab_matrices():
    found = []
    for name in ("seed4", "het8", "nodes", "slownic"):
        record = json.load(open(os.path.join(ROOT, "results", "lab", f"{name}.json")))
        found.append(BandwidthMatrix.from_json(record["probe"]["matrix"]))
    return found


@pytest.mark.parametrize("index", range(7))
def test_no_modelled_algorithm_beats_the_bound(index):
    """Random heterogeneous links, two-level nodes and the lab's probed shapes: every
    algorithm's modelled time at 1 MiB and 256 MiB is at least the bound."""
    matrices = [random_heterogeneous(6, seed=1), random_heterogeneous(9, seed=2),
                two_level(3, 2, intra=100, inter=5)] + lab_matrices()
    model = cost_model(matrices[index])
    for size in (1 << 20, 256 << 20):
        bound = model.lower_bound(size).seconds
        for algorithm in SCHEDULES:
            assert model.time(algorithm, size) >= bound * (1 - 1e-9), (algorithm, size)


def probed(ranks, nodes, mpi_us, flag_us, copy_GBps, link_GBps=5.0, latency_us=3.0, ports=None):
    """A probe's file of ``ranks`` ranks on ``nodes`` with a floor: every pair's C ping-pong
    ``mpi_us``, the pairs of a node a flag of ``flag_us``, every host's fastest copy ``copy_GBps``."""
    nodes = list(nodes)
    same = np.equal.outer(nodes, nodes)
    flag = [[flag_us if same[a, b] and a != b else None for b in range(ranks)] for a in range(ranks)]
    mpi = [[None if a == b else mpi_us for b in range(ranks)] for a in range(ranks)]
    hosts = [f"h{v}" for v in nodes]
    floor = {"mpi_us": mpi, "flag_us": flag, "hosts": {h: {"copy_GBps": {"4096": copy_GBps, "1048576": copy_GBps / 4}}
                                                       for h in set(hosts)}}
    matrix = BandwidthMatrix(np.full((ranks, ranks), link_GBps), np.full((ranks, ranks), latency_us), hosts,
                             {"method": "probe", "floor": floor}, nodes, ports)
    return Network.from_matrix(matrix)


def test_one_node_takes_one_flag_latency_and_the_fastest_copy():
    """8 ranks on one node, flag 0.05 us, C ping-pong 0.4 us, copies 80 GB/s at best (20 at 1 MiB),
    the probe's links 5 GB/s and 3 us: at 8 B one latency of the flag (not ceil(log2 8) of the
    probe's); at 64 MiB the traffic 2(N-1)M over N ranks each reading its 7 peers at 80 GB/s,
    2M/(8 x 80 GB/s), plus the flag."""
    network = probed(8, [0] * 8, 0.4, 0.05, 80.0)
    small = lower_bound(network, 8)  # the bytes plus one latency beat the latency alone
    assert small.seconds == pytest.approx(0.05e-6 + 2 * 8 / (8 * 80e9)) and small.missing is None
    assert LowerBound(network).latency == (0.05e-6, "1 latency within a node of 0.05 us (shared memory: a rank "
                                                    "reads every peer at once)")
    big = lower_bound(network, M)
    assert big.kind == "traffic" and big.seconds == pytest.approx(2 * M / (8 * 80e9) + 0.05e-6)


def test_nodes_over_a_network_take_log_latencies_of_the_c_ping_pong():
    """4 nodes of 2 ranks, C ping-pong 2 us: a node's 2 ranks each take a message at a time, so
    what a node heard of grows at most 3-fold a latency: ceil(log3 4) = 2 latencies of 2 us; and
    at 64 MiB the nodes' ports, 1.1 x 1 GB/s (the probe's accuracy), carry 2(K-1)/K M."""
    ports = {"egress": [1.0] * 4, "ingress": [1.0] * 4}
    network = probed(8, [0, 0, 1, 1, 2, 2, 3, 3], 2.0, 0.05, 80.0, ports=ports)
    small = lower_bound(network, 8)
    assert small.kind == "latency" and small.seconds == pytest.approx(2 * 2e-6)
    assert small.detail.startswith("ceil(log3 4) = 2 network latencies of 2 us")
    big = lower_bound(network, M)
    assert big.kind == "traffic" and big.detail == "the nodes' ports"
    assert big.seconds == pytest.approx(2 * 3 / 4 * M / 1.1e9 + 0.05e-6)


def test_an_old_probe_file_has_no_sound_bound():
    """A probe's file without the floor: latencies 0, no limit within a node, and says so."""
    matrix = BandwidthMatrix(np.full((2, 2), 5.0), np.full((2, 2), 3.0), measured={"method": "probe"}, nodes=[0, 0])
    bound = lower_bound(Network.from_matrix(matrix), M)
    assert bound.seconds == 0.0 and "older probe" in bound.missing
