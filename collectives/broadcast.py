"""Pipelined ring broadcast: the root's buffer flows along the ring, segment by segment.

The ranks form a chain that starts at the root: root -> root+1 -> ... -> root-1. The buffer is
cut into segments (`segment_bytes`); while a rank forwards segment k-1 to its right, it already
receives segment k from its left, so all hops work at once:

    time ->    t0    t1    t2    t3
    root->1    s0    s1    s2
    1->2             s0    s1    s2

Every rank receives the message exactly once; with m segments the last rank has it after
m + N - 2 segment times instead of m (N - 1). With two ranks there is one hop and nothing to
overlap it with, so the message goes whole (the transport still streams it, or the receiver
reads it in one copy).

Small buffers take one exchange instead (`one_shot_broadcast`): every rank publishes its buffer
(only the root's is read: the others' are not even copied, `Transport.unread`), and the others
copy the root's; one wait instead of a chain of N-1 hops, each of which may wait for its rank
to be scheduled when ranks outnumber cores.
"""

from __future__ import annotations

from typing import Any

from transports.base import Transport, segments

from .blocks import from_root


def ring_broadcast(transport: Transport, work: Any, root: int) -> None:
    """Broadcast the flat contiguous array `work` from `root`, in place on every rank."""
    rank, size = transport.rank, transport.size
    if size == 1:
        return
    position = (rank - root) % size  # 0 at the root, size-1 at the end of the chain
    right, left = (rank + 1) % size, (rank - 1) % size
    if size == 2:
        pieces = [work] if work.size else []
    else:
        pieces = [work[lo:hi]
                  for lo, hi in segments(work.size, work.itemsize, transport.segment_bytes)]
    if not pieces:
        return
    if position == 0:
        for step, piece in enumerate(pieces):
            transport.at("broadcast", step)
            transport.send(piece, right)
    elif position == size - 1:
        for step, piece in enumerate(pieces):
            transport.at("broadcast", step)
            transport.recv(piece, left)
    else:
        # Step k: forward segment k-1 while segment k arrives.
        transport.at("broadcast", 0)
        transport.recv(pieces[0], left)
        for step in range(1, len(pieces)):
            transport.at("broadcast", step)
            transport.sendrecv(pieces[step - 1], right, pieces[step], left)
        transport.at("broadcast", len(pieces))
        transport.send(pieces[-1], right)


def one_shot_broadcast(transport: Transport, work: Any, root: int) -> None:
    """Broadcast the flat contiguous array `work` from `root` in one exchange
    (`Transport.all_inputs`, which also carries the call's check). Every rank publishes its
    `work`, the same size everywhere, and all but the root take the root's, into `work`
    (naming what they take, `from_root`: the exchange may read it where it lies, in
    registered memory, or share its copy with the root). Counted as what moves: the root's
    buffer to each other rank."""
    rank = transport.rank
    transport.at("one-shot")
    if rank != root:
        transport.unread()  # (none takes ours)
    else:
        transport.copied_whole()  # (the others copy ours whole)
    transport.all_inputs(work, counted=False, reads=from_root(work.nbytes, root, rank,
                                                              transport.size),
                         into=None if rank == root else work)
    if rank != root:
        transport.count(None, None, work, root)
        return
    for dst in range(transport.size):
        if dst != rank:
            transport.count(work, dst, None, None)
