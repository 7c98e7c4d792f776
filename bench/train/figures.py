"""The figures and text of ``python -m bench train``, shared by its DDP and FSDP runs: a -J
figure (the median over the rounds with its 95% interval), ratios paired by round, and the
tables' cells."""

from ..formats import stats
from ..formats.tables import significant


def table_lines(columns, units, rows, keys=3, width=120):
    """A table: the header and units as "# " lines, then a line a row ("  "), every column as wide
    as its widest cell, the first aligned left and the others right. Where a line would pass
    ``width`` columns, the columns after the first ``keys`` go into as many tables as they need,
    one after another ("#" between), each starting with those ``keys`` columns."""
    widths = [max(len(cell) for cell in column) for column in zip(columns, units, *rows)]

    def line(cells, lead, picked):
        return lead + "  ".join(f"{cells[i]:<{widths[i]}}" if i == 0 else f"{cells[i]:>{widths[i]}}"
                                for i in picked).rstrip()

    key_width = 2 + sum(widths[:keys]) + 2 * max(keys - 1, 0)
    groups, used = [[]], key_width
    for i in range(keys, len(columns)):
        if groups[-1] and used + 2 + widths[i] > width:
            groups.append([])
            used = key_width
        groups[-1].append(i)
        used += 2 + widths[i]
    made = []
    for group in groups:
        picked = [*range(keys), *group]
        made += (["#"] if made else []) + [line(columns, "# ", picked), line(units, "# ", picked),
                                           *(line(row, "  ", picked) for row in rows)]
    return made


def run_label(run):
    """A run's name in tables and pictures: "ring", "ring+ovl" (on the communication thread), "gloo"."""
    return run["algorithm"] + ("+ovl" if run["overlap"] and run["algorithm"] != "gloo" else "")


def mib(nbytes):
    """ "96.0 MiB", "16.3 KiB", "512 B"."""
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{nbytes} B"


def number(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def gloo_ratio_cell(ratio):
    """ "0.47x [0.17, 0.77]", then " tie" where the paired ratio's interval holds 1; "-" for None."""
    return span(ratio, "x") + (" tie" if ratio and ratio["verdict"] == "tie" else "")


def span(figure, unit=""):
    """ "183 [175, 190]": a figure's median and 95% interval (a -J figure, :meth:`stats.Interval.as_dict`);
    "-" for None."""
    if figure is None:
        return "-"
    return f"{significant(figure['median'])}{unit} [{significant(figure['ci_low'])}, {significant(figure['ci_high'])}]"


def percentile(values, p):
    """nccl-tests' percentile (:func:`bench.core.timing.iteration_stats`): the ceil(n p / 100)-th smallest."""
    kept = sorted(values)
    return kept[min(len(kept) - 1, (len(kept) * p + 99) // 100 - 1)]


def figure(values):
    """A figure of the -J document: the median of ``values`` (one a round) with its interval."""
    return stats.median_interval(values).as_dict()


def ratios(numerators, denominators):
    """(per round a / b, None where b <= 0, which :func:`stats.paired_ratio` leaves out; their
    :class:`stats.Interval`, None where no round has one)."""
    per_round = [a / b if b > 0 else None for a, b in zip(numerators, denominators)]
    if all(r is None for r in per_round):
        return per_round, None
    return per_round, stats.paired_ratio(numerators, denominators)


def against_gloo(made, per_round, step, compute, gloo):
    """Set a run's "step_vs_gloo" and "exposed_vs_gloo" (paired by round, with the verdict) in
    ``made`` and their per-round ratios in ``per_round``, from its step and the reference's
    compute ms a round and gloo's rounds (``gloo``: each with its "steps_s"); nothing where
    ``gloo`` is None."""
    if gloo is None:
        return
    gloo_step = [stats.median(one["steps_s"]) * 1e3 for one in gloo]
    exposed = [s - c for s, c in zip(step, compute)]
    for name, mine, theirs in (("step", step, gloo_step),
                               ("exposed", exposed, [g - c for g, c in zip(gloo_step, compute)])):
        per_round[f"{name}_vs_gloo"], ratio = ratios(mine, theirs)
        made[f"{name}_vs_gloo"] = None if ratio is None else {**ratio.as_dict(), "verdict": stats.verdict(ratio)}
