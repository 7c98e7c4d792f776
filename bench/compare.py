"""``python -m bench compare FILE...``: busbw side by side per size, with ratios.

Each FILE is an nccl-tests log (NVIDIA's, old or new format), our text output,
a ``-J`` document or a JSON-lines log of ours. Every algorithm found becomes a
column; the first column (or ``--reference NAME``) is what the ratios divide by.
"""

import argparse
import os
import sys

from .logs import LogError, read_log
from .results import read_results


def load(path):
    """Rows from any file we understand, labelled by algorithm (a log: its file name)."""
    try:
        rows = read_results(path)
        if rows and all("out_of_place" in r for r in rows):
            return [{**r, "algorithm": r.get("algorithm", path)} for r in rows]
    except (ValueError, OSError, UnicodeDecodeError):
        pass
    return read_log(path, name=path.rsplit("/", 1)[-1].rsplit(".", 1)[0])


def load_all(paths):
    """Rows of every file; an algorithm found in several files is labelled with each file's name."""
    per_file = [(path, load(path)) for path in paths]
    seen = {}
    for _, rows in per_file:
        for name in {r["algorithm"] for r in rows}:
            seen[name] = seen.get(name, 0) + 1
    labelled = []
    for path, rows in per_file:
        stem = os.path.basename(path).rsplit(".", 1)[0]
        labelled += [{**r, "algorithm": f"{r['algorithm']} ({stem})"} if seen[r["algorithm"]] > 1 else r
                     for r in rows]
    return labelled


def table(rows, placement="out_of_place", reference=None):
    """Text table: size, then busbw of each algorithm, then each one's ratio to the reference."""
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    reference = reference or names[0]
    if reference not in names:
        raise ValueError(f"--reference {reference!r} is none of: {', '.join(names)}")
    busbw = {}
    for r in rows:
        busbw.setdefault(r["size"], {})[r["algorithm"]] = r[placement]["bus_bw"]
    others = [n for n in names if n != reference]
    head = f"{'size (B)':>12}  " + "  ".join(f"{n[:14]:>14}" for n in names)
    head += "".join(f"  {(o[:6] + '/' + reference[:7]):>14}" for o in others)
    lines = [f"# busbw (GB/s), {placement.replace('_', '-')}; ratios = algorithm / {reference}", head]
    for size in sorted(busbw):
        values = busbw[size]
        line = f"{size:12d}  " + "  ".join(
            f"{values[n]:14.2f}" if n in values else f"{'-':>14}" for n in names)
        for o in others:
            ref, val = values.get(reference), values.get(o)
            line += f"  {val / ref:14.2f}" if ref and val is not None else f"  {'-':>14}"
        lines.append(line)
    return "\n".join(lines)


def main(argv):
    p = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--in-place", action="store_true", help="compare the in-place columns")
    p.add_argument("--reference", help="the algorithm the ratios divide by (default: the first)")
    args = p.parse_args(argv)
    try:
        rows = load_all(args.files)
        print(table(rows, "in_place" if args.in_place else "out_of_place", args.reference))
    except (LogError, ValueError) as exc:
        print(f"python -m bench compare: {exc}", file=sys.stderr)
        return 2
    return 0
