"""Sendrecv: every rank sends its buffer to the next rank while receiving the previous one's
(nccl-tests' sendrecv_perf).

    mpiexec -n 4 python -m benchmarks.sendrecv -b 8 -e 64M -f 2 --compare mpi,gloo

busbw = algbw: each rank's link carries the buffer once each way.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.sendrecv(send, (comm.rank + 1) % comm.size, recv, (comm.rank - 1) % comm.size)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return data((rank - 1) % ranks)


SENDRECV = Collective(
    name="sendrecv",
    bus_factor=lambda n: 1.0,
    shapes=lambda count, n: ((count,), (count,)),
    run=run,
    expected=expected,
)

if __name__ == "__main__":
    sys.exit(main(SENDRECV))
