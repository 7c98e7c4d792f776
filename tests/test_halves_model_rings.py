"""The cost model's reduce-scatter and all-gather of the double ring and of two-shot against
their closed forms: dring's N-1 steps of M/(2N) to each neighbour at once, two-shot's one shot
of reads from every other rank's memory (M the whole vector, nccl-tests' size)."""

import math

import pytest

from algorithms import cost_model
from algorithms.settings import setting
from topology import uniform
from topology.model import Network

HALVES = ("reduce_scatter", "all_gather")
SIZES = (1 << 10, 64 << 10, 4 << 20, 64 << 20, 1 << 30)
ALPHA, BETA = 5.0, 10.0  # us, GB/s


def seconds(alpha_us, nbytes, GBps):
    return alpha_us * 1e-6 + nbytes / (GBps * 1e9)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [3, 4, 5, 8, 16])
def test_dring_half_on_per_pair_links(n, collective):
    """Ranks of one node, a link of their own per pair and direction, no port between:
    (N-1)(alpha + M/(2N beta)), half the double ring's all-reduce."""
    model = cost_model(Network.uniform(n, BETA, ALPHA, ranks_per_node=n, intra_GBps=BETA), collective=collective)
    whole = cost_model(Network.uniform(n, BETA, ALPHA, ranks_per_node=n, intra_GBps=BETA))
    for m in SIZES:
        assert model.time("dring", m) == pytest.approx((n - 1) * seconds(ALPHA, m / (2 * n), BETA), rel=1e-12)
        assert 2 * model.time("dring", m) == pytest.approx(whole.time("dring", m), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [3, 5, 8])
def test_dring_half_on_a_matrix_of_uniform_links(n, collective):
    """The same per-pair links as an N x N matrix with no ports (ports="file")."""
    model = cost_model(uniform(n, BETA, ALPHA), ports="file", collective=collective)
    for m in SIZES:
        assert model.time("dring", m) == pytest.approx((n - 1) * seconds(ALPHA, m / (2 * n), BETA), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [3, 4, 7, 32])
def test_dring_half_where_each_node_port_carries_both_rings(n, collective):
    """One rank a node, each node's port beta out and in: both rings' transfers share it, so
    each moves M/(2N) at beta/2, (N-1)(alpha + M/(N beta)), the ring's half."""
    model = cost_model(Network.uniform(n, BETA, ALPHA), collective=collective)
    for m in SIZES:
        assert model.time("dring", m) == pytest.approx((n - 1) * seconds(ALPHA, m / n, BETA), rel=1e-12)
        assert model.time("dring", m) == pytest.approx(model.time("ring", m), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
def test_dring_half_on_two_ranks_is_the_rings(collective):
    """2 ranks: one step of M/2 over the one link, alpha + M/(2 beta)."""
    model = cost_model(Network.uniform(2, BETA, ALPHA), collective=collective)
    for m in SIZES:
        assert model.time("dring", m) == pytest.approx(seconds(ALPHA, m / 2, BETA), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_twoshot_half_where_memory_binds(n, collective):
    """One node whose ranks' memory (4 GB/s in and out) is slower than its links (40 GB/s)
    shared by N-1 reads: ceil(M/C) alpha/2 + (N-1)/N M/beta_mem, C the two-shot box; half
    two-shot's all-reduce."""
    memory, box = 4.0, setting("ALLREDUCE_TWOSHOT_BYTES")
    network = Network.uniform(n, BETA, ALPHA, ranks_per_node=n, intra_GBps=40.0, rank_GBps=memory)
    model, whole = cost_model(network, collective=collective), cost_model(network)
    for m in SIZES:
        rounds = max(1, math.ceil(m / box))
        expected = rounds * ALPHA * 1e-6 / 2 + (n - 1) / n * m / (memory * 1e9)
        assert model.time("twoshot", m) == pytest.approx(expected, rel=1e-12)
        assert 2 * model.time("twoshot", m) == pytest.approx(whole.time("twoshot", m), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [3, 5, 8])
def test_twoshot_half_where_links_bind(n, collective):
    """One node, no memory limit: each of the ceil(M/C) phases reads M/(N ceil(M/C)) from every
    other rank over its own link, ceil(M/C)(alpha/2 + M/(N ceil(M/C) beta))."""
    box = setting("ALLREDUCE_TWOSHOT_BYTES")
    model = cost_model(Network.uniform(n, BETA, ALPHA, ranks_per_node=n, intra_GBps=BETA), collective=collective)
    for m in SIZES:
        rounds = max(1, math.ceil(m / box))
        expected = rounds * (ALPHA * 1e-6 / 2 + m / (n * rounds) / (BETA * 1e9))
        assert model.time("twoshot", m) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [3, 6])
def test_twoshot_half_across_nodes_is_the_rings(n, collective):
    """Ranks on several nodes: the ring's half, (N-1)(alpha + M/(N beta))."""
    model = cost_model(Network.uniform(n, BETA, ALPHA), collective=collective)
    for m in SIZES:
        assert model.time("twoshot", m) == pytest.approx((n - 1) * seconds(ALPHA, m / n, BETA), rel=1e-12)
