"""The ring does what all_reduce.py says it does, and moves no more bytes than the ring must."""

from __future__ import annotations

import re

import numpy
import pytest

import collectives
from collectives import all_reduce, chunk_bounds
from collectives.ring import ring_chunks

COUNT = 8000  # 2000 elements per chunk on 4 ranks: a large message, so the ring runs


def docstring_table() -> list[tuple[str, int, list[str]]]:
    """The rows of the 4-rank table in all_reduce.py: (phase, step, ["sent/received", ...])."""
    rows = re.findall(r"^\s+(reduce-scatter|all-gather)\s+(\d)\s+((?:\d/\d\s+){3}\d/\d)\s*$",
                      all_reduce.__doc__, re.MULTILINE)
    return [(phase, int(step), cells.split()) for phase, step, cells in rows]


def test_the_table_has_every_step_of_both_passes():
    table = docstring_table()
    assert [(phase, step) for phase, step, _ in table] == \
        [("reduce-scatter", s) for s in range(3)] + [("all-gather", s) for s in range(3)]


def test_the_table_matches_the_schedule_function():
    first = {"reduce-scatter": 0, "all-gather": 1}
    for phase, step, cells in docstring_table():
        computed = ["%d/%d" % ring_chunks(rank, 4, step, first[phase]) for rank in range(4)]
        assert cells == computed, f"{phase} step {step}"


def test_the_table_matches_what_the_code_runs():
    """Run all-reduce on 4 thread ranks with tracing on; turn each transfer into chunk numbers."""
    def traced(comm):
        with comm.trace() as records:
            comm.all_reduce(numpy.arange(COUNT, dtype=numpy.float64) * (comm.rank + 1))
        return records

    starts = {lo: chunk for chunk, (lo, _) in enumerate(chunk_bounds(COUNT, 4))}
    records = [r for rank_records in collectives.spawn(traced, 4) for r in rank_records]
    ran = {}
    for r in records:
        ran[(r["phase"], r["step"], r["rank"])] = f"{starts[r['send'][0]]}/{starts[r['recv'][0]]}"
    for phase, step, cells in docstring_table():
        assert [ran[(phase, step, rank)] for rank in range(4)] == cells, f"{phase} step {step}"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 6])
def test_all_reduce_moves_2_n_minus_1_over_n_of_the_message(run, size):
    count = 10_007  # a prime: chunks are uneven
    results = run("all_reduce_case", size, "ring", count=count, dtype="float64", op="sum",
                  layout="flat", in_place=False)
    message = count * 8
    bound = 2 * (size - 1) / size * message
    for rank, result in enumerate(results):
        stats = result["stats"]
        # Each rank skips two chunks of its own, and chunks differ from S/N by under one element.
        assert abs(stats["bytes_sent"] - bound) < 2 * 8, f"rank {rank} sent {stats}"
        assert abs(stats["bytes_received"] - bound) < 2 * 8, f"rank {rank} received {stats}"
    # Every chunk goes round the ring twice, one hop short each time.
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
