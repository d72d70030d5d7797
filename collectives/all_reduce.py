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
ones take the ring's two passes each in one step (two_shot.py). `auto_algorithm` picks.
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport

from .arrays import overlap
from .blocks import peers_inputs
from .chunking import chunk_bounds
from .ring import all_gather_pass, reduce_scatter_pass
from .two_shot import two_shot_pays


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


def with_own(xp: Any, inputs: list[Any], mine: Any, rank: int, out: Any | None) -> list[Any]:
    """The exchange's `inputs` with this rank's own, `mine`, in its place (the exchange need
    not hold it: `peers_inputs`). A copy of it where `out` overlaps it and the reduction
    would write `out` before reading it (`reduce_in_rank_order` reads inputs 0 and 1 first)."""
    inputs = list(inputs)
    inputs[rank] = mine if rank < 2 or out is None or not overlap(out, mine, xp) \
        else mine.copy()
    return inputs


def reduce_in_rank_order(xp: Any, inputs: list[Any], op: ReduceOp, average: bool,
                         out: Any | None = None) -> Any:
    """(((x0 op x1) op x2) ...) of two or more `inputs` into `out` (a new array when None),
    divided by their number when `average`: the same order on every rank, so the same bits.
    With `out` None, the op makes the array (a scalar for 0-d inputs)."""
    out = op(inputs[0], inputs[1]) if out is None else op(inputs[0], inputs[1], out=out)
    if len(inputs) > 2:  # (two is the common case, and a slice costs a small call)
        for later in inputs[2:]:
            op(out, later, out=out)
    if average:
        xp.true_divide(out, len(inputs), out=out)
    return out


def auto_algorithm(transport: Transport, count: int, itemsize: int) -> str:
    """What `algorithm="auto"` runs for `count` elements of `itemsize` bytes: "one_shot" up to
    `transport.one_shot_bytes` (at any size where `transport.one_shot_at_any_size`), else
    "hierarchical" on a transport that knows its nodes (transports/hierarchical.py: it has
    `across` nodes), "two_shot" on more than 2 ranks that outnumber the cores, for chunks of
    AUTO_CHUNK_BYTES or more that the transport can keep under way (two_shot.py), else
    "ring". The same on every rank: nothing here differs between ranks (not tracing)."""
    if count * itemsize <= transport.one_shot_bytes or transport.one_shot_at_any_size:
        return "one_shot"
    if transport.across is not None:
        return "hierarchical"
    if two_shot_pays(transport,
                     [(hi - lo) * itemsize for lo, hi in chunk_bounds(count, transport.size)]):
        return "two_shot"
    return "ring"
