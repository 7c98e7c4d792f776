"""The lower bound on any all-reduce (topology.model.lower_bound): its closed forms (bytes and
latencies), its minimum cut against every subset by brute force, and no modelled algorithm below it."""

import itertools
import json
import os

import numpy as np
import pytest

from algorithms.costs import SCHEDULES, cost_model
from topology import BandwidthMatrix, random_heterogeneous, two_level
from topology.model import Network
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
    alpha = matrix.latency[~np.eye(matrix.size, dtype=bool)].min() * 1e-6  # the last byte's latency
    assert bound.seconds == pytest.approx(M / (matrix.ports["egress"][slow] * 1e9) + alpha)


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
        assert bound.detail == f"ceil(log2 {n}) = {hops} latencies of 10 us"
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
