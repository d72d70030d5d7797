"""All-reduce: every rank gets the reduction of every rank's buffer (nccl-tests' all_reduce_perf).

    mpiexec -n 4 python -m benchmarks.all_reduce -b 8 -e 64M -f 2 --compare mpi,gloo

busbw = algbw * 2(n-1)/n: a ring reduce-scatters then all-gathers, and each rank sends
(n-1)/n of the buffer in each pass.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .measure import reduce_ranks
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.all_reduce(send, recv, op=op)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return reduce_ranks(data, ranks, op)


ALL_REDUCE = Collective(
    name="all_reduce",
    bus_factor=lambda n: 2 * (n - 1) / n,
    shapes=lambda count, n: ((count,), (count,)),
    run=run,
    expected=expected,
    reduces=True,
)

if __name__ == "__main__":
    sys.exit(main(ALL_REDUCE))
