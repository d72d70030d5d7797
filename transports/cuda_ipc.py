"""CUDA IPC on one node: ranks copy, and reduce, straight out of each other's device memory.

This is the shared-memory transport (shm.py) with its data moved to the GPU. The protocol is
the same class, `ShmTransport`: slots that carry a message a segment at a time, one-shot areas
for small all-reduces, and the control lines (which slot holds which segment, what each rank
has consumed, barrier counts) in a host shared-memory segment, where the CPU polls them. Only
where the data lives, and how it is copied and reduced, differ:

    memory    each rank allocates its slots and one-shot areas with `cupy.cuda.Memory`, a plain
              cudaMalloc outside CuPy's pool (a pooled block shares its allocation with
              others, and an IPC handle names a whole allocation)
    sharing   each rank sends (handle, offset, nbytes) over the MPI bootstrap, a `Dup` of the
              caller's communicator; every rank opens its peers' handles with
              cudaIpcOpenMemHandle and reads their memory through the pointer it gets back.
              A process cannot open its own handle, so a rank uses its own memory directly
    copies    cudaMemcpyAsync, and the reduction a CuPy ufunc `op(mine, slot, out=acc)`
              reading the peer's slot in place, both on the caller's current stream

Ordering: flags in host shared memory plus stream synchronisation. A copy or reduction that
writes a slot, or reads one, is complete (its stream synchronised) before the flag that
announces it is written: a slot is published only once its data is in device memory, and
counted consumed only once the kernel that read it has finished, so a sender never overwrites
a slot still being read. Device memory written by a finished kernel is visible to every
process that maps it. A one-shot call also synchronises the device first: the previous call's
reads of peers' areas, queued by the algorithm, may sit on another stream than this call's.
(Interprocess CUDA events, recorded after the writer's copy and waited on by the reader's
stream, would let copies run ahead of the CPU; they need an event per slot and per reader,
opened across processes, where flags and synchronisation need nothing new. The cost is one
synchronisation per segment on each side, which large segments amortise.)

Lifetime: `close` waits for this rank's kernels, unmaps every peer's memory, and frees its own
only after a barrier, so that no peer still maps it. If a peer does not reach the barrier
within CLOSE_TIMEOUT_S, the memory is kept until the process exits instead.

Rank r of the node uses GPU r mod (number of GPUs); several ranks may share one GPU. With
several GPUs, every pair must be peer-accessible (P2P), which opening a handle enables.

The CuPy helpers at the bottom (`copy_bytes`, `pinned_empty`) also serve the MPI transport,
which stages device arrays through pinned host memory when the MPI library cannot take them.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy
from mpi4py import MPI

from .base import ReduceOp, buffer_address
from .errors import CollectiveError
from .shm import ShmTransport

try:
    import cupy
except ImportError:  # CuPy is optional: `require_cupy` says what is missing
    cupy = None

CLOSE_TIMEOUT_S = 10.0
_kept: list[Any] = []  # device memory a peer may still map (see the module docstring)


def require_cupy() -> ModuleType:
    """CuPy, once it is known to see a GPU; a CollectiveError that says what is missing if not."""
    if cupy is None:
        raise CollectiveError("device='cuda' needs CuPy, which is not installed here: "
                              "pip install 'ringcc[cuda12]' (or cuda13)")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise CollectiveError(f"device='cuda' needs a CUDA GPU, but CuPy finds none here "
                              f"({error})") from None
    if count == 0:
        raise CollectiveError("device='cuda' needs a CUDA GPU, but CuPy finds none here")
    return cupy


def use_gpu(comm: MPI.Comm) -> ModuleType:
    """CuPy, with GPU (rank on this node) mod (GPUs) made current on this thread. Collective."""
    cp = require_cupy()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        local = node.Get_rank()
    finally:
        node.Free()
    cp.cuda.Device(local % cp.cuda.runtime.getDeviceCount()).use()
    return cp


class CudaIpcTransport(ShmTransport):
    """Ranks of `comm` (default `MPI.COMM_WORLD`), all on one node, moving CuPy arrays."""

    name = "cuda_ipc"
    # Chosen, not yet measured: large slots, since every segment costs a stream
    # synchronisation on each side; one-shot up to 1 MiB, where the ring's 2(N-1) steps of
    # synchronisations cost more than one exchange.
    default_segment_bytes = 16 << 20
    default_one_shot_bytes = 1 << 20
    data_on_host = False  # slots and one-shot areas live in device memory

    def __init__(self, comm: MPI.Comm | None = None, **options: Any) -> None:
        super().__init__(comm, xp=require_cupy(), **options)

    def _setup(self) -> None:
        use_gpu(self.comm)
        self.device = self.xp.cuda.Device()
        self._memory = None  # this rank's device memory: its slots and one-shot areas
        self._opened: list[int] = []  # peers' memory mapped here, unmapped at close
        super()._setup()

    # ---- where the data lives ---------------------------------------------------------------

    def _share_data(self, segments: list[Any], offset: int, nbytes: int) -> list[Any]:
        """Allocate this rank's data in device memory and map every peer's (rank order).

        Collective. Each step ends in an agreement, so when any rank fails every rank raises.
        """
        runtime = self.xp.cuda.runtime
        mine, failure = None, None
        try:
            self._memory = self.xp.cuda.Memory(nbytes)
            # The data starts at the allocation's base, so its offset from what the handle
            # names is 0.
            mine = (runtime.ipcGetMemHandle(self._memory.ptr), 0, nbytes)
        except (MemoryError, runtime.CUDARuntimeError) as error:
            failure = error
        shared = self.comm.allgather(mine)
        if None in shared:
            raise CollectiveError(f"rank {shared.index(None)} could not allocate {nbytes} bytes "
                                  f"of device memory for the cuda_ipc transport; pass a smaller "
                                  f"segment_bytes") from failure
        data = []
        try:
            for rank, (handle, start, size) in enumerate(shared):
                if rank == self.rank:  # a process cannot open its own handle
                    data.append(self.xp.ndarray((nbytes,), numpy.uint8,
                                                self.xp.cuda.MemoryPointer(self._memory, 0)))
                    continue
                base = runtime.ipcOpenMemHandle(handle)
                self._opened.append(base)
                # Reached from this rank's GPU (through P2P if the memory is on another), so
                # CuPy is told it is on this GPU.
                memory = self.xp.cuda.UnownedMemory(base + start, size, None, self.device.id)
                data.append(self.xp.ndarray((size,), numpy.uint8,
                                            self.xp.cuda.MemoryPointer(memory, 0)))
        except runtime.CUDARuntimeError as error:
            failure = error
        if not self.comm.allreduce(failure is None, op=MPI.LAND):
            self._unmap_peers()
            raise CollectiveError("a rank could not map its peers' device memory through CUDA "
                                  "IPC (with several GPUs, every pair must be peer-accessible)"
                                  ) from failure
        return data

    def _copy(self, dst: Any, src: Any) -> None:
        copy_bytes(dst, src)

    def _reduce(self, op: ReduceOp, out: Any, mine: Any, theirs: Any) -> None:
        op(mine, theirs, out=out)
        self.xp.cuda.get_current_stream().synchronize()

    def _all_inputs(self, buf: Any) -> list[Any]:
        self.device.synchronize()  # see the module docstring: reads of the previous call
        return super()._all_inputs(buf)

    # ---- lifetime ---------------------------------------------------------------------------

    def _unmap_peers(self) -> None:
        runtime = self.xp.cuda.runtime
        for base in self._opened:
            try:
                runtime.ipcCloseMemHandle(base)
            except runtime.CUDARuntimeError:  # a failed kernel broke the context: nothing to do
                pass
        self._opened = []

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.device.synchronize()  # our kernels that read peers' memory have finished
        except self.xp.cuda.runtime.CUDARuntimeError:
            pass  # a failed kernel left the context unusable; what follows only releases
        self._data, self._slots, self._areas = [], [], []  # no view outlives its mapping
        self._unmap_peers()
        kept, self._memory = self._memory, None  # kept until every peer has unmapped it
        timeout, self.timeout = self.timeout, min(self.timeout, CLOSE_TIMEOUT_S)
        try:
            self.barrier()
            kept = None  # freed now
        except CollectiveError:
            pass  # a peer did not come: keep the memory until exit
        finally:
            if kept is not None:
                _kept.append(kept)
            self.timeout = timeout
            super().close()


# ---- CuPy helpers, shared with the MPI transport -------------------------------------------

def copy_bytes(dst: Any, src: Any) -> None:
    """Copy contiguous `src` into `dst` (of as many bytes), each on the host or a device, on the
    current stream; complete when it returns."""
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memcpyAsync(buffer_address(dst), buffer_address(src), dst.nbytes,
                                  cupy.cuda.runtime.memcpyDefault, stream.ptr)
    stream.synchronize()


def pinned_empty(nbytes: int) -> numpy.ndarray:
    """`nbytes` of page-locked host memory as a NumPy array: the GPU copies it by DMA."""
    import cupyx

    return cupyx.empty_pinned(nbytes, numpy.uint8)
