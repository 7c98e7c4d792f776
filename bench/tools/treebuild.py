"""How long building a tree takes: ``python -m bench.treebuild [-o results/tree-build]``.

For S ranks with a random heterogeneous bandwidth matrix (1-100 GB/s, random seed S), times
``topology.build_tree`` with BAM (bottleneck matching, compiled Hopcroft-Karp
in the threshold search) and KM (Kuhn-Munkres), and reports each tree's
slowest level and predicted cost. Writes FILE.json and FILE.md atomically.
Targets: BAM under 0.2 s at S = 1024 and under 3 s at S = 4096.
"""

import sys
import statistics
import time

from topology import build_tree, random_heterogeneous, tree_cost
from plumbing.cli import Parser
from plumbing.files import write_json_atomically, write_text_atomically

from ..core.machine import results_header

TARGETS = {1024: 0.2, 4096: 3.0}


def time_build(matrix, method, repeats):
    times, tree = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        tree = build_tree(matrix, root=0, method=method)
        times.append(time.perf_counter() - start)
    return statistics.median(times), tree


def run(sizes, repeats, km_max):
    rows = []
    for size in sizes:
        matrix = random_heterogeneous(size, low=1.0, high=100.0, seed=size)
        reps = repeats if size <= 4096 else 1
        row = {"ranks": size, "repeats": reps}
        for method in ("bam", "km", "binomial"):
            if method == "km" and size > km_max:
                row["km"] = {"skipped": f"S > {km_max}"}
                continue
            seconds, tree = time_build(matrix, method, reps)
            row[method] = {"seconds": round(seconds, 4), "levels": tree.depth(),
                           "slowest_level_GBps": round(min(tree.bottlenecks, default=0.0), 3),
                           "predicted_s_per_GB": round(tree_cost(tree) * 1e9, 5)}
        if size in TARGETS:
            row["target_seconds"] = TARGETS[size]
            row["target_met"] = row["bam"]["seconds"] < TARGETS[size]
        rows.append(row)
        print(row, flush=True)
    return rows


def markdown(data):
    lines = [
        "# Tree build time",
        "",
        f"{data['date']}, commit {data['machine']['commit']}, {data['machine']['cpu']} "
        f"({data['machine']['cores']} cores), Python {data['machine']['python']}. Random heterogeneous "
        "matrices (1..100 GB/s, seed = S), root 0, median of the repeats (one run above S = 4096). "
        "Every method first validates the S x S matrix, takes each link's slower direction and "
        "checks that every rank is reachable; the binomial column, which matches nothing, is that "
        "fixed cost.",
        "",
        "| S | BAM (s) | KM (s) | binomial (s) | slowest level BAM / KM / binomial (GB/s) | target | met |",
        "|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in data["results"]:
        km = r["km"].get("seconds", r["km"].get("skipped"))
        slowest = " / ".join(str(r[m].get("slowest_level_GBps", "-")) for m in ("bam", "km", "binomial"))
        target = f"< {r['target_seconds']}" if "target_seconds" in r else "report"
        met = {True: "yes", False: "**no**"}.get(r.get("target_met"), "-")
        lines.append(f"| {r['ranks']} | {r['bam']['seconds']} | {km} | {r['binomial']['seconds']} | "
                     f"{slowest} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = Parser(prog="python -m bench.treebuild", description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default="results/tree-build",
                   help="FILE prefix: writes FILE.json and FILE.md (default results/tree-build)")
    p.add_argument("--sizes", default="64,256,1024,4096,16384",
                   help="comma list of rank counts S (default 64,256,1024,4096,16384)")
    p.add_argument("--repeats", type=int, default=3,
                   help="builds per size and method; the median is kept (default 3; one above S = 4096)")
    p.add_argument("--km-max", type=int, default=16384, help="skip KM above this many ranks S (default 16384)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    data = {**results_header("tree-build", None, argv=["treebuild", *(sys.argv[1:] if argv is None else argv)]),
            "results": run(sizes, args.repeats, args.km_max)}
    write_json_atomically(args.output + ".json", data)
    write_text_atomically(args.output + ".md", markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
