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
                        last: Any | None = None, forward: int = 0) -> int:
    """N-1 steps, each reducing the received chunk with this rank's own into `work`; returns
    the chunk this rank then holds fully reduced, (rank + first + 1) mod N.

    This rank's input is `mine` when given (then `work` need not hold it), else `work`. With
    `last` (apart from `mine`), the last step reduces into it instead of into `work`: a
    reduce-scatter's result lands where the caller wants it, with no copy after. With
    `forward` (1, or the divisor of an average), the last step is also the first step of the
    all-gather that follows (`all_gather_pass` with first + 1, from step 1): the chunk it
    reduces, divided by `forward`, goes on to the right, and the left's lands in `work`
    (`Transport.reduce_forward`, which may send each piece on as soon as it is reduced).
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
        inbuf = mine[slice(*bounds[recv])]
        if forward and step == size - 2:
            # The all-gather's step 0 sends this chunk, and receives chunk rank + first.
            gathered = work[slice(*bounds[(rank + first) % size])]
            smallest = min(hi - lo for lo, hi in bounds) * work.itemsize
            transport.reduce_forward(outgoing, right, into, left, op, inbuf, gathered,
                                     forward, smallest)
        else:
            transport.sendrecv_reduce(outgoing, right, into, left, op, inbuf=inbuf)
    return (rank + first + 1) % size


def all_gather_pass(transport: Transport, work: Any, bounds: list[tuple[int, int]],
                    first: int = 0, start: int = 0) -> None:
    """N-1 steps, each copying the received chunk into `work`; rank r starts holding chunk
    (r + first) and ends holding all of them. Steps before `start` were made already (a
    reduce-scatter pass's `forward`)."""
    rank, size = transport.rank, transport.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(start, size - 1):
        transport.at("all-gather", step)
        send, recv = ring_chunks(rank, size, step, first)
        transport.sendrecv(work[slice(*bounds[send])], right,
                           work[slice(*bounds[recv])], left)
