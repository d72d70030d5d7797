"""The public face of the engine: a `Communicator` over one transport.

It checks arguments, turns user arrays (any shape, any layout) into the flat contiguous
buffers the algorithms work on, and copies results back where they belong. The algorithms
themselves live one per module and see only the transport.

What every call goes through, its turn on the progress thread, torch tensors, the timeline
and how calls fail, is calls.py's `collective`, the decorator of every method here.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy

from transports.base import Reads, Stats, Transport
from transports.errors import (CollectiveError, InvalidArgumentError, InvalidTypeError,
                              MismatchError)

from .all_gather import one_shot_all_gather, ring_all_gather
from .all_reduce import (auto_algorithm, one_shot_all_reduce, reduce_scatter_all_gather,
                         ring_all_reduce)
from .all_to_all import one_shot_all_to_all, pairwise_all_to_all
from .arguments import check_buffers, check_root, check_writeable, output
from .arrays import flat_work, overlap, same_memory
from .blocks import check_counts, every_input, exchanged, gathered, own_blocks, split
from .broadcast import one_shot_broadcast, one_sided_broadcast, reads_from_root, ring_broadcast
from .calls import collective, current_device, on_callers_stream
from .check import LEFT_WAITING, MESSAGES, agree, descriptor, disagreement, pair_agree
from .gather import gather_to_root, one_shot_gather
from .hierarchical import hierarchical_all_reduce
from .naive import naive_ring_all_reduce, reduce_broadcast_all_reduce
from .ops import resolve_op
from .point_to_point import Messages, two_peers
from .reduce import one_shot_reduce, reduce_to_root
from .reduce_scatter import (one_shot_reduce_scatter, read_in_one_exchange,
                             ring_reduce_scatter, two_shot_reduce_scatter)
from .scan import finish, one_shot_scan, recursive_doubling_scan
from .scatter import scatter_from_root
from .small import (GENERAL, small_all_gather, small_all_reduce, small_all_to_all,
                    small_barrier, small_broadcast, small_gather, small_message, small_reduce,
                    small_recv, small_reduce_scatter, small_scan, small_scatter,
                    small_send, small_sendrecv)
from .timeline import Trace, record_span, write_timeline
from .two_shot import two_shot_all_reduce, two_shot_pays
from .work import Progress, Work

# The ways `all_reduce` can run besides "auto" (which picks one-shot or the ring by size, the
# hierarchical one on the hierarchical transport, or where ranks outnumber the cores the
# two-shot one or the reduce-scatter and all-gather exchanges: all_reduce.auto_algorithm);
# the naive ones are there to teach what the ring saves (naive.py).
ALL_REDUCE_ALGORITHMS = {"ring": ring_all_reduce, "one_shot": one_shot_all_reduce,
                         "naive_ring": naive_ring_all_reduce,
                         "reduce_broadcast": reduce_broadcast_all_reduce,
                         "hierarchical": hierarchical_all_reduce,
                         "two_shot": two_shot_all_reduce,
                         "reduce_scatter_all_gather": reduce_scatter_all_gather}
# The algorithms whose first move is an exchange (of every rank's input; the two-shot's, of
# where each rank's buffer lies), which carries the call check along (`_begin`'s `folded`).
FOLDED = ("one_shot", "reduce_scatter_all_gather", "two_shot")
# Every call the check tells apart (check.py numbers them by their place here). Point-to-point
# calls are checked by the two ranks they concern, not here (check.pair_agree).
CALLS = ("all_reduce", "all_gather", "broadcast", "scatter", "reduce_scatter", "barrier",
         "gather", "reduce", "all_to_all", "scan", "scan/exclusive",
         *(f"all_reduce/{name}" for name in ALL_REDUCE_ALGORITHMS), "empty")
_CALL_CODES = {name: code for code, name in enumerate(CALLS)}


class Communicator:
    """Collectives among `size` ranks over one transport. Use as a context manager.

    check: before the data of each call moves, check that every rank made the same call
        (collective, count, dtype, op, root; see check.py), at the cost of one exchange of six
        integers among the ranks; default on, `$RINGCC_CHECK=0` turns it off.
    trace: record every transfer, and every call's start and end, from the start (see
        `trace` and `write_timeline`).

    Every call takes `async_op=True`: it then returns a `Work` at once and runs in the
    background, in the order calls were made (work.py). Its buffers belong to it until
    `work.wait()` returns. Calls come from one thread at a time, as in MPI.
    """

    def __init__(self, transport: Transport, trace: bool = False,
                 check: bool | None = None) -> None:
        self._transport = transport
        self._calls = 0
        self._checking = check if check is not None else os.environ.get("RINGCC_CHECK") != "0"
        self._in_flight = False  # a collective has started to exchange messages
        self._broken: str | None = None  # why no more calls can be made, once one failed
        self._ufuncs: dict[tuple[str, Any], Any] = {}  # (op, dtype) -> ufunc, see `_resolve`
        self._descriptors: dict[tuple, tuple[int, ...]] = {}  # a call's descriptor but its seq
        self._messages = Messages(transport.rank, transport.size)  # point to point, numbered
        use_device = current_device(transport.xp)

        def prepare_progress() -> None:  # on the progress thread, before its first call
            transport.check_thread()
            if use_device is not None:
                use_device()
        self._progress = Progress(f"ringcc-progress-rank-{transport.rank}", prepare_progress,
                                  on_callers_stream(transport.xp), inline=transport.xp is numpy)
        # Calls up to this size may take the small-call lanes (small.py), which keep what
        # they know of each kind of call they have seen.
        self._small_bytes = transport.one_shot_bytes \
            if transport.xp is numpy and transport.size > 1 else 0
        self._small_calls: dict[tuple, tuple[Any, tuple, Any]] = {}
        self._lane_messages = transport.xp is numpy and transport.size > 1  # (at any size)
        if transport.size > 1:
            self._agree_on_checking()
        # What the caller's thread records into (spans, and `write_timeline`'s default): the
        # transport's own trace switches in turn with the queued calls (`trace`).
        self._recording: Trace | None = None
        if trace:
            transport.trace = self._recording = Trace()

    def _agree_on_checking(self) -> None:
        """Refuse, on every rank, ranks that differ on the call check (`check=`,
        `$RINGCC_CHECK`): a checking rank would make exchanges the others never join. One
        uncounted exchange of a flag, when the communicator is made. Collective."""
        xp = self._transport.xp
        said = self._transport.all_inputs(xp.array([self._checking], xp.uint8), counted=False)
        checking = [bool(int(flag[0])) for flag in said]
        if len(set(checking)) > 1:
            self._transport.close()
            raise InvalidArgumentError(
                "the call check must be on on every rank or off on every rank (check=, "
                "$RINGCC_CHECK); got, by rank: "
                + ", ".join(f"{r}: {'on' if on else 'off'}" for r, on in enumerate(checking)))

    # ---- who we are ----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def size(self) -> int:
        return self._transport.size

    @property
    def transport(self) -> str:
        """The name of the transport in use: "mpi", "shm", "cuda_ipc", "hierarchical" or
        "threads"."""
        return self._transport.name

    @property
    def device(self) -> str:
        """The arrays this communicator moves: "cpu" (NumPy) or "cuda" (CuPy)."""
        return "cpu" if self._transport.xp is numpy else "cuda"

    @property
    def timeout(self) -> float:
        """Seconds any wait may last before it raises `CollectiveTimeoutError`."""
        return self._transport.timeout

    @property
    def stats(self) -> Stats:
        """Bytes and messages this rank has moved; `comm.stats.reset()` starts again."""
        return self._transport.stats

    @contextmanager
    def trace(self) -> Iterator[Trace]:
        """Record every transfer this rank makes inside the `with` block.

        Yields a list that fills with one dict per transfer: rank, kind ("copy" or "reduce"),
        where ("all_reduce #3"), phase, step, dst and send (offset, count), src and recv
        (offset, count), bytes sent, and start and end (`time.perf_counter()`); its `calls`
        list gets each call's and each `span`'s row, name, start and end. Tracing is off,
        and costs nothing, outside the block. It starts and ends in turn with the calls
        queued on the progress thread: the calls queued before the block are not traced, and
        those made inside it, `async_op=True` ones too, are; the end of the block waits for
        them, so that its list is whole.
        """
        transport = self._transport
        outer = self._recording
        records = self._recording = Trace() if outer is None else outer

        def switch(to: Any) -> None:
            transport.trace = to
        if self._progress.outstanding and not self._progress.on_thread():
            self._progress.submit("trace", lambda: switch(records))  # (not waited for)
        else:
            switch(records)
        try:
            yield records
        finally:
            self._recording = outer
            self._in_turn(lambda: switch(outer))

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Mark the caller's own work inside the block ("backward") on the timeline, beside
        the calls; nothing when not tracing."""
        trace = self._recording
        start = time.perf_counter()
        try:
            yield
        finally:
            if trace is not None:
                record_span(trace, name, start, time.perf_counter())

    def write_timeline(self, path: str, records: Trace | None = None) -> None:
        """Write what every rank traced (default: since `init(trace=True)`, or in the current
        `trace` block) to `path` as Chrome trace-event JSON, for Perfetto or chrome://tracing:
        one process per rank, one row per phase. Collective: rank 0 gathers and writes, once
        the calls queued before it have run (their records are then whole)."""
        records = records if records is not None else self._recording
        if records is None:
            raise InvalidArgumentError("nothing traced: make the communicator with "
                                       "trace=True, or pass the records of a `trace` block")
        self._in_turn(lambda: write_timeline(self, path, records))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Work:
        """Run `fn(*args)` on the progress thread, after every call made before it; a `Work`
        for its result. The calls `fn` makes on this communicator run at once, in its turn:
        a step of several calls (a scale, then a reduction) queued as one."""
        self._usable()
        return self._progress.submit(f"submitted {getattr(fn, '__name__', 'function')}",
                                     lambda: fn(*args))

    def empty(self, shape: int | tuple[int, ...], dtype: Any = numpy.float64) -> Any:
        """A new array that peers read in place (registered memory, as MPI_Win_allocate_shared
        and ncclMemAlloc give): a collective sending from it moves no staging copy. Any array
        works in every collective; these are faster on the shm transport, and ordinary
        arrays elsewhere. Collective: every rank asks for the same shape and dtype (a rank
        that asks for another size, or whose arguments are refused, makes every rank raise).
        The memory lasts until the communicator is closed and the array is dropped."""
        try:
            dtype = self._transport.xp.dtype(dtype)
        except TypeError:
            dtype = None
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        if dtype is None or dtype.kind not in "biufc":
            refused: Exception | None = InvalidTypeError(
                f"dtype {dtype} is not numeric; collectives move numbers and bools")
        elif any(not isinstance(n, (int, numpy.integer)) or isinstance(n, bool) or n < 0
                 for n in shape):
            refused = InvalidArgumentError(f"shape {shape} must be whole numbers >= 0")
        else:
            refused = None
        nbytes = -1 if refused is not None else math.prod(shape) * dtype.itemsize
        return self._register(nbytes, refused).view(dtype).reshape(shape)

    @collective
    def _register(self, nbytes: int, refused: Exception | None) -> Any:
        """`empty`'s collective part: every rank's size (-1 where its arguments were refused)
        agreed in a checked exchange that times out, before the transport's allocation (on
        shm, MPI collectives that would wait for ever for a rank that never comes)."""
        transport = self._transport
        self._begin("empty", folded=True)
        sizes = [int(n) for n in transport.all_inputs(transport.xp.array(nbytes, "i8"),
                                                      counted=False)]
        if refused is not None:
            raise refused
        if len(set(sizes)) > 1:
            raise InvalidArgumentError(
                f"every rank must ask for registered memory of the same size; got, by rank: "
                f"{', '.join(map(str, sizes))} bytes"
                + (" (-1: its arguments were refused)" if -1 in sizes else ""))
        registered = transport.register(nbytes)
        # The lanes' exchanges were prepared for a transport without this memory: with it,
        # one may take another exchange (every rank drops them here, as it registers).
        self._small_calls.clear()
        return registered

    def zeros(self, shape: int | tuple[int, ...], dtype: Any = numpy.float64) -> Any:
        """`empty`, filled with zeros."""
        array = self.empty(shape, dtype)
        array[...] = 0
        return array

    def on_transfer(self, callback: Callable[[dict], None] | None) -> None:
        """Test hook: call `callback(record)` at each transfer this rank makes (the record a
        trace gets), or stop with None. Fault tests use it to fail a rank in mid-collective."""
        self._transport.on_transfer = callback

    # ---- the collectives -----------------------------------------------------------------

    def all_reduce(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
                   algorithm: str = "auto", *, async_op: bool = False) -> Any:
        """Reduce `sendbuf` over all ranks with `op`; every rank gets the same result.

        Returns `recvbuf` (allocated when None); `recvbuf is sendbuf` works in place. NaN
        propagates: under sum, prod and avg as in arithmetic, and min and max follow NumPy's
        `minimum` and `maximum`, which return NaN where either side is NaN. `algorithm`: "auto"
        (one-shot up to the transport's `one_shot_bytes`, else the ring, or on the
        hierarchical transport the hierarchical one, or on ranks that outnumber the cores the
        two-shot one or the reduce-scatter and all-gather exchanges), "ring", "one_shot",
        "hierarchical", "two_shot", "reduce_scatter_all_gather", or one of the naive
        all-reduces kept to teach, "naive_ring" and "reduce_broadcast".
        With `async_op=True` it returns a `Work` (see the class).
        """
        if (algorithm == "auto" and not async_op and type(sendbuf) is numpy.ndarray
                and 0 < sendbuf.nbytes <= self._small_bytes):  # `_small`, written out
            result = small_all_reduce(self, sendbuf, recvbuf, op)
            if result is not GENERAL:
                return result
        return self._all_reduce(sendbuf, recvbuf, op, algorithm, async_op=async_op)

    @collective
    def _all_reduce(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
                    algorithm: str = "auto") -> Any:
        """`all_reduce` by the general path: any array, any algorithm, any turn."""
        transport = self._transport
        xp = transport.xp
        check_buffers(xp, transport.name, sendbuf, recvbuf)
        ufunc = self._resolve(op, sendbuf.dtype)
        recvbuf, in_place = self._result(sendbuf, recvbuf)
        work, copied = flat_work(recvbuf, xp)
        # Out of place, the algorithm reads the input where it lies instead of copying it
        # into recvbuf first: a whole pass over memory saved.
        mine = None if in_place else flat_work(sendbuf, xp)[0]
        if algorithm == "auto":
            name, algorithm = "all_reduce", auto_algorithm(transport, work.size, work.itemsize)
        elif algorithm in ALL_REDUCE_ALGORITHMS:
            name = f"all_reduce/{algorithm}"
        else:
            raise InvalidArgumentError(f"unknown all_reduce algorithm {algorithm!r}; expected "
                                       f"auto or one of {', '.join(ALL_REDUCE_ALGORITHMS)}")
        # One-shot moves the data in one exchange, which carries the call check along, as
        # the reduce-scatter and all-gather exchanges' first does.
        self._begin(name, sendbuf.size, sendbuf.dtype, op,
                    folded=algorithm in FOLDED and work.size > 0)
        ALL_REDUCE_ALGORITHMS[algorithm](transport, work, ufunc, average=(op == "avg"),
                                         mine=mine)
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    def all_gather(self, sendbuf: Any, recvbuf: Any | None = None, counts: Any | None = None,
                   *, async_op: bool = False) -> Any:
        """Gather every rank's `sendbuf` on every rank: shape (size, *sendbuf.shape), rank order.

        counts: uneven blocks, flat (MPI's Allgatherv; blocks.py): rank r sends counts[r]
        elements, and every rank gets all of them in rank order.
        """
        if counts is None and (not async_op and type(sendbuf) is numpy.ndarray  # (`_small`)
                               and 0 < sendbuf.nbytes <= self._small_bytes
                               or self._read_in_place(sendbuf, async_op, 1)):
            result = small_all_gather(self, sendbuf, recvbuf)
            if result is not GENERAL:
                return result
        return self._all_gather(sendbuf, recvbuf, counts, async_op=async_op)

    @collective
    def _all_gather(self, sendbuf: Any, recvbuf: Any | None = None,
                    counts: Any | None = None) -> Any:
        """`all_gather` by the general path."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        counts, bounds, shape = gathered("all_gather", counts, sendbuf, self.size, self.rank)
        recvbuf = output(recvbuf, shape, sendbuf.dtype, xp)
        work, copied = flat_work(recvbuf, xp)
        if counts is None and self._one_shot(sendbuf, every_input(sendbuf.nbytes, self.size)):
            # Small equal blocks, or any read in place: one exchange, which carries the call
            # check along.
            self._begin("all_gather", sendbuf.size, sendbuf.dtype, folded=True)
            one_shot_all_gather(self._transport, flat_work(sendbuf, xp)[0], work, bounds)
        else:
            work[slice(*bounds[self.rank])] = sendbuf.reshape(-1)
            self._begin("all_gather", bounds[-1][1] if counts else sendbuf.size, sendbuf.dtype,
                        counts=counts)
            ring_all_gather(self._transport, work, bounds)
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    def gather(self, sendbuf: Any, recvbuf: Any | None = None, root: int = 0,
               counts: Any | None = None, *, async_op: bool = False) -> Any | None:
        """Gather every rank's `sendbuf` at `root`: shape (size, *sendbuf.shape), block r from
        rank r. Returns it at the root and None elsewhere, where `recvbuf` is ignored (as in
        MPI). In place at the root (MPI_IN_PLACE): pass its own block of `recvbuf` as `sendbuf`.

        counts: uneven blocks, flat (MPI's Gatherv; blocks.py): rank r sends counts[r]
        elements, and the root gets all of them in rank order.
        """
        if counts is None and self._small(sendbuf, async_op):
            result = small_gather(self, sendbuf, recvbuf, root)
            if result is not GENERAL:
                return result
        return self._gather(sendbuf, recvbuf, root, counts, async_op=async_op)

    @collective
    def _gather(self, sendbuf: Any, recvbuf: Any | None = None, root: int = 0,
                counts: Any | None = None) -> Any | None:
        """`gather` by the general path."""
        xp = self._transport.xp
        check_root(root, self.size)
        recvbuf = recvbuf if self.rank == root else None
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        counts, bounds, shape = gathered("gather", counts, sendbuf, self.size, self.rank)
        mine = flat_work(sendbuf, xp)[0]
        work = copied = None
        if self.rank == root:
            recvbuf = output(recvbuf, shape, sendbuf.dtype, xp)
            work, copied = flat_work(recvbuf, xp)
            if same_memory(mine, work[slice(*bounds[root])], xp):
                mine = None  # in place: the root's block is already where it belongs
        if counts is None and self._one_shot(sendbuf):
            # Small equal blocks: one exchange, which carries the call check along.
            self._begin("gather", sendbuf.size, sendbuf.dtype, root=root, folded=True)
            one_shot_gather(self._transport, mine, work, bounds, root)
        else:
            self._begin("gather", bounds[-1][1] if counts else sendbuf.size, sendbuf.dtype,
                        root=root, counts=counts, first_exchange=True)
            gather_to_root(self._transport, mine, work, bounds, root)
            self._transport.checked()
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    def reduce(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum", root: int = 0,
               *, async_op: bool = False) -> Any | None:
        """Reduce `sendbuf` over all ranks with `op` into `recvbuf` (allocated when None) at
        `root`. Returns it at the root and None elsewhere, where `recvbuf` is ignored (as in
        MPI). `recvbuf is sendbuf` at the root works in place. NaN propagates as in
        `all_reduce`.
        """
        if self._small(sendbuf, async_op):
            result = small_reduce(self, sendbuf, recvbuf, op, root)
            if result is not GENERAL:
                return result
        return self._reduce(sendbuf, recvbuf, op, root, async_op=async_op)

    @collective
    def _reduce(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
                root: int = 0) -> Any | None:
        """`reduce` by the general path."""
        xp = self._transport.xp
        check_root(root, self.size)
        recvbuf = recvbuf if self.rank == root else None
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        ufunc = self._resolve(op, sendbuf.dtype)
        copied = False
        one_shot = self._one_shot(sendbuf)
        if self.rank == root:
            recvbuf, in_place = self._result(sendbuf, recvbuf)
            work, copied = flat_work(recvbuf, xp)
            mine = work if in_place else flat_work(sendbuf, xp)[0]
        else:
            mine = flat_work(sendbuf, xp)[0]
            work = None if one_shot else xp.empty_like(mine)  # the chunks in flight
        if one_shot:  # a small buffer: one exchange, which carries the call check along
            self._begin("reduce", sendbuf.size, sendbuf.dtype, op, root, folded=True)
            one_shot_reduce(self._transport, mine, work, ufunc, root, average=(op == "avg"))
        else:
            self._begin("reduce", sendbuf.size, sendbuf.dtype, op, root)
            reduce_to_root(self._transport, mine, work, ufunc, root, average=(op == "avg"))
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    def broadcast(self, buf: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Copy the root's `buf` into `buf` on every rank (in place); returns `buf`."""
        if not async_op and type(buf) is numpy.ndarray \
                and 0 < buf.nbytes <= self._small_bytes or self._one_sided(buf, async_op):
            result = small_broadcast(self, buf, root)  # (`_small`, written out)
            if result is not GENERAL:
                return result
        return self._broadcast(buf, root, async_op=async_op)

    @collective
    def _broadcast(self, buf: Any, root: int = 0) -> Any:
        """`broadcast` by the general path."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, buf)
        check_root(root, self.size)
        check_writeable(buf, "buf")
        work, copied = flat_work(buf, xp)
        if self._one_shot(buf):  # small: one exchange, which carries the call check along
            self._begin("broadcast", buf.size, buf.dtype, root=root, folded=True)
            one_shot_broadcast(self._transport, work, root)
        elif reads_from_root(self._transport, buf.nbytes):  # (its exchange carries the check)
            self._begin("broadcast", buf.size, buf.dtype, root=root, folded=True)
            one_sided_broadcast(self._transport, work, root)
        else:
            self._begin("broadcast", buf.size, buf.dtype, root=root)
            ring_broadcast(self._transport, work, root)
        if copied:
            buf[...] = work.reshape(buf.shape)
        return buf

    def scatter(self, sendbuf: Any | None = None, recvbuf: Any | None = None, root: int = 0,
                counts: Any | None = None, *, async_op: bool = False) -> Any:
        """Send block r of the root's `sendbuf` (shape (size, *block)) to rank r.

        `sendbuf` is ignored on other ranks; there `recvbuf` may be None, and the block's shape
        and dtype then come from the root. Returns `recvbuf`. counts: uneven blocks, flat
        (MPI's Scatterv; blocks.py): rank r gets counts[r] elements.
        """
        # At any size: the lane's exchange is the blocks' description, and the blocks move as
        # the general path moves them (docs/performance.md, "Middle sizes"), while its Python before
        # that exchange cost a 2 MiB scatter on 2 ranks a fifth of its time.
        if counts is None and self._small_bytes \
                and self._lane_message(sendbuf if self.rank == root else recvbuf, async_op):
            result = small_scatter(self, sendbuf, recvbuf, root)
            if result is not GENERAL:
                return result
        return self._scatter(sendbuf, recvbuf, root, counts, async_op=async_op)

    @collective
    def _scatter(self, sendbuf: Any | None = None, recvbuf: Any | None = None,
                 root: int = 0, counts: Any | None = None) -> Any:
        """`scatter` by the general path."""
        check_root(root, self.size)
        xp = self._transport.xp
        if sendbuf is not None or recvbuf is not None:
            check_buffers(xp, self.transport, *(b for b in (sendbuf, recvbuf) if b is not None))
        flat = bounds = shape = None
        if self.rank == root:
            if sendbuf is None:
                raise InvalidArgumentError(f"scatter: the root (rank {root}) must pass sendbuf")
            counts, bounds, shapes = split("scatter", counts, sendbuf, self.size)
            flat, shape = flat_work(sendbuf, xp)[0], shapes[root]
            recvbuf = output(recvbuf, shape, sendbuf.dtype, xp)
        else:
            counts = None if counts is None else check_counts(counts, self.size)
            if recvbuf is not None:
                check_writeable(recvbuf, "recvbuf")
        copy_back = None

        def receive_into(shape: tuple[int, ...], dtype: Any) -> Any:
            nonlocal recvbuf, copy_back
            recvbuf = output(recvbuf, shape, dtype, xp)
            work, copied = flat_work(recvbuf, xp)
            # The root writes its block while peers may still read theirs: not over them.
            if flat is not None and not copied and overlap(work, sendbuf, xp):
                work, copied = xp.empty_like(work), True
            copy_back = work if copied else None
            return work

        # Only the root surely knows the blocks' dtype, and their count unless `counts` says:
        # the check compares the rest, in the exchange that describes the blocks.
        self._begin("scatter", sum(counts) if counts else -1, root=root, counts=counts,
                    folded=True)
        scatter_from_root(self._transport, flat, bounds, shape, counts, root, receive_into)
        if copy_back is not None:
            recvbuf[...] = copy_back.reshape(recvbuf.shape)
        return recvbuf

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
                       counts: Any | None = None, *, async_op: bool = False) -> Any:
        """Reduce `sendbuf` (shape (size, *block)) over ranks; rank r gets block r.

        NaN propagates as in `all_reduce`. counts: uneven blocks, flat (MPI's Reduce_scatter;
        blocks.py): rank r gets the counts[r] elements of block r.
        """
        if counts is None and (self._small(sendbuf, async_op)
                               or self._lane_message(sendbuf, async_op)
                               and read_in_one_exchange(self._transport, sendbuf.nbytes)):
            result = small_reduce_scatter(self, sendbuf, recvbuf, op)
            if result is not GENERAL:
                return result
        return self._reduce_scatter(sendbuf, recvbuf, op, counts, async_op=async_op)

    @collective
    def _reduce_scatter(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
                        counts: Any | None = None) -> Any:
        """`reduce_scatter` by the general path."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        ufunc = self._resolve(op, sendbuf.dtype)
        counts, bounds, shapes = split("reduce_scatter", counts, sendbuf, self.size)
        shape = shapes[self.rank]
        recvbuf = output(recvbuf, shape, sendbuf.dtype, xp)
        mine = flat_work(sendbuf, xp)[0]
        if counts is None and (self._one_shot(sendbuf)
                               or read_in_one_exchange(self._transport, sendbuf.nbytes)):
            # Small equal blocks (or where ranks outnumber the cores, larger ones read in
            # place): one exchange, which carries the call check along.
            out, copied = flat_work(recvbuf, xp)
            self._begin("reduce_scatter", sendbuf.size, sendbuf.dtype, op, folded=True)
            one_shot_reduce_scatter(self._transport, mine, ufunc, op == "avg", bounds, out)
            if copied:
                recvbuf[...] = out.reshape(recvbuf.shape)
            return recvbuf
        if two_shot_pays(self._transport, [(hi - lo) * mine.itemsize for lo, hi in bounds]):
            # Where ranks outnumber the cores: every block under way at once (reduce_scatter.py).
            out, copied = flat_work(recvbuf, xp)
            if xp.may_share_memory(out, mine):  # (a peer may still be reading it)
                out, copied = xp.empty_like(out), True
            self._begin("reduce_scatter", sendbuf.size, sendbuf.dtype, op, counts=counts)
            two_shot_reduce_scatter(self._transport, mine, out, ufunc, op == "avg", bounds)
            if copied:
                recvbuf[...] = out.reshape(recvbuf.shape)
            return recvbuf
        work = xp.empty_like(mine)  # the chunks in flight; `mine` is only read
        # The last step reduces straight into recvbuf: no copy after. Not when recvbuf
        # overlaps the input, which is still being read then; nor while tracing, so that
        # every traced offset indexes the one buffer that the explainer and the schedule
        # tests replay (the same messages move either way).
        out, copied = flat_work(recvbuf, xp)
        if self._transport.trace is not None or xp.may_share_memory(out, mine):
            out = copied = None
        self._begin("reduce_scatter", sendbuf.size, sendbuf.dtype, op, counts=counts)
        block = ring_reduce_scatter(self._transport, mine, work, ufunc, average=(op == "avg"),
                                    bounds=bounds, out=out)
        if out is None or copied:
            recvbuf[...] = block.reshape(recvbuf.shape)
        return recvbuf

    def all_to_all(self, sendbuf: Any, recvbuf: Any | None = None, counts: Any | None = None,
                   *, async_op: bool = False) -> Any:
        """Send block j of `sendbuf` (shape (size, *block)) to rank j; block i of the result
        came from rank i. `recvbuf is sendbuf` works in place (at the cost of a copy of the
        input).

        counts: uneven blocks, flat (MPI's Alltoallv; blocks.py): a `size` x `size` matrix,
        rank i sending counts[i][j] elements to rank j, or `size` numbers, rank j getting
        counts[j] elements from each rank.
        """
        if counts is None and (self._small(sendbuf, async_op)
                               or self._read_in_place(sendbuf, async_op, self.size)):
            result = small_all_to_all(self, sendbuf, recvbuf)
            if result is not GENERAL:
                return result
        return self._all_to_all(sendbuf, recvbuf, counts, async_op=async_op)

    @collective
    def _all_to_all(self, sendbuf: Any, recvbuf: Any | None = None,
                    counts: Any | None = None) -> Any:
        """`all_to_all` by the general path."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        counts, send_bounds, recv_bounds, shape, total = exchanged(counts, sendbuf, self.size,
                                                                   self.rank)
        recvbuf = output(recvbuf, shape, sendbuf.dtype, xp)
        work, copied = flat_work(recvbuf, xp)
        mine = flat_work(sendbuf, xp)[0]
        transport = self._transport
        if counts is None and self._one_shot(
                sendbuf, own_blocks(send_bounds, self.rank, sendbuf.itemsize)):
            # Small equal blocks, or any read in place: one exchange, which carries the call
            # check along. (Whether a rank traces never changes the way: ranks may differ in
            # it. The explainer shows the pairwise steps with one_shot_bytes=0.)
            self._begin("all_to_all", total, sendbuf.dtype, folded=True)
            one_shot_all_to_all(transport, mine, work, send_bounds)
        else:
            if xp.may_share_memory(mine, work):
                mine = mine.copy()  # in place: blocks land where others are yet to leave
            self._begin("all_to_all", total, sendbuf.dtype, counts=counts, first_exchange=True)
            pairwise_all_to_all(transport, mine, work, send_bounds, recv_bounds)
            transport.checked()
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    def scan(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
             exclusive: bool = False, *, async_op: bool = False) -> Any:
        """Rank r gets `op` over the `sendbuf`s of ranks 0..r (MPI_Scan), or with `exclusive`
        of ranks 0..r-1 (MPI_Exscan), where rank 0 gets the op's identity: 0 for sum and avg,
        1 for prod, the dtype's largest value for min and its smallest for max (MPI leaves it
        undefined). "avg" divides by the number of ranks reduced. Returns `recvbuf`
        (allocated when None); `recvbuf is sendbuf` works in place.
        """
        if self._small(sendbuf, async_op):
            result = small_scan(self, sendbuf, recvbuf, op, exclusive)
            if result is not GENERAL:
                return result
        return self._scan(sendbuf, recvbuf, op, exclusive, async_op=async_op)

    @collective
    def _scan(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
              exclusive: bool = False) -> Any:
        """`scan` by the general path."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        ufunc = self._resolve(op, sendbuf.dtype)
        recvbuf, in_place = self._result(sendbuf, recvbuf)
        work, copied = flat_work(recvbuf, xp)
        name = "scan/exclusive" if exclusive else "scan"
        transport = self._transport
        if self._one_shot(sendbuf):
            # Small: one exchange, which carries the call check along (and publishes the
            # input before the result is written, so in place needs no copy). The explainer
            # shows the doubling steps with one_shot_bytes=0.
            self._begin(name, sendbuf.size, sendbuf.dtype, op, folded=True)
            # (In place, `work` holds the input: `_result` copied it over a recvbuf that
            # overlaps sendbuf, and sendbuf may be half overwritten by it.)
            one_shot_scan(transport, work if in_place else flat_work(sendbuf, xp)[0], work,
                          ufunc, exclusive)
        else:
            # In place, the input is kept apart: each step sends this rank's own input again.
            mine = work.copy() if in_place else flat_work(sendbuf, xp)[0]
            self._begin(name, sendbuf.size, sendbuf.dtype, op)
            recursive_doubling_scan(transport, mine, work, xp.empty_like(work), ufunc,
                                    exclusive)
        finish(xp, work, op, self.rank, exclusive)
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    def barrier(self, *, async_op: bool = False) -> Any:
        """Return once every rank has called `barrier`."""
        if async_op or small_barrier(self) is GENERAL:
            return self._barrier(async_op=async_op)
        return None

    @collective
    def _barrier(self) -> None:
        """`barrier` by the general path."""
        self._begin("barrier")
        if not self._checking or self.size == 1:
            # (With the check on, its exchange was the barrier: every rank waited there for
            # every other's descriptor, which each gives as it enters.)
            self._transport.barrier()

    # ---- point to point ------------------------------------------------------------------

    def send(self, buf: Any, dst: int, *, async_op: bool = False) -> None:
        """Send `buf` (read flat) to rank `dst`, which takes it with `recv` or `sendrecv`.

        With the call check on, the two ranks first compare what one sends and the other
        expects (check.pair_agree): a different count or dtype, or two ranks that both send
        to (or both receive from) each other, raises MismatchError on both before any data
        moves, and a send returns only once its receiver has come (as MPI_Ssend). Without
        it, a transport finds a wrong size where it can (shm, threads), and the mpi transport
        raises a CollectiveError, from MPI's own, for a message longer than its receive buffer.
        """
        if self._lane_message(buf, async_op) and (
                small_send(self, buf, dst) is not GENERAL
                or small_message(self, buf, dst, None, None) is not GENERAL):
            return None
        return self._send(buf, dst, async_op=async_op)

    @collective
    def _send(self, buf: Any, dst: int) -> None:
        """`send` by the general path."""
        self._pair(buf, dst, None, None)

    def recv(self, buf: Any, src: int, *, async_op: bool = False) -> Any:
        """Receive what rank `src` sends into `buf` (filled flat); returns `buf`. See `send`."""
        if self._lane_message(buf, async_op):
            result = small_recv(self, buf, src)
            if result is GENERAL:
                result = small_message(self, None, None, buf, src)
            if result is not GENERAL:
                return result
        return self._recv(buf, src, async_op=async_op)

    @collective
    def _recv(self, buf: Any, src: int) -> Any:
        """`recv` by the general path."""
        return self._pair(None, None, buf, src)

    def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any | None = None,
                 src: int | None = None, *, async_op: bool = False) -> Any:
        """Send `sendbuf` to `dst` while receiving into `recvbuf` from `src` (default: `dst`),
        both at once, so ranks that all send and receive never wait on each other. `recvbuf`
        None: a new array like `sendbuf`; `recvbuf` may be `sendbuf` itself, or share its
        memory: what is sent is then `sendbuf` as the call found it (MPI_Sendrecv_replace).
        Returns `recvbuf`. A rank that names itself as both `dst` and `src` copies. See `send`
        for the check.
        """
        src = dst if src is None else src
        if self._lane_message(sendbuf, async_op):
            result = small_sendrecv(self, sendbuf, dst, recvbuf, src)
            if result is GENERAL:
                result = small_message(self, sendbuf, dst, recvbuf, src)
            if result is not GENERAL:
                return result
        return self._sendrecv(sendbuf, dst, recvbuf, src, async_op=async_op)

    @collective
    def _sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any | None, src: int) -> Any:
        """`sendrecv` by the general path."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        if recvbuf is None:
            recvbuf = xp.empty(sendbuf.shape, sendbuf.dtype)
        return self._pair(sendbuf, dst, recvbuf, src)

    def wait_all(self) -> None:
        """Wait until every call made so far has run; the progress thread then ends, until the
        next `async_op` call starts it again. It raises none of their errors (unlike
        MPI_Waitall): each stays with its `Work`, whose `wait()` raises it."""
        if self._progress.on_thread():
            raise InvalidArgumentError("wait_all and close wait for the progress thread: call "
                                       "them from the thread that made the calls")
        self._progress.close()

    def close(self) -> None:
        """Wait for the calls still queued, then release the transport's resources. The
        communicator cannot be used afterwards."""
        self.wait_all()
        self._small_calls.clear()  # their prepared exchanges hold views of the transport's memory
        self._transport.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[1] is not None and self._progress.outstanding \
                and not self._progress.on_thread():
            # Left by an error with calls still queued, which the peers may never join:
            # waiting for them would hold the error back for the whole timeout. No more
            # calls instead; the queued ones end with their timeout, or with the job.
            self._broken = (f"the with block was left by {type(exc_info[1]).__name__} with "
                            f"calls still queued")
            return
        self.close()

    def __repr__(self) -> str:
        return f"<Communicator rank {self.rank} of {self.size} over {self.transport}>"

    # ---- preparing, numbering and checking each call ----------------------------------------

    def _result(self, sendbuf: Any, recvbuf: Any | None) -> tuple[Any, bool]:
        """The result array of a call whose result has sendbuf's shape, and whether it works in
        place: `recvbuf` checked, or a new array. A recvbuf that is another view of sendbuf's
        memory takes sendbuf's values first, so the call works in place after all."""
        xp = self._transport.xp
        if recvbuf is None:
            return xp.empty(sendbuf.shape, sendbuf.dtype), False
        recvbuf = output(recvbuf, sendbuf.shape, sendbuf.dtype, xp)
        in_place = overlap(recvbuf, sendbuf, xp)
        if in_place and recvbuf is not sendbuf:
            recvbuf[...] = sendbuf
        return recvbuf, in_place

    def _pair(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
              src: int | None) -> Any:
        """Send `sendbuf` to `dst` and receive `recvbuf` from `src` (either side None), checked
        by the pair and numbered per peer (point_to_point.py); returns `recvbuf`."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, *(b for b in (sendbuf, recvbuf) if b is not None))
        if self._messages.check(sendbuf, dst, recvbuf, src):
            recvbuf[...] = sendbuf.reshape(recvbuf.shape)
            return recvbuf
        mine = None if sendbuf is None else flat_work(sendbuf, xp)[0]
        into, copied = (None, False) if recvbuf is None else flat_work(recvbuf, xp)
        if mine is not None and into is not None and xp.may_share_memory(mine, into):
            mine = mine.copy()  # in place: what arrives lands where the message is yet to leave
        received = None if src is None else self._messages.received[src]
        try:
            self._message(mine, dst, into, src)
        except MismatchError:
            # (A sendrecv whose recv agreed and moved, while its send's pair differed.)
            if copied and self._messages.received[src] != received:
                recvbuf[...] = into.reshape(recvbuf.shape)
            raise
        if copied:
            recvbuf[...] = into.reshape(recvbuf.shape)
        return recvbuf

    def _message(self, mine: Any | None, dst: int | None, into: Any | None,
                 src: int | None) -> None:
        """Move the flat `mine` to `dst` and into the flat `into` from `src` (either None):
        numbered per peer, and checked by the pair before the data moves (with two peers,
        half by half: `two_peers`). What `_pair` does once the arguments are known good, and
        the small-call lane too (small.py)."""
        transport = self._transport
        where, said = self._messages.describe(mine, dst, into, src)
        self._usable()
        self._in_flight = True
        transport.begin(where, phase="send" if src is None else "recv" if dst is None
                        else "sendrecv")
        if self._checking and len(said) == 2:
            two_peers(transport, said, mine, dst, into, src, self._messages.count)
            return
        transport.message(mine, dst, into, src,
                          (lambda: pair_agree(transport, said)) if self._checking else None)
        self._messages.count(dst, src)

    def _in_turn(self, call: Callable[[], Any]) -> Any:
        """`call()`, after the calls queued before it (at once when none are)."""
        if self._progress.outstanding and not self._progress.on_thread():
            return self._progress.submit("a queued call", call).wait()
        return call()

    def _disagreement(self, calls: list[tuple[int, ...]]) -> str:
        """What this rank says when ranks made the calls `calls` (check.py's descriptors). A
        peer in a send or a recv made no collective call, so this rank's call takes back its
        number: the next collective of both has the same one. Where the transport does not
        answer every rank of the collective for it (`answers_messages_met`), on more than 2
        ranks, the communicator cannot go on."""
        said = disagreement(calls, self.rank, CALLS)
        if any(call[0] == MESSAGES for call in calls):
            self._calls -= 1
            if self.size > 2 and not self._transport.answers_messages_met:
                said += LEFT_WAITING.replace("this rank", "the rank in a message")
                self._broken = f"{self._transport.where} failed (MismatchError: {said})"
        return said

    def _usable(self) -> None:
        """Refuse a closed or broken communicator."""
        if self._transport.closed:
            raise InvalidArgumentError("this communicator is closed")
        if self._broken is not None:
            raise CollectiveError(f"rank {self.rank}: this communicator cannot be used since "
                                  f"{self._broken}; make a new one")

    def _one_shot(self, sendbuf: Any, reads: Reads | None = None) -> bool:
        """Whether a call on `sendbuf` (equal blocks) takes one exchange: on two or more ranks,
        up to `one_shot_bytes`, as the small all-reduce does; or, unless that is 0 (never), at
        any size where the transport reads in place what each rank takes (`reads`: an
        all-to-all's or an all-gather's, which place it where it belongs)."""
        most = self._transport.one_shot_bytes
        return self.size > 1 and 0 < sendbuf.nbytes and (
            sendbuf.nbytes <= most or most > 0 and reads is not None
            and self._transport.reads_in_place(reads, sendbuf.nbytes))

    def _begin(self, collective: str, count: int = -1, dtype: Any = None, op: str | None = None,
               root: int = -1, folded: bool = False, counts: tuple | None = None,
               first_exchange: bool = False) -> None:
        """Number the call, then check that every rank made the same one (see check.py):
        here; when `folded`, in the call's first exchange of small inputs, which carries the
        descriptor; with `first_exchange`, handed to `transport.check_first`, which may make
        it inside the call's first exchange (the caller then calls `transport.checked()`)."""
        transport = self._transport
        self._usable()
        self._calls += 1
        self._in_flight = True
        if not self._checking or transport.size == 1:
            transport.begin(f"{collective} #{self._calls}")
            return
        call = (self._calls, *self._descriptor(collective, count, dtype, op, root, counts))
        transport.begin(f"{collective} #{self._calls}", call)
        if first_exchange:
            transport.check_first(lambda: agree(transport))
        elif not folded:
            agree(transport)

    def _descriptor(self, collective: str, count: int, dtype: Any, op: str | None = None,
                    root: int = -1, counts: tuple | None = None) -> tuple[int, ...]:
        """The call's descriptor (check.py) but its number: the same call again costs a
        lookup, not a description."""
        key = (collective, count, dtype, op, root, counts)
        rest = self._descriptors.get(key)
        if rest is None:
            rest = self._descriptors[key] = descriptor(0, _CALL_CODES[collective], count, dtype,
                                                       op, root, counts)[1:]
        return rest

    def _break(self, error: BaseException) -> None:
        """No more calls: `error` stopped a call whose messages may still be in flight."""
        self._broken = f"{self._transport.where} failed ({type(error).__name__}: {error})"

    def _resolve(self, op: str, dtype: Any) -> Any:
        """`resolve_op`, remembered: a run of calls of one kind looks it up once, and the
        small-call lane (small.py) finds it there."""
        ufunc = self._ufuncs.get((op, dtype)) if isinstance(op, str) else None
        if ufunc is None:
            ufunc = self._ufuncs[(op, dtype)] = resolve_op(op, dtype, self._transport.xp)
        return ufunc

    def _small(self, buf: Any, async_op: bool) -> bool:
        """Whether a call on `buf` may take the small-call lane (small.py): blocking, on a
        NumPy array of at most `one_shot_bytes` (none on one rank), more than zero."""
        return not async_op and type(buf) is numpy.ndarray and 0 < buf.nbytes <= self._small_bytes

    def _read_in_place(self, buf: Any, async_op: bool, blocks: int) -> bool:
        """Whether an all-to-all (`blocks`: the number of ranks, each taking one block of each
        input) or an all-gather (1: each input whole) on `buf`, larger than `_small`, may take
        its lane (small.py) all the same: where the transport reads what each rank takes in
        place at any size (a reduce-scatter's caller asks `read_in_one_exchange`, which asks
        the same of its blocks). The general path then makes the lane's one exchange too
        (`_one_shot`), and the Python around it, paid at any size,
        is felt most where ranks outnumber the cores: each rank waits for every other twice a
        call (docs/performance.md, "Large calls in the lane, and copies read directly on shared
        cores")."""
        if not (self._lane_messages and not async_op and type(buf) is numpy.ndarray
                and buf.nbytes > 0 and self._transport.one_shot_bytes > 0):
            return False
        block = buf.nbytes // blocks
        return self._transport.reads_in_place(((0, block),) * self.size, buf.nbytes)

    def _one_sided(self, buf: Any, async_op: bool) -> bool:
        """Whether a broadcast of `buf`, larger than `_small`, takes its lane all the same:
        where it goes one-sided (`reads_from_root`), its one exchange says where the root's
        buffer lies, and the lane prepares that as it does the others (small.py). The general
        path's Python around it is felt where ranks outnumber the cores, as `_read_in_place`
        says."""
        return self._lane_messages and not async_op and type(buf) is numpy.ndarray \
            and reads_from_root(self._transport, buf.nbytes)

    def _lane_message(self, buf: Any, async_op: bool) -> bool:
        """Whether a message of `buf` may take the small-call lane (small.py), whatever its
        size: blocking, on a NumPy array of more than zero bytes, on a transport of NumPy
        arrays with more than one rank. A lane's message makes the general path's own
        moves, or the transport's shortest way (a pair's messages read in place on shm)."""
        return self._lane_messages and not async_op and type(buf) is numpy.ndarray \
            and buf.nbytes > 0

