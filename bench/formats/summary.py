"""The summary after the tables: per size, every algorithm's busbw, the fastest, and how it
compares with its runner-up and with native MPI: the ``mpi`` baseline (the library's
collective timed in a compiled loop) and, when it ran, ``mpi4py`` (the same call made through
mpi4py); given the links (``--topology``), each all-reduce's time over the lower bound of any
all-reduce on them (:mod:`topology.model.lower_bound`).

The statistics are :mod:`.stats`' (Hoefler and Belli, SC'15): each busbw and time is the
median over the rounds of a size; each ratio is paired, the median of the ratios of two
algorithms' times in the same round, with its 95% interval, and where that holds 1 the two
tie. With several cycles (``-N``) the rounds of every cycle are pooled: round i of cycle c of
one algorithm pairs with round i of cycle c of another.

Every line starts with ``#``, after the last table's ``Out of bounds values`` line, so
parsers written for nccl-tests' tables (SuperBench's, CloudAI's) read past it.
"""

from . import stats
from .tables import comment, ratio_text, significant

#: the baselines the fastest is set against, each a column "vs NAME" where it ran
REFERENCES = ("mpi", "mpi4py")


def round_times(row, placement):
    """{(cycle, round): us} of one row's placement: every round's full time
    (``round_times_us``), or, for a row without rounds, its one time as one round."""
    cell = row[placement]
    times = cell.get("round_times_us") or [cell.get("time", cell.get("cpu_time"))]
    return {(row.get("cycle", 1), index): float(t) for index, t in enumerate(times)}


def paired(per_algorithm):
    """{algorithm: [us per round]} over the rounds every algorithm ran in (the same (cycle,
    round) for each, so that the lists pair round by round), in the order run."""
    common = set.intersection(*(set(times) for times in per_algorithm.values()))
    keys = sorted(common)
    return {name: [times[k] for k in keys] for name, times in per_algorithm.items()}


def entry(dtype, op, size, times, throughput):
    """One size's summary from its paired round times ({algorithm: [us]}) and each algorithm's
    busbw x time (GB/s x us, the same for every round of a size): medians, the fastest and its
    ties (:func:`.stats.fastest`), and the paired ratios of the others' times over its own."""
    medians = {name: stats.median(values) for name, values in times.items()}
    best, ties = stats.fastest(times)
    others = sorted((n for n in times if n != best), key=medians.get)

    def over(name):
        return stats.paired_ratio(times[name], times[best]).as_dict() if name in times else None

    return {"type": dtype, "redop": op, "size": size, "rounds": len(times[best]),
            "busbw": {n: throughput[n] / medians[n] if medians[n] > 0 else 0.0 for n in times},
            "time_us": medians, "fastest": best, "ties": ties,
            "runner_up": others[0] if others else None,
            "fastest_vs_runner_up": over(others[0]) if others else None,
            **{f"fastest_vs_{name}": over(name) for name in REFERENCES}}


def by_size(rows, placement="out_of_place"):
    """[{"type", "redop", "size", "rounds", "busbw": {algorithm: GB/s}, "time_us": {algorithm:
    us}, "fastest", "ties", "runner_up", "fastest_vs_runner_up", "fastest_vs_mpi",
    "fastest_vs_mpi4py"}], one per type, op and size, in the order first measured. Times and
    busbw are medians over the rounds, every cycle's (``-N``) pooled; a ratio is the
    :meth:`.stats.Interval.as_dict` of the other's time over the fastest's in the same round
    (so the fastest's busbw over the other's), None where the other did not run."""
    samples, throughput = {}, {}
    for row in rows:
        key = (row["type"], row["redop"], row["size"])
        name, cell = row["algorithm"], row.get(placement, {})
        if not cell.get("round_times_us") and cell.get("time", cell.get("cpu_time")) is None:
            continue  # a row without a time (a reader's partial row): nothing to compare
        samples.setdefault(key, {}).setdefault(name, {}).update(round_times(row, placement))
        full = cell.get("time_ci", {}).get("median", cell.get("time", cell.get("cpu_time")))
        throughput.setdefault(key, {})[name] = cell["bus_bw"] * full
    found = ((key, paired(per_algorithm)) for key, per_algorithm in samples.items())
    return [entry(*key, times, throughput[key]) for key, times in found if all(times.values())]


