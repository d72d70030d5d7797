"""The rule that cuts a buffer into one chunk per rank."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectives import chunking, chunk_bounds


@given(count=st.integers(0, 10_000), parts=st.integers(1, 64))
def test_chunks_tile_the_buffer_in_order_with_sizes_differing_by_at_most_one(count, parts):
    bounds = chunk_bounds(count, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(hi == next_lo for (_, hi), (next_lo, _) in zip(bounds, bounds[1:]))
    sizes = [hi - lo for lo, hi in bounds]
    assert sizes == sorted(sizes, reverse=True)  # the larger chunks come first
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("count, parts, expected", [
    (0, 3, [(0, 0), (0, 0), (0, 0)]),
    (2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)]),
    (10, 4, [(0, 3), (3, 6), (6, 8), (8, 10)]),
    (7, 1, [(0, 7)]),
])
def test_known_cuts(count, parts, expected):
    assert chunk_bounds(count, parts) == expected


@pytest.mark.parametrize("count, parts", [(5, 0), (-1, 2)])
def test_bad_arguments_are_named(count, parts):
    with pytest.raises(ValueError, match="cannot cut"):
        chunk_bounds(count, parts)


def test_docstring_examples():
    results = doctest.testmod(chunking)
    assert results.attempted > 0, "chunking.py has no docstring examples"
    assert results.failed == 0
