"""The summary after the tables: per size, every algorithm's busbw, the fastest, and how it
compares with native MPI (the ``mpi`` baseline).

Every line starts with ``#``, after the last table's ``Out of bounds values`` line, so
parsers written for nccl-tests' tables (SuperBench's, CloudAI's) read past it. With several
cycles (``-N``), each busbw is the median of the cycles.
"""

import statistics

from .tables import ratio_text, significant

REFERENCE = "mpi"


def by_size(rows, placement="out_of_place"):
    """[{"type", "redop", "size", "busbw": {algorithm: GB/s}, "fastest", "fastest_vs_mpi"}],
    one per type, op and size, in the order first measured."""
    samples = {}
    for row in rows:
        key = (row["type"], row["redop"], row["size"])
        samples.setdefault(key, {}).setdefault(row["algorithm"], []).append(row[placement]["bus_bw"])
    summary = []
    for (dtype, op, size), per_algorithm in samples.items():
        busbw = {name: statistics.median(values) for name, values in per_algorithm.items()}
        fastest = max(busbw, key=busbw.get)
        reference = busbw.get(REFERENCE)
        summary.append({"type": dtype, "redop": op, "size": size, "busbw": busbw, "fastest": fastest,
                        "fastest_vs_mpi": busbw[fastest] / reference if reference else None})
    return summary


def text(summary, placement="out_of_place"):
    """The summary as ``#`` lines, one block per type and op (at most 120 columns for nine
    algorithms)."""
    if not summary:
        return ""
    names = list(dict.fromkeys(name for entry in summary for name in entry["busbw"]))
    where = placement.replace("_", " ")
    lines = ["#", f"# Summary: busbw (GB/s, {where}) of every algorithm per size; the fastest, and its busbw "
                  f"over {REFERENCE}'s"]
    groups = {}
    for entry in summary:
        groups.setdefault((entry["type"], entry["redop"]), []).append(entry)
    for (dtype, op), entries in groups.items():
        lines.append(f"# {dtype} {op}:")
        lines.append(f"# {'size':>10}" + "".join(f" {name[:8]:>8}" for name in names)
                     + f" {'fastest':>8} {'vs ' + REFERENCE:>8}")
        for entry in entries:
            values = "".join(f" {significant(entry['busbw'][n]):>8}" if n in entry["busbw"] else f" {'-':>8}"
                             for n in names)
            ratio = entry["fastest_vs_mpi"]
            lines.append(f"# {entry['size']:10d}{values} {entry['fastest'][:8]:>8} "
                         f"{ratio_text(ratio) if ratio is not None else '-':>8}")
    return "\n".join(lines)
