"""The MPI library's own all-reduce algorithms as baselines, and the tuning files the library loads.

``--algo mpi:NAME`` runs ``MPI_Allreduce`` with the library told to use its algorithm NAME. It
reads that once, at ``MPI_Init``, so a run takes one NAME, and ``python -m bench`` sets it
before MPI starts (:func:`environment_for`):

* MPICH (:data:`MPICH`): ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=NAME``, with
  ``MPIR_CVAR_DEVICE_COLLECTIVES=none``, without which MPICH's shared-memory device collectives
  (``release_gather`` within a node) answer first and NAME is never asked, and
  ``MPIR_CVAR_COLLECTIVE_FALLBACK=print``, so that where NAME cannot run a call (``ring`` needs a
  commutative op, ``reduce_scatter_allgather`` at least as many elements as the largest power
  of two below the rank count) MPICH says so on stderr before it runs its own choice instead (as
  it does for ``reduce_scatter_allgather`` in ``MPI_Init``'s own one-element all-reduce).
* Open MPI (:data:`OPEN_MPI`, under Open MPI's ``mpiexec``): its coll/tuned algorithm number
  (``OMPI_MCA_coll_tuned_allreduce_algorithm``, with ``OMPI_MCA_coll_tuned_use_dynamic_rules=1``
  and ``OMPI_MCA_coll=^han,xhc,acoll``, so that coll/tuned, not a component above it, answers).

``python -m bench mpi-tuning RESULTS... -o FILE`` reads the runs of ``mpi:NAME`` (``-J`` files or
logs), picks the library's fastest algorithm per size (out of place), each size's choice
reaching to the geometric mean with the next measured size, and writes what that library loads:

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

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field

PREFIX = "mpi:"


@dataclass(frozen=True, eq=False)  # compared and hashed as the one object per library
class Library:
    """One MPI library's menu: NAME -> the value of ``variable`` that forces it, and what else it needs."""
    name: str
    menu: dict
    variable: str
    forced: dict = field(default_factory=dict)

    def environment(self, algorithm):
        return {self.variable: self.menu[algorithm], **self.forced}


MPICH = Library("MPICH", {n: n for n in ("recursive_doubling", "recursive_multiplying", "reduce_scatter_allgather",
                                         "tree", "recexch", "ring", "k_reduce_scatter_allgather")},
                "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
                {"MPIR_CVAR_DEVICE_COLLECTIVES": "none", "MPIR_CVAR_COLLECTIVE_FALLBACK": "print"})
#: coll/tuned's all-reduce algorithms 1-6 (ompi_info --param coll tuned --level 9 lists them); Open MPI 5.0
#: refuses 7 (allgather_reduce, of later versions) with a warning and runs its default instead
OPEN_MPI = Library("Open MPI", {"basic_linear": "1", "nonoverlapping": "2", "recursive_doubling": "3", "ring": "4",
                                "segmented_ring": "5", "rabenseifner": "6"},
                   "OMPI_MCA_coll_tuned_allreduce_algorithm",
                   {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll": "^han,xhc,acoll"})
MENU = tuple(MPICH.menu)  # MPICH's, the library this suite installs
#: the parameters an MPICH selection file gives each algorithm: those of the mpi:NAME runs (MPICH's
#: CVAR defaults: MPIR_CVAR_ALLREDUCE_TREE_*, _RECEXCH_*, _RECURSIVE_MULTIPLYING_KVAL); a tree
#: without its k divides by zero
PARAMETERS = {"tree": ("tree_type=knomial_1", "k=2", "chunk_size=0", "buffer_per_child=0"),
              "recexch": ("k=2", "single_phase_recv=0"), "k_reduce_scatter_allgather": ("k=2", "single_phase_recv=0"),
              "recursive_multiplying": ("k=2",)}


def launched_by(env):
    """The library whose launcher started this process: Open MPI's sets ``OMPI_COMM_WORLD_SIZE``."""
    return OPEN_MPI if "OMPI_COMM_WORLD_SIZE" in env else MPICH


def library_of(version):
    """The :class:`Library` of an ``MPI_Get_library_version`` text, or None."""
    return MPICH if version.startswith("MPICH") else OPEN_MPI if version.startswith("Open MPI") else None


def algo_entries(argv, prefix):
    """The entries of ``--algo`` in ``argv`` that start with ``prefix``, in order."""
    names = []
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--algo" and i + 1 < len(argv) else arg[7:] if arg.startswith("--algo=") else None
        if value:
            names += [a for a in value.split(",") if a.startswith(prefix)]
    return names


def requested(argv):
    """The NAMEs of the ``mpi:NAME`` entries of ``--algo`` in ``argv``, in order."""
    return [a[len(PREFIX):] for a in algo_entries(argv, PREFIX)]


def environment_for(argv, env):
    """The variables a run of ``argv`` needs, set before ``MPI_Init``, or a problem in words."""
    names = requested(argv)
    if not names:
        return {}
    library = launched_by(env)
    unknown = [n for n in names if n not in library.menu]
    if unknown:
        return f"unknown {library.name} all-reduce algorithm {', '.join(unknown)}; choices: {', '.join(library.menu)}"
    if len(set(names)) > 1:
        return (f"one mpi:NAME per run ({', '.join(PREFIX + n for n in dict.fromkeys(names))} given): {library.name} "
                f"reads {library.variable} once, at MPI_Init")
    wanted = library.environment(names[0])
    clashes = [f"{k}={env[k]}" for k, v in wanted.items() if env.get(k, v) != v]
    if clashes:
        return f"--algo {PREFIX}{names[0]} sets {', '.join(f'{k}={v}' for k, v in wanted.items())}, but {', '.join(clashes)} is set"
    return wanted


def current_library():
    """The :class:`Library` of the MPI this process runs, or None (neither MPICH nor Open MPI)."""
    from mpi4py import MPI

    return library_of(MPI.Get_library_version())


def library_path():
    """The file of the MPI library this process loaded (``libmpi``), from its memory map."""
    from mpi4py import MPI

    MPI.Get_library_version()  # the library is loaded
    with open("/proc/self/maps") as maps:
        found = [line.split()[-1] for line in maps if re.search(r"/libmpi(ch)?\.so", line)]
    if not found:
        raise RuntimeError("no libmpi in this process's memory map")
    return found[0]


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


def placement_time(cell):
    from .results import placement_time as time_of  # bench.results imports mpi4py: not before MPI_Init is set up

    return time_of(cell)


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
    p = argparse.ArgumentParser(prog="python -m bench mpi-tuning", description=(
        "From runs of --algo mpi:NAME, the MPI library's fastest all-reduce per size, written as the tuning "
        "file that library loads (MPICH's selection JSON, Open MPI's coll/tuned rules)."))
    p.add_argument("results", nargs="+", help="-J files or logs of runs with --algo mpi:NAME (all of one library)")
    p.add_argument("-o", "--output", required=True,
                   help="the file to write (required): MPICH's selection JSON, or Open MPI's coll/tuned rules")
    p.add_argument("--library", help="MPICH: the libmpi file whose default selection the file starts from "
                                     "(default: the one this Python's mpi4py loads)")
    args = p.parse_args(argv)
    from topology.files import write_json_atomically, write_text_atomically

    from .results import read_results

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
