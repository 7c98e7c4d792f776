"""The bottleneck ring (topology.rings): against brute force over every order for small N,
the heuristic beyond the exact search against planted rings and the threshold bound, nodes
kept in one run, and bench model's bamring against the ring's closed form."""

import itertools

import numpy as np
import pytest

from topology import BandwidthMatrix, uniform
from topology.rings import EXACT_RANKS, bottleneck_ring, ring_bottleneck


def brute_force(w):
    """The largest slowest link of any ring: every order of the ranks after rank 0."""
    n = len(w)
    return max(ring_bottleneck(w, (0, *rest)) for rest in itertools.permutations(range(1, n)))


def is_ring(order, n):
    return sorted(order) == list(range(n)) and order[0] == 0


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_the_exact_search_finds_the_brute_force_bottleneck(n):
    """Random integer weights 1..20 (distinct enough that the ranks' own order is kept only
    when it is as fast), asymmetric, some links missing; both the exact search and the
    heuristic (forced) against every order, the heuristic never above the bound."""
    rng = np.random.default_rng(n)
    for trial in range(25):
        w = rng.integers(1, 21, size=(n, n)).astype(float)
        if trial % 3 == 0:
            w[rng.random((n, n)) < 0.3] = 0.0
        np.fill_diagonal(w, 0.0)
        best = brute_force(w)
        if best <= 0:
            with pytest.raises(ValueError, match="no ring over these links"):
                bottleneck_ring(w)
            continue
        ring = bottleneck_ring(w)
        assert is_ring(ring.order, n) and ring.exact
        assert ring.bottleneck_GBps == ring_bottleneck(w, ring.order) == best, (w, ring)
        searched = bottleneck_ring(w, exact_up_to=0)
        assert is_ring(searched.order, n) and not searched.exact
        assert searched.bottleneck_GBps <= best <= searched.bound_GBps


def test_the_direction_of_the_ring_counts():
    """One-way fast links 0->1->2->3->0 (10), the way back slow (1): the ring runs the fast way;
    reversed, the ring must run the other way round."""
    w = np.ones((4, 4))
    for a in range(4):
        w[a, (a + 1) % 4] = 10.0
    np.fill_diagonal(w, 0.0)
    assert bottleneck_ring(w).order == (0, 1, 2, 3)
    assert bottleneck_ring(w.T).order == (0, 3, 2, 1) and bottleneck_ring(w.T).bottleneck_GBps == 10.0


@pytest.mark.parametrize("n", [EXACT_RANKS, EXACT_RANKS + 1, 48, 200])
def test_a_planted_ring_is_found_at_any_size(n):
    """Links of 10-20 GB/s on one hidden cycle, 0.1-1 elsewhere: the best ring is the planted
    one (its slowest link), the bound says so, and the search finds it beyond 16 ranks too."""
    rng = np.random.default_rng(n)
    w = rng.uniform(0.1, 1.0, size=(n, n))
    cycle = rng.permutation(n)
    for a, b in zip(cycle, np.roll(cycle, -1)):
        w[a, b] = rng.uniform(10, 20)
    np.fill_diagonal(w, 0.0)
    planted = ring_bottleneck(w, cycle)
    ring = bottleneck_ring(w)
    assert is_ring(ring.order, n) and ring.bottleneck_GBps == planted
    assert ring.exact == (n <= EXACT_RANKS) and ring.gap == 0.0


def test_beyond_the_exact_search_the_gap_to_the_bound_is_reported():
    rng = np.random.default_rng(5)
    w = rng.uniform(1, 10, size=(40, 40))
    np.fill_diagonal(w, 0.0)
    ring = bottleneck_ring(w)
    assert is_ring(ring.order, 40) and not ring.exact
    assert ring.bottleneck_GBps == ring_bottleneck(w, ring.order) <= ring.bound_GBps
    assert ring.gap == pytest.approx(1 - ring.bottleneck_GBps / ring.bound_GBps) and 0.0 <= ring.gap < 0.5


def test_nodes_are_visited_in_one_run_each():
    """4 nodes of 2 ranks in a scrambled numbering; node links 100, between nodes 5, except
    nodes 0 and 1 (1 GB/s): every node's ranks are neighbours in the ring, and it avoids 0-1."""
    nodes = [0, 1, 2, 3, 1, 0, 3, 2]
    between = np.array([[0, 1, 5, 5], [1, 0, 5, 5], [5, 5, 0, 5], [5, 5, 5, 0]], dtype=float)
    w = between[np.ix_(nodes, nodes)]
    w[np.equal.outer(nodes, nodes)] = 100.0
    np.fill_diagonal(w, 0.0)
    ring = bottleneck_ring(BandwidthMatrix(w, nodes=nodes))
    order = list(ring.order)
    visits = [nodes[r] for r in order]
    runs = [k for i, k in enumerate(visits) if k != visits[i - 1]]
    assert is_ring(order, 8) and sorted(runs) == [0, 1, 2, 3], visits  # each node entered once
    assert ring.bottleneck_GBps == 5.0


def test_the_ranks_own_order_is_kept_when_it_is_as_fast():
    w = np.full((5, 5), 3.0)
    np.fill_diagonal(w, 0.0)
    assert bottleneck_ring(w).order == (0, 1, 2, 3, 4)


