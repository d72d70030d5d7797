"""The seam between algorithms and transports.

An algorithm sees a transport as a handful of neighbour operations on flat, contiguous
arrays: exchange (`sendrecv`), receive-and-reduce (`sendrecv_reduce`), `send`, `recv`, a send
left for its receiver (`isend`), a ring all-reduce's two middle steps (`reduce_forward`),
every rank's input (`all_inputs`), `barrier` and `close`. It never learns how the bytes move.
A transport never learns which collective it serves.

The public methods here validate their arguments once, count bytes, record a trace when one
is asked for, and skip empty transfers (both sides agree a chunk is empty, so neither posts a
message). Each transport overrides the raw moves `_sendrecv` and `_barrier`, and where it has
a shorter way, the defaults written here in the plain way: `_sendrecv_reduce` (receive into
bounded scratch, then reduce), `_all_inputs` (the call's descriptor, then copies with every
peer, in `_exchange`), `_isend` and `sends_ahead`, `recv_while`, `message`, `reduce_forward`,
and the hooks `alongside`, `_send_reduced`, `check_first` and `checked`, `register`,
`pair_message`, `prepare_pair_message`, `check_thread`; and `say_pairs`, a message check's
words, which each transport says its own way (all in docs/architecture.md, "Adding a
transport").
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any, Callable

import numpy

from .errors import (CallsDiffer, CollectiveError, CollectiveTimeoutError, InvalidArgumentError,
                     MismatchError)

# A reduction is a binary ufunc of the array module: op(mine, incoming, out=acc).
ReduceOp = Callable[..., Any]
# A prepared all_inputs (`Transport.prepare_all_inputs`): exchange(buf, number) -> inputs, or
# exchange(buf, number, into), the bytes taken of rank r's input placed in block r of `into`
# (or in `into` whole, where it holds one block: `place`).
Exchange = Callable[..., Any]
# What one transfer of a collective counts in `stats`: (bytes sent, to, bytes received, from).
Moved = tuple[int, int, int, int]
# Which bytes of each rank's input a rank takes out of an exchange, per rank: [lo, hi).
Reads = tuple[tuple[int, int], ...]

DEFAULT_SEGMENT_BYTES = 1 << 20
CALL_WORDS = 6  # a call's descriptor: six non-negative integers (collectives/check.py)
# What each rank's one-shot exchange says beside its data (slots.py's call lines, mpi.py's
# headers): the call's descriptor, zeros when no call is checked, then the input's size.
CALL_LINE = struct.Struct(f"{CALL_WORDS + 1}Q")
NO_CALL = (0,) * CALL_WORDS
# The first word of a point-to-point check's six integers, never a call number: a rank in a
# collective tells a message's check from a call's by it (collectives/check.py).
MESSAGES = 1 << 62
DEFAULT_TIMEOUT_S = 300.0


def swapped_dtypes(dtypes: int) -> int:
    """A point-to-point check's dtypes word (sent << 32 | expected) as its peer says it."""
    return (dtypes & 0xFFFFFFFF) << 32 | dtypes >> 32


