"""``python -m bench mpi-tuning RESULTS... -o FILE``: the tuning file an MPI library loads, from
runs of ``--algo mpi:NAME`` (:mod:`bench.baselines.mpi`).

It reads the runs (``-J`` files or logs), picks the library's fastest algorithm per size (out of
place), each size's choice reaching to the geometric mean with the next measured size, and
writes what that library loads:

* MPICH: a collective selection file for ``MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE``: the
  library's own default selection (the JSON compiled into the ``libmpi`` this process loaded),
  with the all-reduce of communicators of up to the measured rank count and commutative built-in
  ops replaced by the measured choices; the rest keeps MPICH's defaults. MPICH follows it where
  its device collectives step aside: run with ``MPIR_CVAR_DEVICE_COLLECTIVES=none``.
* Open MPI: a coll/tuned dynamic rules file (``OMPI_MCA_coll_tuned_dynamic_rules_filename``,
  with ``OMPI_MCA_coll_tuned_use_dynamic_rules=1``): the all-reduce of communicators of the
  measured rank count and more, a rule per size range; other collectives keep Open MPI's fixed
  decisions.
"""

import json
import math
import re
import sys

from plumbing.cli import Parser
from plumbing.files import write_json_atomically, write_text_atomically

from topology.mpicc import loaded_libmpi
from ..baselines.mpi import OPEN_MPI, PREFIX, library_of
from ..formats.results import placement_time, read_results

#: the parameters an MPICH selection file gives each algorithm: those of the mpi:NAME runs (MPICH's
#: CVAR defaults: MPIR_CVAR_ALLREDUCE_TREE_*, _RECEXCH_*, _RECURSIVE_MULTIPLYING_KVAL); a tree
#: without its k divides by zero
PARAMETERS = {"tree": ("tree_type=knomial_1", "k=2", "chunk_size=0", "buffer_per_child=0"),
              "recexch": ("k=2", "single_phase_recv=0"), "k_reduce_scatter_allgather": ("k=2", "single_phase_recv=0"),
              "recursive_multiplying": ("k=2",)}


def library_path():
    """The file of the MPI library this process loaded (``libmpi``), from its memory map."""
    from mpi4py import MPI  # loads the library (a tool run on its own: MPI starts here)

    MPI.Get_library_version()
    found = loaded_libmpi()
    if not found:
        raise RuntimeError("no libmpi in this process's memory map")
    return sorted(found)[0]


