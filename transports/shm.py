"""Shared memory on one node: ranks copy, and reduce, straight out of each other's memory.

Each rank creates one POSIX shared-memory segment and every other rank on the node maps it
read-only: a rank writes only its own segment, and only reads its peers'. A segment holds

    control   64-byte lines, one counter per line (a counter sharing a line with other
              writes bounces between cores; one straddling two lines could tear):
                barrier    barriers this rank has entered
                published  one-shot inputs this rank has published, and their sizes
                consumed   one line per peer: segments this rank has taken from that peer
                slot j     one line per slot: which segment slot j holds (dst, seq), its size
    slots     SLOTS buffers of `segment_bytes`: outgoing messages, one segment at a time
    one-shot  two areas of `one_shot_bytes`, used by turns: the input of a small all-reduce

To send, a rank cuts the message into segments; for each it waits for a free slot, copies the
segment in, and writes the slot's line last. To receive segment `seq` from `src`, a rank waits
until one of src's slot lines names (itself, seq), then copies it, or reduces it
(`op(mine, slot, out=acc)`), straight out of src's slot into its own buffer, and counts it
consumed; the slot is free once that count has passed it. Sender and receiver work at once,
so a message of any size streams through SLOTS * segment_bytes per rank. Counters only grow:
nothing is reset between collectives. Publishing relies on one rank's stores becoming
visible to the others in program order, as on x86-64.

A small all-reduce instead publishes its whole input in a one-shot area (`_all_inputs`), and
every rank reads every other's. Memory per rank, whatever the message: SLOTS * segment_bytes
+ 2 * one_shot_bytes + the control page, 1.5 MiB by default. A wait spins briefly, then
yields the CPU (`Transport.wait`), and stops with PeerFailedError if the peer's process has
died rather than wait out the timeout.

The protocol is the one a CUDA IPC transport needs too; only the data's memory differs. Such a
transport subclasses `ShmTransport`: the control lines stay in this host segment, where the CPU
polls them, and it overrides `data_on_host`, `_share_data`, `_copy` and `_reduce` to keep the
slots and one-shot areas in device memory.

Lifetime: a segment is created with mode 0600 under a random name, mapped by every rank, and
unlinked as soon as all have mapped it. From then on it has no name, and the kernel frees it
when the last rank unmaps it or dies: nothing is left in /dev/shm after a normal exit, an
exception or `kill -9`. (Only a rank killed inside `init`, between create and unlink, can
leave one behind.)
"""

from __future__ import annotations

import mmap
import os
import secrets
from typing import Any

import numpy
from mpi4py import MPI

from .base import ReduceOp, Transport
from .errors import CollectiveError, MismatchError, PeerFailedError
from .mpi import check_same_options, oversubscribed

SHM_DIR = "/dev/shm"
LINE = 64  # bytes: a cache line, one counter each
PAGE = 4096
SLOTS = 4  # a sender fills some slots while its receiver empties others
WORDS = LINE // 8  # 8-byte words per line
# Control lines: two counters, then one per peer (consumed), then one per slot.
BARRIER, PUBLISHED, CONSUMED = 0, 1, 2


def on_one_node(comm: MPI.Comm) -> bool:
    """True when every rank of `comm` can share memory with every other (an MPI shared split)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size()
    finally:
        node.Free()


def create_segment(nbytes: int) -> tuple[str, numpy.ndarray]:
    """Create a shared segment readable and writable by this user only; (path, bytes)."""
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


def attach_segment(path: str, nbytes: int) -> numpy.ndarray:
    """Map a peer's segment read-only."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return numpy.frombuffer(mmap.mmap(fd, nbytes, access=mmap.ACCESS_READ), numpy.uint8)
    finally:
        os.close(fd)


