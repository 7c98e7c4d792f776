"""The nccl-tests text format: header, one row per size, out-of-bounds and average lines.

Row format as nccl-tests prints it: ``%12li  %12li  %8s  %6s  %6i`` (size, count,
type, redop, root), then for out-of-place and in-place ``  %7s  %6.2f  %6.2f  %6g``
(time in us, algbw and busbw in GB/s, #wrong), so parsers written for
nccl-tests (SuperBench's, for one) read it unchanged.
"""

import math

from algorithms.dtypes import nccl_name

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"  # -S, as nccl-tests writes it


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
