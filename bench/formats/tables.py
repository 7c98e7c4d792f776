"""Text for the offline tools (compare, model, scaling): numbers, sizes and tables that fit
:data:`WIDTH` columns."""

import itertools
import math
import re
import textwrap

from algorithms.settings import size_text

WIDTH = 120  # the widest line a tool prints
_UNITS = (("GiB", 30), ("MiB", 20), ("KiB", 10))


def significant(value, digits=3):
    """``value`` with ``digits`` significant digits, never in e-notation and never dropping
    integer digits: 0.000498, 0.0166, 1.09, 65.5, 235, 63896."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def ratio_text(ratio):
    """A ratio as "1.23x", "0.0166x", "216x"."""
    return f"{significant(ratio)}x"


def size_label(nbytes):
    """A size in binary units: "8 B", "1 KiB", "4 MiB" (:func:`algorithms.settings.size_text`),
    or "120.6 KiB" for a size that is not a whole number of them."""
    exact = size_text(nbytes)
    if exact.endswith(" B") and nbytes >= 1024:
        unit, shift = next((u, s) for u, s in _UNITS if nbytes >= 1 << s)
        return f"{nbytes / (1 << shift):.1f} {unit}"
    return exact


def plural(count, word):
    """ "1 rank", "2 ranks", "1 level"."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def comment(text):
    """``text`` as "# " lines of at most :data:`WIDTH` columns."""
    return "\n".join(textwrap.wrap(text, WIDTH, initial_indent="# ", subsequent_indent="#   ",
                                   break_on_hyphens=False))


def table(header, rows, left=(0,)):
    """Lines of a table: every column as wide as its widest cell, two spaces apart; the
    columns numbered in ``left`` (names) align left, the others (numbers) right. A blank line
    sets apart each run of rows sharing their first cell (a size), where a run has several."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(f"{c:<{w}}" if i in left else f"{c:>{w}}"
                         for i, (c, w) in enumerate(zip(map(str, cells), widths))).rstrip()
    lines, previous = [line(header)], []
    for _, run in itertools.groupby(rows, key=lambda row: row[0]):
        run = list(run)
        if previous and max(len(run), len(previous)) > 1:
            lines.append("")
        lines += [line(row) for row in run]
        previous = run
    return lines


def description(doc):
    """A module docstring's first paragraph as an argparse description (wrapped, no RST marks)."""
    first = doc.strip().split("\n\n")[0]
    return textwrap.fill(re.sub(r"\s+", " ", first.replace("``", "")), 79)


def epilog(doc):
    """The rest of a module docstring, as written (no RST marks), for a raw argparse epilog."""
    return doc.strip().split("\n\n", 1)[1].replace("``", "")
