"""Reduce: the root gets the reduction of every rank's buffer (nccl-tests' reduce_perf).

    mpiexec -n 4 python -m benchmarks.reduce -b 8 -e 64M -f 2 -r 0 --compare mpi,gloo

busbw = algbw: whatever the algorithm, the root's link carries the whole buffer's worth.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .measure import reduce_ranks
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.reduce(send, recv, op=op, root=root)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray | None:
    return reduce_ranks(data, ranks, op) if rank == root else None


REDUCE = Collective(
    name="reduce",
    bus_factor=lambda n: 1.0,
    shapes=lambda count, n: ((count,), (count,)),
    run=run,
    expected=expected,
    reduces=True,
    rooted=True,
)

if __name__ == "__main__":
    sys.exit(main(REDUCE))
