"""Non-blocking calls (`async_op=True`, collectives/work.py) and the timeline (timeline.py).

Calls run in the order they were made whatever order they are waited on in, blocking calls
queue behind outstanding ones, errors surface at `wait()` on every rank, and `close` waits for
what is queued. The bodies that need real ranks run through the `run` fixture, on thread ranks
and on every pool transport.
"""

from __future__ import annotations

import inspect
import json
import threading

import numpy
import pytest

import collectives
from cases import assert_matches, reduce_reference, values
from launch import mpiexec

SIZE = 3


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_outstanding_calls_of_every_collective_waited_out_of_order_are_right(run, dtype):
    count = 5
    for order in range(2):
        results = run("async_case", SIZE, "auto", count=count, dtype=dtype, order=order)
        mine = [values(r, count, dtype) for r in range(SIZE)]
        blocks = [values(r, SIZE * count, dtype).reshape(SIZE, count) for r in range(SIZE)]
        for rank, outcome in enumerate(results):
            assert outcome["completed"]
            got = outcome["result"]
            assert_matches(got["all_reduce"], reduce_reference("sum", mine), dtype)
            assert_matches(got["queued"], reduce_reference("max", mine), dtype)
            assert_matches(got["all_gather"], numpy.stack(mine), dtype)
            assert_matches(got["broadcast"], mine[SIZE - 1], dtype)
            assert_matches(got["scatter"], blocks[0][rank], dtype)
            assert_matches(got["reduce_scatter"],
                           reduce_reference("sum", [b[rank] for b in blocks]), dtype)
            if rank == 0:
                assert_matches(got["gather"], numpy.stack(mine), dtype)
            else:
                assert got["gather"] is None
            if rank == SIZE - 1:
                assert_matches(got["reduce"], reduce_reference("sum", mine), dtype)
            else:
                assert got["reduce"] is None
            assert_matches(got["all_to_all"], numpy.stack([b[rank] for b in blocks]), dtype)
            assert_matches(got["scan"], reduce_reference("sum", mine[:rank + 1]), dtype)
            assert_matches(got["sendrecv"], mine[(rank - 1) % SIZE], dtype)
            assert got["barrier"] is None


def test_a_mismatch_inside_an_async_call_raises_at_wait_on_every_rank(run):
    for rank, outcome in enumerate(run("async_mismatch_case", SIZE, "auto")):
        said = outcome["result"]
        assert said is not None and said.startswith(f"MismatchError: rank {rank}: ranks "
                                                    f"disagree"), said
        assert "all_reduce" in said
        numpy.testing.assert_array_equal(outcome["after"], [[0], [1], [2]])


def test_a_timeout_inside_an_async_call_raises_at_wait_and_breaks_the_communicator():
    def body(comm):
        if comm.rank == 0:
            return None  # never joins: rank 1's all-reduce times out
        work = comm.all_reduce(numpy.ones(3), async_op=True)
        with pytest.raises(collectives.CollectiveTimeoutError, match="all_reduce") as raised:
            work.wait()
        assert "raised by all_reduce (async call)" in raised.value.__notes__
        assert isinstance(work.exception(), collectives.CollectiveTimeoutError)
        with pytest.raises(collectives.CollectiveError, match="cannot be used"):
            comm.all_gather(numpy.ones(1), async_op=True).wait()
        with pytest.raises(collectives.CollectiveError, match="cannot be used"):
            comm.barrier()
        return "raised"

    assert collectives.spawn(body, 2, timeout=0.5) == [None, "raised"]


def test_close_waits_for_outstanding_calls():
    """Rank 0 closes with its calls still queued (the others come later), and its queued calls
    still run on the progress thread while `close` waits for them."""
    others = threading.Event()

    def body(comm):
        if comm.rank == 0:
            threading.Timer(0.2, others.set).start()
        else:
            others.wait(30)
        return [comm.all_reduce(values(comm.rank, 4, "float64"), async_op=True)
                for _ in range(4)]  # never waited on: the communicator closes with them queued

    want = reduce_reference("sum", [values(r, 4, "float64") for r in range(SIZE)])
    for works in collectives.spawn(body, SIZE):
        for work in works:
            assert work.is_completed()
            assert_matches(work.wait(), want, "float64")


