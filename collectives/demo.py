"""A short look at the ring: `mpiexec -n 4 python -m collectives.demo`.

Each rank holds data that depends on its rank, all-reduces it, and rank 0 shows the inputs,
the result, and the bytes each rank sent against the ring's 2(N-1)/N bound.
"""

from __future__ import annotations

import numpy

import collectives


def main() -> None:
    with collectives.init() as comm:
        mine = numpy.arange(8, dtype=numpy.float64) + 10 * comm.rank
        inputs = comm.all_gather(mine)
        comm.stats.reset()
        total = comm.all_reduce(mine)
        sent = comm.all_gather(numpy.array([comm.stats.bytes_sent]))
        results = comm.all_gather(total)
        if comm.rank == 0:
            print(f"ring all-reduce over {comm.size} ranks on the {comm.transport} transport")
            for rank, row in enumerate(inputs):
                print(f"  rank {rank} holds   {row}")
            print(f"  every rank gets {total}")
            same = all(r.tobytes() == total.tobytes() for r in results)
            print(f"  bitwise identical on all ranks: {same}")
            print(f"  matches numpy's sum: {numpy.array_equal(total, inputs.sum(axis=0))}")
            bound = 2 * (comm.size - 1) / comm.size * mine.nbytes
            print(f"  bytes sent per rank: {sent.ravel().tolist()} "
                  f"(ring bound 2(N-1)/N * {mine.nbytes} = {bound:g})")


if __name__ == "__main__":
    main()
