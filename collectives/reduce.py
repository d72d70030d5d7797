"""Reduce to a root: the root gets the reduction of every rank's buffer (Rabenseifner's).

Two passes, both made of pieces that already exist:

1. Ring reduce-scatter (reduce_scatter.py): the buffer is cut into N chunks and, after N-1
   steps round the ring, rank r holds chunk r fully reduced. Every rank reduces one chunk, so
   the arithmetic is spread over all of them.
2. Gather (gather.py): every rank but the root sends its reduced chunk to the root.

With 3 ranks and root 0, as "sent/received" chunk numbers ("-": nothing; a test runs the code
and checks this table against what it does):

    pass            step   rank 0   rank 1   rank 2
    reduce-scatter  0      2/1      0/2      1/0
    reduce-scatter  1      1/0      2/1      0/2
    gather          0      -/1      1/-      -
    gather          1      -/2      -        2/-

In the first pass what arrives is reduced into this rank's own copy of the chunk, which it
sends on in the next step, so rank r ends with chunk r reduced over every rank; in the second
the root copies the others' chunks into place.

Cost, for S bytes: every rank but the root sends S ((N-1)/N S in the first pass, its chunk S/N
in the second), the root (N-1)/N S; the root receives 2(N-1)/N S. A pipelined chain (each rank
receives the running reduction, adds its own and passes it on) would send S from every rank
and receive S at the root, but each rank would reduce the whole buffer, and the last segment
would reach the root only after N-1 hops. Both keep scratch at S on every rank but the root.

On two ranks the reduce-scatter's one step and the gather's one message are one call
(`reduce_pair`, `Transport.reduce_forward`), which a transport may fuse: the root's peer writes
each piece of its chunk into the root's result as soon as it has reduced it.
Small buffers take one exchange instead (`one_shot_reduce`): every rank publishes its buffer,
and the root reduces all N in rank order, as the one-shot all-reduce does. Where ranks
outnumber the cores and the transport reads each chunk in place, the first pass is one
exchange too, below the chunks for which the two-shot passes pay (`read_in_one_exchange`),
as the reduce-scatter's is.
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport

from .ops import reduce_in_rank_order, with_own
from .blocks import to_root
from .chunking import chunk_bounds
from .gather import gather_to_root, inputs_at_root
from .reduce_scatter import one_shot_reduce_scatter, read_in_one_exchange
from .ring import reduce_scatter_pass


def reduce_to_root(transport: Transport, mine: Any, work: Any, op: ReduceOp, root: int,
                   average: bool = False) -> None:
    """Reduce the flat array `mine` over every rank into `work` (flat, the same size) at
    `root`; elsewhere `work` is scratch. `mine` may be `work` itself (in place)."""
    size, rank = transport.size, transport.rank
    if size == 1:
        if mine is not work:
            work[...] = mine
        return
    bounds = chunk_bounds(work.size, size)
    if size == 2:
        reduce_pair(transport, mine, work, bounds, op, root, average)
        return
    if work.size % size == 0 and read_in_one_exchange(transport, mine.nbytes):
        # (Where ranks outnumber the cores: the first pass in one exchange, reduce_scatter.py.)
        chunk = work[slice(*bounds[rank])]
        one_shot_reduce_scatter(transport, mine, op, average, bounds, chunk)
    else:
        owned = reduce_scatter_pass(transport, work, bounds, op, first=-1, mine=mine)
        chunk = work[slice(*bounds[owned])]
        if average:
            transport.xp.true_divide(chunk, size, out=chunk)
    gather_to_root(transport, None if rank == root else chunk, work, bounds, root)


def reduce_pair(transport: Transport, mine: Any, work: Any, bounds: list[tuple[int, int]],
                op: ReduceOp, root: int, average: bool) -> None:
    """Two ranks: the reduce-scatter's one step and the gather's one message in one call, which
    a transport may fuse, the root's peer writing each piece of its chunk into the root's
    result as soon as it has reduced it (`Transport.reduce_forward`, the result one way)."""
    rank, peer = transport.rank, 1 - transport.rank
    own, theirs = slice(*bounds[rank]), slice(*bounds[peer])
    transport.at("reduce-scatter", 0)
    transport.reduce_forward(mine[theirs], peer, work[own], peer, op, mine[own],
                             work[theirs] if rank == root else None, 2 if average else 1,
                             min(hi - lo for lo, hi in bounds) * work.itemsize,
                             onward=rank != root)


def one_shot_reduce(transport: Transport, mine: Any, work: Any | None, op: ReduceOp, root: int,
                    average: bool = False) -> None:
    """The reduction of every rank's flat `mine` into the root's flat `work` (which may be
    `mine`), in one exchange, in rank order; two or more ranks. The root takes its peers'
    inputs and reduces its own where it lies (`to_root`: the exchange may leave an input in
    registered memory where it lies too)."""
    rank, xp = transport.rank, transport.xp
    inputs = inputs_at_root(transport, mine, root, lambda src: work,
                            to_root(mine.nbytes, root, rank, transport.size))
    if inputs is not None:
        reduce_in_rank_order(xp, with_own(xp, inputs, mine, rank, work), op, average, out=work)
