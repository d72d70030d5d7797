"""Scatter from a root: block r of the root's buffer goes to rank r.

The root sends each rank its own block directly, starting with its right neighbour, so every
rank receives exactly its block and the root sends (N-1)/N of its buffer, the least possible.

Only the root knows the blocks' shape and dtype, and a rank that passes no receive buffer
needs them. So the call starts with one exchange of a small description (`all_inputs`): the
root's says what each block is, the others' are blank. It is the exchange the call check
needs anyway (it carries the call's descriptor), so describing costs no message of its own.
A small buffer travels in it too, after the description (`inline_bytes`: about 3 KiB on a
few ranks, up to 256 KiB where the transport moves only the bytes of an input that are read,
shm), and the call is that one exchange: no rank waits for another to take its block. Only
the peers' blocks travel, from the root's right neighbour's on (`carried`): the root's own
is read by none, so it is not copied into the description.

A larger one, where the transport reaches its peers' memory (`Transport.one_sided`: shm with
direct reads), moves one-sided: the root's description also says where its blocks lie
(`Transport.locate`), and each rank copies its own straight out of the root's buffer
(`Transport.get`) while the root copies its own block; a barrier then says every block has
been taken, and the root may return. No message is announced, found and answered for each
block: measured (docs/performance.md, "One-sided moves: a scatter's blocks, a broadcast on shared
cores"), a 512 KiB scatter took 0.7x the time on 2 ranks and a 1 MiB one 0.9x, and a 1 MiB
one half the time on 4 ranks sharing 2 cores. On two ranks with a core each, a peer that
knows where its block lands says so in its blank description, and the root writes the first
quarter of that block there itself (`Transport.put`) while the peer reads the rest
(`shared_part`). Elsewhere the blocks go by messages, and the
root copies its own block while the peers take theirs (`Transport.isend`: a large block is
left for its rank to read, so the two copies overlap).

A rank whose buffer does not fit the description still drains its block, or meets the
barrier (no sender is left hanging), before it raises. Uneven blocks (`counts`, MPI's
Scatterv) go the same way: the description then lists the counts.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from typing import Any, Callable

import numpy

from transports.base import Transport, buffer_address

LENGTH = struct.Struct("<Q")  # a description starts with the length of its JSON text
# The last word of a description's room: where the root's blocks lie, for its peers to get
# theirs one-sided (`Transport.locate`).
WHERE = struct.Struct("<Q")
# On two ranks with a core each, the root of a one-sided scatter writes the first
# SHARED_EIGHTHS eighths of its peer's block into the peer's buffer (`Transport.put`), while
# the peer reads the rest and the root copies its own block: the one system call's copy split
# between the two cores. A peer offers its buffer for that in its blank description
# (`offer_target`: its address, its bytes, and a word that checks both). Measured with a bare
# loop of the moves (docs/performance.md, "A scatter's block written in part by its root"),
# a quarter written: a block of 256 KiB took 49-54 us read whole, 42-44 shared; 512 KiB
# 81-92 against 64-74; 1 MiB 150-151 against 117-119; but 2 MiB 218-225 against 242-264 (out
# of the caches, the two copies slow each other), so only blocks from SHARED_LEAST to
# SHARED_MOST bytes. A quarter, not three eighths: the root copies its own block as well.
SHARED_EIGHTHS = 2
SHARED_LEAST, SHARED_MOST = 256 << 10, 1 << 20
# A peer's offer, the first words of its blank description: where its block lands, its
# bytes, and a check.
TARGET = struct.Struct("<QQQ")
TARGET_CHECK = 0x72696E6763632D70  # (the check word is where ^ bytes ^ this)
# A description fills at least this: the smallest exchange a transport makes in one step (a
# page, slots.py's one-shot area at its smallest). What its JSON leaves of it carries a
# small scatter's blocks.
DESCRIPTION_BYTES = 4096
# Where the transport moves only the bytes of an input that are read
# (`Transport.moves_what_is_read`), a description has room for this many bytes of blocks,
# within the one-shot area: the root says how much of it it fills (`Transport.unread`), and
# the others fill none. Measured (docs/performance.md, "Middle sizes"): 32 KiB on 2 ranks took
# 41-42 us one-sided, 24 in the description; 128 KiB 50 against 43, 256 KiB 61-64 against 67; on 4
# ranks sharing 2 cores 8 KiB 164-172 against 78-80, 128 KiB 171 against 122-127, 256 KiB
# 180-184 against 168. Once the root's own block no longer travelled (`carried`), 256 KiB on 2
# ranks took 61.7-67.8 one-sided and 50.8-52.2 in the description ("A scatter's description
# carries its peers' blocks only").
INLINE_BYTES = 256 << 10


def description_bytes(size: int) -> int:
    """Where the blocks start in a description on `size` ranks: after room for a shape, a
    dtype and a count per rank. Every rank works it out alike, as an exchange needs."""
    return 1024 + 24 * size


def where_at(size: int) -> int:
    """Where a description's WHERE word lies on `size` ranks: the last of its room."""
    return description_bytes(size) - WHERE.size


