"""POSIX shared memory among the ranks of one node, and host memory as a kind of slot memory.

Each rank creates one region and every other rank on the node maps it read-only: a rank writes
only its own region, and only reads its peers'. (A "region" here is a whole shared mapping; a
"segment" is always a piece of a message, as in `segment_bytes`.)

Lifetime: a region is created with mode 0600 under a random name, mapped by every rank, and
unlinked as soon as all have mapped it. From then on it has no name, and the kernel frees it
when the last rank unmaps it or dies: nothing is left in /dev/shm after a normal exit, an
exception or `kill -9`. (Only a rank killed between create and unlink can leave one behind.)

Reading a peer's ordinary memory. Linux lets a process copy straight out of another process of
the same user (cross-memory attach, `process_vm_readv`, as MPICH does above 8 KiB), or into
it (`process_vm_writev`), in one copy, with no shared region in between. A security policy
may refuse it (Yama's ptrace_scope, a container's seccomp profile), so `can_read_peers` tries
both once, on every rank, before the transport relies on them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import threading
import weakref
from typing import Any

import numpy
from mpi4py import MPI

from .base import ReduceOp, buffer_address
from .errors import CollectiveError

SHM_DIR = "/dev/shm"


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_process_vm_readv = getattr(_libc, "process_vm_readv", None)  # Linux only
_process_vm_writev = getattr(_libc, "process_vm_writev", None)
for _call in (_process_vm_readv, _process_vm_writev):
    if _call is not None:
        _call.restype = ctypes.c_ssize_t
# Their arguments are passed as ctypes values of the right types (pid_t is an int), not
# converted through `argtypes`: on this path a call is a read of a peer's buffer, and the
# conversion took 2 of the 4 us a call cost before it moved a byte.
_ONE_IOVEC, _NO_FLAGS = ctypes.c_ulong(1), ctypes.c_ulong(0)


_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_shared(fd: int, nbytes: int, writable: bool) -> numpy.ndarray:
    """Map `nbytes` of `fd` shared, as bytes that are unmapped once no array uses them.

    Not Python's `mmap.mmap`, which keeps a duplicate of `fd` open for as long as the mapping
    lives: a rank maps one region per peer for the communicator and again for every registered
    buffer, which would hold N descriptors per buffer against the process's limit."""
    protection = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    address = _libc.mmap(None, nbytes, protection, mmap.MAP_SHARED, fd, 0)
    if address in (None, _MAP_FAILED):
        error = ctypes.get_errno()
        raise OSError(error, f"mmap of {nbytes} bytes: {os.strerror(error)}")
    memory = (ctypes.c_uint8 * nbytes).from_address(address)
    unmap = weakref.finalize(memory, _libc.munmap, address, nbytes)  # when the last view goes
    unmap.atexit = False  # at exit the process's end unmaps it, after every exit hook has run
    # The array holds `memory`, as every view of it does; a peer's region is read-only to
    # the buffer too, so that no view of it can be made writeable (a write would be SIGSEGV).
    buffer = memoryview(memory) if writable else memoryview(memory).toreadonly()
    return numpy.frombuffer(buffer, numpy.uint8)


def read_peer(pid: int, address: int, into: numpy.ndarray) -> None:
    """Copy `into.nbytes` bytes from `address` in process `pid` into `into` (contiguous):
    one copy, by the kernel. OSError if the kernel refuses."""
    _cross(_process_vm_readv, "process_vm_readv", pid, buffer_address(into), into.nbytes, address)


def read_peer_bytes(pid: int, address: int, local: int, nbytes: int) -> None:
    """`read_peer` of `nbytes` into this process's memory at `local` (an address: where a
    call reads into several places of one array, making a view of each cost more than the
    read's own Python)."""
    _cross(_process_vm_readv, "process_vm_readv", pid, local, nbytes, address)


