"""Reading nccl-tests text output: NVIDIA's logs (old format with an ``error`` column, new
with ``root`` and ``#wrong``) and ours (the same table, after ``# Algorithm:`` lines).

Rows are found the way SuperBench's parser finds them: after the header line that
names size, time, algbw and busbw, the lines of numbers; the last eight fields are
time, algbw, busbw and #wrong (or error) for out of place, then in place.
"""

import re


class LogError(ValueError):
    """The file is not an nccl-tests log."""


def read_log(path, name=None):
    """Rows ``{"algorithm", "size", "count", "type", "out_of_place": {...}, "in_place": {...}}``."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise LogError(f"cannot read {path}: {exc.strerror}") from None
    label = name or path
    algorithm, in_table, rows = label, False, []
    for line in lines:
        found = re.match(r"#\s*Algorithm:\s*(\S+)", line)
        if found:
            algorithm, in_table = found.group(1), False
            continue
        if line.startswith("#"):
            if re.search(r"\bsize\b.*\btime\b.*\balgbw\b.*\bbusbw\b", line):
                in_table = True
            elif "Out of bounds values" in line:
                in_table = False
            continue
        fields = line.split()
        if not in_table or len(fields) < 10 or not fields[0].isdigit() or not fields[1].isdigit():
            continue
        try:
            place = [float(x) for x in fields[-8:-5]], [float(x) for x in fields[-4:-1]]
        except ValueError:
            continue
        rows.append({
            "algorithm": algorithm, "size": int(fields[0]), "count": int(fields[1]), "type": fields[2],
            "out_of_place": dict(zip(("time", "alg_bw", "bus_bw"), place[0])),
            "in_place": dict(zip(("time", "alg_bw", "bus_bw"), place[1])),
        })
    if not rows:
        raise LogError(f"{path}: no nccl-tests table found (a line naming size, time, algbw and busbw, "
                       "then rows of numbers)")
    return rows
