"""Shared memory on one node: ranks copy, and reduce, straight out of each other's host memory.

The slot protocol (slots.py) over host shared memory (shared_memory.py): each rank's slots and
one-shot areas sit in its own POSIX shared-memory region, right after its control lines, and
every other rank of the node maps that region read-only. Memory per rank, whatever the
message: 4 slots of `segment_bytes` + 2 one-shot areas + 2 pair areas per peer (2 MiB in all at
most, 512 KiB each on 2 ranks) + a control page, by default 5.0 MiB on 2 ranks, 4.0 MiB on 4,
3.3 MiB on 16 (a page is only allocated once something is written to it).
Nothing is left in /dev/shm after any exit, `kill -9` included (see shared_memory.py).

Messages of 4 MiB and more in a ring step are read straight out of the sender's buffer, where
the kernel allows it (cross-memory attach; see slots.py, "Direct reads");
`RINGCC_SINGLE_COPY=0` keeps every message in the slots instead (and so does a kernel that
refuses).
"""

from __future__ import annotations

import os
from typing import Any

from mpi4py import MPI

from .shared_memory import HostMemory
from .slots import SlotTransport


class ShmTransport(SlotTransport):
    """Ranks of `comm` (default `MPI.COMM_WORLD`), all on one node, over shared memory."""

    name = "shm"
    # Measured (docs/transports.md, "Shared memory"): slots this small stay in the caches.
    default_segment_bytes = 256 << 10

    @property
    def default_one_shot_bytes(self) -> int:  # type: ignore[override]
        """2 MiB / N, at least 64 KiB: one-shot reads N-1 inputs where the ring moves two
        chunks a step for 2(N-1) steps. Measured (docs/transports.md, "Shared memory"): it wins up
        to 1 MiB on 2 ranks and to about 1 MiB on 4."""
        return max(64 << 10, (2 << 20) // self.size)

    def __init__(self, comm: MPI.Comm | None = None, **options: Any) -> None:
        single_copy = os.environ.get("RINGCC_SINGLE_COPY") != "0"
        super().__init__(comm, HostMemory(single_copy), **options)
