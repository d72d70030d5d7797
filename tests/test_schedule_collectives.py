"""Gather, reduce, all-to-all, scan and sendrecv move what their definitions say, and no more
bytes than their algorithms must (the oracle and the traced runs of test_schedule.py).

The replay of each traced run must end where the collective's definition says, for 1 to 8
ranks and uneven counts; the table in each algorithm's docstring is checked against a traced
run; and the bytes each rank moves are held against the bound written above its algorithm,
on thread ranks and on real MPI ranks, with equal blocks and uneven ones.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy
import pytest

import cases
from collectives import all_to_all, chunk_bounds, gather, reduce, scan
from test_schedule import COUNTS, ITEM, SIZES, data, own_contributions, replay, traced_run


# ---- gather, reduce, all-to-all, scan and sendrecv ----------------------------------------

def full(size: int, count: int, rank: int) -> numpy.ndarray:
    """A buffer of `size` blocks of `count`, rank r's own data in block r, zeros elsewhere: a
    gather's sendbuf is its own block of it, so every rank's offsets are the result's."""
    buf = numpy.zeros(size * count)
    buf[rank * count:(rank + 1) * count] = data(rank, count)
    return buf


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_gather_sends_each_block_straight_to_the_root(size, count):
    root = size // 2

    def body(comm):
        buf = full(size, count, comm.rank)
        mine = buf[comm.rank * count:(comm.rank + 1) * count]
        return comm.gather(mine, buf.reshape(size, count) if comm.rank == root else None, root)

    runs = traced_run(body, size)
    held = [[Counter({rank: 1}) if i // count == rank else Counter()
             for i in range(size * count)] for rank in range(size)]
    replay([records for records, _, _ in runs], held)
    assert held[root] == [Counter({i // count: 1}) for i in range(size * count)]
    for rank, (_, result, sent) in enumerate(runs):
        if rank == root:
            assert numpy.array_equal(result.reshape(-1), numpy.concatenate(
                [data(r, count) for r in range(size)]))
        assert sent == (0 if rank == root else count * ITEM)  # its block, once


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_reduce_scatters_then_gathers_at_the_root(size, count):
    root = size - 1
    runs = traced_run(lambda comm: comm.reduce(data(comm.rank, count), root=root), size)
    records = [rank_records for rank_records, _, _ in runs]
    held = own_contributions(size, count)
    replay(records, held)
    assert held[root] == [Counter(range(size))] * count
    assert numpy.array_equal(runs[root][1], sum(data(r, count) for r in range(size)))
    chunks = [(hi - lo) * ITEM for lo, hi in chunk_bounds(count, size)]
    for rank, (_, _, sent) in enumerate(runs):
        # Every chunk but its own round the ring, then its own to the root: S, bar the root's.
        assert sent == count * ITEM - (chunks[root] if rank == root else 0)


def exchange(comm, size: int, count: int):
    """An all-to-all from the front half of a buffer into its back half, so that the trace's
    offsets tell the blocks sent from the blocks received."""
    buf = numpy.zeros(2 * size * count)
    buf[:size * count] = comm.rank * 1000 + numpy.arange(size * count)
    half = buf.reshape(2, size, count)
    comm.all_to_all(half[0], half[1])
    return half[1]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_all_to_all_sends_every_block_once_to_its_rank(size, count):
    runs = traced_run(lambda comm: exchange(comm, size, count), size)
    # Element i of the front half of rank r's buffer: (r, the block it belongs to).
    held = [[Counter({(rank, i // count): 1}) if i < size * count else Counter()
             for i in range(2 * size * count)] for rank in range(size)]
    replay([records for records, _, _ in runs], held)
    for rank, (_, result, sent) in enumerate(runs):
        for i in range(size):
            received = held[rank][(size + i) * count:(size + i + 1) * count]
            # Its own block is copied, not sent: the trace does not show it.
            assert received == ([Counter()] if i == rank else [Counter({(i, rank): 1})]) * count
            assert numpy.array_equal(result[i], i * 1000 + rank * count + numpy.arange(count))
        assert sent == (size - 1) * count * ITEM  # (N-1)/N of its buffer


def scan_steps(rank: int, size: int) -> tuple[int, int]:
    """(steps in which `rank` sends, steps in which it receives) of a recursive-doubling scan
    on `size` ranks: it sends where rank + 2^k < size, receives where 2^k <= rank."""
    distances = [1 << k for k in range((size - 1).bit_length())]
    return sum(rank + d < size for d in distances), sum(d <= rank for d in distances)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("exclusive", [False, True])
def test_scan_doubles_each_rank_s_window_every_step(size, count, exclusive):
    runs = traced_run(lambda comm: comm.scan(data(comm.rank, count), exclusive=exclusive),
                      size)
    records = [rank_records for rank_records, _, _ in runs]
    if not exclusive:  # the windows alternate between two buffers of one layout: replayable
        held = own_contributions(size, count)
        replay(records, held)
        assert held == [[Counter(range(rank + 1))] * count for rank in range(size)]
    for rank, (mine, result, sent) in enumerate(runs):
        below = [data(r, count) for r in range(rank if exclusive else rank + 1)]
        assert numpy.array_equal(result, sum(below) if below else numpy.zeros(count))
        sends, receives = scan_steps(rank, size)
        assert sent == sends * count * ITEM  # ceil(log2(N - r)) times S
        assert sum(r["recv"] is not None for r in mine) == (receives if count else 0)


@pytest.mark.parametrize("size", SIZES)
def test_sendrecv_moves_the_message_once_and_nothing_else(size):
    count = 100

    def body(comm):
        return comm.sendrecv(data(comm.rank, count), (comm.rank + 1) % size,
                             src=(comm.rank - 1) % size)

    for rank, (records, result, sent) in enumerate(traced_run(body, size)):
        assert numpy.array_equal(result, data((rank - 1) % size, count))
        # The pair's check exchanges are neither counted nor traced; a rank alone copies.
        assert sent == (count * ITEM if size > 1 else 0)
        assert {r["phase"] for r in records} == ({"sendrecv"} if size > 1 else set())
        # One record, or one a half where a half moved alone (its peer came first,
        # `point_to_point.two_peers`): the message once each way.
        assert sum(r["send"] is not None for r in records) == (size > 1), records
        assert sum(r["recv"] is not None for r in records) == (size > 1), records


# ---- the tables above gather, reduce, all-to-all and scan ---------------------------------

def table(module, phases: str) -> list[tuple[str, int, list[str]]]:
    """The rows of the table in `module`'s docstring (phases: a regex of the phase names):
    (phase, step, ["sent/received" or "-", one per rank])."""
    rows = re.findall(rf"^\s+({phases})\s+(\d+)((?:\s+(?:\S+/\S+|-))+)\s*$",
                      module.__doc__, re.MULTILINE)
    return [(phase, int(step), cells.split()) for phase, step, cells in rows]


def traced_cells(runs, sent_label, received_label) -> dict[tuple[str, int, int], str]:
    """What each rank did in each (phase, step, rank) of a traced run, as a table's cell."""
    cells = {}
    for records, _, _ in runs:
        for r in records:
            sent = sent_label(r) if r["send"] is not None else "-"
            received = received_label(r) if r["recv"] is not None else "-"
            cells[(r["phase"], r["step"], r["rank"])] = f"{sent}/{received}"
    return cells


def assert_table_ran(rows, cells, size):
    assert rows, "the table is missing"
    for phase, step, row in rows:
        ran = [cells.get((phase, step, rank), "-") for rank in range(size)]
        assert ran == row, f"{phase} step {step}: the code ran {ran}"


def test_the_gather_table_matches_what_the_code_runs():
    size, count = 4, 5
    runs = traced_run(lambda comm: comm.gather(data(comm.rank, count), root=0), size)
    cells = traced_cells(runs, lambda r: str(r["rank"]), lambda r: str(r["src"]))
    assert_table_ran(table(gather, "gather"), cells, size)


def test_the_reduce_table_matches_what_the_code_runs():
    size, count = 3, 30
    runs = traced_run(lambda comm: comm.reduce(data(comm.rank, count), root=0), size)
    chunk_at = {lo: str(k) for k, (lo, _) in enumerate(chunk_bounds(count, size))}
    cells = traced_cells(runs, lambda r: chunk_at[r["send"][0]],
                         lambda r: chunk_at[r["recv"][0]])
    assert_table_ran(table(reduce, "reduce-scatter|gather"), cells, size)


def test_the_all_to_all_table_matches_what_the_code_runs():
    size, count = 4, 3
    runs = traced_run(lambda comm: exchange(comm, size, count), size)
    cells = traced_cells(runs, lambda r: str(r["send"][0] // count), lambda r: str(r["src"]))
    assert_table_ran(table(all_to_all, "all-to-all"), cells, size)


def test_the_scan_table_matches_what_the_code_runs():
    size = 5
    runs = traced_run(lambda comm: comm.scan(data(comm.rank, 8)), size)
    cells = traced_cells(runs, lambda r: str(r["dst"]), lambda r: str(r["src"]))
    assert_table_ran(table(scan, "scan"), cells, size)


# ---- bytes on real MPI ranks too --------------------------------------------------------------

@pytest.mark.parametrize("size, root", [(1, 0), (2, 1), (4, 0), (6, 5)])
def test_gather_and_reduce_move_what_their_bounds_say(run, size, root):
    count = 1009  # prime: the reduction's chunks are uneven
    gathered = run("gather_case", size, "ring", count=count, dtype="int32", layout="flat",
                   root=root, recv="none")
    reduced = run("reduce_case", size, "ring", count=count, dtype="float64", op="sum",
                  layout="flat", root=root, in_place=False)
    chunks = [(hi - lo) * 8 for lo, hi in chunk_bounds(count, size)]
    for rank in range(size):
        stats = gathered[rank]["stats"]
        assert stats["bytes_sent"] == (0 if rank == root else count * 4), rank
        assert stats["bytes_received"] == ((size - 1) * count * 4 if rank == root else 0)
        stats = reduced[rank]["stats"]
        assert stats["bytes_sent"] == count * 8 - (chunks[root] if rank == root else 0), rank
    if size > 1:  # the ring brings the root all chunks but the one before its own, the
        lacking = chunks[root] + chunks[(root - 1) % size]  # gather all but its own
        assert reduced[root]["stats"]["bytes_received"] == 2 * count * 8 - lacking


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_all_to_all_scan_and_sendrecv_move_what_their_bounds_say(run, size):
    count = 1000
    exchanged = run("all_to_all_case", size, "ring", count=count, dtype="float32",
                    layout="flat", in_place=False)
    scanned = run("scan_case", size, "ring", count=count, dtype="float64", op="sum",
                  layout="flat", in_place=False, exclusive=False)
    shifted = run("sendrecv_case", size, "auto", count=count, dtype="int64", layout="flat",
                  shift=1)
    for rank in range(size):
        assert exchanged[rank]["stats"]["bytes_sent"] == (size - 1) * count * 4
        assert exchanged[rank]["stats"]["bytes_received"] == (size - 1) * count * 4
        sends, receives = scan_steps(rank, size)
        assert scanned[rank]["stats"]["bytes_sent"] == sends * count * 8
        assert scanned[rank]["stats"]["bytes_received"] == receives * count * 8
        assert shifted[rank]["stats"]["bytes_sent"] == (count * 8 if size > 1 else 0)
        assert shifted[rank]["stats"]["messages"] == (1 if size > 1 else 0)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_small_calls_in_one_exchange_count_what_their_steps_move(run, size):
    """Small equal blocks go in one exchange (each rank publishes its buffer once; the others
    take what is theirs): right in place and not, at every root, and counted as the step-by-step
    algorithms count what moves."""
    count, root, item = 1000, size - 1, 4
    for in_place in (False, True):
        exchanged = run("all_to_all_case", size, "one_shot", count=count, dtype="float32",
                        layout="flat", in_place=in_place)
        cases.check_all_to_all(exchanged, count, "float32")
        gathered = run("gather_case", size, "one_shot", count=count, dtype="float32",
                       layout="strided", root=root, recv="in place" if in_place else "none")
        cases.check_gather(gathered, count, "float32", "strided", root)
        reduced = run("reduce_case", size, "one_shot", count=count, dtype="float32", op="avg",
                      layout="flat", root=root, in_place=in_place)
        cases.check_reduce(reduced, count, "float32", "avg", "flat", root)
        for rank in range(size):
            for result in (exchanged, gathered, reduced):
                assert result[rank]["phase"] == "one-shot"
            stats = exchanged[rank]["stats"]
            assert stats["bytes_sent"] == stats["bytes_received"] == (size - 1) * count * item
            assert stats["messages"] == size - 1
            for result in (gathered, reduced):  # one buffer from each rank to the root
                stats = result[rank]["stats"]
                assert stats["bytes_sent"] == (0 if rank == root else count * item)
                assert stats["bytes_received"] == \
                    ((size - 1) * count * item if rank == root else 0)
    broadcast = run("broadcast_case", size, "one_shot", count=count, dtype="float16",
                    layout="strided", root=root)
    cases.check_broadcast(broadcast, count, "float16", "strided", root)
    for rank in range(size):
        stats = broadcast[rank]["stats"]
        assert broadcast[rank]["phase"] == "one-shot"
        assert stats["bytes_sent"] == ((size - 1) * count * 2 if rank == root else 0)
        assert stats["bytes_received"] == (0 if rank == root else count * 2)
    scattered = run("reduce_scatter_case", size, "one_shot", count=count, dtype="int64",
                    op="prod")
    cases.check_reduce_scatter(scattered, count, "int64", "prod")
    for rank in range(size):
        assert scattered[rank]["phase"] == "one-shot"
        stats = scattered[rank]["stats"]
        assert stats["bytes_sent"] == stats["bytes_received"] == (size - 1) * count * 8


@pytest.mark.parametrize("size", [2, 3, 5])
def test_uneven_blocks_move_what_the_ring_bounds_say(run, size):
    counts = [(3 * r + 1) * 100 % 700 for r in range(size)]  # some blocks far larger
    gathered = run("uneven_case", size, "ring", collective="all_gather", counts=counts,
                   dtype="float64", op="sum", root=0)
    scattered = run("uneven_case", size, "ring", collective="reduce_scatter", counts=counts,
                    dtype="float64", op="sum", root=0)
    for rank in range(size):
        # All-gather: every block but the right neighbour's, the last to arrive; reduce-scatter:
        # every block but its own.
        assert gathered[rank]["stats"]["bytes_sent"] == \
            (sum(counts) - counts[(rank + 1) % size]) * 8
        assert scattered[rank]["stats"]["bytes_sent"] == (sum(counts) - counts[rank]) * 8
