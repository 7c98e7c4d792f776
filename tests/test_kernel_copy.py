"""The kernel's copies between processes (algorithms.runtime.transports.kernel_copy), in one process:
a read and a write against its own memory, as another rank would make them, checked against
NumPy's copy; a copy the kernel refuses raises with the process and the reason."""

import os

import numpy as np
import pytest

from algorithms.runtime.transports import kernel_copy


def test_read_and_write_move_the_bytes():
    source = np.arange(300_001, dtype=np.float64)
    into = np.zeros_like(source)
    kernel_copy.read(os.getpid(), source.ctypes.data, into)
    assert np.array_equal(into, source)
    target = np.zeros(1000, np.int32)
    kernel_copy.write(os.getpid(), target.ctypes.data + 40, np.arange(990, dtype=np.int32))
    assert np.array_equal(target, np.concatenate([np.zeros(10, np.int32), np.arange(990, dtype=np.int32)]))


def test_a_refused_copy_names_the_process():
    missing = 2 ** 22 + 12345  # above the usual pid_max: no such process
    with pytest.raises(OSError, match=f"process_vm_readv from process {missing}: No such process"):
        kernel_copy.read(missing, 4096, np.zeros(4, np.uint8))
