"""algorithms/kernels/bfloat16.h, the bfloat16 arithmetic of the GPU's reductions, against the
host's: the header compiled here by the C compiler and checked bit for bit against ml_dtypes'
ufuncs and PyTorch's CPU kernels, over every bfloat16 against special and pseudo-random
partners, every subnormal against every subnormal, and constructed rounding ties; on a GPU, the
same pairs through algorithms.bf16_kernels against that host build."""

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

KERNELS = Path(__file__).resolve().parent.parent / "algorithms" / "kernels"
BF16 = np.dtype(ml_dtypes.bfloat16)
QNAN = 0x7FC0  # every NaN that add, mul and div make
#: +-0, +-1, +-largest finite, +-smallest normal, +-smallest and largest subnormal, +-inf, quiet
#: and signaling NaNs of both signs, and two quiet NaNs with payloads
SPECIALS = np.array([0x0000, 0x8000, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F, 0x0080, 0x8080, 0x0001, 0x8001, 0x007F,
                     0x807F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FC1, 0xFFD5], np.uint16)
#: rank counts that bfloat16 holds (ml_dtypes rounds n to bfloat16 before it divides: 257 by 256)
DIVISORS = (*range(1, 65), 100, 255, 256, 384)
UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
WORDS = np.arange(1 << 16, dtype=np.uint16)

WRAPPER = r"""
#include "bfloat16.h"
#define LOOP(name, fn) \
    void name(const unsigned short *a, const unsigned short *b, unsigned short *out, long long n) \
    { for (long long i = 0; i < n; i++) out[i] = fn(a[i], b[i]); }
LOOP(add, bf16_add)
LOOP(mul, bf16_mul)
LOOP(max, bf16_max)
LOOP(min, bf16_min)
void divide(const unsigned short *a, float d, unsigned short *out, long long n)
{ for (long long i = 0; i < n; i++) out[i] = bf16_div(a[i], d); }
"""


