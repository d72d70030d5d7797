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
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport, segments

from .communicator import Communicator, _flat_work
from .ops import resolve_op


def naive_ring_all_reduce(transport: Transport, work: Any, op: ReduceOp,
                          average: bool = False) -> None:
    """All-reduce `work` in place by passing every rank's whole buffer once round the ring.

    In step s, rank r sends the buffer of rank (r - s) to its right and receives that of rank
    (r - s - 1) from its left, then reduces it into `work`. Two boxes, swapped every step, hold
    the buffer in flight: what arrived in one step is what leaves in the next.
    """
    rank, size = transport.rank, transport.size
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    boxes = transport.xp.empty((2, work.size), work.dtype)
    boxes[0] = work
    transport.phase = "whole-buffer ring"
    for step in range(size - 1):
        transport.step = step
        outbox, inbox = boxes[step % 2], boxes[(step + 1) % 2]
        transport.sendrecv(outbox, right, inbox, left)
        op(work, inbox, out=work)
    if average:
        transport.xp.true_divide(work, size, out=work)


def reduce_broadcast_all_reduce(transport: Transport, work: Any, op: ReduceOp,
                                average: bool = False, root: int = 0) -> None:
    """All-reduce `work` in place: every rank sends its buffer to `root`, which reduces them
    one after another and sends the result back to each rank in turn.

    The root's link carries everything, (N-1) S bytes each way, while the others idle.
    Buffers move in segments (`segment_bytes`), each reduced as it lands.
    """
    rank, size = transport.rank, transport.size
    if size == 1:
        return
    pieces = [work[lo:hi] for lo, hi in segments(work.size, work.itemsize,
                                                   transport.segment_bytes)]
    peers = [(root + k) % size for k in range(1, size)]
    transport.phase = "reduce"
    if rank == root:
        for transport.step, peer in enumerate(peers):
            for piece in pieces:
                transport.sendrecv_reduce(None, None, piece, peer, op)
        if average:
            transport.xp.true_divide(work, size, out=work)
    else:
        transport.step = peers.index(rank)
        for piece in pieces:
            transport.send(piece, root)
    transport.phase = "broadcast"
    if rank == root:
        for transport.step, peer in enumerate(peers):
            for piece in pieces:
                transport.send(piece, peer)
    else:
        transport.step = peers.index(rank)
        for piece in pieces:
            transport.recv(piece, root)


ALGORITHMS = {"naive_ring": naive_ring_all_reduce, "reduce_broadcast": reduce_broadcast_all_reduce}


def all_reduce(comm: Communicator, buf: Any, algorithm: str, op: str = "sum") -> Any:
    """`comm.all_reduce(buf, buf, op)` done by a naive `algorithm` (a key of ALGORITHMS)."""
    xp = comm._module(buf)
    ufunc = resolve_op(op, buf.dtype, xp)
    comm._check_writeable(buf, "buf")
    work, copied = _flat_work(buf, xp)
    comm._begin(algorithm, buf.size, buf.dtype, op)
    ALGORITHMS[algorithm](comm._transport, work, ufunc, average=(op == "avg"))
    if copied:
        buf[...] = work.reshape(buf.shape)
    return buf
