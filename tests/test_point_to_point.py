"""Point-to-point calls: the pair's check, the numbering of messages, and how they fail.

`send`, `recv` and `sendrecv` concern two ranks: they check each message between the two
(check.pair_agree) instead of on every rank. A mismatch (a count, a dtype, two ranks that both
send or both receive, a collective met) raises MismatchError on both ends before any data
moves, and both can go on; a rank left waiting times out naming the message; the check's own
exchanges are neither counted nor traced. The bodies that need real ranks run
through the `run` fixture, on thread ranks and on every pool transport.
"""

from __future__ import annotations

import re

import numpy
import pytest

import cases
import collectives
from cases import values
from collectives import check
from launch import mpiexec, rank_env
from transports.mpi import KEPT_SIZES
from transports.slots import pair_area_bytes

TIMEOUT = 3  # seconds: a rank left waiting gives up after this


@pytest.mark.parametrize("what, message", [
    ("count", "rank 0 sends message #N (count 4, float64) to rank 1, but rank 1 receives "
              "message #N (count 5, float64) from rank 0; the count differs"),
    ("dtype", "rank 0 sends message #N (count 4, float64) to rank 1, but rank 1 receives "
              "message #N (count 4, float32) from rank 0; the dtype differs"),
    ("both send", "rank 0 sends message #N (count 4, float64) to rank 1, but rank 1 sends "
                  "message #N (count 4, float64) to rank 0 at the same time; a send needs a "
                  "matching recv"),
    ("both receive", "rank 1 receives message #N (count 4, float64) from rank 0, but rank 0 "
                     "receives message #N (count 4, float64) from rank 1 at the same time; a "
                     "recv needs a matching send"),
])
def test_both_ends_of_a_mismatched_message_raise_and_go_on(run, what, message):
    """Both ends say the same; the numbers are those of messages the pool's ranks have
    passed before."""
    results = run("mismatch_case", 3, "auto", what=what)
    for rank, result in enumerate(results):
        if rank < 2:  # the pair; rank 2 took no part
            said = re.sub(r"#\d+", "#N", result["result"])
            assert said.startswith(f"MismatchError: rank {rank}: {message}"), said
        else:
            assert result["result"] is None
        numpy.testing.assert_array_equal(result["after"], values((rank - 1) % 3, 3, "int32"))
        assert result["stats"]["bytes_sent"] == 3 * 4, "a mismatched message sent data"


@pytest.mark.parametrize("extra", [0, 1 << 14])
def test_a_pair_on_the_general_path_meets_one_on_the_shortest_way(run, extra):
    """A traced rank takes the general path, an untraced one the lane and the transport's
    shortest way for a pair (on mpi, the check's words and the data in one message, or
    with `extra`, 128 KiB more, the words and then the data straight from the caller's
    buffers; on shm, for a send and its recv too, the pair areas): they meet, agree,
    disagree and count alike; and two untraced ones, both the shortest way."""
    for rank, result in enumerate(run("mixed_paths_case", 3, "auto", extra=extra)):
        if rank == 2:
            continue
        peer = 1 - rank
        expected = []
        for trial in range(6):
            expected += [values(peer + trial, 5 + extra, "float64").tolist(), "MismatchError",
                         values(peer + trial, 4 + extra, "float64").tolist(), "MismatchError"]
        assert result["got"] == expected, [str(got)[:80] for got in result["got"]]
        for key in ("bytes_sent", "bytes_received"):
            assert result["stats"][key] == 6 * (5 + 4 + 2 * extra) * 8, result["stats"]
        assert result["stats"]["messages"] == 6 * 2, result["stats"]
        # (Where the transport readies steps, the untraced calls took them.)
        assert result["stepped"] == (["recv", "send", "sendrecv"]
                                     if result["transport"] in ("shm", "mpi") else []), result


@pytest.mark.parametrize("in_place", [False, True])
def test_a_ring_shift_meets_a_rank_on_the_general_path(run, in_place):
    """On 3 ranks, each rank in turn traces (the general path) while the others take the
    step readied for a sendrecv with two peers: every shift is right, with the step's
    halves through the pair areas and, on shm with direct reads, read in place."""
    for rank, result in enumerate(run("mixed_ring_case", 3, "auto", in_place=in_place)):
        assert result["got"] == [values((rank - 1) % 3 + trial, 5, "float64").tolist()
                                 for trial in range(4)], result["got"]
        if result["in_place"] is not None:  # each untraced shift's message, left in place
            assert result["in_place"] == 3, result


