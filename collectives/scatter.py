"""Scatter from a root: block r of the root's buffer goes to rank r.

The root sends each rank its own block directly, starting with its right neighbour, so every
rank receives exactly its block and the root sends (N-1)/N of its buffer, the least possible.
A small header goes first, so a rank that passes no receive buffer learns the block's shape
and dtype from the root, and a rank whose buffer does not fit still drains its block (no
sender is left hanging) before it raises. Uneven blocks (`counts`, MPI's Scatterv) go the same
way, each with its own header.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Callable

import numpy

from transports.base import Transport

HEADER_BYTES = 1024


def _header(shape: tuple[int, ...], dtype: Any) -> numpy.ndarray:
    """The header that describes a block (read only: `_described` shares it)."""
    return _described(tuple(shape), numpy.dtype(dtype).str)


# Remembered both ways: a run of scatters of one kind describes and reads the same header, and
# JSON costs a small call several microseconds at each end.
@functools.lru_cache(maxsize=64)
def _described(shape: tuple[int, ...], dtype: str) -> numpy.ndarray:
    text = json.dumps({"shape": list(shape), "dtype": dtype}).encode()
    if len(text) > HEADER_BYTES:
        raise ValueError(f"scatter: cannot describe a block of shape {shape} in a header")
    header = numpy.zeros(HEADER_BYTES, numpy.uint8)
    header[: len(text)] = numpy.frombuffer(text, numpy.uint8)
    header.flags.writeable = False
    return header


def _parse(header: Any) -> tuple[tuple[int, ...], numpy.dtype]:
    raw = header.get() if hasattr(header, "get") else header  # CuPy -> NumPy
    return _read(bytes(raw).rstrip(b"\0"))


@functools.lru_cache(maxsize=64)
def _read(text: bytes) -> tuple[tuple[int, ...], numpy.dtype]:
    fields = json.loads(text)
    return tuple(fields["shape"]), numpy.dtype(fields["dtype"])


def scatter_from_root(transport: Transport, blocks: list[Any] | None, root: int,
                      receive_into: Callable[[tuple[int, ...], Any], Any]) -> Any:
    """Send `blocks[r]` (root only: one contiguous array per rank, in the shape rank r gets)
    to each rank r.

    Every rank other than the root calls `receive_into(shape, dtype)` for the flat array to
    receive its block into, and returns that array; the root returns its own block.
    """
    xp, rank, size = transport.xp, transport.rank, transport.size
    if rank == root:
        headers: dict[tuple[int, ...], Any] = {}  # one per shape: equal blocks share one
        for step in range(1, size):
            peer = (root + step) % size
            block = blocks[peer]
            if block.shape not in headers:
                headers[block.shape] = xp.asarray(_header(block.shape, block.dtype))
            transport.at("scatter header", step - 1)
            transport.send(headers[block.shape], peer)
            transport.at("scatter", step - 1)
            transport.send(block.reshape(-1), peer)
        return blocks[root]
    step = (rank - root) % size - 1
    transport.at("scatter header", step)
    header = xp.empty(HEADER_BYTES, xp.uint8)
    transport.recv(header, root)
    transport.at("scatter", step)
    shape, dtype = _parse(header)
    try:
        target, problem = receive_into(shape, dtype), None
    except (ValueError, TypeError) as error:
        target, problem = xp.empty(math.prod(shape), dtype), error
    transport.recv(target, root)
    if problem is not None:
        raise problem
    return target
