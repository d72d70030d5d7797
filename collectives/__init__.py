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

TRANSPORTS = ("auto", "mpi", "shm")

__all__ = ["init", "spawn", "Communicator", "chunk_bounds", "OPS", "TRANSPORTS",
           "CollectiveError", "InvalidArgumentError", "InvalidTypeError", "MismatchError",
           "PeerFailedError", "TimeoutError"]


def init(transport: str = "auto", comm: Any = None, *, segment_bytes: int | None = None,
         one_shot_bytes: int | None = None, timeout: float | None = None,
         trace: bool = False, check: bool | None = None) -> Communicator:
    """A Communicator over the ranks of `comm` (an mpi4py communicator, default COMM_WORLD).

    transport: "shm" is shared memory among ranks on one node, "mpi" point-to-point MPI;
        "auto" picks shm when every rank is on one node, else mpi.
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
    from mpi4py import MPI

    from transports.mpi import MPITransport
    from transports.shm import ShmTransport, on_one_node

    from .job import guard_job

    guard_job()
    comm = comm if comm is not None else MPI.COMM_WORLD
    if transport == "auto":
        transport = "shm" if on_one_node(comm) else "mpi"
    kind = ShmTransport if transport == "shm" else MPITransport
    options = {"segment_bytes": segment_bytes, "one_shot_bytes": one_shot_bytes,
               "timeout": timeout}
    return Communicator(kind(comm, **options), trace=trace, check=check)
