"""The public face of the engine: a `Communicator` over one transport.

It checks arguments, turns user arrays (any shape, any layout) into the flat contiguous
buffers the algorithms work on, and copies results back where they belong. The algorithms
themselves live one per module and see only the transport.

How calls fail. A bad argument raises before this rank sends anything. Before the data of a
call moves, the ranks check that they all made the same call (check.py); if not, every rank
raises `MismatchError`. After either, the communicator is as good as before. Any other failure
inside a collective (a timeout, a dead peer, an interrupt) may leave messages in flight, which
a later call could take for its own, so the communicator then refuses every later call.
"""

from __future__ import annotations

import functools
import math
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy

from transports.base import Stats, Transport
from transports.errors import (CallsDiffer, CollectiveError, InvalidArgumentError,
                               InvalidTypeError, MismatchError)

from .all_gather import ring_all_gather
from .all_reduce import auto_algorithm, one_shot_all_reduce, ring_all_reduce
from .arguments import check_blocks, check_buffers, check_root, check_writeable, output
from .arrays import flat_work
from .broadcast import ring_broadcast
from .check import agree, descriptor, disagreement
from .naive import naive_ring_all_reduce, reduce_broadcast_all_reduce
from .ops import resolve_op
from .reduce_scatter import ring_reduce_scatter
from .scatter import scatter_from_root

# The ways `all_reduce` can run besides "auto" (which picks one-shot or the ring by size); the
# naive ones are there to teach what the ring saves (naive.py).
ALL_REDUCE_ALGORITHMS = {"ring": ring_all_reduce, "one_shot": one_shot_all_reduce,
                         "naive_ring": naive_ring_all_reduce,
                         "reduce_broadcast": reduce_broadcast_all_reduce}
# Every call the check tells apart (check.py numbers them by their place here).
CALLS = ("all_reduce", "all_gather", "broadcast", "scatter", "reduce_scatter", "barrier",
         *(f"all_reduce/{name}" for name in ALL_REDUCE_ALGORITHMS))
_CALL_CODES = {name: code for code, name in enumerate(CALLS)}


def _collective(method: Callable[..., Any]) -> Callable[..., Any]:
    """Break the communicator when `method` fails once messages may be in flight.

    Bad arguments (ValueError, TypeError) are raised before anything is sent, or after what
    was sent has been drained (scatter), so they leave the communicator usable.
    """
    @functools.wraps(method)
    def call(self: Communicator, *args: Any, **kwargs: Any) -> Any:
        self._in_flight = False  # until `_begin` starts the exchanges
        try:
            return method(self, *args, **kwargs)
        except CallsDiffer as differ:  # every rank raises it, and every message has landed
            self._in_flight = False
            raise MismatchError(disagreement(differ.calls, self.rank, CALLS)) from None
        except BaseException as error:
            if self._in_flight and not isinstance(error, (ValueError, TypeError)):
                self._broken = f"{self._transport.where} failed ({type(error).__name__}: {error})"
            raise

    return call


