"""The ring collectives move what their definitions say, and no more bytes than the ring must.

Thread ranks run each collective with tracing on, and an oracle that knows nothing of the
schedule replays the traced transfers on symbolic data: each element of each rank's buffer
holds the contributions it carries, as a count per rank; a message carries what its span held
when it was sent, a copy overwrites the span it lands in and a reduce adds to it. The replay
must end where the collective's definition says, with every contribution exactly once, for 1
to 8 ranks and uneven counts, where some chunks are one element longer and some empty. The
4-rank table in all_reduce.py's docstring is checked against a traced run, the naive
all-reduces for the whole buffers they pass, and the bytes each rank moves against the bound
of its algorithm, on thread ranks and on real MPI ranks. (test_schedule_collectives.py does
the same for gather, reduce, all-to-all, scan and sendrecv.)
"""

from __future__ import annotations

import re
from collections import Counter, deque

import numpy
import pytest

import collectives
from collectives import all_reduce, chunk_bounds

SIZES = range(1, 9)
COUNTS = [0, 3, 7, 13, 100]
ITEM = 8  # float64


def data(rank: int, count: int) -> numpy.ndarray:
    return rank * 1000 + numpy.arange(count, dtype=numpy.float64)


def traced_run(body, size: int, **options) -> list[tuple[list[dict], object, int]]:
    """Run `body(comm)` on thread ranks, always by the ring, with tracing on: per rank
    (records, result, bytes sent)."""
    def traced(comm):
        with comm.trace() as records:
            result = body(comm)
        return records, result, comm.stats.bytes_sent

    return collectives.spawn(traced, size, one_shot_bytes=0, **options)


def own_contributions(size: int, count: int) -> list[list[Counter]]:
    """Every element of rank r's buffer holds rank r's contribution, once."""
    return [[Counter({rank: 1}) for _ in range(count)] for rank in range(size)]


def replay(records: list[list[dict]], held: list[list[Counter]]) -> None:
    """Replay every rank's traced transfers on `held` (held[rank][element]), in place.

    Each rank takes its records in order; a record's message leaves with what its span holds
    then, and its receive waits for the matching message: the k-th that its source sent it,
    as messages between two ranks arrive in order.
    """
    size = len(records)
    in_flight = {(src, dst): deque() for src in range(size) for dst in range(size)}
    done, sent = [0] * size, [False] * size
    moved = True
    while moved:
        moved = False
        for rank in range(size):
            while done[rank] < len(records[rank]):
                record = records[rank][done[rank]]
                if record["send"] is not None and not sent[rank]:
                    lo, count = record["send"]
                    in_flight[(rank, record["dst"])].append(held[rank][lo:lo + count])
                    sent[rank] = True
                if record["recv"] is not None:
                    arrived = in_flight[(record["src"], rank)]
                    if not arrived:
                        break  # wait for the source to send it
                    message = arrived.popleft()
                    lo, count = record["recv"]
                    assert len(message) == count, f"rank {rank}: {record} got {len(message)}"
                    for i, carried in enumerate(message, start=lo):
                        held[rank][i] = carried if record["kind"] == "copy" \
                            else held[rank][i] + carried
                done[rank], sent[rank] = done[rank] + 1, False
                moved = True
    assert done == [len(r) for r in records], "the traced transfers wait for each other forever"
    assert not any(in_flight.values()), "a message was sent that no rank received"


def in_phase(records: list[list[dict]], phase: str) -> list[list[dict]]:
    return [[r for r in rank_records if r["phase"] == phase] for rank_records in records]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_all_reduce_reduces_every_chunk_on_one_rank_then_gives_it_to_all(size, count):
    """After the reduce-scatter pass each element is fully reduced on exactly one rank, rank r
    owning chunk r+1 (all_reduce.py); after the all-gather pass every rank has every one."""
    def in_place(comm):
        buf = data(comm.rank, count)
        return comm.all_reduce(buf, buf)

    runs = traced_run(in_place, size)
    records = [rank_records for rank_records, _, _ in runs]
    everyone = Counter(range(size))
    held = own_contributions(size, count)
    replay(in_phase(records, "reduce-scatter"), held)
    for rank in range(size):
        assert all(max(c.values()) == 1 for c in held[rank]), f"rank {rank} counts one twice"
        owned = [i for i, carried in enumerate(held[rank]) if carried == everyone]
        assert owned == list(range(*chunk_bounds(count, size)[(rank + 1) % size])), rank
    replay(in_phase(records, "all-gather"), held)
    assert held == [[everyone] * count] * size
    total = sum(data(r, count) for r in range(size))
    for _, result, _ in runs:
        assert numpy.array_equal(result, total)
    # Every chunk goes round the ring twice, one hop short each time.
    assert sum(sent for _, _, sent in runs) == 2 * (size - 1) * count * ITEM


