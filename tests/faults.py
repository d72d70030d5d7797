"""One fault, injected on rank 1 of a real MPI job, for test_reliability.py:

    mpiexec -n 3 python tests/faults.py DIR TRANSPORT FAULT TIMEOUT

Every rank first writes DIR/<rank>.json: its pid and the /dev/shm files it has mapped, so the
test can check afterwards that no process and no file of the job is left. Then the ranks make a
few collectives, and rank 1 gets call #2 wrong (see FAULTS). A rank that raises writes
DIR/<rank>.raised ("KIND: MESSAGE") and lets the exception go uncaught, which aborts the job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import numpy
from mpi4py import MPI

import collectives

COUNT = 100
BIG = 1 << 16  # elements: the ring, with several transfers per rank


def data(comm, count: int = COUNT, dtype: str = "float64") -> numpy.ndarray:
    return (numpy.arange(count) * (comm.rank + 1)).astype(dtype)


def rank_one(comm, wrong, right):
    """Rank 1's value and everyone else's."""
    return wrong if comm.rank == 1 else right


def tripwire(at: int, action):
    """A transfer hook that runs `action` at this rank's `at`-th transfer: a fault in the middle
    of a collective, after some of its messages have moved."""
    transfers = 0

    def hook(record: dict) -> None:
        nonlocal transfers
        transfers += 1
        if transfers == at:
            action()
    return hook


def in_the_middle(comm, action) -> None:
    """All-reduce by the ring, whatever the transport's one-shot limit; rank 1 runs `action` at
    its 3rd transfer."""
    if comm.rank == 1:
        comm.on_transfer(tripwire(3, action))
    comm.all_reduce(data(comm, BIG), algorithm="ring")


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fail() -> None:
    raise RuntimeError("rank 1 fails on purpose")


def skip(comm) -> None:
    """Rank 1 skips call #2 and goes on to the next one."""
    if comm.rank != 1:
        comm.all_reduce(data(comm))
    comm.broadcast(data(comm))


def skip_last(comm) -> None:
    """Rank 1 skips the last call and leaves: the others time out waiting for it."""
    if comm.rank != 1:
        comm.all_reduce(data(comm))


def sleep(comm) -> None:
    """Rank 1 comes to call #2 after the others have given up waiting for it."""
    if comm.rank == 1:
        time.sleep(comm.timeout + 3)
    comm.all_reduce(data(comm))


def untaken(comm) -> None:
    """Rank 0 sends to rank 1 while it receives from rank 2, below the call check (the
    transport's own exchange); rank 2 sends, rank 1 takes nothing and leaves: rank 0's wait
    names rank 1, whose part is missing, not rank 2, whose message has come."""
    transport, big = comm._transport, data(comm, BIG)
    if comm.rank == 0:
        transport.sendrecv(big, 1, numpy.empty_like(big), 2)
    elif comm.rank == 2:
        transport.sendrecv(big, 0, None, None)


FAULTS = {
    # Call #2 differs on rank 1: every rank raises MismatchError.
    "count": lambda c: c.all_reduce(data(c, rank_one(c, COUNT - 1, COUNT))),
    "dtype": lambda c: c.all_reduce(data(c, dtype=rank_one(c, "float32", "float64"))),
    "op": lambda c: c.all_reduce(data(c), op=rank_one(c, "max", "sum")),
    "root": lambda c: c.broadcast(data(c), root=rank_one(c, 1, 0)),
    "collective": lambda c: rank_one(c, c.all_gather, c.all_reduce)(data(c)),
    "skip": skip,
    "skip_last": skip_last,
    "sleep": sleep,
    "untaken": untaken,
    # Rank 1 dies in the middle of call #2, after some of its messages have moved.
    "kill": lambda c: in_the_middle(c, kill_self),
    "raise": lambda c: in_the_middle(c, fail),
}
MISMATCHES = ("count", "dtype", "op", "root", "collective", "skip")


def shm_files() -> set[str]:
    """The /dev/shm files this process has mapped, named or already unlinked."""
    with open("/proc/self/maps") as maps:
        return set(re.findall(r"\s(/dev/shm/\S+)", maps.read()))


def settle(request: MPI.Request, seconds: float) -> None:
    """Wait for `request` without spinning in MPI, for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while not request.Test() and time.monotonic() < deadline:
        time.sleep(1e-3)


def report(out: str, name: str, text: str) -> None:
    """Write DIR/`name` whole or not at all: the job may be killed meanwhile (another rank's
    abort), and the test must not read a file half written."""
    path = os.path.join(out, name)
    with open(path + ".part", "w") as part:
        part.write(text)
    os.replace(path + ".part", path)


def main() -> None:
    out, transport, fault, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    comm = collectives.init(transport, timeout=timeout, segment_bytes=4096)
    report(out, f"{comm.rank}.json", json.dumps({"pid": os.getpid(), "files": sorted(shm_files())}))
    comm.all_reduce(data(comm))  # call #1 is right everywhere
    try:
        FAULTS[fault](comm)
    except Exception as error:
        report(out, f"{comm.rank}.raised", f"{type(error).__name__}: {error}")
        if fault in MISMATCHES:  # every rank raises: let each one say so before the abort
            settle(MPI.COMM_WORLD.Ibarrier(), 10)
        raise
    comm.close()


if __name__ == "__main__":
    main()
