"""The statistics every figure here carries, after Hoefler and Belli, "Scientific benchmarking
of parallel computing systems" (SC'15): nonparametric, over rounds that interleave what is compared.

* **A time** is the median of its rounds with a confidence interval of the median from order
  statistics (no normality assumed): with n rounds sorted, the interval [x_(k), x_(n+1-k)]
  holds the true median with probability 1 - 2 P(B <= k-1), B ~ Binomial(n, 1/2); k is the
  largest that reaches the level asked (95%). Below 6 rounds no k reaches 95%: the interval is
  then the whole range and :attr:`Interval.coverage` says what it holds (5 rounds: 93.75%).
* **A comparison** of A with B is paired: the ratio A_i / B_i of each round i (both measured
  in the same round, so a slow moment of the machine falls on both), its median and interval as
  above. Where the interval holds 1 the two **tie**.
* **The fastest** of several is the one of least median time; every other whose paired ratio
  over it has an interval holding 1 ties with it (:func:`fastest`).
* Rounds visit the candidates in an order rotated by one each round (:func:`round_order`), so
  no candidate always runs first, or always after the same one.
"""

import math
from dataclasses import dataclass

LEVEL = 0.95  # the confidence asked of every interval
FULL_ROUNDS = 6  # the fewest values whose interval reaches LEVEL (the whole range of 6: 96.9%)


@dataclass(frozen=True)
class Interval:
    """A median with its confidence interval: ``low <= median <= high``, over ``n`` values;
    ``coverage`` is the probability that [low, high] holds the true median (at least
    :data:`LEVEL` from 6 values on)."""

    median: float
    low: float
    high: float
    n: int
    coverage: float

    def holds(self, value):
        """Whether ``value`` lies in the interval (a ratio's interval holding 1: a tie)."""
        return self.low <= value <= self.high

    def as_dict(self, scale=1.0):
        """For JSON: ``{"median", "ci_low", "ci_high", "rounds", "coverage"}``, the values times ``scale``."""
        return {"median": self.median * scale, "ci_low": self.low * scale, "ci_high": self.high * scale,
                "rounds": self.n, "coverage": round(self.coverage, 4)}

    def text(self, fmt="{:.3g}", unit=""):
        """ "1.23x [1.10, 1.40]" (``unit`` "x"), the interval in brackets."""
        return f"{fmt.format(self.median)}{unit} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


def rank_coverage(n, k):
    """The probability that [x_(k), x_(n+1-k)] of ``n`` sorted values holds their true median:
    1 - 2 P(B <= k-1), B ~ Binomial(n, 1/2)."""
    if n <= 0 or k < 1 or 2 * k > n + 1:
        return 0.0
    tail = sum(math.comb(n, i) for i in range(k)) / 2 ** n
    return max(0.0, 1.0 - 2.0 * tail)


def interval_rank(n, level=LEVEL):
    """The largest k whose [x_(k), x_(n+1-k)] holds the median with at least ``level``; 1 (the
    whole range) where none does."""
    best = 1
    for k in range(1, (n + 1) // 2 + 1):
        if rank_coverage(n, k) >= level:
            best = k
        else:
            break
    return best


def coverage(n, level=LEVEL):
    """What the interval of :func:`median_interval` of ``n`` values holds (at least ``level``
    from :data:`FULL_ROUNDS` values on; 0 for one value)."""
    return rank_coverage(n, interval_rank(n, level)) if n > 1 else 0.0


def median(values):
    """The median (the mean of the middle two of an even count)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("the median of no values")
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def median_interval(values, level=LEVEL):
    """The :class:`Interval` of the median of ``values`` (order statistics; module docstring)."""
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    if n == 0:
        raise ValueError("an interval of no values")
    k = interval_rank(n, level)
    return Interval(median(ordered), ordered[k - 1], ordered[n - k], n, coverage(n, level))


def paired_ratio(numerators, denominators, level=LEVEL):
    """The :class:`Interval` of the median of ``numerators[i] / denominators[i]``, each pair
    measured in the same round."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired values need as many of each: {len(numerators)} and {len(denominators)}")
    return median_interval([a / b for a, b in zip(numerators, denominators) if b > 0], level)


def verdict(ratio):
    """ "tie" where the :class:`Interval` of a ratio holds 1, else "higher" or "lower"."""
    return "tie" if ratio.holds(1.0) else ("higher" if ratio.low > 1.0 else "lower")


def fastest(times, level=LEVEL):
    """(the name of least median time, [the names that tie with it, itself first]) of ``times``
    ({name: [seconds per round]}, every list from the same rounds): another ties where its
    paired time over the fastest's has an interval holding 1."""
    best = min(times, key=lambda name: median(times[name]))
    ties = [best] + [name for name in times if name != best
                     and paired_ratio(times[name], times[best], level).holds(1.0)]
    return best, ties


def round_order(names, round_index):
    """``names`` rotated left by ``round_index``: each round starts one candidate later."""
    names = list(names)
    if not names:
        return names
    shift = round_index % len(names)
    return names[shift:] + names[:shift]
