"""MPI point-to-point through mpi4py.

The transport works on a `Dup` of the caller's communicator, so its messages can never match
the caller's own. Payloads travel as raw bytes with uppercase (buffer) methods: nothing is
pickled, any dtype works, and the reduction happens in NumPy (or CuPy) after the bytes land.

CuPy arrays go to MPI as they are when the MPI library takes device memory (`cuda_aware`);
otherwise each segment is staged through pinned host memory: copied down, sent, received,
and copied (or reduced) up on the device. The PyPI MPI wheels are not CUDA-aware.

Waits poll `Test` and yield the CPU between polls (see `Transport.wait`) rather than block in
MPI: MPICH busy-polls inside a blocking call, which starves the peer we are waiting for when
ranks outnumber cores.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
from typing import Any, Callable

import numpy
from mpi4py import MPI

from .base import (CALL_LINE, GENERAL_WAY, MESSAGES, READIED, SILENT, Exchange, Half, Heard,
                   Moved, Reads, ReduceOp, Transport, call_line, kept, ring_kinds, ring_step,
                   segments, swapped_dtypes)
from .bootstrap import duplicated, nodes, start
from .cuda import copy_bytes, pinned_empty, use_gpu
from .errors import CollectiveError, InvalidArgumentError

TAG = 17
PAIR_WORDS = struct.Struct("=6Q")  # a point-to-point check's six integers (check.pair_agree)
PAIR_BYTES = PAIR_WORDS.size
# A send's or a recv's packet alone, by a readied step, is longer than the words by this
# much, in front of its data: so its peer knows it from the general way's words alone. (It
# still fits where it lands: `_Landing` has room for a one-shot header, a word more.)
ONE_WAY_MARK_BYTES = 8
# Messages of a pair up to this size may go with the check's words in one packet
# (`pair_message`): above it, copying the data into the packet and out of it costs more than
# the second round trip saves (2 ranks here: 128 KiB 49 us against 56, 512 KiB 140 against
# 103). The packet's persistent send is MPI's slow road for large messages, though (a bare
# loop of them, 2 ranks: 64 KiB 34 us, 1 MiB 390, where an Isend and Irecv took 16 and 142):
# so a step with one peer sends larger messages than PAIR_DIRECT_BYTES straight from the
# caller's buffer, once the words have agreed (docs/performance.md, "Messages on the mpi
# transport moved straight": on 2 ranks a 16 KiB sendrecv took 9.9-10.1 us so, 10.7-10.9 by
# the packet; 8 KiB 9.4-9.6 so, 8.9 by the packet).
PAIR_PACKET_BYTES = 128 << 10
PAIR_DIRECT_BYTES = 8 << 10
KEPT_SIZES = 8  # one-shot packet sizes whose persistent sends are kept, and kinds of input
NO_DATA = numpy.empty(0, numpy.uint8)  # a one-shot exchange's input when only its header goes


def _bytes(buf: Any) -> list:
    """A contiguous `buf` as MPI's buffer of bytes (a 0-d one as 1-d: NumPy views no 0-d
    array as bytes)."""
    return [(buf if buf.ndim else buf.reshape(1)).view(numpy.uint8), MPI.BYTE]


def cuda_aware(comm: MPI.Comm) -> bool:
    """Whether the MPI library takes CUDA device buffers.

    Yes when MPI 4.1's memory allocation kinds name CUDA device memory, or when the
    MPIX_Query_cuda_support extension (Open MPI, MPICH) says so. $RINGCC_MPI_CUDA=0 or 1
    overrides the answer (to test one path or the other).
    """
    forced = os.environ.get("RINGCC_MPI_CUDA")
    if forced in ("0", "1"):
        return forced == "1"
    info = comm.Get_info()
    try:
        kinds = (info.Get("mpi_memory_alloc_kinds") or "").split(",")
    finally:
        info.Free()
    if "cuda" in kinds or "cuda:device" in kinds:
        return True
    query = getattr(ctypes.CDLL(MPI.__file__), "MPIX_Query_cuda_support", None)
    return query is not None and query() == 1


class _Landing:
    """Where each peer's one-shot packet lands, with room for the largest (this rank's own
    entry is a placeholder), the peers' descriptors within them (as bytes), and the
    persistent receive into each, made once: a small call then costs one Startall, not a
    buffer and a request per peer. The packets stay valid until the next call, as
    `all_inputs` promises."""

    def __init__(self, comm: MPI.Comm, rank: int, peers: list[int], one_shot_bytes: int) -> None:
        room = CALL_LINE.size + one_shot_bytes
        self.buffers = [numpy.empty(0 if r == rank else room, numpy.uint8)
                        for r in range(comm.Get_size())]
        self.headers = [memoryview(self.buffers[r])[:CALL_LINE.size].cast("Q") for r in peers]
        self.receives = [comm.Recv_init(_bytes(self.buffers[r]), r, TAG) for r in peers]


class _Shot:
    """A one-shot packet of `nbytes` (descriptor, then data) and its persistent sends to every
    peer."""

    def __init__(self, comm: MPI.Comm, peers: list[int], nbytes: int,
                 receives: list[MPI.Prequest]) -> None:
        self.packet = numpy.empty(nbytes, numpy.uint8)
        self.header = memoryview(self.packet)[:CALL_LINE.size].cast("Q")
        self.sends = [comm.Send_init(_bytes(self.packet), r, TAG) for r in peers]
        self.requests = receives + self.sends  # what one Startall starts
        self.freed = False

    def free(self) -> None:
        """Free the sends (a send still going finishes on its own); the shot is not used again."""
        for request in self.sends:
            request.Free()
        self.freed = True


class _Packet:
    """A pair step's packet of one size to one peer, and its persistent send (`_pair_phases`):
    `freed` once `_free_pair_packets` has freed the send, and a step then takes a new one."""

    def __init__(self, comm: MPI.Comm, peer: int, size: int) -> None:
        self.packet = numpy.zeros(size, numpy.uint8)  # (a one-way step's mark bytes stay 0)
        self.send = comm.Send_init(_bytes(self.packet), peer, TAG)
        self.freed = False


class MPITransport(Transport):
    """Point-to-point over a duplicate of `comm` (default `MPI.COMM_WORLD`)."""

    name = "mpi"

    @property
    def default_one_shot_bytes(self) -> int:  # type: ignore[override]
        """1 MiB / N, at least 16 KiB: one-shot moves N/2 times the ring's bytes, in one step
        instead of 2(N-1). Measured (docs/transports.md, "The mpi transport's one-shot"): on 2
        ranks it wins up to 512 KiB, on 4 up to 256 KiB."""
        return max(16 << 10, (1 << 20) // self.size)

    def __init__(self, comm: MPI.Comm | None = None, *, device: str = "cpu",
                 node_size: int | None = None, **options: Any) -> None:
        if device not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"unknown device {device!r}; expected 'cpu' or 'cuda'")
        with duplicated(comm) as self.comm:
            xp = use_gpu(self.comm) if device == "cuda" else numpy
            super().__init__(self.comm.Get_rank(), self.comm.Get_size(), xp=xp, **options)
            start(self.comm, self)
            # Which peers are on other nodes (virtual ones with `node_size`), for `stats`.
            node = nodes(self.comm, node_size)
            self.off_node = frozenset(r for r, n in enumerate(node) if n != node[self.rank])
            # Two segments of scratch, where the reduction runs: one is reduced while the next
            # one arrives. (A segment holds at least one element; no dtype is wider than 64 B.)
            nbytes = max(self.segment_bytes, 64)
            self._scratch = [self.xp.empty(nbytes, numpy.uint8) for _ in range(2)]
            # The one-shot exchange's persistent requests and buffers (`_Landing`, `_Shot`).
            self._peers = [r for r in range(self.size) if r != self.rank]
            self._landing: _Landing | None = None
            self._sending: dict[int, _Shot] = {}  # by packet size
            self._exchanges: dict[tuple, Callable[..., list[Any]]] = {}  # by shape and dtype
            # `pair_message`'s packets and their persistent sends, by peer and data size.
            self._pair_packets: dict[tuple[int, int], _Packet] = {}
            self._status = MPI.Status()  # (made once: a small message feels each object)
            self.staged = self.xp is not numpy and not cuda_aware(self.comm)
            if self.staged:
                self._host = [pinned_empty(nbytes) for _ in range(2)]  # outgoing, incoming

    def _wait_all(self, requests: list[MPI.Request], peer: int | None, what: str) -> None:
        self.wait(lambda: MPI.Request.Testall(requests), peer, what)

    def wait(self, ready: Callable[[], bool], peer: int | None, what: str,
             late: Callable[[], list[int]] | None = None) -> None:
        """`Transport.wait`, with an error MPI reports in a request raised as a CollectiveError,
        as every error of ringcc is (with the check off, a message longer than its receive
        buffer; or a message of a peer that gave up on a call and went on)."""
        try:
            super().wait(ready, peer, what, late)
        except MPI.Exception as error:
            raise self._reported(peer, what) from error

    def _reported(self, peer: int | None, what: str) -> CollectiveError:
        """An error MPI reported while this rank waited for `what` from `peer`, as ringcc's."""
        return CollectiveError(
            f"rank {self.named(self.rank)}: MPI reported an error while this rank waited "
            f"for {what}" + (f" from rank {self.named(peer)}" if peer is not None else "")
            + self.during()
            + " (with the check off, a message longer than its receive buffer; or one of "
              "a peer that gave up on a call)")

    def _ready(self) -> None:
        """Before MPI reads or writes device memory, let the kernels queued on it finish."""
        if self.xp is not numpy:
            self.xp.cuda.get_current_stream().synchronize()

    def _sendrecv(self, sendbuf: Any | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> None:
        if self.staged:
            self._staged(sendbuf, dst, recvbuf, src, None, None)
            return
        self._ready()
        receive = [] if recvbuf is None else [self.comm.Irecv(_bytes(recvbuf), src, TAG)]
        send = [] if sendbuf is None else [self.comm.Isend(_bytes(sendbuf), dst, TAG)]
        # One wait each, so that a timeout names the rank that did not come.
        self._wait_all(receive, src, "a message")
        self._wait_all(send, dst, "its message to be taken")

    def sends_ahead(self, nbytes: int, reduced: bool = False) -> int:
        # MPI progresses an Isend while we receive; a reducing receiver takes segments.
        return 0 if self.staged or reduced else self.size

    def _isend(self, buf: Any, dst: int) -> Callable[[], None]:
        if self.staged:
            return super()._isend(buf, dst)
        self._ready()
        request = self.comm.Isend(_bytes(buf), dst, TAG)
        return lambda: self._wait_all([request], dst, "a message")

    def _sendrecv_reduce(self, sendbuf: Any | None, dst: int | None,
                         accbuf: Any, src: int, op: ReduceOp, inbuf: Any) -> None:
        if self.staged:
            self._staged(sendbuf, dst, accbuf, src, op, inbuf)
            return
        self._ready()
        # The receiver cuts the message into segments that fit its scratch, so the sender
        # sends the same segments as separate messages (MPI keeps them in order).
        itemsize = accbuf.itemsize
        sends = [] if sendbuf is None else [
            self.comm.Isend(_bytes(sendbuf[lo:hi]), dst, TAG)
            for lo, hi in segments(sendbuf.size, itemsize, self.segment_bytes)]
        pieces = segments(accbuf.size, itemsize, self.segment_bytes)
        scratch = [s[: (s.size // itemsize) * itemsize].view(accbuf.dtype) for s in self._scratch]

        def post(k: int) -> MPI.Request:
            lo, hi = pieces[k]
            return self.comm.Irecv(_bytes(scratch[k % 2][: hi - lo]), src, TAG)

        receives = [post(k) for k in range(min(2, len(pieces)))]
        for k, (lo, hi) in enumerate(pieces):
            self._wait_all([receives[k]], src, "a segment")
            op(inbuf[lo:hi], scratch[k % 2][: hi - lo], out=accbuf[lo:hi])
            if k + 2 < len(pieces):
                self._ready()  # the reduction has read the scratch the next segment lands in
                receives.append(post(k + 2))
        self._wait_all(sends, dst, "a send to complete")

    def _staged(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
                src: int | None, op: ReduceOp | None, inbuf: Any | None) -> None:
        """Device arrays through pinned host memory, a segment at a time: copy one down and send
        it while the matching one arrives, then copy that up (or, with `op`, reduce it with
        `inbuf` into `recvbuf`).

        Both sides cut a message into the same segments, so they match message by message.
        """
        outgoing, incoming = self._host
        sends = [] if sendbuf is None else segments(sendbuf.size, sendbuf.itemsize,
                                                    self.segment_bytes)
        receives = [] if recvbuf is None else segments(recvbuf.size, recvbuf.itemsize,
                                                       self.segment_bytes)
        for k in range(max(len(sends), len(receives))):
            receive, send = [], []
            if k < len(receives):
                lo, hi = receives[k]
                landed = incoming[: (hi - lo) * recvbuf.itemsize]
                receive.append(self.comm.Irecv([landed, MPI.BYTE], src, TAG))
            if k < len(sends):
                lo, hi = sends[k]
                out = outgoing[: (hi - lo) * sendbuf.itemsize]
                copy_bytes(out, sendbuf[lo:hi])
                send.append(self.comm.Isend([out, MPI.BYTE], dst, TAG))
            self._wait_all(receive, src, "a segment")
            self._wait_all(send, dst, "its segment to be taken")
            if k < len(receives):
                lo, hi = receives[k]
                if op is None:
                    copy_bytes(recvbuf[lo:hi], landed)
                else:  # the next copy up waits, on the same stream, for this reduction
                    scratch = self._scratch[0][: landed.size].view(recvbuf.dtype)
                    copy_bytes(scratch, landed)
                    op(inbuf[lo:hi], scratch, out=recvbuf[lo:hi])

    def say_pairs(self, said: dict[int, tuple[int, ...]]) -> Heard:
        """Each peer's words go as a message of their own, and the peer's land where a
        one-shot packet would (`_Landing`), which has room for any: a peer in a collective call
        sends its packet instead, whose first six words, its call's descriptor, `heard` then
        returns (a receive of six words alone would be cut short, an MPI error on this rank).
        Once the peer's have come, `heard` waits for ours to be taken too."""
        landing = self._landed().buffers
        receives = {peer: self.comm.Irecv(_bytes(landing[peer]), peer, TAG) for peer in said}
        words = {peer: numpy.array(said[peer], numpy.uint64) for peer in said}
        sends = {peer: self.comm.Isend(_bytes(words[peer]), peer, TAG) for peer in said}
        got: dict[int, tuple[int, ...]] = {}

        def heard(peer: int) -> tuple[int, ...] | None:
            if peer not in got:
                try:
                    if not receives[peer].Test():
                        return None
                except MPI.Exception as error:
                    raise self._reported(peer, "a message") from error
                self._wait_all([sends[peer]], peer, "its check to be taken")
                got[peer] = PAIR_WORDS.unpack_from(landing[peer], 0)
            return got[peer]
        return heard

    def pair_message(self, mine: Any, peer: int, into: Any, said: tuple[int, ...] | None,
                     expected: tuple[int, ...] | None) -> bool | tuple[int, ...]:
        """A checked sendrecv with one `peer`, in one message each way up to PAIR_DIRECT_BYTES,
        in two above (`prepare_pair_message`, whose step this makes for the one call).
        `expected` is what `said` mirrors (`check.pair_said`). True once moved and counted;
        False, having done nothing, for a message `message` must take; or the peer's words
        where they differ from `expected`, having taken nothing (a peer that disagrees takes
        nothing either, and raises)."""
        if said is None or self.trace is not None or self.on_transfer is not None:
            return False
        step = self.prepare_pair_message(peer, mine.nbytes, into.nbytes, said[3:])
        return False if step is None else step(mine, into, said[1], said[2])

    def prepare_pair_message(self, peer: int, sent_bytes: int | None,
                             expected_bytes: int | None,
                             kind: tuple[int, int, int]) -> Callable[..., Any] | None:
        """`pair_message` for a run of checked sendrecvs with one `peer`, of flat arrays of
        `sent_bytes` and `expected_bytes` whose description is `kind` (`check.pair_kind`):
        `step(mine, into, n_sent, n_expected)`, where `message` makes the check and the data
        two exchanges. A send alone (`expected_bytes` None, `into` None) or a recv alone
        (`sent_bytes` None, `mine` None) goes the same way. None for messages of no data.

        Up to PAIR_DIRECT_BYTES each way is one message: the pair's six words with the data
        behind them, landing where a one-shot packet does (`_Landing`, room for any: the
        receive is the one-shot exchange's from this peer, the same buffer and tag); a recv
        alone sends its words alone. Larger messages send the words alone, then, once the
        peer's have agreed, the data straight from and into the caller's buffers, as the
        general way does (so it meets a peer on either way), without its Python (2 ranks, 512
        KiB: 165-173 us a call by the general way, 103-106 so; MPICH's 81-87). A peer whose
        packet carried its data (a ring's half, which keeps packets up to PAIR_PACKET_BYTES)
        hears the words alone and sends its data again the general way, where this step takes
        them. The packet and its persistent send are kept per peer and size, as the one-shot's
        are; what stays from call to call is found here, so that a call writes
        its two numbers and copies its data in and out (an 8 B sendrecv on 2 ranks took
        22.0-22.3 us with the step made anew each call, 12.7-12.9 so: docs/performance.md,
        "Messages of one kind, written out").

        A peer on the general way (a traced one) sends its words alone, then its data: the
        check is the same, and the data then go that way. So that a send's step knows a recv's
        step from the general way (both send no data), a send's or a recv's packet alone has
        ONE_WAY_MARK_BYTES between its words and its data. Steps are never traced or watched
        (their caller takes those calls the general way)."""
        phases = self._pair_phases(peer, sent_bytes, expected_bytes, kind, PAIR_DIRECT_BYTES)
        if phases is None:
            return None
        publish, finish, _ = phases

        def step(mine: Any, into: Any, n_sent: int, n_expected: int) -> bool | tuple[int, ...]:
            return finish(mine, into, n_sent, n_expected, publish(mine, n_sent, n_expected))
        return step

    def prepare_ring_message(self, dst: int, src: int, sent_bytes: int, expected_bytes: int,
                             kind: tuple[int, int, int]) -> Callable[..., Any] | None:
        """`prepare_pair_message` for a sendrecv with two peers (a ring shift): a send alone to
        `dst` and a recv alone from `src`, both started before either is waited for
        (`ring_step`)."""
        sending, receiving = ring_kinds(kind)
        out = self._pair_phases(dst, sent_bytes, None, sending)
        come = self._pair_phases(src, None, expected_bytes, receiving)
        return None if out is None or come is None else ring_step(dst, out, src, come,
                                                                  self.wait)

    def _pair_phases(self, peer: int, sent_bytes: int | None, expected_bytes: int | None,
                     kind: tuple[int, int, int], direct_from: int | None = None) -> Half | None:
        """The two halves of a readied step with `peer` (`prepare_pair_message`):
        `publish(mine, n_sent, n_expected)`, which writes the packet and starts both requests,
        and `finish(mine, into, n_sent, n_expected, _)`, which waits for them and takes the
        peer's data: True, or the peer's words where they differ; then `spoken`, for
        `ring_step`: what the peer's packet is, without waiting. With `direct_from`, messages
        larger than that send their words alone and move their data once those agree; else
        None for messages larger than a packet holds. (A ring's halves may not: a half that
        waited for its data would wait for a peer that waits for its own, around the ring.)"""
        most = min(self.one_shot_bytes, PAIR_PACKET_BYTES)  # (what lands must fit: `_Landing`)
        ways = [n for n in (sent_bytes, expected_bytes) if n is not None]
        if self.xp is not numpy or not ways or min(ways) <= 0:
            return None
        words_alone = max(ways) > (most if direct_from is None else min(most, direct_from))
        if words_alone and direct_from is None:
            return None
        at = PAIR_BYTES if len(ways) == 2 or words_alone else \
            PAIR_BYTES + ONE_WAY_MARK_BYTES  # where the data lie in a packet
        c_sent, c_expected, dtypes = kind
        mirrored = swapped_dtypes(dtypes)  # the peer's dtypes word
        landing = self._landed()
        landed = landing.buffers[peer]
        receive = landing.receives[peer if peer < self.rank else peer - 1]
        size = at if words_alone else at + (sent_bytes or 0)
        start_all, status = MPI.Prequest.Startall, MPI.Status()
        irecv, isend, test_all = self.comm.Irecv, self.comm.Isend, MPI.Request.Testall
        tally = self._tally([(sent_bytes or 0, peer, expected_bytes or 0, peer)])
        # The packet and its send (`_Packet`), kept per peer and size, and taken anew once
        # freed (by a sweep of more sizes than are kept); both requests, started at once; the
        # packets' data as arrays of the messages' dtypes, made for the first call's (a copy
        # between arrays of one dtype costs half one through a cast of bytes).
        held: list[Any] = [None, [receive, None]]
        typed: list[Any] = [None] * 4
        landed_count: list[int | None] = [None]  # the size of a packet `spoken` took this call

        def publish(mine: Any, n_sent: int, n_expected: int) -> None:
            landed_count[0] = None
            made = held[0]
            if made is None or made.freed:
                made = held[0] = self._pair_packet(peer, size)
                held[1][1], typed[0] = made.send, None
            # (all six words: a step of another kind of as many bytes shares the packet)
            PAIR_WORDS.pack_into(made.packet, 0, MESSAGES, n_sent, n_expected, c_sent,
                                 c_expected, dtypes)
            if mine is not None and not words_alone:
                if typed[0] is not mine.dtype:
                    typed[0] = mine.dtype
                    typed[2] = numpy.frombuffer(made.packet, mine.dtype, mine.size, at)
                typed[2][...] = mine
            start_all(held[1])

        def finish(mine: Any, into: Any, n_sent: int, n_expected: int,
                   _: None) -> bool | tuple[int, ...]:
            count, landed_count[0] = landed_count[0], None
            if count is None:  # (not taken by `spoken`): a short spin first, as the
                polls = self.spin  # one-shot exchange's
                while not receive.Test(status):
                    polls -= 1
                    if polls < 0:
                        self.wait(lambda: receive.Test(status), peer, "a message")
                        break
                count = status.Get_count(MPI.BYTE)
            send = held[0].send
            if not send.Test():
                self._wait_all([send], peer, "its message to be taken")
            heard = PAIR_WORDS.unpack_from(landed, 0)
            if heard != (MESSAGES, n_expected, n_sent, c_expected, c_sent, mirrored):
                return heard
            if words_alone:  # the data follow the words, straight: a peer whose packet
                # carried its data (a ring's half) heard our words alone, and sends them again
                # the general way (below), which meets these requests
                moving = [] if into is None else [irecv([into, MPI.BYTE], peer, TAG)]
                if mine is not None:
                    moving.append(isend([mine, MPI.BYTE], peer, TAG))
                polls = self.spin
                while not test_all(moving):
                    polls -= 1
                    if polls < 0:
                        self._wait_all(moving[:1], peer, "a message")
                        self._wait_all(moving, peer, "its message to be taken")
                        break
                tally()
                return True
            if count == PAIR_BYTES:  # its words alone: the data follow, as the general
                self.sendrecv(mine, None if mine is None else peer, into,  # way's do
                              None if into is None else peer)
                return True
            if into is not None:
                if typed[1] is not into.dtype:
                    typed[1] = into.dtype
                    typed[3] = numpy.frombuffer(landed, into.dtype, into.size, at)
                into[...] = typed[3]
            tally()
            return True

        def spoken(n_sent: int, n_expected: int, _: None, __: list[int]) -> int:
            """What the peer's packet is, without waiting (`ring_step`): one that has landed is
            taken, and its size kept for `finish`. (Not `Request.Get_status`, which leaves it:
            here the `Test` that completes a request so seen gives an empty status.)"""
            if landed_count[0] is None:
                if not receive.Test(status):
                    return SILENT
                landed_count[0] = status.Get_count(MPI.BYTE)
            return GENERAL_WAY if landed_count[0] == PAIR_BYTES else READIED
        return publish, finish, spoken

    def _all_inputs(self, buf: Any, call: tuple[int, ...] | None, reads: Reads | None = None,
                    into: Any | None = None) -> list[Any] | None:
        """One message per peer carries a header, the call's descriptor (zeros when no call is
        checked) and the size of the input, and, when the input is small (up to
        `one_shot_bytes`), the input too (`_one_shot_exchange`): a small call checks itself
        in the exchange that moves it."""
        host = buf if self.xp is numpy else buf.get()
        with_data = host.nbytes <= self.one_shot_bytes
        if call is None and not with_data:
            return self._exchange(buf)
        sent = host if with_data else NO_DATA
        inputs = self._one_shot_exchange(sent.shape, sent.dtype)(sent,
                                                                  call_line(call, host.nbytes))
        if not with_data:
            return self._exchange(buf)
        return inputs if self.xp is numpy else [self.xp.asarray(i) for i in inputs]

    def prepare_all_inputs(self, shape: tuple[int, ...], dtype: Any, collective: str,
                           call: tuple[int, ...] | None, moved: list[Moved] | None = None,
                           reads: Reads | None = None) -> Exchange:
        """The one-shot exchange (`_one_shot_exchange`) with the call's naming, counting and
        header worked out beforehand (`_prepare_one_shot`). Every input moves whole (`reads`
        is not needed)."""
        nbytes = math.prod(shape) * numpy.dtype(dtype).itemsize
        if (self.xp is not numpy or not 0 <= nbytes <= self.one_shot_bytes or self.size == 1
                or self.off_node):  # (across nodes, the general way counts those bytes apart)
            return super().prepare_all_inputs(shape, dtype, collective, call, moved, reads)
        return self._prepare_one_shot(shape, dtype, collective, call, moved,
                                      self._one_shot_exchange(shape, dtype), reads)

    def _one_shot_exchange(self, shape: tuple[int, ...],
                           dtype: Any) -> Callable[[numpy.ndarray, memoryview], list[Any]]:
        """exchange(host, line): send the header `line` (`call_line`) and `host` (of `shape`
        and `dtype`, on the host) to every peer in one packet, and take each peer's; return
        every rank's input, views within the packets, valid until the next call (`into` is
        placed out of them by the caller, `_prepare_one_shot`). CallsDiffer,
        or MismatchError, if a peer's header differs. Each receive has room for the largest
        such packet, so a peer whose call differs cannot overrun it.

        Small calls come often, so what does not depend on the data is made once per shape
        and dtype, and kept: the packet and its persistent requests (`_Shot`), every rank's
        input as views; a call copies its input in, starts the requests, and compares the
        headers as words.
        """
        return kept(self._exchanges, (shape, dtype), KEPT_SIZES,
                    lambda: self._new_one_shot_exchange(shape, dtype))

    def _new_one_shot_exchange(self, shape: tuple[int, ...],
                               dtype: Any) -> Callable[[numpy.ndarray, memoryview], list[Any]]:
        """`_one_shot_exchange`, made."""
        nbytes = math.prod(shape) * numpy.dtype(dtype).itemsize
        landing, rank, start_all = self._landed(), self.rank, MPI.Prequest.Startall
        headers = landing.headers
        held: list[Any] = []  # the packet (a `_Shot`) and every rank's input within the packets

        def exchange(host: numpy.ndarray, line: memoryview,
                     into: Any | None = None) -> list[Any]:
            if not held or held[0].freed:  # (calls of other sizes may have pushed it out)
                shot = self._outgoing(CALL_LINE.size + nbytes)
                views = [b[CALL_LINE.size:CALL_LINE.size + nbytes] for b in landing.buffers]
                views[rank] = shot.packet[CALL_LINE.size:]
                held[:] = shot, [v.view(dtype).reshape(shape) for v in views]
            shot, inputs = held
            shot.header[:] = line
            inputs[rank][...] = host
            start_all(shot.requests)
            for request in shot.requests:  # (one request's Test costs a third of a Testall)
                polls = self.spin
                while not request.Test():  # a short spin first: a peer is most often about to
                    polls -= 1
                    if polls < 0:
                        break
                if polls < 0:  # then wait for them all, naming any peer that does not come
                    for peer, receive in zip(self._peers, landing.receives):
                        self._wait_all([receive], peer, "a message")
                    self._wait_all(shot.sends, None, "its sends to complete")
                    break
            for header in headers:
                if header != line:
                    self._compare_lines(line, headers)  # raises
            return inputs

        return exchange

    def _outgoing(self, nbytes: int) -> _Shot:
        """The one-shot packet of `nbytes` and its persistent requests, kept for the next call
        of the same size; made with the persistent receives (`_Landing`) on first use."""
        shot = self._sending.get(nbytes)
        if shot is None:
            if len(self._sending) >= KEPT_SIZES:  # the oldest size goes
                self._sending.pop(next(iter(self._sending))).free()
            shot = self._sending[nbytes] = _Shot(self.comm, self._peers, nbytes,
                                                 self._landed().receives)
        return shot

    def _landed(self) -> _Landing:
        """Where peers' packets land (`_Landing`), made on first use."""
        if self._landing is None:
            self._landing = _Landing(self.comm, self.rank, self._peers, self.one_shot_bytes)
        return self._landing

    def _exchange(self, buf: Any) -> list[Any]:
        """Every rank's `buf`. Device inputs, which are small, travel as host copies."""
        host = buf if self.xp is numpy else buf.get()
        inputs = [numpy.empty_like(host) for _ in range(self.size)]
        inputs[self.rank][...] = host
        self._post_all(host, inputs)
        return inputs if self.xp is numpy else [self.xp.asarray(i) for i in inputs]

    def _post_all(self, mine: numpy.ndarray, into: list[numpy.ndarray]) -> None:
        """Send `mine` to every peer and receive each peer's into `into[peer]`: every exchange
        posted at once, then each peer waited for in turn (so a timeout names the first one
        missing), about one message time instead of N-1."""
        peers = [r for r in range(self.size) if r != self.rank]
        receives = [self.comm.Irecv(_bytes(into[r]), r, TAG) for r in peers]
        sends = [self.comm.Isend(_bytes(mine), r, TAG) for r in peers]
        for peer, request in zip(peers, receives):
            self._wait_all([request], peer, "a message")
        self._wait_all(sends, None, "its sends to complete")

    def _barrier(self) -> None:
        request = self.comm.Ibarrier()
        self.wait(request.Test, None, "the barrier")

    def check_thread(self) -> None:
        """MPI calls from the progress thread, while the caller's thread, or another
        communicator's progress thread, may make their own: MPI must have been initialised at
        MPI_THREAD_MULTIPLE (what mpi4py asks for unless `mpi4py.rc.thread_level` says
        otherwise)."""
        level = MPI.Query_thread()
        if level < MPI.THREAD_MULTIPLE:
            names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED:
                     "MPI_THREAD_FUNNELED", MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED"}
            raise CollectiveError(f"calls on the progress thread (async_op=True, the torch "
                                  f"backend) need MPI initialised at MPI_THREAD_MULTIPLE, but "
                                  f"it is at {names.get(level, level)}: leave "
                                  f"mpi4py.rc.thread_level at 'multiple', its default")

    def close(self) -> None:
        if not self.closed and not MPI.Is_finalized():
            self._free_persistent()
            self.comm.Free()
        super().close()

    def _free_persistent(self) -> None:
        """Free the one-shot requests; a receive still waiting (a call that failed) is
        cancelled first, and a send still going is freed to finish on its own."""
        receives = [] if self._landing is None else self._landing.receives
        for request in receives:
            if not request.Test():
                request.Cancel()
                request.Wait()
            request.Free()
        for shot in self._sending.values():
            shot.free()
        self._free_pair_packets()
        self._landing, self._sending, self._exchanges = None, {}, {}

    def _pair_packet(self, peer: int, size: int) -> _Packet:
        """The packet of `size` bytes to `peer` and its persistent send, kept for the steps of
        that size (`_pair_phases`); the oldest kept go, all at once, past KEPT_SIZES."""
        made = self._pair_packets.get((peer, size))
        if made is None or made.freed:
            if len(self._pair_packets) >= KEPT_SIZES:
                self._free_pair_packets()  # (`kept` would drop the sends unfreed)
            made = self._pair_packets[(peer, size)] = _Packet(self.comm, peer, size)
        return made

    def _free_pair_packets(self) -> None:
        """Free the pair steps' sends (one still going finishes on its own) and packets; a
        step that held one takes a new one (`_Packet.freed`)."""
        for made in self._pair_packets.values():
            made.send.Free()
            made.freed = True
        self._pair_packets = {}
