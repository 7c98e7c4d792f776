"""The sweep's output, each row twice: the nccl-tests table (the header lines above it, one
row per size, the out-of-bounds and average lines) and the record the log and ``-J`` keep.

Row format as nccl-tests prints it: ``%12li  %12li  %8s  %6s  %6i`` (size, count,
type, redop, root), then for out-of-place and in-place ``  %7s  %6.2f  %6.2f  %6g``
(time in us, algbw and busbw in GB/s, #wrong), so parsers written for
nccl-tests (SuperBench's, for one) read it unchanged. A new column is a change here alone:
its header (:func:`columns`), its cell (:func:`row`) and its field (:func:`placement_cell`,
:func:`record`).
"""

import math
import time

from algorithms.dtypes import nccl_name

from . import stats

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"  # -S, as nccl-tests writes it
PLACEMENTS = ("out_of_place", "in_place")  # a row's two halves, in the table's order


def columns(per_iteration=False, cputime=False, timestamps=False):
    """The three header lines of a table, as nccl-tests prints them: ``time`` named ``cputime``
    with ``-C``, the per-iteration columns with ``-I 1``, a timestamp column with ``-S 1``."""
    time = "cputime" if cputime else "time"
    names, units, fields = [time, "algbw", "busbw", "#wrong"], ["(us)", "(GB/s)", "(GB/s)", ""], "  %7s  %6s  %6s  %6s"
    over = "           out-of-place                       in-place          "
    if per_iteration:
        names, units = names + ["i_min", "i_max", "i_p99", "i_cv%"], units + ["(us)", "(us)", "(us)", "(%)"]
        fields += "  %7s  %7s  %7s  %7s"
        over = ("              out-of-place (+ per-iteration)                                "
                "in-place (+ per-iteration)")
    pad, label, form = (19, "timestamp", TIMESTAMP_FORMAT) if timestamps else (0, "", "")
    lead = "# %10s  %12s  %8s  %6s  %6s"
    return "\n".join([
        lead % ("", "", "", "", "") + over,
        lead % ("size", "count", "type", "redop", "root") + (fields * 2) % tuple(names * 2) + " %*s" % (pad, label),
        lead % ("(B)", "(elements)", "", "", "") + (fields * 2) % tuple(units * 2) + " %*s" % (pad, form)])


def bandwidths(nbytes, seconds, factor):
    """(algbw, busbw) in GB/s (1e9 bytes)."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * factor


def time_text(us):
    """nccl-tests prints times with fewer decimals as they grow."""
    if us >= 10000:
        return f"{us:7.0f}"
    if us >= 100:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def float_text(value, width=7):
    """nccl-tests' getFloatStr: two decimals if they fit in ``width``, then one, then none."""
    for fmt in (f"{{:{width}.2f}}", f"{{:{width}.1f}}", f"{{:{width}.0f}}"):
        text = fmt.format(value)
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}"


def row(size, count, dtype, op, root, results, per_iteration=None, timestamp=None):
    """One table row; ``results`` is [(seconds, algbw, busbw, wrong)] for out-of-place, in-place;
    ``per_iteration`` (with ``-I 1``) the matching [stats dict] whose i_min, i_max, i_p99 and
    i_cv% follow each placement's #wrong; ``timestamp`` (``-S 1``) ends the row, as nccl-tests'
    ``%21s``."""
    text = f"{size:12d}  {count:12d}  {nccl_name(dtype):>8s}  {op:>6s}  {root:6d}"
    for k, (seconds, algbw, busbw, wrong) in enumerate(results):
        wrong_text = "N/A" if wrong is None else f"{wrong:g}"
        text += f"  {time_text(seconds * 1e6)}  {algbw:6.2f}  {busbw:6.2f}  {wrong_text:>6s}"
        if per_iteration is not None:
            st = per_iteration[k]
            text += "".join(f"  {float_text(st[key])}" for key in ("min_us", "max_us", "p99_us", "cv_pct"))
    return text + (f"{timestamp:>21s}" if timestamp is not None else "")


