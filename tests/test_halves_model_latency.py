"""The cost model of the latency-bound halves on uniform links (each rank a node whose port is its
link, topology.model.Network.uniform) against their closed forms: Rabenseifner's reduce-scatter
(recursive halving) and all-gather (recursive doubling), radix 2 and 3, and Bruck's all-gather
(rd's)."""

import math

import pytest

ALPHA_US, BETA_GBPS = 7, 25
ALPHA, BETA = ALPHA_US * 1e-6, BETA_GBPS * 1e9
SIZES = [8, 1e5, 3e6, 14e9]


def model(n, collective):
    from algorithms.costs import cost_model
    from topology.model import Network

    return cost_model(Network.uniform(n, BETA_GBPS, ALPHA_US), collective=collective)


def rabenseifner_half(n, k, m):
    """p = k^steps <= N cores, the ranks in p groups of consecutive ranks (q or q+1 each, the larger
    first); the step of stride S moves the chunks of the S groups a core keeps or sends, the k-1
    transfers of a core sharing its port: (k-1) G(S) M/(N beta), G(S) = S q + min(S, N - pq) the
    ranks of the first S groups. Where N > p the fold: the largest group's g-1 members share their
    core's port, with the whole vector one way and a chunk the other,
    2 alpha + (g-1)(M + M/N)/beta. N = p: log_k(p) alpha + (p-1)/p M/beta."""
    steps = 0
    while k ** (steps + 1) <= n:
        steps += 1
    p = k ** steps
    q, extra = divmod(n, p)
    strides = [k ** s for s in range(steps)]
    t = sum(ALPHA + (k - 1) * (s * q + min(s, extra)) * m / (n * BETA) for s in strides)
    if n > p:
        members = -(-n // p) - 1
        t += 2 * ALPHA + members * (m + m / n) / BETA
    return t


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12, 16, 33])
def test_rabenseifner_halves_radix_2(monkeypatch, collective, n):
    monkeypatch.delenv("ALLREDUCE_RADIX", raising=False)
    found = model(n, collective)
    for m in SIZES:
        assert found.time("rabenseifner", m) == pytest.approx(rabenseifner_half(n, 2, m), rel=1e-9), (n, m)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [3, 4, 5, 9, 11, 27])
def test_rabenseifner_halves_radix_3(monkeypatch, collective, n):
    monkeypatch.setenv("ALLREDUCE_RADIX", "3")
    found = model(n, collective)
    for m in SIZES:
        assert found.time("rabenseifner", m) == pytest.approx(rabenseifner_half(n, 3, m), rel=1e-9), (n, m)


@pytest.mark.parametrize("n", [4, 8, 16])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_rabenseifner_halves_at_a_power_of_two(monkeypatch, collective, n):
    """N = p = 2^m: log2(N) alpha + (N-1)/N M/beta, half the all-reduce's time."""
    monkeypatch.delenv("ALLREDUCE_RADIX", raising=False)
    found = model(n, collective)
    for m in SIZES:
        expected = math.log2(n) * ALPHA + (n - 1) / n * m / BETA
        assert found.time("rabenseifner", m) == pytest.approx(expected, rel=1e-9), (n, m)
        assert found.time("rabenseifner", m) == pytest.approx(model(n, "allreduce").time("rabenseifner", m) / 2)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 33, 64])
def test_bruck_all_gather(n):
    """rd's all-gather (Bruck's): ceil(log2 N) alpha + (N-1)/N M/beta, for any N."""
    found = model(n, "all_gather")
    for m in SIZES:
        expected = math.ceil(math.log2(n)) * ALPHA + (n - 1) / n * m / BETA if n > 1 else 0.0
        assert found.time("rd", m) == pytest.approx(expected, rel=1e-9), (n, m)


def test_rd_has_no_reduce_scatter():
    assert "rd" not in model(4, "reduce_scatter").schedules
