"""Point-to-point messages on a communicator: what `send`, `recv` and `sendrecv` add to the
transport's own exchange.

Only two ranks take part in a message, so the call check of the collectives, which every rank
makes, does not apply: the pair checks the message itself (`check.pair_agree`) before its data
moves; a sendrecv with two peers, each half apart, in the order its peers come (`two_peers`).
Messages are numbered per pair: the k-th that a rank sends to a peer is the k-th that
the peer receives from it, and "send #3 to rank 1" names the call in traces, timeouts and
errors. The data moves by the transport's exchange (`Transport.message`; a send half started
ahead, by `isend`), counted in `stats` and traced like any transfer; the check's own exchanges
are neither.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Collection

from transports.base import Transport
from transports.errors import CollectiveError, InvalidArgumentError, MismatchError

from .arguments import check_root, check_writeable
from .check import MessagesDiffer, hear, judge_pair, messages


# How long a sendrecv with two peers waits for the second once the first has come, before it
# moves a half alone (`two_peers`). Ranks of a ring shift come within it and move both halves
# at once, as the transport moves a sendrecv; one of a pipeline waits it out once. Measured
# on 3 ranks sharing 2 cores, a ring of 1 MiB on the mpi transport: without it more than
# half of the calls moved a half alone, with it 4 in 200 at most (docs/performance.md).
GRACE_S = 200e-6


class MessageName:
    """A message call's name, as errors and traces give it ("sendrecv (send #3 to rank 1, recv
    #3 from rank 1)"), made into words only when one is shown: at 8 B, formatting it costs a
    small message as much as its copies."""

    __slots__ = ("dst", "sent", "src", "received")

    def __init__(self, dst: int | None, sent: int, src: int | None, received: int) -> None:
        self.dst, self.sent, self.src, self.received = dst, sent, src, received

    def __str__(self) -> str:
        if self.src is None:
            return f"send #{self.sent} to rank {self.dst}"
        if self.dst is None:
            return f"recv #{self.received} from rank {self.src}"
        return (f"sendrecv (send #{self.sent} to rank {self.dst}, recv #{self.received} from "
                f"rank {self.src})")


class Messages:
    """The point-to-point messages of one rank, numbered per peer."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.sent = [0] * size  # messages sent to each rank
        self.received = [0] * size  # messages received from each rank

    def check(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
              src: int | None) -> bool:
        """Refuse ranks that are no peers and a read-only `recvbuf` (the buffers' types are
        checked already); True for a rank that exchanges with itself: a copy, not a message."""
        for peer, name in ((dst, "dst"), (src, "src")):
            if peer is not None:
                check_root(peer, len(self.sent), name)
        if recvbuf is not None:
            check_writeable(recvbuf, "recvbuf" if sendbuf is not None else "buf")
        if self.rank not in (dst, src):
            return False
        if (dst, src) != (self.rank, self.rank) or sendbuf.size != recvbuf.size \
                or sendbuf.dtype != recvbuf.dtype:
            raise InvalidArgumentError(f"rank {self.rank} cannot send to or receive from "
                                       f"itself, but by a sendrecv to and from itself of "
                                       f"buffers alike in size and dtype (a copy)")
        return True

    def describe(self, mine: Any | None, dst: int | None, into: Any | None,
                 src: int | None) -> tuple[MessageName, dict[int, tuple[int, ...]]]:
        """A call's messages (flat `mine` to `dst`, flat `into` from `src`, either None), by
        their numbers: the call's name, and for each peer this rank's description of the
        messages between the two, for the check (check.messages). They count once `count`
        is called, after the check: a call both ends refused took no number."""
        if src is None:
            number = self.sent[dst] + 1
            return MessageName(dst, number, None, 0), {dst: messages((number, mine), None)}
        if dst is None:
            number = self.received[src] + 1
            return MessageName(None, 0, src, number), {src: messages(None, (number, into))}
        sent, expected = (self.sent[dst] + 1, mine), (self.received[src] + 1, into)
        where = MessageName(dst, sent[0], src, expected[0])
        if dst == src:
            return where, {dst: messages(sent, expected)}
        return where, {dst: messages(sent, None), src: messages(None, expected)}

    def count(self, dst: int | None, src: int | None) -> None:
        """The messages that `describe` numbered are under way."""
        if dst is not None:
            self.sent[dst] += 1
        if src is not None:
            self.received[src] += 1


def two_peers(transport: Transport, said: dict[int, tuple[int, ...]], mine: Any, dst: int,
              into: Any, src: int, count: Callable[[int | None, int | None], None]) -> None:
    """A checked sendrecv with two peers: `mine` to `dst`, `into` from `src` (`said`, this
    rank's description for each, `Messages.describe`), each half checked by its pair and moved
    once that pair agrees, then counted (`count(dst or None, src or None)`, as
    `Messages.count`).

    Neither half may wait for the other's peer. In a pipeline (rank 0 sends to rank 1 and
    receives from rank 2, which sends only once rank 1 has passed rank 0's message on), the
    recv's words come only after the send has gone; in the mirror of it, the send's receiver
    takes it only after the recv. So the rank says its words to both, waits until either peer
    has come (`say_pairs`), then a moment (GRACE_S) for the other. Where both have, both
    halves move at once. Where only `dst` has, the send is started (`isend`, which leaves it
    for `dst` where the transport can) and finished after the recv; where only `src` has, the
    recv moves first, alone. No rank waits in a circle: around a ring, the last rank to come
    finds its `src` come, and so on back. A half whose pair disagrees raises MessagesDiffer,
    once the other has moved if its pair agreed (its peer raises nothing, and waits for it)."""
    heard = transport.say_pairs(said)
    phase, step = transport.phase, transport.step
    sent: list[Callable[[], None]] = []  # the wait of a send started ahead

    def come() -> list[int]:
        return [peer for peer in (src, dst) if heard(peer) is not None]

    def agrees(peer: int) -> bool:
        try:
            judge_pair(transport, {peer: said[peer]}, {peer: heard(peer)})
            return True
        except MismatchError:
            return False  # judged again with the other, whose half still moves if it agrees

    def move(peers: Collection[int]) -> None:
        to, frm = (dst if dst in peers else None), (src if src in peers else None)
        transport.at(phase, step)
        transport.message(None if to is None else mine, to, None if frm is None else into,
                          frm, None)
        count(to, frm)
    transport.at("check")
    transport.wait(lambda: bool(come()), None, "a message",
                   late=lambda: [peer for peer in (dst, src) if heard(peer) is None])
    first = come()
    if len(first) == 1:  # (a moment for the other, which in a ring comes about now)
        deadline = time.perf_counter() + GRACE_S
        while len(first) == 1 and time.perf_counter() < deadline:
            os.sched_yield()
            first = come()
    rest = [dst, src]
    if len(first) == 1 and agrees(first[0]):
        if first == [src]:
            move(first)
        else:
            transport.at(phase, step)
            sent.append(transport.isend(mine, dst))
            count(dst, None)
        rest.remove(first[0])
    try:
        words = {peer: hear(transport, heard, peer) for peer in rest}
        try:
            judge_pair(transport, {peer: said[peer] for peer in rest}, words)
        except MessagesDiffer as differ:
            if differ.agreed:
                move(differ.agreed)
            raise
        move(rest)
    except BaseException:
        # A send started ahead may be left for `dst` to read where it lies: it is finished
        # before the caller has its buffer back. The first error is what the caller hears.
        for wait in sent:
            with contextlib.suppress(CollectiveError):
                wait()
        raise
    for wait in sent:
        wait()
