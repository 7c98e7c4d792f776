"""``python -m bench nccl-tuning RESULTS... -o FILE``: the tuner-plugin file NCCL loads, from runs
of ``--algo nccl:ALGO/PROTO`` (:mod:`bench.baselines.nccl`) or nccl-tests logs.

It reads runs of ``nccl:ALGO/PROTO`` (``-J``
files or logs) and nccl-tests logs run with ``NCCL_ALGO``/``NCCL_PROTO`` set and
``NCCL_DEBUG=INFO`` (whose ``NCCL_ALGO set by environment to ...`` lines name the pair), and
writes the CSV file of NCCL's example tuner plugin (``plugins/tuner/example`` of NCCL, loaded
with ``NCCL_TUNER_PLUGIN`` and ``NCCL_TUNER_CONFIG_FILE``): per collective and size range, every
measured pair, fastest first, each line
``collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks``. The plugin
applies the first line that matches a call and whose pair NCCL allows on that communicator, so a
pair NCCL rules out falls through to the next fastest. Each measured size's range reaches to the
geometric mean with the next measured size; the first starts at 0, the last ends at 2^64 - 1.

Channels: the example plugin sets 1 channel for every call whose line says -1 and for every call
no line matches, so each line carries a channel count: the one the runs' ``NCCL_DEBUG=INFO``
lines report (``N coll channels``; ``nvls``, ``collnet`` channels for those algorithms), or
``--channels``.

``--plugin SO`` loads a tuner plugin (its ``ncclTunerPlugin_v5`` table) with ctypes, gives it
the written file and asks it, at every measured size, which pair it prefers
(:func:`plugin_choice`): the file is shown to be read as meant without a GPU.
"""

import ctypes
import math
import os
import re
import sys

from plumbing.cli import Parser
from plumbing.files import write_text_atomically

from ..baselines.nccl import NCCL_ALGOS, PREFIX, PROTOCOLS, split
from ..formats.logs import LogError, read_log
from ..formats.results import placement_time, read_results

#: the collectives of the tuner file, in NCCL's ncclFunc_t order (ncclFuncBroadcast = 0 ...)
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
#: nccl-tests' programs -> the tuner file's collective names
PROGRAMS = {"broadcast_perf": "broadcast", "reduce_perf": "reduce", "all_gather_perf": "allgather",
            "reduce_scatter_perf": "reducescatter", "all_reduce_perf": "allreduce"}
LARGEST = (1 << 64) - 1
LINE_LIMIT = 255  # the example plugin reads lines of up to 255 characters
IGNORE = -1.0  # NCCL_ALGO_PROTO_IGNORE: a pair NCCL rules out


# ---- reading runs --------------------------------------------------------------------------

def _forced(value, collective, table):
    """The one name of ``table`` an ``NCCL_ALGO``/``NCCL_PROTO`` value forces for ``collective``
    (``ring``, ``allreduce:tree;allgather:ring``), or None when it leaves NCCL a choice."""
    value = value.strip()
    if ":" in value:
        parts = dict(p.split(":", 1) for p in value.split(";") if ":" in p)
        value = next((v for k, v in parts.items() if k.strip().lower() == collective), "")
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    by_value = {v.lower(): k for k, v in table.items()}
    if len(names) != 1 or names[0].startswith("^") or names[0] not in by_value:
        return None
    return by_value[names[0]]


