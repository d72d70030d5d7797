"""All-to-all by pairwise exchange: block j of rank i's buffer ends as block i of rank j's.

Each rank copies the block it keeps, then makes N-1 exchanges: in step s (from 0), rank r
sends its block for rank r+s+1 and receives rank r-s-1's block for it (mod N), both at once.
Each step every rank sends one message and receives one, so no rank waits on a busy one, and
every block travels once, straight to where it belongs. The schedule for 4 ranks, as "sent/received"
(block number sent / rank it came from; a test runs the code and checks this table):

    phase       step   rank 0   rank 1   rank 2   rank 3
    all-to-all  0      1/3      2/0      3/1      0/2
    all-to-all  1      2/2      3/3      0/0      1/1
    all-to-all  2      3/1      0/2      1/3      2/0

Cost: each rank sends and receives (N-1)/N S of a buffer of S bytes in N-1 steps, the least
possible; on a network where a message's latency dominates, Bruck's algorithm takes log2 N
steps by forwarding blocks, at log2 N / 2 times the bytes.

Where the transport lets a rank start sends before it receives (`Transport.sends_ahead`:
MPI's Isend, a message that fits a slot), each rank instead keeps up to that many of its
blocks under way and receives them in the same order: on ranks that outnumber cores, a rank
then takes the blocks of every peer that has run, instead of waiting for each in its step.
Each send is paired with a receive in the same step only in the plain form, which traced
calls keep, as the explainer pictures it.

Uneven blocks (`counts`, MPI's Alltoallv) follow the same schedule: `send_bounds[j]` is the
block for rank j, `recv_bounds[i]` the one from rank i.

Small equal blocks take one exchange instead (`one_shot_all_to_all`): each rank publishes its
whole buffer and takes its own block out of every other's. N-1 steps each wait for one peer;
on ranks that outnumber cores, each such wait may wait for the peer to be scheduled, so one
wait for all pays that once. Where the transport reads each block straight out of its owner's
memory into place (`Transport.reads_in_place`: shm, where direct reads work), equal blocks
of any size take it: each block then moves once, as in the pairwise exchange, with one wait.
"""

from __future__ import annotations

from typing import Any

from transports.base import Transport

from .arrays import overlap
from .blocks import own_blocks


def pairwise_all_to_all(transport: Transport, mine: Any, work: Any,
                        send_bounds: list[tuple[int, int]],
                        recv_bounds: list[tuple[int, int]]) -> None:
    """Send block j of the flat array `mine` (at send_bounds[j]) to rank j, and receive rank
    i's block for this rank into `work` (flat) at recv_bounds[i]. `mine` is only read."""
    rank, size = transport.rank, transport.size
    work[slice(*recv_bounds[rank])] = mine[slice(*send_bounds[rank])]
    blocks = [mine[slice(*bounds)] for bounds in send_bounds]
    ahead = min(size - 1, *(transport.sends_ahead(block.nbytes) for block in blocks))
    if ahead < 2 or transport.trace is not None:
        for step in range(size - 1):
            dst, src = (rank + 1 + step) % size, (rank - 1 - step) % size
            transport.at("all-to-all", step)
            transport.sendrecv(blocks[dst], dst, work[slice(*recv_bounds[src])], src)
        return
    # Where the transport lets sends run ahead, each rank keeps `ahead` of its blocks under
    # way: a rank receives from whichever peers have run, instead of meeting each in turn.
    sent = []

    def post(step: int) -> None:
        dst = (rank + 1 + step) % size
        transport.at("all-to-all", step)
        sent.append(transport.isend(blocks[dst], dst))

    for step in range(ahead):
        post(step)
    for step in range(size - 1):
        src = (rank - 1 - step) % size
        transport.at("all-to-all", step)
        transport.recv(work[slice(*recv_bounds[src])], src)
        if step + ahead < size - 1:
            post(step + ahead)
    for wait in sent:
        wait()


def one_shot_all_to_all(transport: Transport, mine: Any, work: Any,
                        bounds: list[tuple[int, int]]) -> None:
    """The all-to-all of equal blocks (at `bounds`) in one exchange (`Transport.all_inputs`,
    which also carries the call's check): block i of `work` is this rank's block of rank i's
    published `mine`. Counted as the pairwise exchange is: one block to and from each peer."""
    rank, size = transport.rank, transport.size
    transport.at("one-shot")
    reads = own_blocks(bounds, rank, mine.itemsize)
    if transport.reads_in_place(reads, mine.nbytes) and overlap(mine, work, transport.xp):
        mine = mine.copy()  # in place: peers read `mine` where it lies while blocks land
    transport.all_inputs(mine, counted=False, reads=reads, into=work)
    for step in range(1, size):
        dst, src = (rank + step) % size, (rank - step) % size
        transport.count(mine[slice(*bounds[dst])], dst, work[slice(*bounds[src])], src)
