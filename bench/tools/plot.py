"""``python -m bench plot FILE... -o busbw.png``: busbw against message size, one line per algorithm.

FILE is any file ``python -m bench compare`` reads: our results (``-J`` documents,
JSON-lines logs, text tables) and nccl-tests logs (vendor baselines); a file without
results is skipped with one line on stderr. The x axis is the message size on a log
scale, labelled 8, 1K, 1M, 1G (powers of 1024, as nccl-tests sizes are written). The y
axis turns logarithmic by itself when the largest busbw plotted is more than 50 times
the smallest positive one (a GPU log beside CPU runs), so that the slower curves do not
lie flat at 0; ``--logy`` and ``--no-logy`` decide instead. The default title names the
collective, the rank count, the hosts and the MPI library of our runs.
"""

import argparse
import math
import re
import sys

from plumbing.cli import Parser
from plumbing.files import save_figure_atomically

from ..formats.tables import description, epilog
from .compare import load_all

LOGY_SPREAD = 50  # largest / smallest positive busbw above which the y axis is logarithmic
_TICK_UNITS = (("G", 30), ("M", 20), ("K", 10))
_COLLECTIVES = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter"}


def size_tick(nbytes, _position=None):
    """An x tick label as nccl-tests writes sizes: 8, 512, 1K, 64M, 1G."""
    nbytes = int(round(nbytes))
    for unit, shift in _TICK_UNITS:
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def size_ticks(sizes, most=16):
    """``(major, minor)`` x ticks for ``sizes``: every power of two in range as a minor tick;
    as majors every 1st, 2nd, 5th or 10th of them (1K, 4K, 16K...), at most ``most``."""
    low = math.floor(math.log2(min(sizes)))
    high = math.ceil(math.log2(max(sizes)))
    step = next((s for s in (1, 2, 5) if (high - low) // s < most), 10)
    major = [2 ** e for e in range(low - low % step, high + 1, step)]
    return major, [2 ** e for e in range(low, high + 1)]


def wants_logy(values, spread=LOGY_SPREAD):
    """Whether busbw ``values`` want a log y axis: the largest positive one over the smallest
    is more than ``spread``."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) > spread * min(positive)


def mpi_name(text):
    """MPI's version line made short: "MPICH Version:  5.0.2" -> "MPICH 5.0.2",
    "Open MPI v4.1.2, package: ..." -> "Open MPI v4.1.2"."""
    return re.sub(r"\s+", " ", re.sub(r"\s*Version:\s*", " ", text.split(",")[0])).strip()


def where_run(rows):
    """"2 ranks on vm", "16 ranks on 4 hosts" from our rows' ``ranks`` and ``hosts``; "" without."""
    ranks = list(dict.fromkeys(str(r["ranks"]) for r in rows if r.get("ranks") is not None))
    if not ranks:
        return ""
    hosts = sorted({h for r in rows for h in r.get("hosts") or []})
    text = f"{'/'.join(ranks)} rank{'' if ranks == ['1'] else 's'}"
    if hosts:
        text += f" on {', '.join(hosts)}" if len(hosts) <= 3 else f" on {len(hosts)} hosts"
    return text


def default_title(rows, placement="out_of_place"):
    """"all-reduce busbw, 2 ranks on vm, MPICH 5.0.2" from what our rows carry (the vendor
    logs' rows carry none of it: "busbw against message size")."""
    collectives = {r["collective"] for r in rows if r.get("collective")}
    name = collectives.pop() if len(collectives) == 1 else None
    head = f"{_COLLECTIVES.get(name, name)} busbw" if name else "busbw"
    head += ", in place" if placement == "in_place" else ""
    mpis = " / ".join(dict.fromkeys(mpi_name(r["mpi"]) for r in rows if r.get("mpi")))
    parts = [part for part in (where_run(rows), mpis) if part]
    return ", ".join([head, *parts]) if parts else f"{head} against message size"


def curves(rows, placement):
    """{label: [(size, busbw)]} sorted by size, sizes above 0."""
    series = {}
    for r in rows:
        if r["size"] > 0 and isinstance(r.get(placement), dict):
            series.setdefault(r["algorithm"], []).append((r["size"], r[placement]["bus_bw"]))
    return {name: sorted(points) for name, points in series.items()}


def plot(rows, output, title=None, placement="out_of_place", logy=None):
    """Write the PNG; ``logy`` None decides the y scale by :func:`wants_logy`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    series = curves(rows, placement)
    if not series:
        raise ValueError("no sizes above 0 to plot")
    busbw = [b for points in series.values() for _, b in points]
    logy = wants_logy(busbw) if logy is None else logy
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=120)
    # one colour per algorithm, one line style per file ("algo (file)" labels from load_all)
    bases = list(dict.fromkeys(name.split(" (")[0] for name in series))
    tags = list(dict.fromkeys(name.partition(" (")[2] for name in series))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for name, points in series.items():
        if logy:
            points = [p for p in points if p[1] > 0]  # a log axis has no 0
        base, _, tag = name.partition(" (")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=name,
                color=palette[bases.index(base) % len(palette)], linestyle=styles[tags.index(tag) % len(styles)])
    ax.set_xscale("log", base=2)
    major, minor = size_ticks([s for points in series.values() for s, _ in points])
    ax.xaxis.set_major_locator(FixedLocator(major))
    ax.xaxis.set_major_formatter(FuncFormatter(size_tick))
    ax.xaxis.set_minor_locator(FixedLocator(minor))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("message size (bytes; K, M, G = 1024, 1024², 1024³)")
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel(f"bus bandwidth (GB/s{', log scale' if logy else ''})")
    ax.set_title(title or default_title(rows, placement))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize="small")
    fig.tight_layout()
    save_figure_atomically(fig, output)
    plt.close(fig)
    return logy


def main(argv):
    p = Parser(prog="python -m bench plot", description=description(__doc__),
                                epilog=epilog(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="nccl-tests logs, our text tables, -J documents or JSON-lines logs")
    p.add_argument("-o", "--output", required=True, help="PNG file to write (required)")
    p.add_argument("--title", help="the plot's title (default: the collective, ranks, hosts and MPI library "
                                   "of the runs, e.g. 'all-reduce busbw, 2 ranks on vm, MPICH 5.0.2')")
    p.add_argument("--in-place", action="store_true", help="plot the in-place busbw (default: out-of-place)")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--logy", action="store_const", const=True, dest="logy",
                       help=f"log-scale y axis (default: on when the largest busbw is over {LOGY_SPREAD}x "
                            "the smallest positive one)")
    scale.add_argument("--no-logy", action="store_const", const=False, dest="logy",
                       help="linear y axis, whatever the spread (default: off, see --logy)")
    args = p.parse_args(argv)
    try:
        rows, _ = load_all(args.files, "python -m bench plot")
        logy = plot(rows, args.output, args.title, "in_place" if args.in_place else "out_of_place", args.logy)
    except (ValueError, OSError) as exc:
        print(f"python -m bench plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}{' (log y axis)' if logy else ''}")
    return 0
