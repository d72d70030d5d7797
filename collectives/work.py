"""Non-blocking calls: a `Work` for each, run in order on one progress thread per communicator.

`comm.all_reduce(x, async_op=True)` returns a `Work` at once, as torch.distributed's
`async_op=True` returns a `Work` and mpi4py's `Iallreduce` a `Request`; `work.wait()` returns
what the blocking call would have returned, or raises what it raised.

Why one thread, and in order. Every rank must make the same calls in the same order (that is
what a collective is), and the transports move one call's messages at a time. A queue that a
single thread empties keeps both: calls run exactly in the order they were made, whichever
order they are waited on in. A blocking call made while calls are outstanding takes its place
in the same queue and waits for its turn, so it cannot overtake them either. The thread starts
with the first non-blocking call, so a program that never makes one never has it.

A waiter that finds its call still queued, with nothing running, runs the calls up to its
own itself, in order, instead of waiting for the thread to wake (`Progress.run_here`): waking a
thread and handing it the call cost an 8 B all-reduce made with `async_op=True` and waited for
at once 96 us here, where the call itself takes 8. The thread still takes every call that
nobody waits for, so a call overlaps the caller's work as before.

Buffers belong to the call until its `wait` returns (as in MPI): change or read them before,
and the result is undefined.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import time
from typing import Any, Callable

from transports.errors import CollectiveError, CollectiveTimeoutError, InvalidArgumentError


class Work:
    """A call that runs in the background; `wait()` for its result."""

    def __init__(self, what: str) -> None:
        self.what = what  # the call, for messages: "all_reduce (async call)"
        self.started: float | None = None  # time.perf_counter() when it began to run
        self.finished: float | None = None  # ... and when it ended
        # Held until the call has run. A plain lock, not an Event: waking a waiter through
        # it takes a few microseconds, through an Event's condition several times that.
        self._running = threading.Lock()
        self._running.acquire()
        self._done = False
        self._progress: Progress | None = None  # where it is queued
        self._result: Any = None
        self._error: BaseException | None = None

    def wait(self, timeout: float | None = None) -> Any:
        """Return the call's result once it has run, or raise its error. `timeout`: seconds
        to wait at most before raising `CollectiveTimeoutError` (the call goes on)."""
        self._await(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self) -> bool:
        """Whether the call has run (successfully or not); never blocks."""
        return self._done

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the call as `wait` does; return the error it raised, or None if it
        succeeded (as concurrent.futures' `Future.exception`)."""
        self._await(timeout)
        return self._error

    def _await(self, timeout: float | None) -> None:
        if self._done:
            return
        progress = self._progress
        if progress is not None and progress.on_thread():
            # From a submitted function: the thread would wait for a call queued behind
            # the one it runs, that is, for itself, for ever.
            raise InvalidArgumentError(f"{self.what} is queued behind the call that waits for "
                                       f"it, on the same progress thread: wait for it after "
                                       f"that call has returned")
        if timeout is None and progress is not None:  # (with a timeout, it must stay free)
            while not self._done and progress.run_here():
                pass
        if not self._running.acquire(timeout=-1 if timeout is None else timeout):
            raise CollectiveTimeoutError(f"{self.what} did not complete within {timeout:g} s")
        self._running.release()  # for any other waiter

    @property
    def seconds(self) -> float:
        """How long the call ran (0 until it has)."""
        if self.started is None or self.finished is None:
            return 0.0
        return self.finished - self.started

    def _run(self, call: Callable[[], Any]) -> None:
        """Run `call` and keep its outcome; `_finish` then wakes the waiters."""
        self.started = time.perf_counter()
        try:
            self._result = call()
        except BaseException as error:  # noqa: BLE001 - raised again by `wait`
            error.add_note(f"raised by {self.what}")
            self._error = error
        self.finished = time.perf_counter()

    def _finish(self) -> None:
        self._done = True
        self._running.release()

    def __repr__(self) -> str:
        state = "failed" if self._error else "completed" if self.is_completed() else "pending"
        return f"<Work {self.what}: {state}>"


