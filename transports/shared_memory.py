"""POSIX shared memory among the ranks of one node, and host memory as a kind of slot memory.

Each rank creates one region and every other rank on the node maps it read-only: a rank writes
only its own region, and only reads its peers'. (A "region" here is a whole shared mapping; a
"segment" is always a piece of a message, as in `segment_bytes`.)

Lifetime: a region is created with mode 0600 under a random name, mapped by every rank, and
unlinked as soon as all have mapped it. From then on it has no name, and the kernel frees it
when the last rank unmaps it or dies: nothing is left in /dev/shm after a normal exit, an
exception or `kill -9`. (Only a rank killed between create and unlink can leave one behind.)
"""

from __future__ import annotations

import mmap
import os
import secrets
from typing import Any

import numpy
from mpi4py import MPI

from .base import ReduceOp
from .errors import CollectiveError

SHM_DIR = "/dev/shm"


def create_region(nbytes: int) -> tuple[str, numpy.ndarray]:
    """Create a shared region readable and writable by this user only; (path, bytes)."""
    path = os.path.join(SHM_DIR, f"ringcc-{secrets.token_hex(16)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.posix_fallocate(fd, 0, nbytes)  # claim the pages now: ENOSPC here, not SIGBUS later
        memory = mmap.mmap(fd, nbytes)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path, numpy.frombuffer(memory, numpy.uint8)


def attach_region(path: str, nbytes: int) -> numpy.ndarray:
    """Map a peer's region read-only."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return numpy.frombuffer(mmap.mmap(fd, nbytes, access=mmap.ACCESS_READ), numpy.uint8)
    finally:
        os.close(fd)


def share_regions(comm: MPI.Comm, nbytes: int) -> list[numpy.ndarray]:
    """Every rank's region of `nbytes`, in rank order (this rank's writable), already unlinked.

    Collective. Each step ends in an agreement, so when any rank fails every rank raises and
    unlinks what it created, and no rank is left waiting for another.
    """
    path, failure = None, None
    try:
        try:
            path, own = create_region(nbytes)
        except OSError as error:
            failure = error
        paths = comm.allgather(path)
        if None in paths:
            raise CollectiveError(f"rank {paths.index(None)} could not create its shared-memory "
                                  f"region of {nbytes} bytes in {SHM_DIR}") from failure
        regions = []
        try:
            regions = [own if r == comm.Get_rank() else attach_region(p, nbytes)
                       for r, p in enumerate(paths)]
        except OSError as error:
            failure = error
        if not comm.allreduce(failure is None, op=MPI.LAND):  # also: every rank has attached
            raise CollectiveError("a rank could not map its peers' shared-memory regions") \
                from failure
        return regions
    finally:
        if path is not None:
            os.unlink(path)


def free_bytes() -> int:
    """Bytes free in SHM_DIR for this user (0 if it cannot be read)."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


class HostMemory:
    """Slot memory in the host regions themselves, beside the control lines (see slots.py)."""

    xp = numpy
    device = "cpu"
    in_host_region = True  # the data lives in the shared host regions

    def share(self, comm: MPI.Comm, regions: list[Any], offset: int, nbytes: int) -> list[Any]:
        """Every rank's data memory, flat bytes in rank order: a slice of each host region."""
        return [r[offset:offset + nbytes] for r in regions]

    def copy(self, dst: Any, src: Any) -> None:
        """dst[...] = src, complete when it returns."""
        dst[...] = src

    def reduce(self, op: ReduceOp, out: Any, mine: Any, theirs: Any) -> None:
        """out = op(mine, theirs), complete when it returns."""
        op(mine, theirs, out=out)

    def settle(self) -> None:
        """Before a one-shot exchange: every earlier read of a peer's memory has finished
        (host reads finish as they return)."""
