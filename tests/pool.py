"""A persistent pool of real `mpiexec` ranks that run test bodies sent over local sockets.

Starting an MPI job costs a second or so; a property test runs hundreds of examples. So the
test process starts one job of `MAX_RANKS` ranks (`pool_worker.py`) and keeps it: each rank
builds, once, a communicator for every sub-size 1..MAX_RANKS, transport and variant, then
waits for work in a socket read (MPICH busy-polls inside a blocking MPI call, which would steal
the cores the working ranks need). An example is sent to ranks 0..k-1 of the pool; each runs
the named body from `cases.py` on its size-k communicator and sends back what it ended with.

A rank that does not answer in time fails the example with its rank named, and the pool is
killed whole (its own process group) and started afresh for the next example.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from launch import ROOT, mpiexec_path, rank_env

MAX_RANKS = 6
# Communicator options the tests choose between: the transport's defaults; the ring always,
# with many segments per chunk on test-sized buffers (Gloo's maxSegmentSize knob); and the
# one-shot all-reduce for every buffer a test sends.
VARIANTS = {"auto": {}, "ring": {"segment_bytes": 4096, "one_shot_bytes": 0},
            "one_shot": {"one_shot_bytes": 1 << 20}}
START_TIMEOUT = 120.0
ANSWER_TIMEOUT = 40.0  # longer than a rank's own collective timeout, so that one speaks first
RANK_TIMEOUT = 20.0


def send_message(sock: socket.socket, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def recv_message(sock: socket.socket) -> Any:
    """The next message, or None when the other side has gone."""
    header = _recv_exactly(sock, 8)
    if header is None:
        return None
    payload = _recv_exactly(sock, struct.unpack("!Q", header)[0])
    return None if payload is None else pickle.loads(payload)


def _recv_exactly(sock: socket.socket, nbytes: int) -> bytes | None:
    chunks, left = [], nbytes
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class RankFailed(AssertionError):
    """A test body raised on a rank; `kind` is the exception's class name."""

    def __init__(self, rank: int, kind: str, message: str, trace: str) -> None:
        super().__init__(f"rank {rank} raised {kind}: {message}\n{trace}")
        self.rank, self.kind, self.message = rank, kind, message


class RankPool:
    """`MAX_RANKS` MPI ranks, started on first use, that run `cases.<name>` on request."""

    def __init__(self, transports: list[str]) -> None:
        self.transports = transports
        self.process: subprocess.Popen | None = None
        self.sockets: list[socket.socket] = []
        self.log = tempfile.TemporaryFile(mode="w+")

    def run(self, case: str, size: int, transport: str, variant: str = "auto",
            **example: Any) -> list[dict]:
        """Run `cases.<case>(comm, **example)` on `size` ranks; their results in rank order."""
        if self.process is None:
            self._start()
        for rank in range(size):
            send_message(self.sockets[rank], (case, (transport, variant, size), example))
        replies = [self._answer(rank, case) for rank in range(size)]
        for rank, reply in enumerate(replies):
            if reply[0] == "raised":
                raise RankFailed(rank, *reply[1:])
        return [reply[1] for reply in replies]

    def _answer(self, rank: int, case: str) -> Any:
        sock = self.sockets[rank]
        sock.settimeout(ANSWER_TIMEOUT)
        try:
            reply = recv_message(sock)
        except socket.timeout:
            reply = None
        if reply is None:
            output = self._output()
            self.close()
            raise AssertionError(f"rank {rank} did not answer {case} within "
                                 f"{ANSWER_TIMEOUT:g} s; the pool was restarted\n{output}")
        return reply

    def _start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(START_TIMEOUT)
        port = listener.getsockname()[1]
        command = [mpiexec_path(), "-n", str(MAX_RANKS), sys.executable,
                   str(Path(__file__).with_name("pool_worker.py")), str(port),
                   ",".join(self.transports), str(RANK_TIMEOUT)]
        self.log.seek(0)
        self.log.truncate()
        self.process = subprocess.Popen(command, cwd=ROOT, env=rank_env(), stdin=subprocess.DEVNULL,
                                        stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        by_rank: dict[int, socket.socket] = {}
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while len(by_rank) < MAX_RANKS:
                connection, _ = listener.accept()
                connection.settimeout(max(1.0, deadline - time.monotonic()))
                by_rank[recv_message(connection)] = connection
            self.sockets = [by_rank[rank] for rank in range(MAX_RANKS)]
            for rank, sock in enumerate(self.sockets):
                if recv_message(sock) != "ready":
                    raise RuntimeError(f"pool rank {rank} failed to start")
        except (OSError, RuntimeError) as error:
            output = self._output()
            self.close()
            raise RuntimeError(f"the MPI test pool did not start: {error}\n{output}") from None
        finally:
            listener.close()

    def _output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def close(self) -> None:
        """Stop the ranks: politely, then by killing their process group."""
        if self.process is None:
            return
        for sock in self.sockets:
            try:
                send_message(sock, "quit")
            except OSError:
                pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        for sock in self.sockets:
            sock.close()
        self.process, self.sockets = None, []
