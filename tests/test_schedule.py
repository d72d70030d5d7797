"""The recorded schedule of every ring collective equals the textbook one, transfer by transfer.

Thread ranks run each collective with tracing on; the test writes down, independently of the
code, what the textbook says each rank does in each step (baidu-allreduce's rule: in step s,
rank r sends chunk r - s and receives chunk r - s - 1), and compares the two for every rank
count from 1 to 8 and uneven counts, where some chunks are one element longer and some empty.
"""

from __future__ import annotations

import numpy
import pytest

import collectives
from collectives import naive

SIZES = range(1, 9)
COUNTS = [0, 3, 7, 13, 100]
ITEM = 8  # float64


@pytest.fixture(autouse=True)
def ring_only(monkeypatch):
    """Small all-reduces may take the one-shot path when a transport is told to; not here."""
    monkeypatch.delenv("RINGCC_ONE_SHOT_BYTES", raising=False)


def textbook_chunks(count: int, size: int) -> list[tuple[int, int]]:
    """[lo, hi) of each chunk: the first count % size chunks one element longer."""
    sizes = [count // size + (1 if k < count % size else 0) for k in range(size)]
    starts = numpy.concatenate([[0], numpy.cumsum(sizes)]).astype(int).tolist()
    return list(zip(starts[:-1], starts[1:]))


def ring_pass(rank: int, size: int, chunks: list[tuple[int, int]], phase: str, kind: str,
              first: int, where: str) -> list[dict]:
    """One ring pass as the textbook draws it: in step s, rank r sends chunk (r + first - s)
    to r + 1 and receives chunk (r + first - s - 1) from r - 1. Empty chunks are not sent."""
    records = []
    for step in range(size - 1):
        send = chunks[(rank + first - step) % size]
        recv = chunks[(rank + first - step - 1) % size]
        if send[1] == send[0] and recv[1] == recv[0]:
            continue
        records.append({
            "rank": rank, "kind": kind, "where": where, "phase": phase, "step": step,
            "dst": (rank + 1) % size if send[1] > send[0] else None,
            "send": (send[0], send[1] - send[0]) if send[1] > send[0] else None,
            "src": (rank - 1) % size if recv[1] > recv[0] else None,
            "recv": (recv[0], recv[1] - recv[0]) if recv[1] > recv[0] else None,
            "bytes": (send[1] - send[0]) * ITEM})
    return records


def recorded(body, size: int, **options) -> list[tuple[list[dict], dict, int]]:
    """Run `body(comm)` on thread ranks with tracing on: per rank (records, result, bytes)."""
    def traced(comm):
        with comm.trace() as records:
            result = body(comm)
        return records, result, comm.stats.bytes_sent

    return collectives.spawn(traced, size, **options)


def data(rank: int, count: int) -> numpy.ndarray:
    return rank * 1000 + numpy.arange(count, dtype=numpy.float64)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_all_reduce_follows_the_textbook_ring(size, count):
    runs = recorded(lambda comm: comm.all_reduce(data(comm.rank, count)), size)
    chunks = textbook_chunks(count, size)
    total = sum(data(r, count) for r in range(size))
    for rank, (records, result, sent) in enumerate(runs):
        expected = (ring_pass(rank, size, chunks, "reduce-scatter", "reduce", 0, "all_reduce #1")
                    + ring_pass(rank, size, chunks, "all-gather", "copy", 1, "all_reduce #1"))
        assert records == expected, f"rank {rank}"
        assert numpy.array_equal(result, total)
        # Rank r sends every chunk but r+1 in the first pass and every one but r+2 in the second.
        skipped = sum(hi - lo for lo, hi in (chunks[(rank + 1) % size], chunks[(rank + 2) % size]))
        assert sent == ((2 * count - skipped) * ITEM if size > 1 else 0)
    assert sum(sent for _, _, sent in runs) == 2 * (size - 1) * count * ITEM


@pytest.mark.parametrize("size", SIZES)
def test_all_reduce_sends_2_n_minus_1_over_n_of_the_buffer(size):
    count = 24 * 35  # a multiple of every size 1..8: each rank sends exactly the bound
    runs = recorded(lambda comm: comm.all_reduce(data(comm.rank, count)), size)
    for _, _, sent in runs:
        assert sent == 2 * (size - 1) * count * ITEM // size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_all_gather_follows_the_textbook_ring(size, count):
    runs = recorded(lambda comm: comm.all_gather(data(comm.rank, count)), size)
    blocks = [(r * count, (r + 1) * count) for r in range(size)]
    for rank, (records, result, sent) in enumerate(runs):
        assert records == ring_pass(rank, size, blocks, "all-gather", "copy", 0,
                                    "all_gather #1"), f"rank {rank}"
        assert numpy.array_equal(result, [data(r, count) for r in range(size)])
        assert sent == (size - 1) * count * ITEM  # (N-1)/N of the output


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_reduce_scatter_follows_the_textbook_ring(size, count):
    def body(comm):
        return comm.reduce_scatter(data(comm.rank, size * count).reshape(size, count))

    runs = recorded(body, size)
    blocks = [(r * count, (r + 1) * count) for r in range(size)]
    total = sum(data(r, size * count) for r in range(size)).reshape(size, count)
    for rank, (records, result, sent) in enumerate(runs):
        # Shifted one block back, so that the block a rank ends with is its own.
        assert records == ring_pass(rank, size, blocks, "reduce-scatter", "reduce", -1,
                                    "reduce_scatter #1"), f"rank {rank}"
        assert numpy.array_equal(result, total[rank])
        assert sent == (size - 1) * count * ITEM  # (N-1)/N of the input


def textbook_broadcast(rank: int, size: int, root: int, pieces: list[tuple[int, int]]):
    """The pipelined chain root -> root+1 -> ...: while a rank forwards segment k-1 to its
    right, segment k arrives from its left."""
    position, right, left = (rank - root) % size, (rank + 1) % size, (rank - 1) % size

    def record(step, send, recv):
        return {"rank": rank, "kind": "copy", "where": "broadcast #1", "phase": "broadcast",
                "step": step, "dst": right if send else None,
                "send": (send[0], send[1] - send[0]) if send else None,
                "src": left if recv else None,
                "recv": (recv[0], recv[1] - recv[0]) if recv else None,
                "bytes": (send[1] - send[0]) * ITEM if send else 0}

    if size == 1 or not pieces:
        return []
    if position == 0:
        return [record(k, piece, None) for k, piece in enumerate(pieces)]
    if position == size - 1:
        return [record(k, None, piece) for k, piece in enumerate(pieces)]
    return ([record(0, None, pieces[0])]
            + [record(k, pieces[k - 1], pieces[k]) for k in range(1, len(pieces))]
            + [record(len(pieces), pieces[-1], None)])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_broadcast_follows_the_textbook_pipeline(size, count):
    root = size // 2
    segment = 3 * ITEM  # several segments per buffer
    runs = recorded(lambda comm: comm.broadcast(data(comm.rank, count), root), size,
                    segment_bytes=segment)
    pieces = [(lo, min(lo + 3, count)) for lo in range(0, count, 3)]
    for rank, (records, result, sent) in enumerate(runs):
        assert records == textbook_broadcast(rank, size, root, pieces), f"rank {rank}"
        assert numpy.array_equal(result, data(root, count))
        end_of_chain = rank == (root - 1) % size
        assert sent == (0 if end_of_chain or size == 1 else count * ITEM)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", [0, 7, 100])
def test_naive_ring_passes_whole_buffers(size, count):
    runs = recorded(lambda comm: naive.all_reduce(comm, data(comm.rank, count), "naive_ring"),
                    size)
    total = sum(data(r, count) for r in range(size))
    for rank, (records, result, sent) in enumerate(runs):
        # Step s sends box s % 2 and receives into the other; the boxes are one array.
        steps = [(r["step"], r["send"], r["recv"], r["dst"], r["src"]) for r in records]
        assert steps == [(s, ((s % 2) * count, count), (((s + 1) % 2) * count, count),
                          (rank + 1) % size, (rank - 1) % size)
                         for s in range(size - 1)] if count else steps == []
        assert numpy.array_equal(result, total)
        assert sent == (size - 1) * count * ITEM


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_reduce_broadcast_goes_through_the_root(size, op):
    count = 13
    runs = recorded(lambda comm: naive.all_reduce(comm, data(comm.rank, count),
                                                  "reduce_broadcast", op), size,
                    segment_bytes=5 * ITEM)
    stack = numpy.stack([data(r, count) for r in range(size)])
    expected = {"sum": stack.sum(0), "max": stack.max(0), "avg": stack.mean(0)}[op]
    for rank, (records, result, sent) in enumerate(runs):
        assert numpy.allclose(result, expected, rtol=1e-15)
        peers = {r["src"] for r in records if r["src"] is not None} | \
            {r["dst"] for r in records if r["dst"] is not None}
        if rank == 0:
            assert sent == (size - 1) * count * ITEM
            assert peers == set(range(1, size))
        else:
            assert sent == count * ITEM
            assert peers == {0}