def shared_part(transport: Transport, nbytes: int) -> int:
    """Of a block of `nbytes` moved one-sided to a peer that offered its buffer, the bytes
    the root writes (the first ones, in whole cache lines): on two ranks with a core each,
    for blocks of SHARED_LEAST to SHARED_MOST bytes; else 0, and the peer reads it whole."""
    if transport.size != 2 or transport.oversubscribed or not transport.one_sided \
            or not SHARED_LEAST <= nbytes <= SHARED_MOST:
        return 0
    return nbytes * SHARED_EIGHTHS // 8 // 64 * 64


def offer_target(transport: Transport, published: Any, target: Any | None) -> int:
    """A peer's side, before the describing exchange: write in its `published` description
    (writable) the address of the contiguous `target`, for the root to write its part of the
    block there (`shared_part`), or that it offers nothing (`target` None, or a block the
    root does not share); and publish that much of it (`Transport.unread`). Returns the
    bytes offered (0: none). Every peer writes it, so that the root never reads an offer
    left by an earlier call."""
    offered = target.nbytes if target is not None and shared_part(transport, target.nbytes) \
        else 0
    where = buffer_address(target) if offered else 0
    TARGET.pack_into(published, 0, where, offered, where ^ offered ^ TARGET_CHECK)
    transport.unread(TARGET.size)
    return offered


def _offered(said: Any, nbytes: int) -> int | None:
    """Where a peer whose blank description is `said` offered its buffer for a block of
    `nbytes`, or None where it did not (or offered one of another size)."""
    where, offered, check = TARGET.unpack_from(said)
    if not where or offered != nbytes or check != where ^ offered ^ TARGET_CHECK:
        return None
    return where


def inline_bytes(transport: Transport) -> int:
    """The room for blocks after a description on `transport`'s ranks: a scatter of at most
    this many bytes travels inside its description. Every rank works it out alike."""
    described = description_bytes(transport.size)
    room = DESCRIPTION_BYTES - described
    if transport.moves_what_is_read:
        room = max(room, min(INLINE_BYTES, transport.one_shot_bytes - described))
    return max(room, 0)


def published_bytes(transport: Transport) -> int:
    """The bytes every rank publishes in a scatter's describing exchange: a description and
    its room for blocks."""
    return description_bytes(transport.size) + inline_bytes(transport)


@functools.lru_cache(maxsize=64)
def describe(shape: tuple[int, ...] | None, counts: tuple[int, ...] | None, dtype: str,
             size: int) -> numpy.ndarray:
    """The root's description of blocks of `shape`, or flat ones of `counts` elements each,
    of `dtype`, on `size` ranks: the first `description_bytes` of what it publishes (read
    only: it is kept, as JSON costs a small call several microseconds)."""
    room = description_bytes(size)
    fields = {"dtype": dtype, "shape": shape} if counts is None else \
        {"dtype": dtype, "counts": counts}
    text = json.dumps(fields).encode()
    if LENGTH.size + len(text) > where_at(size):
        raise ValueError(f"scatter: cannot describe blocks of shape {shape} in {room} bytes")
    description = numpy.zeros(room, numpy.uint8)
    LENGTH.pack_into(description, 0, len(text))
    description[LENGTH.size:LENGTH.size + len(text)] = numpy.frombuffer(text, numpy.uint8)
    description.flags.writeable = False
    return description


