"""What every call of a `Communicator` goes through (`collective`, its methods' decorator).

- Its turn: with `async_op=True`, or while earlier calls are still queued, the call goes to
  the communicator's progress thread (work.py) and the caller gets a `Work`, or waits for it.
- torch tensors become arrays that share their memory, and results come back as tensors.
- While tracing, the call's start and end are recorded for the timeline (timeline.py).
- How calls fail: a bad argument raises before this rank sends anything. Before the data of a
  call moves, the ranks check that they all made the same call (check.py); if not, every rank
  raises `MismatchError`. After either, the communicator is as good as before. Any other
  failure inside a call (a timeout, a dead peer, an interrupt) may leave messages in flight,
  which a later call could take for its own, so the communicator then refuses every later
  call.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from typing import Any, Callable

import numpy

from transports.errors import CallsDiffer, MismatchError

from .arrays import is_tensor, tensor_memory
from .check import MessagesDiffer
from .timeline import record_call
from .work import run_now


def collective(method: Callable[..., Any]) -> Callable[..., Any]:
    """Make `method` a collective call: in its turn, timed when tracing, and breaking the
    communicator when it fails once messages may be in flight.

    async_op=True queues the call on the progress thread and returns a `Work` (work.py); a
    blocking call made while others are queued queues behind them and waits. Bad arguments
    (ValueError, TypeError) are raised before anything is sent, or after what was sent has
    been drained (scatter), so they leave the communicator usable; so do the mismatches that
    the checks find before data moves (CallsDiffer, MessagesDiffer).
    """
    name = method.__name__.lstrip("_")  # `_all_reduce`, all_reduce's general path
    general = name != method.__name__
    async_call, queued_call = f"{name} (async call)", f"{name} (queued call)"  # (for `Work`)

    @functools.wraps(method)
    def call(self: Any, *args: Any, async_op: bool = False, **kwargs: Any) -> Any:
        if async_op or self._progress.outstanding:
            # In its turn, the call runs as its blocking form does: through the public method
            # (`all_reduce` for `_all_reduce`), whose small-call lane (small.py) it may take
            # there, else this same wrapper. (Its arguments come in the public order.)
            front = getattr(type(self), name, None) if general else None
            run = (lambda: front(self, *args, **kwargs)) if front is not None else \
                (lambda: call(self, *args, **kwargs))
            if not self._progress.on_thread():
                self._usable()  # refused here, as a blocking call is, with no thread started
                work = self._progress.submit(async_call if async_op else queued_call, run)
                return work if async_op else work.wait()
            if async_op:  # from a submitted function: its turn is now
                return run_now(async_call, run)
        self._in_flight = False  # until `_begin` starts the exchanges
        tensors: dict[int, Any] = {}  # id of the NumPy view -> the caller's torch tensor
        if _holds_tensor(args, kwargs):
            args, kwargs = _tensors_as_arrays(args, kwargs, tensors)
        trace = self._transport.trace
        start = time.perf_counter() if trace is not None else 0.0
        try:
            result = method(self, *args, **kwargs)
            return result if not tensors else _as_tensor(result, tensors)
        except CallsDiffer as differ:  # every rank raises it, and every message has landed
            self._in_flight = False
            raise MismatchError(self._disagreement(differ.calls)) from None
        except MessagesDiffer as differ:  # both ends raise it, having taken every message
            self._in_flight = False
            raise MismatchError(str(differ)) from None
        except BaseException as error:
            if self._in_flight and not isinstance(error, (ValueError, TypeError)):
                self._break(error)
            raise
        finally:
            if trace is not None:  # named by its number once `_begin` gave it one
                where = self._transport.where
                record_call(trace, where if where.startswith(name) else name, start,
                            time.perf_counter())

    signature = inspect.signature(method)
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(),
                    inspect.Parameter("async_op", inspect.Parameter.KEYWORD_ONLY,
                                      default=False, annotation="bool")],
        return_annotation=f"{signature.return_annotation} | Work")
    return call


def current_device(xp: Any) -> Callable[[], None] | None:
    """What makes the progress thread use this thread's GPU: CUDA's current device is per
    thread (None for NumPy)."""
    if xp is numpy:
        return None
    device = xp.cuda.Device()
    return device.use


def on_callers_stream(xp: Any) -> Callable[[Callable[[], Any]], Callable[[], Any]] | None:
    """What runs a call submitted to the progress thread on the CUDA stream current where it
    was submitted (None for NumPy). CuPy's current stream is per thread too, and the caller's
    kernels that write the call's inputs, and those that read its results, are ordered on
    the caller's: the transport's copies and reductions, and its synchronisations, must be
    on that one (as NCCL's kernels are on the stream it is given)."""
    if xp is numpy:
        return None

    def wrap(call: Callable[[], Any]) -> Callable[[], Any]:
        stream = xp.cuda.get_current_stream()

        def on_stream() -> Any:
            with stream:
                return call()
        return on_stream
    return wrap


def _holds_tensor(args: tuple, kwargs: dict) -> bool:
    """Whether any argument comes from torch: a plain loop, since every call, small ones too,
    asks (a generator over `is_tensor` costs twice as much)."""
    for value in args:
        if type(value).__module__[:5] == "torch":
            return True
    for value in kwargs.values():
        if type(value).__module__[:5] == "torch":
            return True
    return False


def _tensors_as_arrays(args: tuple, kwargs: dict, tensors: dict[int, Any]) -> tuple[tuple, dict]:
    """The call's torch tensors replaced by NumPy views of their memory (`tensor_memory`)."""
    def view(value: Any) -> Any:
        if not is_tensor(value):
            return value
        array = tensor_memory(value)
        tensors[id(array)] = value
        return array
    return tuple(view(a) for a in args), {k: view(v) for k, v in kwargs.items()}


def _as_tensor(result: Any, tensors: dict[int, Any]) -> Any:
    """The caller's tensor where the collective returns its view; a new result as a tensor that
    shares its memory (torch is loaded: the caller holds a tensor)."""
    if result is None or id(result) in tensors:
        return tensors.get(id(result))
    torch = sys.modules["torch"]
    return torch.from_numpy(result) if isinstance(result, numpy.ndarray) \
        else torch.from_dlpack(result)