class Communicator:
    """Collectives among `size` ranks over one transport. Use as a context manager.

    check: before the data of each call moves, check that every rank made the same call
        (collective, count, dtype, op, root; see check.py), at the cost of one exchange of six
        integers among the ranks; default on, `$RINGCC_CHECK=0` turns it off.
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
        if trace:
            transport.trace = []

    # ---- who we are ----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def size(self) -> int:
        return self._transport.size

    @property
    def transport(self) -> str:
        """The name of the transport in use: "mpi", "shm", "cuda_ipc" or "threads"."""
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
    def trace(self) -> Iterator[list[dict]]:
        """Record every transfer this rank makes inside the `with` block.

        Yields a list that fills with one dict per transfer: rank, kind ("copy" or "reduce"),
        where ("all_reduce #3"), phase, step, dst and send (offset, count), src and recv
        (offset, count), bytes sent. Tracing is off, and costs nothing, outside the block.
        """
        records: list[dict] = [] if self._transport.trace is None else self._transport.trace
        outer, self._transport.trace = self._transport.trace, records
        try:
            yield records
        finally:
            self._transport.trace = outer

    def empty(self, shape: int | tuple[int, ...], dtype: Any = numpy.float64) -> Any:
        """A new array that peers read in place (registered memory, as MPI_Win_allocate_shared
        and ncclMemAlloc give): a collective sending from it moves no staging copy. Any array
        works in every collective; these are faster on the shm transport, and ordinary
        arrays elsewhere. Collective: every rank asks for the same shape and dtype. The memory
        lasts until the communicator is closed and the array is dropped."""
        xp = self._transport.xp
        dtype = xp.dtype(dtype)
        if dtype.kind not in "biufc":
            raise InvalidTypeError(f"dtype {dtype} is not numeric; collectives move numbers "
                                   f"and bools")
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        if any(not isinstance(n, (int, numpy.integer)) or isinstance(n, bool) or n < 0
               for n in shape):
            raise InvalidArgumentError(f"shape {shape} must be whole numbers >= 0")
        if self._transport.closed:
            raise InvalidArgumentError("this communicator is closed")
        nbytes = math.prod(shape) * dtype.itemsize
        return self._transport.register(nbytes).view(dtype).reshape(shape)

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

    @_collective
    def all_reduce(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum",
                   algorithm: str = "auto") -> Any:
        """Reduce `sendbuf` over all ranks with `op`; every rank gets the same result.

        Returns `recvbuf` (allocated when None); `recvbuf is sendbuf` works in place. NaN
        propagates: under sum, prod and avg as in arithmetic, and min and max follow NumPy's
        `minimum` and `maximum`, which return NaN where either side is NaN. `algorithm`: "auto"
        (one-shot up to the transport's `one_shot_bytes`, else the ring), "ring", "one_shot",
        or one of the naive all-reduces kept to teach, "naive_ring" and "reduce_broadcast".
        """
        transport = self._transport
        xp = transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        ufunc = (self._ufuncs.get((op, sendbuf.dtype)) if isinstance(op, str) else None) \
            or self._resolve(op, sendbuf.dtype)
        if recvbuf is None:
            recvbuf, in_place = xp.empty(sendbuf.shape, sendbuf.dtype), False
        else:
            recvbuf = output(recvbuf, sendbuf.shape, sendbuf.dtype, xp)
            in_place = recvbuf is sendbuf or xp.may_share_memory(recvbuf, sendbuf)
            if in_place and recvbuf is not sendbuf:
                recvbuf[...] = sendbuf  # another view of the same memory: in place after all
        work, copied = flat_work(recvbuf, xp)
        # Out of place, the algorithm reads the input where it lies instead of copying it
        # into recvbuf first: a whole pass over memory saved.
        mine = None if in_place else flat_work(sendbuf, xp)[0]
        if algorithm == "auto":
            name, algorithm = "all_reduce", auto_algorithm(transport, work.nbytes)
        elif algorithm in ALL_REDUCE_ALGORITHMS:
            name = f"all_reduce/{algorithm}"
        else:
            raise InvalidArgumentError(f"unknown all_reduce algorithm {algorithm!r}; expected "
                                       f"auto or one of {', '.join(ALL_REDUCE_ALGORITHMS)}")
        # One-shot moves the data in one exchange, which carries the call check along.
        self._begin(name, sendbuf.size, sendbuf.dtype, op,
                    folded=algorithm == "one_shot" and work.size > 0)
        ALL_REDUCE_ALGORITHMS[algorithm](transport, work, ufunc, average=(op == "avg"),
                                         mine=mine)
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    @_collective
    def all_gather(self, sendbuf: Any, recvbuf: Any | None = None) -> Any:
        """Gather every rank's `sendbuf` on every rank: shape (size, *sendbuf.shape), rank order."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        recvbuf = output(recvbuf, (self.size, *sendbuf.shape), sendbuf.dtype, xp)
        work, copied = flat_work(recvbuf, xp)
        work.reshape(self.size, -1)[self.rank] = sendbuf.reshape(-1)
        self._begin("all_gather", sendbuf.size, sendbuf.dtype)
        ring_all_gather(self._transport, work)
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    @_collective
    def broadcast(self, buf: Any, root: int = 0) -> Any:
        """Copy the root's `buf` into `buf` on every rank (in place); returns `buf`."""
        xp = self._transport.xp
        check_buffers(xp, self.transport, buf)
        check_root(root, self.size)
        check_writeable(buf, "buf")
        work, copied = flat_work(buf, xp)
        self._begin("broadcast", buf.size, buf.dtype, root=root)
        ring_broadcast(self._transport, work, root)
        if copied:
            buf[...] = work.reshape(buf.shape)
        return buf

    @_collective
    def scatter(self, sendbuf: Any | None = None, recvbuf: Any | None = None,
                root: int = 0) -> Any:
        """Send block r of the root's `sendbuf` (shape (size, *block)) to rank r.

        `sendbuf` is ignored on other ranks; there `recvbuf` may be None, and the block's shape
        and dtype then come from the root. Returns `recvbuf`.
        """
        check_root(root, self.size)
        xp = self._transport.xp
        if sendbuf is not None or recvbuf is not None:
            check_buffers(xp, self.transport, *(b for b in (sendbuf, recvbuf) if b is not None))
        blocks = None
        if self.rank == root:
            if sendbuf is None:
                raise InvalidArgumentError(f"scatter: the root (rank {root}) must pass sendbuf")
            check_blocks("scatter", sendbuf, self.size)
            blocks = xp.ascontiguousarray(sendbuf)
            recvbuf = output(recvbuf, sendbuf.shape[1:], sendbuf.dtype, xp)
        elif recvbuf is not None:
            check_writeable(recvbuf, "recvbuf")
        copy_back = None

        def receive_into(shape: tuple[int, ...], dtype: Any) -> Any:
            nonlocal recvbuf, copy_back
            recvbuf = output(recvbuf, shape, dtype, xp)
            work, copied = flat_work(recvbuf, xp)
            copy_back = work if copied else None
            return work

        # Only the root surely knows the blocks' count and dtype: the check compares the root.
        self._begin("scatter", root=root)
        block = scatter_from_root(self._transport, blocks, root, receive_into)
        if self.rank == root:
            recvbuf[...] = block.reshape(recvbuf.shape)
        elif copy_back is not None:
            recvbuf[...] = copy_back.reshape(recvbuf.shape)
        return recvbuf

    @_collective
    def reduce_scatter(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum") -> Any:
        """Reduce `sendbuf` (shape (size, *block)) over ranks; rank r gets block r.

        NaN propagates as in `all_reduce`.
        """
        xp = self._transport.xp
        check_buffers(xp, self.transport, sendbuf, recvbuf)
        ufunc = resolve_op(op, sendbuf.dtype, xp)
        check_blocks("reduce_scatter", sendbuf, self.size)
        recvbuf = output(recvbuf, sendbuf.shape[1:], sendbuf.dtype, xp)
        mine = flat_work(sendbuf, xp)[0]
        work = xp.empty_like(mine)  # the chunks in flight; `mine` is only read
        self._begin("reduce_scatter", sendbuf.size, sendbuf.dtype, op)
        block = ring_reduce_scatter(self._transport, mine, work, ufunc, average=(op == "avg"))
        recvbuf[...] = block.reshape(recvbuf.shape)
        return recvbuf

    @_collective
    def barrier(self) -> None:
        """Return once every rank has called `barrier`."""
        self._begin("barrier")
        self._transport.barrier()

    def close(self) -> None:
        """Release the transport's resources. The communicator cannot be used afterwards."""
        self._transport.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Communicator rank {self.rank} of {self.size} over {self.transport}>"

    # ---- numbering and checking each call ------------------------------------------------

    def _begin(self, collective: str, count: int = -1, dtype: Any = None, op: str | None = None,
               root: int = -1, folded: bool = False) -> None:
        """Number the call, then check that every rank made the same one (see check.py):
        here, or, when `folded`, in the call's first exchange of small inputs."""
        transport = self._transport
        if transport.closed:
            raise InvalidArgumentError("this communicator is closed")
        if self._broken is not None:
            raise CollectiveError(f"rank {self.rank}: this communicator cannot be used since "
                                  f"{self._broken}; make a new one")
        self._calls += 1
        self._in_flight = True
        if not self._checking or transport.size == 1:
            transport.begin(f"{collective} #{self._calls}")
            return
        key = (collective, count, dtype, op, root)
        rest = self._descriptors.get(key)
        if rest is None:  # the same call again costs a lookup, not a description
            rest = self._descriptors[key] = descriptor(0, _CALL_CODES[collective], count, dtype,
                                                       op, root)[1:]
        call = (self._calls, *rest)
        transport.begin(f"{collective} #{self._calls}", call)
        if not folded:
            agree(transport)

    def _resolve(self, op: str, dtype: Any) -> Any:
        """`resolve_op`, remembered: a run of calls of one kind looks it up once."""
        ufunc = self._ufuncs[(op, dtype)] = resolve_op(op, dtype, self._transport.xp)
        return ufunc
