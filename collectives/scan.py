"""Scan (prefix reduction) by recursive doubling: rank r gets op over ranks 0..r.

Each rank keeps the reduction of a window of ranks that ends with itself; the window doubles
every step. In step k, with d = 2^k, rank r sends its window to rank r+d and receives the
window of rank r-d, which ends where its own begins, and reduces it in as it lands. After
ceil(log2 N) steps every window reaches rank 0. With 5 ranks, as "sent/received" (the rank a
window went to / came from; a test runs the code and checks this table):

    phase  step   rank 0   rank 1   rank 2   rank 3   rank 4
    scan   0      1/-      2/0      3/1      4/2      -/3
    scan   1      2/-      3/-      4/0      -/1      -/2
    scan   2      4/-      -        -        -        -/0

After step 0 rank r holds ranks r-1..r, after step 1 r-3..r, after step 2 all of 0..r. A rank
sends the window it held before the step while the one from below lands, so the windows
alternate between two buffers, ordered so that the last lands in the result.

Cost: rank r sends S bytes in each step where r + 2^k < N, ceil(log2(N-r)) times in all, and
receives S in each step where 2^k <= r, floor(log2 r) + 1 times. The exclusive scan
(op over 0..r-1) moves the same messages: it reduces what arrives into a result of its own,
and sends that result with its own input reduced in (in step 0 what lands is a copy, so every
message of that step is one; every later one is reduced). Rank 0's exclusive result is the op's
identity (0 for sum, 1 for prod, the largest value for min, the smallest for max).

Recursive doubling pays the per-message latency log2 N times, against N-1 for a chain that
passes the running reduction from rank to rank; a pipelined chain sends S only once per rank,
so for large buffers on many ranks it moves fewer bytes.

Small buffers take one exchange instead (`one_shot_scan`): every rank publishes its input,
and rank r reduces those of ranks 0..r itself, in rank order; one wait instead of log2 N.
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport

from .ops import reduce_in_rank_order, with_own
from .ops import identity


def recursive_doubling_scan(transport: Transport, mine: Any, out: Any, scratch: Any,
                            op: ReduceOp, exclusive: bool = False) -> None:
    """Scan the flat array `mine` into `out` (flat, the same size), with `scratch` (the same
    size) for the window in flight. `mine` is only read; rank 0's exclusive `out` is left for
    the caller to fill."""
    rank, size = transport.rank, transport.size
    distances = [1 << k for k in range((size - 1).bit_length())]  # 1, 2, 4, ... below size
    receives = sum(1 for d in distances if d <= rank)  # the steps in which this rank receives
    windows = [out, scratch] if receives % 2 else [scratch, out]  # the last lands in `out`
    held, taken = mine, 0  # the window this rank sends (ranks up to itself); windows taken
    for step, distance in enumerate(distances):
        dst = rank + distance if rank + distance < size else None
        src = rank - distance if rank >= distance else None
        if dst is None and src is None:
            continue
        transport.at("scan", step)
        outgoing = None if dst is None else held
        if not exclusive:
            landing = None if src is None else windows[taken % 2]
            transport.sendrecv_reduce(outgoing, dst, landing, src, op, inbuf=held)
            held = held if landing is None else landing
        elif step == 0:  # the first window to land is the exclusive result so far
            transport.sendrecv(outgoing, dst, None if src is None else out, src)
        else:  # what lands is reduced into `out`, which never includes this rank's own input
            transport.sendrecv_reduce(outgoing, dst, None if src is None else out, src, op)
        if exclusive and src is not None and rank + 2 * distance < size:
            held = op(out, mine, out=scratch)  # another send to come: the window it sends
        taken += src is not None
    if not exclusive and held is not out:
        out[...] = held  # only a rank that received nothing: rank 0, or a single rank


def one_shot_scan(transport: Transport, mine: Any, out: Any, op: ReduceOp,
                  exclusive: bool = False) -> None:
    """Scan the flat array `mine` into `out` (flat, the same size) in one exchange
    (`Transport.all_inputs`, which also carries the call's check); two or more ranks. Counted
    as what is read: rank r's input by each rank above it. `mine` may be `out`: it is
    published before `out` is written. Rank 0's exclusive `out` is left for the caller. The
    last rank's input no peer takes: it reduces its own where it lies (`Transport.unread`)."""
    rank, size = transport.rank, transport.size
    transport.at("one-shot")
    last = rank == size - 1
    if last:
        transport.unread()
    inputs = transport.all_inputs(mine, counted=False)
    if last:
        inputs = with_own(transport.xp, inputs, mine, rank, out)
    for peer in range(size):
        if peer > rank:
            transport.count(mine, peer, None, None)
        elif peer < rank:
            transport.count(None, None, out, peer)
    prefix(transport.xp, inputs, rank, op, exclusive, out)


def prefix(xp: Any, inputs: list[Any], rank: int, op: ReduceOp, exclusive: bool,
           out: Any) -> None:
    """out = op over `inputs` 0..rank (0..rank-1 when `exclusive`) in rank order, so every
    rank's result is the reduction of all_reduce.py's one-shot; nothing when that is none."""
    below = inputs[:rank if exclusive else rank + 1]
    if len(below) == 1:
        out[...] = below[0]
    elif below:
        reduce_in_rank_order(xp, below, op, False, out)


def finish(xp: Any, out: Any, op: str, rank: int, exclusive: bool) -> None:
    """What the scan's exchanges leave to do in `out`: rank 0's exclusive result is the op's
    identity, and "avg" divides the sum by the number of ranks reduced."""
    reduced = rank if exclusive else rank + 1
    if reduced == 0:
        out[...] = identity(op, out.dtype, xp)
    elif op == "avg":
        xp.true_divide(out, reduced, out=out)
