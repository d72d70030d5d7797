"""Scan: rank r gets the reduction of the buffers of ranks 0..r (MPI_Scan).

    mpiexec -n 4 python -m benchmarks.scan -b 8 -e 64M -f 2 --compare mpi

nccl-tests has no scan, so no bus-bandwidth factor: busbw = algbw. Gloo has none either.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .measure import reduce_ranks
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.scan(send, recv, op=op)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return reduce_ranks(data, rank + 1, op)


SCAN = Collective(
    name="scan",
    bus_factor=lambda n: 1.0,
    shapes=lambda count, n: ((count,), (count,)),
    run=run,
    expected=expected,
    reduces=True,
)

if __name__ == "__main__":
    sys.exit(main(SCAN))
