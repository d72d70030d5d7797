"""All-to-all: block j of every rank's buffer goes to rank j (nccl-tests' alltoall_perf).

    mpiexec -n 4 python -m benchmarks.all_to_all -b 8 -e 64M -f 2 --compare mpi,gloo

The size is each rank's whole buffer (n blocks). busbw = algbw * (n-1)/n: each rank sends and
receives every block but the one it keeps.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from .harness import main
from .options import Collective, Data


def run(comm: Any, send: numpy.ndarray, recv: numpy.ndarray, op: str, root: int) -> None:
    comm.all_to_all(send, recv)


def expected(data: Data, rank: int, ranks: int, op: str, root: int) -> numpy.ndarray:
    return numpy.stack([data(r)[rank] for r in range(ranks)])


ALL_TO_ALL = Collective(
    name="all_to_all",
    bus_factor=lambda n: (n - 1) / n,
    shapes=lambda count, n: ((n, count // n), (n, count // n)),
    run=run,
    expected=expected,
    blocks=True,
)

if __name__ == "__main__":
    sys.exit(main(ALL_TO_ALL))
