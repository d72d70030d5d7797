"""A persistent pool of real `mpiexec` ranks that run test bodies sent over local connections.

Starting an MPI job costs a second or so; a property test runs hundreds of examples. So the
test process starts one job of `MAX_RANKS` ranks (`pool_worker.py`) and keeps it: each rank
builds, once, a communicator for every sub-size 1..MAX_RANKS, transport and variant, then
waits for work in a socket read (MPICH busy-polls inside a blocking MPI call, which would steal
the cores the working ranks need). An example is sent to ranks 0..k-1 of the pool; each runs
the named body from `cases.py` on its size-k communicator and sends back what it ended with.

Messages go through `multiprocessing.connection`, authenticated with a key the ranks get in
their environment. A rank that does not answer in time fails the example with its rank named,
and the pool is killed whole (its own process group) and started afresh for the next example.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from launch import ROOT, mpiexec_path, rank_env

MAX_RANKS = 6
# Communicator options the tests choose between: the transport's defaults; the ring always,
# with many segments per chunk on test-sized buffers (Gloo's maxSegmentSize knob); the
# one-shot all-reduce for every buffer a test sends; and no call check (check.py), which is
# itself a barrier and would hide a transport's barrier that does not hold.
VARIANTS = {"auto": {}, "ring": {"segment_bytes": 4096, "one_shot_bytes": 0},
            "one_shot": {"one_shot_bytes": 1 << 20}, "unchecked": {"check": False}}
# Hierarchical communicators over virtual nodes, (nodes, ranks per node), keyed
# ("hierarchical", "MxK", M*K); every all-reduce on them takes the hierarchical algorithm, its
# steps cut in many segments (test_hierarchical.py).
NODE_SHAPES = ((2, 2), (2, 3), (3, 2))
HIERARCHICAL = {"segment_bytes": 4096, "one_shot_bytes": 0}
START_TIMEOUT = 120.0
ANSWER_TIMEOUT = 40.0  # longer than a rank's own collective timeout, so that one speaks first
RANK_TIMEOUT = 20.0
AUTHKEY_VARIABLE = "RINGCC_POOL_AUTHKEY"  # the key, in hex, in the ranks' environment


def receive(connection: Connection, timeout: float) -> Any:
    """The next message, or None if none came within `timeout` seconds or the other side has
    gone."""
    try:
        return connection.recv() if connection.poll(timeout) else None
    except (EOFError, OSError):
        return None


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
        self.connections: list[Connection] = []
        self.log = tempfile.TemporaryFile(mode="w+")

    def run(self, case: str, size: int, transport: str, variant: str = "auto",
            **example: Any) -> list[dict]:
        """Run `cases.<case>(comm, **example)` on `size` ranks; their results in rank order."""
        if self.process is None:
            self._start()
        for rank in range(size):
            self.connections[rank].send((case, (transport, variant, size), example))
        replies = [self._answer(rank, case) for rank in range(size)]
        for rank, reply in enumerate(replies):
            if reply[0] == "raised":
                raise RankFailed(rank, *reply[1:])
        return [reply[1] for reply in replies]

    def _answer(self, rank: int, case: str) -> Any:
        reply = receive(self.connections[rank], ANSWER_TIMEOUT)
        if reply is None:
            output = self._output()
            self.close()
            raise AssertionError(f"rank {rank} did not answer {case}: it has gone, or took "
                                 f"over {ANSWER_TIMEOUT:g} s; the pool was restarted\n{output}")
        return reply

    def _start(self) -> None:
        authkey = os.urandom(32)
        server = socket.create_server(("127.0.0.1", 0))
        command = [mpiexec_path(), "-n", str(MAX_RANKS), sys.executable,
                   str(Path(__file__).with_name("pool_worker.py")),
                   str(server.getsockname()[1]), ",".join(self.transports), str(RANK_TIMEOUT)]
        self.log.seek(0)
        self.log.truncate()
        self.process = subprocess.Popen(command, cwd=ROOT,
                                        env=rank_env(**{AUTHKEY_VARIABLE: authkey.hex()}),
                                        stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        by_rank: dict[int, Connection] = {}
        try:
            while len(by_rank) < MAX_RANKS:
                connection = _accept(server, authkey, deadline)
                rank = receive(connection, deadline - time.monotonic())
                if rank is None:
                    raise RuntimeError("a rank connected but did not say which it is")
                by_rank[rank] = connection
            self.connections = [by_rank[rank] for rank in range(MAX_RANKS)]
            for rank, connection in enumerate(self.connections):
                if receive(connection, deadline - time.monotonic()) != "ready":
                    raise RuntimeError(f"pool rank {rank} failed to start")
        except (OSError, EOFError, AuthenticationError, RuntimeError) as error:
            self.connections = list(by_rank.values())
            output = self._output()
            self.close()
            raise RuntimeError(f"the MPI test pool did not start: {error}\n{output}") from None
        finally:
            server.close()

    def _output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def close(self) -> None:
        """Stop the ranks: politely, then by killing their process group."""
        if self.process is None:
            return
        for connection in self.connections:
            try:
                connection.send("quit")
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
        for connection in self.connections:
            connection.close()
        self.process, self.connections = None, []


def _accept(server: socket.socket, authkey: bytes, deadline: float) -> Connection:
    """The next connection to `server`, authenticated as `Listener.accept` does it (whose
    accept cannot time out); OSError once `deadline` (time.monotonic) has passed."""
    server.settimeout(max(deadline - time.monotonic(), 1e-3))
    sock, _ = server.accept()
    sock.setblocking(True)
    connection = Connection(sock.detach())
    deliver_challenge(connection, authkey)
    answer_challenge(connection, authkey)
    return connection
