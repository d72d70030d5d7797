"""The small-call lane: small blocking calls on NumPy arrays, with nothing else.

A small collective (a loss, a metric, a flag, a small gradient bucket) moves a few bytes, so
its cost is all overhead. The general path (`Communicator._all_reduce`, `_broadcast`, ...,
through the `collective` decorator of calls.py) pays for everything any call might need: its
turn on the progress thread, torch tensors, any layout, any algorithm, tracing. It costs
several times what the exchange itself does.

So each collective that moves small equal blocks in one exchange (all_reduce, broadcast,
reduce, gather, all_gather, reduce_scatter, all_to_all, scan, and a scatter of blocks each
rank knows the shape of, inside its description where they fit, else one-sided or as
messages after it) first offers a call to this lane, which takes it when it is the common case:
blocking, of a contiguous NumPy array no larger than the transport's `one_shot_bytes`, of a
kind the general path has taken before where there is an op (so it is resolved for the
dtype), nothing queued, not traced. An all-to-all or an all-gather takes it at any size where
the transport reads what each rank takes in place (`Communicator._read_in_place`), and so
does a reduce-scatter where it also takes one exchange (`read_in_one_exchange`), and a
broadcast where it goes one-sided (`reads_from_root`: its one exchange says where the root's
buffer lies), and a scatter at any size (its exchange is its description): the general path
makes the same one exchange then, and its Python, paid at any size, cost a 1 MiB all-to-all on
four ranks sharing two cores a fifth of its time, as it did a 2 MiB scatter on two ranks. The
lane then does what the general path's one-shot form would do for that call, and only that:

1. number the call;
2. make the exchange that the general path makes (`transport.all_inputs`): every rank's
   input, with the call's descriptor beside it, so the check costs no exchange of its own
   and a mismatch still raises on every rank. A rank in the lane and a rank on the general
   path make the same exchange, so each rank may take either;
3. take this rank's result out of the inputs: a reduction in rank order (((x0 op x1) op x2)
   ...), bitwise the general path's, or the blocks copied where they belong.

What it keeps per kind of call (collective, op or root, dtype, shape) is the ufunc and the
exchange, prepared for that shape, dtype, descriptor and byte count
(`transport.prepare_all_inputs`, as MPI's persistent collectives are): a run of calls of one
kind looks them up once, and each call only moves its data. At a few bytes every lookup
counts (docs/performance.md, "Small calls"). Anything else (a strided input, a recvbuf of another
shape or dtype, a first call of its kind) goes the general path, which also raises the errors:
the lane never decides what is wrong, only what is plain. An async call takes the lane in its
turn (calls.py), on the progress thread or on its waiter's.

Messages (send, recv, sendrecv) take a shorter lane, at any size: their arguments seen plain,
then a step the transport readies once per kind of message (`prepare_pair_message`, kept as the
collectives' exchanges are: `small_sendrecv`, `small_send`, `small_recv`, `_step_message`). On
shm a sendrecv with one peer goes through the pair areas, up to 512 KiB on 2 ranks, and is read
in place above them where direct reads work (where ranks share cores, from 512 KiB); a sendrecv
with two peers (`_ring_message`) goes the same ways, each half on its own, and a send or a recv
alone through the pair areas up to a segment. On
mpi each way is one packet, the check's words and the data (up to 128 KiB), for one peer or
two. Where there is no such step,
`small_message` takes the transport's `pair_message` for a sendrecv with one peer, else the
general path's own moves (`Communicator._message`), without the decorator.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy

from transports.base import Moved, Reads
from transports.errors import CallsDiffer, MismatchError

from .ops import reduce_in_rank_order, with_own
from .arguments import NUMERIC, output
from .arrays import overlap
from .blocks import equal, every_input, from_root, own_blocks, peers_inputs, to_root
from .broadcast import read_from_root, reads_from_root, where_root
from .check import MessagesDiffer, judge_pair, mirrored, pair_kind, pair_said
from .point_to_point import MessageName
from .scan import finish, prefix
from .scatter import (LENGTH, TARGET, WHERE, carried, describe, description_bytes,
                      give_blocks, inline_bytes, offer_target, published_bytes,
                      receive_described, send_blocks, take_block, where_at)

KINDS_KEPT = 64  # kinds of call remembered; more means a sweep of sizes, so start again
# The blocks of an all-to-all, an all-gather or a gather from this size are placed where they
# belong by the exchange, which may read them straight there (transports/slots.py, "Inputs
# read in place"); below it, a few views cost a call more than its data.
PLACED_BYTES = 64 << 10
GENERAL = object()  # what a lane returns for a call it leaves to the general path
BARRIER = ("barrier",)  # the barrier's kind of call (`small_barrier`)
NO_DATA = numpy.empty(0, numpy.uint8)  # the barrier's input: its exchange moves no data
# How a lane's scatter moves its blocks: inside its description, one-sided, or as messages.
INLINE, ONE_SIDED, MESSAGES = object(), object(), object()


def small_all_reduce(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None, op: str) -> Any:
    """`comm.all_reduce(sendbuf, recvbuf, op)` by the lane, or GENERAL. The caller has seen
    that sendbuf is a NumPy array of at most `comm._small_bytes`, more than zero.

    The busiest lane (losses, metrics, gradient buckets) has `_open`, `_exchange` and `_fits`
    written out, and reduces two inputs in one call of the ufunc (`_own_reduced`): at 8 B,
    each call of a function costs a tenth of a microsecond or more (docs/performance.md,
    "Small calls").
    """
    transport = comm._transport
    if (transport.trace is not None or transport.on_transfer is not None
            or comm._broken is not None or transport.closed or not sendbuf.flags.c_contiguous
            or type(op) is not str):
        return GENERAL
    if comm._progress.outstanding and not comm._progress.on_thread():
        return GENERAL  # (in its turn, on the progress thread)
    key = ("all_reduce", op, sendbuf.dtype, sendbuf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "all_reduce", sendbuf, op,
        reads=peers_inputs(sendbuf.nbytes, transport.rank, transport.size))
    if kind is None:
        return GENERAL
    if recvbuf is not None and not (type(recvbuf) is numpy.ndarray  # (`_fits`)
                                    and recvbuf.dtype is sendbuf.dtype
                                    and recvbuf.shape == sendbuf.shape
                                    and recvbuf.flags.writeable):
        return GENERAL
    ufunc, average, exchange = kind
    comm._calls = number = comm._calls + 1
    try:
        inputs = exchange(sendbuf, number)
    except CallsDiffer as differ:  # every rank raises it, and every message has landed
        raise MismatchError(comm._disagreement(differ.calls)) from None
    except BaseException as error:  # messages may be in flight: no more calls
        comm._break(error)
        raise
    return _own_reduced(inputs, sendbuf, transport.rank, ufunc, average, recvbuf)


def small_barrier(comm: Any) -> Any:
    """`comm.barrier()` by the lane: None, or GENERAL. With the call check on, the general
    path's barrier is its check's exchange, of no data (every rank waits there for every
    other's descriptor, which each gives as it enters); the lane makes that exchange,
    prepared once (`transport.prepare_all_inputs`), without the rest of the general path
    (on shm on 2 ranks, 15.2-15.4 us a call by the general path, 3.5 by the lane, MPICH's
    3.0-3.2: docs/performance.md, "A barrier in the lane"). Unchecked, the transport's own
    barrier: the general path."""
    transport = comm._transport
    if (not comm._checking or transport.size == 1 or transport.trace is not None
            or transport.on_transfer is not None or comm._broken is not None
            or transport.closed or comm._progress.outstanding and not comm._progress.on_thread()):
        return GENERAL
    exchange = comm._small_calls.get(BARRIER)
    if exchange is None:
        if len(comm._small_calls) >= KINDS_KEPT:
            comm._small_calls.clear()
        exchange = comm._small_calls[BARRIER] = transport.prepare_all_inputs(
            NO_DATA.shape, NO_DATA.dtype, "barrier", comm._descriptor("barrier", -1, None), [])
    comm._calls = number = comm._calls + 1
    try:
        exchange(NO_DATA, number)
    except CallsDiffer as differ:  # every rank raises it, and every message has landed
        raise MismatchError(comm._disagreement(differ.calls)) from None
    except BaseException as error:  # messages may be in flight: no more calls
        comm._break(error)
        raise
    return None


def small_reduce(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None, op: str,
                 root: int) -> Any:
    """`comm.reduce(sendbuf, recvbuf, op, root)` by the lane, or GENERAL: the root reduces
    every input in rank order, the others return None."""
    rank = comm._transport.rank
    if not _open(comm, sendbuf) or type(op) is not str or not _is_rank(comm, root):
        return GENERAL
    key = ("reduce", op, root, sendbuf.dtype, sendbuf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "reduce", sendbuf, op, root, _one_way(comm, root, sendbuf.nbytes, True),
        to_root(sendbuf.nbytes, root, rank, comm._transport.size))
    if kind is None or (rank == root and recvbuf is not None
                        and not _fits(recvbuf, sendbuf.shape, sendbuf.dtype)):
        return GENERAL
    ufunc, average, exchange = kind
    if rank == root:
        comm._transport.unread()  # (none takes the root's input: `to_root`)
    inputs = _exchange(comm, exchange, sendbuf)
    if rank != root:
        return None
    return _own_reduced(inputs, sendbuf, rank, ufunc, average, recvbuf)


def small_broadcast(comm: Any, buf: numpy.ndarray, root: int) -> Any:
    """`comm.broadcast(buf, root)` by the lane, or GENERAL: every rank publishes its `buf`
    (the general path's exchange), and all but the root take the root's, into `buf`; or,
    larger than that exchange holds, one-sided (`_one_sided_broadcast`). (`_open` and
    `_is_rank` written out: at 8 B each call of a function shows.)"""
    transport = comm._transport
    if (transport.trace is not None or transport.on_transfer is not None
            or comm._broken is not None or transport.closed or not buf.flags.c_contiguous
            or not buf.flags.writeable or type(root) is not int
            or not 0 <= root < transport.size):
        return GENERAL
    if comm._progress.outstanding and not comm._progress.on_thread():
        return GENERAL
    if buf.nbytes > comm._small_bytes:
        return _one_sided_broadcast(comm, buf, root)
    key = ("broadcast", root, buf.dtype, buf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "broadcast", buf, root=root, moved=_one_way(comm, root, buf.nbytes, False),
        reads=from_root(buf.nbytes, root, transport.rank, transport.size))
    if kind is None:
        return GENERAL
    if transport.rank != root:
        transport.unread()  # (none takes ours: `from_root`)
        _exchange(comm, kind[2], buf, buf)  # (the root's lands in `buf`: `place`)
    else:
        transport.copied_whole()  # (the others copy ours whole)
        _exchange(comm, kind[2], buf)
    return buf


def _one_sided_broadcast(comm: Any, buf: numpy.ndarray, root: int) -> Any:
    """A broadcast larger than one exchange holds, where it goes one-sided (`reads_from_root`:
    on ranks that outnumber the cores), as the general path's `one_sided_broadcast`: its
    exchange of where the root's buffer lies prepared as the lane's others are, checked with
    the broadcast's descriptor (uncounted: the root's buffer counts as it moves); else
    GENERAL."""
    transport = comm._transport
    if buf.dtype.kind not in NUMERIC or not reads_from_root(transport, buf.nbytes):
        return GENERAL
    key = ("broadcast", root, buf.dtype, buf.shape)
    exchange = comm._small_calls.get(key)
    if exchange is None:
        if len(comm._small_calls) >= KINDS_KEPT:
            comm._small_calls.clear()
        call = comm._descriptor("broadcast", buf.size, buf.dtype, root=root) \
            if comm._checking else None
        exchange = comm._small_calls[key] = transport.prepare_all_inputs(
            (1,), numpy.uint64, "broadcast", call, [])
    flat = _flat(buf)
    said = _exchange(comm, exchange, where_root(transport, flat, root))
    _messages(comm, lambda: read_from_root(transport, said, root, flat))
    return buf


def small_gather(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None, root: int) -> Any:
    """`comm.gather(sendbuf, recvbuf, root)` by the lane, or GENERAL: the root copies every
    rank's input into its block, the others return None."""
    transport = comm._transport
    if not _open(comm, sendbuf) or not _is_rank(comm, root):
        return GENERAL
    key = ("gather", root, sendbuf.dtype, sendbuf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "gather", sendbuf, root=root, moved=_one_way(comm, root, sendbuf.nbytes, True),
        reads=to_root(sendbuf.nbytes, root, transport.rank, transport.size))
    shape = (transport.size, *sendbuf.shape)
    if kind is None or (transport.rank == root and recvbuf is not None
                        and not _fits(recvbuf, shape, sendbuf.dtype)):
        return GENERAL
    if transport.rank != root:
        transport.copied_whole()  # (the root copies ours whole)
        _exchange(comm, kind[2], sendbuf)
        return None
    result = numpy.empty(shape, sendbuf.dtype) if recvbuf is None else recvbuf
    placed = _placed(result, sendbuf)
    transport.unread()  # (none takes the root's input: `to_root`)
    if placed:  # the peers' blocks, placed; ours copied with the exchange (`alongside`)
        def copy_own() -> None:
            result[root] = sendbuf
        transport.alongside(copy_own)
        _exchange(comm, kind[2], sendbuf, result)
        return result
    inputs = _exchange(comm, kind[2], sendbuf)
    result[root] = sendbuf  # first: `sendbuf` may overlap the other blocks
    for source, theirs in enumerate(inputs):
        if source != root:
            result[source] = theirs
    return result


def small_all_gather(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None) -> Any:
    """`comm.all_gather(sendbuf, recvbuf)` by the lane, or GENERAL: every rank's input, block
    r from rank r, in `recvbuf` or a new array; placed there by the exchange where it may be
    (`_placed`), else copied out of it."""
    if not _open(comm, sendbuf):
        return GENERAL
    size = comm._transport.size
    key = ("all_gather", sendbuf.dtype, sendbuf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "all_gather", sendbuf, reads=every_input(sendbuf.nbytes, size))
    if kind is None:
        return GENERAL
    if recvbuf is None:
        result = numpy.empty((size, *sendbuf.shape), sendbuf.dtype)
    elif _fits(recvbuf, (size, *sendbuf.shape), sendbuf.dtype):
        result = recvbuf
    else:
        return GENERAL
    if _placed(result, sendbuf):
        _exchange(comm, kind[2], sendbuf, result)
        return result
    for source, theirs in enumerate(_exchange(comm, kind[2], sendbuf)):
        result[source] = theirs
    return result


def small_reduce_scatter(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None,
                         op: str) -> Any:
    """`comm.reduce_scatter(sendbuf, recvbuf, op)` by the lane, or GENERAL: each rank reduces
    its own block of every input, in rank order, its own input's where it lies (`keeps_own`:
    the exchange need not copy it) unless the result overlaps the input."""
    transport = comm._transport
    if not _open(comm, sendbuf) or type(op) is not str or not _in_blocks(comm, sendbuf):
        return GENERAL
    key = ("reduce_scatter", op, sendbuf.dtype, sendbuf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "reduce_scatter", sendbuf, op,
        moved=transport.every_peer(sendbuf.nbytes // transport.size),
        reads=_own_blocks(comm, sendbuf))
    block = sendbuf.shape[1:]
    if kind is None or recvbuf is not None and not _fits(recvbuf, block, sendbuf.dtype):
        return GENERAL
    ufunc, average, exchange = kind
    rank = transport.rank
    kept = recvbuf is None or not overlap(recvbuf, sendbuf, numpy)
    if kept:
        transport.keeps_own()
    blocks = [theirs[rank] for theirs in _exchange(comm, exchange, sendbuf)]
    if kept:
        return _own_reduced(blocks, sendbuf[rank], rank, ufunc, average, recvbuf)
    return _reduced(blocks, ufunc, average, recvbuf, block, sendbuf.dtype)


def small_all_to_all(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None) -> Any:
    """`comm.all_to_all(sendbuf, recvbuf)` by the lane, or GENERAL: block i of the result is
    this rank's block of rank i's input."""
    transport = comm._transport
    if not _open(comm, sendbuf) or not _in_blocks(comm, sendbuf):
        return GENERAL
    key = ("all_to_all", sendbuf.dtype, sendbuf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "all_to_all", sendbuf,
        moved=transport.every_peer(sendbuf.nbytes // transport.size),
        reads=_own_blocks(comm, sendbuf))
    if kind is None or recvbuf is not None and not _fits(recvbuf, sendbuf.shape, sendbuf.dtype):
        return GENERAL
    rank = transport.rank
    result = numpy.empty(sendbuf.shape, sendbuf.dtype) if recvbuf is None else recvbuf
    if _placed(result, sendbuf):
        _exchange(comm, kind[2], sendbuf, result)
        return result
    inputs = _exchange(comm, kind[2], sendbuf)
    for source, theirs in enumerate(inputs):
        result[source] = theirs[rank]
    return result


def small_scan(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None, op: str,
               exclusive: bool) -> Any:
    """`comm.scan(sendbuf, recvbuf, op, exclusive)` by the lane, or GENERAL: rank r reduces
    the inputs of ranks 0..r (0..r-1) in rank order, as scan.py's one-shot does."""
    transport = comm._transport
    if not _open(comm, sendbuf) or type(op) is not str or type(exclusive) is not bool:
        return GENERAL
    key = ("scan", op, exclusive, sendbuf.dtype, sendbuf.shape)
    kind = comm._small_calls.get(key) or _learn(
        comm, key, "scan/exclusive" if exclusive else "scan", sendbuf, op,
        moved=_up_the_ranks(comm, sendbuf.nbytes))
    if kind is None or recvbuf is not None and not _fits(recvbuf, sendbuf.shape, sendbuf.dtype):
        return GENERAL
    last = transport.rank == transport.size - 1
    if last:
        transport.unread()  # (none takes the last rank's input: it reduces its own as it lies)
    inputs = _exchange(comm, kind[2], sendbuf)
    out = numpy.empty(sendbuf.shape, sendbuf.dtype) if recvbuf is None else recvbuf
    if last:
        inputs = with_own(numpy, inputs, sendbuf, transport.rank, out)
    prefix(numpy, inputs, transport.rank, kind[0], exclusive, out)
    finish(numpy, out, op, transport.rank, exclusive)
    return out


def small_scatter(comm: Any, sendbuf: Any | None, recvbuf: Any | None, root: int) -> Any:
    """`comm.scatter(sendbuf, recvbuf, root)` by the lane, or GENERAL: a scatter of blocks
    each rank knows the shape of (a recvbuf off the root). The root publishes the description
    (scatter.py), with the blocks in it when they fit, and each rank takes its own from there;
    larger blocks move one-sided where the transport can (each rank gets its own from where
    the description says they lie), else follow as messages, the root copying its own block
    while its peers take theirs. A description other than the one expected (the root's blocks
    differ) is read as the general path reads it."""
    transport = comm._transport
    size, rank = transport.size, transport.rank
    mine = sendbuf if rank == root else recvbuf
    if type(mine) is not numpy.ndarray or type(root) is not int or not _open(comm, mine):
        return GENERAL
    # The root's kind is named by its whole buffer (a block per rank), the others' by their
    # block: a kind kept says that the root is a rank, the dtype a number, the blocks one a
    # rank.
    key = ("scatter", root, mine.dtype, mine.shape)
    kind = comm._small_calls.get(key)
    if kind is None:
        if mine.dtype.kind not in NUMERIC or not 0 <= root < size \
                or rank == root and not _in_blocks(comm, mine):
            return GENERAL
        kind = _learn_scatter(comm, key, root, mine.shape[1:] if rank == root else mine.shape,
                              mine.dtype)
    block = kind.block
    if rank == root:
        if recvbuf is not None and not _fits(recvbuf, block, mine.dtype):
            return GENERAL
    elif not mine.flags.writeable:
        return GENERAL
    publish, exchange, way = kind.publish, kind.exchange, kind.way
    if rank == root:
        if way is not INLINE and recvbuf is not None and overlap(recvbuf, mine, numpy):
            return GENERAL  # its block would be written while its peers read theirs
        if way is INLINE:  # the peers' blocks, from our right neighbour's on (`carried`)
            kind.blocks[:size - 1 - root] = mine[root + 1:]
            if root:
                kind.blocks[size - 1 - root:] = mine[:root]
        elif way is ONE_SIDED:
            WHERE.pack_into(publish, where_at(size), transport.locate(mine))
        transport.unread(kind.published)  # (the rest of it no peer takes)
        said = _exchange(comm, exchange, publish)
        result = numpy.empty(block, mine.dtype) if recvbuf is None else recvbuf
        if way is INLINE:
            result[...] = mine[root]
            return result
        bounds = equal(math.prod(block), size)
        if way is ONE_SIDED:
            _messages(comm, lambda: give_blocks(transport, mine.reshape(-1), bounds, root,
                                                result, said))
        else:
            _messages(comm, lambda: send_blocks(transport, mine.reshape(-1), bounds, root,
                                                result))
        return result
    if way is INLINE:  # (the offer of nothing is in `publish` from the start: `offer_target`)
        transport.unread(TARGET.size)
        offered = 0
    else:
        offered = offer_target(transport, publish, mine.reshape(-1) if way is ONE_SIDED
                               else None)
    said = _exchange(comm, exchange, publish)[root]
    described, taken, _ = kind.views.get(id(said)) or kind.view(said)
    if described != kind.expected:
        _messages(comm, lambda: receive_described(
            transport, said, root,
            lambda shape, dtype: output(mine, shape, dtype, numpy).reshape(-1), offered))
    elif way is INLINE:
        mine[...] = taken
    elif way is ONE_SIDED:
        _messages(comm, lambda: take_block(transport, said, root, rank * mine.nbytes,
                                           mine.reshape(-1), offered))
    else:
        transport.at("scatter", (rank - root) % size - 1)
        _messages(comm, lambda: transport.recv(mine.reshape(-1), root))
    return mine


class _ScatterKind:
    """What the lane keeps of a kind of scatter (`_learn_scatter`): what this rank publishes
    (the root: its description, with room for the blocks, or where they lie, written each
    call; the others: their offer of where their block may land, `offer_target`), the
    description the root gives when the blocks are as this rank expects them, the exchange,
    and the way the blocks go (INLINE, ONE_SIDED or MESSAGES, as the general path chooses).

    And views, made once, as a small call feels each (a reshape, a view and a slice cost a
    16 B scatter 2 us): on the root, where its blocks go in what it publishes (`blocks`,
    INLINE) and the bytes its peers take of that (`published`); on the others, for each
    place the exchange returns the root's description in (`view`)."""

    __slots__ = ("publish", "expected", "exchange", "way", "blocks", "published", "start",
                 "block", "dtype", "views")

    def __init__(self, publish: numpy.ndarray, expected: bytes, exchange: Any, way: object,
                 block: tuple[int, ...], dtype: numpy.dtype, rank: int, root: int,
                 size: int) -> None:
        self.publish, self.expected, self.exchange, self.way = publish, expected, exchange, way
        self.block, self.dtype = block, dtype
        room, nbytes = description_bytes(size), math.prod(block) * dtype.itemsize
        peers = (size - 1) * nbytes  # (the root's own block is not carried: `carried`)
        self.blocks = publish[room:room + peers].view(dtype).reshape((size - 1, *block)) \
            if rank == root and way is INLINE else None
        self.published = room + peers if way is INLINE else room
        self.start = room + carried(rank * nbytes, root * nbytes, (root + 1) * nbytes,
                                    size * nbytes)  # (our block, after the description)
        self.views: dict[int, tuple[memoryview, Any, Any]] = {}

    def view(self, said: Any) -> tuple[memoryview, Any, Any]:
        """Of the root's description `said`, as the exchange returned it: the bytes that
        describe its blocks, this rank's block (INLINE; else None), and `said` (kept, so that
        its id is not another's), for the exchange's next call that returns it in the same
        place (a transport has few: an area per turn's parity)."""
        if len(self.views) >= 4:  # (a transport that returns new arrays: none kept long)
            self.views.clear()
        nbytes = math.prod(self.block) * self.dtype.itemsize
        taken = said[self.start:self.start + nbytes].view(self.dtype).reshape(self.block) \
            if self.way is INLINE else None
        views = self.views[id(said)] = (memoryview(said[:len(self.expected)]), taken, said)
        return views


def _messages(comm: Any, move: Callable[[], Any]) -> Any:
    """`move()`, the messages of a lane (those that follow its exchange, or a message's own),
    raising what `_failed` says where they fail."""
    try:
        return move()
    except BaseException as error:
        raise _failed(comm, error)


def _failed(comm: Any, error: BaseException) -> BaseException:
    """What a lane's messages raise where they fail with `error`: a pair that disagreed,
    MismatchError on both ends, having taken no data; a ValueError leaves the communicator
    usable (as calls.py); anything else breaks it."""
    if isinstance(error, MessagesDiffer):
        mismatch = MismatchError(str(error))
        mismatch.__suppress_context__ = True  # (`raise ... from None`)
        return mismatch
    if not isinstance(error, (ValueError, TypeError)):
        comm._break(error)
    return error


def small_message(comm: Any, sendbuf: numpy.ndarray | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> Any:
    """`comm.sendrecv(sendbuf, dst, recvbuf, src)`, `send` (no recvbuf, no src) or `recv` (no
    sendbuf, no dst) by the lane, or GENERAL: the arguments seen to be plain (contiguous
    NumPy arrays of numbers, peers that are other ranks), then what the general path does
    with them (`Communicator._message`: numbered, checked by the pair, moved). Returns
    `recvbuf` (a new array for a sendrecv without one). (A sendrecv with one peer tries
    `small_sendrecv` first.)"""
    if recvbuf is None and sendbuf is not None and src is not None:
        recvbuf = numpy.empty(sendbuf.shape, sendbuf.dtype)
    size, rank = comm._transport.size, comm._transport.rank
    for peer in (dst, src):
        if peer is not None and (type(peer) is not int or not 0 <= peer < size or peer == rank):
            return GENERAL  # (a rank that names itself copies: the general path)
    for buf in (sendbuf, recvbuf):
        if buf is not None and (type(buf) is not numpy.ndarray or buf.dtype.kind not in NUMERIC
                                or not buf.flags.c_contiguous):
            return GENERAL
    if not _open(comm, recvbuf if sendbuf is None else sendbuf):
        return GENERAL
    if recvbuf is not None and not recvbuf.flags.writeable:
        return GENERAL
    if sendbuf is not None and recvbuf is not None and overlap(recvbuf, sendbuf, numpy):
        return GENERAL  # in place: the general path sends a copy
    mine = None if sendbuf is None else _flat(sendbuf)
    into = None if recvbuf is None else _flat(recvbuf)

    def move() -> None:
        if dst != src or mine is None or not _pair_message(comm, mine, dst, into):
            comm._message(mine, dst, into, src)
    _messages(comm, move)
    return recvbuf


def small_sendrecv(comm: Any, sendbuf: numpy.ndarray, dst: Any, recvbuf: Any | None,
                   src: Any) -> Any:
    """`comm.sendrecv(sendbuf, dst, recvbuf, src)` by a readied step (`_step_message`, or
    `_ring_message` for two peers): `recvbuf` (a new array where None), or GENERAL. The
    caller has seen that sendbuf is a NumPy array of more than zero bytes."""
    if recvbuf is None:
        recvbuf = numpy.empty(sendbuf.shape, sendbuf.dtype)
    if (type(recvbuf) is not numpy.ndarray
            or not (sendbuf.flags.c_contiguous and recvbuf.flags.c_contiguous
                    and recvbuf.flags.writeable)
            or overlap(recvbuf, sendbuf, numpy)):
        return GENERAL
    if dst == src:
        key = ("sendrecv", dst, sendbuf.dtype, sendbuf.shape, recvbuf.dtype, recvbuf.shape)
        return recvbuf if _step_message(comm, key, sendbuf, dst, recvbuf) else GENERAL
    return recvbuf if _ring_message(comm, sendbuf, dst, recvbuf, src) else GENERAL


def _ring_message(comm: Any, mine: numpy.ndarray, dst: Any, into: numpy.ndarray,
                  src: Any) -> bool:
    """A sendrecv with two peers (a ring shift) by the step the transport readies for its
    kind (`prepare_ring_message`), as `_step_message` makes one with one peer: True once
    moved; False, nothing done, where there is none. Where one pair disagrees, the other's
    half has moved and takes its number, and both ends of the pair that disagreed raise, as
    `Communicator._message` has it."""
    transport = comm._transport
    if (type(dst) is not int or type(src) is not int or transport.trace is not None
            or transport.on_transfer is not None or comm._broken is not None
            or transport.closed or comm._progress.outstanding and not comm._progress.on_thread()):
        return False
    key = ("sendrecv", dst, src, mine.dtype, mine.shape, into.dtype, into.shape)
    kind = comm._small_calls.get(key, GENERAL)
    if kind is GENERAL:
        kind = _learn_ring(comm, key, mine, dst, into, src)
    if kind is None:
        return False
    step, name = kind
    counted = comm._messages
    name.sent = n_sent = counted.sent[dst] + 1
    name.received = n_expected = counted.received[src] + 1
    transport.begin(name, None, "sendrecv")
    try:  # (`_messages` and `_flat`, written out)
        moved = step(mine if mine.ndim == 1 else mine.reshape(-1),
                     into if into.ndim == 1 else into.reshape(-1), n_sent, n_expected)
    except BaseException as error:
        raise _failed(comm, error)
    if moved is False:
        return False
    if moved is not True:  # the words of each peer, one pair's differing: raises
        said = {dst: pair_said(n_sent, 0, pair_kind(mine, None))[0],
                src: pair_said(0, n_expected, pair_kind(None, into))[0]}
        if moved[dst] is True:
            counted.sent[dst] = n_sent
            moved[dst] = mirrored(said[dst])
        if moved[src] is True:
            counted.received[src] = n_expected
            moved[src] = mirrored(said[src])
        _messages(comm, lambda: judge_pair(transport, said, moved))
    counted.sent[dst], counted.received[src] = n_sent, n_expected  # (`Messages.count`)
    return True


def _learn_ring(comm: Any, key: tuple, mine: numpy.ndarray, dst: int, into: numpy.ndarray,
                src: int) -> tuple[Callable[..., Any], MessageName] | None:
    """`_learn_pair` for a sendrecv with two peers: the step `prepare_ring_message` readies,
    and the call's name."""
    transport = comm._transport
    size, rank = transport.size, transport.rank
    step = None
    if comm._checking and transport.prepare_ring_message is not None \
            and 0 <= dst < size and 0 <= src < size and rank not in (dst, src) \
            and mine.dtype.kind in NUMERIC and into.dtype.kind in NUMERIC:
        step = transport.prepare_ring_message(dst, src, mine.nbytes, into.nbytes,
                                              pair_kind(mine, into))
    if len(comm._small_calls) >= KINDS_KEPT:
        comm._small_calls.clear()
    kind = comm._small_calls[key] = None if step is None else (step,
                                                               MessageName(dst, 0, src, 0))
    return kind


def small_send(comm: Any, buf: numpy.ndarray, dst: Any) -> Any:
    """`comm.send(buf, dst)` by a readied step (`_step_message`): None, or GENERAL. The caller
    has seen that buf is a NumPy array of more than zero bytes."""
    if not buf.flags.c_contiguous:
        return GENERAL
    return None if _step_message(comm, ("send", dst, buf.dtype, buf.shape), buf, dst, None) \
        else GENERAL


def small_recv(comm: Any, buf: numpy.ndarray, src: Any) -> Any:
    """`comm.recv(buf, src)` by a readied step (`_step_message`): `buf`, or GENERAL. The caller
    has seen that buf is a NumPy array of more than zero bytes."""
    if not (buf.flags.c_contiguous and buf.flags.writeable):
        return GENERAL
    return buf if _step_message(comm, ("recv", src, buf.dtype, buf.shape), None, src, buf) \
        else GENERAL


def _step_message(comm: Any, key: tuple, mine: numpy.ndarray | None, peer: Any,
                  into: numpy.ndarray | None) -> bool:
    """The messages of one kind (`key`) with one `peer`, `mine` to it and `into` from it (one
    of them None for a send or a recv alone), by the step that the transport readied for
    that kind (`prepare_pair_message`, kept as the collectives' exchanges are): numbered,
    named and checked as `_pair_message` does. True once moved; False, nothing done, where
    there is no such step or the communicator's state asks for the general path.

    A message costs little but its Python, so what stays from call to call is found once per
    kind; the call's name for errors is made once too, and renumbered. At 8 B on 2 ranks on
    shm a sendrecv took 15.5-16.0 us before this function was written out (and the step's
    wait spun first), 10.6 after; a send and its recv took 40-41 us a way by the general
    path, 8.3 by a step (docs/performance.md, "Messages of one kind, written out"). The
    step's own call is written out too (no `_messages`, no `_flat`; `_failed` only where it
    raises): on the third machine, alternating, 4.04-4.27 us -> 3.67-3.76, MPICH's 2.50-2.63
    in the same jobs (`benchmarks.sendrecv -b 8 -e 8`).
    """
    transport = comm._transport
    if (type(peer) is not int or transport.trace is not None
            or transport.on_transfer is not None or comm._broken is not None
            or transport.closed or comm._progress.outstanding and not comm._progress.on_thread()):
        return False
    kind = comm._small_calls.get(key, GENERAL)
    if kind is GENERAL:
        kind = _learn_pair(comm, key, mine, peer, into)
    if kind is None:
        return False
    step, name = kind
    counted = comm._messages
    name.sent = n_sent = 0 if mine is None else counted.sent[peer] + 1
    name.received = n_expected = 0 if into is None else counted.received[peer] + 1
    transport.begin(name, None, key[0])
    try:  # (`_messages` and `_flat`, written out)
        moved = step(mine if mine is None or mine.ndim == 1 else mine.reshape(-1),
                     into if into is None or into.ndim == 1 else into.reshape(-1),
                     n_sent, n_expected)
    except BaseException as error:
        raise _failed(comm, error)
    if moved is False:
        return False
    if moved is not True:  # the peer's words, which differ: raises
        said = pair_said(n_sent, n_expected, pair_kind(mine, into))[0]
        _messages(comm, lambda: judge_pair(transport, {peer: said}, {peer: moved}))
    if mine is not None:  # (`Messages.count`)
        counted.sent[peer] = n_sent
    if into is not None:
        counted.received[peer] = n_expected
    return True


def _learn_pair(comm: Any, key: tuple, mine: numpy.ndarray | None, peer: int,
                into: numpy.ndarray | None) -> tuple[Callable[..., Any], MessageName] | None:
    """The step the transport readies for a kind of checked message (`key`) with another
    rank, and the call's name, renumbered by each call; or None: unchecked, to itself or no
    rank, of no numbers, or none readied."""
    transport = comm._transport
    step = None
    if comm._checking and transport.prepare_pair_message is not None \
            and 0 <= peer < transport.size and peer != transport.rank \
            and all(buf.dtype.kind in NUMERIC for buf in (mine, into) if buf is not None):
        step = transport.prepare_pair_message(
            peer, None if mine is None else mine.nbytes, None if into is None else into.nbytes,
            pair_kind(mine, into))
    if len(comm._small_calls) >= KINDS_KEPT:
        comm._small_calls.clear()
    kind = comm._small_calls[key] = None if step is None else (step, MessageName(
        None if mine is None else peer, 0, None if into is None else peer, 0))
    return kind


def _pair_message(comm: Any, mine: numpy.ndarray, peer: int, into: numpy.ndarray) -> bool:
    """A sendrecv of the flat `mine` and `into` with one `peer` by the transport's shortest
    way (`pair_message`), numbered, named and checked as `Communicator._message` does; False,
    nothing done, where the transport has none for it (8 B on shm: 22 us by `_message`, 19
    this way; docs/performance.md, "Small calls")."""
    transport = comm._transport
    if transport.pair_message is None:
        return False
    counted = comm._messages  # (`Messages.describe`, for this one case)
    n_sent, n_expected = counted.sent[peer] + 1, counted.received[peer] + 1
    transport.begin(MessageName(peer, n_sent, peer, n_expected), phase="sendrecv")
    said, expected = pair_said(n_sent, n_expected, pair_kind(mine, into)) \
        if comm._checking else (None, None)
    moved = transport.pair_message(mine, peer, into, said, expected)
    if moved is False:
        return False
    if moved is not True:  # the peer's words, which differ: raises
        judge_pair(transport, {peer: said}, {peer: moved})
    counted.count(peer, peer)
    return True


def _flat(buf: numpy.ndarray) -> numpy.ndarray:
    """A contiguous `buf` as a flat view (itself when flat already: a view costs a message)."""
    return buf if buf.ndim == 1 else buf.reshape(-1)


# ---- what every lane shares ---------------------------------------------------------------

def _open(comm: Any, sendbuf: numpy.ndarray) -> bool:
    """Whether the lane may take a call on `sendbuf` now: contiguous, on a communicator in
    good order, not traced or watched, and nothing queued ahead of it (on the progress
    thread, its turn is now)."""
    transport = comm._transport
    return (transport.trace is None and transport.on_transfer is None and comm._broken is None
            and not transport.closed and sendbuf.flags.c_contiguous
            and (not comm._progress.outstanding or comm._progress.on_thread()))


def _learn(comm: Any, key: tuple, collective: str, sendbuf: numpy.ndarray,
           op: str | None = None, root: int = -1, moved: list[Moved] | None = None,
           reads: Reads | None = None) -> tuple[Any, bool, Any] | None:
    """What the lane keeps of a kind of call (`key`): its ufunc (None without an op), whether
    it averages, and its exchange, prepared with the descriptor but its number, what each
    call counts in `stats`, and which bytes of each input the lane takes (None: all; see
    `transport.prepare_all_inputs`). None until the general path has resolved the op for
    the dtype, and for a dtype the general path refuses: it raises."""
    dtype = sendbuf.dtype
    if op is not None:
        ufunc = comm._ufuncs.get((op, dtype))
        if ufunc is None:
            return None
    elif dtype.kind in NUMERIC:
        ufunc = None
    else:
        return None
    if len(comm._small_calls) >= KINDS_KEPT:
        comm._small_calls.clear()
    call = comm._descriptor(collective, sendbuf.size, dtype, op, root) \
        if comm._checking else None
    kind = comm._small_calls[key] = (ufunc, op == "avg", comm._transport.prepare_all_inputs(
        sendbuf.shape, dtype, collective, call, moved, reads))
    return kind


def _learn_scatter(comm: Any, key: tuple, root: int, block: tuple[int, ...],
                   dtype: numpy.dtype) -> _ScatterKind:
    """What the lane keeps of a kind of scatter (`key`, `_ScatterKind`): the exchange is
    prepared as the general path makes it (uncounted there: each block counts, in the
    exchange when inline, else as it moves), and the way is the general path's."""
    transport = comm._transport
    if len(comm._small_calls) >= KINDS_KEPT:
        comm._small_calls.clear()
    nbytes = math.prod(block) * dtype.itemsize
    way = INLINE if transport.size * nbytes <= inline_bytes(transport) else \
        ONE_SIDED if transport.one_sided else MESSAGES
    described = describe(block, None, dtype.str, transport.size)
    length = LENGTH.size + LENGTH.unpack_from(described)[0]
    publish = numpy.zeros(published_bytes(transport), numpy.uint8)  # (an offer of nothing)
    if transport.rank == root:
        publish[:described.size] = described
    call = comm._descriptor("scatter", -1, None, root=root) if comm._checking else None
    exchange = transport.prepare_all_inputs(
        publish.shape, publish.dtype, "scatter", call,
        _one_way(comm, root, nbytes, False) if way is INLINE else [])
    kind = comm._small_calls[key] = _ScatterKind(
        publish, described[:length].tobytes(), exchange, way, block, dtype, transport.rank,
        root, transport.size)
    return kind


def _exchange(comm: Any, exchange: Any, sendbuf: numpy.ndarray,
              into: Any | None = None) -> Any:
    """Number the call and make its exchange: every rank's input, in rank order; or, `into`
    given, the bytes this rank takes of each placed there (`transport.prepare_all_inputs`)."""
    comm._calls = number = comm._calls + 1
    try:
        return exchange(sendbuf, number, into)
    except CallsDiffer as differ:  # every rank raises it, and every message has landed
        raise MismatchError(comm._disagreement(differ.calls)) from None
    except BaseException as error:  # messages may be in flight: no more calls
        comm._break(error)
        raise


def _reduced(inputs: list[numpy.ndarray], ufunc: Any, average: bool, recvbuf: Any | None,
             shape: tuple[int, ...], dtype: numpy.dtype) -> numpy.ndarray:
    """The reduction of `inputs` in rank order, in `recvbuf`, or when None in a new array of
    `shape` and `dtype`: the one the ufunc makes for its result (an empty array given it as
    `out` costs a small call 0.6 us more), but where that would differ: a scalar for 0-d, a
    native-endian array for a dtype that is not."""
    if recvbuf is None and not (shape and dtype.isnative):
        recvbuf = numpy.empty(shape, dtype)
    return reduce_in_rank_order(numpy, inputs, ufunc, average, recvbuf)


def _own_reduced(inputs: list[numpy.ndarray], sendbuf: numpy.ndarray, rank: int, ufunc: Any,
                 average: bool, recvbuf: Any | None) -> numpy.ndarray:
    """`_reduced` of an exchange's `inputs` (or of the blocks this rank takes of them) with
    this rank's own, `sendbuf`, in its place (the exchange need not hold it: `with_own`), of
    sendbuf's shape and dtype; of two inputs, not averaged, in one call of the ufunc
    (`reduce_in_rank_order` for two): at 8 B each call of a function shows."""
    if recvbuf is None and not (sendbuf.ndim and sendbuf.dtype.isnative):  # (see _reduced)
        recvbuf = numpy.empty(sendbuf.shape, sendbuf.dtype)
    if average or len(inputs) > 2:
        return reduce_in_rank_order(numpy, with_own(numpy, inputs, sendbuf, rank, recvbuf),
                                    ufunc, average, recvbuf)
    if rank == 0:
        return ufunc(sendbuf, inputs[1], out=recvbuf)
    return ufunc(inputs[0], sendbuf, out=recvbuf)


def _fits(recvbuf: Any, shape: tuple[int, ...], dtype: numpy.dtype) -> bool:
    """Whether `recvbuf` takes the result as it is: a writeable NumPy array of `shape` and
    `dtype`. It may be the input, or overlap it, or be strided: the inputs are read out of the
    exchange's own memory, so writing the result cannot change them."""
    return (type(recvbuf) is numpy.ndarray  # (a dtype equal but not the same object, and
            and recvbuf.dtype is dtype  # anything else, goes the general path)
            and recvbuf.shape == shape and recvbuf.flags.writeable)


def _placed(result: numpy.ndarray, sendbuf: numpy.ndarray) -> bool:
    """Whether an exchange of `sendbuf` places the blocks it takes straight in `result`, where
    it may read them straight there: from PLACED_BYTES, into a contiguous result apart from
    `sendbuf` (which peers may read meanwhile)."""
    return sendbuf.nbytes >= PLACED_BYTES and result.flags.c_contiguous \
        and not overlap(result, sendbuf, numpy)


def _is_rank(comm: Any, root: Any) -> bool:
    return type(root) is int and 0 <= root < comm._transport.size


def _in_blocks(comm: Any, sendbuf: numpy.ndarray) -> bool:
    """Whether `sendbuf` holds one block per rank (else the general path says what is wrong)."""
    return sendbuf.ndim > 0 and sendbuf.shape[0] == comm._transport.size


def _one_way(comm: Any, root: int, nbytes: int, to_root: bool) -> list[Moved]:
    """What a rank counts of a collective whose every other rank sends `nbytes` to the root
    (`to_root`), or receives them from it: as gather.py and broadcast.py count."""
    rank, size = comm._transport.rank, comm._transport.size
    if rank == root:
        peers = [peer for peer in range(size) if peer != root]
        return [(0, -1, nbytes, peer) for peer in peers] if to_root else \
            [(nbytes, peer, 0, -1) for peer in peers]
    return [(nbytes, root, 0, -1)] if to_root else [(0, -1, nbytes, root)]


def _own_blocks(comm: Any, sendbuf: numpy.ndarray) -> Reads:
    """What a lane takes of each input to an exchange of `sendbuf`s of a block per rank: its
    own block (`own_blocks`)."""
    size = comm._transport.size
    return own_blocks(equal(sendbuf.size // size, size), comm._transport.rank,
                      sendbuf.itemsize)


def _up_the_ranks(comm: Any, nbytes: int) -> list[Moved]:
    """What a rank counts of a scan's one exchange: its input read by each rank above it, and
    each input read from the ranks below, as scan.py counts."""
    rank, size = comm._transport.rank, comm._transport.size
    return [(nbytes, peer, 0, -1) if peer > rank else (0, -1, nbytes, peer)
            for peer in range(size) if peer != rank]

