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

Larger ones on more than two ranks that outnumber the cores, where the transport reaches its
peers' memory (`reads_from_root`), go one-sided (`one_sided_broadcast`): one exchange says
where the root's buffer lies, each other rank reads it whole, straight out of the root's
memory, and a barrier ends the call. Each rank still receives the message once, but waits
twice, where the chain's ranks wait at every hop of every segment for the rank before them
to be scheduled: measured on 4 ranks sharing 2 cores (docs/performance.md, "One-sided moves: a
scatter's blocks, a broadcast on shared cores"), a 4 or 16 MiB broadcast took 0.6x the ring's time.
"""

from __future__ import annotations

from typing import Any

import numpy

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


def reads_from_root(transport: Transport, nbytes: int) -> bool:
    """Whether a broadcast of `nbytes` (more than one exchange holds) goes one-sided: where
    the transport reaches its peers' memory (`Transport.one_sided`), on more than two ranks
    (two ranks share the copy of a message one way: transports/slots.py, "Shared copies")
    that outnumber the cores, unless `one_shot_bytes` is 0 (the ring at every size). The
    same on every rank."""
    return (transport.one_sided and transport.oversubscribed and transport.size > 2
            and transport.one_shot_bytes > 0 and nbytes > 0)


def one_sided_broadcast(transport: Transport, work: Any, root: int) -> None:
    """Broadcast the flat contiguous host array `work` from `root` one-sided: one exchange
    (which also carries the call's check) says where the root's buffer lies (`where_root`);
    each other rank reads it whole into `work`, then the barrier (`read_from_root`)."""
    transport.at("broadcast")
    said = transport.all_inputs(where_root(transport, work, root), counted=False)
    read_from_root(transport, said, root, work)


def where_root(transport: Transport, work: Any, root: int) -> Any:
    """What a rank publishes in a one-sided broadcast's exchange: the root, where its `work`
    lies (`Transport.locate`); the others, 0."""
    where = numpy.zeros(1, numpy.uint64)
    if transport.rank == root:
        where[0] = transport.locate(work)
    return where


def read_from_root(transport: Transport, said: list[Any], root: int, work: Any) -> None:
    """The rest of a one-sided broadcast, once every rank's word has come (`said`): each other
    rank reads the root's buffer whole into `work` (`Transport.get`); then the barrier, after
    which the root's buffer may change. Counted as what moves: the root's buffer to each
    other rank."""
    rank = transport.rank
    if rank != root:
        transport.get(root, int(said[root][0]), 0, work)
        transport.count(None, None, work, root)
    else:
        for dst in range(transport.size):
            if dst != rank:
                transport.count(work, dst, None, None)
    transport.barrier()
