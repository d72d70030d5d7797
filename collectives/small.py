"""The small-call lane: a small blocking all-reduce of NumPy arrays, with nothing else.

A small all-reduce (a loss, a metric, a flag, a small gradient bucket) moves a few bytes, so
its cost is all overhead. The general path (`Communicator._all_reduce`, through the
`collective` decorator of calls.py) pays for everything any call might need: its turn on the
progress thread, torch tensors, any layout, any algorithm, tracing. It costs several times
what the exchange itself does.

So `Communicator.all_reduce` first offers a call to this lane, which takes it when it is the
common case: blocking, of a contiguous NumPy array no larger than the transport's
`one_shot_bytes`, with an op already resolved for that dtype, nothing queued, not traced. It
then does what the general path would do for that call, and only that:

1. number the call;
2. one exchange of every rank's input (`transport.all_inputs`), which carries the call's
   descriptor along with the data, so the check costs no exchange of its own and a mismatch
   still raises on every rank;
3. reduce every rank's input in rank order (((x0 op x1) op x2) ...), so the result is
   bitwise the general path's one-shot result, on every rank.

What it keeps per kind of call (op, dtype, shape) is the ufunc and the exchange, prepared
for that shape, dtype and descriptor (`transport.prepare_all_inputs`, as MPI's persistent
collectives are): a run of calls of one kind looks them up once, and each call only moves
its data. At a few bytes every lookup counts (README, "Against the shared-memory goals":
preparing the exchange took a third off an 8 B call). Anything else (a
strided input, a recvbuf of another shape or dtype, a first call of its kind, an async
call) goes the general path, which also raises the errors: the lane never decides what is
wrong, only what is plain.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from transports.base import Exchange
from transports.errors import CallsDiffer, MismatchError

from .all_reduce import reduce_in_rank_order

KINDS_KEPT = 64  # kinds of call remembered; more means a sweep of sizes, so start again


def small_all_reduce(comm: Any, sendbuf: numpy.ndarray, recvbuf: Any | None,
                     op: str) -> numpy.ndarray | None:
    """`comm.all_reduce(sendbuf, recvbuf, op)` by the lane, or None when the call needs the
    general path. The caller has seen that sendbuf is a NumPy array of at most
    `comm._small_bytes`, more than zero."""
    transport = comm._transport
    if (transport.trace is not None or transport.on_transfer is not None
            or comm._broken is not None or transport.closed or not sendbuf.flags.c_contiguous):
        return None
    kind = comm._small_calls.get((op, sendbuf.dtype, sendbuf.shape)) \
        if type(op) is str else None
    if kind is None:
        kind = _learn(comm, op, sendbuf.dtype, sendbuf.shape)
        if kind is None:
            return None
    if comm._progress.outstanding and not comm._progress.on_thread():
        return None  # its turn comes after the queued calls (on the progress thread: now)
    if recvbuf is not None and not _takes_result(recvbuf, sendbuf):
        return None
    ufunc, average, exchange = kind
    comm._calls = number = comm._calls + 1
    try:
        inputs = exchange(sendbuf, number)
    except CallsDiffer as differ:  # every rank raises it, and every message has landed
        raise MismatchError(comm._disagreement(differ.calls)) from None
    except BaseException as error:  # messages may be in flight: no more calls
        comm._break(error)
        raise
    if recvbuf is None and sendbuf.ndim == 0:  # a ufunc makes a 0-d result a scalar
        recvbuf = numpy.empty((), sendbuf.dtype)
    return reduce_in_rank_order(numpy, inputs, ufunc, average, recvbuf)


def _learn(comm: Any, op: Any, dtype: Any,
           shape: tuple[int, ...]) -> tuple[Any, bool, Exchange] | None:
    """What the lane keeps of an all-reduce of `shape`: its ufunc, whether it averages, and
    its exchange, prepared with the descriptor but its number (`transport.prepare_all_inputs`).
    None until the general path has resolved the op for the dtype (and so raised, for an op
    the dtype lacks)."""
    ufunc = comm._ufuncs.get((op, dtype)) if type(op) is str else None
    if ufunc is None:
        return None
    if len(comm._small_calls) >= KINDS_KEPT:
        comm._small_calls.clear()
    call = comm._descriptor("all_reduce", math.prod(shape), dtype, op) \
        if comm._checking else None
    kind = comm._small_calls[(op, dtype, shape)] = (
        ufunc, op == "avg", comm._transport.prepare_all_inputs(shape, dtype, "all_reduce", call))
    return kind


def _takes_result(recvbuf: Any, sendbuf: numpy.ndarray) -> bool:
    """Whether `recvbuf` takes the result as it is: a writeable NumPy array of sendbuf's shape
    and dtype. It may be sendbuf, or overlap it, or be strided: the inputs are read out of the
    exchange's own memory, so writing the result cannot change them."""
    if recvbuf is sendbuf:
        return sendbuf.flags.writeable
    return (type(recvbuf) is numpy.ndarray  # (a dtype equal but not the same object, and
            and recvbuf.dtype is sendbuf.dtype  # anything else, goes the general path)
            and recvbuf.shape == sendbuf.shape and recvbuf.flags.writeable)
