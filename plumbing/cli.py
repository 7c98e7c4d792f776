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
