"""MPI point-to-point through mpi4py.

The transport works on a `Dup` of the caller's communicator, so its messages can never match
the caller's own. Payloads travel as raw bytes with uppercase (buffer) methods: nothing is
pickled, any dtype works, and the reduction happens in NumPy after the bytes land.

Waits poll `Test` and yield the CPU between polls (see `Transport.wait`) rather than block in
MPI: MPICH busy-polls inside a blocking call, which starves the peer we are waiting for when
ranks outnumber cores.
"""

from __future__ import annotations

import os
from typing import Any

import numpy
from mpi4py import MPI

from .base import ReduceOp, Transport, segments

TAG = 17


def _bytes(buf: Any) -> list:
    return [buf.view(numpy.uint8), MPI.BYTE]


def oversubscribed(comm: MPI.Comm) -> bool:
    """True when the ranks of `comm` on this node outnumber the cores they may run on."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cores = set().union(*node.allgather(os.sched_getaffinity(0)))
        return node.Get_size() > len(cores)
    finally:
        node.Free()


class MPITransport(Transport):
    """Point-to-point over a duplicate of `comm` (default `MPI.COMM_WORLD`)."""

    name = "mpi"
    # Measured (README, "Shared memory"): below this, exchanging every input at once beats
    # the ring's 2(N-1) steps.
    default_one_shot_bytes = 64 << 10

    def __init__(self, comm: MPI.Comm | None = None, **options: Any) -> None:
        self.comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        super().__init__(self.comm.Get_rank(), self.comm.Get_size(), **options)
        if oversubscribed(self.comm):
            self.spin = 0
        # Two segments of scratch: one is reduced while the next one arrives. (A segment holds
        # at least one element, and no dtype is wider than 64 bytes.)
        nbytes = max(self.segment_bytes, 64)
        self._scratch = [numpy.empty(nbytes, numpy.uint8) for _ in range(2)]

    def _wait_all(self, requests: list[MPI.Request], peer: int | None, what: str) -> None:
        self.wait(lambda: MPI.Request.Testall(requests), peer, what)

    def _sendrecv(self, sendbuf: Any | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> None:
        requests = []
        if recvbuf is not None:
            requests.append(self.comm.Irecv(_bytes(recvbuf), src, TAG))
        if sendbuf is not None:
            requests.append(self.comm.Isend(_bytes(sendbuf), dst, TAG))
        self._wait_all(requests, src if recvbuf is not None else dst, "a message")

    def _sendrecv_reduce(self, sendbuf: Any | None, dst: int | None,
                         accbuf: Any, src: int, op: ReduceOp, inbuf: Any) -> None:
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
                receives.append(post(k + 2))
        self._wait_all(sends, dst, "a send to complete")

    def _all_inputs(self, buf: Any) -> list[Any]:
        """Post every exchange at once, then wait for each peer in turn (so a timeout names the
        first one missing): about one message time instead of the default's N-1."""
        inputs = [numpy.empty_like(buf) for _ in range(self.size)]
        inputs[self.rank][...] = buf
        peers = [r for r in range(self.size) if r != self.rank]
        receives = [self.comm.Irecv(_bytes(inputs[r]), r, TAG) for r in peers]
        sends = [self.comm.Isend(_bytes(buf), r, TAG) for r in peers]
        for peer, request in zip(peers, receives):
            self._wait_all([request], peer, "a message")
        self._wait_all(sends, None, "its sends to complete")
        return inputs

    def _barrier(self) -> None:
        request = self.comm.Ibarrier()
        self.wait(request.Test, None, "the barrier")

    def close(self) -> None:
        if not self.closed and not MPI.Is_finalized():
            self.comm.Free()
        super().close()
