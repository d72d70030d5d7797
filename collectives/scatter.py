"""Scatter from a root: block r of the root's buffer goes to rank r.

The root sends each rank its own block directly, starting with its right neighbour, so every
rank receives exactly its block and the root sends (N-1)/N of its buffer, the least possible.

Only the root knows the blocks' shape and dtype, and a rank that passes no receive buffer
needs them. So the call starts with one exchange of a small description (`all_inputs`): the
root's says what each block is, the others' are blank. It is the exchange the call check
needs anyway (it carries the call's descriptor), so describing costs no message of its own;
and the root makes it once the first block has gone as far as it can without a receiver
(into free slots, on shm), so that copy overlaps the wait.
A rank whose buffer does not fit the description still drains its block (no sender is left
hanging) before it raises. Uneven blocks (`counts`, MPI's Scatterv) go the same way: the
description then lists the counts.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from typing import Any, Callable

import numpy

from transports.base import Transport

LENGTH = struct.Struct("<Q")  # a description starts with the length of its JSON text


def description_bytes(size: int) -> int:
    """The size of a description on `size` ranks: room for a shape, a dtype and a count per
    rank. Every rank works it out alike, as an exchange needs."""
    return 1024 + 24 * size


@functools.lru_cache(maxsize=64)
def _describe(shape: tuple[int, ...] | None, counts: tuple[int, ...] | None, dtype: str,
              nbytes: int) -> numpy.ndarray:
    """The root's description (read only: it is kept): blocks of `shape`, or flat ones of
    `counts` elements each, of `dtype`. Remembered, as JSON costs a small call several
    microseconds."""
    fields = {"dtype": dtype, "shape": shape} if counts is None else \
        {"dtype": dtype, "counts": counts}
    text = json.dumps(fields).encode()
    if LENGTH.size + len(text) > nbytes:
        raise ValueError(f"scatter: cannot describe blocks of shape {shape} in {nbytes} bytes")
    description = numpy.zeros(nbytes, numpy.uint8)
    LENGTH.pack_into(description, 0, len(text))
    description[LENGTH.size:LENGTH.size + len(text)] = numpy.frombuffer(text, numpy.uint8)
    description.flags.writeable = False
    return description


@functools.lru_cache(maxsize=8)
def _blank(nbytes: int) -> numpy.ndarray:
    """What a rank other than the root publishes: nothing (read only: it is kept)."""
    blank = numpy.zeros(nbytes, numpy.uint8)
    blank.flags.writeable = False
    return blank


@functools.lru_cache(maxsize=64)
def _read(text: bytes, rank: int) -> tuple[tuple[int, ...], numpy.dtype]:
    """The shape and dtype of `rank`'s block, from the root's description."""
    fields = json.loads(text)
    shape = tuple(fields["shape"]) if "shape" in fields else (fields["counts"][rank],)
    return shape, numpy.dtype(fields["dtype"])


def _describing(transport: Transport, description: Any) -> list[Any]:
    """The exchange of descriptions (uncounted: only the blocks are the scatter's traffic)."""
    phase, step = transport.phase, transport.step
    transport.at("describe")
    said = transport.all_inputs(description, counted=False)
    transport.at(phase, step)
    return said


def scatter_from_root(transport: Transport, blocks: list[Any] | None, root: int,
                      counts: tuple[int, ...] | None,
                      receive_into: Callable[[tuple[int, ...], Any], Any]) -> Any:
    """Send `blocks[r]` (root only: one contiguous array per rank, in the shape rank r gets;
    of the `counts` given, if uneven) to each rank r.

    Every rank calls `receive_into(shape, dtype)` for the flat array to receive its block into
    (the root copies its own), and returns that array. The call's check, if any
    (`transport.begin`), rides on the first exchange.
    """
    xp, rank, size = transport.xp, transport.rank, transport.size
    nbytes = description_bytes(size)
    if rank == root:
        mine = blocks[root]
        description = _describe(None if counts else mine.shape, counts, mine.dtype.str, nbytes)
    else:
        description = _blank(nbytes)
    description = xp.asarray(description)
    if rank == root:
        # The root publishes what fits of its first block before it describes them, so its
        # copy in overlaps the exchange's wait (`check_first`; on a mismatch, withdrawn).
        transport.check_first(lambda: _describing(transport, description))
        sent = []
        for step in range(1, size):
            peer = (root + step) % size
            transport.at("scatter", step - 1)
            sent.append(transport.isend(blocks[peer].reshape(-1), peer))
        transport.checked()
        # Its own block while the peers take theirs (a large block is left for its rank to
        # read: the two copies overlap).
        mine = blocks[root]
        target = receive_into(mine.shape, mine.dtype)
        target[...] = mine.reshape(-1)
        for wait in sent:
            wait()
        return target
    said = _describing(transport, description)[root]
    raw = said.get() if hasattr(said, "get") else said  # CuPy -> NumPy
    length, = LENGTH.unpack_from(raw)
    shape, dtype = _read(raw[LENGTH.size:LENGTH.size + length].tobytes(), rank)
    try:
        target, problem = receive_into(shape, dtype), None
    except (ValueError, TypeError) as error:
        target, problem = xp.empty(math.prod(shape), dtype), error
    transport.at("scatter", (rank - root) % size - 1)
    transport.recv(target, root)
    if problem is not None:
        raise problem
    return target
