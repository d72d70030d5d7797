"""Broadcast: the root's buffer lands, in place, on every rank (nccl-tests' broadcast_perf).

    mpiexec -n 4 python -m benchmarks.broadcast -b 8 -e 64M -f 2 -r 0 --compare mpi,gloo

busbw = algbw: a pipelined ring moves the whole buffer over every link once.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.broadcast(recv, root=root)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return data(root)


BROADCAST = Collective(
    name="broadcast",
    bus_factor=lambda n: 1.0,
    shapes=lambda count, n: ((count,), None),
    run=run,
    expected=expected,
    rooted=True,
)

if __name__ == "__main__":
    sys.exit(main(BROADCAST))
