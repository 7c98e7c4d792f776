"""The device steps: every call that only a GPU runs, behind one small interface, :func:`steps`.

The transports, the executor and the benchmark handle NumPy and CuPy vectors alike; wherever
device memory needs a stream, an event, a pinned buffer, a CUDA IPC mapping or a kernel of ours,
they ask ``steps(xp)``: :class:`HostSteps` for NumPy (what each step is on host memory: a copy
done at once, nothing to wait for), :class:`CudaSteps` for CuPy. The CPU tests run every call
site above this module through :class:`HostSteps`; what only a GPU runs is :class:`CudaSteps`
and the bfloat16 kernels (:mod:`.bf16_kernels`), listed in docs/architecture.md.

The stream discipline (docs/gpu.md, "One stream discipline"), which :class:`CudaSteps` follows
and nothing else restates:

1. Our kernels and device-to-device copies run on CuPy's current stream, the caller's.
2. Copies between device memory and pinned host memory run on side streams of their own (one
   each way, as PCIe carries both at once), so that they overlap the current stream's kernels.
   Each first waits, on the device (``cudaStreamWaitEvent``), for an event recorded on the
   current stream as it is issued: a copy out reads what the kernels queued before it wrote; a
   copy in overwrites nothing those kernels still read.
3. After a copy into device memory the current stream waits, on the device, for the copy's
   event: kernels queued later read what arrived.
4. The host waits only where the host or another process touches what a stream made:
   :meth:`~CudaSteps.settle` (the current stream) before MPI reads or writes device memory and
   before a CUDA IPC counter tells a peer process that a slot is full or free; a copy out's
   event before MPI sends its host buffer; a copy in's event before its host buffer is
   overwritten (:meth:`~CudaSteps.wait`).
"""

import time

import numpy as np

from . import bf16_kernels
from .arrays import array_module
from .dtypes import BY_DTYPE, BY_NAME

#: the dtype our own kernel reduces on the device (:mod:`.bf16_kernels`)
BFLOAT16 = BY_NAME["bfloat16"].dtype


class HostSteps:
    """The steps on host memory (NumPy): copies finish at once, nothing waits."""

    device = False

    def settle(self):
        """Nothing is queued on the host."""

    def pinned(self, nbytes):
        """A host byte buffer for staging."""
        return np.empty(nbytes, np.uint8)

    def copy_out(self, raw, host):
        """``raw``'s bytes into ``host``; returns what :meth:`wait` waits for (nothing here)."""
        np.copyto(host[:raw.size], raw)

    def copy_in(self, host, raw):
        """``host``'s first bytes into ``raw``; returns what :meth:`wait` waits for (nothing here)."""
        np.copyto(raw, host[:raw.size])

    def wait(self, token):
        """Nothing to wait for."""

    def clock(self):
        """A :class:`HostClock`."""
        return HostClock()


class HostClock:
    """Seconds between :meth:`start` and :meth:`stop` by the host's monotonic clock."""

    def start(self):
        self._start = time.perf_counter()

    def stop(self):
        return time.perf_counter() - self._start


