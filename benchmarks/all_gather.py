"""All-gather: every rank gets every rank's block, in rank order (nccl-tests' all_gather_perf).

    mpiexec -n 4 python -m benchmarks.all_gather -b 8 -e 64M -f 2 --compare mpi,gloo

The size is the whole output (n blocks). busbw = algbw * (n-1)/n: each rank receives the
n-1 blocks it lacks.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.all_gather(send, recv)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return numpy.stack([data(r) for r in range(ranks)])


ALL_GATHER = Collective(
    name="all_gather",
    bus_factor=lambda n: (n - 1) / n,
    shapes=lambda count, n: ((count // n,), (n, count // n)),
    run=run,
    expected=expected,
    blocks=True,
)

if __name__ == "__main__":
    sys.exit(main(ALL_GATHER))