def test_a_with_block_left_by_an_error_does_not_wait_for_the_queued_calls():
    """An error inside `with comm:` while a call is queued that the peer never joins: waiting
    for it held the error back for the whole timeout (a job's traceback 30 s late). The
    communicator is broken instead, and the queued call ends on its own."""
    def body(comm):
        if comm.rank == 1:
            return None
        try:
            with comm:
                work = comm.all_reduce(numpy.ones(4), async_op=True)
                raise KeyError("rank 0 fails with a call queued")
        except KeyError:
            pass
        left_queued = comm._progress.outstanding  # (before: 0, the call waited out)
        with pytest.raises(collectives.CollectiveError, match="with calls still queued"):
            comm.all_reduce(numpy.ones(4))
        return left_queued, isinstance(work.exception(), collectives.CollectiveError)

    # (The queued call ends with its timeout, or refused by the broken communicator if it had
    # not started: a CollectiveError either way.)
    assert collectives.spawn(body, 2, timeout=1)[0] == (1, True)


def test_wait_with_a_timeout_leaves_the_call_running_and_is_completed_never_blocks():
    late = threading.Event()

    def body(comm):
        if comm.rank == 1:
            late.wait(30)  # until rank 0 has seen its call still running
        work = comm.all_reduce(numpy.full(2, comm.rank + 1.0), async_op=True)
        if comm.rank == 0:
            assert not work.is_completed()
            with pytest.raises(collectives.CollectiveTimeoutError, match="within 0.05 s"):
                work.wait(timeout=0.05)
            late.set()
        return work.wait().tolist()

    assert collectives.spawn(body, 2) == [[3.0, 3.0], [3.0, 3.0]]


def test_submitted_functions_run_in_turn_and_their_calls_run_at_once():
    def body(comm):
        x = numpy.arange(3.0) + comm.rank
        first = comm.all_reduce(x, async_op=True)
        doubled = comm.submit(lambda: comm.all_reduce(x, op="max", async_op=True).wait() * 2)
        last = comm.broadcast(numpy.full(2, comm.rank), root=1, async_op=True)
        return first.wait().tolist(), doubled.wait().tolist(), last.wait().tolist()

    for result in collectives.spawn(body, 2):
        assert result == ([1.0, 3.0, 5.0], [2.0, 4.0, 6.0], [1, 1])


def test_a_waiter_runs_the_calls_queued_up_to_its_own_in_order_where_none_is_running():
    """A waiter whose call is still queued, with none running, runs the calls up to its own
    itself, in order (work.py), instead of waiting for the thread to wake; not with a
    timeout, which must return in time. Here the thread is held in its preparation, as if it
    had not woken yet; what no one waits for, it runs once free."""
    from collectives.work import Progress

    hold, ran = threading.Event(), []
    progress = Progress("progress", lambda: hold.wait(30))

    def call(n: int) -> int:
        ran.append((n, threading.current_thread().name, progress.on_thread()))
        return n
    works = [progress.submit(f"call {n}", lambda n=n: call(n)) for n in range(4)]
    with pytest.raises(collectives.CollectiveTimeoutError, match="within 0.05 s"):
        works[0].wait(timeout=0.05)  # (not ready: the thread's preparation has not run)
    progress._ready = True  # as once it has run, the thread not woken since
    with pytest.raises(collectives.CollectiveTimeoutError, match="within 0.05 s"):
        works[0].wait(timeout=0.05)
    assert ran == []
    assert works[1].wait() == 1
    me = threading.current_thread().name
    assert ran == [(0, me, True), (1, me, True)] and not progress.on_thread()
    assert progress.outstanding == 2 and works[0].is_completed()
    hold.set()
    progress.close()  # the thread runs what is left
    assert [work.wait() for work in works] == [0, 1, 2, 3]
    assert ran[2:] == [(2, "progress", True), (3, "progress", True)]


