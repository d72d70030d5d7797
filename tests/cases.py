"""Test bodies that run on every rank, and the NumPy references they are checked against.

Each `*_case(comm, **example)` runs one collective on data that depends on rank and index and
returns what this rank ended with. The same bodies run on thread ranks (`collectives.spawn`)
and on real `mpiexec` ranks (the worker pool in `pool.py`); `check_*` then compares the list of
per-rank results with a NumPy reference, exactly for integers and bools, within a tight
tolerance for floats (the ring adds in another order than NumPy does).
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from pathlib import Path
from typing import Any

import numpy

from collectives import small
from collectives.small import PLACED_BYTES
from transports.errors import MismatchError
from transports.slots import IN_PLACE, INLINE, pair_area_bytes

DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
LAYOUTS = ("flat", "matrix", "strided")
UFUNCS = {"sum": numpy.add, "prod": numpy.multiply, "min": numpy.minimum,
          "max": numpy.maximum, "avg": numpy.add}
RTOL = {"float16": 5e-3, "float32": 1e-6, "float64": 1e-14, "complex64": 1e-6,
        "complex128": 1e-14}


def ops_for(dtype: str) -> tuple[str, ...]:
    """The ops a dtype supports."""
    kind = numpy.dtype(dtype).kind
    return {"b": ("min", "max"), "i": ("sum", "prod", "min", "max"),
            "u": ("sum", "prod", "min", "max"), "f": ("sum", "prod", "min", "max", "avg"),
            "c": ("sum", "prod", "avg")}[kind]


def values(seed: int, count: int, dtype: str) -> numpy.ndarray:
    """`count` values that depend on `seed` (a rank) and on the index: never all alike.

    Floats are multiples of 1/8 in [-1.375, 1.375], so sums are exact in every float type and
    products of six stay far from overflow.
    """
    i = numpy.arange(count, dtype=numpy.int64)
    pattern = (i * 31 + seed * 17 + 5) % 23
    kind = numpy.dtype(dtype).kind
    if kind == "b":
        return pattern % 3 == 0
    if kind == "u":
        return pattern.astype(dtype)
    if kind == "i":
        return (pattern - 11).astype(dtype)
    real = (pattern - 11) / 8
    if kind == "c":
        return (real + 1j * ((i * 7 + seed * 3) % 13 - 6) / 8).astype(dtype)
    return real.astype(dtype)


def laid_out(flat: numpy.ndarray, layout: str) -> numpy.ndarray:
    """The same values as a flat array, a 2-D array, or a non-contiguous view."""
    if layout == "flat":
        return flat.copy()
    if layout == "matrix":
        return flat.copy().reshape(1, -1) if flat.size % 2 else flat.copy().reshape(2, -1)
    spread = numpy.zeros(2 * flat.size, flat.dtype)
    spread[::2] = flat
    return spread[::2]  # every other element: not contiguous


# ---- bodies run on each rank --------------------------------------------------------------

def all_reduce_case(comm: Any, count: int, dtype: str, op: str, layout: str,
                    in_place: bool, algorithm: str = "auto") -> dict:
    mine = laid_out(values(comm.rank, count, dtype), layout)
    before = mine.copy()
    if in_place:
        out = comm.all_reduce(mine, mine, op=op, algorithm=algorithm)
        assert out is mine
    else:
        out = comm.all_reduce(mine, op=op, algorithm=algorithm)
        assert numpy.array_equal(mine, before), "all_reduce changed its sendbuf"
    assert out.shape == mine.shape and out.dtype == mine.dtype
    return {"result": numpy.ascontiguousarray(out), "stats": vars(comm.stats).copy()}


def all_gather_case(comm: Any, count: int, dtype: str, layout: str, given: bool) -> dict:
    mine = laid_out(values(comm.rank, count, dtype), layout)
    recvbuf = numpy.empty((comm.size, *mine.shape), mine.dtype) if given else None
    out = comm.all_gather(mine, recvbuf)
    assert recvbuf is None or out is recvbuf
    return {"result": out, "stats": vars(comm.stats).copy()}


def broadcast_case(comm: Any, count: int, dtype: str, layout: str, root: int) -> dict:
    buf = laid_out(values(comm.rank, count, dtype), layout)
    out = comm.broadcast(buf, root=root)
    assert out is buf
    return {"result": numpy.ascontiguousarray(buf), "stats": vars(comm.stats).copy(),
            "phase": ended_in(comm)}


def scatter_case(comm: Any, count: int, dtype: str, root: int, given: bool) -> dict:
    sendbuf = None
    if comm.rank == root:
        sendbuf = values(100 + root, comm.size * count, dtype).reshape(comm.size, count)
    recvbuf = numpy.empty(count, dtype) if given or comm.rank == root else None
    out = comm.scatter(sendbuf, recvbuf, root=root)
    assert recvbuf is None or out is recvbuf
    return {"result": out}


def ended_in(comm: Any) -> str | None:
    """The phase the call's algorithm ended in ("one-shot" for one exchange), as the
    transport shows it; None where there is no transport to ask (the GPU driver's wrapper)."""
    return getattr(getattr(comm, "_transport", None), "phase", None)


def reduce_scatter_case(comm: Any, count: int, dtype: str, op: str) -> dict:
    sendbuf = values(comm.rank, comm.size * count, dtype).reshape(comm.size, count)
    before = sendbuf.copy()
    out = comm.reduce_scatter(sendbuf, op=op)
    assert numpy.array_equal(sendbuf, before), "reduce_scatter changed its sendbuf"
    return {"result": out, "stats": vars(comm.stats).copy(), "phase": ended_in(comm)}


def gather_case(comm: Any, count: int, dtype: str, layout: str, root: int,
                recv: str) -> dict:
    """recv: "none" (the root's result allocated), "given", "in place" (the root passes its
    own block of recvbuf as sendbuf), or "another block" (the root's sendbuf is the block of
    recvbuf where a peer's lands: then by the general path too, as "general")."""
    out = {}
    for general in (False, True) if recv == "another block" else (False,):
        mine = laid_out(values(comm.rank, count, dtype), layout)
        recvbuf = None
        if comm.rank == root and recv != "none":
            recvbuf = numpy.zeros((comm.size, *mine.shape), mine.dtype)
            if recv in ("in place", "another block"):
                block = root if recv == "in place" else (root + 1) % comm.size
                recvbuf[block] = mine
                mine = recvbuf[block]
        got = (comm._gather if general else comm.gather)(mine, recvbuf, root=root)
        assert (got is None) == (comm.rank != root) and (recvbuf is None or got is recvbuf)
        out["general" if general else "result"] = got
    return {**out, "stats": vars(comm.stats).copy(), "phase": ended_in(comm)}


def reduce_case(comm: Any, count: int, dtype: str, op: str, layout: str, root: int,
                in_place: bool) -> dict:
    mine = laid_out(values(comm.rank, count, dtype), layout)
    before = mine.copy()
    if in_place and comm.rank == root:
        out = comm.reduce(mine, mine, op=op, root=root)
        assert out is mine
    else:
        out = comm.reduce(mine, op=op, root=root)
        assert numpy.array_equal(mine, before), "reduce changed its sendbuf"
    assert (out is None) == (comm.rank != root)
    return {"result": None if out is None else numpy.ascontiguousarray(out),
            "stats": vars(comm.stats).copy(), "phase": ended_in(comm)}


def blocks_laid_out(flat: numpy.ndarray, size: int, layout: str) -> numpy.ndarray:
    """`flat` as `size` blocks, shape (size, block): contiguous, or a non-contiguous view."""
    blocks = flat.reshape(size, -1)
    if layout != "strided":
        return blocks.copy()
    spread = numpy.zeros((size, 2 * blocks.shape[1]), flat.dtype)
    spread[:, ::2] = blocks
    return spread[:, ::2]


def all_to_all_case(comm: Any, count: int, dtype: str, layout: str, in_place: bool) -> dict:
    mine = blocks_laid_out(values(comm.rank, comm.size * count, dtype), comm.size, layout)
    before = mine.copy()
    out = comm.all_to_all(mine, mine if in_place else None)
    assert out is mine if in_place else numpy.array_equal(mine, before)
    return {"result": numpy.ascontiguousarray(out), "stats": vars(comm.stats).copy(),
            "phase": ended_in(comm)}


def scan_case(comm: Any, count: int, dtype: str, op: str, layout: str, in_place: bool,
              exclusive: bool) -> dict:
    mine = laid_out(values(comm.rank, count, dtype), layout)
    before = mine.copy()
    if in_place:
        out = comm.scan(mine, mine, op=op, exclusive=exclusive)
        assert out is mine
    else:
        out = comm.scan(mine, op=op, exclusive=exclusive)
        assert numpy.array_equal(mine, before), "scan changed its sendbuf"
    assert out.shape == mine.shape and out.dtype == mine.dtype
    return {"result": numpy.ascontiguousarray(out), "stats": vars(comm.stats).copy()}


def uneven_input(collective: str, rank: int, counts: list, dtype: str,
                 root: int) -> numpy.ndarray | None:
    """Rank `rank`'s sendbuf in `uneven_case`: its block, the root's blocks, or its row."""
    if collective in ("all_gather", "gather"):
        return values(rank, counts[rank], dtype)
    if collective == "scatter":
        return values(100 + root, sum(counts), dtype) if rank == root else None
    if collective == "reduce_scatter":
        return values(rank, sum(counts), dtype)
    return values(rank, sum(row_of(counts, rank)), dtype)


def row_of(counts: list, rank: int) -> list[int]:
    """What rank `rank` sends to each rank in an all-to-all by `counts`: its row of a matrix,
    or the numbers that stand for every row."""
    return counts[rank] if isinstance(counts[0], (list, tuple)) else counts


def uneven_case(comm: Any, collective: str, counts: list, dtype: str, op: str,
                root: int) -> dict:
    """One collective with uneven blocks (`counts=`)."""
    mine = uneven_input(collective, comm.rank, counts, dtype, root)
    call = getattr(comm, collective)
    if collective in ("gather", "scatter"):
        out = call(mine, root=root, counts=counts)
    elif collective == "reduce_scatter":
        out = call(mine, op=op, counts=counts)
    else:
        out = call(mine, counts=counts)
    return {"result": out, "stats": vars(comm.stats).copy()}


def sendrecv_case(comm: Any, count: int, dtype: str, layout: str, shift: int) -> dict:
    """Every rank sends to rank + shift and receives from rank - shift (a ring shift)."""
    mine = laid_out(values(comm.rank, count, dtype), layout)
    recvbuf = laid_out(numpy.zeros(count, dtype), layout)
    out = comm.sendrecv(mine, (comm.rank + shift) % comm.size, recvbuf,
                        (comm.rank - shift) % comm.size)
    assert out is recvbuf
    return {"result": numpy.ascontiguousarray(out), "stats": vars(comm.stats).copy()}


def chain_case(comm: Any, count: int, dtype: str) -> dict:
    """A pipeline of sends and receives: rank r receives the running total from rank r-1,
    adds its own values and sends it on; the last rank ends with the total."""
    total = values(comm.rank, count, dtype)
    if comm.rank > 0:
        before = numpy.empty(count, dtype)
        assert comm.recv(before, comm.rank - 1) is before
        total = before + total
    if comm.rank < comm.size - 1:
        comm.send(total, comm.rank + 1)
    return {"result": total, "stats": vars(comm.stats).copy()}


def mismatch_case(comm: Any, what: str) -> dict:
    """Ranks 0 and 1 disagree about a call (`what`: "count", "dtype", "both send", "both
    receive", or "counts" for an all-gather on every rank); every rank returns what it raised,
    then the result of a sendrecv ring shift made afterwards."""
    rank = comm.rank
    message = None
    try:
        if what == "counts":
            counts = [2] * comm.size if rank else [1, 3] + [2] * (comm.size - 2)
            comm.all_gather(values(rank, counts[rank], "float64"), counts=counts)
        elif rank < 2:
            buf = values(0, 4, "float64") if rank == 0 else numpy.zeros(
                5 if what == "count" else 4, "float32" if what == "dtype" else "float64")
            if what == "both send" or (rank == 0 and what != "both receive"):
                comm.send(buf, 1 - rank)
            else:
                comm.recv(buf, 1 - rank)
    except Exception as error:  # noqa: BLE001 - what every rank raised is the result
        message = f"{type(error).__name__}: {error}"
    after = comm.sendrecv(values(rank, 3, "int32"), (rank + 1) % comm.size,
                          src=(rank - 1) % comm.size)
    return {"result": message, "after": after, "stats": vars(comm.stats).copy()}


def mixed_paths_case(comm: Any, extra: int = 0) -> dict:
    """Pairs of sendrecv, then a send and its recv each way, between ranks 0 and 1 where one
    rank traces (the general path) and the other does not (the lane, and a transport's
    shortest way for a pair), then where neither does: they must meet as they do on one
    path, agreeing, and disagreeing. Every message has `extra` elements more (past the
    largest packet of a step on mpi, its data move apart from its words). Returns what each
    rank received, its stats, and the messages the transport readied steps for (small.py,
    `_step_message`)."""
    rank, got = comm.rank, []
    if rank > 1:
        return {"got": got, "stats": vars(comm.stats).copy()}
    peer = 1 - rank
    for trial in range(6):
        traced = trial < 4 and rank == trial % 2
        with comm.trace() if traced else contextlib.nullcontext():
            got.append(comm.sendrecv(values(rank + trial, 5 + extra, "float64"),
                                     peer).tolist())
            try:
                comm.sendrecv(numpy.ones(3 + rank + extra), peer,
                              numpy.empty(3 + rank + extra))
            except Exception as error:  # noqa: BLE001 - what the rank raised is the result
                got.append(type(error).__name__)
            for sender in (0, 1):
                if rank == sender:
                    comm.send(values(rank + trial, 4 + extra, "float64"), peer)
                else:
                    got.append(comm.recv(numpy.empty(4 + extra), peer).tolist())
            try:
                if rank == 0:
                    comm.send(numpy.ones(2 + extra), peer)
                else:
                    comm.recv(numpy.empty(3 + extra), peer)
            except Exception as error:  # noqa: BLE001 - what the rank raised is the result
                got.append(type(error).__name__)
    stepped = sorted({key[0] for key, kind in comm._small_calls.items()
                      if key[0] in ("send", "recv", "sendrecv") and kind is not None
                      and next(part for part in key if type(part) is tuple)[0] > extra})
    # (the sizes: a pool's ranks keep the kinds of earlier cases)
    return {"got": got, "stats": vars(comm.stats).copy(), "stepped": stepped,
            "transport": comm.transport}


def pair_areas_case(comm: Any) -> dict:
    """Sendrecvs between ranks 0 and 1 of 8 B, a pair area (`pair_area_bytes` on shm) and a
    pair area + 8 B each way, then sends from rank 0 to rank 1 of 8 B, the most one way goes
    through a pair area (also a segment at most) and 8 B more, noting the sizes of those that
    went through the pair areas (one way: negative; None on a transport without them);
    returns what each rank received, the sizes, the transport's name and that most."""
    rank, got = comm.rank, []
    if rank > 1:
        return {"got": got, "through_areas": None, "transport": comm.transport}
    transport, taken = comm._transport, []
    areas = getattr(transport, "_pair_out", None) is not None
    area = pair_area_bytes(comm.size) // 8
    for count in (1, area, area + 1):
        got.append(comm.sendrecv(values(rank, count, "float64"), 1 - rank).tolist())
        if areas and _last_mark(transport, 1 - rank) & INLINE:
            taken.append(8 * count)
    # One way, from rank 0 to rank 1: through the areas up to a segment too.
    one_way = min(area, getattr(transport, "_one_segment_bytes", 0) // 8)
    for count in (1, one_way, one_way + 1):
        if rank == 0:
            comm.send(values(rank, count, "float64"), 1)
        else:
            got.append(comm.recv(numpy.empty(count), 0).tolist())
        if areas and _last_mark(transport, 1 - rank) & INLINE:
            taken.append(-8 * count)
    return {"got": got, "through_areas": taken if areas else None, "transport": comm.transport,
            "one_way": one_way}


def _last_mark(transport: Any, peer: int) -> int:
    """The marks (slots.py's INLINE, IN_PLACE) of the last words this rank wrote in its pair
    lines to `peer`: where its last message with `peer` lay for the peer to take."""
    line = transport._pair_words(peer, transport._pairs[peer])
    return transport._own[line + 1] & (INLINE | IN_PLACE)


def pair_in_place_case(comm: Any) -> dict:
    """Sendrecvs between ranks 0 and 1 with their messages read in place wherever they can be
    (shm with direct reads: `pairs_read_from` lowered to a byte, on ranks that share cores
    too): of 1, 512 and 1 << 15 float64; two where rank 1 takes the general way (the peer
    meets it there), of one segment and of several; one where rank 0 sends an element too
    many (both raise); then one more. Returns what each rank received or raised, and how
    many messages went in place (None: not shm, or no direct reads)."""
    rank, got = comm.rank, []
    transport = comm._transport
    if rank > 1:
        return {"got": got, "in_place": None}
    can_read = getattr(transport, "single_copy", False)
    reads_from, marks = getattr(transport, "pairs_read_from", None), []

    def mark() -> None:
        if can_read:
            marks.append(_last_mark(transport, 1 - rank))
    if can_read:
        transport.pairs_read_from = 1
    try:
        for count in (1, 512, 1 << 15):
            got.append(comm.sendrecv(values(rank, count, "float64"), 1 - rank).tolist())
            mark()
        for count in (100, (1 << 16) + 3):  # (in one segment, and in several)
            mine, into = values(rank, count, "float64"), numpy.zeros(count)
            if rank == 1:
                comm._sendrecv(mine, 0, into, 0)  # the general way
            else:
                comm.sendrecv(mine, 1, into)
            got.append(into.tolist())
            mark()
        try:
            comm.sendrecv(values(rank, 7 + (rank == 0), "float64"), 1 - rank, numpy.zeros(7))
            got.append("no error")
        except MismatchError as error:
            got.append(type(error).__name__)
        mark()
        got.append(comm.sendrecv(values(rank, 9, "float64"), 1 - rank).tolist())
        mark()
    finally:
        if can_read:
            transport.pairs_read_from = reads_from
    return {"got": got, "in_place": marks.count(IN_PLACE) if can_read else None}


def ring_mismatch_case(comm: Any, count: int) -> dict:
    """A ring shift by sendrecv, twice: in the first, rank 0 sends one element more than rank
    1 expects. Each rank returns, per round, what it raised or what it received, and whether
    the second took a step readied for a sendrecv with two peers (small.py, `_ring_message`)."""
    rank, size = comm.rank, comm.size
    comm._small_calls.clear()  # (the pool's communicator has made such calls before)
    rounds = []
    for shift in range(2):
        mine = values(rank + 10 * shift, count + (shift == 0 and rank == 0), "float64")
        into = numpy.full(count, -1.0)
        try:
            comm.sendrecv(mine, (rank + 1) % size, into, (rank - 1) % size)
            rounds.append(into)
        except Exception as error:  # noqa: BLE001 - what every rank raised is the result
            rounds.append(f"{type(error).__name__}: {error}")
    key = ("sendrecv", (rank + 1) % size, (rank - 1) % size, numpy.dtype("float64"),
           (count,), numpy.dtype("float64"), (count,))
    return {"result": rounds, "stepped": comm._small_calls.get(key) is not None,
            "transport": comm.transport,
            "reads_from": getattr(comm._transport, "pairs_read_from", None)}


def mixed_ring_case(comm: Any, in_place: bool = False) -> dict:
    """Ring shifts by sendrecv where one rank in turn traces (the general path) and the others
    do not (a step readied for two peers, on shm), then where none does: what each received,
    and how many of this rank's untraced shifts left its message in place. `in_place`: on shm
    with direct reads, each half of the step is read in place (`pairs_read_from` lowered to a
    byte); the peer on the general path meets it there."""
    rank, size, got = comm.rank, comm.size, []
    transport = comm._transport
    reads_from = getattr(transport, "pairs_read_from", None)
    lowered = in_place and getattr(transport, "single_copy", False)
    marks = []
    if lowered:
        transport.pairs_read_from = 1
        comm._small_calls.clear()  # (steps readied before were readied for the old size)
    try:
        for trial in range(size + 1):
            traced = trial < size and rank == trial
            with comm.trace() if traced else contextlib.nullcontext():
                got.append(comm.sendrecv(values(rank + trial, 5, "float64"), (rank + 1) % size,
                                         src=(rank - 1) % size).tolist())
            if lowered and not traced:
                marks.append(_last_mark(transport, (rank + 1) % size))
    finally:
        if lowered:
            transport.pairs_read_from = reads_from
            comm._small_calls.clear()
    return {"got": got, "stats": vars(comm.stats).copy(),
            "in_place": marks.count(IN_PLACE) if lowered else None}


def pipeline_case(comm: Any, count: int, traced: int | None = None,
                  reverse: bool = False) -> dict:
    """A sendrecv with two peers among ranks that each receive and send alone: rank 0 sends to
    rank 1 and receives from the last rank, while each other rank receives from the one before
    it and then sends to the one after (`reverse`: rank 1 receives from the last rank, then
    from rank 0, and the last rank sends to rank 0, then to rank 1). A valid MPI program in
    which rank 0 must finish its send first (its recv's message comes only once its send has
    gone round), or, reversed, its recv first. Rank `traced` traces (the general path). What
    each rank received, in order. (The waits are cut to 60 s: a deadlock fails the test.)"""
    rank, size = comm.rank, comm.size
    last, mine = size - 1, values(rank, count, "float64")
    transport, got = comm._transport, []
    timeout, transport.timeout = transport.timeout, 60.0
    try:
        with comm.trace() if rank == traced else contextlib.nullcontext():
            if rank == 0:
                got.append(comm.sendrecv(mine, 1, src=last).tolist())
            elif reverse and rank == 1:
                got += [comm.recv(numpy.empty(count), last).tolist(),
                        comm.recv(numpy.empty(count), 0).tolist()]
            elif reverse and rank == last:
                comm.send(mine, 0)
                comm.send(mine, 1)
            else:
                got.append(comm.recv(numpy.empty(count), rank - 1).tolist())
                comm.send(mine, (rank + 1) % size)
    finally:
        transport.timeout = timeout
    return {"got": got}


def half_differs_case(comm: Any, first: str) -> dict:
    """On 3 ranks, rank 0's sendrecv (to rank 1, from rank 2, into a strided recvbuf: the
    general path) whose other pair differs in count, the agreeing half's peer coming first
    (`first`: "send", rank 1 receives at once and rank 2 later sends one element more;
    "recv", rank 2 sends at once and rank 1 later receives one element more). What each
    rank raised or received (rank 0: both), then a ring shift made afterwards."""
    rank, size, count = comm.rank, comm.size, 5
    late = 0.3  # seconds: the other pair comes after `two_peers` has stopped waiting for it
    raised, got = None, None
    try:
        if rank == 0:
            got = numpy.zeros(2 * count)[::2]
            comm.sendrecv(values(0, count, "float64"), 1, got, 2)
        elif rank == 1:
            time.sleep(late if first == "recv" else 0)
            got = comm.recv(numpy.zeros(count + (first == "recv")), 0)
        else:
            time.sleep(late if first == "send" else 0)
            comm.send(values(2, count + (first == "send"), "float64"), 0)
    except MismatchError as error:
        raised = str(error)
    after = comm.sendrecv(values(rank, 3, "int32"), (rank + 1) % size, src=(rank - 1) % size)
    return {"raised": raised, "got": None if got is None else got.tolist(),
            "after": after.tolist()}


def crowded_pair_roads_case(comm: Any) -> dict:
    """Sendrecvs of 128 KiB with one peer as where ranks share cores (no `roads`; pairs read in
    place only from above a pair area): what each received, and how many kinds of message
    measured their road (`pair_roads`: none should, timings there measure the scheduler)."""
    transport, peer = comm._transport, comm.rank ^ 1
    roads = transport.roads
    transport.roads = None
    transport.pair_roads.clear()
    comm._small_calls.clear()  # (steps readied before were readied with the roads)
    try:
        got = [comm.sendrecv(values(comm.rank + trial, 1 << 14, "float64"), peer).tolist()
               for trial in range(10)]
        measured = len(transport.pair_roads)
    finally:
        transport.roads = roads
        comm._small_calls.clear()
    return {"got": got, "measured": measured}


def messages_of_many_sizes_case(comm: Any, sizes: int) -> dict:
    """Three rounds of sendrecvs, ring shifts, and sends with their recvs, of 1 to `sizes`
    elements: more kinds than a transport keeps packets for (mpi.py's KEPT_SIZES), each
    readied step taken again once its packet has gone. What each rank received, in order."""
    rank, size, got = comm.rank, comm.size, []
    for _ in range(3):
        for count in range(1, sizes + 1):
            got.append(comm.sendrecv(values(rank, count, "float64"), rank ^ 1 if rank ^ 1 < size
                                     else rank).tolist())
            got.append(comm.sendrecv(values(rank, count, "float64"), (rank + 1) % size,
                                     src=(rank - 1) % size).tolist())
            if rank < 2 and size > 1:
                if rank == 0:
                    comm.send(values(rank, count, "float64"), 1)
                else:
                    got.append(comm.recv(numpy.empty(count), 0).tolist())
    return {"got": got}


def collective_met_case(comm: Any, collective: str, count: int = 3) -> dict:
    """On 2 ranks, rank 0 makes a collective call (`collective`: "barrier", "all_reduce", or
    "large all_reduce", past the one-shot) while rank 1 receives `count` float64 from it;
    each returns what it raised, then the results of a barrier, an all-reduce and a sendrecv
    made afterwards."""
    message = None
    try:
        if comm.rank == 1:
            comm.recv(numpy.zeros(count), 0)
        elif collective == "barrier":
            comm.barrier()
        else:
            comm.all_reduce(numpy.ones(3 if collective == "all_reduce" else 1 << 18))
    except Exception as error:  # noqa: BLE001 - what every rank raised is the result
        message = f"{type(error).__name__}: {error}"
    comm.barrier()
    total = comm.all_reduce(values(comm.rank, 5, "float64"))
    after = comm.sendrecv(values(comm.rank, 3, "int32"), 1 - comm.rank)
    return {"result": message, "total": total, "after": after}


def sendrecv_in_place_case(comm: Any) -> dict:
    """Every rank sends its buffer right and receives its left neighbour's into the same
    memory (`recvbuf` the buffer itself, or another view of it), small, middling and large
    (read in place on shm): the neighbour's values, every time."""
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    wrong = []
    for count in (3, 1 << 17, (4 << 20) // 8 + 5):
        for view in (False, True):
            buf = values(rank, count, "float64")
            into = buf[:, None] if view else buf  # (the same memory, another shape)
            got = comm.sendrecv(buf, right, into, left)
            if got is not into or not numpy.array_equal(buf, values(left, count, "float64")):
                wrong.append((count, view))
    return {"result": wrong}


def barrier_case(comm: Any) -> dict:
    comm.barrier()
    return {"result": numpy.array(comm.rank)}


def marked_barrier_case(comm: Any, folder: str, hold: float) -> dict:
    """Leave a mark in `folder`, pass the barrier, then list the marks there.

    The last rank marks late: once another rank has passed the barrier, or after `hold`
    seconds. A barrier lets nobody out before that mark is made, so every rank lists all N
    marks (and the last rank waits out `hold`); a rank let out early misses the last mark.
    """
    marks = Path(folder)
    if comm.size > 1 and comm.rank == comm.size - 1:
        deadline = time.monotonic() + hold
        while not any(marks.glob("passed-*")) and time.monotonic() < deadline:
            time.sleep(0.001)
    (marks / f"mark-{comm.rank}").touch()
    comm.barrier()
    seen = sorted(path.name for path in marks.glob("mark-*"))
    (marks / f"passed-{comm.rank}").touch()
    return {"result": seen}


def async_lane_case(comm: Any) -> dict:
    """Three small all-reduces made async and waited for at once: their results, and whether
    the small-call lane took them (it knows their kind)."""
    comm._small_calls.clear()  # (the pool's communicator has made such calls before)
    x = numpy.arange(3.0) + comm.rank
    results = [comm.all_reduce(x, async_op=True).wait().tolist() for _ in range(3)]
    return {"results": results, "transport": comm.transport,
            "lane": ("all_reduce", "sum", x.dtype, x.shape) in comm._small_calls}


def async_case(comm: Any, count: int, dtype: str, order: int) -> dict:
    """Every collective started with async_op=True, a blocking all-reduce queued behind them,
    then the Works waited on in an order that differs from rank to rank."""
    rank, size = comm.rank, comm.size
    mine = values(rank, count, dtype)
    blocks = values(rank, size * count, dtype).reshape(size, count)
    started = {
        "all_reduce": comm.all_reduce(mine, async_op=True),
        "all_gather": comm.all_gather(mine, async_op=True),
        "broadcast": comm.broadcast(mine.copy(), root=size - 1, async_op=True),
        "scatter": comm.scatter(blocks, root=0, async_op=True),
        "reduce_scatter": comm.reduce_scatter(blocks, async_op=True),
        "gather": comm.gather(mine, root=0, async_op=True),
        "reduce": comm.reduce(mine, root=size - 1, async_op=True),
        "all_to_all": comm.all_to_all(blocks, async_op=True),
        "scan": comm.scan(mine, async_op=True),
        "sendrecv": comm.sendrecv(mine, (rank + 1) % size, src=(rank - 1) % size,
                                  async_op=True),
        "barrier": comm.barrier(async_op=True),
    }
    queued = comm.all_reduce(mine, op="max")  # blocking: it waits for its turn
    names = random.Random(order * 1000 + rank).sample(list(started), len(started))
    result = {name: started[name].wait() for name in names}
    return {"result": {**result, "queued": queued},
            "completed": all(work.is_completed() for work in started.values())}


def async_mismatch_case(comm: Any) -> dict:
    """Rank 0 starts an all-reduce of 4 elements, the others of 5, then an all-gather, both
    async: every rank's first wait raises what the blocking call would; the next succeeds."""
    first = comm.all_reduce(numpy.ones(4 if comm.rank == 0 else 5), async_op=True)
    after = comm.all_gather(numpy.array([comm.rank]), async_op=True)
    try:
        first.wait()
        said = None
    except Exception as error:  # noqa: BLE001 - what every rank raised is the result
        said = f"{type(error).__name__}: {error}"
    return {"result": said, "after": after.wait()}


def small_call_case(comm: Any, dtype: str, op: str) -> dict:
    """Small all-reduces of one kind in every form a call takes, once the kind is known, and
    which of them took the general path (`_all_reduce`) instead of the small-call lane
    (collectives/small.py); also what the lane and the general one-shot count in
    `stats`."""
    mine = values(comm.rank, 6, dtype).reshape(2, 3)
    comm.all_reduce(mine, op=op)  # the first call of a kind resolves its op: general path
    general_path = comm._all_reduce
    taken = []

    def spy(sendbuf: Any, recvbuf: Any = None, op: str = "sum", algorithm: str = "auto",
            **kwargs: Any) -> Any:
        taken.append(algorithm)
        return general_path(sendbuf, recvbuf, op, algorithm, **kwargs)

    comm._all_reduce = spy
    try:
        counted = []
        for algorithm in ("auto", "one_shot"):
            comm.stats.reset()
            result = comm.all_reduce(mine, op=op, algorithm=algorithm)
            counted.append((result, comm.stats.bytes_sent, comm.stats.bytes_received,
                            comm.stats.messages))
        into = numpy.empty_like(mine)
        returned = comm.all_reduce(mine, into, op=op)
        in_place = mine.copy()
        comm.all_reduce(in_place, in_place, op=op)
        into_view = numpy.empty((2, *mine.shape), mine.dtype)[1]  # not owning its memory
        comm.all_reduce(mine, into_view, op=op)
        into_strided = numpy.empty((2, 6), mine.dtype)[:, ::2]
        comm.all_reduce(mine, into_strided, op=op)
        shared = numpy.empty(9, mine.dtype)  # input and result overlap by three elements
        overlapping_in, overlapping = shared[:6].reshape(2, 3), shared[3:].reshape(2, 3)
        overlapping_in[...] = mine
        comm.all_reduce(overlapping_in, overlapping, op=op)
        scalar = comm.all_reduce(numpy.array(mine[0, 0]), op=op)
        strided = comm.all_reduce(values(comm.rank, 12, dtype).reshape(2, 6)[:, ::2], op=op)
    finally:
        del comm._all_reduce
    return {"lane": counted[0], "general": counted[1], "into": into,
            "returned_into": returned is into, "in_place": in_place, "into_view": into_view,
            "into_strided": into_strided, "overlapping": overlapping, "scalar": scalar,
            "strided": strided, "general_path": taken}


LANES = ("broadcast", "gather", "all_gather", "reduce", "reduce_scatter", "all_to_all", "scan",
         "exclusive scan", "sendrecv", "scatter", "large scatter")
# Bytes in a block of the "large scatter": on 3 ranks, more in all than its description's room
# for blocks (scatter.py's INLINE_BYTES where it is largest, on shm), so that they follow
# one-sided or as messages; and less than the "one_shot" variant's one_shot_bytes, so that
# the root takes the lane too.
LARGE_BLOCK_BYTES = 96 << 10


def large_block(dtype: str) -> int:
    """Elements of `dtype` in a block of the "large scatter"."""
    return LARGE_BLOCK_BYTES // numpy.dtype(dtype).itemsize


def small_lanes_case(comm: Any, dtype: str, op: str, read_in_place: bool = False) -> dict:
    """`_small_lanes`; with `read_in_place`, every exchange that can read its inputs in place
    does, whatever its size (transports/slots.py, "Inputs read in place"), and the lanes
    place their blocks from any size; then also how many peers' inputs each rank read in
    place (None: the transport cannot read a peer's memory), and what a mismatched call left
    in its result."""
    transport = comm._transport
    if not read_in_place:
        return _small_lanes(comm, dtype, op)
    can_read = getattr(transport, "single_copy", False)
    reads_from = getattr(transport, "reads_inputs_from", None)
    above = getattr(transport, "reads_inputs_above", 0)
    comm._small_calls.clear()  # (lanes keep their exchanges)
    if can_read:  # (on ranks that share cores too)
        transport.reads_inputs_from, transport.reads_inputs_above = 1, 0
        move, read = transport._move, []

        def counted(*args: Any) -> Any:
            if args[2].endswith("'s input"):  # (`_new_exchange_in_place`'s reads)
                read.append(args[1])
            return move(*args)
        transport._move = counted
    small.PLACED_BYTES = 1
    try:
        out = _small_lanes(comm, dtype, op)
        # Rank 0's all-to-all meets the others' all-gathers: all raise, its result untouched.
        into = numpy.zeros((comm.size, 2, 3), dtype)
        try:
            if comm.rank == 0:
                comm.all_to_all(values(0, 6 * comm.size, dtype).reshape(comm.size, 2, 3), into)
            else:
                comm.all_gather(values(comm.rank, 6, dtype).reshape(2, 3), into)
            out["mismatch"] = "no error"
        except MismatchError:
            out["mismatch"] = "untouched" if not into.any() else "written"
    finally:
        comm._small_calls.clear()
        small.PLACED_BYTES = PLACED_BYTES
        if can_read:
            transport.reads_inputs_from, transport.reads_inputs_above = reads_from, above
            del transport._move
    out["read in place"] = len(read) if can_read else None
    return out


# Bytes in a block of `large_read_in_place_case`: more than an area of the "one_shot" variant.
LARGE_IN_PLACE_BYTES = (1 << 20) + 64


@contextlib.contextmanager
def _read_in_place_counted(transport: Any, can_read: bool, crowded: bool = False) -> Any:
    """Where `can_read` (the transport can read a peer's memory), every exchange that can read
    its inputs in place does so, whatever their size (on ranks that share cores too), and with
    `crowded` the ranks count as outnumbering the cores; yields the list of the peers whose
    inputs were read so, in order (empty where not `can_read`)."""
    read: list[int] = []
    if not can_read:
        yield read
        return
    saved = (transport.reads_inputs_from, transport.reads_inputs_above, transport.oversubscribed)
    transport.reads_inputs_from, transport.reads_inputs_above = 1, 0
    transport.oversubscribed = saved[2] or crowded
    move = transport._move

    def counted(*args: Any) -> Any:
        if args[2].endswith("'s input"):  # (`_new_exchange_in_place`'s reads)
            read.append(args[1])
        return move(*args)
    transport._move = counted
    try:
        yield read
    finally:
        transport.reads_inputs_from, transport.reads_inputs_above, transport.oversubscribed = saved
        del transport._move


@contextlib.contextmanager
def _general_path_counted(comm: Any, name: str) -> Any:
    """Yields a one-item list counting the calls that take collective `name`'s general path
    (`comm._<name>`) rather than its lane, until the block ends."""
    general = [0]
    general_path = getattr(comm, f"_{name}")

    def spy(*args: Any, **kwargs: Any) -> Any:
        general[0] += 1
        return general_path(*args, **kwargs)
    setattr(comm, f"_{name}", spy)
    try:
        yield general
    finally:
        delattr(comm, f"_{name}")


def large_scatter_case(comm: Any, dtype: str) -> dict:
    """Scatters of blocks of LARGE_IN_PLACE_BYTES (more in all than the "one_shot" variant's
    one_shot_bytes) from every root, a recvbuf given: what each rank got, and how many calls
    took the general path rather than the lane (collectives/small.py); then rank 0 alone on
    the general path (`_scatter`), meeting the others' lanes."""
    rank, size = comm.rank, comm.size
    count = LARGE_IN_PLACE_BYTES // numpy.dtype(dtype).itemsize
    with _general_path_counted(comm, "scatter") as general:
        got = [comm.scatter(values(root, size * count, dtype).reshape(size, count)
                            if rank == root else None, numpy.empty(count, dtype), root=root)
               for root in range(size)]
        taken, general[0] = general[0], 0
        mixed = (comm._scatter if rank == 0 else comm.scatter)(
            values(0, size * count, dtype).reshape(size, count) if rank == 0 else None,
            numpy.empty(count, dtype), root=0)
    return {"got": got, "general path": taken, "mixed": mixed, "mixed general": general[0]}


def large_read_in_place_case(comm: Any, dtype: str) -> dict:
    """All-to-alls and all-gathers of blocks larger than the transport's one-shot area, every
    exchange that can read its inputs in place doing so, whatever their size: each then takes
    one exchange (transports/slots.py, "Inputs read in place"). Each result by itself, into a
    recvbuf, into a strided one, in place, and with rank 0 alone strided; then how many
    peers' inputs each rank read in place (None: the transport cannot read a peer's memory),
    and, where it can, what a mismatched call left in its result; and how many calls of each
    took the general path rather than the lane (collectives/small.py)."""
    transport, rank, size = comm._transport, comm.rank, comm.size
    count = LARGE_IN_PLACE_BYTES // numpy.dtype(dtype).itemsize
    can_read = getattr(transport, "single_copy", False)
    blocks = values(rank, size * count, dtype).reshape(size, count)
    mine = values(rank, count, dtype)
    out: dict[str, Any] = {}
    general = {"all_to_all": 0, "all_gather": 0}
    for name in general:
        def spy(*args: Any, general_path: Any = getattr(comm, f"_{name}"), name: str = name,
                **kwargs: Any) -> Any:
            general[name] += 1
            return general_path(*args, **kwargs)
        setattr(comm, f"_{name}", spy)
    try:
        with _read_in_place_counted(transport, can_read) as read:
            for name, x in (("all_to_all", blocks), ("all_gather", mine)):
                call = getattr(comm, name)
                out[name] = call(x)
                into = numpy.empty((size, count), dtype)
                strided = _strided(numpy.empty((size, count), dtype))
                call(x, into)
                call(x, strided)
                if name == "all_to_all":
                    in_place = blocks.copy()
                    call(in_place, in_place)
                else:  # MPI_IN_PLACE: each rank's input is its block of recvbuf
                    in_place = numpy.empty((size, count), dtype)
                    in_place[rank] = mine
                    call(in_place[rank], in_place)
                out.update({f"{name} into": into, f"{name} strided": strided,
                            f"{name} in place": in_place,
                            f"{name} mixed": call(_strided(x) if rank == 0 else x.copy())})
            if can_read:  # rank 0's all-to-all meets the others' all-gathers: all raise
                into = numpy.zeros((size, count), dtype)
                try:
                    if rank == 0:
                        comm.all_to_all(blocks, into)
                    else:
                        comm.all_gather(mine, into)
                    out["mismatch"] = "no error"
                except MismatchError:
                    out["mismatch"] = "untouched" if not into.any() else "written"
    finally:
        for name in general:
            delattr(comm, f"_{name}")
    out["read in place"] = len(read) if can_read else None
    out["general path"] = general
    return out


# Bytes in a block of `large_reduce_scatter_case`: on 3 ranks, more in all than an area of the
# "one_shot" variant, and less than a block from which the two-shot passes pay.
LARGE_REDUCED_BLOCK_BYTES = (512 << 10) + 64


def large_reduce_scatter_case(comm: Any, dtype: str, op: str) -> dict:
    """Reduce-scatters of equal blocks larger in all than the transport's one-shot area, as
    if the ranks outnumbered the cores, with every exchange that can read its inputs in place
    doing so: each then takes one exchange (collectives/reduce_scatter.py,
    `read_in_one_exchange`). Each result by itself, into a recvbuf, into a strided one, into
    its own block of the input (in place), and with rank 0 alone strided; then how many
    peers' blocks each rank read in place (None: the transport cannot read a peer's memory),
    and where it can, how many calls after the first (which resolves its op) took the general
    path rather than the lane, and what a mismatched call (rank 0 with another op) left in
    its result; then a reduce of the same blocks to the last rank, and how many peers' inputs
    its first pass read in place."""
    transport, rank, size = comm._transport, comm.rank, comm.size
    count = LARGE_REDUCED_BLOCK_BYTES // numpy.dtype(dtype).itemsize
    can_read = getattr(transport, "single_copy", False)
    blocks = values(rank, size * count, dtype).reshape(size, count)
    out: dict[str, Any] = {}
    with _general_path_counted(comm, "reduce_scatter") as general:
        with _read_in_place_counted(transport, can_read, crowded=True) as read:
            out["alone"] = comm.reduce_scatter(blocks, op=op)
            general[0] = 0
            into = numpy.empty(count, dtype)
            comm.reduce_scatter(blocks, into, op=op)
            strided = _strided(numpy.empty(count, dtype))
            comm.reduce_scatter(blocks, strided, op=op)
            in_place = blocks.copy()
            comm.reduce_scatter(in_place, in_place[rank], op=op)
            out.update({"into": into, "strided": strided, "in place": in_place[rank],
                        "mixed": comm.reduce_scatter(_strided(blocks) if rank == 0
                                                     else blocks.copy(), op=op)})
            out["general path"] = general[0]
            before = len(read)
            out["read in place"] = before if can_read else None
            # a reduce's first pass is the same reduce-scatter (reduce.py)
            out["reduce"] = comm.reduce(blocks.reshape(-1), op=op, root=size - 1)
            out["reduce read in place"] = len(read) - before if can_read else None
            if can_read:
                into = numpy.zeros(count, dtype)
                other = "min" if op == "max" else "max"
                try:
                    comm.reduce_scatter(blocks, into, op=other if rank == 0 else op)
                    out["mismatch"] = "no error"
                except MismatchError:
                    out["mismatch"] = "untouched" if not into.any() else "written"
    return out


def _small_lanes(comm: Any, dtype: str, op: str) -> dict:
    """Each call that has a small-call lane (collectives/small.py) besides all_reduce (a
    sendrecv around the ring too), once its kind is known: by the lane, by the general path
    (`comm._<name>`) for the same call, into a recvbuf, into a strided one, in place where
    MPI allows it, and with rank 0 alone on the general path (a strided input); with what
    the lane and the general path count in `stats`, and which calls took the general
    path."""
    rank, size, root = comm.rank, comm.size, comm.size - 1
    mine = values(rank, 6, dtype).reshape(2, 3)
    blocks = values(rank, 6 * size, dtype).reshape(size, 2, 3)
    large = values(rank, large_block(dtype) * size, dtype).reshape(size, large_block(dtype))
    calls = {  # lane -> (input, call(method, input, recvbuf)), the method public or general
        "broadcast": (mine, lambda m, x, into: m(x.copy() if into is None else into,
                                                   root=root)),
        "gather": (mine, lambda m, x, into: m(x, recvbuf=into, root=root)),
        "all_gather": (mine, lambda m, x, into: m(x, recvbuf=into)),
        "reduce": (mine, lambda m, x, into: m(x, recvbuf=into, op=op, root=root)),
        "reduce_scatter": (blocks, lambda m, x, into: m(x, recvbuf=into, op=op)),
        "all_to_all": (blocks, lambda m, x, into: m(x, recvbuf=into)),
        "scan": (mine, lambda m, x, into: m(x, recvbuf=into, op=op)),
        "exclusive scan": (mine, lambda m, x, into: m(x, recvbuf=into, op=op, exclusive=True)),
        "sendrecv": (mine, lambda m, x, into: m(x, (rank + 1) % size, into, (rank - 1) % size)),
        # (off the root a scatter takes the lane with a recvbuf: given, unless the input is
        # strided, as rank 0's is in the mixed form)
        "scatter": (blocks, lambda m, x, into: m(
            x, numpy.empty((2, 3), dtype) if into is None and x.flags.c_contiguous else into,
            root=root)),
        "large scatter": (large, lambda m, x, into: m(
            x, numpy.empty(large_block(dtype), dtype) if into is None and x.flags.c_contiguous
            else into, root=root)),
    }
    out: dict[str, Any] = {}
    for lane, (x, call) in calls.items():
        name = lane.split()[-1]
        public, general = getattr(comm, name), getattr(comm, f"_{name}")
        call(public, x, None)  # the first call of a kind: the general path, which learns it
        taken: list[str] = []

        def spy(*args: Any, _general: Any = general, **kwargs: Any) -> Any:
            taken.append("general")
            return _general(*args, **kwargs)

        setattr(comm, f"_{name}", spy)
        try:
            counted = []
            for method in (public, general):
                comm.stats.reset()
                counted.append((call(method, x, None), comm.stats.bytes_sent,
                                comm.stats.bytes_received, comm.stats.messages))
            got = {"lane": counted[0], "general": counted[1]}
            if name != "broadcast":  # (off the root, gather and reduce ignore recvbuf)
                shape = (size, 2, 3) if name in ("gather", "all_gather", "all_to_all") \
                    else x.shape[1:] if lane == "large scatter" else (2, 3)
                into, strided = numpy.empty(shape, dtype), _strided(numpy.empty(shape, dtype))
                returned = call(public, x, into)
                if name not in ("sendrecv", "scatter"):  # (these take the lane contiguous)
                    call(public, x, strided)
                    got["into_strided"] = strided
                if counted[0][0] is not None:
                    got.update(returned_into=returned is into, into=into)
            if name in ("broadcast", "reduce", "all_to_all", "scan"):  # recvbuf is sendbuf
                source = x.copy()
                call(public, source, source)
                if name != "reduce" or rank == root:
                    got["in_place"] = source
            if name == "gather":  # MPI_IN_PLACE: each rank's input is its block of recvbuf
                into = numpy.empty((size, 2, 3), dtype)
                into[rank] = x
                call(public, into[rank], into)
                if rank == root:
                    got["in_place"] = into
            mixed = _strided(x) if rank == 0 else x.copy()
            got["mixed"] = call(public, mixed, mixed if name == "broadcast" else None)
            got["taken"] = taken
        finally:
            delattr(comm, f"_{name}")
        out[lane] = got
    return out


def _strided(x: numpy.ndarray) -> numpy.ndarray:
    """A strided array (every other element of a wider one) holding `x`'s values."""
    wide = numpy.empty((*x.shape[:-1], 2 * x.shape[-1]), x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


def small_calls_of_many_sizes_case(comm: Any, sizes: int) -> list:
    """Small all-reduces of `sizes` sizes, round and round: more kinds than a transport keeps
    ready (mpi.py's KEPT_SIZES packets), so prepared exchanges find theirs dropped and make it
    again. Every result, in call order."""
    results = []
    for _ in range(3):
        for count in range(1, sizes + 1):
            results.append(comm.all_reduce(values(comm.rank, count, "float64")))
    return results


def small_call_mismatch_case(comm: Any) -> dict:
    """Both kinds known on every rank, rank 0 sums where the others take the max (then
    broadcasts from root 0 where the others take root 1, then enters a barrier where the
    others all-reduce): the lane's check raises on every rank, and the communicator goes on."""
    mine = values(comm.rank, 4, "float64")
    for op in ("sum", "max"):
        comm.all_reduce(mine, op=op)
        comm.all_reduce(mine, op=op)
    try:
        comm.all_reduce(mine, op="sum" if comm.rank == 0 else "max")
        said = None
    except Exception as error:  # noqa: BLE001 - what every rank raised is the result
        said = f"{type(error).__name__}: {error}"
    for root in (0, 1):  # and a lane of another collective: a broadcast from another root
        comm.broadcast(mine.copy(), root=root)
    try:
        comm.broadcast(mine.copy(), root=0 if comm.rank == 0 else 1)
        said_broadcast = None
    except Exception as error:  # noqa: BLE001
        said_broadcast = f"{type(error).__name__}: {error}"
    comm.barrier()  # and the barrier's lane: met by rank 0's traced one, then by an all-reduce
    with comm.trace() if comm.rank == 0 else contextlib.nullcontext():
        comm.barrier()
    try:
        comm.barrier() if comm.rank == 0 else comm.all_reduce(mine, op="sum")
        said_barrier = None
    except Exception as error:  # noqa: BLE001
        said_barrier = f"{type(error).__name__}: {error}"
    return {"said": said, "said_broadcast": said_broadcast, "said_barrier": said_barrier,
            "after": comm.all_reduce(mine)}


# ---- references, checked in the test process ----------------------------------------------

def reduce_reference(op: str, inputs: list[numpy.ndarray]) -> numpy.ndarray:
    total = functools.reduce(lambda a, b: UFUNCS[op](a, b), inputs)
    return total / len(inputs) if op == "avg" else total


def assert_matches(got: numpy.ndarray, want: numpy.ndarray, dtype: str) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == numpy.dtype(dtype), (got.dtype, dtype)
    if dtype in RTOL:
        # Values are at most 1.375 in size, so products of six stay below 8: an absolute
        # tolerance of 8 * rtol covers cancellation in complex products.
        rtol = RTOL[dtype]
        numpy.testing.assert_allclose(got, want.astype(dtype), rtol=rtol, atol=8 * rtol)
    else:
        numpy.testing.assert_array_equal(got, want)


def check_all_reduce(results: list[dict], count: int, dtype: str, op: str,
                     layout: str) -> None:
    size = len(results)
    inputs = [laid_out(values(r, count, dtype), layout) for r in range(size)]
    want = reduce_reference(op, inputs)
    first = results[0]["result"]
    assert_matches(first, want, dtype)
    for rank, result in enumerate(results):
        assert result["result"].tobytes() == first.tobytes(), \
            f"rank {rank}'s result differs bitwise from rank 0's"


def check_all_gather(results: list[dict], count: int, dtype: str, layout: str) -> None:
    size = len(results)
    want = numpy.stack([laid_out(values(r, count, dtype), layout) for r in range(size)])
    for result in results:
        assert_matches(result["result"], want, dtype)


def check_broadcast(results: list[dict], count: int, dtype: str, layout: str,
                    root: int) -> None:
    want = laid_out(values(root, count, dtype), layout)
    for result in results:
        assert_matches(result["result"], want, dtype)


def check_scatter(results: list[dict], count: int, dtype: str, root: int) -> None:
    size = len(results)
    want = values(100 + root, size * count, dtype).reshape(size, count)
    for rank, result in enumerate(results):
        assert_matches(result["result"], want[rank], dtype)


def check_reduce_scatter(results: list[dict], count: int, dtype: str, op: str) -> None:
    size = len(results)
    inputs = [values(r, size * count, dtype).reshape(size, count) for r in range(size)]
    want = reduce_reference(op, inputs)
    for rank, result in enumerate(results):
        assert_matches(result["result"], want[rank], dtype)


def check_gather(results: list[dict], count: int, dtype: str, layout: str, root: int) -> None:
    size = len(results)
    want = numpy.stack([laid_out(values(r, count, dtype), layout) for r in range(size)])
    for rank, result in enumerate(results):
        for how in ("result", "general") if "general" in result else ("result",):
            if rank == root:
                assert_matches(result[how], want, dtype)
            else:
                assert result[how] is None, f"rank {rank} is not the root but got a result"


def check_reduce(results: list[dict], count: int, dtype: str, op: str, layout: str,
                 root: int) -> None:
    size = len(results)
    want = reduce_reference(op, [laid_out(values(r, count, dtype), layout) for r in range(size)])
    for rank, result in enumerate(results):
        if rank == root:
            assert_matches(result["result"], want, dtype)
        else:
            assert result["result"] is None, f"rank {rank} is not the root but got a result"


def check_all_to_all(results: list[dict], count: int, dtype: str) -> None:
    size = len(results)
    sent = [values(r, size * count, dtype).reshape(size, count) for r in range(size)]
    for rank, result in enumerate(results):
        assert_matches(result["result"], numpy.stack([sent[i][rank] for i in range(size)]),
                       dtype)


def identity(op: str, dtype: str) -> object:
    """What an empty reduction gives: rank 0's exclusive scan."""
    kind = numpy.dtype(dtype).kind
    if op in ("sum", "avg"):
        return 0
    if op == "prod":
        return 1
    if kind == "b":
        return op == "min"
    if kind == "f":
        return numpy.inf if op == "min" else -numpy.inf
    info = numpy.iinfo(dtype)
    return info.max if op == "min" else info.min


def check_scan(results: list[dict], count: int, dtype: str, op: str, layout: str,
               exclusive: bool) -> None:
    inputs = [laid_out(values(r, count, dtype), layout) for r in range(len(results))]
    for rank, result in enumerate(results):
        below = inputs[:rank] if exclusive else inputs[:rank + 1]
        want = reduce_reference(op, below) if below else \
            numpy.full(inputs[0].shape, identity(op, dtype), dtype)
        assert_matches(result["result"], want, dtype)


def check_uneven(results: list[dict], collective: str, counts: list, dtype: str, op: str,
                 root: int) -> None:
    size = len(results)
    inputs = [uneven_input(collective, r, counts, dtype, root) for r in range(size)]
    if collective == "all_to_all":
        bounds = [numpy.cumsum([0, *row_of(counts, i)]) for i in range(size)]
        for rank, result in enumerate(results):
            want = numpy.concatenate([inputs[i][bounds[i][rank]:bounds[i][rank + 1]]
                                      for i in range(size)])
            assert_matches(result["result"], want, dtype)
        return
    ends = numpy.cumsum([0, *counts])
    for rank, result in enumerate(results):
        block = slice(ends[rank], ends[rank + 1])
        if collective == "all_gather" or (collective == "gather" and rank == root):
            assert_matches(result["result"], numpy.concatenate(inputs), dtype)
        elif collective == "gather":
            assert result["result"] is None
        elif collective == "scatter":
            assert_matches(result["result"], inputs[root][block], dtype)
        else:
            assert_matches(result["result"], reduce_reference(op, inputs)[block], dtype)


def check_sendrecv(results: list[dict], count: int, dtype: str, layout: str,
                   shift: int) -> None:
    size = len(results)
    for rank, result in enumerate(results):
        want = laid_out(values((rank - shift) % size, count, dtype), layout)
        assert_matches(result["result"], want, dtype)


def check_chain(results: list[dict], count: int, dtype: str) -> None:
    partial = values(0, count, dtype)
    for rank, result in enumerate(results):
        if rank:
            partial = partial + values(rank, count, dtype)
        assert_matches(result["result"], partial, dtype)
