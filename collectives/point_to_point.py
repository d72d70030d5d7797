"""Point-to-point messages on a communicator: what `send`, `recv` and `sendrecv` add to the
transport's own exchange.

Only two ranks take part in a message, so the call check of the collectives, which every rank
makes, does not apply: the pair checks the message itself (`check.pair_agree`) before its data
moves. Messages are numbered per pair: the k-th that a rank sends to a peer is the k-th that
the peer receives from it, and "send #3 to rank 1" names the call in traces, timeouts and
errors. The data moves by the transport's exchange (`Transport.sendrecv`), counted in `stats`
and traced like any transfer; the check's own exchanges are neither.
"""

from __future__ import annotations

from typing import Any

from transports.errors import InvalidArgumentError

from .arguments import check_root, check_writeable
from .check import messages


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
