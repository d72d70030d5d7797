"""Reduce-scatter: rank r gets block r of the reduction of every rank's buffer
(nccl-tests' reduce_scatter_perf).

    mpiexec -n 4 python -m benchmarks.reduce_scatter -b 8 -e 64M -f 2 --compare mpi,gloo

The size is each rank's whole input (n blocks). busbw = algbw * (n-1)/n: each rank sends
n-1 partial blocks around the ring.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .measure import reduce_ranks
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.reduce_scatter(send, recv, op=op)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return reduce_ranks(lambda r: data(r)[rank], ranks, op)


REDUCE_SCATTER = Collective(
    name="reduce_scatter",
    bus_factor=lambda n: (n - 1) / n,
    shapes=lambda count, n: ((n, count // n), (count // n,)),
    run=run,
    expected=expected,
    blocks=True,
    reduces=True,
)

if __name__ == "__main__":
    sys.exit(main(REDUCE_SCATTER))
