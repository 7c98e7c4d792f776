"""The flags the benchmark's tools share, declared once: message sizes as nccl-tests takes them
(``-b``, ``-e``, ``-f``; each tool its own defaults), the algorithms (``--algo``) and the
element types (``-d``, ``--dtype``), each name resolved once against the set the tool declares
with the same errors in every tool, and a uniform network for the cost model (``--ranks``,
``--ranks-per-node``, ``--alpha-us``, ``--beta-GBps``, ``--intra-GBps``). Parsers are
:class:`plumbing.cli.Parser`: a bad argument is one line from rank 0."""

import argparse
from typing import NamedTuple

from algorithms.dtypes import BY_NAME, TYPES, names_text
from plumbing.cli import Parser, comma_names, pick
from plumbing.units import parse_size

__all__ = ["Parser", "Types", "add_algo_flag", "add_dtype_flag", "add_network_flags", "add_size_flags", "algos_in",
           "size_type"]


def size_type(text):
    """A byte count with an optional K, M or G suffix (powers of 1024), for ``type=``."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_size_flags(p, minbytes, maxbytes, stepfactor, group=None, what="message size", step_note=""):
    """``-b``, ``-e``, ``-f`` with these defaults (``minbytes``, ``maxbytes``: text as typed, "8",
    "256M"), in ``group`` where given; ``step_note`` follows ``-f``'s help."""
    into = group or p
    into.add_argument("-b", "--minbytes", type=size_type, default=minbytes, metavar="BYTES",
                      help=f"smallest {what} in bytes, K/M/G suffixes (powers of 1024) (default {minbytes})")
    into.add_argument("-e", "--maxbytes", type=size_type, default=maxbytes, metavar="BYTES",
                      help=f"largest {what} in bytes, K/M/G suffixes (default {maxbytes})")
    into.add_argument("-f", "--stepfactor", type=int, default=stepfactor, metavar="F",
                      help=f"each size is F times the one before{step_note} (default {stepfactor})")


def add_network_flags(p, alpha_us, beta_GBps, ranks_help, ranks_type=str, ranks_default=None):
    """The uniform network of the cost model: ``--ranks`` (``ranks_help`` says what it takes),
    ``--ranks-per-node``, ``--alpha-us``, ``--beta-GBps``, ``--intra-GBps``."""
    p.add_argument("--ranks", type=ranks_type, default=ranks_default, help=ranks_help)
    p.add_argument("--ranks-per-node", type=int, default=1, metavar="R",
                   help="R consecutive ranks a node, sharing its port (default 1: every rank a node)")
    p.add_argument("--alpha-us", type=float, default=alpha_us, help=f"start-up time per message, in us "
                                                                    f"(default {alpha_us:g})")
    p.add_argument("--beta-GBps", type=float, default=beta_GBps,
                   help=f"link bandwidth between nodes, and each node's port, in GB/s (default {beta_GBps:g})")
    p.add_argument("--intra-GBps", type=float,
                   help="with --ranks-per-node: link bandwidth within a node, in GB/s (default 10 x --beta-GBps)")


def add_algo_flag(p, default, help, group=None):
    """``--algo``: a comma list of algorithms (``default``: the text a tool starts from; None:
    the flag is required), which the tool resolves once, after parsing, against the set it
    declares (:func:`algos_in`)."""
    (group or p).add_argument("--algo", default=default, required=default is None, metavar="NAMES", help=help)


def algos_in(text, known, what="", every="all", choices=None):
    """``known[name]`` ({name: an entry, a record, a name}) of each name of ``--algo``'s comma
    list ``text``, in order, ``every`` alone giving them all; ``ValueError`` naming the unknown
    ones and the choices (``choices``, where not ``known``'s names), worded alike in every tool
    (``what``: "allgather")."""
    return pick(text, known, "--algo", what, every, choices)


class Types(NamedTuple):
    """The rows of the table of types a type flag of several names gave, and whether they came
    from ``all``."""

    rows: list
    every: bool = False


def add_dtype_flag(p, default, help, flags=("-d", "--datatype"), many=False, every=False, among=TYPES, group=None):
    """A type flag, its names resolved while parsing to rows of the table of types
    (:data:`algorithms.dtypes.TYPES`): every name the table knows of a row (nccl-tests', NumPy's,
    the aliases, ``bench train``'s) is taken, of the rows ``among`` that the tool runs. One name
    gives its row; with ``many`` (a comma list) or ``every`` (``all`` stands for every row of
    ``among``) a :class:`Types`. ``help`` says what the types are for; the names follow it."""
    def resolve(text):
        names = comma_names(text)
        if every and names == ["all"]:
            return Types(list(among), True)
        unknown = [n for n in names if n not in BY_NAME or BY_NAME[n] not in among]
        if unknown or not names or (len(names) > 1 and not many):
            problem = (f"one type, not {text!r}" if not unknown and names else
                       f"unknown type {','.join(unknown) or repr(text)}")
            raise argparse.ArgumentTypeError(f"{problem}; choices: {names_text(among)}{', all' if every else ''}")
        rows = list(dict.fromkeys(BY_NAME[n] for n in names))
        return Types(rows) if many or every else rows[0]
    (group or p).add_argument(*flags, type=resolve, default=default, metavar="TYPE" + ("S" if many else ""),
                              help=f"{help}: {names_text(among)}{', or all' if every else ''} (default {default})")
