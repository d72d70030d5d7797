"""Two-shot all-reduce: the ring's two passes, each made in one step with every peer at once.

The buffer is cut into N chunks, as for the ring (all_reduce.py), and rank r owns chunk r.

1. Reduce-scatter. Rank r starts sending chunk p of its input to every other rank p
   (`Transport.isend`: all N-1 sends under way at once), then takes chunk r from each peer
   in turn, r+1, r+2, ... (mod N), reducing it into its own chunk as it arrives.
2. All-gather. Rank r starts sending its reduced chunk to every peer, then takes each peer's
   reduced chunk into place.

For 3 ranks, per rank (each starts its sends, then receives in that order; a test runs the
code and checks this order):

    phase           rank 0          rank 1          rank 2
    reduce-scatter  sends 1, 2      sends 2, 0      sends 0, 1
                    takes 1, 2      takes 2, 0      takes 0, 1
    all-gather      the same peers, with the reduced chunks

Cost: the ring's bytes, 2(N-1) chunks of S/N sent and received by each rank, in 2 steps
instead of 2(N-1). What it saves is waiting. In the ring, rank r's step s needs rank r-1 to
have finished step s-1, which needed rank r-2, and so on round the ring; on ranks that
outnumber the cores a rank then often waits for one that is not running, while the ranks
that are running yield to each other. Here a rank's first pass needs only that its peers have
started the call, and its second that they have finished their first. It needs N-1 sends
under way before any receive (`Transport.sends_ahead`), so it runs where the transport
allows that, and `auto_algorithm` picks it only where ranks outnumber cores, for chunks of
AUTO_CHUNK_BYTES or more (measured in the README, "Measured: all-reduce").

Every chunk is reduced on one rank, in the order r, r+1, ..., then copied: every rank ends
with bitwise the same result (not always the ring's bits: the order of the sum differs).
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport
from transports.errors import InvalidArgumentError

from .chunking import chunk_bounds

# `auto_algorithm` takes the two-shot all-reduce for chunks of at least this: measured on 4
# ranks of 2 cores, in one job alternating with the ring, chunks of 512 KiB took 1.15x the
# ring's time, 768 KiB about the same, 1 MiB 0.92x-0.97x, 2 MiB 0.82x-0.91x, 4 MiB 0.85x-0.92x.
AUTO_CHUNK_BYTES = 1 << 20


def two_shot_fits(transport: Transport, count: int, itemsize: int) -> bool:
    """Whether the transport lets each rank have its N-1 chunks of `count` elements under
    way at once, to receivers that reduce them (every chunk size: they differ by at most one
    element)."""
    size = transport.size
    sizes = {(hi - lo) * itemsize for lo, hi in chunk_bounds(count, size)} - {0}
    return all(transport.sends_ahead(nbytes, reduced=True) >= size - 1 for nbytes in sizes)


def two_shot_all_reduce(transport: Transport, work: Any, op: ReduceOp, average: bool = False,
                        mine: Any | None = None) -> None:
    """All-reduce into the flat contiguous array `work` on every rank, the input `mine` (flat,
    same size) when given, else `work` itself (in place). Refused where the transport cannot
    keep N-1 sends under way (`two_shot_fits`): there ranks that all send first could wait
    on each other for ever."""
    size, rank = transport.size, transport.rank
    mine = work if mine is None else mine
    if size == 1:
        if mine is not work:
            work[...] = mine
        return
    if not two_shot_fits(transport, work.size, work.itemsize):
        raise InvalidArgumentError(
            f"the two-shot all-reduce needs {size - 1} sends under way at once, which the "
            f"{transport.name} transport cannot keep for chunks of {work.nbytes // size} "
            f"bytes; use algorithm='ring'")
    bounds = chunk_bounds(work.size, size)
    own = slice(*bounds[rank])
    peers = [(rank + step) % size for step in range(1, size)]

    transport.at("reduce-scatter")
    sent = [transport.isend(mine[slice(*bounds[peer])], peer) for peer in peers]
    for step, peer in enumerate(peers):
        transport.at("reduce-scatter", step)
        # The first reduction reads this rank's input where it lies; the later ones add to
        # what the earlier ones left in `work`.
        transport.sendrecv_reduce(None, None, work[own], peer, op,
                                  inbuf=mine[own] if step == 0 else work[own])
    for wait in sent:  # (in place, the peers' chunks of `work` are read before we write them)
        wait()
    if average:
        transport.xp.true_divide(work[own], size, out=work[own])

    transport.at("all-gather")
    sent = [transport.isend(work[own], peer) for peer in peers]
    for step, peer in enumerate(peers):
        transport.at("all-gather", step)
        transport.recv(work[slice(*bounds[peer])], peer)
    for wait in sent:
        wait()