def share_segments(comm: MPI.Comm, nbytes: int) -> list[numpy.ndarray]:
    """Every rank's segment of `nbytes`, in rank order (this rank's writable), already unlinked.

    Collective. Each step ends in an agreement, so when any rank fails every rank raises and
    unlinks what it created, and no rank is left waiting for another.
    """
    path, failure = None, None
    try:
        try:
            path, own = create_segment(nbytes)
        except OSError as error:
            failure = error
        paths = comm.allgather(path)
        if None in paths:
            raise CollectiveError(f"rank {paths.index(None)} could not create its shared-memory "
                                  f"segment of {nbytes} bytes in {SHM_DIR}") from failure
        segments = []
        try:
            segments = [own if r == comm.Get_rank() else attach_segment(p, nbytes)
                        for r, p in enumerate(paths)]
        except OSError as error:
            failure = error
        if not comm.allreduce(failure is None, op=MPI.LAND):  # also: every rank has attached
            raise CollectiveError("a rank could not map its peers' shared-memory segments") \
                from failure
        return segments
    finally:
        if path is not None:
            os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class ShmTransport(Transport):
    """Ranks of `comm` (default `MPI.COMM_WORLD`), all on one node, over shared memory."""

    name = "shm"
    # Both measured (README, "Shared memory"): slots this small stay in the caches, and
    # one-shot beats the ring up to this size.
    default_segment_bytes = 256 << 10
    default_one_shot_bytes = 256 << 10
    data_on_host = True  # slots and one-shot areas live in the host segment

    def __init__(self, comm: MPI.Comm | None = None, **options: Any) -> None:
        self.comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        try:
            super().__init__(self.comm.Get_rank(), self.comm.Get_size(), **options)
            if not on_one_node(self.comm):
                raise CollectiveError("the shm transport needs every rank on one node, but these "
                                      "ranks span nodes; use transport='mpi' or 'auto'")
            check_same_options(self.comm, self)
            if oversubscribed(self.comm):
                self.spin = 0
            self._setup()
        except BaseException:
            self.comm.Free()
            raise

    def _setup(self) -> None:
        size = self.size
        self.slot_bytes = max(LINE, self.segment_bytes // LINE * LINE)  # any itemsize divides it
        # At least a page, so that small exchanges (the call check too) always take an area.
        self._area_bytes = max(PAGE, -(-self.one_shot_bytes // LINE) * LINE)
        self._slot_line = CONSUMED + size
        control = -(-(self._slot_line + SLOTS) * LINE // PAGE) * PAGE
        data = SLOTS * self.slot_bytes + 2 * self._area_bytes
        nbytes = control + (data if self.data_on_host else 0)
        self._check_room(nbytes)
        segments = share_segments(self.comm, nbytes)
        # Counter i of rank r is self._ctl[r][i * WORDS], the size beside it the next word.
        # (Indexing a memoryview is several times cheaper than indexing an array.)
        self._ctl = [memoryview(s[:control]).cast("Q") for s in segments]
        self._own = self._ctl[self.rank]
        self._data = self._share_data(segments, control, data)
        self._slots = [[d[j * self.slot_bytes:(j + 1) * self.slot_bytes] for j in range(SLOTS)]
                       for d in self._data]
        self._slot_words = [(self._slot_line + j) * WORDS for j in range(SLOTS)]
        pids = self.comm.allgather(os.getpid())
        # Watch peers for death only if their pids mean something here (same pid namespace).
        self._pids = pids if all(_alive(p) for p in pids) else None
        self._sent = [0] * size  # segments sent to each rank
        self._taken = [0] * size  # segments taken from each rank (mirrors our consumed lines)
        self._occupant: list[tuple[int, int] | None] = [None] * SLOTS  # (dst, seq) per slot
        self._next_slot = 0
        self._expect = [0] * size  # the slot of each peer to look at first for our next segment
        self._barriers = 0
        self._one_shots = 0
        # Per one-shot area, the typed views of its last input and their (size, dtype): a
        # run of small all-reduces of one kind makes them once.
        self._areas: list[tuple[tuple[int, Any] | None, list[Any]]] = [(None, []), (None, [])]

    def _check_room(self, nbytes: int) -> None:
        """Fail on every rank, before anything is allocated, if /dev/shm cannot hold the job."""
        try:
            stat = os.statvfs(SHM_DIR)
            free = stat.f_bavail * stat.f_frsize
        except OSError:
            free = 0
        free = self.comm.allreduce(free, op=MPI.MIN)
        need = nbytes * self.size
        if free < need:
            raise CollectiveError(
                f"{SHM_DIR} has {free / 2**20:.1f} MiB free, but the shm transport needs "
                f"{need / 2**20:.1f} MiB ({self.size} ranks x {nbytes / 2**20:.1f} MiB: "
                f"{SLOTS} slots of segment_bytes={self.slot_bytes} plus 2 x one_shot_bytes="
                f"{self._area_bytes}); pass a smaller segment_bytes, enlarge {SHM_DIR} "
                f"(docker run --shm-size=...), or use transport='mpi'")

    # ---- where the data lives: overridden by a transport whose data is not in host memory --

    def _share_data(self, segments: list[Any], offset: int, nbytes: int) -> list[Any]:
        """Every rank's data memory (slots, then one-shot areas), flat bytes, in rank order."""
        return [s[offset:offset + nbytes] for s in segments]

    def _copy(self, dst: Any, src: Any) -> None:
        """dst[...] = src, complete when it returns."""
        dst[...] = src

    def _reduce(self, op: ReduceOp, out: Any, mine: Any, theirs: Any) -> None:
        """out = op(mine, theirs), complete when it returns."""
        op(mine, theirs, out=out)

    # ---- the protocol -----------------------------------------------------------------------

    def _sendrecv(self, sendbuf: Any | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> None:
        self._stream(sendbuf, dst, recvbuf, src, None, None)

    def _sendrecv_reduce(self, sendbuf: Any | None, dst: int | None,
                         accbuf: Any, src: int, op: ReduceOp, inbuf: Any) -> None:
        self._stream(sendbuf, dst, accbuf, src, op, inbuf)

    def _stream(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
                src: int | None, op: ReduceOp | None, inbuf: Any | None) -> None:
        """Publish `sendbuf` to `dst` while taking `recvbuf` from `src`, a slot at a time
        (with `op`: recvbuf = op(inbuf, what arrives))."""
        slot = self.slot_bytes
        out = sendbuf.view(numpy.uint8) if sendbuf is not None else None
        into = recvbuf.view(numpy.uint8) if recvbuf is not None else None
        n_out = 0 if out is None else -(-out.size // slot)
        n_in = 0 if into is None else -(-into.size // slot)
        k_out = k_in = 0
        while True:
            while k_out < n_out and self._slot_free():
                self._publish(out[k_out * slot:(k_out + 1) * slot], dst, out.size)
                k_out += 1
            while k_in < n_in:
                j = self._find(src)
                if j is None:
                    break
                if k_in == 0:
                    self._check_size(src, j, into.size)
                piece = into[k_in * slot:(k_in + 1) * slot]
                segment = self._slots[src][j][:piece.size]
                if op is None:
                    self._copy(piece, segment)
                else:
                    mine = inbuf.view(numpy.uint8)[k_in * slot:(k_in + 1) * slot]
                    self._reduce(op, piece.view(recvbuf.dtype), mine.view(recvbuf.dtype),
                                 segment.view(recvbuf.dtype))
                self._taken[src] += 1
                self._own[(CONSUMED + src) * WORDS] = self._taken[src]
                k_in += 1
            if k_out == n_out and k_in == n_in:
                return
            self.wait(lambda: (k_out < n_out and self._slot_free())
                      or (k_in < n_in and self._find(src) is not None),
                      src if k_in < n_in else dst, "a segment" if k_in < n_in else "a free slot")

    def _slot_free(self) -> bool:
        """Whether the receiver of what the next slot holds has taken it."""
        occupant = self._occupant[self._next_slot]
        if occupant is None:
            return True
        dst, seq = occupant
        return self._ctl[dst][(CONSUMED + self.rank) * WORDS] > seq

    def _publish(self, piece: Any, dst: int, nbytes: int) -> None:
        """Copy `piece` (of a message of `nbytes`) into the next slot, then say what it holds."""
        j = self._next_slot
        self._copy(self._slots[self.rank][j][:piece.size], piece)
        seq = self._sent[dst]
        word = self._slot_words[j]
        self._own[word + 1] = nbytes
        self._own[word] = (dst + 1) << 48 | seq  # last: the segment is now visible
        self._occupant[j] = (dst, seq)
        self._sent[dst] = seq + 1
        self._next_slot = (j + 1) % SLOTS

    def _find(self, src: int) -> int | None:
        """The slot of `src` that holds our next segment from it, or None if none does yet."""
        want = (self.rank + 1) << 48 | self._taken[src]
        ctl, j = self._ctl[src], self._expect[src]
        for _ in range(SLOTS):
            if ctl[self._slot_words[j]] == want:
                self._expect[src] = (j + 1) % SLOTS  # where the next one most likely is
                return j
            j = (j + 1) % SLOTS
        return None

    def _check_size(self, src: int, j: int, nbytes: int) -> None:
        sent = self._ctl[src][self._slot_words[j] + 1]
        if sent != nbytes:
            raise MismatchError(f"rank {self.rank} expected {nbytes} bytes from rank {src} but "
                                f"it sent {sent}"
                                + (f" during {self.where}" if self.where else ""))

    def _barrier(self) -> None:
        self._barriers += 1
        self._own[BARRIER * WORDS] = self._barriers
        self.wait(lambda: self._everyone(BARRIER, self._barriers), None, "the barrier",
                  late=lambda: self._behind(BARRIER, self._barriers))

    def _behind(self, counter: int, at_least: int) -> list[int]:
        """The ranks whose `counter` has not reached `at_least`."""
        return [r for r, ctl in enumerate(self._ctl) if ctl[counter * WORDS] < at_least]

    def _everyone(self, counter: int, at_least: int) -> bool:
        word = counter * WORDS
        for ctl in self._ctl:
            if ctl[word] < at_least:
                return False
        return True

    def _all_inputs(self, buf: Any) -> list[Any]:
        """Publish `buf` in this call's one-shot area and return every rank's area.

        The areas alternate between calls. Reusing one is safe without asking: a peer
        publishes call c-1 only after reading call c-2, and we saw every peer's call c-1.
        """
        nbytes = buf.nbytes
        if nbytes > self._area_bytes:
            return super()._all_inputs(buf)
        self._one_shots += 1
        call = self._one_shots
        area = call & 1
        key, inputs = self._areas[area]
        if key != (nbytes, buf.dtype):
            lo = SLOTS * self.slot_bytes + area * self._area_bytes
            inputs = [d[lo:lo + nbytes].view(buf.dtype) for d in self._data]
            self._areas[area] = ((nbytes, buf.dtype), inputs)
        self._copy(inputs[self.rank], buf)
        size_word = PUBLISHED * WORDS + 1 + area  # one per area, kept as long as the area
        self._own[size_word] = nbytes
        self._own[PUBLISHED * WORDS] = call
        self.wait(lambda: self._everyone(PUBLISHED, call), None, "one-shot inputs",
                  late=lambda: self._behind(PUBLISHED, call))
        for r, ctl in enumerate(self._ctl):
            if ctl[size_word] != nbytes:
                raise MismatchError(f"rank {self.rank} all-reduces {nbytes} bytes but rank {r} "
                                    f"{ctl[size_word]}"
                                    + (f" during {self.where}" if self.where else ""))
        return inputs

    def _check_peer(self, peer: int | None) -> None:
        if self._pids is None:
            return
        for r in range(self.size) if peer is None else (peer,):
            if r != self.rank and not _alive(self._pids[r]):
                raise PeerFailedError(f"rank {self.rank}: rank {r} (pid {self._pids[r]}) has died"
                                      + (f" during {self.where}" if self.where else ""))

    def close(self) -> None:
        if not self.closed:
            # Drop our views; each mapping goes when its last view does (or at exit).
            self._ctl, self._own, self._data, self._slots, self._areas = [], None, [], [], []
            if not MPI.Is_finalized():
                self.comm.Free()
        super().close()
