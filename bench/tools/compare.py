"""``python -m bench compare FILE...``: busbw per size and algorithm, each as a ratio to a reference.

Each FILE is an nccl-tests log (NVIDIA's, old or new format), our text output, a ``-J``
document or a JSON-lines log of ours. One row per size and algorithm: its busbw, its time
and busbw / the reference's busbw at the same size. The reference is the first nccl-tests
log among the files (the vendor baseline), else native MPI (the algorithm ``mpi``, the
library's collective timed in a compiled loop, ``mpi4py`` being the same call through mpi4py;
the first file's when several hold it), else the first algorithm; ``--reference NAME`` picks
another. An algorithm found in several files is labelled with each file's name, e.g.
"ring (tuned)". A file that holds no results is skipped with one line on stderr; when no
file holds any, the command fails (exit 2) with one line.
"""

import argparse
import os
import sys

from plumbing.cli import Parser

from ..formats.logs import LogError, read_log
from ..formats.results import placement_time, read_results
from ..formats.tables import comment, description, epilog, ratio_text, significant, size_label, table

NATIVE = "mpi"
NOT_OURS = "no results of python -m bench (rows of a -J document or a JSON-lines log)"


def stem(path):
    """A file's name without folder and extension: the label of its rows."""
    return os.path.basename(path).rsplit(".", 1)[0]


def load(path):
    """``(rows, vendor)`` of one file: rows labelled by algorithm (an nccl-tests log's by
    its file name, ``vendor`` True). ``ValueError`` with the reason when it holds none."""
    try:
        rows = [r for r in read_results(path) if isinstance(r.get("out_of_place"), dict) and "size" in r]
    except OSError as exc:
        raise ValueError(f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        rows = []
    if rows:
        return [{**r, "algorithm": r.get("algorithm", stem(path))} for r in rows], False
    if path.endswith((".json", ".jsonl")):
        raise ValueError(NOT_OURS)
    try:
        rows = read_log(path)
    except LogError as exc:
        raise ValueError(str(exc).removeprefix(f"{path}: ")) from None
    vendor = all(r["algorithm"] == path for r in rows)  # no "# Algorithm:" line: not our text
    return [{**r, "algorithm": stem(path)} if r["algorithm"] == path else r for r in rows], vendor


def read_files(paths, prog):
    """``[(path, rows, vendor)]`` of every file that holds results (:func:`load`); one line
    on stderr for each other file, or ``ValueError`` (one line) when no file holds any."""
    per_file, skipped = [], []
    for path in paths:
        try:
            per_file.append((path, *load(path)))
        except ValueError as exc:
            skipped.append((path, str(exc)))
    if not per_file:
        reasons = {}
        for path, reason in skipped:
            reasons.setdefault(reason, []).append(path)
        raise ValueError("nothing to compare: " + "; ".join(f"{', '.join(files)}: {reason}"
                                                             for reason, files in reasons.items()))
    for path, reason in skipped:
        print(f"{prog}: skipped {path}: {reason}", file=sys.stderr)
    return per_file


def load_all(paths, prog="python -m bench compare"):
    """``(rows, vendors)``: the rows of every file that holds results (:func:`read_files`),
    an algorithm found in several files labelled with each file's name, and the labels of
    the nccl-tests logs."""
    per_file = read_files(paths, prog)
    seen = {}
    for _, rows, _ in per_file:
        for name in {r["algorithm"] for r in rows}:
            seen[name] = seen.get(name, 0) + 1
    labelled, vendors = [], []
    for path, rows, vendor in per_file:
        rows = [{**r, "algorithm": f"{r['algorithm']} ({stem(path)})"} if seen[r["algorithm"]] > 1 else r
                for r in rows]
        labelled += rows
        vendors += [rows[0]["algorithm"]] if vendor else []
    return labelled, vendors


def base_name(label):
    """"ring (tuned)" -> "ring"."""
    return label.split(" (")[0]


def pick_reference(names, vendors=(), wanted=None):
    """The label ratios divide by: ``wanted`` (a label, or the first label of that algorithm),
    else the first vendor log, else the first ``mpi``, else the first name."""
    if wanted:
        found = [n for n in names if n == wanted] or [n for n in names if base_name(n) == wanted]
        if not found:
            raise ValueError(f"--reference {wanted!r} is none of: {', '.join(names)}")
        return found[0]
    natives = [n for n in names if base_name(n) == NATIVE]
    return (list(vendors) + natives + list(names))[0]


def busbw_table(rows, placement, reference):
    """Cells ``[size, algorithm, busbw, time, busbw / reference's]``, one row per size and
    algorithm (the last row of a size and algorithm counts), sizes ascending."""
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    cells = {}
    for r in rows:
        if isinstance(r.get(placement), dict):
            cells.setdefault(r["size"], {})[r["algorithm"]] = r[placement]
    out = []
    for size in sorted(cells):
        ref = cells[size].get(reference, {}).get("bus_bw")
        for name in (n for n in names if n in cells[size]):
            busbw, time = cells[size][name]["bus_bw"], placement_time(cells[size][name])
            out.append([size_label(size), name, significant(busbw), significant(time),
                        ratio_text(busbw / ref) if ref else "-"])
    return out


def render(rows, placement="out_of_place", reference=None, vendors=()):
    """The whole text: what the ratios are, then the table (:func:`busbw_table`)."""
    reference = pick_reference(list(dict.fromkeys(r["algorithm"] for r in rows)), vendors, reference)
    cells = busbw_table(rows, placement, reference)
    header = ["size", "algorithm", f"busbw {placement.replace('_', '-')} (GB/s)", "time (us)", f"vs {reference}"]
    return "\n".join([comment(f"busbw and time per size and algorithm; vs {reference} = busbw / the busbw of "
                               f"{reference} at the same size (- where it has none)"),
                       *table(header, cells, left=(1,))])


def main(argv):
    p = Parser(prog="python -m bench compare", description=description(__doc__),
                                epilog=epilog(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="nccl-tests logs, our text tables, -J documents or JSON-lines logs")
    p.add_argument("--in-place", action="store_true",
                   help="compare the in-place busbw and time (default: out-of-place)")
    p.add_argument("--reference", metavar="NAME",
                   help="the algorithm (or file label) the ratios divide by (default: the first nccl-tests "
                        "log given, else mpi, the MPI library timed in a compiled loop, else the first algorithm)")
    args = p.parse_args(argv)
    try:
        rows, vendors = load_all(args.files)
        print(render(rows, "in_place" if args.in_place else "out_of_place", args.reference, vendors))
    except ValueError as exc:
        print(f"python -m bench compare: {exc}", file=sys.stderr)
        return 2
    return 0