@functools.lru_cache(maxsize=8)
def blank(nbytes: int) -> numpy.ndarray:
    """What a rank other than the root publishes, `nbytes` in all: nothing (read only)."""
    nothing = numpy.zeros(nbytes, numpy.uint8)
    nothing.flags.writeable = False
    return nothing


@functools.lru_cache(maxsize=64)
def _read(text: bytes, rank: int, root: int,
          size: int) -> tuple[tuple[int, ...], numpy.dtype, int, int, int]:
    """The shape and dtype of `rank`'s block, from `root`'s description on `size` ranks;
    where its bytes start in the root's buffer, and among the blocks the description carries
    (`carried`); and the bytes of all the blocks."""
    fields = json.loads(text)
    dtype = numpy.dtype(fields["dtype"])
    if "shape" in fields:
        shape = tuple(fields["shape"])
        counts = [math.prod(shape)] * size
    else:
        counts = fields["counts"]
        shape = (counts[rank],)
    starts = [sum(counts[:r]) * dtype.itemsize for r in range(size + 1)]
    return shape, dtype, starts[rank], carried(starts[rank], starts[root], starts[root + 1],
                                               starts[size]), starts[size]


def carried(start: int, root_start: int, root_end: int, total: int) -> int:
    """Where a peer's block, `start` bytes into the root's buffer of `total` bytes, lies among
    the blocks a description carries: the blocks after the root's own (from `root_end`),
    then those before it; the root's own (from `root_start`) is not carried."""
    return start - root_end if start >= root_end else total - root_end + start


def scatter_from_root(transport: Transport, flat: Any | None, bounds: list[tuple[int, int]],
                      shape: tuple[int, ...] | None, counts: tuple[int, ...] | None, root: int,
                      receive_into: Callable[[tuple[int, ...], Any], Any]) -> Any:
    """Send block r of the root's flat `flat` (at bounds[r]: blocks of `shape`, or of the
    `counts` given) to each rank r; other ranks pass None.

    Every rank calls `receive_into(shape, dtype)` for the flat array to receive its block into
    (the root copies its own), and returns that array. The call's check, if any
    (`transport.begin`), rides on the describing exchange.
    """
    xp, rank, size = transport.xp, transport.rank, transport.size
    if rank != root:
        # (An offer of nothing, `offer_target`: its receive buffer may be made only once the
        # description has come.)
        transport.unread(TARGET.size)
        said = _describing(transport, xp.asarray(blank(published_bytes(transport))))[root]
        return receive_described(transport, said, root, receive_into)
    room = description_bytes(size)
    inline = flat.nbytes <= inline_bytes(transport)
    one_sided = not inline and transport.one_sided
    # (Past what it holds, never read.)
    description = xp.empty(published_bytes(transport), xp.uint8)
    description[:room] = xp.asarray(describe(shape, counts, flat.dtype.str, size))
    published = room
    if inline:  # the peers' blocks, from our right neighbour's on (`carried`)
        raw = flat.view(xp.uint8)
        own_start, own_end = (bound * flat.itemsize for bound in bounds[root])
        for part in (raw[own_end:], raw[:own_start]):
            description[published:published + part.nbytes] = part
            published += part.nbytes
    elif one_sided:
        WHERE.pack_into(description, where_at(size), transport.locate(flat))
    transport.unread(published)  # (the rest no peer takes)
    said = _describing(transport, description)
    target = receive_into(shape if counts is None else (counts[root],), flat.dtype)
    if one_sided:
        give_blocks(transport, flat, bounds, root, target, said)
        return target
    if not inline:
        send_blocks(transport, flat, bounds, root, target)
        return target
    for step in range(1, size):
        peer = (root + step) % size
        transport.count(flat[slice(*bounds[peer])], peer, None, None)
    target[...] = flat[slice(*bounds[root])]
    return target