def _columns(names, most):
    """``names`` in even groups of at most ``most``, for tables of at most 120 columns."""
    groups = -(-len(names) // most)
    step = -(-len(names) // groups)
    return [names[i:i + step] for i in range(0, len(names), step)]


def _ratio(interval, itself=False):
    """ "1.53x [1.41, 1.62]", with " tie" where the interval holds 1; "itself" for the fastest."""
    if interval is None:
        return "-"
    if itself:
        return "itself"
    cell = f"{ratio_text(interval['median'])} [{significant(interval['ci_low'])}, {significant(interval['ci_high'])}]"
    return cell + (" tie" if interval["ci_low"] <= 1.0 <= interval["ci_high"] else "")


def text(summary, placement="out_of_place"):
    """The summary as ``#`` lines of at most 120 columns (for ~15 algorithms), one block per
    type and op: every algorithm's median busbw per size (in groups of at most 12 columns),
    then per size the fastest ("tie" where another's paired ratio over it holds 1), its busbw
    over the runner-up's and the references' (median [95% interval] of the paired ratios), and
    a line naming those that tie."""
    if not summary:
        return ""
    names = list(dict.fromkeys(name for entry in summary for name in entry["busbw"]))
    references = [name for name in REFERENCES if name == REFERENCES[0] or name in names]
    rounds = sorted({entry["rounds"] for entry in summary})
    compared = ["the runner-up's", *(name + "'s" for name in references)]
    where, over = placement.replace("_", " "), ", ".join(compared[:-1]) + " and " + compared[-1]
    counted = f"{rounds[0]} rounds" if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]} rounds"
    lines = ["#", f"# Summary: busbw (GB/s, {where}) of every algorithm per size, the median of {counted}"]
    if rounds[0] < stats.FULL_ROUNDS:  # the interval is the whole range, and holds the median less often
        lines.append(comment(f"warning: with {rounds[0]} rounds an interval holds the median with only "
                             f"{stats.coverage(rounds[0]):.0%}, not 95% (--rounds {stats.FULL_ROUNDS} "
                             "or more): its ties and winners are weak"))
    groups = {}
    for entry in summary:
        groups.setdefault((entry["type"], entry["redop"]), []).append(entry)
    for (dtype, op), entries in groups.items():
        lines.append(f"# {dtype} {op}:")
        for chunk in _columns(names, 12):
            lines.append(f"# {'size':>10}" + "".join(f" {name[:8]:>8}" for name in chunk))
            lines += [f"# {e['size']:10d}" + "".join(f" {significant(e['busbw'][n]):>8}" if n in e["busbw"]
                                                     else f" {'-':>8}" for n in chunk) for e in entries]
        lines.append(comment(f"{dtype} {op}: the fastest, and its busbw over {over}: the median "
                             "[95% interval] of the ratios of their times in the same round; \"tie\" where it holds 1"))
        lines.append(f"# {'size':>10} {'fastest':>8} {'runner-up':>9}  {'vs runner-up':<24}"
                     + "".join(f" {'vs ' + name:<24}" for name in references).rstrip())
        for e in entries:
            shown = e["fastest"] if len(e["ties"]) == 1 else "tie"
            ratios = "".join(f" {_ratio(e[f'fastest_vs_{name}'], name == e['fastest']):<24}" for name in references)
            lines.append(f"# {e['size']:10d} {shown[:8]:>8} {(e['runner_up'] or '-')[:9]:>9}  "
                         f"{_ratio(e['fastest_vs_runner_up']):<24}{ratios}".rstrip())
        tied = [e for e in entries if len(e["ties"]) > 1]
        if tied:
            lines.append(f"# {dtype} {op}: where the fastest ties, those within noise of it (the first: least median time)")
            lines += [comment(f"{e['size']:10d}  {', '.join(e['ties'])}") for e in tied]
    return "\n".join(lines)


def bound_text(summary, bound, placement="out_of_place", assumes=None):
    """Each algorithm's time over ``bound(size)`` (a :class:`topology.model.Bound`: the lower
    bound on these links, ``assumes`` the network it takes, in words) as ``#`` lines, one block
    per type and op, with the bound itself in the last column; where the bound lacks a figure
    (``Bound.missing``), that instead of the ratios."""
    if not summary:
        return ""
    names = list(dict.fromkeys(name for entry in summary for name in entry["time_us"]))
    lines = ["#", f"# Time ({placement.replace('_', ' ')}) over the lower bound of any all-reduce on the links "
                  "of --topology (traffic or minimum cut plus a latency, or the latencies alone)"
                  + (f"; it assumes {assumes}" if assumes else "")]
    missing = next((b.missing for b in map(bound, [e["size"] for e in summary]) if b.missing), None)
    if missing:
        return "\n".join(lines + [f"# no sound bound: {missing}"])
    groups = {}
    for entry in summary:
        groups.setdefault((entry["type"], entry["redop"]), []).append(entry)
    for (dtype, op), entries in groups.items():
        lines.append(f"# {dtype} {op}:")
        lines.append(f"# {'size':>10}" + "".join(f" {name[:8]:>8}" for name in names) + f" {'bound us':>10}")
        for entry in entries:
            limit = bound(entry["size"]).seconds
            cells = "".join(f" {ratio_text(entry['time_us'][n] * 1e-6 / limit):>8}"
                            if n in entry["time_us"] and limit > 0 else f" {'-':>8}" for n in names)
            lines.append(f"# {entry['size']:10d}{cells} {significant(limit * 1e6):>10}")
    return "\n".join(lines)
