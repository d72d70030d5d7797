"""Scatter: block r of the root's buffer goes to rank r (nccl-tests' scatter_perf).

    mpiexec -n 4 python -m benchmarks.scatter -b 8 -e 64M -f 2 -r 0 --compare mpi,gloo

The size is the root's whole input (n blocks). busbw = algbw * (n-1)/n: the root sends all
blocks but its own.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.scatter(send, recv, root=root)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return data(root)[rank]


SCATTER = Collective(
    name="scatter",
    bus_factor=lambda n: (n - 1) / n,
    shapes=lambda count, n: ((n, count // n), (count // n,)),
    run=run,
    expected=expected,
    blocks=True,
    rooted=True,
)

if __name__ == "__main__":
    sys.exit(main(SCATTER))
