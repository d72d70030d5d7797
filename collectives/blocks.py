"""Where each rank's block lies in the buffers of a collective of one block per rank.

all_gather, gather, scatter, reduce_scatter and all_to_all take equal blocks, in buffers of
shape (size, *block), or uneven ones, in flat buffers, given by `counts` as MPI's v-variants
(Allgatherv, Gatherv, Scatterv, Reduce_scatter, Alltoallv) take them: counts[r] elements for
rank r, blocks one after another in rank order. Every rank passes the same counts, and the
call check compares a digest of them (check.py), so ranks whose counts differ all raise
MismatchError, instead of waiting for blocks of other sizes than those that come.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy

from transports.errors import InvalidArgumentError

from .arguments import check_blocks
from .chunking import count_bounds

# Block r's [lo, hi) in a flat buffer, for each rank r (read only: `equal` shares its answers).
Bounds = Sequence[tuple[int, int]]


def check_counts(counts: Any, size: int) -> tuple[int, ...]:
    """`counts` (uneven blocks, one per rank) as a tuple of `size` whole numbers >= 0."""
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__len__") \
            or len(counts) != size or any(
                isinstance(n, bool) or not isinstance(n, (int, numpy.integer)) or n < 0
                for n in counts):
        raise InvalidArgumentError(f"counts must be {size} whole numbers >= 0, one per rank; "
                                   f"got {counts!r}")
    return tuple(int(n) for n in counts)


def check_size(collective: str, buf: Any, count: int) -> None:
    """The flat `sendbuf` holds the `count` elements that `counts` calls for."""
    if buf.size != count:
        raise InvalidArgumentError(f"{collective}: by counts, sendbuf must hold {count} "
                                   f"elements; got {buf.size}")


@functools.lru_cache(maxsize=64)
def equal(block: int, size: int) -> Bounds:
    """The bounds of `size` blocks of `block` elements each (remembered: a run of calls of
    one kind asks for the same ones, and making them costs a small call most of a
    microsecond)."""
    return tuple((r * block, (r + 1) * block) for r in range(size))


def own_blocks(bounds: Bounds, rank: int, itemsize: int) -> tuple[tuple[int, int], ...]:
    """What `rank` takes of every rank's input to a one-shot all-to-all or reduce-scatter
    (each input a block per rank at `bounds`): the bytes of its own block, of each
    (`Transport.all_inputs`' `reads`)."""
    lo, hi = bounds[rank]
    return ((lo * itemsize, hi * itemsize),) * len(bounds)


def every_input(nbytes: int, size: int) -> tuple[tuple[int, int], ...]:
    """What a rank takes of every rank's input of `nbytes` to a one-shot all-gather: all of
    each (`Transport.all_inputs`' `reads`). Named, although taking every input whole is what
    an exchange does by default, because an all-gather places them as they come: its exchange
    may read them straight where they belong, at any size (`Transport.reads_in_place`). (A
    reduction's and a rooted collective's reads are named otherwise, so that theirs do not:
    through the areas they were measured faster, docs/performance.md, "A second machine".)"""
    return ((0, nbytes),) * size


def from_root(nbytes: int, root: int, rank: int, size: int) -> tuple[tuple[int, int], ...]:
    """What `rank` takes of every rank's input of `nbytes` to a one-shot broadcast from
    `root`: the root's whole, and nothing at the root (`Transport.all_inputs`' `reads`).
    Named so that the exchange may leave the root's input where it lies, in registered
    memory, for the others to copy it from there."""
    return tuple((0, nbytes if r == root != rank else 0) for r in range(size))


def peers_inputs(nbytes: int, rank: int, size: int) -> tuple[tuple[int, int], ...]:
    """What `rank` takes of every rank's input of `nbytes` to a one-shot reduction: every
    peer's whole, not its own, which it reduces where it lies (`Transport.all_inputs`'
    `reads`). Named so that the exchange may leave an input in registered memory where it
    lies; the rank's own left out so that no rank takes every input whole, as an all-gather
    does, which may take another exchange (`Transport.reads_in_place`: a reduction's inputs
    read directly were measured slower than through the areas)."""
    return tuple((0, 0 if r == rank else nbytes) for r in range(size))


def to_root(nbytes: int, root: int, rank: int, size: int) -> tuple[tuple[int, int], ...]:
    """What `rank` takes of every rank's input of `nbytes` to a one-shot reduction or gather
    to `root`: every peer's whole at the root (`peers_inputs`), nothing elsewhere."""
    return peers_inputs(nbytes, rank, size) if rank == root else ((0, 0),) * size


def gathered(collective: str, counts: Any | None, sendbuf: Any, size: int,
             rank: int) -> tuple[tuple[int, ...] | None, Bounds, tuple[int, ...]]:
    """(counts checked, bounds, the result's shape) of a collective that puts every rank's
    `sendbuf` together (all_gather, gather): (size, *sendbuf.shape), or flat by `counts`."""
    if counts is None:
        return None, equal(sendbuf.size, size), (size, *sendbuf.shape)
    counts = check_counts(counts, size)
    check_size(collective, sendbuf, counts[rank])
    return counts, count_bounds(counts), (sum(counts),)


def split(collective: str, counts: Any | None, sendbuf: Any,
          size: int) -> tuple[tuple[int, ...] | None, Bounds, list[tuple[int, ...]]]:
    """(counts checked, bounds, the shape of each rank's block) of a `sendbuf` that holds one
    block per rank (scatter's root, reduce_scatter): shape (size, *block), or flat by
    `counts`."""
    if counts is None:
        check_blocks(collective, sendbuf, size)
        return None, equal(sendbuf.size // size, size), [sendbuf.shape[1:]] * size
    counts = check_counts(counts, size)
    check_size(collective, sendbuf, sum(counts))
    return counts, count_bounds(counts), [(n,) for n in counts]


def exchanged(counts: Any | None, sendbuf: Any, size: int, rank: int) -> tuple[
        tuple[tuple[int, ...], ...] | None, Bounds, Bounds, tuple[int, ...], int]:
    """(counts checked, bounds of the blocks sent, of the blocks received, the result's shape,
    elements in all ranks' buffers) of an all-to-all.

    `counts` is a `size` x `size` matrix, rank i sending counts[i][j] elements to rank j, or
    `size` numbers that stand for every row: rank j gets counts[j] elements from each rank.
    """
    if counts is None:
        check_blocks("all_to_all", sendbuf, size)
        bounds = equal(sendbuf.size // size, size)
        return None, bounds, bounds, sendbuf.shape, sendbuf.size
    rows = counts if hasattr(counts, "__len__") and not isinstance(counts, (str, bytes)) else ()
    if len(rows) == size and all(hasattr(row, "__len__") for row in rows):
        matrix = tuple(check_counts(row, size) for row in rows)
    else:
        matrix = (check_counts(counts, size),) * size
    check_size("all_to_all", sendbuf, sum(matrix[rank]))
    received = count_bounds([row[rank] for row in matrix])
    return (matrix, count_bounds(matrix[rank]), received, (received[-1][1],),
            sum(map(sum, matrix)))
