"""Send and recv: a ping-pong between ranks 0 and 1 (the OSU micro-benchmarks' osu_latency).

    mpiexec -n 2 python -m benchmarks.send -b 8 -e 1M -f 8 --compare mpi,gloo

Rank 0 sends its buffer to rank 1 and receives rank 1's back; rank 1 receives, then sends.
time is the round trip, a message each way; osu_latency reports half of it, the one-way
latency. Other ranks take no part. busbw = algbw: the buffer crosses the pair once each way.
nccl-tests has no such test (its sendrecv_perf, benchmarks/sendrecv.py, sends both ways at once).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    if comm.rank == 0 and comm.size > 1:
        comm.send(send, 1)
        comm.recv(recv, 1)
    elif comm.rank == 1:
        comm.recv(recv, 0)
        comm.send(send, 0)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray | None:
    return data(1 - rank) if rank < 2 and ranks > 1 else None


SEND = Collective(
    name="send",
    bus_factor=lambda n: 1.0,
    shapes=lambda count, n: ((count,), (count,)),
    run=run,
    expected=expected,
)

if __name__ == "__main__":
    sys.exit(main(SEND))
