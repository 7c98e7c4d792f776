"""The summary after the tables: per size, every algorithm's busbw, the fastest, and how it
compares with native MPI: the ``mpi`` baseline (the library's collective timed in a compiled
loop) and, when it ran, ``mpi4py`` (the same call made through mpi4py); given the links
(``--topology``), each all-reduce's time over the lower bound of any all-reduce on them
(:mod:`topology.model.lower_bound`).

Every line starts with ``#``, after the last table's ``Out of bounds values`` line, so
parsers written for nccl-tests' tables (SuperBench's, CloudAI's) read past it. With several
cycles (``-N``), each busbw is the median of the cycles.
"""

import statistics

from .tables import ratio_text, significant

#: the baselines the fastest is set against, each a column "vs NAME" where it ran
REFERENCES = ("mpi", "mpi4py")


def by_size(rows, placement="out_of_place"):
    """[{"type", "redop", "size", "busbw": {algorithm: GB/s}, "fastest", "fastest_vs_mpi",
    "fastest_vs_mpi4py"}], one per type, op and size, in the order first measured (a ratio is
    None where its reference did not run)."""
    samples = {}
    for row in rows:
        key = (row["type"], row["redop"], row["size"])
        samples.setdefault(key, {}).setdefault(row["algorithm"], []).append(
            (row[placement]["bus_bw"], row[placement].get("time", row[placement].get("cpu_time"))))
    summary = []
    for (dtype, op, size), per_algorithm in samples.items():
        busbw = {name: statistics.median(b for b, _ in values) for name, values in per_algorithm.items()}
        time_us = {name: statistics.median(t for _, t in values) for name, values in per_algorithm.items()}
        fastest = max(busbw, key=busbw.get)
        summary.append({"type": dtype, "redop": op, "size": size, "busbw": busbw, "time_us": time_us,
                        "fastest": fastest,
                        **{f"fastest_vs_{name}": busbw[fastest] / busbw[name] if busbw.get(name) else None
                           for name in REFERENCES}})
    return summary


def text(summary, placement="out_of_place"):
    """The summary as ``#`` lines, one block per type and op (at most 120 columns for nine
    algorithms)."""
    if not summary:
        return ""
    names = list(dict.fromkeys(name for entry in summary for name in entry["busbw"]))
    references = {name: max(8, len("vs " + name)) for name in REFERENCES if name == REFERENCES[0] or name in names}
    where, over = placement.replace("_", " "), " and ".join(name + "'s" for name in references)
    lines = ["#", f"# Summary: busbw (GB/s, {where}) of every algorithm per size; the fastest, and its busbw "
                  f"over {over}"]
    groups = {}
    for entry in summary:
        groups.setdefault((entry["type"], entry["redop"]), []).append(entry)
    for (dtype, op), entries in groups.items():
        lines.append(f"# {dtype} {op}:")
        lines.append(f"# {'size':>10}" + "".join(f" {name[:8]:>8}" for name in names)
                     + f" {'fastest':>8}" + "".join(f" {'vs ' + name:>{width}}" for name, width in references.items()))
        for entry in entries:
            values = "".join(f" {significant(entry['busbw'][n]):>8}" if n in entry["busbw"] else f" {'-':>8}"
                             for n in names)
            ratios = "".join(f" {ratio_text(ratio) if ratio is not None else '-':>{width}}"
                             for name, width in references.items() for ratio in [entry[f"fastest_vs_{name}"]])
            lines.append(f"# {entry['size']:10d}{values} {entry['fastest'][:8]:>8}{ratios}")
    return "\n".join(lines)


def bound_text(summary, bound, placement="out_of_place"):
    """Each algorithm's time over ``bound(size)`` (seconds; the lower bound on these links) as
    ``#`` lines, one block per type and op, with the bound itself in the last column."""
    if not summary:
        return ""
    names = list(dict.fromkeys(name for entry in summary for name in entry["time_us"]))
    lines = ["#", f"# Time ({placement.replace('_', ' ')}) over the lower bound of any all-reduce on the links "
                  "of --topology (ports' traffic or minimum cut, plus a latency; at least ceil(log2 N) latencies)"]
    groups = {}
    for entry in summary:
        groups.setdefault((entry["type"], entry["redop"]), []).append(entry)
    for (dtype, op), entries in groups.items():
        lines.append(f"# {dtype} {op}:")
        lines.append(f"# {'size':>10}" + "".join(f" {name[:8]:>8}" for name in names) + f" {'bound us':>10}")
        for entry in entries:
            limit = bound(entry["size"])
            cells = "".join(f" {ratio_text(entry['time_us'][n] * 1e-6 / limit):>8}"
                            if n in entry["time_us"] and limit > 0 else f" {'-':>8}" for n in names)
            lines.append(f"# {entry['size']:10d}{cells} {significant(limit * 1e6):>10}")
    return "\n".join(lines)