def write_peer(pid: int, address: int, data: numpy.ndarray) -> None:
    """Copy `data` (contiguous) to `address` in process `pid`: one copy, by the kernel.
    OSError if the kernel refuses."""
    _cross(_process_vm_writev, "process_vm_writev", pid, buffer_address(data), data.nbytes, address)


def write_peer_bytes(pid: int, address: int, local: int, nbytes: int) -> None:
    """`write_peer` of the `nbytes` at `local` in this process (an address, as
    `read_peer_bytes` takes one)."""
    _cross(_process_vm_writev, "process_vm_writev", pid, local, nbytes, address)


# A kernel copy whose destination lies 1 to 15 bytes past its source, counted within a page
# ((destination - source) mod 4096), runs at a quarter of its speed on some cores (AMD EPYC
# here: the fast string copy that the kernel's copies use stalls on the page offsets that
# alias): read between two processes, 1 MiB took 360 us so, 82 us at an offset of 0, 16 or
# 2048 (docs/performance.md, "Copies whose ends nearly alias"). Such a move of SHIFTED_LEAST
# bytes or more goes through a bounce buffer (`_shifted`), a piece of BOUNCE_BYTES at a time.
SHIFTED_LEAST = 16 << 10
# 16 to 31 bytes past, a copy that streams out of the caches runs at about half its speed:
# 16 MiB read in 2.6-3.4 ms so, 1.1-1.7 at an offset of 0 or 32, 1.8-2.4 through the
# bounce; in the caches, at 4 MiB and less, at full speed, where the bounce costs (4 MiB:
# 0.28-0.32 ms, bounced 0.37-0.40). So such a move of NEAR_SHIFTED_LEAST bytes or more
# goes through the bounce too (docs/performance.md, "Copies whose ends nearly alias").
NEAR_SHIFTED_LEAST = 8 << 20
BOUNCE_BYTES = 1 << 20  # (a 16 MiB read took 1.9-2.1 ms so, 3.2-3.5 in pieces of 256 KiB)
PAGE = 4096
_bounces = threading.local()  # each thread's bounce buffer (`_shifted`)


def _aliases(destination: int, source: int, nbytes: int) -> bool:
    """Whether a copy of `nbytes` from `source` to `destination` (addresses) is one the kernel
    makes slowly: the destination 1 to 15 bytes past the source, counted within a page, or of
    NEAR_SHIFTED_LEAST bytes or more, 16 to 31."""
    past = (destination - source) % PAGE
    return 0 < past < 16 or 16 <= past < 32 and nbytes >= NEAR_SHIFTED_LEAST