class Progress:
    """The progress thread of one communicator: runs submitted calls one at a time, in order.

    The calls wait in a queue; the thread is woken once per call (a token), and takes the
    next call whenever none is running. A waiter may take it instead (`run_here`), where
    `inline`: the thread then finds it gone, or running, and waits for the next token. A
    blocking call may run on its caller's thread in its turn (`call_in_turn`), as the torch
    backend's do.
    """

    def __init__(self, name: str, prepare: Callable[[], None] | None = None,
                 in_callers_context: Callable[[Callable[[], Any]], Callable[[], Any]] | None
                 = None, inline: bool = True) -> None:
        self._name = name
        self._prepare = prepare  # run first on the thread (e.g. CUDA's current device)
        self._in_callers_context = in_callers_context  # wraps each call where it is submitted
        self._inline = inline  # whether a waiter may run queued calls itself (`run_here`)
        # Whether `prepare` has run, and well, on the thread: until then, calls wait for it
        # (where it failed, every call raises that, as the thread runs it).
        self._ready = prepare is None
        self._calls: collections.deque[tuple[Work, Callable[[], Any]]] = collections.deque()
        self._tokens: queue.SimpleQueue[bool | None] = queue.SimpleQueue()  # None: stop
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._running = False  # a call is running, on the thread or on a waiter's
        # The thread's identity, and that of the waiter running a call, if any: every call
        # asks which thread it is on (`on_thread`), and `threading.get_ident` answers in a
        # third of `current_thread`'s time (66 ns against 185 here).
        self._serving: int | None = None
        self._helper: int | None = None
        # Calls submitted and not yet run: while there are any, a new call queues behind them.
        self.outstanding = 0

    def on_thread(self) -> bool:
        """Whether the caller is running a call in its turn: the progress thread itself, or a
        waiter running a queued call (a call from a submitted function runs at once)."""
        current = threading.get_ident()
        return current == self._serving or current == self._helper

    def submit(self, what: str, call: Callable[[], Any]) -> Work:
        """Queue `call` behind every call submitted before it; a `Work` for its outcome."""
        if self._in_callers_context is not None:
            call = self._in_callers_context(call)
        work = Work(what)
        work._progress = self
        with self._lock:
            self.outstanding += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name,
                                                daemon=True)
                self._thread.start()
                self._serving = self._thread.ident
            self._calls.append((work, call))
        self._tokens.put(True)
        return work

    def call_in_turn(self, what: str, call: Callable[[], Any]) -> Any:
        """Run `call` on this thread in its turn, as a blocking call, and return what it
        returns: at once where no call is queued or running (counted as outstanding and
        running meanwhile, so that calls made on other threads queue behind it), or where the
        caller runs a call in its turn already (`on_thread`); else queued behind the others
        and waited for (`submit`), as on a GPU communicator, whose calls run on the thread.
        (Unlike `run_here`, it need not wait for the thread's preparation: it runs no call of
        the thread's, and the thread may never have started.)"""
        if self.on_thread():
            return call()
        with self._lock:
            free = self._inline and not self._running and not self._calls
            if free:
                self._running, self._helper = True, threading.get_ident()
                self.outstanding += 1
        if not free:
            return self.submit(what, call).wait()
        try:
            return call()
        finally:
            with self._lock:
                self._running, self._helper = False, None
                self.outstanding -= 1
            if self._calls:  # queued meanwhile: the thread found this one running
                self._tokens.put(True)

    def run_here(self) -> bool:
        """Run the next queued call on this thread, if none is running: True if one ran. A
        waiter calls it until its own call has run, so the calls still run one at a time and
        in order. Not where `inline` is off (a GPU's calls run on the progress thread, whose
        device and stream are set for them), nor before the thread is ready."""
        if not (self._inline and self._ready):
            return False
        if not self._run_next(threading.get_ident()):
            return False
        if self._calls:  # (the thread may have woken for it while it ran here, and gone back)
            self._tokens.put(True)
        return True

    def _run_next(self, helper: int | None,
                  failed: BaseException | None = None) -> bool:
        """Run the next queued call here (on the thread; on a waiter's, `helper`), if none is
        running: True if one ran. Where the thread could not start (`failed`), the call
        raises that."""
        with self._lock:
            if self._running or not self._calls:
                return False
            work, call = self._calls.popleft()
            self._running, self._helper = True, helper
        try:
            work._run(call if failed is None else _raiser(failed))
        finally:
            with self._lock:  # before waking the waiter, whose next call may then run inline
                self._running, self._helper = False, None
                self.outstanding -= 1
            work._finish()
        return True  # (the call's buffers are the caller's again: none is held here)

    def close(self) -> None:
        """Run what is queued, then stop the thread. Safe to call twice."""
        thread = self._thread
        if thread is None:
            return
        self._tokens.put(None)
        thread.join()  # still `_thread` meanwhile: the queued calls must know they are on it
        with self._lock:
            self._thread = self._serving = None

    def _serve(self) -> None:
        failed: BaseException | None = None
        if self._prepare is not None:
            try:
                self._prepare()
                self._ready = True
            except BaseException as error:  # noqa: BLE001 - every call then raises it
                failed = error
        while True:
            token = self._tokens.get()
            while self._run_next(None, failed):
                pass
            if token is None:
                with self._lock:
                    if not self._running and not self._calls:
                        return
                os.sched_yield()  # a waiter still runs one: its calls are queued before the stop
                self._tokens.put(None)


def run_now(what: str, call: Callable[[], Any]) -> Work:
    """`call` run here and now, as a completed `Work`: an async call made on the progress
    thread itself (from a submitted function) is already in its turn, and queueing it there
    would have it wait for the very call that waits for it."""
    work = Work(what)
    work._run(call)
    work._finish()
    return work


def _raiser(error: BaseException) -> Callable[[], Any]:
    """A call that raises its own error, caused by `error` (each call's carries its own
    note of which call it was)."""
    def call() -> Any:
        raise CollectiveError(f"the progress thread could not start: {error}") from error
    return call
