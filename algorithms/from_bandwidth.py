"""What the algorithms build from a bandwidth matrix (their trees, bamring's and dring's ring
orders), built once per (builder, matrix) and cached.

``bandwidth`` is an S x S array-like, a ``topology.BandwidthMatrix`` or the
path of a probe file; a file is re-read when it changes on disk. Building is
deterministic, so every rank that reads the same matrix builds the same tree
(the agreement check compares the trees' digests).
"""

import functools
import hashlib
import os

import numpy as np

from topology import BandwidthMatrix, Tree, as_matrix, binomial_tree, build_tree

_CACHE_SIZE = 16


def tree_for(method, size, tree=None, bandwidth=None, name="tree"):
    """The tree an algorithm of ``method`` runs on ``size`` ranks (``ValueError`` if none fits)."""
    if tree is not None and bandwidth is not None:
        raise ValueError("pass tree= or bandwidth=, not both")
    if tree is not None:
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a topology.Tree, got {type(tree).__name__}")
        if tree.size != size:
            raise ValueError(f"the tree spans {tree.size} ranks, the communicator has {size}")
        return tree
    if bandwidth is None:
        if method == "binomial":
            return _binomial(size)
        raise ValueError(
            f"algorithm {name!r} builds its tree from link bandwidths, and none was given: pass "
            "bandwidth= (an S x S matrix in GB/s, or a file from 'python -m topology probe') or tree="
        )
    return from_bandwidth(_tree, size, bandwidth, method)


def from_bandwidth(build, size, bandwidth, *args):
    """``build(matrix, *args)`` for the matrix ``bandwidth`` (an S x S array-like, a
    ``topology.BandwidthMatrix`` or a probe file's path) of ``size`` ranks, made once per
    build, arguments and matrix and kept (a file is read again when it changes on disk)."""
    if isinstance(bandwidth, (str, os.PathLike)):
        return _from_file(build, size, *file_version(bandwidth), *args)
    matrix = bandwidth if isinstance(bandwidth, BandwidthMatrix) else as_matrix(bandwidth)
    key = (build, size, matrix_key(matrix), *args)
    cached = _by_content.get(key)
    if cached is None:
        matrix.check_ranks(size)
        cached = build(matrix, *args)
        if len(_by_content) >= _CACHE_SIZE:
            _by_content.clear()
        _by_content[key] = cached
    return cached


def matrix_key(matrix):
    """A checksum of a matrix's bandwidths and latencies (16 bytes)."""
    return hashlib.blake2b(np.ascontiguousarray(matrix.bandwidth).tobytes()
                           + np.ascontiguousarray(matrix.latency).tobytes(), digest_size=16).digest()


def file_version(path):
    """(absolute path, mtime in ns, size) of a probe file: the key of a cache that re-reads the
    file when it changes on disk; ``ValueError`` when it cannot be read."""
    absolute = os.path.abspath(path)
    try:
        stat = os.stat(absolute)
    except OSError as exc:
        raise ValueError(f"cannot read bandwidth matrix {path}: {exc.strerror}") from None
    return absolute, stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _binomial(size):
    return binomial_tree(size)


def _tree(matrix, method):
    return build_tree(matrix, root=0, method=method)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _from_file(build, size, path, mtime_ns, nbytes, *args):
    return build(as_matrix(path, ranks=size), *args)


_by_content = {}
