"""``python -m bench plot FILE... -o busbw.png``: busbw against message size (log scale),
one line per algorithm, from our results and from nccl-tests logs (vendor baselines)."""

import argparse
import sys

from .compare import load_all
from .logs import LogError


def plot(rows, output, title=None, placement="out_of_place"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for r in rows:
        if r["size"] > 0:
            series.setdefault(r["algorithm"], []).append((r["size"], r[placement]["bus_bw"]))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    # one colour per algorithm, one line style per file ("algo (file)" labels from load_all)
    bases = list(dict.fromkeys(name.split(" (")[0] for name in series))
    tags = list(dict.fromkeys(name.partition(" (")[2] for name in series))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for name, points in series.items():
        points.sort()
        base, _, tag = name.partition(" (")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=name,
                color=palette[bases.index(base) % len(palette)], linestyle=styles[tags.index(tag) % len(styles)])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title or f"busbw, {placement.replace('_', '-')}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main(argv):
    p = argparse.ArgumentParser(prog="python -m bench plot", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.add_argument("--title")
    p.add_argument("--in-place", action="store_true")
    args = p.parse_args(argv)
    try:
        rows = load_all(args.files)
        plot(rows, args.output, args.title, "in_place" if args.in_place else "out_of_place")
    except (LogError, ValueError, OSError) as exc:
        print(f"python -m bench plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0
