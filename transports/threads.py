"""Ranks as threads in one process: for teaching, and for fast tests without MPI.

Each ordered pair of ranks has a mailbox; a send puts a copy of the buffer in it and a receive
takes the next one out, so messages between two ranks arrive in order, as with MPI. Every wait
is `Transport.wait`, bounded by the timeout. If any rank fails, the group is marked failed and
every waiting rank stops with `PeerFailedError`.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy

from .base import Heard, Transport
from .errors import MismatchError, PeerFailedError


class ThreadGroup:
    """What the threads of one group share: mailboxes and a failure flag."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.mailboxes = {(src, dst): queue.SimpleQueue()
                          for src in range(size) for dst in range(size) if src != dst}
        self.failed = threading.Event()

    def fail(self) -> None:
        """Release every rank that waits: one of them has failed."""
        self.failed.set()


class ThreadTransport(Transport):
    """One rank of a `ThreadGroup`."""

    name = "threads"

    def __init__(self, group: ThreadGroup, rank: int, **options: Any) -> None:
        super().__init__(rank, group.size, **options)
        self.group = group

    def sends_ahead(self, nbytes: int, reduced: bool = False) -> int:
        # A send only fills a mailbox; a reducing receiver takes segments, not one message.
        return 0 if reduced else self.size

    def _sendrecv(self, sendbuf: Any | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> None:
        if sendbuf is not None:
            self.group.mailboxes[(self.rank, dst)].put(sendbuf.copy())
        if recvbuf is not None:
            self.wait(lambda: self._take(src, recvbuf), src, "a message")

    def say_pairs(self, said: dict[int, tuple[int, ...]]) -> Heard:
        """Each peer's words go in its mailbox, and `heard` takes the peer's from ours, as
        messages: they arrive before the data that follows them."""
        for peer, words in said.items():
            self.group.mailboxes[(self.rank, peer)].put(numpy.array(words, numpy.uint64))
        got: dict[int, tuple[int, ...]] = {}

        def heard(peer: int) -> tuple[int, ...] | None:
            if peer not in got:
                theirs = numpy.empty(len(said[peer]), numpy.uint64)
                if not self._take(peer, theirs, 0.0):
                    return None
                got[peer] = tuple(theirs.tolist())
            return got[peer]
        return heard

    def _take(self, src: int, recvbuf: Any, most: float = 0.001) -> bool:
        """Whether the next message from `src` has come, taken into `recvbuf` if so; waits
        `most` seconds at most."""
        if self.group.failed.is_set():
            raise PeerFailedError(f"rank {self.named(self.rank)}: another rank failed "
                                  f"while this one waited for rank {self.named(src)}"
                                  f"{self.during()}")
        try:
            box = self.group.mailboxes[(src, self.rank)]
            message = box.get(timeout=most) if most else box.get_nowait()
        except queue.Empty:
            return False
        if message.nbytes != recvbuf.nbytes:
            raise MismatchError(f"rank {self.named(self.rank)} expected {recvbuf.nbytes} "
                                f"bytes from rank {self.named(src)} but got "
                                f"{message.nbytes}{self.during()}")
        recvbuf[...] = message.view(recvbuf.dtype)
        return True

    def _barrier(self) -> None:
        """Dissemination: in round k, signal rank + 2^k and wait for rank - 2^k.

        After ceil(log2 N) rounds each rank has heard, through others, from every rank; a
        rank that never comes is named by the timeout of whoever waits for it.
        """
        token = numpy.zeros(1, numpy.uint8)
        distance = 1
        while distance < self.size:
            self._sendrecv(token, (self.rank + distance) % self.size,
                           token, (self.rank - distance) % self.size)
            distance *= 2

