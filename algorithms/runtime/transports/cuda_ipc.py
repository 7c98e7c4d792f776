"""Device memory shared by the ranks of a node through CUDA IPC, for the device slots of
:mod:`.shared_memory`.

Each rank allocates its slots with ``cudaMalloc``, the ranks of the node exchange the handles
once through MPI (``cudaIpcGetMemHandle``), and each opens the others'
(``cudaIpcOpenMemHandle``). Then a rank copies device to device into its own slots and its
peers read them in place, as NCCL's intranode P2P transport does. The CUDA calls are the device
steps' (:class:`algorithms.device.CudaSteps`); what is here is their order across the node,
which the CUDA runtime's rules fix: an allocation is freed only after every peer has closed its
mapping of it (``cudaIpcCloseMemHandle``), so freeing is close, a barrier over the node, then free.
"""

from plumbing.ending import raise_together

from ...device import steps


class IpcUnavailable(RuntimeError):
    """CUDA IPC failed on some rank of the node (the message says which and why)."""


class DeviceSlots:
    """``nbytes`` of device memory per rank of ``node``, each rank's mapped into all of them:
    ``views[r]`` is rank r's part as a CuPy uint8 array. Collective over ``node`` (kept, a
    duplicate, for :meth:`free`); raises :class:`IpcUnavailable` on every rank when any rank
    cannot allocate, export or map."""

    def __init__(self, cupy, node, nbytes):
        self.steps, self.node = steps(cupy), node.Dup()
        self._own, self._opened = 0, []
        problem, handle = None, None
        try:
            self._own, handle = self.steps.ipc_allocate(nbytes)
        except Exception as exc:  # CUDA errors, or CuPy without IPC
            problem = f"CUDA IPC unavailable on rank {node.Get_rank()} of the node: {exc}"
        try:
            raise_together(self.node, problem, IpcUnavailable)
            handles = self.node.allgather(handle)
            pointers, problem = [], None
            try:
                for rank, theirs in enumerate(handles):
                    if rank == self.node.Get_rank():
                        pointers.append(self._own)
                    else:
                        self._opened.append(self.steps.ipc_open(theirs))
                        pointers.append(self._opened[-1])
            except Exception as exc:
                problem = f"CUDA IPC cannot map a peer's memory on rank {node.Get_rank()} of the node: {exc}"
            raise_together(self.node, problem, IpcUnavailable)
        except IpcUnavailable:
            self.free()
            raise
        self.views = [self.steps.view(pointer, nbytes, self) for pointer in pointers]

    def free(self):
        """Close the peers' mappings, wait until every rank of the node has, then free this rank's
        allocation (collective over the node; again is a no-op)."""
        if self.node is None:
            return
        self.views = []
        self.steps.settle()  # no kernel of ours reads a peer's slots any more
        for pointer in self._opened:
            self.steps.ipc_close(pointer)
        self._opened = []
        self.node.Barrier()  # every peer has closed its mapping of our allocation
        if self._own:
            self.steps.ipc_free(self._own)
            self._own = 0
        self.node.Free()
        self.node = None