@pytest.mark.parametrize("size", SIZES)
def test_all_reduce_sends_2_n_minus_1_over_n_of_the_buffer(size):
    count = 24 * 35  # a multiple of every size 1..8: each rank sends exactly the bound
    for _, _, sent in traced_run(lambda comm: comm.all_reduce(data(comm.rank, count)), size):
        assert sent == 2 * (size - 1) * count * ITEM // size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_all_gather_gives_every_rank_every_block(size, count):
    runs = traced_run(lambda comm: comm.all_gather(data(comm.rank, count)), size)
    held = [[Counter({rank: 1}) if i // count == rank else Counter()
             for i in range(size * count)] for rank in range(size)]
    replay([records for records, _, _ in runs], held)
    assert held == [[Counter({i // count: 1}) for i in range(size * count)]] * size
    for _, result, sent in runs:
        assert numpy.array_equal(result, [data(r, count) for r in range(size)])
        assert sent == (size - 1) * count * ITEM  # (N-1)/N of the output


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_reduce_scatter_reduces_block_r_on_rank_r(size, count):
    def body(comm):
        return comm.reduce_scatter(data(comm.rank, size * count).reshape(size, count))

    runs = traced_run(body, size)
    held = own_contributions(size, size * count)
    replay([records for records, _, _ in runs], held)
    total = sum(data(r, size * count) for r in range(size)).reshape(size, count)
    for rank, (_, result, sent) in enumerate(runs):
        assert held[rank][rank * count:(rank + 1) * count] == [Counter(range(size))] * count
        assert numpy.array_equal(result, total[rank])
        assert sent == (size - 1) * count * ITEM  # (N-1)/N of the input


def assert_forwards_what_arrived(records: list[dict]) -> None:
    """Each transfer sends on what the one before received, while the next arrives."""
    for before, after in zip(records, records[1:]):
        assert after["send"] == before["recv"], (before, after)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_broadcast_pipelines_segments_down_the_chain(size, count):
    root = size // 2
    runs = traced_run(lambda comm: comm.broadcast(data(comm.rank, count), root), size,
                      segment_bytes=3 * ITEM)  # several segments per buffer
    records = [rank_records for rank_records, _, _ in runs]
    held = own_contributions(size, count)
    replay(records, held)
    assert held == [[Counter({root: 1})] * count] * size
    end = (root - 1) % size
    for rank, (_, result, sent) in enumerate(runs):
        assert numpy.array_equal(result, data(root, count))
        assert sent == (0 if rank == end else count * ITEM)
        # Pipelined in segments down a chain; with two ranks, one hop, the message goes whole.
        piece = 3 * ITEM if size > 2 else count * ITEM
        assert all(r["bytes"] <= piece for r in records[rank])
        if rank not in (root, end):
            assert_forwards_what_arrived(records[rank])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", [0, 7, 100])
def test_naive_ring_passes_whole_buffers(size, count):
    runs = traced_run(lambda comm: comm.all_reduce(data(comm.rank, count),
                                                   algorithm="naive_ring"), size)
    total = sum(data(r, count) for r in range(size))
    for rank, (records, result, sent) in enumerate(runs):
        assert len(records) == (size - 1 if count else 0)
        assert all(r["dst"] == (rank + 1) % size and r["src"] == (rank - 1) % size
                   and r["send"][1] == r["recv"][1] == count for r in records)
        assert_forwards_what_arrived(records)
        assert numpy.array_equal(result, total)
        assert sent == (size - 1) * count * ITEM


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_reduce_broadcast_goes_through_the_root(size, op):
    count = 13
    runs = traced_run(lambda comm: comm.all_reduce(data(comm.rank, count), op=op,
                                                   algorithm="reduce_broadcast"), size,
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


# ---- the table in all_reduce.py ------------------------------------------------------------

def docstring_table() -> list[tuple[str, int, list[str]]]:
    """The rows of the 4-rank table in all_reduce.py: (phase, step, ["sent/received", ...])."""
    rows = re.findall(r"^\s+(reduce-scatter|all-gather)\s+(\d)\s+((?:\d/\d\s+){3}\d/\d)\s*$",
                      all_reduce.__doc__, re.MULTILINE)
    return [(phase, int(step), cells.split()) for phase, step, cells in rows]


def test_the_table_has_every_step_of_both_passes():
    assert [(phase, step) for phase, step, _ in docstring_table()] == \
        [("reduce-scatter", s) for s in range(3)] + [("all-gather", s) for s in range(3)]


def test_the_table_matches_what_the_code_runs():
    """Run all-reduce on 4 thread ranks; turn each traced transfer into chunk numbers."""
    count = 40
    runs = traced_run(lambda comm: comm.all_reduce(data(comm.rank, count)), 4)
    chunk_at = {lo: chunk for chunk, (lo, _) in enumerate(chunk_bounds(count, 4))}
    ran = {(r["phase"], r["step"], r["rank"]):
           f"{chunk_at[r['send'][0]]}/{chunk_at[r['recv'][0]]}"
           for records, _, _ in runs for r in records}
    for phase, step, cells in docstring_table():
        assert [ran[(phase, step, rank)] for rank in range(4)] == cells, f"{phase} step {step}"


# ---- bytes on real MPI ranks too --------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 5, 6])
def test_all_reduce_moves_2_n_minus_1_over_n_of_the_message(run, size):
    count = 10_007  # a prime: chunks are uneven
    results = run("all_reduce_case", size, "ring", count=count, dtype="float64", op="sum",
                  layout="flat", in_place=False)
    message = count * ITEM
    bound = 2 * (size - 1) / size * message
    for rank, result in enumerate(results):
        stats = result["stats"]
        # Each rank skips two chunks of its own, and chunks differ from S/N by under one element.
        assert abs(stats["bytes_sent"] - bound) < 2 * ITEM, f"rank {rank} sent {stats}"
        assert abs(stats["bytes_received"] - bound) < 2 * ITEM, f"rank {rank} received {stats}"
    assert sum(r["stats"]["bytes_sent"] for r in results) == 2 * (size - 1) * message


@pytest.mark.parametrize("size", [1, 2, 4, 6])
def test_all_gather_moves_n_minus_1_over_n_of_the_output(run, size):
    count = 1009
    results = run("all_gather_case", size, "ring", count=count, dtype="int32", layout="flat",
                  given=False)
    for result in results:
        assert result["stats"]["bytes_sent"] == (size - 1) * count * 4
        assert result["stats"]["bytes_received"] == (size - 1) * count * 4


@pytest.mark.parametrize("size, root", [(1, 0), (2, 1), (5, 3), (6, 0)])
def test_broadcast_reaches_each_rank_exactly_once(run, size, root):
    count = 50_000  # many segments
    results = run("broadcast_case", size, "ring", count=count, dtype="float32", layout="flat",
                  root=root)
    last = (root - 1) % size
    for rank, result in enumerate(results):
        stats = result["stats"]
        assert stats["bytes_received"] == (0 if rank == root else count * 4), rank
        assert stats["bytes_sent"] == (0 if rank == last or size == 1 else count * 4), rank


def test_a_call_traced_on_one_rank_takes_the_way_of_the_others():
    """Tracing is a rank's own affair: where a call could take one exchange or steps (a
    small all-to-all, a small scan), a rank that traces chooses as its peers do, and every
    rank gets NumPy's result."""
    def body(comm):
        blocks = numpy.arange(comm.size * 2.0).reshape(comm.size, 2) + 10 * comm.rank
        mine = numpy.arange(4.0) + comm.rank
        if comm.rank == 0:
            with comm.trace():
                return comm.all_to_all(blocks), comm.scan(mine)
        return comm.all_to_all(blocks), comm.scan(mine)

    size = 3
    for rank, (exchanged, scanned) in enumerate(collectives.spawn(body, size, timeout=5,
                                                                  one_shot_bytes=1 << 16)):
        numpy.testing.assert_array_equal(
            exchanged, numpy.arange(size * 2.0).reshape(size, 2)[rank] + 10 * numpy.arange(
                size)[:, None])
        numpy.testing.assert_array_equal(scanned, sum(numpy.arange(4.0) + r
                                                      for r in range(rank + 1)))