def test_bamring_is_modelled_as_the_ring_on_its_slowest_link():
    """bench model: on uniform links bamring is the ring; on links where the ranks' order
    crosses a slow link and another order does not, bamring's time is the ring's closed form
    2(N-1)(alpha + M/(N b)) with b the bottleneck ring's slowest link."""
    from algorithms.costs import cost_model

    n, m = 6, 64e6
    w = np.full((n, n), 10.0)
    w[2, 3] = w[3, 2] = 0.5  # on the ranks' ring, not needed by another
    np.fill_diagonal(w, 0.0)
    matrix = BandwidthMatrix(w, np.zeros((n, n)))
    model = cost_model(matrix)
    ring = bottleneck_ring(matrix)
    assert ring.bottleneck_GBps == 10.0 and ring_bottleneck(w, range(n)) == 0.5
    assert model.time("bamring", m) == pytest.approx(2 * (n - 1) * m / n / 10e9, rel=1e-9)
    assert model.time("ring", m) == pytest.approx(2 * (n - 1) * m / n / 0.5e9, rel=1e-9)


def test_dring_halves_the_rings_bandwidth_term_on_full_duplex_links():
    """bench model, uniform links of their own per pair, each direction its own capacity and no
    port in between (ports="file"): the double ring's 2(N-1) steps move M/(2N) each way,
    2(N-1)(alpha + M/(2N beta)), where the ring's move M/N one way, 2(N-1)(alpha + M/(N beta))."""
    from algorithms.costs import cost_model

    alpha, beta, m = 5e-6, 10e9, 64e6
    for n in (3, 4, 5, 8):
        model = cost_model(uniform(n, beta / 1e9, alpha * 1e6), ports="file")
        assert model.time("dring", m) == pytest.approx(2 * (n - 1) * (alpha + m / (2 * n) / beta), rel=1e-9)
        assert model.time("ring", m) == pytest.approx(2 * (n - 1) * (alpha + m / n / beta), rel=1e-9)
        assert str(model.limit("dring", m)) == "link"


def test_dring_gains_nothing_where_a_port_carries_both_rings():
    """Each rank's port as fast as one link (the model's default without measured ports), or
    nodes whose NIC every transfer crosses: both rings share it, and the double ring takes the
    ring's time; on 2 ranks it is the ring."""
    from algorithms.costs import cost_model
    from topology import two_level

    m = 64e6
    for matrix in (uniform(5, 10.0, 0.0), two_level(4, 1, inter=10.0, inter_latency=0.0), uniform(2, 10.0, 0.0)):
        model = cost_model(matrix)
        assert model.time("dring", m) == pytest.approx(model.time("ring", m), rel=1e-9)


def test_dring_takes_the_ring_whose_slower_directions_are_fastest():
    """One direction of a link slow (3 -> 2): the ring may use its fast direction (2 -> 3), the
    double ring, which uses both, must avoid the pair. Its order is the bottleneck ring over
    min(B, B^T), and the model times it on fast links only."""
    from algorithms.catalog import dring
    from algorithms.costs import cost_model

    n, m = 6, 64e6
    w = np.full((n, n), 10.0)
    w[3, 2] = 0.5
    np.fill_diagonal(w, 0.0)
    matrix = BandwidthMatrix(w, np.zeros((n, n)))
    order = dring.prepare(n, bandwidth=matrix).order
    pairs = {frozenset(p) for p in zip(order, order[1:] + order[:1])}
    assert frozenset((2, 3)) not in pairs and sorted(order) == list(range(n))
    assert ring_bottleneck(np.minimum(w, w.T), order) == 10.0
    model = cost_model(matrix, ports="file")
    assert model.time("dring", m) == pytest.approx(2 * (n - 1) * m / (2 * n) / 10e9, rel=1e-9)
    assert model.time("ring", m) == pytest.approx(2 * (n - 1) * m / n / 10e9, rel=1e-9)  # 2 -> 3 only


def test_bench_model_names_the_double_rings_order(tmp_path):
    """bench model prints dring's order and its slowest link in the slower direction: on links
    fast only between ranks two apart (0 2 4 1 3 is the only fast ring of 5), that ring at 8 GB/s."""
    import json
    import subprocess
    import sys

    n = 5
    w = np.full((n, n), 0.5)
    for r in range(n):
        w[r, (r + 2) % n] = w[(r + 2) % n, r] = 8.0
    np.fill_diagonal(w, 0.0)
    path = tmp_path / "links.json"
    path.write_text(json.dumps(BandwidthMatrix(w, np.ones((n, n))).to_json()))
    proc = subprocess.run([sys.executable, "-m", "bench", "model", "--topology", str(path), "-b", "1M", "-e", "1M",
                           "--algo", "ring,dring"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("# dring:"))
    order = [int(r) for r in line.split("order ")[1].split(" both")[0].split()]
    assert sorted(order) == list(range(n)) and all((b - a) % n in (2, n - 2) for a, b in zip(order, order[1:] + order[:1]))
    assert line.endswith("slowest link (the slower direction) 8.00 GB/s"), line
