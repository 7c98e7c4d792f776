"""The bound one device's memory sets on an all-reduce among ranks that share it (several ranks
on one GPU): docs/gpu.md, "The bound on one GPU".

Whatever an all-reduce on one device does, it reads and writes that device's memory, which moves
at most 2C bytes a second, C the rate of the device's fastest copy (a copy reads every byte it
writes). Any all-reduce of M bytes a rank among N ranks reads every rank's input and writes every
rank's result, 2NM bytes: T >= NM / C, busbw <= 2(N-1)/N^2 C. An algorithm whose ranks receive
messages moves more: a received byte reduced into a partial result is read with the partial and
the sum written (3 bytes), a received byte copied into place read and written (2 bytes), so
T >= (3R + 2K) / 2C for R bytes reduced and K copied by all ranks together
(:attr:`algorithms.Algorithm.received`). Sending costs nothing more: the receiver reads the
sender's memory (CUDA IPC). The bound is the larger of the two.
"""


def any_allreduce_seconds(n, nbytes, copy_rate):
    """The least time of any all-reduce of ``nbytes`` a rank among ``n`` ranks on one device
    whose fastest copy moves ``copy_rate`` B/s: every input read and every result written."""
    return n * nbytes / copy_rate if n > 1 else 0.0


def moved_seconds(reduced, copied, copy_rate):
    """The least time to reduce ``reduced`` received bytes into partial results (3 bytes of
    traffic each) and copy ``copied`` into place (2 each) through memory moving 2 ``copy_rate`` B/s."""
    return (3 * reduced + 2 * copied) / (2 * copy_rate)


def seconds(n, nbytes, copy_rate, received=None):
    """The one-device bound: the larger of :func:`any_allreduce_seconds` and, where the
    algorithm's ``received`` bytes ``(reduced, copied)`` are known, :func:`moved_seconds`."""
    bound = any_allreduce_seconds(n, nbytes, copy_rate)
    return bound if received is None else max(bound, moved_seconds(*received, copy_rate))