def ring_kinds(kind: tuple[int, int, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A sendrecv's description with two peers (`check.pair_kind`: counts sent and expected,
    and the dtypes word) as its two halves: a send alone, and a recv alone."""
    c_sent, c_expected, dtypes = kind
    return (c_sent, 0, dtypes >> 32 << 32), (0, c_expected, dtypes & 0xFFFFFFFF)


# What a half of a ring step has heard from its peer (`ring_step`): nothing yet, the words of
# a readied step (which takes our message without us), or those of a message that goes the
# general way (which moves ours only as this rank sends it).
SILENT, READIED, GENERAL_WAY = 0, 1, 2
Half = tuple[Callable[..., Any], Callable[..., Any], Callable[..., int]]
# A peer's words of a message's check, once come (`Transport.say_pairs`).
Heard = Callable[[int], tuple[int, ...] | None]


def ring_step(dst: int, sending: Half, src: int, receiving: Half,
              wait: Callable[..., None], stale: Callable[[], bool] = lambda: False
              ) -> Callable[..., Any]:
    """A transport's readied step for a sendrecv with two peers (`prepare_ring_message`), made
    of the halves of its steps for one (`publish`, `finish`, and `spoken`, which says without
    waiting what the peer's words of a turn are: SILENT, READIED or GENERAL_WAY; a send alone
    to `dst`, a recv alone from `src`), both published before either is finished, so that
    ranks that all send and receive at once never wait on each other. `wait(ready, peer,
    what)` is the transport's wait. `step(mine, into, n_sent, n_expected)`: True once both
    have moved; else each peer's words, or True for a half that agreed and moved, by peer;
    False, having done nothing, while `stale()`.

    Which half is finished first depends on who has spoken. No fixed order is safe: finishing
    the send first deadlocks a ring whose messages are read in place, since a send left in
    place is finished once `dst` has read it, which `dst` does in finishing its own recv.
    Finishing the recv first deadlocks a pipeline. There `dst` receives the general way and
    then sends to `src`, which sends to us only then, while a general-way message moves only
    as its sender sends it. So the step waits until either peer has spoken. It finishes the
    recv first if `src` has spoken, or if `dst` takes our message by a readied step (reading
    or copying it without us). It finishes the send first where `dst` takes it the general
    way."""
    (publish_out, finish_out, spoken_out), (publish_in, finish_in, spoken_in) = sending, receiving

    def step(mine: Any, into: Any, n_sent: int,
             n_expected: int) -> bool | dict[int, bool | tuple[int, ...]]:
        if stale():
            return False
        out, come = publish_out(mine, n_sent, 0), publish_in(None, 0, n_expected)
        answered: tuple[list[int], list[int]] = ([], [])  # (a peer's collective answered)

        def send_first() -> bool | None:
            """None until either peer has spoken; then whether the send goes first."""
            if spoken_in(0, n_expected, come, answered[1]) != SILENT:
                return False
            way = spoken_out(n_sent, 0, out, answered[0])
            return None if way == SILENT else way == GENERAL_WAY
        chosen = [send_first()]
        if chosen[0] is None:
            def either_spoken() -> bool:
                chosen[0] = send_first()
                return chosen[0] is not None
            wait(either_spoken, src, "a message")
        if chosen[0]:
            sent = finish_out(mine, None, n_sent, 0, out)
            received = finish_in(None, into, 0, n_expected, come)
        else:
            received = finish_in(None, into, 0, n_expected, come)
            sent = finish_out(mine, None, n_sent, 0, out)
        return True if sent is True and received is True else {dst: sent, src: received}
    return step


def call_line(call: tuple[int, ...] | None, nbytes: int) -> memoryview:
    """A call's `CALL_LINE` (its descriptor, or NO_CALL, then `nbytes`), writable, as 8-byte
    words: lines are compared whole, and two lines of words compare in a third of the time
    that two of bytes take."""
    return memoryview(bytearray(CALL_LINE.pack(*(call or NO_CALL), nbytes))).cast("Q")


@dataclass
class Stats:
    """Bytes and messages this rank moved since the last reset (empty transfers not counted)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0  # point-to-point sends requested by the algorithms
    # Of those bytes, the ones to and from ranks on other nodes (`Transport.off_node`).
    inter_node_bytes_sent: int = 0
    inter_node_bytes_received: int = 0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


def kept(cache: dict, key: Any, most: int, make: Callable[[], Any]) -> Any:
    """`cache[key]`, made by `make()` the first time it is asked for; a cache that holds `most`
    starts again (a sweep of sizes). What small calls keep: per kind, what a call of it needs
    that does not depend on its data."""
    value = cache.get(key)
    if value is None:
        if len(cache) >= most:
            cache.clear()
        value = cache[key] = make()
    return value


def place(inputs: list[Any], reads: Reads | None, into: Any) -> None:
    """Fill the contiguous array `into` with the bytes `reads[r]` of inputs[r] (all of them
    where `reads` is None), in its block r: `into` holds a block per rank of the length that
    every read names which is not empty (they are alike; an empty one leaves its block as it
    is), or, where one read only is not empty (a broadcast's), that one block. An exchange
    given `into` does this (`Transport.prepare_all_inputs`)."""
    flat = into.reshape(-1).view(numpy.uint8)
    for r, theirs in enumerate(inputs):
        lo, hi = (0, theirs.nbytes) if reads is None else reads[r]
        if lo < hi:
            at = r * (hi - lo)
            if flat.size == hi - lo and reads is not None \
                    and sum(a < b for a, b in reads) == 1:  # (a broadcast's)
                at = 0
            flat[at:at + hi - lo] = theirs.reshape(-1).view(numpy.uint8)[lo:hi]


def placing(reads: Reads | None) -> Callable[[list[Any], Any], None]:
    """`place` for calls that all name these `reads`, what does not depend on the call seen
    once: where one rank's input is taken whole (a broadcast's), into a block of its shape
    and dtype, one assignment. (A small broadcast's placement took 5.7 us by `place`.)"""
    pieces = [] if reads is None else [(r, lo, hi) for r, (lo, hi) in enumerate(reads)
                                       if lo < hi]
    if len(pieces) != 1 or pieces[0][1] != 0:
        return lambda inputs, into: place(inputs, reads, into)
    root, _, hi = pieces[0]

    def place_one(inputs: list[Any], into: Any) -> None:
        theirs = inputs[root]
        if hi == theirs.nbytes and into.shape == theirs.shape and into.dtype == theirs.dtype:
            into[...] = theirs
        else:
            place(inputs, reads, into)
    return place_one


def _sent() -> None:
    """The wait of a send that is already whole."""


def result_phase(onward: bool, recvbuf: Any | None) -> str:
    """The phase of `Transport.reduce_forward`'s second step: an all-reduce's all-gather, or,
    where the result goes one way only, a reduce's gather."""
    return "all-gather" if onward and recvbuf is not None else "gather"


def buffer_address(buf: Any) -> int:
    """Address of the first element of a NumPy or CuPy array. (Of a NumPy one through a
    ctypes view where it is writable and contiguous, 1 us; its `ctypes.data` takes 3, and is
    what is left.)"""
    if isinstance(buf, numpy.ndarray):
        try:
            return ctypes.addressof(ctypes.c_char.from_buffer(buf))
        except (TypeError, ValueError):  # read-only, strided or empty
            return buf.ctypes.data
    return buf.data.ptr


def element_span(buf: Any) -> tuple[int, int]:
    """(offset, count) of a view inside the array it was cut from, in elements."""
    base = buf.base if hasattr(buf.base, "nbytes") else buf  # an array, not bytes or mmap
    return (buffer_address(buf) - buffer_address(base)) // buf.itemsize, buf.size


def segments(count: int, itemsize: int, segment_bytes: int) -> list[tuple[int, int]]:
    """Split `count` elements into [lo, hi) pieces of at most `segment_bytes` each."""
    step = max(1, segment_bytes // itemsize)
    return [(lo, min(lo + step, count)) for lo in range(0, count, step)]


def configured(segment_bytes: int | str | None, one_shot_bytes: int | str | None,
               timeout: float | str | None) -> tuple[int | None, int | None, float]:
    """segment_bytes, one_shot_bytes and timeout as given, else from $RINGCC_SEGMENT_BYTES,
    $RINGCC_ONE_SHOT_BYTES and $RINGCC_TIMEOUT, checked (None: the transport's default; the
    timeout's is DEFAULT_TIMEOUT_S). InvalidArgumentError (a ValueError) names one that is out
    of range or no number."""
    given = {"segment_bytes": segment_bytes, "one_shot_bytes": one_shot_bytes,
             "timeout": timeout}
    settled: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            value = os.environ.get(f"RINGCC_{name.upper()}") or None
        if value is None:
            settled[name] = DEFAULT_TIMEOUT_S if name == "timeout" else None
            continue
        try:
            settled[name] = float(value) if name == "timeout" else int(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{name} (or $RINGCC_{name.upper()}) must be a number, "
                                       f"got {value!r}") from None
    if settled["segment_bytes"] is not None and settled["segment_bytes"] < 1:
        raise InvalidArgumentError(f"segment_bytes must be positive, got "
                                   f"{settled['segment_bytes']}")
    if settled["one_shot_bytes"] is not None and settled["one_shot_bytes"] < 0:
        raise InvalidArgumentError(f"one_shot_bytes must be >= 0, got "
                                   f"{settled['one_shot_bytes']}")
    if not settled["timeout"] > 0:
        raise InvalidArgumentError(f"timeout must be positive, got {settled['timeout']}")
    return settled["segment_bytes"], settled["one_shot_bytes"], settled["timeout"]


class Transport(ABC):
    """Moves bytes between `size` ranks. Subclasses set `name` and implement the raw moves."""

    name: str = "?"
    default_segment_bytes: int = DEFAULT_SEGMENT_BYTES  # unless segment_bytes= or $RINGCC_...
    # Calls of at most this many bytes take one exchange (the one-shot all-reduce, and every
    # collective's small path but scatter's; `Communicator._one_shot`); a transport whose
    # measured crossover is above zero says so here.
    default_one_shot_bytes: int = 0
    # True where one exchange beats the ring at every size, so that larger all-reduces take
    # one-shot too, `one_shot_bytes` at a time (cuda_ipc on one shared GPU says why).
    one_shot_at_any_size: bool = False
    # Whether a rank in a send or a recv that meets a collective answers every rank of it
    # (slots.py, "Folded checks"), so that all raise and go on. Elsewhere only its peer in
    # the message hears it, and on more than 2 ranks the others still wait for it.
    answers_messages_met: bool = False
    # A sendrecv with one peer, with its pair check, in one method where the transport has a
    # shortest way for it (slots.py's `pair_message`), else None.
    pair_message: Callable[..., bool | tuple[int, ...]] | None = None
    # That way made ready for a run of messages alike (`prepare_pair_message`: slots.py,
    # mpi.py), where the transport has one, else None; and for a sendrecv with two peers, a
    # ring shift (`prepare_ring_message`: slots.py, mpi.py, each through `ring_step`).
    prepare_pair_message: Callable[..., Callable[..., Any] | None] | None = None
    prepare_ring_message: Callable[..., Callable[..., Any] | None] | None = None
    # The hierarchical transport's parts: the ranks of this node, and one rank per node.
    node: Transport | None = None
    across: Transport | None = None

    def __init__(self, rank: int, size: int, *, segment_bytes: int | None = None,
                 one_shot_bytes: int | None = None, timeout: float | None = None,
                 xp: ModuleType = numpy) -> None:
        self.rank = rank
        self.size = size
        self.xp = xp
        segment_bytes, one_shot_bytes, self.timeout = configured(segment_bytes, one_shot_bytes,
                                                                 timeout)
        self.segment_bytes = self.default_segment_bytes if segment_bytes is None \
            else segment_bytes
        # (0 is a real setting, always the ring: None is the default.)
        self.one_shot_bytes = self.default_one_shot_bytes if one_shot_bytes is None \
            else one_shot_bytes
        # Whether ranks outnumber cores here (bootstrap.start says): then the rank we wait for
        # may be waiting for our core, so a wait yields the CPU at once (`spin`, the polls
        # before a wait first yields, is 0).
        self.oversubscribed = False
        self.spin = 50
        self.stats = Stats()
        # The peers on other nodes, whose bytes `stats` also counts apart; a transport that
        # can span nodes says which they are.
        self.off_node: frozenset[int] = frozenset()
        self.trace: list[dict] | None = None  # a list while tracing, else None (free when off)
        # Test hook: called with each transfer's record, as the trace gets it (see `_count`).
        self.on_transfer: Callable[[dict], None] | None = None
        # What the caller is doing, for error messages (`where`: "all_reduce #3"): a name,
        # and the call's number when not in the name (0). Kept apart, since a small call
        # would spend a tenth of its time formatting a message that is almost never shown.
        self._what, self._number = "", 0
        self.phase = ""  # which pass of the algorithm is running ("reduce-scatter"), for traces
        self.step = 0  # which step of that pass, for traces and error messages
        self._call: tuple[int, ...] | None = None  # the descriptor the next all_inputs carries
        # The bytes of this rank's input to the next exchange past which no peer takes any
        # (`unread`: 0, none taken); None: any may be.
        self._unread_after: int | None = None
        self._copied_whole = False  # whether its peers copy it whole (`copied_whole`)
        self._keeps_own = False  # whether it takes its own bytes from its input (`keeps_own`)
        self._alongside: Callable[[], None] | None = None  # work of ours meanwhile (`alongside`)
        # Whether `locate` and `get` work: each rank can reach its peers' memory.
        self.one_sided = False
        # Whether `all_inputs` moves no byte of a flat byte input past what `unread` says is
        # taken: such an input may then carry room it seldom fills (a scatter's description)
        # for the cost of what it fills.
        self.moves_what_is_read = False
        self.closed = False
        self.abandoned: str | None = None  # why every wait is to stop at once (`abandon`)
        # Where this transport is a part of another (hierarchical.py), the world rank of each
        # of its ranks, for error messages (`named`).
        self.world_ranks: list[int] | None = None

    def named(self, rank: int) -> int:
        """`rank` as error messages give it: the rank the user knows, its world rank where this
        transport is a part of another."""
        return rank if self.world_ranks is None else self.world_ranks[rank]

    # ---- what the caller is doing, for traces and error messages ------------------------

    @property
    def where(self) -> str:
        """What the caller is doing, for error messages ("all_reduce #3")."""
        return f"{self._what} #{self._number}" if self._number else str(self._what)

    def during(self) -> str:
        """The end of an error message: ' during all_reduce #3', or nothing outside a call."""
        return f" during {self.where}" if self.where else ""

    def begin(self, where: Any, call: tuple[int, ...] | None = None, phase: str = "") -> None:
        """A new call starts: `where` names it ("all_reduce #3", or an object that says it
        when made a string) until the next one, and its algorithm is at `phase` (see `at`).

        `call`, when given, is the call's descriptor (six non-negative integers): the call's
        first `all_inputs` carries it to every rank along with the data, and raises
        `CallsDiffer` on every rank if any rank's differs. So a small call checks itself in
        the exchange that moves its data.
        """
        self._what, self._number, self.phase, self.step, self._call = where, 0, phase, 0, call

    def unread(self, after: int = 0) -> None:
        """No peer takes any of this rank's input to its next `all_inputs` (a broadcast's other
        ranks', a gather's or a reduce's root's, a scan's last rank's), or none past its first
        `after` bytes (a scatter root's description, followed by what it holds of the blocks):
        a transport may leave those unmoved. Said just before that exchange, on the ranks it
        is true of, and forgotten after it, whether the transport heeded it or not."""
        self._unread_after = after

    def copied_whole(self) -> None:
        """Each peer that takes this rank's input to its next `all_inputs` copies all of it
        into a buffer of its own, reducing none (a broadcast's root's, a gather's other
        ranks'): a transport may share that copy with it. Said just before that exchange, and
        forgotten after it, as `unread` is."""
        self._copied_whole = True

    def keeps_own(self) -> None:
        """This rank takes its own bytes of its input to its next `all_inputs` straight from
        its input, not from what the exchange returns (a reduce-scatter's own block, which the
        lane reduces where it lies): a transport may leave them uncopied, and the array it
        returns as this rank's input then need not hold them. Said just before that exchange,
        and forgotten after it, as `unread` is."""
        self._keeps_own = True

    def alongside(self, work: Callable[[], None]) -> None:
        """`work()`, this rank's own (a gather's root copying its block), is to be made with
        its next `all_inputs`, and touches neither its input nor where that exchange places
        what it takes: a transport may make it while its peers move their inputs, and have
        them move more (slots.py, "Shared inputs"). Where the transport has not made it, it is
        made once the exchange has moved; it is dropped if the exchange fails."""
        self._alongside = work

    def at(self, phase: str, step: int = 0) -> None:
        """The algorithm is at `step` of `phase` ("reduce-scatter", 2)."""
        self.phase, self.step = phase, step

    # ---- the seam: what algorithms call -------------------------------------------------

    def sendrecv(self, sendbuf: Any | None, dst: int | None,
                 recvbuf: Any | None, src: int | None) -> None:
        """Send `sendbuf` to `dst` while receiving `recvbuf` from `src`; either side may be None."""
        sendbuf, recvbuf = self._check(sendbuf, dst), self._check(recvbuf, src)
        if sendbuf is None and recvbuf is None:
            return
        record = self._count("copy", sendbuf, dst, recvbuf, src)
        self._sendrecv(sendbuf, dst, recvbuf, src)
        if record is not None:
            record["end"] = time.perf_counter()

    def sendrecv_reduce(self, sendbuf: Any | None, dst: int | None,
                        accbuf: Any | None, src: int | None, op: ReduceOp,
                        inbuf: Any | None = None) -> None:
        """Send `sendbuf` to `dst` while receiving from `src` and reducing into `accbuf`:
        acc = op(inbuf, received), where `inbuf` (same size as `accbuf`) defaults to `accbuf`.

        An `inbuf` apart from `accbuf` lets an out-of-place all-reduce read the caller's input
        where it lies, instead of first copying it into the output.
        """
        sendbuf, accbuf = self._check(sendbuf, dst), self._check(accbuf, src)
        if sendbuf is None and accbuf is None:
            return
        if inbuf is None:
            inbuf = accbuf
        elif accbuf is not None and (inbuf.shape != accbuf.shape or inbuf.dtype != accbuf.dtype):
            raise ValueError("inbuf must match accbuf in size and dtype")
        record = self._count("reduce", sendbuf, dst, accbuf, src)
        if accbuf is None:  # the peer takes it in its own reduction, so cut it as that does
            self._send_reduced(sendbuf, dst)
        else:
            self._sendrecv_reduce(sendbuf, dst, accbuf, src, op, inbuf)
        if record is not None:
            record["end"] = time.perf_counter()

    def reduce_forward(self, sendbuf: Any, dst: int, accbuf: Any, src: int, op: ReduceOp,
                       inbuf: Any, recvbuf: Any | None, divide: int, smallest: int,
                       onward: bool = True) -> None:
        """A ring all-reduce's last reduce-scatter step and its first all-gather step, which
        a transport may fuse: `sendrecv_reduce(sendbuf, dst, accbuf, src, op, inbuf)`,
        accbuf /= divide (an average; 1: none), then `sendrecv(accbuf, dst, recvbuf, src)`.
        On two ranks, a reduce's one step and its gather's one message (reduce.py) the same
        way, the result going one way only: the root takes its peer's into `recvbuf` and sends
        its own to none (`onward` False), the peer takes none (`recvbuf` None). `smallest`,
        every rank's smallest chunk in bytes, is the same on every rank, so that a transport
        which fuses the steps for some sizes decides alike on every rank. Here the two steps
        are made one after the other."""
        self.sendrecv_reduce(sendbuf, dst, accbuf, src, op, inbuf)
        if divide != 1:
            self.xp.true_divide(accbuf, divide, out=accbuf)
        self.at(result_phase(onward, recvbuf), 0)
        self.sendrecv(accbuf if onward else None, dst if onward else None, recvbuf,
                      None if recvbuf is None else src)

    def message(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
                src: int | None, check: Callable[[], None] | None) -> None:
        """A point-to-point call's `sendrecv`, with its pair `check` (None: unchecked, or
        checked already, as the halves of a sendrecv with two peers are: `two_peers`) made
        first, before any data is taken (`check_first`): a MismatchError from it leaves no
        data taken, nothing counted in `stats`, and what was sent withdrawn. A transport
        with a shorter way for a small message overrides this."""
        stats, phase, step = vars(self.stats).copy(), self.phase, self.step
        if check is not None:
            self.check_first(check)
            self.at(phase, step)  # the check names its own phase
        try:
            self.sendrecv(sendbuf, dst, recvbuf, src)
            self.checked()
        except MismatchError:
            vars(self.stats).update(stats)
            raise

    def send(self, buf: Any, dst: int) -> None:
        """Send `buf` to `dst`; returns once `buf` may be reused."""
        self.sendrecv(buf, dst, None, None)

    def recv(self, buf: Any, src: int) -> None:
        """Receive from `src` into `buf`."""
        self.sendrecv(None, None, buf, src)

    def recv_while(self, buf: Any, src: int, meanwhile: Callable[[], None]) -> None:
        """`recv(buf, src)`, with `meanwhile()`, work of the caller's own that touches
        neither `buf` nor what `src` sends, made while the message comes where the transport
        can overlap the two (slots.py: a shared message's sender then writes it whole). Here
        first."""
        meanwhile()
        self.recv(buf, src)

    def isend(self, buf: Any, dst: int) -> Callable[[], None]:
        """Start sending `buf` to `dst`, and return `wait()`, which returns once `buf` may be
        reused; `buf` must not change until then. Meanwhile the caller may do other work: a
        scatter's root copies its own block while its peers take theirs. Messages to one
        peer still arrive in the order they were sent."""
        buf = self._check(buf, dst)
        if buf is None:
            return _sent
        record = self._count("copy", buf, dst, None, None)
        wait = self._isend(buf, dst)
        if record is None:
            return wait

        def wait_and_record() -> None:
            wait()
            record["end"] = time.perf_counter()
        return wait_and_record

    def _isend(self, buf: Any, dst: int) -> Callable[[], None]:
        """`isend` of a checked, counted, non-empty `buf`. Here the send is whole before this
        returns; a transport that can leave a message for its receiver to take overrides it."""
        self._sendrecv(buf, dst, None, None)
        return _sent

    def sends_ahead(self, nbytes: int, reduced: bool = False) -> int:
        """How many messages of `nbytes` this rank may start (`isend`) before it receives
        any, each surely under way whatever its receiver is doing, so that ranks which all
        send first never wait on each other; `reduced`: received by `sendrecv_reduce`. 0 here:
        a whole send may wait for its receiver."""
        return 0

    def reads_in_place(self, reads: Reads, nbytes: int) -> bool:
        """Whether `all_inputs` reads what each rank takes of each input of `nbytes` (`reads`)
        straight out of its owner's memory: then at any size, each input staying where it
        lies, so that a collective that places what it takes (`into`) may take one exchange
        however large. False here: the inputs move."""
        return False

    def all_inputs(self, buf: Any, counted: bool = True, reads: Reads | None = None,
                   into: Any | None = None) -> list[Any] | None:
        """Every rank's `buf`, in rank order.

        Every rank calls it with a contiguous buffer of the same shape and dtype; the arrays
        returned have that shape too. They never alias `buf` (so `buf` may be overwritten while
        they are read), and stay valid only until this rank's next collective: read them before
        returning. Uncounted, the exchange stays out of `stats` and traces: the call check uses
        it, so that they show only the collectives' own traffic. `reads`: which bytes of each
        input this rank takes (`prepare_all_inputs`); every rank of the call says the same of
        its own, or none does. `into` (a contiguous array, apart from `buf` where the inputs
        are read in place, `reads_in_place`, or where a peer takes `buf`): those bytes land
        there instead, those of rank r's input in block r, or where `into` holds one block
        only, there (`place`), and None is returned; whether it is given may differ from rank
        to rank.
        """
        try:
            inputs = self._all_inputs_counted(buf, counted, reads, into)
        finally:
            # (For this exchange only, whether it heeded them or not.)
            self._unread_after, self._copied_whole, self._keeps_own = None, False, False
            alongside, self._alongside = self._alongside, None
        if alongside is not None:  # (not made by the exchange)
            alongside()
        return inputs

    def _all_inputs_counted(self, buf: Any, counted: bool, reads: Reads | None,
                            into: Any | None) -> list[Any] | None:
        """`all_inputs`, counted."""
        if not buf.flags.c_contiguous:
            raise ValueError("transports move contiguous arrays only")
        call, self._call = self._call, None
        nbytes, peers = buf.nbytes, self.size - 1
        if counted and nbytes and peers and self.trace is None and self.on_transfer is None \
                and not self.off_node:
            # What the loop below counts, without a record per peer: small calls come often.
            stats = self.stats
            stats.bytes_sent += peers * nbytes
            stats.bytes_received += peers * nbytes
            stats.messages += peers
            inputs = self._all_inputs(buf, call, reads, into)
        elif not peers or (not nbytes and call is None):
            inputs = [buf.copy() for _ in range(self.size)]
        elif not counted or not nbytes:
            inputs = self._all_inputs(buf, call, reads, into)
        else:
            records = []  # while tracing: one exchange, so its records span it alike
            for step in range(1, self.size):
                record = self._count("copy", buf, (self.rank + step) % self.size,
                                     buf, (self.rank - step) % self.size)
                if record is not None:
                    records.append(record)
            inputs = self._all_inputs(buf, call, reads, into)
            if records:
                start, end = records[0]["start"], time.perf_counter()
                for record in records:
                    record["start"], record["end"] = start, end
        if into is None or inputs is None:
            return inputs
        place(inputs, reads, into)
        return None

    def prepare_all_inputs(self, shape: tuple[int, ...], dtype: Any, collective: str,
                           call: tuple[int, ...] | None, moved: list[Moved] | None = None,
                           reads: Reads | None = None) -> Exchange:
        """`all_inputs` made ready for a run of calls of one `collective` on inputs of one
        `shape` and `dtype`, as MPI's persistent collectives (`MPI_Allreduce_init`) are: what
        does not depend on the data is worked out once, so a call only moves it. Small calls
        come often, and there that work costs more than moving the data.

        `call` is the calls' descriptor but its number (None: unchecked). `exchange(buf,
        number)` then does `begin(f"{collective} #{number}", (number, *call), "one-shot")` and
        returns `all_inputs(buf)`, for a contiguous `buf` of that shape and dtype. `moved`
        says what each call counts in `stats`, as the collective's own path would (a root
        that only sends, say); None: what `all_inputs` counts, every input to and from every
        peer. `reads` says which bytes of each input this rank takes, per rank [lo, hi) (None:
        all): the others may be left unmoved (slots.py, "Inputs read in place").
        `exchange(buf, number, into)` instead lands the bytes that `reads` names of each
        rank's input in `into` (a contiguous array that overlaps no byte of `buf` a peer
        reads), those of rank r's in block r, or in the one block `into` holds (`place`): an
        all-to-all's, an all-gather's or a gather's result, a broadcast's buffer. A transport
        may read them straight there; the exchange returns None. Here it is just that; a
        transport with a leaner way overrides this.
        """
        tally, placed = self._tally(moved), placing(reads)

        def exchange(buf: Any, number: int, into: Any | None = None) -> Any:
            self.begin(f"{collective} #{number}", None if call is None else (number, *call),
                       "one-shot")
            if moved is None:
                inputs = self.all_inputs(buf, reads=reads)
            else:
                inputs = self.all_inputs(buf, counted=False, reads=reads)
                tally()
            return inputs if into is None else placed(inputs, into)
        return exchange

    def _prepare_one_shot(self, shape: tuple[int, ...], dtype: Any, collective: str,
                          call: tuple[int, ...] | None, moved: list[Moved] | None,
                          move: Callable[..., Any], reads: Reads | None) -> Exchange:
        """A prepared exchange (`prepare_all_inputs`) around a transport's one-shot exchange,
        `move(buf, line, into)`, which sends `buf` with its `CALL_LINE` and returns every
        rank's input (placed here where `into` is given), or None having placed the bytes
        `reads` names in `into` itself: the line is packed once, and a call writes only its
        number into it; the call is named (formatted only for a message) and counted as
        `begin` and `all_inputs` would, written out (at 8 B, each call of a function costs a
        tenth of a microsecond or more). A traced or watched call goes the general way, which
        records it."""
        nbytes = math.prod(shape) * numpy.dtype(dtype).itemsize
        general = Transport.prepare_all_inputs(self, shape, dtype, collective, call, moved,
                                               reads)
        line = call_line((0, *call) if call else None, nbytes)
        # What each call counts. (No prepared one-shot exchange crosses nodes: a transport that
        # spans them takes the general way there, which counts those bytes apart.)
        sent, received, messages, _, _ = self._sums(moved if moved is not None
                                                    else self.every_peer(nbytes))
        stats, placed = self.stats, placing(reads)

        def exchange(buf: Any, number: int, into: Any | None = None) -> Any:
            if self.trace is not None or self.on_transfer is not None:
                return general(buf, number, into)
            self._what, self._number = collective, number
            self.phase, self.step, self._call = "one-shot", 0, None
            if call is not None:
                line[0] = number
            stats.bytes_sent += sent
            stats.bytes_received += received
            stats.messages += messages
            try:
                inputs = move(buf, line) if into is None else move(buf, line, into)
            finally:
                # (For this exchange only, whether it heeded them or not.)
                self._unread_after, self._copied_whole, self._keeps_own = None, False, False
                alongside, self._alongside = self._alongside, None
            if alongside is not None:  # (not made by the exchange)
                alongside()
            return inputs if into is None or inputs is None else placed(inputs, into)
        return exchange

    def every_peer(self, nbytes: int) -> list[Moved]:
        """A block of `nbytes` to and from every peer, as `moved` (`prepare_all_inputs`)
        counts it: what `all_inputs` moves, or a reduce-scatter's blocks."""
        return [(nbytes, (self.rank + step) % self.size, nbytes, (self.rank - step) % self.size)
                for step in range(1, self.size)]

    def _tally(self, moved: list[Moved] | None) -> Callable[[], None]:
        """What counts `moved` in `stats`, as `count` would each transfer, with the sums made
        once (a small call feels each addition); nothing if None."""
        if not moved:
            return lambda: None
        stats = self.stats
        sent, received, messages, across_sent, across_received = self._sums(moved)

        def tally() -> None:
            stats.bytes_sent += sent
            stats.bytes_received += received
            stats.messages += messages
            if across_sent or across_received:
                stats.inter_node_bytes_sent += across_sent
                stats.inter_node_bytes_received += across_received
        return tally

    def _sums(self, moved: list[Moved]) -> tuple[int, int, int, int, int]:
        """What `moved` adds to `stats`: bytes sent, bytes received, messages, and the bytes
        sent to and received from other nodes."""
        off = self.off_node
        return (sum(m[0] for m in moved), sum(m[2] for m in moved),
                sum(1 for m in moved if m[0]), sum(m[0] for m in moved if m[1] in off),
                sum(m[2] for m in moved if m[3] in off))

    def count(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
              src: int | None) -> None:
        """Count a transfer that an uncounted exchange made (`all_inputs(counted=False)`), in
        `stats` and, as one that has ended, in the trace and the transfer hook."""
        record = self._count("copy", sendbuf, dst, recvbuf, src)
        if record is not None:
            record["end"] = record["start"]

    def check_first(self, check: Callable[[], None]) -> None:
        """Make the call's `check` (an exchange of descriptors) before its data moves: here,
        at once. A transport that can make it inside the call's first exchange, overlapping
        the wait with its own copy in, overrides this and `checked` (slots.py)."""
        check()

    def checked(self) -> None:
        """The call's data has moved: make a check handed to `check_first` that no exchange
        has made yet (a rank that moved nothing). Nothing to do here."""

    def register(self, nbytes: int) -> Any:
        """`nbytes` of memory for the caller's buffers, flat bytes, that peers can read in
        place where the transport shares memory (then collective: every rank asks for the same
        size, agreed beforehand by the caller). Elsewhere an ordinary allocation, which works as
        well, only without the gain."""
        return self.xp.empty(nbytes, numpy.uint8)

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        if self.size > 1:
            self._barrier()

    # ---- one-sided moves: where `one_sided`, a collective moves blocks itself --------------
    #
    # As MPI's windows (MPI_Get, MPI_Put) and a GPU's peer pointers (NCCL's, vLLM's custom
    # all-reduce): once an exchange has told each rank where a peer's buffer lies (`locate`),
    # the rank copies straight out of it (`get`), or into it (`put`, given its address), with
    # no message; a barrier afterwards says every copy has ended, and the owner may change its
    # buffer. Only where the transport reaches its peers' memory (shm, with direct reads):
    # here, nowhere.

    def locate(self, buf: Any) -> int:
        """A word that names where the contiguous `buf` lies, for a peer to `get` from once an
        exchange has carried it there."""
        raise NotImplementedError(f"the {self.name} transport has no one-sided moves")

    def get(self, peer: int, where: int, offset: int, into: Any) -> None:
        """Copy into the contiguous `into` as many bytes, from `offset` on in `peer`'s buffer
        that its `locate` word `where` names; done when it returns. Uncounted (the caller
        counts)."""
        raise NotImplementedError(f"the {self.name} transport has no one-sided moves")

    def put(self, peer: int, address: int, data: Any) -> None:
        """Copy the contiguous `data` to `address` in `peer`'s memory (where a buffer of its
        lies, as `buffer_address` gives it there); done when it returns. Uncounted (the caller
        counts)."""
        raise NotImplementedError(f"the {self.name} transport has no one-sided moves")

    def abandon(self, why: str) -> None:
        """Make every wait, the one under way too, raise CollectiveError saying `why` (at exit,
        for a call that its peers will never join)."""
        self.abandoned = why

    def check_thread(self) -> None:
        """Raise if this transport may not be used from another thread than the one that made
        it (the communicator's progress thread calls it first). Host memory may be."""

    def close(self) -> None:
        """Release what the transport holds; safe to call twice."""
        self.closed = True

    # ---- what each transport provides ----------------------------------------------------

    @abstractmethod
    def _sendrecv(self, sendbuf: Any | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> None:
        """Raw exchange of non-empty, validated buffers (either may be None)."""

    @abstractmethod
    def _barrier(self) -> None:
        """Raw barrier among more than one rank."""

    @abstractmethod
    def say_pairs(self, said: dict[int, tuple[int, ...]]) -> Heard:
        """Give each peer of a message its six integers of the pair's check, `said[peer]`
        (check.pair_agree), without waiting; returns `heard(peer)`, the peer's six for this
        rank once they have come, else None, which never waits either (and the same six each
        time, once come). A peer in a collective call meanwhile sends its call's descriptor
        instead, which `heard` returns. Made so that a sendrecv with two peers can move the
        half whose peer has come first (`point_to_point.two_peers`)."""

    def _sendrecv_reduce(self, sendbuf: Any | None, dst: int | None,
                         accbuf: Any, src: int, op: ReduceOp, inbuf: Any) -> None:
        """Receive in segments into bounded scratch and reduce each one as it lands."""
        pieces = segments(accbuf.size, accbuf.itemsize, self.segment_bytes)
        sent = segments(0 if sendbuf is None else sendbuf.size, accbuf.itemsize,
                        self.segment_bytes)
        scratch = self.xp.empty(pieces[0][1], accbuf.dtype)
        for k in range(max(len(pieces), len(sent))):
            out = sendbuf[slice(*sent[k])] if k < len(sent) else None
            if k < len(pieces):
                lo, hi = pieces[k]
                self._sendrecv(out, dst, scratch[: hi - lo], src)
                op(inbuf[lo:hi], scratch[: hi - lo], out=accbuf[lo:hi])
            else:
                self._sendrecv(out, dst, None, None)

    def _send_reduced(self, sendbuf: Any, dst: int) -> None:
        """The sending half of a reduction whose receiving half is empty, cut as the receiver's
        `_sendrecv_reduce` takes it: by the default (and mpi's), one message per segment."""
        for lo, hi in segments(sendbuf.size, sendbuf.itemsize, self.segment_bytes):
            self._sendrecv(sendbuf[lo:hi], dst, None, None)

    def _all_inputs(self, buf: Any, call: tuple[int, ...] | None, reads: Reads | None = None,
                    into: Any | None = None) -> list[Any] | None:
        """The descriptors first, when a call is carried, then the data: two exchanges where a
        transport that can carry both at once takes one (every input moves whole, and
        `all_inputs` places it `into`; a transport that reads inputs in place lands them there
        itself, and returns None)."""
        if call is not None:
            calls = [tuple(c.tolist()) for c in self._exchange(self.xp.array(call, "u8"))]
            if calls.count(call) != self.size:
                raise CallsDiffer(calls)
        if buf.size == 0:
            return [buf.copy() for _ in range(self.size)]
        return self._exchange(buf)

    def _compare_lines(self, mine: memoryview, theirs: list[memoryview]) -> None:
        """After a one-shot exchange: raise, on every rank, what differs between this rank's
        `CALL_LINE` `mine` and the peers' `theirs` (in rank order, all as words: `call_line`):
        the call (CallsDiffer), else the size of the input (MismatchError). Compared whole:
        small calls come often."""
        for line in theirs:
            if line != mine:
                break
        else:
            return
        lines = [tuple(line) for line in theirs]
        lines.insert(self.rank, tuple(mine))
        call, nbytes = lines[self.rank][:CALL_WORDS], lines[self.rank][CALL_WORDS]
        if call != NO_CALL:  # (a checked call is numbered from 1)
            calls = [line[:CALL_WORDS] for line in lines]
            if calls.count(call) != self.size:
                raise CallsDiffer(calls)
        r, other = next((r, line) for r, line in enumerate(lines) if line[CALL_WORDS] != nbytes)
        raise MismatchError(f"rank {self.named(self.rank)} exchanges {nbytes} bytes but rank "
                            f"{self.named(r)} "
                            f"{other[CALL_WORDS]}"
                            + self.during())

    def _exchange(self, buf: Any) -> list[Any]:
        """Every rank's `buf` (any shape) by direct copies of it flat: in step s, send to
        rank + s and receive from rank - s."""
        inputs = [self.xp.empty_like(buf) for _ in range(self.size)]
        inputs[self.rank][...] = buf
        for step in range(1, self.size):
            src = (self.rank - step) % self.size
            self._sendrecv(buf.reshape(-1), (self.rank + step) % self.size,
                           inputs[src].reshape(-1), src)
        return inputs

    # ---- helpers shared by transports ----------------------------------------------------

    def wait(self, ready: Callable[[], bool], peer: int | None, what: str,
             late: Callable[[], list[int]] | None = None) -> None:
        """Wait until `ready()` is true: spin briefly, then yield the CPU, then nap.

        Ranks may outnumber cores, so a long wait must let the peer we wait for run. `peer` is
        the rank waited for; when waiting for several (peer None), `late()` says which of them
        have not come, for the timeout's message.
        """
        if ready():
            return
        deadline = time.monotonic() + self.timeout
        polls = 0
        while not ready():
            polls += 1
            if polls < self.spin:
                continue
            if polls < 2000:
                os.sched_yield()
            else:
                time.sleep(50e-6 if polls < 20000 else 1e-3)
            if polls % 50:
                continue
            if self.abandoned is not None:
                raise CollectiveError(f"rank {self.named(self.rank)} stopped waiting for {what}"
                                      f"{self.during()}: {self.abandoned}")
            self._check_peer(peer)
            if time.monotonic() > deadline:
                waited = [peer] if peer is not None else late() if late is not None else []
                raise CollectiveTimeoutError(
                    f"rank {self.named(self.rank)} waited {self.timeout:g} s for {what}"
                    + (f" from rank{'s' if len(waited) > 1 else ''} "
                       f"{', '.join(str(self.named(w)) for w in waited)}" if waited else "")
                    + self.during()
                    + (f" ({self.phase} step {self.step})" if self.phase else "")
                    + f" on the {self.name} transport")

    def _check_peer(self, peer: int | None) -> None:
        """Called now and then while waiting on `peer` (None: on every rank); raise to stop."""

    def _check(self, buf: Any | None, peer: int | None) -> Any | None:
        """Validate one side of a transfer; an empty buffer means no transfer at all."""
        if buf is None:
            return None
        if peer is None or not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"rank {self.rank}: peer {peer} is not another rank of {self.size}")
        if buf.ndim != 1 or not buf.flags.c_contiguous:
            raise ValueError("transports move flat contiguous arrays only")
        return buf if buf.size else None

    def _count(self, kind: str, sendbuf: Any | None, dst: int | None,
               recvbuf: Any | None, src: int | None) -> dict | None:
        """Count a transfer in `stats`; its record (whose "end" the caller sets once the
        transfer is done) when tracing or hooked, else None."""
        if sendbuf is not None:
            self.stats.bytes_sent += sendbuf.nbytes
            self.stats.messages += 1
            if dst in self.off_node:
                self.stats.inter_node_bytes_sent += sendbuf.nbytes
        if recvbuf is not None:
            self.stats.bytes_received += recvbuf.nbytes
            if src in self.off_node:
                self.stats.inter_node_bytes_received += recvbuf.nbytes
        if self.trace is not None or self.on_transfer is not None:
            record = {
                "rank": self.rank, "kind": kind, "where": self.where,
                "phase": self.phase, "step": self.step,
                "dst": dst if sendbuf is not None else None,
                "send": element_span(sendbuf) if sendbuf is not None else None,
                "src": src if recvbuf is not None else None,
                "recv": element_span(recvbuf) if recvbuf is not None else None,
                "bytes": sendbuf.nbytes if sendbuf is not None else 0,
                "start": time.perf_counter(), "end": None,
            }
            if self.trace is not None:
                self.trace.append(record)
            if self.on_transfer is not None:
                self.on_transfer(record)
            return record
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"