def test_a_call_in_turn_runs_here_ahead_of_calls_made_meanwhile_or_behind_those_queued():
    """`Progress.call_in_turn` (a blocking torch call's way): with nothing queued or running,
    the call runs on the caller's thread, counted as outstanding, and a call submitted from
    another thread meanwhile waits until it has returned; with a call queued, it queues behind
    it; made from a call running in its turn, it runs at once."""
    from collectives.work import Progress

    progress, ran = Progress("progress"), []
    late: list = []

    def first() -> str:
        ran.append(("first", threading.current_thread().name, progress.outstanding))
        other = threading.Thread(target=lambda: late.append(progress.submit(
            "late", lambda: ran.append(("late", threading.current_thread().name)))))
        other.start()
        other.join()  # submitted: it waits for this call, which the thread finds running
        assert progress.call_in_turn("nested", lambda: "nested") == "nested"
        ran.append(("first ends", progress.outstanding))
        return "first"

    assert progress.call_in_turn("first", first) == "first"
    late[0].wait()  # (run by the thread, or by this waiter)
    me = threading.current_thread().name
    assert ran[:2] == [("first", me, 1), ("first ends", 2)] and ran[2][0] == "late", ran
    hold, pause = threading.Event(), threading.Event()
    progress.submit("held", lambda: (hold.wait(30), ran.append("held")))
    for _ in range(30_000):  # until the thread runs it, holding the queue
        if progress._running:
            break
        pause.wait(0.001)
    behind = threading.Thread(
        target=lambda: progress.call_in_turn("behind", lambda: ran.append("behind")))
    behind.start()
    for _ in range(30_000):  # until it is queued behind the held call
        if progress._calls:
            break
        pause.wait(0.001)
    assert progress._calls and ran[-1][0] == "late"  # (not run at once)
    hold.set()
    behind.join()
    assert ran[-2:] == ["held", "behind"] and progress.outstanding == 0, ran
    progress.close()


def test_an_async_small_call_takes_the_lane_in_its_turn(run):
    """An async call runs as its blocking form would, in its turn: a small one through its
    public method and its lane (small.py), which then knows its kind, where there is one."""
    for result in run("async_lane_case", 2, "auto"):
        assert result["results"] == [[1.0, 3.0, 5.0]] * 3
        assert result["lane"] == (result["transport"] in ("shm", "mpi")), result


def test_every_collective_says_async_op_in_its_signature():
    for name in ("all_reduce", "all_gather", "broadcast", "scatter", "reduce_scatter", "gather",
                 "reduce", "all_to_all", "scan", "barrier", "send", "recv", "sendrecv"):
        parameter = inspect.signature(getattr(collectives.Communicator, name)).parameters
        assert parameter["async_op"].default is False, name


# ---- the timeline --------------------------------------------------------------------------

def check_timeline(path, ranks: int, rows: set[str]) -> dict:
    """The trace-event schema, every rank named, `rows` among each rank's rows, and within
    each rank's row events in order and never overlapping. Returns the events by row name."""
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == \
        {f"rank {r}" for r in range(ranks)}
    by_row: dict[tuple[int, str], list[dict]] = {}
    for e in events:
        if e["ph"] == "M":
            continue
        assert e["ph"] == "X" and set(e) == {"name", "ph", "pid", "tid", "ts", "dur", "args"}
        assert 0 <= e["pid"] < ranks and e["ts"] >= 0 and e["dur"] >= 0
        by_row.setdefault((e["pid"], names[(e["pid"], e["tid"])]), []).append(e)
    for rank in range(ranks):
        assert rows <= {row for pid, row in by_row if pid == rank}, (rank, list(by_row))
    for row in by_row.values():
        for before, after in zip(row, row[1:]):
            assert before["ts"] <= after["ts"], "events out of order"
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-6, (before, after)
    return {key: [e["name"] for e in row] for key, row in by_row.items()}