def default_selection(path=None):
    """MPICH's own MPIR-level selection: the largest JSON document of ``"collective=..."`` keys
    naming ``MPIR_`` algorithms among the strings of the library file (the one
    ``MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE`` replaces)."""
    with open(path or library_path(), "rb") as f:
        data = f.read()
    best = None
    for match in re.finditer(rb'\{\s*"collective=', data):
        end = data.find(b"\0", match.start())
        try:
            document = json.loads(data[match.start():end].decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if "algorithm=MPIR_" in json.dumps(document) and (best is None or len(document) > len(best)):
            best = document
    if best is None or "collective=allreduce" not in best:
        raise RuntimeError(f"no MPIR collective selection in {path or library_path()}")
    return best


def fastest(rows):
    """{bytes: (NAME, us)}: per size, the library's fastest algorithm among the ``mpi:NAME`` rows
    (the out-of-place time; all-reduce, sum)."""
    best = {}
    for row in rows:
        algorithm = row.get("algorithm", "")
        if not algorithm.startswith(PREFIX) or row.get("collective", "allreduce") != "allreduce":
            continue
        size, us = int(row["size"]), float(placement_time(row["out_of_place"]))
        if size not in best or us < best[size][1]:
            best[size] = (algorithm[len(PREFIX):], us)
    return best


def allreduce_rules(choices):
    """The csel subtree of ``{bytes: NAME}``: each size up to the geometric mean with the next
    (``avg_msg_size`` is the vector's bytes), the largest size's choice beyond;
    reduce_scatter_allgather only where the count reaches the power of two (else recursive doubling)."""
    sizes = sorted(choices)
    rules = {}
    for i, size in enumerate(sizes):
        key = f"avg_msg_size<={math.isqrt(size * sizes[i + 1])}" if i + 1 < len(sizes) else "avg_msg_size=any"
        name = choices[size]
        leaf = {f"algorithm=MPIR_Allreduce_intra_{name}": {key: {} for key in PARAMETERS.get(name, ())}}
        if name == "reduce_scatter_allgather":
            leaf = {"count<pow2": {"algorithm=MPIR_Allreduce_intra_recursive_doubling": {}}, "count=any": leaf}
        rules[key] = leaf
    return rules


def selection_file(choices, ranks, base):
    """``base`` (MPICH's default selection) with the all-reduce of intra-communicators of up to
    ``ranks`` ranks and commutative built-in ops following ``choices`` ({bytes: NAME})."""
    document = json.loads(json.dumps(base))
    default = document["collective=allreduce"]
    default_intra = default.get("comm_type=intra", default)
    document["collective=allreduce"] = {
        **default,
        "comm_type=intra": {
            f"comm_size<={ranks}": {
                "is_commutative=yes": {"is_op_built_in=yes": allreduce_rules(choices), "is_op_built_in=no": default_intra},
                "is_commutative=no": default_intra,
            },
            "comm_size=any": default_intra,
        },
    }
    return document


def rules_file(choices, ranks):
    """Open MPI coll/tuned dynamic rules (the classic format of coll_tuned_dynamic_file.c) for the
    all-reduce (collective 2) of communicators of ``ranks`` ranks and more: a rule per size of
    ``{bytes: NAME}``, from just above the geometric mean with the size before (0 for the first:
    Open MPI wants a rule from 0) to the next rule; algorithm number, fan-in/out 0, segment 0."""
    sizes = sorted(choices)
    lines = ["1", "2", "1", str(ranks), str(len(sizes))]
    for i, size in enumerate(sizes):
        start = 0 if i == 0 else math.isqrt(sizes[i - 1] * size) + 1
        lines.append(f"{start} {OPEN_MPI.menu[choices[size]]} 0 0")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = Parser(prog="python -m bench mpi-tuning", description=(
        "From runs of --algo mpi:NAME, the MPI library's fastest all-reduce per size, written as the tuning "
        "file that library loads (MPICH's selection JSON, Open MPI's coll/tuned rules)."))
    p.add_argument("results", nargs="+", help="-J files or logs of runs with --algo mpi:NAME (all of one library)")
    p.add_argument("-o", "--output", required=True,
                   help="the file to write (required): MPICH's selection JSON, or Open MPI's coll/tuned rules")
    p.add_argument("--library", help="MPICH: the libmpi file whose default selection the file starts from "
                                     "(default: the one this Python's mpi4py loads)")
    args = p.parse_args(argv)
    prog = "python -m bench mpi-tuning"
    rows = []
    for path in args.results:
        try:
            rows += [r for r in read_results(path) if str(r.get("algorithm", "")).startswith(PREFIX)]
        except (OSError, ValueError) as exc:
            print(f"{prog}: {path}: {exc}", file=sys.stderr)
            return 2
    if not rows:
        print(f"{prog}: no mpi:NAME rows in " + ", ".join(args.results), file=sys.stderr)
        return 2
    ranks = {int(r["ranks"]) for r in rows if "ranks" in r}
    libraries = {library_of(str(r.get("mpi", ""))) for r in rows}
    if len(ranks) > 1 or len(libraries) > 1 or None in libraries:
        print(f"{prog}: the runs must share one rank count and one MPI library (MPICH or Open MPI); "
              f"these have ranks {sorted(ranks)}, {sorted({str(r.get('mpi', '?')) for r in rows})}", file=sys.stderr)
        return 2
    library, count = libraries.pop(), ranks.pop() if ranks else 1
    best = fastest(rows)
    choices = {size: name for size, (name, _) in best.items()}
    if library is OPEN_MPI:
        write_text_atomically(args.output, rules_file(choices, count))
        how = (f"OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_dynamic_rules_filename={args.output} "
               "OMPI_MCA_coll=^han,xhc,acoll")
    else:
        try:
            base = default_selection(args.library)
        except (OSError, RuntimeError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        write_json_atomically(args.output, selection_file(choices, count, base))
        how = f"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE={args.output} MPIR_CVAR_DEVICE_COLLECTIVES=none"
    print(f"# {library.name}'s fastest all-reduce per size on {count} ranks")
    print(f"{'bytes':>10}  {'algorithm':<28} {'us':>10}")
    for size, (name, us) in sorted(best.items()):
        print(f"{size:>10}  {name:<28} {us:>10.1f}")
    print(f"wrote {args.output}; {library.name} follows it with {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