def read_vendor_log(path, collective=None):
    """Rows of an nccl-tests log run with ``NCCL_ALGO``, ``NCCL_PROTO`` and ``NCCL_DEBUG=INFO``:
    ``{"algorithm": "nccl:ALGO/PROTO", "collective", "size", "out_of_place", "ranks", "hosts",
    "channels"}``; ``ValueError`` with the reason when it is not such a log."""
    try:
        rows = read_log(path)
    except LogError as exc:
        raise ValueError(str(exc)) from None
    with open(path, errors="replace") as f:
        text = f.read()
    program = re.search(r"Collective test starting:\s*(\S+)", text)
    collective = (PROGRAMS.get(program.group(1)) if program else None) or collective or "allreduce"
    found = {}
    for variable, table in (("NCCL_ALGO", NCCL_ALGOS), ("NCCL_PROTO", PROTOCOLS)):
        said = re.findall(rf"{variable} set by environment to (\S+)", text)
        if not said:
            raise ValueError(f"{path}: no '{variable} set by environment to' line: run nccl-tests with "
                             f"{variable} set and NCCL_DEBUG=INFO")
        found[variable] = _forced(said[0], collective, table)
        if found[variable] is None:
            raise ValueError(f"{path}: {variable}={said[0]} leaves NCCL a choice for {collective}: "
                             "one algorithm and one protocol per log")
    hosts = {}
    for rank, host in re.findall(r"#\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device", text):
        hosts[int(rank)] = host
    channels = {kind: int(n) for n, kind in re.findall(r"\b(\d+) (coll|collnet|nvls) channels", text)}
    name = f"{PREFIX}{found['NCCL_ALGO']}/{found['NCCL_PROTO']}"
    return [{"algorithm": name, "collective": collective, "size": r["size"], "out_of_place": r["out_of_place"],
             "ranks": len(hosts) or None, "hosts": sorted(set(hosts.values())), "channels": channels}
            for r in rows if r["size"] > 0]


def read_runs(path, collective=None):
    """The ``nccl:ALGO/PROTO`` rows of one file: ours (``-J`` or a log) or an nccl-tests log."""
    try:
        rows = [r for r in read_results(path) if str(r.get("algorithm", "")).startswith(PREFIX)]
    except (ValueError, UnicodeDecodeError):
        rows = []
    if rows:
        return rows
    return read_vendor_log(path, collective)


def ranking(rows):
    """{(collective, bytes): [(algorithm, protocol, us), ...] fastest first}, out of place."""
    best = {}
    for row in rows:
        pair = split(row["algorithm"])
        if pair is None or int(row["size"]) <= 0:
            continue
        key = (row.get("collective", "allreduce"), int(row["size"]))
        us = float(placement_time(row["out_of_place"]))
        table = best.setdefault(key, {})
        table[pair] = min(us, table.get(pair, math.inf))
    return {key: sorted(((a, p, us) for (a, p), us in table.items()), key=lambda t: t[2])
            for key, table in best.items()}


def channel_count(rows, algorithm):
    """The channel count the runs' NCCL reported for ``algorithm``, or None."""
    kind = "nvls" if algorithm.startswith("nvls") else "collnet" if algorithm.startswith("collnet") else "coll"
    counts = {r["channels"][kind] for r in rows if isinstance(r.get("channels"), dict) and kind in r["channels"]}
    return max(counts) if counts else None


# ---- the tuner file ------------------------------------------------------------------------

def ranges(sizes):
    """[(size, lo, hi)]: each measured size's byte range, to the geometric mean with the next."""
    sizes = sorted(sizes)
    out = []
    for i, size in enumerate(sizes):
        lo = 0 if i == 0 else math.isqrt(sizes[i - 1] * size) + 1
        hi = math.isqrt(size * sizes[i + 1]) if i + 1 < len(sizes) else LARGEST
        out.append((size, lo, hi))
    return out


def tuner_csv(ranked, nodes, ranks, channels, header=()):
    """The example tuner plugin's file for ``ranked`` (:func:`ranking`): per collective and range,
    every measured pair fastest first, neighbouring sizes of the same order merged into one range;
    ``channels(algorithm)`` gives each line's channel count."""
    lines = [f"# {h}" for h in header]
    lines.append("# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks")
    for collective in COLLECTIVES:
        spans = []  # [lo, hi, pairs]: neighbouring sizes with the same order are one range
        for size, lo, hi in ranges([size for c, size in ranked if c == collective]):
            pairs = [(a, p) for a, p, _ in ranked[collective, size]]
            if spans and spans[-1][2] == pairs:
                spans[-1][1] = hi
            else:
                spans.append([lo, hi, pairs])
        for lo, hi, pairs in spans:
            for algorithm, protocol in pairs:
                lines.append(f"{collective},{lo},{hi},{algorithm},{protocol},{channels(algorithm)},{nodes},{ranks}")
    too_long = [line for line in lines if len(line) > LINE_LIMIT]
    if too_long:
        raise ValueError(f"a line longer than the plugin reads ({LINE_LIMIT} characters): {too_long[0][:60]}...")
    return "\n".join(lines) + "\n"