class CudaSteps:
    """The steps on device memory (CuPy), under the stream discipline of the module docstring.
    One per device: its side streams belong to the device current when it was made."""

    device = True

    def __init__(self, cupy):
        self.cupy = cupy
        self.runtime = cupy.cuda.runtime
        self.device_id = cupy.cuda.Device().id
        self.outbound, self.inbound = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        self._combiners = {}

    def current(self):
        return self.cupy.cuda.get_current_stream()

    def settle(self):
        """Wait for everything queued on the current stream (rule 4)."""
        self.current().synchronize()

    def pinned(self, nbytes):
        """A page-locked host byte buffer, which copies on the side streams need to be asynchronous."""
        import cupyx

        return cupyx.empty_pinned((nbytes,), np.uint8)

    def _on_side(self, side, destination, source, nbytes, kind):
        """One copy on ``side`` after the current stream's queued work (rule 2); its event."""
        before = self.cupy.cuda.Event(disable_timing=True)
        before.record(self.current())
        side.wait_event(before)
        self.runtime.memcpyAsync(destination, source, nbytes, kind, side.ptr)
        done = self.cupy.cuda.Event(disable_timing=True)
        done.record(side)
        return done

    def copy_out(self, raw, host):
        """Start copying device bytes ``raw`` into pinned ``host``; the event :meth:`wait` waits for
        before the host reads them."""
        return self._on_side(self.outbound, host.ctypes.data, raw.data.ptr, raw.nbytes,
                             self.runtime.memcpyDeviceToHost)

    def copy_in(self, host, raw):
        """Start copying pinned ``host``'s first bytes into device bytes ``raw``; kernels queued
        on the current stream afterwards see them (rule 3). The event :meth:`wait` waits for
        before ``host`` is overwritten."""
        done = self._on_side(self.inbound, raw.data.ptr, host.ctypes.data, raw.nbytes,
                             self.runtime.memcpyHostToDevice)
        self.current().wait_event(done)
        return done

    def wait(self, event):
        """Block the host until ``event`` (a copy's) has happened."""
        if event is not None:
            event.synchronize()

    def clock(self):
        """A :class:`CudaClock` on the current stream."""
        return CudaClock(self.cupy)

    # CUDA IPC (docs/gpu.md): memory one rank allocates and the node's other ranks map

    def ipc_allocate(self, nbytes):
        """``(pointer, handle)``: ``nbytes`` from ``cudaMalloc`` (not CuPy's pool, so that the
        handle maps exactly this allocation) and its IPC handle."""
        pointer = self.runtime.malloc(nbytes)
        try:
            return pointer, self.runtime.ipcGetMemHandle(pointer)
        except Exception:
            self.runtime.free(pointer)
            raise

    def ipc_open(self, handle):
        """A pointer to a peer's allocation, mapped into this process."""
        return self.runtime.ipcOpenMemHandle(handle)

    def ipc_close(self, pointer):
        self.runtime.ipcCloseMemHandle(pointer)

    def ipc_free(self, pointer):
        """Free an allocation of :meth:`ipc_allocate`: only once every peer closed its mapping."""
        self.runtime.free(pointer)

    def view(self, pointer, nbytes, owner):
        """A CuPy uint8 vector over ``nbytes`` at ``pointer`` (own or peer-mapped), said to be on
        this rank's device: asked, CUDA would name the peer's device for a peer mapping, and CuPy
        would then check peer access on every kernel that touches it."""
        cupy = self.cupy
        memory = cupy.cuda.UnownedMemory(pointer, nbytes, owner, self.device_id)
        return cupy.ndarray(nbytes, cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))

    # reductions: CuPy's ufuncs, bfloat16 by our own kernel

    def combiner(self, ufunc, op):
        """``combine(a, b, out)``: ``out = a (op) b`` by CuPy's ``ufunc`` (a name), bfloat16 vectors
        by our kernel for ``op`` (:mod:`.bf16_kernels`: the host path's arithmetic, bit for bit)."""
        key = (ufunc, op)
        combine = self._combiners.get(key)
        if combine is None:
            cupy_ufunc = getattr(self.cupy, ufunc)
            combine = self._combiners[key] = _by_dtype(lambda a, b, out: cupy_ufunc(a, b, out=out),
                                                       lambda: bf16_kernels.combiner(op))
        return combine

    def divider(self):
        """``divide(a, n, out)``: ``out = a / n`` (avg's last step), bfloat16 by our kernel."""
        divide = self._combiners.get("divide")
        if divide is None:
            cupy = self.cupy
            divide = self._combiners["divide"] = _by_dtype(lambda a, n, out: cupy.divide(a, n, out=out),
                                                           lambda: bf16_kernels.divider())
        return divide


def _by_dtype(plain, load_bf16):
    """``plain``, but bfloat16 vectors through the kernel ``load_bf16()`` makes on first use (its
    module compiled by NVRTC then, on the first bfloat16 device vector)."""
    kernel = None

    def run(a, b, out):
        nonlocal kernel
        if a.dtype == BFLOAT16:
            if kernel is None:
                kernel = load_bf16()
            kernel(a, b, out)
        else:
            plain(a, b, out)
    return run


class CudaClock:
    """Seconds between :meth:`start` and :meth:`stop` on the current stream, by CUDA events: the
    span from the stream reaching ``start`` to its finishing everything queued before ``stop``
    (nccl-tests' rule: every call enqueued back to back, one wait at the end)."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.begin, self.end = cupy.cuda.Event(), cupy.cuda.Event()

    def start(self):
        self.begin.record(self.cupy.cuda.get_current_stream())

    def stop(self):
        self.end.record(self.cupy.cuda.get_current_stream())
        self.end.synchronize()
        return self.cupy.cuda.get_elapsed_time(self.begin, self.end) / 1e3


_HOST = HostSteps()
_CUDA = {}  # device id -> CudaSteps


def steps(xp):
    """The steps for array module ``xp``: :class:`HostSteps` for NumPy, :class:`CudaSteps` of
    the current device for CuPy."""
    if xp is np:
        return _HOST
    device = xp.cuda.Device().id
    found = _CUDA.get(device)
    if found is None:
        found = _CUDA[device] = CudaSteps(xp)
    return found


def settle_for(vector):
    """Settle the device before MPI reads or writes ``vector``, where it is device memory (rule 4)."""
    if type(vector) is not np.ndarray:
        steps(array_module(vector)).settle()


def lacks(dtype):
    """Why the GPU path cannot reduce ``dtype`` (one line), else None: CuPy's own types, and
    bfloat16 where CuPy holds it (14 and newer, with ml_dtypes), which our kernel reduces; fp8
    never (CuPy has no such arrays, and no kernel of ours adds them). Imports CuPy for bfloat16."""
    dtype = np.dtype(dtype)
    row = BY_DTYPE.get(dtype)
    if row is None or row.gpu == "cupy":
        return None
    if not row.gpu:
        return f"CuPy has no {dtype.name} arrays, and no kernel of this suite reduces {dtype.name} on the device"
    import cupy

    try:
        cupy.empty(0, dtype)
    except Exception:  # TypeError, or CuPy's own error for an unknown dtype
        return (f"CuPy {cupy.__version__} has no {dtype.name} arrays (CuPy 14 and newer, with ml_dtypes "
                "and NumPy 2.1.2 or newer, have them)")
    return None
