"""ringcc's collectives: ring all-reduce, all-gather, broadcast, scatter and reduce-scatter.

    import collectives, numpy as np
    comm = collectives.init()                  # under mpiexec
    total = comm.all_reduce(np.arange(4.0) * comm.rank)

    collectives.spawn(lambda comm: comm.all_reduce(np.ones(3)), 4)   # 4 thread ranks
"""

from __future__ import annotations

from typing import Any

from transports.errors import (CollectiveError, InvalidArgumentError, InvalidTypeError,
                               MismatchError, PeerFailedError, TimeoutError)

from .chunking import chunk_bounds
from .communicator import Communicator
from .ops import OPS
from .spawn import spawn

TRANSPORTS = ("auto", "mpi", "shm", "cuda_ipc")
DEVICES = ("cpu", "cuda")

__all__ = ["init", "spawn", "Communicator", "chunk_bounds", "OPS", "TRANSPORTS", "DEVICES",
           "CollectiveError", "InvalidArgumentError", "InvalidTypeError", "MismatchError",
           "PeerFailedError", "TimeoutError"]


def init(transport: str = "auto", comm: Any = None, *, device: str | None = None,
         segment_bytes: int | None = None, one_shot_bytes: int | None = None,
         timeout: float | None = None, trace: bool = False,
         check: bool | None = None) -> Communicator:
    """A Communicator over the ranks of `comm` (an mpi4py communicator, default COMM_WORLD).

    transport: "shm" is shared memory among ranks on one node, "cuda_ipc" device memory
        shared among ranks on one node through CUDA IPC, "mpi" point-to-point MPI; "auto"
        picks, when every rank is on one node, shm for device "cpu" and cuda_ipc for "cuda",
        else mpi.
    device: the arrays the communicator moves: "cpu" NumPy arrays, "cuda" CuPy arrays, with
        GPU r mod (GPUs) made current for the r-th rank of a node (the mpi transport stages
        them through pinned host memory unless the MPI library takes device memory). Default:
        "cuda" for transport "cuda_ipc", else "cpu". "auto" never picks the device itself: a
        communicator moves one kind of array, fixed here, before it sees any.
    segment_bytes: how large messages are cut for pipelining (also bounds scratch memory).
    one_shot_bytes: all-reduces up to this size take the one-shot path instead of the ring
        (default: the transport's measured crossover, or $RINGCC_ONE_SHOT_BYTES; 0: always ring).
    timeout: seconds any wait may last (default 300, or $RINGCC_TIMEOUT).
    trace: record every transfer from the start (see `Communicator.trace`).
    check: compare every call across ranks before data moves (default on; $RINGCC_CHECK=0).

    In a job of several processes it also makes an uncaught exception abort the job (see job.py).
    """
    if transport not in TRANSPORTS:
        raise InvalidArgumentError(f"unknown transport {transport!r}; expected one of "
                                   f"{', '.join(TRANSPORTS)} (use collectives.spawn for threads)")
    device = device or ("cuda" if transport == "cuda_ipc" else "cpu")
    if device not in DEVICES:
        raise InvalidArgumentError(f"unknown device {device!r}; expected one of "
                                   f"{', '.join(DEVICES)}")
    if (transport, device) == ("shm", "cuda"):
        raise InvalidArgumentError("the shm transport moves host memory; for CuPy arrays "
                                   "use transport 'cuda_ipc', 'mpi' or 'auto'")
    if (transport, device) == ("cuda_ipc", "cpu"):
        raise InvalidArgumentError("the cuda_ipc transport moves CuPy arrays: pass "
                                   "device='cuda' (or leave it out)")
    from mpi4py import MPI

    from transports.mpi import MPITransport
    from transports.shm import ShmTransport, on_one_node

    from .job import guard_job

    guard_job()
    comm = comm if comm is not None else MPI.COMM_WORLD
    if transport == "auto":
        transport = ("cuda_ipc" if device == "cuda" else "shm") if on_one_node(comm) else "mpi"
    options = {"segment_bytes": segment_bytes, "one_shot_bytes": one_shot_bytes,
               "timeout": timeout}
    if transport == "cuda_ipc":
        from transports.cuda_ipc import CudaIpcTransport

        kind = CudaIpcTransport
    elif transport == "shm":
        kind = ShmTransport
    else:
        kind = MPITransport
        if device == "cuda":
            from transports.cuda_ipc import use_gpu

            options["xp"] = use_gpu(comm)
    return Communicator(kind(comm, **options), trace=trace, check=check)
