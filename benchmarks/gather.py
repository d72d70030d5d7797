"""Gather: the root gets every rank's block, in rank order (nccl-tests' gather_perf).

    mpiexec -n 4 python -m benchmarks.gather -b 8 -e 64M -f 2 -r 0 --compare mpi,gloo

The size is the root's whole output (n blocks). busbw = algbw * (n-1)/n: the root receives
every block but its own.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.gather(send, recv, root=root)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray | None:
    return numpy.stack([data(r) for r in range(ranks)]) if rank == root else None


GATHER = Collective(
    name="gather",
    bus_factor=lambda n: (n - 1) / n,
    shapes=lambda count, n: ((count // n,), (n, count // n)),
    run=run,
    expected=expected,
    blocks=True,
    rooted=True,
)

if __name__ == "__main__":
    sys.exit(main(GATHER))
