"""Ring all-reduce: every rank ends with the reduction of every rank's buffer.

N ranks stand in a ring. Each one only talks to its neighbours: it sends to the right
(rank + 1) and receives from the left (rank - 1), at the same time.

        +-----> 1 -----+
        |              v
        0              2
        ^              |
        +----- 3 <-----+

The buffer is cut into N chunks (`chunk_bounds`: sizes differ by at most one element), and
the work is two passes of N-1 steps each.

1. Reduce-scatter. In step s, rank r sends chunk (r - s) and receives chunk (r - s - 1)
   (mod N), reducing what arrives into its own copy of that chunk. What it sends next is what
   it has just reduced, so each chunk travels once round the ring, picking up one rank's
   contribution per hop. After N-1 steps rank r holds chunk (r + 1) fully reduced.

2. All-gather. In step s, rank r sends chunk (r + 1 - s) and receives chunk (r - s),
   overwriting its copy: the finished chunks travel round the ring once more.

The schedule for 4 ranks, as "sent/received" chunk numbers (a test runs the code and checks
this table against what it does):

    phase           step   rank 0   rank 1   rank 2   rank 3
    reduce-scatter  0      0/3      1/0      2/1      3/2
    reduce-scatter  1      3/2      0/3      1/0      2/1
    reduce-scatter  2      2/1      3/2      0/3      1/0
    all-gather      0      1/0      2/1      3/2      0/3
    all-gather      1      0/3      1/0      2/1      3/2
    all-gather      2      3/2      0/3      1/0      2/1

Cost: each rank sends, and receives, 2(N-1) chunks of S/N bytes, that is 2(N-1)/N * S: less
than twice the message, however many ranks there are. With a per-message latency a and a
per-byte time b, T = 2(N-1) a + 2(N-1)/N S b. Every chunk is reduced on exactly one rank and
then copied, so every rank ends with bitwise the same result.

Large chunks stream through the transport in segments (`segment_bytes`), so scratch memory
stays bounded and a segment is reduced while the next one is on the wire. The last
reduce-scatter step and the first all-gather step are one call (`Transport.reduce_forward`):
the chunk a rank has just finished is the first it sends on. A transport that can write into
its neighbour's memory sends each piece on as soon as it is reduced, while it is still in
cache, as NCCL's ring does, instead of the neighbour reading the whole chunk back from memory
afterwards (shared memory, "Forwarded results").

Small messages take a shorter road (`one_shot_all_reduce`): the ring's 2(N-1) steps each pay
the latency a, while one-shot pays it about once. On ranks that outnumber the cores, large
ones take the ring's two passes each in one step: by messages (two_shot.py), or, for
middle-sized ones whose chunks a rank reads in place, in one exchange each
(`reduce_scatter_all_gather`). `auto_algorithm` picks.
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport

from .all_gather import one_shot_all_gather
from .blocks import peers_inputs
from .chunking import chunk_bounds
from .ops import reduce_in_rank_order, with_own
from .reduce_scatter import one_shot_reduce_scatter, read_in_one_exchange
from .ring import all_gather_pass, reduce_scatter_pass
from .two_shot import two_shot_pays

# `auto_algorithm` takes `reduce_scatter_all_gather` on 4 ranks or more that outnumber the
# cores, where each rank's chunk, read in place, is at most this. Measured on 2 cores,
# float32, the ring's time / this one's in one job (`--algorithms`; docs/performance.md, "Two
# exchanges for a middle-sized all-reduce on shared cores"): on 4 ranks 1.07x-1.21x at 1 MiB
# (256 KiB chunks), 0.86x-1.16x at 2 MiB, 0.98x-1.48x at 3 MiB (768 KiB chunks); on 6 ranks
# 1.27x-1.46x at 1.5 MiB, 1.07x-1.19x at 3 MiB. Not on 3 ranks, whose ring steps wait less:
# 0.69x-1.09x at 768 KiB, 0.81x-1.14x at 1.1 MiB, 0.74x-1.30x at 1.5 MiB.
EXCHANGED_CHUNK_BYTES = 512 << 10


def ring_all_reduce(transport: Transport, work: Any, op: ReduceOp, average: bool = False,
                    mine: Any | None = None) -> None:
    """All-reduce into the flat contiguous array `work` on every rank.

    The input is `mine` (flat, same size) when given, else `work` itself (in place). Reading
    `mine` where it lies saves copying it into `work` first.
    """
    size = transport.size
    if size == 1:
        if mine is not None:
            work[...] = mine
        return
    bounds = chunk_bounds(work.size, size)
    # The last reduce-scatter step also makes the all-gather's first: the chunk a rank has
    # just reduced (divided by N for an average) is the one it sends first.
    reduce_scatter_pass(transport, work, bounds, op, first=0, mine=mine,
                        forward=size if average else 1)
    all_gather_pass(transport, work, bounds, first=1, start=1)


def one_shot_all_reduce(transport: Transport, work: Any, op: ReduceOp,
                        average: bool = False, mine: Any | None = None) -> None:
    """All-reduce by reading every rank's input at once: one exchange instead of 2(N-1) steps.

    Each rank publishes its buffer and reduces all N inputs itself, always in rank order
    (((x0 op x1) op x2) ...), so every rank computes bitwise the same result. It moves N-1
    times the message into each rank, so it pays only while latency dominates (or where,
    as on one shared GPU, every exchange costs more than moving the bytes).
    """
    size = transport.size
    mine = work if mine is None else mine
    if size == 1 or work.size == 0:
        if mine is not work:
            work[...] = mine
        return
    transport.at("one-shot")
    # Larger inputs go a piece of `one_shot_bytes` at a time, each piece one exchange: the
    # pieces fit where the transport publishes inputs (its one-shot areas).
    step = transport.one_shot_bytes // work.itemsize
    if step <= 0 or work.size <= step:
        step = work.size
    for lo in range(0, work.size, step):
        # The first exchange also checks the call, when the caller asked for it.
        piece, out = mine[lo:lo + step], work[lo:lo + step]
        inputs = transport.all_inputs(piece, reads=peers_inputs(piece.nbytes, transport.rank,
                                                                  size))
        reduce_in_rank_order(transport.xp, with_own(transport.xp, inputs, piece, transport.rank,
                                                    out), op, average, out=out)


def reduce_scatter_all_gather(transport: Transport, work: Any, op: ReduceOp,
                              average: bool = False, mine: Any | None = None) -> None:
    """All-reduce as the ring's two passes, each made in one exchange (MPICH names it
    reduce_scatter_allgather): a reduce-scatter in which rank r reads chunk r of every peer's
    input where it lies and reduces it in rank order, then an all-gather in which each rank
    reads every peer's reduced chunk (`one_shot_reduce_scatter`, `one_shot_all_gather`).

    The ring's bytes, 2(N-1) chunks of S/N in and out of each rank, in 2 exchanges instead of
    2(N-1) steps. Where ranks outnumber the cores, each of the ring's steps waits for a
    neighbour that may not be running, while an exchange needs only that every rank has come
    (two_shot.py says the same of its passes made by messages, which pay from larger chunks).
    Each chunk is reduced on one rank, in rank order, then copied: every rank ends with
    bitwise the same result. Chunks that differ in size (the count does not divide by N) take
    the ring's passes instead: the ranks of an exchange take alike of each input, and so read
    it the same way (each rank's chunk, of another size, could be read in place on one rank and
    not on another, `Transport.reads_in_place`)."""
    size, rank = transport.size, transport.rank
    if work.size % size:
        ring_all_reduce(transport, work, op, average, mine)
        return
    mine = work if mine is None else mine
    if size == 1 or work.size == 0:
        if mine is not work:
            work[...] = mine
        return
    bounds = chunk_bounds(work.size, size)
    out = work[slice(*bounds[rank])]
    # (In place, peers read their chunks of `work` before we write theirs: the exchange
    # returns once every peer has read what it takes of ours.)
    one_shot_reduce_scatter(transport, mine, op, average, bounds, out)
    one_shot_all_gather(transport, out, work, bounds)


def exchanged_passes_pay(transport: Transport, count: int, itemsize: int) -> bool:
    """Whether `auto` takes `reduce_scatter_all_gather` for `count` elements: on 4 ranks or
    more, equal chunks of at most EXCHANGED_CHUNK_BYTES that a reduce-scatter reads in one
    exchange (`read_in_one_exchange`: ranks that outnumber the cores, each chunk read in
    place). The same on every rank."""
    size = transport.size
    return (size > 3 and count % size == 0 and count // size * itemsize <= EXCHANGED_CHUNK_BYTES
            and read_in_one_exchange(transport, count * itemsize))


def auto_algorithm(transport: Transport, count: int, itemsize: int) -> str:
    """What `algorithm="auto"` runs for `count` elements of `itemsize` bytes: "one_shot" up to
    `transport.one_shot_bytes` (at any size where `transport.one_shot_at_any_size`), else
    "hierarchical" on a transport that knows its nodes (transports/hierarchical.py: it has
    `across` nodes), "two_shot" on more than 2 ranks that outnumber the cores, for chunks of
    AUTO_CHUNK_BYTES or more that the transport can keep under way (two_shot.py),
    "reduce_scatter_all_gather" on 4 or more such ranks for equal chunks read in place of up
    to EXCHANGED_CHUNK_BYTES (`exchanged_passes_pay`), else "ring". The same on every rank:
    nothing here differs between ranks (not tracing)."""
    if count * itemsize <= transport.one_shot_bytes or transport.one_shot_at_any_size:
        return "one_shot"
    if transport.across is not None:
        return "hierarchical"
    if two_shot_pays(transport,
                     [(hi - lo) * itemsize for lo, hi in chunk_bounds(count, transport.size)]):
        return "two_shot"
    if exchanged_passes_pay(transport, count, itemsize):
        return "reduce_scatter_all_gather"
    return "ring"
