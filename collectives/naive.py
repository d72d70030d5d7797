"""Two naive all-reduces, kept beside the ring to show what the ring saves.

Both are written against the same transport seam as the ring (Gloo keeps its naive
`AllreduceRing` beside `AllreduceRingChunked` for the same reason). For N ranks and a buffer
of S bytes:

    algorithm                    steps      most bytes a rank sends   time (alpha-beta)
    ring (all_reduce.py)         2(N-1)     2(N-1)/N * S              2(N-1) a + 2(N-1)/N S b
    whole-buffer ring            N-1        (N-1) * S                 (N-1) a + (N-1) S b
    reduce to root, broadcast    2(N-1)     (N-1) * S  (the root)     2(N-1) a + 2(N-1) S b

The ring sends less than 2S per rank however many ranks there are; the naive ones send a
multiple of S that grows with N, and `python -m collectives.explain naive_ring` shows it.
Both are reached as `comm.all_reduce(buf, algorithm="naive_ring")` (or "reduce_broadcast").
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport, segments


def naive_ring_all_reduce(transport: Transport, work: Any, op: ReduceOp,
                          average: bool = False, mine: Any | None = None) -> None:
    """All-reduce `mine` (default: `work`, in place) into `work` by passing every rank's whole
    buffer once round the ring.

    In step s, rank r sends the buffer of rank (r - s) to its right and receives that of rank
    (r - s - 1) from its left, then reduces it into `work`. Two boxes, swapped every step, hold
    the buffer in flight: what arrived in one step is what leaves in the next.

    Each rank adds the buffers in the order they reach it, r, r-1, r-2, ...: a floating-point
    sum then differs between ranks in its last bits, the one all-reduce here that does. (The
    ring reduces each chunk along one path and copies the result, so every rank holds the
    same bits; making this one agree would mean keeping all N buffers, to add in rank order.)
    """
    rank, size = transport.rank, transport.size
    if mine is not None:
        work[...] = mine
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    boxes = transport.xp.empty((2, work.size), work.dtype)
    boxes[0] = work
    for step in range(size - 1):
        transport.at("whole-buffer ring", step)
        outbox, inbox = boxes[step % 2], boxes[(step + 1) % 2]
        transport.sendrecv(outbox, right, inbox, left)
        op(work, inbox, out=work)
    if average:
        transport.xp.true_divide(work, size, out=work)


def reduce_broadcast_all_reduce(transport: Transport, work: Any, op: ReduceOp,
                                average: bool = False, mine: Any | None = None,
                                root: int = 0) -> None:
    """All-reduce `mine` (default: `work`, in place) into `work`: every rank sends its buffer
    to `root`, which reduces them one after another and sends the result back to each rank.

    The root's link carries everything, (N-1) S bytes each way, while the others idle.
    Buffers move in segments (`segment_bytes`), each reduced as it lands.
    """
    rank, size = transport.rank, transport.size
    if mine is not None:
        work[...] = mine
    if size == 1:
        return
    pieces = [work[lo:hi] for lo, hi in segments(work.size, work.itemsize,
                                                   transport.segment_bytes)]
    peers = [(root + k) % size for k in range(1, size)]
    if rank == root:
        for step, peer in enumerate(peers):
            transport.at("reduce", step)
            for piece in pieces:
                transport.sendrecv_reduce(None, None, piece, peer, op)
        if average:
            transport.xp.true_divide(work, size, out=work)
    else:
        transport.at("reduce", peers.index(rank))
        for piece in pieces:
            transport.send(piece, root)
    if rank == root:
        for step, peer in enumerate(peers):
            transport.at("broadcast", step)
            for piece in pieces:
                transport.send(piece, peer)
    else:
        transport.at("broadcast", peers.index(rank))
        for piece in pieces:
            transport.recv(piece, root)