def half_a_page_from(address: int, start: int) -> int:
    """How far past `start` (a buffer's first byte) lies the first byte that is half a page
    from `address` within a page: where a kernel copy of the bytes at `address` lands at full
    speed (`_aliases`), as a bounce and a reduced read's scratch place it."""
    return (address + PAGE // 2 - start) % PAGE


def _cross(call: Any, name: str, pid: int, base: int, nbytes: int, address: int) -> None:
    """Move `nbytes` bytes between `base` here and `address` in process `pid` with `call`
    (process_vm_readv or process_vm_writev), which may move less than asked at a time."""
    if call is None:
        raise OSError(f"no {name} here")
    reads = call is _process_vm_readv
    if nbytes >= SHIFTED_LEAST and _aliases(*((base, address) if reads else (address, base)),
                                            nbytes):
        _shifted(call, name, pid, base, nbytes, address, reads)
    else:
        _whole(call, name, pid, base, nbytes, address)


def _whole(call: Any, name: str, pid: int, base: int, nbytes: int, address: int) -> None:
    """`_cross` as the kernel moves it, all of it however many calls that takes."""
    done = 0
    while done < nbytes:
        here = _IoVec(base + done, nbytes - done)
        there = _IoVec(address + done, nbytes - done)
        moved = call(pid, ctypes.byref(here), _ONE_IOVEC, ctypes.byref(there), _ONE_IOVEC,
                     _NO_FLAGS)
        if moved <= 0:  # 0: the peer's mapping ended early, which a right address never does
            error = ctypes.get_errno()
            raise OSError(error, f"{name} with pid {pid}: {os.strerror(error)}")
        done += moved


def _shifted(call: Any, name: str, pid: int, base: int, nbytes: int, address: int,
             reads: bool) -> None:
    """`_cross` of a move whose ends nearly alias (`_aliases`), through this thread's bounce
    buffer placed half a page from the peer's end, and so about half a page from ours: the
    kernel's copy between the peer and the bounce, and a copy here between the bounce and
    `base`, each at full speed (the second costs a fraction of what the slow kernel copy
    loses)."""
    bounce = getattr(_bounces, "buffer", None)
    if bounce is None:
        bounce = _bounces.buffer = numpy.empty(BOUNCE_BYTES + PAGE, numpy.uint8)
    start = bounce.ctypes.data
    for lo in range(0, nbytes, BOUNCE_BYTES):
        length = min(BOUNCE_BYTES, nbytes - lo)
        here, there = base + lo, address + lo
        between = start + half_a_page_from(there, start)
        if reads:
            _whole(call, name, pid, between, length, there)
            ctypes.memmove(here, between, length)
        else:
            ctypes.memmove(between, here, length)
            _whole(call, name, pid, between, length, there)


def can_read_peers(comm: MPI.Comm, pids: list[int], wanted: bool = True) -> bool:
    """Whether every rank of `comm` wants to, and may, read and write its peers' memory with
    `read_peer` and `write_peer`. Collective: each rank reads a word its right neighbour wrote
    and writes one of its own beside it, and all agree on the answer."""
    mark = numpy.array([0x72696E6763630000 + comm.Get_rank(), 0], numpy.uint64)
    addresses = comm.allgather(mark.ctypes.data)
    right = (comm.Get_rank() + 1) % comm.Get_size()
    seen = numpy.zeros(1, numpy.uint64)
    works = False
    try:
        if wanted:
            read_peer(pids[right], addresses[right], seen)
            # Write only into the process that the read proved to be the peer: where pids
            # mean nothing here, that pid may be someone else's.
            works = int(seen[0]) == 0x72696E6763630000 + right
            if works:
                write_peer(pids[right], addresses[right] + 8, mark[:1])
    except OSError:
        works = False
    return bool(comm.allreduce(works, op=MPI.LAND))  # after it, nobody uses `mark`


def create_region(nbytes: int) -> tuple[str, numpy.ndarray]:
    """Create a shared region readable and writable by this user only; (path, bytes)."""
    path = os.path.join(SHM_DIR, f"ringcc-{secrets.token_hex(16)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.posix_fallocate(fd, 0, nbytes)  # claim the pages now: ENOSPC here, not SIGBUS later
        memory = map_shared(fd, nbytes, writable=True)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path, memory


def attach_region(path: str, nbytes: int) -> numpy.ndarray:
    """Map a peer's region read-only."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return map_shared(fd, nbytes, writable=False)
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
    """Slot memory in the host regions themselves, beside the control lines (see slots.py).
    Peers' ordinary buffers can also be read directly, where the kernel allows it."""

    xp = numpy
    device = "cpu"
    in_host_region = True  # the data lives in the shared host regions

    def __init__(self, single_copy: bool = True) -> None:
        self.single_copy = single_copy  # try reading peers' buffers directly (`read`)

    def can_read(self, comm: MPI.Comm, pids: list[int], usable: bool) -> bool:
        """Whether `read` and `write` work between every pair of ranks (`usable`: whether this
        rank's `pids` mean anything here). Collective."""
        return can_read_peers(comm, pids, wanted=self.single_copy and usable)

    def read(self, pid: int, address: int, into: Any) -> None:
        """into[...] = the bytes at `address` in process `pid`, complete when it returns."""
        read_peer(pid, address, into)

    def write(self, pid: int, address: int, data: Any) -> None:
        """The bytes at `address` in process `pid` = data, complete when it returns."""
        write_peer(pid, address, data)

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
