"""How a buffer is cut into one chunk per rank."""

from __future__ import annotations


def chunk_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """Cut `count` elements into `parts` contiguous [lo, hi) ranges of near-equal size.

    The first `count % parts` chunks get one element more than the rest, so sizes differ by at
    most one. With fewer elements than parts, the last chunks are empty; with none, all are.

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    >>> chunk_bounds(2, 4)
    [(0, 1), (1, 2), (2, 2), (2, 2)]
    """
    if parts < 1:
        raise ValueError(f"cannot cut a buffer into {parts} parts")
    if count < 0:
        raise ValueError(f"cannot cut a negative count {count}")
    small, extra = divmod(count, parts)
    bounds, lo = [], 0
    for i in range(parts):
        hi = lo + small + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def count_bounds(counts: tuple[int, ...] | list[int]) -> list[tuple[int, int]]:
    """The [lo, hi) range of each block of a buffer cut into blocks of `counts` elements, in
    order (MPI's displacements of a v-variant, with no gaps).

    >>> count_bounds([2, 0, 3])
    [(0, 2), (2, 2), (2, 5)]
    """
    bounds, lo = [], 0
    for count in counts:
        bounds.append((lo, lo + count))
        lo += count
    return bounds
