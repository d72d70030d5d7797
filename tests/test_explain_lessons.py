"""The explainer's lessons of gather, reduce, all-to-all, scan and sendrecv: each replay ends
where the collective did, the bytes each rank sent are those its lesson expects, and the
pictures draw them."""

from __future__ import annotations

import json

import pytest

import collectives
from collectives import explain
from collectives.explain import picture
from collectives.explain.schedule import schedule

CASES = [("gather", 4, 8, None), ("gather", 1, 3, None), ("gather", 3, 0, None),
         ("reduce", 3, 7, "avg"), ("reduce", 5, 10, "min"), ("reduce", 2, 1, "sum"),
         ("all_to_all", 3, 6, None), ("all_to_all", 4, 0, None), ("all_to_all", 1, 2, None),
         ("scan", 5, 3, "avg"), ("scan", 3, 4, "prod"), ("scan", 1, 2, "sum"),
         ("sendrecv", 4, 3, None), ("sendrecv", 1, 2, None)]


@pytest.mark.parametrize("collective, size, count, op", CASES)
def test_the_replay_ends_where_the_collective_did(collective, size, count, op):
    setup = explain.Setup(collective, size, count, root=size - 1, op=op or "sum",
                          segment_bytes=16)
    per_rank = collectives.spawn(explain.run_rank, size, setup, (collective,),
                                 segment_bytes=16)
    text, run = explain.explain(setup, json.loads(json.dumps(per_rank)), "threads")
    assert run.replay_matches and run.reference_matches, text
    sent = text[text.index("bytes each rank sent"):].splitlines()[1:]
    assert len(sent) == size and all(line.endswith("(as expected)") for line in sent), text
    assert "<svg" in picture.svg(run) and "<html" in picture.html(run)


def test_scan_averages_divide_by_the_ranks_each_one_reduced(capsys):
    explain.main(["scan", "--ranks", "4", "--count", "2", "--op", "avg"])
    out = capsys.readouterr().out
    assert [line.strip() for line in out.splitlines() if "divides" in line] == \
        [f"rank {r} divides [0:2) by {r + 1} (op avg)" for r in (1, 2, 3)]
    assert "ends where the collective did, on every rank: yes" in out


def test_all_to_all_shows_the_buffer_sent_then_the_buffer_received(capsys):
    explain.main(["all_to_all", "--ranks", "2", "--count", "4"])
    out = capsys.readouterr().out
    assert "  rank 0  [  0  1 |  2  3 ||  0  1 |  -  - ]" in out  # its own block, copied
    assert "  rank 1 -> rank 0: block 0 [0:2) into [6:8) copy" in out
    assert "  rank 0  [  0  1 |  2  3 ||  0  1 | 10 11 ]" in out


def test_a_gather_lesson_refuses_a_count_of_uneven_blocks():
    with pytest.raises(SystemExit):
        explain.main(["gather", "--ranks", "4", "--count", "6"])
    with pytest.raises(SystemExit):
        explain.main(["sendrecv", "--op", "sum"])


def test_hierarchical_shows_each_pass_on_its_part_and_the_bytes_between_nodes(capsys):
    explain.main(["hierarchical", "--ranks", "4", "--node-size", "2", "--count", "8"])
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert steps == ["step 1 of 4: node reduce-scatter", "step 2 of 4: across reduce-scatter",
                     "step 3 of 4: across all-gather", "step 4 of 4: node all-gather"], out
    # Inside node 0 (ranks 0, 1) and node 1 (2, 3), then between them, in world ranks.
    assert "  rank 1 -> rank 0: shard 0 [0:4) reduce" in out
    assert "  rank 0 -> rank 2: [0:2) reduce" in out and "  rank 3 -> rank 1: [4:6) copy" in out
    assert "  rank 2  [ 60 64 68 72 | 24 25 26 27 ]" in out  # shard 0 done, before the gather
    assert "ends where the collective did, on every rank: yes" in out
    assert "the result equals NumPy's reference: yes" in out
    assert out.count("(as expected)") == 4
    assert "(at most 2(M-1)/M S/k, in whole elements 32 B; a flat ring's busiest rank sends " \
        "2(N-1)/N S = 96 B across)" in out
    assert out.count(": 32 B = 0.5 S  (within the bound)") == 4


@pytest.mark.parametrize("size, node_size, count, op", [(6, 3, 13, "avg"), (6, 2, 12, "max"),
                                                        (4, 1, 5, "sum"), (4, 4, 3, "prod")])
def test_hierarchical_replays_on_any_cut_into_nodes(size, node_size, count, op):
    setup = explain.Setup("hierarchical", size, count, op=op, segment_bytes=16,
                          node_size=node_size)
    per_rank = collectives.spawn(explain.run_rank, size, setup, ("hierarchical",),
                                 segment_bytes=16, one_shot_bytes=0, node_size=node_size)
    text, run = explain.explain(setup, json.loads(json.dumps(per_rank)), "threads")
    assert run.replay_matches and run.reference_matches, text
    assert text.count("(as expected)") == size and "OVER THE BOUND" not in text, text
    assert "<svg" in picture.svg(run) and "<html" in picture.html(run)


def test_node_size_is_for_the_hierarchical_lesson_and_must_cut_whole_nodes():
    with pytest.raises(SystemExit):
        explain.main(["all_reduce", "--node-size", "2"])
    with pytest.raises(SystemExit):
        explain.main(["hierarchical", "--ranks", "5", "--node-size", "2"])


def test_a_sendrecv_whose_send_went_ahead_is_put_in_steps_as_its_halves():
    """A ring of three where rank 0 moved both halves of its sendrecv at once, while ranks 1
    and 2 each received before they sent (halves moved apart as their peers came,
    `point_to_point.two_peers`): with rank 0's record whole, the steps would wait in a
    circle; rank 0's send went first, so the steps are 0 -> 1, 1 -> 2, then 2 -> 0."""
    def record(dst, src):
        return {"dst": dst, "src": src, "send": [0, 2], "recv": [0, 2], "kind": "copy",
                "phase": "sendrecv", "bytes": 16}
    records = [[record(1, 2)], [record(None, 0), record(2, None)],
               [record(None, 1), record(0, None)]]
    frames = schedule(records)
    assert [[(move.src, move.dst) for move in frame] for frame in frames] == \
        [[(0, 1)], [(1, 2)], [(2, 0)]]
    # (Where a step can hold each sendrecv whole, it does: a ring shift is one step.)
    ring = [[record((r + 1) % 3, (r - 1) % 3)] for r in range(3)]
    assert [len(frame) for frame in schedule(ring)] == [3]


def test_a_sendrecv_whose_peer_sent_ahead_may_receive_before_it_sends():
    """A ring of four where rank 2 sent before it received (its halves apart), while ranks 3,
    0 and 1 each moved both halves at once: 3 received 2's message, then 0 received 3's and
    1 received 0's in the same step, and 1's message reached 2 a step later. Each rank that
    moved both at once received before, or with, its send."""
    def record(dst, src):
        return {"dst": dst, "src": src, "send": [0, 2], "recv": [0, 2], "kind": "copy",
                "phase": "sendrecv", "bytes": 16}
    records = [[record(1, 3)], [record(2, 0)], [record(3, None), record(None, 1)],
               [record(0, 2)]]
    assert [[(move.src, move.dst) for move in frame] for frame in schedule(records)] == \
        [[(0, 1), (2, 3), (3, 0)], [(1, 2)]]
