"""The cost model's schedules of hier's reduce-scatter and all-gather against their closed forms
on uniform links (M the whole vector, K nodes of L ranks, N = KL; each node's port beta out and in):
within the node (L-1)(alpha_i + M/(L beta_i)), across the nodes (K-1)(alpha + M/(K beta)), the L
rings of a node sharing its port; one node, or one rank per node: the ring's (N-1)(alpha + M/(N beta))."""

import pytest

BETA, ALPHA = 12.5, 5.0  # GB/s and us between the nodes
INTRA, INTRA_ALPHA = 150.0, 2.0  # within a node
HALVES = ("reduce_scatter", "all_gather")
SIZES = (8.0, 1 << 20, 1 << 30)


def hier_time(nodes, m, collective):
    """Predicted seconds of hier's ``collective`` of ``m`` bytes, rank r on node ``nodes[r]``."""
    from algorithms import cost_model
    from topology.model import Network

    network = Network.uniform(len(nodes), BETA, ALPHA, nodes=nodes, intra_GBps=INTRA, intra_alpha_us=INTRA_ALPHA)
    return cost_model(network, collective=collective).time("hier", m)


def within(steps, nbytes):
    return steps * (INTRA_ALPHA * 1e-6 + nbytes / (INTRA * 1e9))


def across(steps, nbytes):
    return steps * (ALPHA * 1e-6 + nbytes / (BETA * 1e9))


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("k,per_node", [(2, 2), (2, 4), (4, 2), (3, 3), (8, 4)])
@pytest.mark.parametrize("m", SIZES)
def test_nodes_of_equal_size(collective, k, per_node, m):
    nodes = [r // per_node for r in range(k * per_node)]
    expected = within(per_node - 1, m / per_node) + across(k - 1, m / k)
    assert hier_time(nodes, m, collective) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("m", SIZES)
def test_interleaved_nodes_are_the_same_nodes(collective, m):
    """Node ids in any order (``1,0,1,0``: nodes {0, 2} and {1, 3}): 2 nodes of 2."""
    assert hier_time([1, 0, 1, 0], m, collective) == pytest.approx(within(1, m / 2) + across(1, m / 2), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("m", SIZES)
def test_one_node_is_the_ring_within_it(collective, n, m):
    assert hier_time([0] * n, m, collective) == pytest.approx(within(n - 1, m / n), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("m", SIZES)
def test_one_rank_per_node_is_the_ring_across(collective, n, m):
    assert hier_time(list(range(n)), m, collective) == pytest.approx(across(n - 1, m / n), rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("m", SIZES)
def test_nodes_of_three_and_two(collective, m):
    """N = 5, K = 2, L = 3: pieces of K chunks of M/5. Within, the node of 3 runs one round of 2
    steps, the node of 2 two rounds of 1 step: 2 steps of 2M/5. Across, pieces 0 and 1 at once
    (node 1's port carries both: 2M/5), then piece 2 alone (M/5), one step each."""
    expected = within(2, 2 * m / 5) + across(1, 2 * m / 5) + across(1, m / 5)
    assert hier_time([0, 0, 0, 1, 1], m, collective) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("collective", HALVES)
@pytest.mark.parametrize("m", SIZES)
def test_nodes_of_one_two_and_one(collective, m):
    """N = 4, K = 3, L = 2: pieces of 3 chunks of M/4; the middle node's ring one step of 3M/4;
    across, waves of the smallest node's one piece: each piece on its owners' ring of 3, 2 steps
    of M/4, one piece after the other (the nodes of one rank own both)."""
    expected = within(1, 3 * m / 4) + 2 * across(2, m / 4)
    assert hier_time([0, 1, 1, 2], m, collective) == pytest.approx(expected, rel=1e-12)
