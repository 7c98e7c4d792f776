"""bench.formats.stats against intervals computed by hand from the binomial distribution."""

import math

import pytest

from bench.formats import stats


def test_coverage_of_the_whole_range_is_one_minus_two_halves_to_the_n():
    # [x_(1), x_(n)] misses the median only when all n values fall on one side: 2 / 2^n
    for n in range(2, 12):
        assert stats.rank_coverage(n, 1) == pytest.approx(1 - 2 / 2 ** n)


def test_ranks_for_95_percent_match_the_tables():
    # hand-computed: n=9 -> k=2 (1 - 2*10/512 = 0.9609); n=10 -> k=2 (1 - 2*11/1024 = 0.9785);
    # n=11 -> k=2 (k=3: 1 - 2*67/2048 = 0.9346 < 0.95); n=20 -> k=6 (1 - 2*P(B<=5) = 0.9586)
    assert stats.interval_rank(9) == 2
    assert stats.interval_rank(10) == 2
    assert stats.interval_rank(11) == 2
    assert stats.interval_rank(20) == 6
    assert stats.rank_coverage(20, 6) == pytest.approx(1 - 2 * sum(math.comb(20, i) for i in range(6)) / 2 ** 20)
    for n in (6, 7, 8):
        assert stats.interval_rank(n) == 1 and stats.rank_coverage(n, 1) >= 0.95


def test_five_rounds_cannot_reach_95_percent_and_say_so():
    interval = stats.median_interval([5, 1, 4, 2, 3])
    assert (interval.median, interval.low, interval.high, interval.n) == (3, 1, 5, 5)
    assert interval.coverage == pytest.approx(0.9375) and interval.coverage < stats.LEVEL


def test_median_interval_of_ten_values():
    values = [10, 3, 7, 1, 9, 2, 8, 4, 6, 5]  # sorted 1..10; k = 2 -> [2, 9]; median 5.5
    interval = stats.median_interval(values)
    assert (interval.median, interval.low, interval.high) == (5.5, 2, 9)
    assert interval.coverage == pytest.approx(1 - 2 * 11 / 1024)
    assert interval.as_dict(1e6)["ci_low"] == pytest.approx(2e6)


def test_paired_ratio_pairs_by_round():
    # A is exactly 2x B in every round, while both drift 10x between rounds: paired, no spread
    b = [1.0, 10.0, 2.0, 7.0, 3.0, 9.0, 4.0]
    a = [2 * x for x in b]
    ratio = stats.paired_ratio(a, b)
    assert (ratio.median, ratio.low, ratio.high) == (2.0, 2.0, 2.0)
    assert stats.verdict(ratio) == "higher"
    with pytest.raises(ValueError):
        stats.paired_ratio([1.0], [1.0, 2.0])


def test_a_ratio_whose_interval_holds_one_is_a_tie():
    ratio = stats.paired_ratio([1.1, 0.9, 1.05, 0.97, 1.02, 1.0], [1.0] * 6)
    assert ratio.holds(1.0) and stats.verdict(ratio) == "tie"
    assert stats.verdict(stats.paired_ratio([0.5] * 6, [1.0] * 6)) == "lower"


def test_fastest_names_ties_on_synthetic_rows():
    rounds = {
        "ring": [1.00, 1.02, 0.98, 1.01, 0.99, 1.03],
        "rd":   [1.01, 1.00, 1.00, 0.99, 1.02, 1.01],  # within a few percent of ring, both ways
        "ps":   [2.00, 2.10, 1.90, 2.05, 1.95, 2.02],  # twice as slow in every round
    }
    best, ties = stats.fastest(rounds)
    assert best in ("ring", "rd") and set(ties) == {"ring", "rd"} and ties[0] == best
    best, ties = stats.fastest({"ring": rounds["ring"], "ps": rounds["ps"]})
    assert (best, ties) == ("ring", ["ring"])


def test_round_order_rotates_every_candidate_through_every_place():
    names = ["a", "b", "c"]
    orders = [stats.round_order(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for place in range(3):
        assert {order[place] for order in orders} == set(names)


def test_full_rounds_is_the_fewest_that_reach_the_level():
    assert stats.rank_coverage(stats.FULL_ROUNDS, 1) >= stats.LEVEL > stats.rank_coverage(stats.FULL_ROUNDS - 1, 1)


def test_coverage_is_what_median_interval_reports():
    for n in range(1, 25):
        assert stats.coverage(n) == stats.median_interval(range(n)).coverage
    assert stats.coverage(1) == 0.0 and stats.coverage(5) == pytest.approx(0.9375)