class Host:
    """The header compiled by the host's C compiler, on uint16 word vectors."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(str(path))
        for name in UFUNCS:
            getattr(self.lib, name).argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong]
        self.lib.divide.argtypes = [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_longlong]

    def binary(self, op, a, b):
        out = np.empty_like(a)
        getattr(self.lib, op)(a.ctypes.data, b.ctypes.data, out.ctypes.data, a.size)
        return out

    def divide(self, a, n):
        out = np.empty_like(a)
        self.lib.divide(a.ctypes.data, float(n), out.ctypes.data, a.size)
        return out


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler: {cc!r} is not on PATH (set CC)")
    where = tmp_path_factory.mktemp("bf16")
    (where / "wrapper.c").write_text(WRAPPER)
    library = where / "libbf16.so"
    proc = subprocess.run([cc, "-O2", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
                           "-I", str(KERNELS), "-o", str(library), str(where / "wrapper.c")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return Host(library)


def _is_tie(a, b, ufunc):
    """Which pairs' float32 result is exact (the float64 one) and lies halfway between two
    bfloat16 values, and of those, which round up (the lower neighbour is odd), not down to even."""
    x, y = a.view(BF16), b.view(BF16)
    f32 = ufunc(x.astype(np.float32), y.astype(np.float32))
    bits = f32.view(np.uint32)
    exact = f32 == ufunc(x.astype(np.float64), y.astype(np.float64))
    tie = np.isfinite(f32) & exact & ((bits & 0xFFFF) == 0x8000)
    return tie, tie & (((bits >> 16) & 1) == 1)


@pytest.fixture(scope="module")
def ties():
    """Op -> (a, b, how many round up, how many down to even): pairs whose exact sum or product
    is a tie, from every finite word plus or minus 1 and 3 halves of its ulp, and every finite
    word times 17 significands of [1, 2)."""
    finite = WORDS[(WORDS & 0x7F80) != 0x7F80]
    exponent = (finite.astype(np.int32) >> 7) & 0xFF
    a, exponent = finite[exponent >= 2], exponent[exponent >= 2]  # half an ulp is a bfloat16
    half = np.ldexp(np.float32(1), exponent - 135).astype(BF16).view(np.uint16)
    partners = [half, half | 0x8000, (half + 0xC0), (half + 0xC0) | 0x8000]  # + 0xC0: twice, times 1.5
    add_a, add_b = np.tile(a, len(partners)), np.concatenate(partners)
    significands = np.append(np.uint16(0x3FC0), np.random.default_rng(7).integers(0x3F81, 0x4000, 16, np.uint16))
    mul_a, mul_b = np.repeat(finite, significands.size), np.tile(significands, finite.size)
    found = {}
    with np.errstate(all="ignore"):
        for op, a, b in (("add", add_a, add_b), ("mul", mul_a, mul_b)):
            tie, up = _is_tie(a, b, np.add if op == "add" else np.multiply)
            found[op] = (a[tie], b[tie], int(up.sum()), int((tie & ~up).sum()))
    return found


@pytest.fixture(scope="module")
def pairs(ties):
    """Name -> (a, b) word vectors: every word against each special and 64 pseudo-random
    partners, both ways round, every subnormal (and zero) against every other, and the ties."""
    partners = np.random.default_rng(20240611).integers(0, 1 << 16, 64).astype(np.uint16)
    tiny = WORDS[(WORDS & 0x7F80) == 0]
    both = lambda x, y: (np.concatenate([x, y]), np.concatenate([y, x]))  # noqa: E731
    return {
        "specials": both(np.repeat(WORDS, SPECIALS.size), np.tile(SPECIALS, WORDS.size)),
        "random": both(np.repeat(WORDS, partners.size), np.tile(partners, WORDS.size)),
        "subnormals": (np.repeat(tiny, tiny.size), np.tile(tiny, tiny.size)),
        "add ties": ties["add"][:2],
        "mul ties": ties["mul"][:2],
    }


def _bits(x):
    return x.view(np.uint16)


def _nan(words):
    return (words & 0x7FFF) > 0x7F80


def _assert_same(what, got, want, a, b, nan_word=None):
    """``got == want`` bit for bit; where ``want`` is NaN and ``nan_word`` is given, ``got`` must
    be ``nan_word`` instead (``True``: any NaN)."""
    if nan_word is True:
        wrong = np.where(_nan(want), ~_nan(got), got != want)
    else:
        want = want if nan_word is None else np.where(_nan(want), np.uint16(nan_word), want)
        wrong = got != want
    bad = np.flatnonzero(wrong)
    examples = ", ".join(f"{a[i]:#06x}, {b if np.isscalar(b) else b[i]:#06x} -> {got[i]:#06x}, not {want[i]:#06x}"
                         for i in bad[:4])
    assert bad.size == 0, f"{what}: {bad.size} of {got.size} differ, e.g. {examples}"


def test_the_c_arithmetic_is_ml_dtypes(host, pairs, ties):
    """Compiled by the host's C compiler, add, mul, max, min and divide give ml_dtypes' bits on
    every class of pair: add, mul and divide wherever ml_dtypes' result is not NaN (a NaN result
    is 0x7FC0), max and min everywhere, NaN signs and payloads included (a NaN operand wins, a
    first; equal operands, -0 and +0 among them, give b). Divide is by every rank count 1-64 and
    a few larger that bfloat16 holds. The ties include both kinds, for add and for mul."""
    for op, (_, _, up, down) in ties.items():
        assert up > 100 and down > 100, f"{op}: {up} ties rounding up, {down} down to even"
    with np.errstate(all="ignore"):
        for name, (a, b) in pairs.items():
            for op, ufunc in UFUNCS.items():
                want = _bits(ufunc(a.view(BF16), b.view(BF16)))
                _assert_same(f"{op} on {name}", host.binary(op, a, b), want, a, b,
                             QNAN if op in ("add", "mul") else None)
        for n in DIVISORS:
            want = _bits(np.divide(WORDS.view(BF16), n))
            _assert_same(f"divide by {n}", host.divide(WORDS, n), want, WORDS, n, QNAN)


def test_the_c_arithmetic_is_pytorchs(host, pairs):
    """add, mul and divide give PyTorch's bfloat16 CPU kernels' bits (one thread) on the same
    pairs, rank counts bfloat16 cannot hold included (257, 1001: PyTorch divides by the float32
    count, as algorithms.bf16_kernels does). NaN for NaN, but not bit for bit: PyTorch's
    vectorized loops make 0xFFFF, its scalar tail 0x7FC0."""
    torch = pytest.importorskip("torch")
    tensor = lambda words: torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    words = lambda t: t.view(torch.int16).numpy().view(np.uint16)  # noqa: E731
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, (a, b) in pairs.items():
            for op, function in (("add", torch.add), ("mul", torch.mul)):
                want = words(function(tensor(a), tensor(b)))
                _assert_same(f"{op} on {name}", host.binary(op, a, b), want, a, b, True)
        for n in (*DIVISORS, 257, 259, 1001):
            want = words(torch.div(tensor(WORDS), n))
            _assert_same(f"divide by {n}", host.divide(WORDS, n), want, WORDS, n, True)
    finally:
        torch.set_num_threads(threads)


def _device_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        pytest.skip(f"no CUDA device ({type(exc).__name__}: {exc})")
    if count == 0:
        pytest.skip("no CUDA device")
    return cupy


def test_the_device_kernels_give_the_host_builds_bits(host, pairs):
    """algorithms.bf16_kernels, the header compiled by NVRTC through CuPy, gives the host
    build's bits (so ml_dtypes' and PyTorch's, as above) for every op and the divide, out of
    place and in place (out is a, and out is b), subnormals kept whatever CuPy's -ftz; on a
    stream of its own, on bfloat16 arrays where CuPy has them, and with nothing to do for 0
    elements."""
    cupy = _device_or_skip()
    from algorithms import bf16_kernels

    a = np.concatenate([x for x, _ in pairs.values()])
    b = np.concatenate([y for _, y in pairs.values()])
    da, db = cupy.asarray(a), cupy.asarray(b)
    for op, c_name in (("sum", "add"), ("prod", "mul"), ("max", "max"), ("min", "min"), ("avg", "add")):
        want, combine = host.binary(c_name, a, b), bf16_kernels.combiner(op)
        out = cupy.empty_like(da)
        combine(da, db, out)
        _assert_same(f"{op} out of place", cupy.asnumpy(out), want, a, b)
        into_a, into_b = da.copy(), db.copy()
        combine(into_a, db, into_a)
        combine(da, into_b, into_b)
        _assert_same(f"{op} into a", cupy.asnumpy(into_a), want, a, b)
        _assert_same(f"{op} into b", cupy.asnumpy(into_b), want, a, b)

    divide, dwords = bf16_kernels.divider(), cupy.asarray(WORDS)
    for n in (*DIVISORS, 257, 1001):
        want, out, inplace = host.divide(WORDS, n), cupy.empty_like(dwords), dwords.copy()
        divide(dwords, n, out)
        divide(inplace, n, inplace)
        _assert_same(f"divide by {n}", cupy.asnumpy(out), want, WORDS, n)
        _assert_same(f"divide by {n} in place", cupy.asnumpy(inplace), want, WORDS, n)

    stream, out = cupy.cuda.Stream(non_blocking=True), cupy.empty_like(da)
    with stream:
        bf16_kernels.combiner("sum")(da, db, out)
    stream.synchronize()
    _assert_same("sum on a stream", cupy.asnumpy(out), host.binary("add", a, b), a, b)

    try:
        da16, db16 = da.view(BF16), db.view(BF16)
        out = cupy.empty_like(da16)
    except (TypeError, ValueError):  # a CuPy without bfloat16 arrays
        pass
    else:
        bf16_kernels.combiner("prod")(da16, db16, out)
        want = host.binary("mul", a, b)
        _assert_same("prod on bfloat16 arrays", cupy.asnumpy(out.view(cupy.uint16)), want, a, b)

    empty = cupy.empty(0, cupy.uint16)
    bf16_kernels.combiner("sum")(empty, empty, empty)
    bf16_kernels.divider()(empty, 3, empty)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler (nvcc) here")
def test_the_device_half_compiles_without_flushing_subnormals(tmp_path):
    """The header's device half, compiled as CuPy compiles it (NVRTC's front end, here nvcc's;
    CuPy adds -ftz=true after our options): its five kernels, and float32 add, multiply and
    divide without .ftz, so bfloat16's subnormals survive. Needs the CUDA compiler, not a GPU."""
    from algorithms.bf16_kernels import OPTIONS

    ptx = tmp_path / "bfloat16.ptx"
    source = tmp_path / "bfloat16.cu"
    source.write_text((KERNELS / "bfloat16.h").read_text())
    proc = subprocess.run(["nvcc", "--ptx", "-arch=compute_90", *OPTIONS, "-ftz=true", str(source), "-o", str(ptx)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = ptx.read_text()
    entries = sorted(line.split()[2].rstrip("(") for line in text.splitlines() if ".entry" in line)
    assert entries == ["bf16_add_kernel", "bf16_div_kernel", "bf16_max_kernel", "bf16_min_kernel", "bf16_mul_kernel"]
    arithmetic = set(re.findall(r"\b(?:add|mul|div)(?:\.\w+)*\.f32\b", text))
    assert arithmetic == {"add.rn.f32", "mul.rn.f32", "div.rn.f32"}, arithmetic
