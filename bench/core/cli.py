"""The flags the benchmark's tools share, declared once: message sizes as nccl-tests takes them
(``-b``, ``-e``, ``-f``; each tool its own defaults) and a uniform network for the cost model
(``--ranks``, ``--ranks-per-node``, ``--alpha-us``, ``--beta-GBps``, ``--intra-GBps``).
Parsers are :class:`plumbing.cli.Parser`: a bad argument is one line from rank 0."""

import argparse

from plumbing.cli import Parser
from plumbing.units import parse_size

__all__ = ["Parser", "add_network_flags", "add_size_flags", "size_type"]


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