def footer(total_wrong, busbws):
    """The two closing lines nccl-tests prints."""
    status = "OK" if total_wrong == 0 else "FAILED"
    average = sum(busbws) / len(busbws) if busbws else 0.0
    if not math.isfinite(average):
        average = 0.0
    return f"# Out of bounds values : {total_wrong} {status}\n# Avg bus bandwidth    : {average:g}"


def header(args, algo, facts, device_lines, transport, engine):
    """The lines above ``algo``'s table: nccl-tests' (its configuration, the devices, the column
    names) and ours (the algorithm, its transport and engine, the timing, the machine).
    ``args``: the sweep's flags; ``facts``: what the run found once, {"ranks", "crowded" (the
    oversubscription, or ""), "info" (:func:`bench.core.machine.describe`), "timing" (the rule
    in words), "aggregation", "malloc", "kernels"}; ``device_lines``: each rank's device."""
    config_line = (
        f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} "
        f"step: {args.stepbytes if args.stepbytes else args.stepfactor}"
        f"({'bytes' if args.stepbytes else 'factor'}) warmup iters: {args.warmup_iters} "
        f"iters: {args.iters} agg iters: {args.agg_iters} validation: {1 if args.check else 0} graph: 0"
    )
    info, crowded = facts["info"], facts["crowded"]
    lines = [config_line]
    if args.blocking:
        lines.append("# Blocking Enabled: barrier after each iteration, inside the timing")
    if args.per_iter_timing:
        lines.append(f"# Per-Iteration Report: {'CUDA event' if args.device == 'gpu' else 'host clock'} timing; "
                     "i_* uses max over process rows"
                     + (f"; summary skips first {args.per_iter_skip} iterations" if args.per_iter_skip else ""))
    if crowded:
        lines.append(f"# Oversubscribed: {crowded}: times are not meaningful")
    lines += [
        "#",
        f"# Algorithm: {algo}  Collective: {args.collective}  Ranks: {facts['ranks']}  "
        f"Hosts: {len({d['hostname'] for d in device_lines})}  Device: {args.device}  "
        f"Time aggregation: {facts['aggregation']}  MPI: {info['mpi']}  Threads: {info['thread_level']}",
        f"# Transport: {transport}",
        *([f"# Engine: {engine}"] if engine else []),
        f"# Timing: {facts['timing']}",
        *([f"# Nodes: {hier_text(args.hier)}"] if algo == "hier" and args.hier else []),
        *(["# Buffers: registered (algorithms.alloc_registered; -R 1)"] if args.local_register else []),
        *([f"# Buffers: unaligned by {args.unalign} elements (-u)"] if args.unalign else []),
        f"# Machine: {info['machine']} {info['cpu']}  Python {info['python']}  numpy {info['numpy']}"
        f"  Commit: {info['commit']}",
        f"# Env: {info['env']}",
        f"# Malloc: {facts['malloc']}  Transparent huge pages: {info['transparent_hugepages']}  /dev/shm: {info['dev_shm']}",
        *([f"# Kernels: {facts['kernels']}"] if facts["kernels"] else []),
        "#",
        "# Using devices",
    ]
    for d in device_lines:
        lines.append(f"#  Rank {d['rank']:2d} Group  0 Pid {d['pid']:6d} on {d['hostname']:>10s} "
                     f"device {d['device']:2d} [{d['device_hex']}] {d['device_info']}")
    lines += ["#", columns(args.per_iter_timing, args.report_cputime, args.report_timestamps)]
    return "\n".join(lines)


def hier_text(layout):
    """hier's layout for its header: "2 nodes (0,0,1,1, from ALLREDUCE_NODE_MAP), ring across"."""
    nodes = layout["nodes"]
    count = max(nodes) + 1
    return (f"{count} node{'s' if count != 1 else ''} ({','.join(map(str, nodes))}, from {layout['source']}), "
            f"{layout['across']} across")