def test_a_traced_communicator_writes_a_timeline_of_calls_steps_and_spans(tmp_path):
    path = tmp_path / "timeline.json"

    def body(comm):
        started = [comm.all_reduce(numpy.ones(300), async_op=True) for _ in range(3)]
        with comm.span("compute"):
            comm.all_gather(numpy.ones(2))
        for work in started:
            work.wait()
        comm.write_timeline(str(path))

    collectives.spawn(body, 2, segment_bytes=512, one_shot_bytes=0, trace=True)
    rows = check_timeline(path, 2, {"spans", "calls", "reduce-scatter", "all-gather"})
    assert rows[(0, "calls")][:4] == ["all_reduce #1", "all_reduce #2", "all_reduce #3",
                                      "all_gather #4"]
    assert rows[(1, "spans")] == ["compute"]
    assert rows[(0, "reduce-scatter")][0] == "reduce-scatter step 0"


def test_without_tracing_there_is_no_timeline_to_write(tmp_path):
    def body(comm):
        with pytest.raises(collectives.InvalidArgumentError, match="nothing traced"):
            comm.write_timeline(str(tmp_path / "never.json"))

    collectives.spawn(body, 2)
    assert not (tmp_path / "never.json").exists()


def test_the_trainer_writes_a_timeline_of_its_first_steps(tmp_path):
    """Small buckets: several all-reduces a step, started while backward goes on."""
    mpiexec(2, "-m", "trainer", "--epochs", "1", "--steps", "8", "--bucket-mb", "0.02",
            "--transport", "shm", "--timeline", str(tmp_path), timeout=120)
    rows = check_timeline(tmp_path / "timeline.json", 2, {"spans", "calls"})
    for rank in range(2):
        spans = rows[(rank, "spans")]
        assert spans[:3] == ["forward", "backward", "optimizer"]
        assert spans.count("backward") == 5  # TIMELINE_STEPS steps traced
        assert sum(name.startswith("all_reduce") for name in rows[(rank, "calls")]) > 5


def test_transfers_of_one_call_under_way_at_once_are_one_event():
    """A two-shot pass keeps its sends under way together: in the timeline they are one
    event of the phase, from the first start to the last end, bytes and peers summed; the
    next step stays an event of its own."""
    from collectives.timeline import Trace, rank_events

    def sent(dst: int, start: float, end: float, step: int = 0) -> dict:
        return {"where": "all_reduce #1", "phase": "reduce-scatter", "step": step,
                "kind": "copy", "bytes": 8, "dst": dst, "src": None, "start": start,
                "end": end}

    trace = Trace()
    trace += [sent(1, 1.0, 3.0), sent(2, 1.5, 2.5), sent(3, 2.0, 4.0), sent(1, 5.0, 6.0, 1)]
    events = rank_events(0, trace)["events"]
    assert [(e["name"], e["ts"], e["dur"], e["args"]["bytes"], e["args"]["to"])
            for e in events] == [("reduce-scatter step 0", 0.0, 3e6, 24, [1, 2, 3]),
                                 ("reduce-scatter step 1", 4e6, 1e6, 8, [1])]


def test_async_calls_made_inside_a_trace_block_are_traced():
    """The block starts and ends in turn with the queued calls: those made inside it run
    traced, however late the progress thread runs them; one queued before it does not."""
    def body(comm):
        before = comm.all_reduce(numpy.ones(300), async_op=True)
        with comm.trace() as records:
            inside = [comm.all_reduce(numpy.ones(300), async_op=True) for _ in range(2)]
        before.wait()
        for work in inside:
            work.wait()
        return sorted({record["where"] for record in records}), [c[1] for c in records.calls]

    for where, calls in collectives.spawn(body, 2):
        assert where == ["all_reduce #2", "all_reduce #3"], where
        assert calls == ["all_reduce #2", "all_reduce #3"], calls


def test_a_trace_block_starts_without_waiting_for_the_calls_queued_before_it():
    """Rank 0 queues a recv, then, inside a trace block, does what lets rank 1 send: had the
    block waited at its start for the queued recv, neither rank would have gone on."""
    go = threading.Event()

    def body(comm):
        if comm.rank == 0:
            got = numpy.zeros(3)
            work = comm.recv(got, 1, async_op=True)
            with comm.trace():
                go.set()
            work.wait()
            return got.tolist()
        go.wait(timeout=10)
        comm.send(numpy.ones(3), 0)
        return None

    assert collectives.spawn(body, 2, timeout=5)[0] == [1.0, 1.0, 1.0]


