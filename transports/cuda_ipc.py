"""CUDA IPC on one node: ranks copy, and reduce, straight out of each other's device memory.

The slot protocol (slots.py) with its data on the GPU: slots that carry a message a segment at
a time, one-shot areas for all-reduces (small ones, and on one GPU any, an area at a time: see
`CudaIpcTransport`), and the control lines (which slot holds which
segment, what each rank has consumed, barrier counts) in a host shared-memory region, where
the CPU polls them. Only where the data lives, and how it is copied and reduced, differ from
shm, and `CudaIpcMemory` says so:

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
"""

from __future__ import annotations

from typing import Any

import numpy
from mpi4py import MPI

from .base import ReduceOp
from .cuda import copy_bytes, require_cupy, use_gpu
from .errors import CollectiveError
from .slots import SlotTransport

CLOSE_TIMEOUT_S = 10.0
_kept: list[Any] = []  # device memory a peer may still map (see the module docstring)


class CudaIpcMemory:
    """Slot memory on the GPU, shared through CUDA IPC handles."""

    device = "cuda"
    in_host_region = False  # the host regions hold only the control lines

    def __init__(self) -> None:
        self.xp = require_cupy()
        self.own = None  # this rank's device memory: its slots and one-shot areas
        self.opened: list[int] = []  # peers' memory mapped here, unmapped by `unmap_peers`
        self.gpu = None  # the device this rank uses, chosen in `share`
        self.one_gpu = False  # whether every rank uses the same GPU, learnt in `share`

    def share(self, comm: MPI.Comm, regions: list[Any], offset: int, nbytes: int) -> list[Any]:
        """Allocate this rank's data in device memory and map every peer's (rank order).

        Collective. Each step ends in an agreement, so when any rank fails every rank raises.
        """
        use_gpu(comm)
        self.gpu = self.xp.cuda.Device()
        runtime = self.xp.cuda.runtime
        rank = comm.Get_rank()
        mine, failure = None, None
        try:
            self.own = self.xp.cuda.Memory(nbytes)
            # The data starts at the allocation's base, so its offset from what the handle
            # names is 0.
            mine = (runtime.ipcGetMemHandle(self.own.ptr), 0, nbytes)
        except (MemoryError, runtime.CUDARuntimeError) as error:
            failure = error
        shared = comm.allgather(mine)
        self.one_gpu = len(set(comm.allgather(self.gpu.pci_bus_id))) == 1
        if None in shared:
            raise CollectiveError(f"rank {shared.index(None)} could not allocate {nbytes} bytes "
                                  f"of device memory for the cuda_ipc transport; pass a smaller "
                                  f"segment_bytes") from failure
        data = []
        try:
            for peer, (handle, start, size) in enumerate(shared):
                if peer == rank:  # a process cannot open its own handle
                    data.append(self.xp.ndarray((nbytes,), numpy.uint8,
                                                self.xp.cuda.MemoryPointer(self.own, 0)))
                    continue
                base = runtime.ipcOpenMemHandle(handle)
                self.opened.append(base)
                # Reached from this rank's GPU (through P2P if the memory is on another), so
                # CuPy is told it is on this GPU.
                memory = self.xp.cuda.UnownedMemory(base + start, size, None, self.gpu.id)
                data.append(self.xp.ndarray((size,), numpy.uint8,
                                            self.xp.cuda.MemoryPointer(memory, 0)))
        except runtime.CUDARuntimeError as error:
            failure = error
        if not comm.allreduce(failure is None, op=MPI.LAND):
            self.unmap_peers()
            raise CollectiveError("a rank could not map its peers' device memory through CUDA "
                                  "IPC (with several GPUs, every pair must be peer-accessible)"
                                  ) from failure
        return data

    def copy(self, dst: Any, src: Any) -> None:
        copy_bytes(dst, src)

    def reduce(self, op: ReduceOp, out: Any, mine: Any, theirs: Any) -> None:
        op(mine, theirs, out=out)
        self.xp.cuda.get_current_stream().synchronize()

    def settle(self) -> None:
        self.gpu.synchronize()  # see the module docstring: reads of the previous call

    def can_read(self, comm: MPI.Comm, pids: list[int], usable: bool) -> bool:
        return False  # peers' device buffers are read through the slots only

    def unmap_peers(self) -> None:
        """Close every peer's handle opened here."""
        runtime = self.xp.cuda.runtime
        for base in self.opened:
            try:
                runtime.ipcCloseMemHandle(base)
            except runtime.CUDARuntimeError:  # a failed kernel broke the context: nothing to do
                pass
        self.opened = []


class CudaIpcTransport(SlotTransport):
    """Ranks of `comm` (default `MPI.COMM_WORLD`), all on one node, moving CuPy arrays."""

    name = "cuda_ipc"
    # Large slots, since every segment costs a stream synchronisation on each side.
    default_segment_bytes = 16 << 20
    # One-shot areas of 32 MiB. Measured on one H100 shared by 2 ranks (README, "GPU"): each
    # time one process's GPU work waits for another's, the GPU switches contexts, about 300 us
    # without MPS. One exchange per call beat the ring's 2(N-1) steps at every size, 64 MiB in
    # one exchange taking 844 us against the ring's 2490 (275 against 433 with MPS).
    default_one_shot_bytes = 32 << 20

    def __init__(self, comm: MPI.Comm | None = None, **options: Any) -> None:
        super().__init__(comm, CudaIpcMemory(), **options)
        # On one GPU the inputs are in the same memory whichever rank reads them, so reading
        # all N costs no link: all-reduces of any size go one-shot, an area at a time. Across
        # GPUs one-shot would move N-1 inputs over the links where the ring moves 2(N-1)/N.
        # (one_shot_bytes=0 still asks for the ring at every size.)
        self.one_shot_at_any_size = self.memory.one_gpu and self.one_shot_bytes > 0

    def close(self) -> None:
        if self.closed:
            return
        memory = self.memory
        try:
            memory.gpu.synchronize()  # our kernels that read peers' memory have finished
        except self.xp.cuda.runtime.CUDARuntimeError:
            pass  # a failed kernel left the context unusable; what follows only releases
        self._data, self._slots, self._exchanges = [], [], {}  # no view outlives its mapping
        memory.unmap_peers()
        kept, memory.own = memory.own, None  # kept until every peer has unmapped it
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
