"""ringcc's collectives: ring all-reduce, all-gather, broadcast, scatter and reduce-scatter.

    import collectives, numpy as np
    comm = collectives.init()                  # under mpiexec
    total = comm.all_reduce(np.arange(4.0) * comm.rank)

    collectives.spawn(lambda comm: comm.all_reduce(np.ones(3)), 4)   # 4 thread ranks
"""

from __future__ import annotations

from typing import Any

from transports.errors import CollectiveError, MismatchError, PeerFailedError, TimeoutError

from .chunking import chunk_bounds
from .communicator import Communicator
from .ops import OPS
from .spawn import spawn

TRANSPORTS = ("auto", "mpi")

__all__ = ["init", "spawn", "Communicator", "chunk_bounds", "OPS", "TRANSPORTS",
           "CollectiveError", "MismatchError", "PeerFailedError", "TimeoutError"]


def init(transport: str = "auto", comm: Any = None, *, segment_bytes: int | None = None,
         timeout: float | None = None, trace: bool = False) -> Communicator:
    """A Communicator over the ranks of `comm` (an mpi4py communicator, default COMM_WORLD).

    transport: "auto" picks the fastest transport that fits; "mpi" is point-to-point MPI.
    segment_bytes: how large messages are cut for pipelining (also bounds scratch memory).
    timeout: seconds any wait may last (default 300, or $RINGCC_TIMEOUT).
    trace: record every transfer from the start (see `Communicator.trace`).
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; expected one of "
                         f"{', '.join(TRANSPORTS)} (use collectives.spawn for threads)")
    from transports.mpi import MPITransport

    options = {"segment_bytes": segment_bytes, "timeout": timeout}
    return Communicator(MPITransport(comm, **options), trace=trace)