def pipeline_results(count: int, reverse: bool) -> list[list[list[float]]]:
    """What each of 3 ranks receives in `pipeline_case`."""
    sent = [values(rank, count, "float64").tolist() for rank in range(3)]
    return [[sent[2]], [sent[2], sent[0]], []] if reverse else [[sent[2]], [sent[0]], [sent[1]]]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("traced", [None, 1])
@pytest.mark.parametrize("transport, count", [("shm", 5), ("mpi", 5), ("mpi", 12 << 10)])
def test_a_sendrecv_with_two_peers_meets_a_pipeline(rank_pool, transport, count, traced,
                                                    reverse):
    """On 3 ranks, rank 0's sendrecv (to rank 1, from rank 2), by the step its transport
    readies for two peers, meets ranks that receive and send alone, rank 1 on the general path
    or not: in a pipeline the step's send must go first (rank 2 sends to it only once rank 1
    has passed its message on), reversed its recv. Each order alone deadlocks one of them
    (`ring_step`). On mpi, 96 KiB: rank 0's halves go in packets while a message with one
    peer that large sends its words alone and then its data (`mpi.PAIR_DIRECT_BYTES`)."""
    results = rank_pool.run("pipeline_case", 3, transport, "auto", count=count, traced=traced,
                            reverse=reverse)
    assert [result["got"] for result in results] == pipeline_results(count, reverse)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_ring_shift_read_in_place_meets_a_pipeline(rank_pool, reverse):
    """The same on shm with 1 MiB messages: rank 0's halves are read in place where direct
    reads work, while rank 1's recv alone, larger than a segment, goes the general way and
    takes rank 0's message only as rank 0 sends it."""
    results = rank_pool.run("pipeline_case", 3, "shm", "auto", count=1 << 17, reverse=reverse)
    assert [result["got"] for result in results] == pipeline_results(1 << 17, reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("count, traced", [(5, 0), (1 << 17, None), (1 << 17, 0)])
def test_a_general_sendrecv_with_two_peers_meets_a_pipeline(run, count, traced, reverse):
    """The same where rank 0's sendrecv takes the general path (traced; on the threads
    transport always; on mpi above a packet): each half is checked by its own pair, and the
    half whose peer comes first moves first (`point_to_point.two_peers`)."""
    results = run("pipeline_case", 3, "auto", count=count, traced=traced, reverse=reverse)
    assert [result["got"] for result in results] == pipeline_results(count, reverse)


@pytest.mark.parametrize("first", ["send", "recv"])
def test_a_general_sendrecv_moves_the_half_that_agrees_when_the_other_differs(run, first):
    """Rank 0's sendrecv with two peers, on the general path, where one pair agrees and its
    peer comes first while the other pair's count differs: the agreeing half moves (alone,
    before the other has come: `two_peers`), the other raises on both its ends, rank 0's
    strided recvbuf holds what it received, and the next ring shift is right everywhere."""
    results = run("half_differs_case", 3, "auto", first=first)
    zeros, five = [0.0] * 5, [values(r, 5, "float64").tolist() for r in range(3)]
    differs = ("rank 2 sends message #N (count 6, float64) to rank 0, but rank 0 receives "
               "message #N (count 5, float64) from rank 2; the count differs" if first == "send"
               else "rank 0 sends message #N (count 5, float64) to rank 1, but rank 1 receives "
               "message #N (count 6, float64) from rank 0; the count differs")
    for rank, result in enumerate(results):
        assert result["after"] == values((rank - 1) % 3, 3, "int32").tolist(), result
    said = [re.sub(r"#\d+", "#N", result["raised"] or "") for result in results]
    other, agreeing = (2, 1) if first == "send" else (1, 2)
    assert said[0] == f"rank 0: {differs}" and said[other] == f"rank {other}: {differs}", said
    assert results[agreeing]["raised"] is None
    assert results[0]["got"] == (zeros if first == "send" else five[2])
    if first == "send":
        assert results[1]["got"] == five[0]


def test_pairs_take_no_measured_road_where_ranks_share_cores(rank_pool):
    """Where ranks share cores (shm without `roads`), a pair's sendrecv of 128 KiB goes
    through the pair areas every time: no kind of message times its roads, since its timings
    would measure the scheduler."""
    for rank, result in enumerate(rank_pool.run("crowded_pair_roads_case", 2, "shm")):
        assert result["got"] == [values((rank ^ 1) + trial, 1 << 14, "float64").tolist()
                                 for trial in range(10)]
        assert result["measured"] == 0, result


def test_readied_messages_outlive_a_sweep_of_more_sizes_than_the_transport_keeps(run):
    """The lane keeps each kind of message's step; the mpi transport keeps fewer packets than
    that (KEPT_SIZES), and a step whose packet has gone takes a new one. Cycling through more
    sizes than it keeps, on 3 ranks, every message is right."""
    sizes = KEPT_SIZES + 3
    for rank, result in enumerate(run("messages_of_many_sizes_case", 3, "auto", sizes=sizes)):
        want = []
        for _ in range(3):
            for count in range(1, sizes + 1):
                want.append(values(rank ^ 1 if rank ^ 1 < 3 else rank, count,
                                   "float64").tolist())
                want.append(values((rank - 1) % 3, count, "float64").tolist())
                if rank == 1:
                    want.append(values(0, count, "float64").tolist())
        assert result["got"] == want


@pytest.mark.parametrize("sent, expected", [("float64", "float64"), ("int8", "complex128"),
                                             (">f4", "bool")])
def test_the_lane_describes_a_sendrecv_as_the_general_path_does(sent, expected):
    """The small-message lane makes a sendrecv's words and its peer's from the numbers
    (check.pair_said); the general path by `messages` and `mirrored`: the same words."""
    mine, into = numpy.zeros(5, sent), numpy.zeros(3, expected)
    said = check.messages((7, mine), (2, into))
    assert check.pair_said(7, 2, check.pair_kind(mine, into)) == (said, check.mirrored(said))


def test_a_small_sendrecv_goes_through_the_pair_areas_on_shm(run):
    """On shm a sendrecv of up to a pair area each way with one peer is one publish and
    one wait, through the pair areas (slots.py, "Pair areas"); a larger one is read in place
    or goes through the slots. So does a send and its recv of up to a pair area and a
    segment. Right on every transport."""
    area = pair_area_bytes(3) // 8
    for rank, result in enumerate(run("pair_areas_case", 3, "auto")):
        if rank == 2:
            continue
        one_way = result["one_way"]
        assert result["got"] == [values(1 - rank, count, "float64").tolist()
                                 for count in (1, area, area + 1)] + (
            [values(0, count, "float64").tolist() for count in (1, one_way, one_way + 1)]
            if rank == 1 else [])
        if result["transport"] == "shm":
            assert one_way == min(area, (256 << 10) // 8), one_way  # (shm's segment)
            assert result["through_areas"] == [8, 8 * area, -8, -8 * one_way], \
                result["through_areas"]


def test_a_sendrecv_read_in_place_meets_every_way_its_peer_sends(run):
    """On shm with direct reads, a pair's messages read in place (slots.py, "Pair messages
    read in place", here from any size): right at every size, against a peer on the general
    way (in one segment and in several), and a mismatch raises on both ranks, after which the next
    message is right. Right on every transport."""
    for rank, result in enumerate(run("pair_in_place_case", 3, "auto")):
        if rank == 2:
            continue
        peer = 1 - rank
        want = [values(peer, count, "float64").tolist()
                for count in (1, 512, 1 << 15, 100, (1 << 16) + 3)]
        assert result["got"] == want + ["MismatchError", values(peer, 9, "float64").tolist()]
        if result["in_place"] is not None:  # every lane's call (rank 1 took 2 the general way)
            assert result["in_place"] == 7 - 2 * rank, result["in_place"]


@pytest.mark.parametrize("count", [6, 1 << 17])
def test_a_sendrecv_moves_the_half_whose_pair_agreed(run, count):
    """A ring shift on 3 ranks where only ranks 0 and 1 disagree (rank 0 sends one element
    too many): they raise, rank 2, whose pairs both agreed, gets rank 1's message, and the next
    shift is right everywhere. Before, the half whose pair agreed was dropped: rank 2 took
    rank 1's next message, or its check's words, as this one's data, with no error. On shm
    and mpi the small shift takes a step readied for two peers, which keeps the same rule, and
    so does the large one on shm where each half is read in place."""
    for rank, result in enumerate(run("ring_mismatch_case", 3, "auto", count=count)):
        first, second = result["result"]
        if rank < 2:
            assert isinstance(first, str) and first.startswith("MismatchError: ") and \
                "the count differs" in first, (rank, first)
        else:
            numpy.testing.assert_array_equal(first, values(1, count, "float64"))
        numpy.testing.assert_array_equal(second, values((rank - 1) % 3 + 10, count, "float64"))
        # On shm and mpi a small ring shift takes a readied step; a larger one the general
        # path, but on shm where pairs are read in place, from there (each half read in place).
        reads_from = result["reads_from"]
        assert result["stepped"] == (result["transport"] in ("shm", "mpi") and count < 1 << 15
                                     or reads_from is not None and 8 * count >= reads_from), \
            result


def test_counts_that_differ_raise_mismatch_on_every_rank_of_every_transport(run):
    for rank, result in enumerate(run("mismatch_case", 3, "auto", what="counts")):
        said = re.sub(r"#\d+ ", "#N ", result["result"])  # the pool's calls go on counting
        assert said.startswith(f"MismatchError: rank {rank}: ranks disagree: rank 0 called "
                               f"all_gather #N (counts #")
        assert result["result"].endswith("; the counts differ")
        numpy.testing.assert_array_equal(result["after"], values((rank - 1) % 3, 3, "int32"))


def test_without_the_check_the_transport_finds_a_wrong_size():
    def body(comm):
        if comm.rank == 0:
            comm.send(numpy.zeros(4), 1)
        else:
            comm.recv(numpy.zeros(5), 0)

    with pytest.raises(collectives.MismatchError, match="rank 1 expected 40 bytes from rank 0 "
                                                        "but got 32 during recv #1 from rank 0"):
        collectives.spawn(body, 2, check=False, timeout=TIMEOUT)


def test_without_the_check_mpi_refuses_a_longer_message_with_a_collective_error():
    """MPI reports the truncation in the receive's status: mpi4py's own exception escaped,
    where every error of ringcc derives from CollectiveError."""
    code = ("import numpy, collectives\n"
            "comm = collectives.init('mpi', check=False, timeout=20)\n"
            "try:\n"
            "    comm.send(numpy.zeros(5), 1) if comm.rank == 0 else comm.recv(numpy.zeros(4), 0)\n"
            "except collectives.CollectiveError as error:\n"
            "    print('refused:', error, flush=True)\n")
    out = mpiexec(2, "-c", code, timeout=60).stdout
    assert "refused: rank 1: MPI reported an error while this rank waited for a message from " \
        "rank 0 during recv #1 from rank 0" in out, out


def test_a_receive_that_no_rank_sends_to_times_out_naming_the_message():
    def body(comm):
        if comm.rank == 1:
            comm.recv(numpy.zeros(3), 0)  # rank 0 returns at once

    with pytest.raises(collectives.CollectiveTimeoutError,
                       match=r"rank 1 waited 0.5 s for a message from rank 0 during recv #1 "
                             r"from rank 0 \(check step 0\)"):
        collectives.spawn(body, 2, timeout=0.5)


def test_without_the_check_two_receives_time_out_and_leave_the_communicator_broken():
    def body(comm):
        with pytest.raises(collectives.CollectiveTimeoutError):
            comm.recv(numpy.zeros(3), 1 - comm.rank)  # each waits for the other to send
        with pytest.raises(collectives.CollectiveError, match="cannot be used since recv #1 "
                                                              "from rank"):
            comm.barrier()

    collectives.spawn(body, 2, check=False, timeout=0.5)


def test_messages_are_numbered_per_peer_and_only_their_data_is_counted_and_traced():
    def body(comm):
        with comm.trace() as records:
            if comm.rank == 0:
                comm.send(numpy.arange(4.0), 1)
                comm.send(numpy.arange(6, dtype="int16"), 1)
                comm.send(numpy.arange(2.0), 2)
            elif comm.rank == 1:
                first, second = numpy.empty(4), numpy.empty((2, 3), "int16")
                comm.recv(first, 0)
                comm.recv(second, 0)  # filled flat
                assert first.tolist() == [0, 1, 2, 3] and second.ravel().tolist() == [*range(6)]
            else:
                assert comm.recv(numpy.empty(2), 0).tolist() == [0, 1]
        return [(r["where"], r["phase"], r["bytes"]) for r in records], vars(comm.stats).copy()

    (sent, stats0), (received, stats1), (other, _) = collectives.spawn(body, 3, timeout=TIMEOUT)
    assert sent == [("send #1 to rank 1", "send", 32), ("send #2 to rank 1", "send", 12),
                    ("send #1 to rank 2", "send", 16)]
    assert received == [("recv #1 from rank 0", "recv", 0), ("recv #2 from rank 0", "recv", 0)]
    assert other == [("recv #1 from rank 0", "recv", 0)]
    none_between_nodes = {"inter_node_bytes_sent": 0, "inter_node_bytes_received": 0}
    assert stats0 == {"bytes_sent": 60, "bytes_received": 0, "messages": 3, **none_between_nodes}
    assert stats1 == {"bytes_sent": 0, "bytes_received": 44, "messages": 0, **none_between_nodes}


def test_sendrecv_with_itself_copies_and_defaults_to_a_new_array_from_its_peer():
    def body(comm):
        mine = numpy.arange(3.0) + comm.rank
        if comm.size == 1:
            return comm.sendrecv(mine, 0).tolist()
        return comm.sendrecv(mine, 1 - comm.rank).tolist()  # recvbuf new, src = dst

    assert collectives.spawn(body, 1) == [[0.0, 1.0, 2.0]]
    assert collectives.spawn(body, 2) == [[1.0, 2.0, 3.0], [0.0, 1.0, 2.0]]


def test_empty_messages_are_checked_but_move_nothing():
    def body(comm):
        if comm.rank == 0:
            comm.send(numpy.zeros(0), 1)
        else:
            comm.recv(numpy.zeros(0), 0)
        return vars(comm.stats).copy()

    assert collectives.spawn(body, 2) == [{"bytes_sent": 0, "bytes_received": 0,
                                           "messages": 0, "inter_node_bytes_sent": 0,
                                           "inter_node_bytes_received": 0}] * 2
    with pytest.raises(collectives.MismatchError, match="count 0, float64"):
        collectives.spawn(lambda c: c.send(numpy.zeros(0), 1) if c.rank == 0
                          else c.recv(numpy.zeros(1), 0), 2, timeout=TIMEOUT)


@pytest.mark.parametrize("count", [3, 1 << 14])
@pytest.mark.parametrize("collective", ["barrier", "all_reduce", "large all_reduce"])
@pytest.mark.parametrize("where", ["threads", "mpi", "shm"])
def test_a_receive_met_by_a_collective_raises_on_both_and_both_go_on(rank_pool, where,
                                                                     collective, count):
    """Each check meets the other's description (on mpi, where a collective's packet is
    longer than a message's check, and a large recv's words go alone; on shm, where each
    answers the other's line), both raise, and the collective takes back its number: a
    barrier, an all-reduce and a sendrecv then work."""
    if where == "threads":
        results = collectives.spawn(
            lambda comm: cases.collective_met_case(comm, collective, count), 2, timeout=TIMEOUT)
    else:
        results = rank_pool.run("collective_met_case", 2, where, collective=collective,
                                count=count)
    name = collective.split()[-1]
    said = [re.sub(r"#\d+", "#N", result["result"]) for result in results]
    assert said[0].startswith("MismatchError: rank 0: ranks disagree: rank 1 called recv #N "
                              f"(count {count}, float64), but rank 0 called {name} #N"), said[0]
    assert said[1] == (f"MismatchError: rank 1: rank 1 calls recv #N (count {count}, float64) "
                       "with rank 0, which makes a collective call"), said[1]
    for rank, result in enumerate(results):
        numpy.testing.assert_array_equal(result["total"], values(0, 5, "float64")
                                         + values(1, 5, "float64"))
        numpy.testing.assert_array_equal(result["after"], values(1 - rank, 3, "int32"))


@pytest.mark.parametrize("transport", ["mpi", "shm"])
def test_on_three_ranks_a_collective_met_by_a_message_ends_or_goes_on_on_every_rank(transport):
    """Rank 0 makes an all-reduce, rank 1 a recv from it, rank 2 the all-reduce. On shm the
    message's rank answers every rank of the collective: all three raise MismatchError and go
    on. On mpi only rank 0 hears rank 1, and rank 2 still waits for it: ranks 0 and 1 raise
    MismatchError and refuse later calls, rank 2 times out; no rank takes a later call's data
    for this one's."""
    code = "\n".join([
        "import numpy, collectives", f"comm = collectives.init({transport!r}, timeout=2)",
        "said = []",
        "for call in (lambda: comm.recv(numpy.zeros(3), 0) if comm.rank == 1",
        "             else comm.all_reduce(numpy.ones(3)),",
        "             lambda: comm.all_reduce(numpy.ones(2)).tolist()):",
        "    try:",
        "        said.append(str(call()))",
        "    except collectives.CollectiveError as error:",
        "        said.append(type(error).__name__)",
        "print(comm.rank, said)"])
    env = rank_env()
    del env["PYTHONUNBUFFERED"]  # each rank then writes its line whole, at exit
    lines = sorted(line for line in mpiexec(3, "-c", code, timeout=90, env=env).stdout
                   .splitlines() if line[:1].isdigit())
    if transport == "shm":
        assert lines == [f"{rank} ['MismatchError', '[3.0, 3.0]']" for rank in range(3)], lines
    else:
        assert lines == ["0 ['MismatchError', 'CollectiveError']",
                         "1 ['MismatchError', 'CollectiveError']",
                         "2 ['CollectiveTimeoutError', 'CollectiveError']"], lines


def test_sendrecv_works_in_place(run):
    """`recvbuf` is `sendbuf`, or another view of its memory: the message sent is the
    buffer as the call found it (MPI_Sendrecv_replace), on every transport and path."""
    assert [result["result"] for result in run("sendrecv_in_place_case", 3)] == [[]] * 3


def test_a_receive_met_by_a_collective_raises_on_both_ranks():
    """Rank 1 waits for a message while rank 0 enters a barrier: each check meets the other's
    description, and both say what the other did instead."""
    def body(comm):
        with pytest.raises(collectives.MismatchError) as caught:
            if comm.rank == 0:
                comm.barrier()
            else:
                comm.recv(numpy.zeros(3), 0)
        return str(caught.value)

    barrier, receive = collectives.spawn(body, 2, timeout=TIMEOUT)
    assert barrier == ("rank 0: ranks disagree: rank 1 called recv #1 (count 3, float64), but "
                       "rank 0 called barrier #1; the collective differs")
    assert receive == ("rank 1: rank 1 calls recv #1 (count 3, float64) with rank 0, which "
                       "makes a collective call")


@pytest.mark.parametrize("src", [1, 2], ids=["one peer", "two peers"])
@pytest.mark.parametrize("error, raised, broken", [
    (check.MessagesDiffer("rank 0: the pair differs"), collectives.MismatchError, False),
    (ValueError("rank 0: refused"), ValueError, False),
    (collectives.CollectiveTimeoutError("rank 0 waited"), collectives.CollectiveTimeoutError,
     True)])
def test_a_readied_step_that_fails_raises_as_the_general_path_would(error, raised, broken, src):
    """A sendrecv's readied step, with one peer or with two, that raises: a pair that
    disagreed is a MismatchError, and a ValueError too leaves the communicator usable;
    anything else (a timeout) breaks it, so its next call says why at once. (The steps are
    stand-ins on thread ranks, whose transport readies none of its own.)"""
    def fail(*args):
        raise error

    def body(comm):
        if comm.rank == 0:
            comm._transport.prepare_pair_message = lambda *args: fail
            comm._transport.prepare_ring_message = lambda *args: fail
            with pytest.raises(raised, match=str(error)) as caught:
                comm.sendrecv(numpy.arange(3.0), 1, src=src)
            assert type(caught.value) is raised and caught.value.__cause__ is None
            assert caught.value.__suppress_context__ == (raised is not type(error))
            if broken:
                with pytest.raises(collectives.CollectiveError, match=re.escape(
                        f"cannot be used since sendrecv (send #1 to rank 1, recv #1 from rank "
                        f"{src}) failed (CollectiveTimeoutError: rank 0 waited)")):
                    comm.barrier()
        if not broken:
            comm.barrier()  # every rank: rank 0 goes on

    collectives.spawn(body, 3, timeout=TIMEOUT)
