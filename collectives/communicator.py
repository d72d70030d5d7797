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
import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy

from transports.base import Stats, Transport
from transports.errors import (CollectiveError, InvalidArgumentError, InvalidTypeError,
                               MismatchError)

from .all_gather import ring_all_gather
from .all_reduce import all_reduce
from .broadcast import ring_broadcast
from .check import agree, descriptor
from .ops import resolve_op
from .reduce_scatter import ring_reduce_scatter
from .scatter import scatter_from_root


def array_module(buf: Any) -> ModuleType:
    """numpy or cupy, whichever `buf` belongs to; InvalidTypeError for anything else."""
    if isinstance(buf, numpy.ndarray):
        return numpy
    if type(buf).__module__.startswith("cupy"):
        import cupy

        return cupy
    raise InvalidTypeError(f"expected a NumPy or CuPy array, got {type(buf).__name__}")


def _flat_work(buf: Any, xp: ModuleType) -> tuple[Any, bool]:
    """A flat contiguous array sharing memory with `buf` if possible, else a copy.

    Returns (work, copied): when copied, the result must be written back into `buf`.
    """
    if buf.flags.c_contiguous:
        return buf.reshape(-1), False
    return xp.ascontiguousarray(buf).reshape(-1), True


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

    # ---- the collectives -----------------------------------------------------------------

    @_collective
    def all_reduce(self, sendbuf: Any, recvbuf: Any | None = None, op: str = "sum") -> Any:
        """Reduce `sendbuf` over all ranks with `op`; every rank gets the same result.

        Returns `recvbuf` (allocated when None); `recvbuf is sendbuf` works in place. NaN
        propagates: under sum, prod and avg as in arithmetic, and min and max follow NumPy's
        `minimum` and `maximum`, which return NaN where either side is NaN.
        """
        xp = self._module(sendbuf, recvbuf)
        ufunc = resolve_op(op, sendbuf.dtype, xp)
        recvbuf = self._output(recvbuf, sendbuf.shape, sendbuf.dtype, xp)
        in_place = recvbuf is sendbuf or xp.may_share_memory(recvbuf, sendbuf)
        if in_place and recvbuf is not sendbuf:
            recvbuf[...] = sendbuf  # another view of the same memory: in place after all
        work, copied = _flat_work(recvbuf, xp)
        # Out of place, the algorithm reads the input where it lies instead of copying it
        # into recvbuf first: a whole pass over memory saved.
        mine = None if in_place else _flat_work(sendbuf, xp)[0]
        self._begin("all_reduce", sendbuf.size, sendbuf.dtype, op)
        all_reduce(self._transport, work, ufunc, average=(op == "avg"), mine=mine)
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    @_collective
    def all_gather(self, sendbuf: Any, recvbuf: Any | None = None) -> Any:
        """Gather every rank's `sendbuf` on every rank: shape (size, *sendbuf.shape), rank order."""
        xp = self._module(sendbuf, recvbuf)
        recvbuf = self._output(recvbuf, (self.size, *sendbuf.shape), sendbuf.dtype, xp)
        work, copied = _flat_work(recvbuf, xp)
        work.reshape(self.size, -1)[self.rank] = sendbuf.reshape(-1)
        self._begin("all_gather", sendbuf.size, sendbuf.dtype)
        ring_all_gather(self._transport, work)
        if copied:
            recvbuf[...] = work.reshape(recvbuf.shape)
        return recvbuf

    @_collective
    def broadcast(self, buf: Any, root: int = 0) -> Any:
        """Copy the root's `buf` into `buf` on every rank (in place); returns `buf`."""
        xp = self._module(buf)
        self._check_root(root)
        self._check_writeable(buf, "buf")
        work, copied = _flat_work(buf, xp)
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
        self._check_root(root)
        xp = self._module(*(b for b in (sendbuf, recvbuf) if b is not None)) \
            if (sendbuf is not None or recvbuf is not None) else self._transport.xp
        blocks = None
        if self.rank == root:
            if sendbuf is None:
                raise InvalidArgumentError(f"scatter: the root (rank {root}) must pass sendbuf")
            if sendbuf.ndim < 1 or sendbuf.shape[0] != self.size:
                raise InvalidArgumentError(f"scatter: sendbuf must have shape ({self.size}, ...), "
                                           f"one block per rank; got {sendbuf.shape}")
            blocks = xp.ascontiguousarray(sendbuf)
            recvbuf = self._output(recvbuf, sendbuf.shape[1:], sendbuf.dtype, xp)
        elif recvbuf is not None:
            self._check_writeable(recvbuf, "recvbuf")
        copy_back = None

        def receive_into(shape: tuple[int, ...], dtype: Any) -> Any:
            nonlocal recvbuf, copy_back
            recvbuf = self._output(recvbuf, shape, dtype, xp)
            work, copied = _flat_work(recvbuf, xp)
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
        xp = self._module(sendbuf, recvbuf)
        ufunc = resolve_op(op, sendbuf.dtype, xp)
        if sendbuf.ndim < 1 or sendbuf.shape[0] != self.size:
            raise InvalidArgumentError(f"reduce_scatter: sendbuf must have shape ({self.size}, "
                                       f"...), one block per rank; got {sendbuf.shape}")
        recvbuf = self._output(recvbuf, sendbuf.shape[1:], sendbuf.dtype, xp)
        mine = _flat_work(sendbuf, xp)[0]
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
               root: int = -1) -> None:
        """Number the call, then check that every rank made the same one (see check.py)."""
        if self._transport.closed:
            raise InvalidArgumentError("this communicator is closed")
        if self._broken is not None:
            raise CollectiveError(f"rank {self.rank}: this communicator cannot be used since "
                                  f"{self._broken}; make a new one")
        self._calls += 1
        transport = self._transport
        transport.where = f"{collective} #{self._calls}"
        self._in_flight = True
        if self._checking and self.size > 1:
            mismatch = agree(transport, descriptor(self._calls, collective, count, dtype, op, root))
            if mismatch is not None:
                self._in_flight = False  # every rank stops here, and every message has landed
                raise MismatchError(mismatch)
        transport.phase, transport.step = "", 0  # until the algorithm names its own

    # ---- argument checks -----------------------------------------------------------------

    def _module(self, buf: Any, *others: Any) -> ModuleType:
        """The array module of `buf` and of the `others` that are not None: one module, the
        transport's, and numeric dtypes."""
        buffers = [buf, *(b for b in others if b is not None)]
        modules = {array_module(b) for b in buffers}
        if len(modules) > 1:
            raise InvalidTypeError("buffers mix NumPy and CuPy arrays; pass arrays of one kind")
        (xp,) = modules
        if xp is not self._transport.xp:
            raise InvalidTypeError(f"the {self.transport} transport moves "
                                   f"{self._transport.xp.__name__} arrays, got a {xp.__name__} "
                                   f"array")
        for b in buffers:
            if b.dtype.kind not in "biufc":
                raise InvalidTypeError(f"dtype {b.dtype} is not numeric; collectives move "
                                       f"numbers and bools")
        return xp

    def _output(self, buf: Any | None, shape: tuple[int, ...], dtype: Any,
                xp: ModuleType) -> Any:
        """Allocate the result array, or check that the caller's one fits."""
        if buf is None:
            return xp.empty(shape, dtype)
        if tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            raise InvalidArgumentError(f"recvbuf must have shape {tuple(shape)} and dtype "
                                       f"{xp.dtype(dtype)}; got shape {tuple(buf.shape)} and "
                                       f"dtype {buf.dtype}")
        self._check_writeable(buf, "recvbuf")
        return buf

    @staticmethod
    def _check_writeable(buf: Any, name: str) -> None:
        array_module(buf)
        if not getattr(buf.flags, "writeable", True):
            raise InvalidArgumentError(f"{name} is read-only")

    def _check_root(self, root: int) -> None:
        if (isinstance(root, bool) or not isinstance(root, (int, numpy.integer))
                or not 0 <= root < self.size):
            raise InvalidArgumentError(f"root {root!r} is not a rank in [0, {self.size})")