# ---- asking a tuner plugin -----------------------------------------------------------------

class _TunerV5(ctypes.Structure):
    """NCCL's ``ncclTuner_v5_t`` (nccl_tuner.h): name, init, getCollInfo, finalize."""
    _fields_ = [("name", ctypes.c_char_p), ("init", ctypes.c_void_p), ("getCollInfo", ctypes.c_void_p),
                ("finalize", ctypes.c_void_p)]


_INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64, ctypes.c_size_t,
                         ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int,
                        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
_FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def plugin_choice(plugin, config, queries, ranks, nodes, allowed=None):
    """Ask the tuner plugin ``plugin`` (a shared object exporting ``ncclTunerPlugin_v5``), with
    ``NCCL_TUNER_CONFIG_FILE=config``, for each ``(collective, bytes)`` of ``queries``: the
    (algorithm, protocol, channels) it makes cheapest in a cost table of 1.0 everywhere (the pairs
    outside ``allowed``, a set of (algorithm, protocol), marked as NCCL marks those it rules out),
    or None where it leaves the table as it was."""
    previous = os.environ.get("NCCL_TUNER_CONFIG_FILE")
    os.environ["NCCL_TUNER_CONFIG_FILE"] = config
    try:
        library = ctypes.CDLL(os.path.abspath(plugin))
        table = _TunerV5.in_dll(library, "ncclTunerPlugin_v5")
        context = ctypes.c_void_p()
        if _INIT(table.init)(ctypes.byref(context), 1, ranks, nodes, None, None, None) != 0:
            raise RuntimeError(f"{plugin}: init failed")
    finally:
        if previous is None:
            os.environ.pop("NCCL_TUNER_CONFIG_FILE", None)
        else:
            os.environ["NCCL_TUNER_CONFIG_FILE"] = previous
    algorithms, protocols = list(NCCL_ALGOS), list(PROTOCOLS)
    answers = []
    try:
        for collective, nbytes in queries:
            costs = (ctypes.c_float * (len(algorithms) * len(protocols)))()
            for a, algorithm in enumerate(algorithms):
                for p, protocol in enumerate(protocols):
                    ok = allowed is None or (algorithm, protocol) in allowed
                    costs[a * len(protocols) + p] = 1.0 if ok else IGNORE
            channels = ctypes.c_int(0)
            if _GET(table.getCollInfo)(context, COLLECTIVES.index(collective), nbytes, 1, ctypes.addressof(costs),
                                       len(algorithms), len(protocols), 0, ctypes.byref(channels)) != 0:
                raise RuntimeError(f"{plugin}: getCollInfo failed at {collective} {nbytes} B")
            cheapest = min(range(len(costs)), key=lambda i: (costs[i] < 0, costs[i]))
            answers.append(None if costs[cheapest] == 1.0 or costs[cheapest] < 0 else
                           (algorithms[cheapest // len(protocols)], protocols[cheapest % len(protocols)], channels.value))
    finally:
        _FINALIZE(table.finalize)(context)
    return answers


# ---- the command ---------------------------------------------------------------------------

def main(argv=None):
    p = Parser(prog="python -m bench nccl-tuning", description=(
        "From runs of --algo nccl:ALGO/PROTO, or nccl-tests logs run with NCCL_ALGO, NCCL_PROTO and "
        "NCCL_DEBUG=INFO, NCCL's fastest algorithm and protocol per collective and size, written as the CSV "
        "file of NCCL's example tuner plugin (NCCL_TUNER_CONFIG_FILE)."))
    p.add_argument("results", nargs="+", help="-J files or logs of --algo nccl:ALGO/PROTO runs, or nccl-tests "
                                              "logs (one algorithm and protocol each; one rank count and node count)")
    p.add_argument("-o", "--output", required=True, help="the CSV file to write (required)")
    p.add_argument("--channels", type=int, help="the channel count of every line, -1 for 'NCCL's own' (which "
                   "NVIDIA's example plugin reads as 1) (default: what the logs' NCCL reported)")
    p.add_argument("--collective", choices=COLLECTIVES, default=None,
                   help="the collective of nccl-tests logs that do not name their program (default allreduce)")
    p.add_argument("--plugin", metavar="SO", help="then ask this tuner plugin (e.g. NCCL's "
                   "libnccl-tuner-example.so) for its choice at every measured size, and fail unless it follows the file "
                   "(default: none)")
    args = p.parse_args(argv)
    prog = "python -m bench nccl-tuning"
    rows = []
    for path in args.results:
        try:
            rows += read_runs(path, args.collective)
        except (OSError, ValueError) as exc:
            print(f"{prog}: {path}: {exc}", file=sys.stderr)
            return 2
    if not rows:
        print(f"{prog}: no nccl:ALGO/PROTO rows in " + ", ".join(args.results), file=sys.stderr)
        return 2
    ranks = {int(r["ranks"]) for r in rows if r.get("ranks")}
    nodes = {len(r["hosts"]) for r in rows if r.get("hosts")}
    if len(ranks) != 1 or len(nodes) != 1:
        print(f"{prog}: the runs must share one rank count and one node count; these have ranks {sorted(ranks)}, "
              f"nodes {sorted(nodes)}", file=sys.stderr)
        return 2
    count, hosts = ranks.pop(), nodes.pop()
    ranked = ranking(rows)
    if args.channels is not None:
        if args.channels == 0 or args.channels < -1:
            print(f"{prog}: --channels must be positive, or -1", file=sys.stderr)
            return 2
        channels = {a: args.channels for a in NCCL_ALGOS}
    else:
        channels = {a: channel_count(rows, a) for a, _, _ in (t for v in ranked.values() for t in v)}
        unknown = sorted(a for a, c in channels.items() if c is None)
        if unknown:
            print(f"{prog}: no channel count for {', '.join(unknown)} in the runs (nccl-tests logs with NCCL_DEBUG=INFO "
                  "say 'N coll channels'): give --channels N (-1: NCCL's own, which NVIDIA's example plugin reads as "
                  "1 channel)", file=sys.stderr)
            return 2
    header = [f"NCCL's fastest algorithm and protocol per size on {count} ranks, {hosts} node(s), from python -m "
              "bench nccl-tuning;", "every measured pair per range, fastest first: the example plugin takes the "
              "first that NCCL allows."]
    try:
        text = tuner_csv(ranked, hosts, count, channels.__getitem__, header)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    write_text_atomically(args.output, text)
    print(f"# NCCL's fastest algorithm/protocol per size on {count} ranks, {hosts} node(s)")
    print(f"{'collective':<14}{'bytes':>12}  {'algorithm/protocol':<22}{'us':>10}  next")
    for (collective, size), pairs in sorted(ranked.items(), key=lambda kv: (COLLECTIVES.index(kv[0][0]), kv[0][1])):
        a, pr, us = pairs[0]
        runner_up = f"{pairs[1][0]}/{pairs[1][1]} {pairs[1][2] / us:.2f}x" if len(pairs) > 1 else "-"
        print(f"{collective:<14}{size:>12}  {a + '/' + pr:<22}{us:>10.1f}  {runner_up}")
    print(f"wrote {args.output}; NCCL follows it with NCCL_TUNER_PLUGIN=<the example plugin> "
          f"NCCL_TUNER_CONFIG_FILE={args.output}")
    if args.plugin:
        queries = sorted(ranked, key=lambda k: (COLLECTIVES.index(k[0]), k[1]))
        try:
            answers = plugin_choice(args.plugin, args.output, queries, count, hosts)
        except (OSError, AttributeError, RuntimeError) as exc:
            print(f"{prog}: --plugin {args.plugin}: {exc}", file=sys.stderr)
            return 2
        wrong = [(q, a) for q, a in zip(queries, answers)
                 if a is None or a[:2] != ranked[q][0][:2] or a[2] != channels[ranked[q][0][0]]]
        if wrong:
            (collective, size), answer = wrong[0]
            print(f"{prog}: --plugin {args.plugin} does not follow the file: {collective} {size} B -> {answer}, "
                  f"measured fastest {ranked[collective, size][0][:2]}", file=sys.stderr)
            return 1
        print(f"{args.plugin} picks the measured fastest pair at all {len(queries)} sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
