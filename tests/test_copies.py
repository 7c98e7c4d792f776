"""The transports' copy (algorithms/runtime/copies.py): the same bytes as NumPy's copyto at every
distance between the vectors (the compiled copy goes backwards where the target lies 1..63 bytes
past the source modulo a page), overlapping either way, and NumPy's own copy for what the
compiled one does not take."""

import ml_dtypes
import numpy as np
import pytest

from algorithms.runtime import copies

PAGE = 4096


def page_aligned(nbytes):
    whole = np.arange(nbytes + 3 * PAGE, dtype=np.uint64).astype(np.uint8)
    start = -whole.ctypes.data % PAGE
    return whole[start:start + nbytes + 2 * PAGE]


@pytest.mark.parametrize("nbytes", [1, 100, 2047, 2048, 4096, 8191, 65536 + 24, 300_000])
@pytest.mark.parametrize("apart", [0, 1, 16, 63, 64, PAGE - 16, PAGE + 16, 3 * PAGE + 40])
def test_the_copy_moves_the_bytes_numpy_moves_at_every_distance(nbytes, apart):
    at = -(-nbytes // PAGE) * PAGE + apart  # the target this far past the source: `apart` modulo a page
    memory = np.zeros(at + nbytes + 2 * PAGE, np.uint8)
    start = -memory.ctypes.data % PAGE
    source = memory[start:start + nbytes]
    source[...] = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    target = memory[start + at:start + at + nbytes]
    expected = source.copy()
    copies.copy(target, source)
    assert np.array_equal(target, expected)


@pytest.mark.parametrize("nbytes", [2048, 8192, 65536])
@pytest.mark.parametrize("shift", [1, 16, 63, 64, PAGE - 16, PAGE + 16])
def test_overlapping_copies_either_way_are_those_of_numpy(nbytes, shift):
    """Target above the source (the backward copy's case) and below it (memmove's), both at
    the distances the compiled copy treats apart."""
    for target_above in (True, False):
        memory = page_aligned(nbytes)
        source = memory[:nbytes] if target_above else memory[shift:shift + nbytes]
        target = memory[shift:shift + nbytes] if target_above else memory[:nbytes]
        expected = source.copy()
        copies.copy(target, source)
        assert np.array_equal(target, expected), (target_above, shift)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_every_reduced_dtype_is_copied_exactly(dtype):
    source = np.random.default_rng(1).standard_normal(5000).astype(dtype)
    target = np.zeros(5000, dtype)
    copies.copy(target, source)
    assert target.tobytes() == source.tobytes()


def test_what_the_compiled_copy_does_not_take_is_numpys_copy():
    """A strided view, a cast between types, a broadcast scalar: NumPy's copyto, as before."""
    target = np.zeros(20)
    copies.copy(target[::2], np.arange(10.0))
    assert np.array_equal(target[::2], np.arange(10.0)) and not target[1::2].any()
    wide = np.zeros(10, np.int64)
    copies.copy(wide, np.arange(10, dtype=np.int32))
    assert np.array_equal(wide, np.arange(10))
    filled = np.zeros(4, np.float32)
    copies.copy(filled, np.float32(3))
    assert np.array_equal(filled, np.full(4, 3, np.float32))
    with pytest.raises(ValueError):
        copies.copy(np.zeros(4), np.zeros(5))  # NumPy's error for shapes that do not broadcast


def test_the_copy_for_another_array_module_is_its_own_copyto():
    class Module:
        copyto = object()
    assert copies.copy_for(np) is copies.copy
    assert copies.copy_for(Module) is Module.copyto
