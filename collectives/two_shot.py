"""Two-shot all-reduce: the ring's two passes, each made in one step with every peer at once.

The buffer is cut into N chunks, as for the ring (all_reduce.py), and rank r owns chunk r.

1. Reduce-scatter. Rank r starts sending chunk p of its input to every other rank p
   (`Transport.isend`: all N-1 sends under way at once), then takes chunk r from each peer
   in turn, r+1, r+2, ... (mod N), reducing it into its own chunk as it arrives.
2. All-gather. Rank r writes its reduced chunk straight into every peer's buffer
   (`Transport.put`), where an exchange at the start of the call said each lies, then meets
   its peers at a barrier, after which every chunk has landed. Where the transport cannot
   reach its peers' memory (`Transport.one_sided`), it starts sending its reduced chunk to
   every peer instead, then takes each peer's reduced chunk into place.

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
allows that, and `auto_algorithm` picks it only where more than 2 ranks outnumber the cores,
for chunks of AUTO_CHUNK_BYTES or more (measured in docs/performance.md, "All-reduce where ranks
outnumber the cores").

Why written, not read: read by its peers, rank r's reduced chunk lies where it reduces into in
the next call, and a write into memory that a rank on another core read last waits for that
core's copy to be dropped, which costs several times the write where the cores do not share a
cache. Written, each chunk lands where only its writer writes. Measured on 4 ranks sharing 2
cores (docs/performance.md, "The two-shot's reduced chunks written into place"): 8 MiB took
3.6-4.1 ms against 6.7-7.0 read, 16 MiB 7.0-8.0 against 10.2-11.1, in the slower spells.

Every chunk is reduced on one rank, in the order r, r+1, ..., then copied: every rank ends
with bitwise the same result (not always the ring's bits: the order of the sum differs).

The first pass alone (`reduce_own_chunk`) is a reduce-scatter, which `auto` takes where it
would take the two-shot all-reduce (`two_shot_pays`; reduce_scatter.py).
"""

from __future__ import annotations

from typing import Any

import numpy

from transports.base import ReduceOp, Transport, buffer_address
from transports.errors import InvalidArgumentError

from .chunking import chunk_bounds

# `auto_algorithm` takes the two-shot all-reduce for chunks of at least this: measured on 4
# ranks of 2 cores, in one job alternating with the ring, chunks of 512 KiB took 1.15x the
# ring's time, 768 KiB about the same, 1 MiB 0.92x-0.97x, 2 MiB 0.82x-0.91x, 4 MiB 0.85x-0.92x.
AUTO_CHUNK_BYTES = 1 << 20


def two_shot_fits(transport: Transport, chunk_bytes: list[int]) -> bool:
    """Whether the transport lets each rank have its N-1 chunks (of these sizes, in bytes)
    under way at once, to receivers that reduce them."""
    return all(transport.sends_ahead(nbytes, reduced=True) >= transport.size - 1
               for nbytes in set(chunk_bytes) - {0})


def two_shot_pays(transport: Transport, chunk_bytes: list[int]) -> bool:
    """Whether `auto` takes the two-shot passes for chunks of these sizes (the all-reduce,
    and the reduce-scatter its first pass makes): on more than 2 ranks that outnumber the
    cores, every chunk of AUTO_CHUNK_BYTES or more, and the transport can keep N-1 of them
    under way. (Not whether a rank traces: ranks may differ in that, and must choose alike.)"""
    return (transport.size > 2 and transport.oversubscribed
            and min(chunk_bytes) >= AUTO_CHUNK_BYTES and two_shot_fits(transport, chunk_bytes))


def reduce_own_chunk(transport: Transport, mine: Any, out: Any, bounds: list[tuple[int, int]],
                     op: ReduceOp) -> None:
    """The first pass: start sending chunk p of the flat `mine` (at bounds[p]) to every peer
    p, then reduce this rank's own chunk of every peer's, in the order r+1, r+2, ..., into
    `out`; return once the peers have taken their chunks. `out` may be this rank's own chunk
    of `mine` (in place), which no peer reads."""
    rank, size = transport.rank, transport.size
    own = slice(*bounds[rank])
    peers = [(rank + step) % size for step in range(1, size)]
    transport.at("reduce-scatter")
    sent = [transport.isend(mine[slice(*bounds[peer])], peer) for peer in peers]
    for step, peer in enumerate(peers):
        transport.at("reduce-scatter", step)
        # The first reduction reads this rank's input where it lies; the later ones add to
        # what the earlier ones left in `out`.
        transport.sendrecv_reduce(None, None, out, peer, op,
                                  inbuf=mine[own] if step == 0 else out)
    for wait in sent:
        wait()


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
    bounds = chunk_bounds(work.size, size)
    if not two_shot_fits(transport, [(hi - lo) * work.itemsize for lo, hi in bounds]):
        raise InvalidArgumentError(
            f"the two-shot all-reduce needs {size - 1} sends under way at once, which the "
            f"{transport.name} transport cannot keep for chunks of {work.nbytes // size} "
            f"bytes; use algorithm='ring'")
    own = slice(*bounds[rank])
    peers = [(rank + step) % size for step in range(1, size)]
    # Where every rank's `work` lies (0: out of reach), for the second pass; the exchange
    # carries the call check along (the communicator's FOLDED).
    where = transport.xp.zeros(1, numpy.uint64)
    if transport.one_sided:
        where[0] = buffer_address(work)
    said = [int(word[0]) for word in transport.all_inputs(where, counted=False)]
    # (In place, the peers' chunks of `work` are read before we write them in the second:
    # each peer's chunk r is read by this rank alone, in its first pass.)
    reduce_own_chunk(transport, mine, work[own], bounds, op)
    if average:
        transport.xp.true_divide(work[own], size, out=work[own])
    if all(said):
        write_own_chunk(transport, work, bounds, said)
        return

    transport.at("all-gather")
    sent = [transport.isend(work[own], peer) for peer in peers]
    for step, peer in enumerate(peers):
        transport.at("all-gather", step)
        transport.recv(work[slice(*bounds[peer])], peer)
    for wait in sent:
        wait()


def write_own_chunk(transport: Transport, work: Any, bounds: list[tuple[int, int]],
                    said: list[int]) -> None:
    """The second pass one-sided: this rank's reduced chunk of `work` written into every
    peer's, which lies at the address the peer said (`said`), in the order r+1, r+2, ...; then
    the barrier, after which every peer's chunk has landed here too. Counted as the messages
    it replaces: the chunk sent to each peer, each peer's received (none where empty)."""
    rank, size = transport.rank, transport.size
    lo, hi = bounds[rank]
    own = work[lo:hi]
    for step in range(1, size if own.size else 1):
        peer = (rank + step) % size
        transport.at("all-gather", step - 1)
        transport.put(peer, said[peer] + lo * work.itemsize, own)
        transport.count(own, peer, None, None)
    transport.barrier()
    for step in range(1, size):
        peer = (rank + step) % size
        transport.at("all-gather", step - 1)
        theirs = work[slice(*bounds[peer])]
        if theirs.size:
            transport.count(None, None, theirs, peer)
