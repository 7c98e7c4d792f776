"""What ``bench doctor`` reports: findings, worst first, and what it could not check.

A finding's ``severity`` orders them (:data:`SEVERITIES`: ``high``, a fast path off or a
link several times slower than another at hand; ``medium``, a cost that depends on the
work; ``low``, a cost seen only in some runs); within one severity the larger measured
``factor`` (how many times slower, where measured) comes first.
"""

from dataclasses import asdict, dataclass, field

SEVERITIES = ("high", "medium", "low")


@dataclass
class Finding:
    check: str           # the check that found it: settings, binding, interfaces, machine, measured
    title: str           # what is wrong, in a few words
    severity: str        # one of SEVERITIES
    ranks: list          # the ranks it concerns
    evidence: str        # the figures, the variable and its value
    cost: str            # what it costs, measured or cited
    fix: str             # what to change
    nodes: list = field(default_factory=list)  # the host names of those ranks
    factor: float = None  # how many times slower, where measured

    def order(self):
        return SEVERITIES.index(self.severity), -(self.factor or 0.0)


@dataclass
class Unchecked:
    check: str
    what: str
    why: str
    nodes: list = field(default_factory=list)  # where


def merged(unchecked):
    """The same (check, what, why) on several nodes as one entry naming them all."""
    found = {}
    for u in unchecked:
        kept = found.setdefault((u.check, u.what, u.why), Unchecked(u.check, u.what, u.why, []))
        kept.nodes += [n for n in u.nodes if n not in kept.nodes]
    return list(found.values())


def ranks_text(ranks):
    """ "rank 3", "ranks 0-3", "ranks 0, 2, 5" (runs of consecutive ranks joined)."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    runs, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


def worst_first(found):
    return sorted(found, key=Finding.order)


def lines(found, unchecked):
    """The text rank 0 prints: each finding as a numbered block, then what was not checked."""
    out = []
    for number, f in enumerate(worst_first(found), 1):
        where = ranks_text(f.ranks) + (f" on {', '.join(f.nodes)}" if f.nodes else "")
        out += [f"{number}. [{f.severity}] {f.check}: {f.title} ({where})",
                f"   evidence: {f.evidence}", f"   cost: {f.cost}", f"   fix: {f.fix}"]
    for u in merged(unchecked):
        out.append(f"# not checked: {u.check}: {u.what}: {u.why}" + (f" ({', '.join(u.nodes)})" if u.nodes else ""))
    return out


def as_json(found, unchecked):
    return {"findings": [asdict(f) for f in worst_first(found)], "not_checked": [asdict(u) for u in merged(unchecked)]}
