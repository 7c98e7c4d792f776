"""The command line every rank of a job parses alike: one :class:`Parser` for the sweep, the
tools and ``python -m topology``. All ranks read the same argv, so a bad argument is one line
from rank 0 alone (the launcher would print every rank's) and exit 2 on every rank."""

import argparse
import sys

from .launcher import world_rank


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors come from rank 0 alone (the launcher's rank,
    read before MPI starts), every rank exiting 2."""

    def error(self, message):
        if world_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            sys.stderr.flush()
        raise SystemExit(2)


def comma_names(text):
    """The names of a comma list, in order, blanks dropped: ``"ring, tree,"`` -> ``["ring", "tree"]``."""
    return [name.strip() for name in text.split(",") if name.strip()]


def pick(text, known, flag, what="", every=None, choices=None):
    """``known[name]`` ({name: value}) of each name of the comma list ``text``, in order; with
    ``every`` (its word, "all"), that word alone gives every value. ``ValueError`` reading
    "unknown --algo butterfly for allgather; choices: ring,rd,all" otherwise, alike in every tool
    (``choices``: the names it lists, where ``known`` is too many to list: default its own)."""
    names = comma_names(text)
    if every is not None and names == [every]:
        return list(known.values())
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        choices = ",".join([*(known if choices is None else choices), *([every] if every is not None else [])])
        raise ValueError(f"unknown {flag} {','.join(unknown) or repr(text)}{f' for {what}' if what else ''}; "
                         f"choices: {choices}")
    return [known[name] for name in names]


def flag_values(argv, flag):
    """Every value of ``flag`` in ``argv`` (``--algo X`` or ``--algo=X``), read before the
    parser runs (before ``MPI_Init``, say), in order."""
    values = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            values.append(arg[len(flag) + 1:])
    return values
