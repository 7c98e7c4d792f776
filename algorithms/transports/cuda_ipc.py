"""Device memory shared by the ranks of a node through CUDA IPC, for the device slots of
:mod:`.shared_memory`.

Each rank allocates its slots with ``cudaMalloc`` (not from CuPy's pool, so the IPC handle
maps exactly this allocation), the ranks of the node exchange the handles once through MPI
(``cudaIpcGetMemHandle``), and each opens the others' (``cudaIpcOpenMemHandle``). Then a
rank copies device to device into its own slots and its peers read them in place, as NCCL's
intranode P2P transport does. Nothing here runs without CuPy and a GPU.
"""

from plumbing.ending import raise_together


class IpcUnavailable(RuntimeError):
    """CUDA IPC failed on some rank of the node (the message says which and why)."""


class DeviceSlots:
    """``nbytes`` of device memory per rank of ``node``, each rank's mapped into all of them:
    ``views[r]`` is rank r's part as a CuPy uint8 array. Collective over ``node``; raises
    :class:`IpcUnavailable` on every rank when any rank cannot allocate, export or map."""

    def __init__(self, node, nbytes):
        import cupy

        runtime = cupy.cuda.runtime
        self._runtime, self._own, self._opened = runtime, 0, []
        problem, handle = None, None
        try:
            self._own = runtime.malloc(nbytes)
            handle = runtime.ipcGetMemHandle(self._own)
        except Exception as exc:  # CUDA errors, or CuPy without IPC
            problem = f"CUDA IPC unavailable on rank {node.Get_rank()} of the node: {exc}"
        try:
            raise_together(node, problem, IpcUnavailable)
            handles = node.allgather(handle)
            pointers, problem = [], None
            try:
                for rank, theirs in enumerate(handles):
                    if rank == node.Get_rank():
                        pointers.append(self._own)
                    else:
                        pointer = runtime.ipcOpenMemHandle(theirs)
                        self._opened.append(pointer)
                        pointers.append(pointer)
            except Exception as exc:
                problem = f"CUDA IPC cannot map a peer's memory on rank {node.Get_rank()} of the node: {exc}"
            raise_together(node, problem, IpcUnavailable)
        except IpcUnavailable:
            self.free()
            raise
        self.views = [cupy.ndarray(nbytes, cupy.uint8,
                                   cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(p, nbytes, self), 0))
                      for p in pointers]

    def free(self):
        for pointer in self._opened:
            self._runtime.ipcCloseMemHandle(pointer)
        self._opened = []
        if self._own:
            self._runtime.free(self._own)
            self._own = 0