class Tables:
    """Rank 0's nccl-tests tables, one per algorithm (``heads``: {algorithm: its header}). With
    one algorithm (``stream``) its header prints at once and each row as it finishes; with
    several, which take turns within every size, each table prints whole, header, rows and
    footer, at :meth:`flush` (the sweep's end; with ``-N 0``, each cycle's end)."""

    def __init__(self, heads, say, stream):
        self.heads, self.say, self.stream = heads, say, stream
        self.lines = {algo: [] for algo in heads}
        self.wrong = dict.fromkeys(heads, 0)
        self.busbws = {algo: [] for algo in heads}
        if stream:
            for head in heads.values():
                say(head, flush=True)

    def add(self, algo, text, wrong=0, busbws=()):
        """A row (or a ``#`` line) of ``algo``'s table, with its wrong elements and busbw values."""
        if self.stream:
            self.say(text, flush=True)
        else:
            self.lines[algo].append(text)
        self.wrong[algo] += wrong
        self.busbws[algo] += busbws

    def flush(self, memory=None):
        """Every table not yet printed, each ended by nccl-tests' footer (and ``memory``, -M's line)."""
        for algo, head in self.heads.items():
            if not self.stream:
                self.say("\n".join([head, *self.lines[algo]]), flush=True)
            self.say(footer(self.wrong[algo], self.busbws[algo]), flush=True)
            if memory:
                self.say(memory, flush=True)
            self.say("#", flush=True)
            self.lines[algo], self.wrong[algo], self.busbws[algo] = [], 0, []


def placement_cell(full, host, nbytes, factor, cputime, wrong):
    """(a placement's JSON, its table cells (seconds, algbw, busbw, wrong)) from its rounds'
    seconds per call: ``time`` (``cpu_time`` with ``-C``: the host's) is the median of the
    rounds, algbw and busbw come from the median full time; ``time_ci`` is that median's 95%
    interval (:func:`.stats.median_interval`) and ``round_times_us`` every round's full time."""
    interval = stats.median_interval(full)
    algbw, busbw = bandwidths(nbytes, interval.median, factor)
    shown = stats.median(host) if cputime else interval.median
    cell = {("cpu_time" if cputime else "time"): shown * 1e6, "alg_bw": algbw, "bus_bw": busbw,
            "nwrong": None if wrong is None else float(wrong),
            "time_ci": interval.as_dict(1e6), "round_times_us": [t * 1e6 for t in full]}
    if cputime:
        cell["cpu_time_ci"] = stats.median_interval(host).as_dict(1e6)
        cell["round_cpu_times_us"] = [t * 1e6 for t in host]
    return cell, (shown, algbw, busbw, wrong)


def record(args, dtype, op, nbytes, count, factor, rounds, places, iterations, wrong):
    """One algorithm's record of a size, as the log and ``-J`` keep it, its table row in ``text``:
    ``rounds`` is [{placement: (seconds, host seconds) per call}] per round, each placement's time
    the median of the rounds (Hoefler and Belli, SC'15) with its 95% interval and every round's
    time; ``places`` the algorithm's turn in each round; ``iterations`` {placement: ``-I 1``'s
    statistics} or None; ``wrong`` {placement: wrong elements, or None unchecked}; ``factor``
    busbw's over algbw (the size moved ``nbytes``, ``count`` the count column)."""
    result = {"size": int(nbytes), "count": int(count), "type": nccl_name(dtype), "redop": op, "root": f"{-1:6d}",
              "actual_iterations": args.iters, "rounds": args.rounds, "round_positions": places}
    cells = []
    for placement in PLACEMENTS:
        full = [r[placement][0] for r in rounds]
        host = [r[placement][1] for r in rounds]
        result[placement], shown = placement_cell(full, host, nbytes, factor, args.report_cputime, wrong[placement])
        if iterations is not None:
            result[f"{placement}_per_iter"] = iterations[placement]
        cells.append(shown)
    if args.report_timestamps:
        result["timestamp"] = time.strftime(TIMESTAMP_FORMAT)
    result["text"] = row(nbytes, count, dtype, op, -1, cells,
                         None if iterations is None else [iterations[p] for p in PLACEMENTS], result.get("timestamp"))
    return result
