"""Ring reduce-scatter: block r of the reduction of every rank's buffer ends on rank r.

This is the first pass of ring all-reduce (see all_reduce.py), shifted by one chunk so that
the block each rank finishes with is its own: in step s, rank r sends block (r - s - 1) and
receives block (r - s - 2), reducing it into its copy. Each rank sends (N-1)/N of the input.
Uneven blocks (`counts`, MPI's Reduce_scatter) take the same ring: each rank then sends every
block but its own.

Small buffers of equal blocks take one exchange instead (`one_shot_reduce_scatter`): every rank
publishes its buffer, and each reduces its own block of all N in rank order, as the one-shot
all-reduce does; one wait instead of N-1 steps. Where ranks outnumber the cores, and the
transport reads each rank's block straight out of its owner's memory (`read_in_one_exchange`),
larger ones do too, up to the blocks for which the two-shot passes below pay: the same bytes
move as in the ring, and each of its N-1 steps would wait for a peer to get a core.

Where ranks outnumber the cores, large blocks take the two-shot all-reduce's first pass
(`two_shot_reduce_scatter`, two_shot.py): every rank starts sending each peer its block, then
reduces its own block from every peer as they come. A ring step waits for a left neighbour
that may not be running; here a rank waits only for its peers to have started the call. The
same bytes move: N-1 blocks sent and received by each rank.
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport

from .ops import reduce_in_rank_order
from .blocks import own_blocks
from .ring import reduce_scatter_pass
from .two_shot import AUTO_CHUNK_BYTES, reduce_own_chunk


def ring_reduce_scatter(transport: Transport, mine: Any, work: Any, op: ReduceOp,
                        average: bool = False, *, bounds: list[tuple[int, int]],
                        out: Any | None = None) -> Any:
    """Reduce-scatter the flat array `mine`, block r at bounds[r], using `work` (the same
    size) for the chunks in flight; returns block `rank` of the result: `out` when given
    (flat, apart from `mine`), which the last step reduces into, else a view of `work`."""
    size, rank = transport.size, transport.rank
    if size == 1:  # no steps: the input is the result
        (work if out is None else out)[...] = mine
    owned = reduce_scatter_pass(transport, work, bounds, op, first=-1, mine=mine, last=out)
    assert owned == rank
    result = work[slice(*bounds[rank])] if out is None else out
    if average:
        transport.xp.true_divide(result, size, out=result)
    return result


def read_in_one_exchange(transport: Transport, nbytes: int) -> bool:
    """Whether a reduce-scatter of equal blocks, `nbytes` in all, takes one exchange at any
    size: on more than 2 ranks that outnumber the cores, where the transport reads each
    rank's block in place (`Transport.reads_in_place`), blocks smaller than those for which
    the two-shot passes pay (AUTO_CHUNK_BYTES), unless `one_shot_bytes` is 0 (never); a
    reduce's first pass too (reduce.py), and an all-reduce's where it takes the two exchanges
    (all_reduce.py, `exchanged_passes_pay`). The same on every rank. Measured on 4 ranks sharing
    2 cores (docs/performance.md, "Large calls in the lane, and copies read directly on shared
    cores"): 1 MiB took 668-733 us so against 1075-1191 by the ring, 2 MiB 1600-1787 against
    1913-2099; 4 MiB (1 MiB blocks) took longer so than by the two-shot passes, 3544-3822
    against 3319-3546."""
    size = transport.size
    block = nbytes // size
    return (size > 2 and transport.oversubscribed and transport.one_shot_bytes > 0
            and 0 < block < AUTO_CHUNK_BYTES
            and transport.reads_in_place(((0, block),) * size, nbytes))


def one_shot_reduce_scatter(transport: Transport, mine: Any, op: ReduceOp, average: bool,
                            bounds: list[tuple[int, int]], out: Any) -> None:
    """Reduce-scatter the flat array `mine` (equal blocks at `bounds`) into this rank's flat
    block `out`, in one exchange (`Transport.all_inputs`, which also carries the call's check);
    two or more ranks. This rank's own block is reduced where it lies in `mine`
    (`Transport.keeps_own`: the exchange need not copy it), unless `out` overlaps `mine`.
    Counted as the ring is: one block to and from each peer."""
    rank, size, xp = transport.rank, transport.size, transport.xp
    transport.at("one-shot")
    kept = not xp.may_share_memory(out, mine)
    if kept:
        transport.keeps_own()
    inputs = transport.all_inputs(mine, counted=False,
                                  reads=own_blocks(bounds, rank, mine.itemsize))
    for step in range(1, size):
        dst, src = (rank + step) % size, (rank - step) % size
        transport.count(mine[slice(*bounds[dst])], dst, out, src)
    lo, hi = bounds[rank]
    blocks = [theirs[lo:hi] for theirs in inputs]
    if kept:
        blocks[rank] = mine[lo:hi]
    reduce_in_rank_order(xp, blocks, op, average, out=out)


def two_shot_reduce_scatter(transport: Transport, mine: Any, out: Any, op: ReduceOp,
                            average: bool, bounds: list[tuple[int, int]]) -> None:
    """Reduce-scatter the flat array `mine` (block r at bounds[r]) into this rank's flat block
    `out` (apart from `mine`) by the two-shot all-reduce's first pass (`reduce_own_chunk`);
    more than one rank, and the transport can keep N-1 blocks under way (`two_shot_fits`)."""
    reduce_own_chunk(transport, mine, out, bounds, op)
    if average:
        transport.xp.true_divide(out, transport.size, out=out)