def send_blocks(transport: Transport, flat: Any, bounds: list[tuple[int, int]], root: int,
                own: Any) -> None:
    """The root's messages: block r of `flat` (at bounds[r]) to each rank r, starting with
    its right neighbour, and its own block copied into `own` (any shape of as many elements)
    while the peers take theirs (a large block is left for its rank to read: the two copies
    overlap)."""
    sent = []
    for step in range(1, transport.size):
        peer = (root + step) % transport.size
        transport.at("scatter", step - 1)
        sent.append(transport.isend(flat[slice(*bounds[peer])], peer))
    own[...] = flat[slice(*bounds[root])].reshape(own.shape)
    for wait in sent:
        wait()


def give_blocks(transport: Transport, flat: Any, bounds: list[tuple[int, int]], root: int,
                own: Any, said: list[Any]) -> None:
    """The root's side of blocks moved one-sided (its description said where `flat` lies):
    each block counted as sent, its part written into a peer that offered its buffer
    (`shared_part`, the peers' descriptions `said`), its own copied into `own` while each
    peer gets its own, then the barrier, after which every peer has its block and `flat` may
    change."""
    size = transport.size
    for step in range(1, size):
        peer = (root + step) % size
        block = flat[slice(*bounds[peer])]
        if block.size:
            transport.at("scatter", step - 1)
            part = shared_part(transport, block.nbytes)
            where = _offered(said[peer], block.nbytes) if part else None
            if where is not None:
                transport.put(peer, where, block.view(numpy.uint8)[:part])
            transport.count(block, peer, None, None)
    own[...] = flat[slice(*bounds[root])].reshape(own.shape)
    transport.barrier()


def take_block(transport: Transport, said: Any, root: int, offset: int,
               target: Any | None, offered: int = 0) -> None:
    """A rank's side of blocks moved one-sided: its block copied into the flat `target`
    straight out of the root's buffer, `offset` bytes on from where the root's description
    `said` says the blocks lie, but for the part the root writes where this rank offered
    `target` for a block of its size (`offered` bytes: `offer_target`); then the barrier,
    after which that part has landed too. A `target` None (the block does not fit) takes
    nothing, and still meets the barrier, so that the root returns."""
    transport.at("scatter", (transport.rank - root) % transport.size - 1)
    if target is not None and target.size:
        where, = WHERE.unpack_from(said, where_at(transport.size))
        part = shared_part(transport, target.nbytes) if offered == target.nbytes else 0
        transport.get(root, where, offset + part, target.view(numpy.uint8)[part:])
        transport.count(None, None, target, root)
    transport.barrier()


def receive_described(transport: Transport, said: Any, root: int,
                      receive_into: Callable[[tuple[int, ...], Any], Any],
                      offered: int = 0) -> Any:
    """A rank's block, given the root's description `said`: taken out of it (a small
    scatter), got one-sided (`take_block`), or received from the root. Returns the flat array
    `receive_into` gave."""
    xp, size = transport.xp, transport.size
    raw = said.get() if hasattr(said, "get") else said  # CuPy -> NumPy
    length, = LENGTH.unpack_from(raw)
    shape, dtype, offset, at, total = _read(raw[LENGTH.size:LENGTH.size + length].tobytes(),
                                            transport.rank, root, size)
    try:
        target, problem = receive_into(shape, dtype), None
    except (ValueError, TypeError) as error:
        target, problem = xp.empty(math.prod(shape), dtype), error
    if total > inline_bytes(transport) and transport.one_sided:
        take_block(transport, raw, root, offset, None if problem else target, offered)
    elif total > inline_bytes(transport):  # a message follows: taken even when it does not fit
        transport.at("scatter", (transport.rank - root) % size - 1)
        transport.recv(target, root)
    elif problem is None:
        start = description_bytes(size) + at
        target.view(xp.uint8)[...] = said[start:start + target.nbytes]
        transport.count(None, None, target, root)
    if problem is not None:
        raise problem
    return target


def _describing(transport: Transport, description: Any) -> list[Any]:
    """The exchange of descriptions (uncounted: only the blocks are the scatter's traffic)."""
    phase, step = transport.phase, transport.step
    transport.at("describe")
    said = transport.all_inputs(description, counted=False)
    transport.at(phase, step)
    return said
