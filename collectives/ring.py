"""The two ring passes that all-reduce, all-gather and reduce-scatter are made of.

Both follow one schedule: in step s, rank r sends chunk (r + first - s) to its right neighbour
and receives chunk (r + first - s - 1) from its left. `first` says which chunk a rank sends
first. all_reduce.py explains the ring with a picture and a table.
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport


def ring_chunks(rank: int, size: int, step: int, first: int) -> tuple[int, int]:
    """(chunk sent, chunk received) by `rank` in `step` of a ring pass."""
    return (rank + first - step) % size, (rank + first - step - 1) % size


def reduce_scatter_pass(transport: Transport, work: Any, bounds: list[tuple[int, int]],
                        op: ReduceOp, first: int = 0, mine: Any | None = None,
                        last: Any | None = None) -> int:
    """N-1 steps, each reducing the received chunk with this rank's own into `work`; returns
    the chunk this rank then holds fully reduced, (rank + first + 1) mod N.

    This rank's input is `mine` when given (then `work` need not hold it), else `work`. With
    `last` (apart from `mine`), the last step reduces into it instead of into `work`: a
    reduce-scatter's result lands where the caller wants it, with no copy after.
    """
    rank, size = transport.rank, transport.size
    right, left = (rank + 1) % size, (rank - 1) % size
    mine = work if mine is None else mine
    for step in range(size - 1):
        transport.at("reduce-scatter", step)
        send, recv = ring_chunks(rank, size, step, first)
        # Step 0 sends this rank's own chunk; every later step forwards the chunk reduced in
        # the step before. What arrives is always combined with this rank's own contribution.
        outgoing = (mine if step == 0 else work)[slice(*bounds[send])]
        into = last if last is not None and step == size - 2 else work[slice(*bounds[recv])]
        transport.sendrecv_reduce(outgoing, right, into, left, op,
                                  inbuf=mine[slice(*bounds[recv])])
    return (rank + first + 1) % size


def all_gather_pass(transport: Transport, work: Any, bounds: list[tuple[int, int]],
                    first: int = 0) -> None:
    """N-1 steps, each copying the received chunk into `work`; rank r starts holding chunk
    (r + first) and ends holding all of them."""
    rank, size = transport.rank, transport.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(size - 1):
        transport.at("all-gather", step)
        send, recv = ring_chunks(rank, size, step, first)
        transport.sendrecv(work[slice(*bounds[send])], right,
                           work[slice(*bounds[recv])], left)