def test_a_timeline_written_with_calls_queued_holds_them_and_a_span_in_a_later_block_counts(
        tmp_path):
    """`write_timeline` right after async calls (no wait) writes once they have run: it held
    none of them, as its gather queued behind them. A `span` in a `trace` block entered while
    calls were queued was lost: it read the transport's trace, which switches in turn."""
    path = str(tmp_path / "timeline.json")

    def body(comm):
        started = [comm.all_reduce(numpy.ones(300), async_op=True) for _ in range(3)]
        with comm.trace() as records:
            comm.all_reduce(numpy.ones(300), async_op=True)
            with comm.span("backward"):
                pass
            comm.write_timeline(path, records)
        return [work.is_completed() for work in started], [row for row, *_ in records.calls]

    for completed, rows in collectives.spawn(body, 2, segment_bytes=512, one_shot_bytes=0):
        assert completed == [True] * 3 and rows.count("spans") == 1, rows
    rows = check_timeline(tmp_path / "timeline.json", 2, {"spans", "calls"})
    assert rows[(0, "calls")][0] == "all_reduce #4" and rows[(1, "spans")] == ["backward"]


def test_an_async_call_on_a_closed_communicator_is_refused_at_the_call():
    def body(comm):
        comm.close()
        with pytest.raises(collectives.InvalidArgumentError, match="closed"):
            comm.all_reduce(numpy.ones(2), async_op=True)
        return comm._progress._thread is None  # and no progress thread was started

    assert collectives.spawn(body, 2) == [True, True]


def test_waiting_on_the_progress_thread_for_a_call_queued_behind_is_refused():
    """A submitted function that waits for a call made after it waited for ever, and `close`
    with it: the progress thread would run that call only once the function returned."""
    def body(comm):
        made, later = threading.Event(), []

        def waits_for_the_next():
            made.wait(30)
            return later[0].wait()
        first = comm.submit(waits_for_the_next)
        later.append(comm.all_reduce(numpy.ones(2), async_op=True))
        made.set()
        with pytest.raises(collectives.InvalidArgumentError, match="queued behind the call"):
            first.wait()
        return later[0].wait().tolist()

    assert collectives.spawn(body, 2, timeout=10) == [[2.0, 2.0]] * 2


def test_a_progress_thread_that_could_not_start_gives_each_call_its_own_error():
    from collectives.work import Progress

    def fail() -> None:
        raise OSError("no such device")

    progress = Progress("progress", fail)
    works = [progress.submit(f"call {n}", lambda: None) for n in range(3)]
    progress.close()
    errors = [work.exception() for work in works]
    assert len({id(error) for error in errors}) == 3
    for n, error in enumerate(errors):
        assert isinstance(error, collectives.CollectiveError) and "no such device" in str(error)
        assert error.__notes__ == [f"raised by call {n}"], error.__notes__


@pytest.mark.parametrize("level", ["single", "serialized"])
def test_async_calls_on_mpi_initialised_without_threads_are_refused_with_the_reason(tmp_path,
                                                                                     level):
    """The progress thread makes MPI calls while the caller's thread may make its own: below
    MPI_THREAD_MULTIPLE every async call raises why (it ran, against the MPI standard), and
    blocking calls go on."""
    script = tmp_path / "single.py"
    script.write_text(
        "import mpi4py\n"
        f"mpi4py.rc.thread_level = '{level}'\n"
        "import numpy\n"
        "import collectives\n"
        "with collectives.init('mpi', timeout=30) as comm:\n"
        "    error = comm.all_reduce(numpy.ones(2), async_op=True).exception()\n"
        "    assert isinstance(error, collectives.CollectiveError), error\n"
        f"    assert 'at MPI_THREAD_{level.upper()}' in str(error), error\n"
        "    assert comm.all_reduce(numpy.ones(2)).tolist() == [comm.size] * 2\n"
        "print('refused', flush=True)\n")
    job = mpiexec(2, str(script), timeout=60)
    assert job.stdout.count("refused") == 2, job.stdout
