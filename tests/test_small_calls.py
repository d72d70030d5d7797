"""The small-call lane (collectives/small.py): a small blocking collective of NumPy arrays
(all_reduce, broadcast, reduce, gather, all_gather, reduce_scatter, all_to_all) skips the
general path's machinery. It must be the same call in every way a user can see: the same
result, bitwise, as the general path's one-shot form; the same bytes in `stats`; the same
check, naming a mismatch on every rank; the same exchange, so a rank on the general path meets
ranks in the lane; and every form it does not take (a strided input, a first call of its kind,
a traced or queued call, a bad recvbuf) still works or fails as before, through the general
path. (The lane takes the calls that go one-shot: the "one_shot" variant makes them so on
every transport, threads too.)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy
import pytest

import collectives
from collectives.ops import identity
from cases import (LANES, LARGE_IN_PLACE_BYTES, LARGE_REDUCED_BLOCK_BYTES, large_block,
                   assert_matches, reduce_reference, values)
from launch import mpiexec
from transports.mpi import KEPT_SIZES

SIZE = 3
KINDS = [("float32", "sum"), ("float64", "avg"), ("int32", "max"), ("bool", "min"),
         ("complex64", "prod"), ("float16", "sum"), ("uint8", "prod")]


@pytest.mark.parametrize("dtype, op", KINDS)
def test_the_lane_gives_the_general_paths_result_bitwise_and_counts_the_same(run, dtype, op):
    results = run("small_call_case", SIZE, "one_shot", dtype=dtype, op=op)
    mine = [values(r, 6, dtype).reshape(2, 3) for r in range(SIZE)]
    want = reduce_reference(op, mine).astype(dtype)
    first = results[0]["lane"][0]
    for outcome in results:
        lane, general = outcome["lane"], outcome["general"]
        assert_matches(lane[0], want, dtype)
        assert lane[0].tobytes() == general[0].tobytes() == first.tobytes()
        assert lane[1:] == general[1:]  # bytes sent, received, messages
        assert lane[1] == (SIZE - 1) * want.nbytes
        for form in ("into", "in_place", "into_view", "into_strided", "overlapping"):
            assert outcome[form].tobytes() == first.tobytes(), form
        assert outcome["returned_into"]
        assert_matches(outcome["scalar"], want[0, 0].reshape(()), dtype)
        strided = reduce_reference(op, [values(r, 12, dtype).reshape(2, 6)[:, ::2]
                                        for r in range(SIZE)]).astype(dtype)
        assert_matches(outcome["strided"], strided, dtype)
        # Only the named algorithm and the strided input took the general path.
        assert outcome["general_path"] == ["one_shot", "auto"]


def lane_references(dtype: str, op: str) -> dict[str, list]:
    """What each lane's collective gives each rank (None: nothing), from NumPy."""
    mine = [values(r, 6, dtype).reshape(2, 3) for r in range(SIZE)]
    blocks = [values(r, 6 * SIZE, dtype).reshape(SIZE, 2, 3) for r in range(SIZE)]
    root = SIZE - 1
    large = values(root, large_block(dtype) * SIZE, dtype).reshape(SIZE, large_block(dtype))
    total = reduce_reference(op, mine).astype(dtype)
    return {
        "broadcast": [mine[root]] * SIZE,
        "gather": [None] * root + [numpy.stack(mine)],
        "all_gather": [numpy.stack(mine)] * SIZE,
        "reduce": [None] * root + [total],
        "reduce_scatter": [reduce_reference(op, [b[r] for b in blocks]).astype(dtype)
                           for r in range(SIZE)],
        "all_to_all": [numpy.stack([b[r] for b in blocks]) for r in range(SIZE)],
        "scan": [reduce_reference(op, mine[:r + 1]).astype(dtype) for r in range(SIZE)],
        "exclusive scan": [numpy.full((2, 3), identity(op, numpy.dtype(dtype), numpy))]
        + [reduce_reference(op, mine[:r]).astype(dtype) for r in range(1, SIZE)],
        "sendrecv": [mine[(r - 1) % SIZE] for r in range(SIZE)],
        "scatter": list(blocks[root]),
        "large scatter": list(large),
    }


@pytest.mark.parametrize("dtype, op", KINDS[:4])
def test_every_lane_gives_the_general_paths_result_bitwise_and_counts_the_same(run, dtype, op):
    """broadcast, gather, all_gather, reduce, reduce_scatter, all_to_all, scan, sendrecv and
    scatter (small, and with blocks too large for its description) take the lane once their
    kind is known: each result is NumPy's, bitwise the general path's for the same call, in
    every form, and counted alike. Only rank 0's strided input took the general path, and the
    other ranks' lanes met it in the same exchange."""
    want = lane_references(dtype, op)
    for rank, outcome in enumerate(run("small_lanes_case", SIZE, "one_shot", dtype=dtype,
                                       op=op)):
        for name in LANES:
            got = outcome[name]
            lane, general = got["lane"], got["general"]
            assert got["taken"] == (["general"] if rank == 0 else []), name
            assert lane[1:] == general[1:], name  # bytes sent, received, messages
            if want[name][rank] is None:
                assert lane[0] is None and general[0] is None and got["mixed"] is None, name
                continue
            assert_matches(lane[0], want[name][rank], dtype)
            assert lane[0].tobytes() == general[0].tobytes(), name
            for form in ("into", "into_strided", "in_place", "mixed"):
                if form in got:
                    assert numpy.array_equal(got[form], lane[0]), (name, form)
            assert got.get("returned_into", True), name


@pytest.mark.parametrize("dtype, op", KINDS[:2])
def test_every_lane_is_right_with_its_inputs_read_in_place(run, dtype, op):
    """As above, with every one-shot exchange that can read its inputs in place doing so
    (transports/slots.py, "Inputs read in place": the all-to-all's, reduce-scatter's and
    all-gather's, where direct reads work), and the lanes placing what they take straight in
    their results (a gather's root copying its own block with the exchange, `alongside`):
    the same results, bitwise the general path's, in every form, rank 0 on the general path
    meeting the others' lanes; a mismatch raises on every rank, leaving the all-to-all's
    result untouched; and on shm, where a rank can read its peers' memory, the inputs were
    read in place."""
    want = lane_references(dtype, op)
    for rank, outcome in enumerate(run("small_lanes_case", SIZE, "one_shot", dtype=dtype,
                                       op=op, read_in_place=True)):
        for name in ("reduce_scatter", "all_to_all", "all_gather", "gather"):
            got = outcome[name]
            lane, general = got["lane"], got["general"]
            assert lane[1:] == general[1:], name
            if want[name][rank] is None:  # (off the gather's root)
                continue
            assert_matches(lane[0], want[name][rank], dtype)
            assert lane[0].tobytes() == general[0].tobytes(), name
            for form in ("into", "into_strided", "in_place", "mixed"):
                if form in got:
                    assert numpy.array_equal(got[form], lane[0]), (name, form)
        assert outcome["mismatch"] == "untouched", outcome["mismatch"]
        if outcome["read in place"] is not None:  # (shm, with direct reads)
            # every call of the three (6 reduce-scatters, 7 all-to-alls, 6 all-gathers), from
            # every peer
            assert outcome["read in place"] == 19 * (SIZE - 1), outcome["read in place"]


@pytest.mark.parametrize("dtype, variant", [("float64", "one_shot"), ("int8", "one_shot"),
                                            ("float64", "ring")])
def test_all_to_alls_and_all_gathers_read_in_place_take_one_exchange_at_any_size(run, dtype,
                                                                                variant):
    """With every exchange that can read its inputs in place doing so, all-to-alls and
    all-gathers of blocks larger than an area take one exchange: each result is NumPy's in
    every form (by itself, into a recvbuf, a strided one, in place, rank 0 alone strided),
    each call read every peer's input in place where a rank can read its peers' memory (shm),
    and a mismatch raises on every rank, leaving the results untouched. There they take the
    lane, however large: only rank 0's strided input took the general path, and met the
    others' lanes. With one_shot_bytes=0 ("ring"), none takes one exchange, nor the lane."""
    count = LARGE_IN_PLACE_BYTES // numpy.dtype(dtype).itemsize
    outcomes = run("large_read_in_place_case", SIZE, variant, dtype=dtype)
    for rank, outcome in enumerate(outcomes):
        blocks = [values(r, SIZE * count, dtype).reshape(SIZE, count) for r in range(SIZE)]
        want = {"all_to_all": numpy.stack([theirs[rank] for theirs in blocks]),
                "all_gather": numpy.stack([values(r, count, dtype) for r in range(SIZE)])}
        for name, expected in want.items():
            for form in ("", " into", " strided", " in place", " mixed"):
                assert numpy.array_equal(outcome[name + form], expected), (name, form)
        general = outcome["general path"]
        if outcome["read in place"] is not None and variant == "ring":
            assert outcome["read in place"] == 0, outcome["read in place"]
            mismatched = "all_to_all" if rank == 0 else "all_gather"  # (the mismatch's call)
            assert general == {name: 5 + (name == mismatched)
                               for name in ("all_to_all", "all_gather")}, general
        elif outcome["read in place"] is not None:  # (shm, with direct reads)
            # five calls of each, from every peer
            assert outcome["read in place"] == 10 * (SIZE - 1), outcome["read in place"]
            assert outcome["mismatch"] == "untouched", outcome["mismatch"]
            strided = 1 if rank == 0 else 0  # (the "mixed" call)
            assert general == {"all_to_all": strided, "all_gather": strided}, general


@pytest.mark.parametrize("variant", ["one_shot", "ring"])
def test_a_scatter_takes_its_lane_at_any_size(run, variant):
    """A scatter whose blocks are larger in all than `one_shot_bytes` takes the lane all the
    same, its exchange being the blocks' description (collectives/small.py): right from every
    root, no call on the general path; rank 0 alone on it meets the others' lanes.
    With one_shot_bytes=0 ("ring") none takes a lane."""
    count = LARGE_IN_PLACE_BYTES // 8
    for rank, outcome in enumerate(run("large_scatter_case", SIZE, variant, dtype="float64")):
        for root, got in enumerate(outcome["got"]):
            assert got.tobytes() == values(root, SIZE * count, "float64")[
                rank * count:(rank + 1) * count].tobytes(), root
        assert outcome["mixed"].tobytes() == values(0, SIZE * count, "float64")[
            rank * count:(rank + 1) * count].tobytes()
        assert outcome["general path"] == (0 if variant == "one_shot" else SIZE)
        assert outcome["mixed general"] == (1 if variant == "ring" or rank == 0 else 0)


@pytest.mark.parametrize("dtype, op", [("float64", "sum"), ("int32", "max")])
def test_reduce_scatters_read_in_place_take_one_exchange_where_ranks_share_cores(run, dtype,
                                                                                 op):
    """Where ranks outnumber the cores, a reduce-scatter whose blocks are read in place takes
    one exchange, larger than an area too (below the blocks for which the two-shot passes
    pay): each result is NumPy's, bitwise the same in every form (by itself, into a recvbuf,
    a strided one, in place, rank 0 alone strided). Where a rank can read its peers' memory
    (shm), each call read every peer's block in place, the calls after the first took the
    lane but rank 0's strided one, which met the others' lanes, and a mismatch raised on
    every rank, leaving the result untouched. A reduce of the same blocks makes its first pass
    so too (collectives/reduce.py): the root's result is NumPy's."""
    count = LARGE_REDUCED_BLOCK_BYTES // numpy.dtype(dtype).itemsize
    outcomes = run("large_reduce_scatter_case", SIZE, "one_shot", dtype=dtype, op=op)
    for rank, outcome in enumerate(outcomes):
        blocks = [values(r, SIZE * count, dtype).reshape(SIZE, count) for r in range(SIZE)]
        want = reduce_reference(op, [theirs[rank] for theirs in blocks]).astype(dtype)
        assert_matches(outcome["alone"], want, dtype)
        for form in ("into", "strided", "in place", "mixed"):
            assert outcome[form].tobytes() == outcome["alone"].tobytes(), form
        if rank == SIZE - 1:  # a reduce of the same blocks, to the last rank
            flat = [theirs.reshape(-1) for theirs in blocks]
            assert_matches(outcome["reduce"], reduce_reference(op, flat).astype(dtype), dtype)
        else:
            assert outcome["reduce"] is None
        if outcome["read in place"] is not None:  # (shm, with direct reads)
            # five calls, from every peer
            assert outcome["read in place"] == 5 * (SIZE - 1), outcome["read in place"]
            assert outcome["mismatch"] == "untouched", outcome["mismatch"]
            assert outcome["general path"] == (rank == 0), outcome["general path"]
            # the reduce's first pass: its chunk of every peer's input, read in place
            assert outcome["reduce read in place"] == SIZE - 1, outcome["reduce read in place"]


def test_prepared_exchanges_outlive_a_sweep_of_more_sizes_than_the_transport_keeps(run):
    """The lane keeps each kind's exchange prepared (`prepare_all_inputs`); the transport keeps
    fewer packets than that. Cycling through more sizes than it keeps, every result is right."""
    sizes = KEPT_SIZES + 3
    want = [reduce_reference("sum", [values(r, count, "float64") for r in range(SIZE)])
            for count in range(1, sizes + 1)] * 3
    for results in run("small_calls_of_many_sizes_case", SIZE, "one_shot", sizes=sizes):
        assert len(results) == len(want)
        for got, expected in zip(results, want):
            assert_matches(got, expected, "float64")


def test_a_mismatch_in_the_lane_is_named_on_every_rank_and_the_communicator_goes_on(run):
    want = reduce_reference("sum", [values(r, 4, "float64") for r in range(SIZE)])
    for rank, outcome in enumerate(run("small_call_mismatch_case", SIZE, "one_shot")):
        said = outcome["said"]
        assert said is not None and said.startswith(f"MismatchError: rank {rank}: ranks "
                                                    f"disagree"), said
        assert "sum" in said and "max" in said, said
        said = outcome["said_broadcast"]
        assert said is not None and said.startswith(f"MismatchError: rank {rank}: ranks "
                                                    f"disagree"), said
        assert "root 0" in said and "root 1" in said, said
        said = outcome["said_barrier"]
        assert said is not None and said.startswith(f"MismatchError: rank {rank}: ranks "
                                                    f"disagree"), said
        assert "barrier" in said and "all_reduce" in said, said
        assert_matches(outcome["after"], want, "float64")


def test_what_the_lane_does_not_take_still_works_or_fails_as_before():
    def body(comm):
        x = numpy.arange(4.0) + comm.rank
        comm.all_reduce(x)
        comm.all_reduce(x)  # the kind is known: the lane would take it
        with comm.trace() as trace:
            traced = comm.all_reduce(x)
        queued = comm.all_reduce(x, async_op=True)
        behind = comm.all_reduce(x)  # queued behind the async call
        read_only = numpy.empty(4)
        read_only.flags.writeable = False
        with pytest.raises(collectives.InvalidArgumentError, match="read-only"):
            comm.all_reduce(x, read_only)
        for wrong in (numpy.empty(5), numpy.empty(4, numpy.float32)):
            with pytest.raises(collectives.InvalidArgumentError, match="recvbuf must have"):
                comm.all_reduce(x, wrong)
        return ([name for _, name, _, _ in trace.calls], traced.tolist(),
                queued.wait().tolist(), behind.tolist())

    want = [6.0, 10.0, 14.0, 18.0]
    for calls, *results in collectives.spawn(body, 4, one_shot_bytes=1 << 20):
        assert calls == ["all_reduce #3"]
        assert results == [want, want, want]


def test_a_kind_of_scatter_kept_by_the_lane_lets_no_root_through_that_is_not_a_rank():
    """The lane keeps a kind of scatter by its root and the root's buffer: a root of True or
    1.0 is equal to 1, and would find the kind that root 1 left; they are refused as before,
    on every rank, and the communicator goes on."""
    blocks = numpy.arange(6.0).reshape(2, 3)

    def body(comm):
        for _ in range(2):  # (the second call of the kind takes the lane)
            comm.scatter(blocks if comm.rank == 1 else None, numpy.empty(3), root=1)
        said = []
        for wrong in (True, 1.0):
            with pytest.raises(collectives.InvalidArgumentError, match="is not a rank") as error:
                comm.scatter(blocks if comm.rank == 1 else None, numpy.empty(3), root=wrong)
            said.append(str(error.value))
        return said, comm.scatter(blocks if comm.rank == 1 else None, root=1).tolist()

    for rank, (said, after) in enumerate(collectives.spawn(body, 2, one_shot_bytes=1 << 20)):
        assert said == ["root True is not a rank in [0, 2)", "root 1.0 is not a rank in [0, 2)"]
        assert after == blocks[rank].tolist()


def test_the_lane_and_the_general_path_keep_the_inputs_byte_order():
    """A big-endian input: the general path gave a big-endian result, the lane (whose ufunc
    made the result) a native one: the same values, other bytes."""
    def body(comm):
        x = (numpy.arange(4) + comm.rank).astype(">f4")
        results = [comm.all_reduce(x), comm.all_reduce(x), comm.reduce(x), comm.reduce(x)]
        return [(r.dtype.str, r.tobytes()) for r in results if r is not None]

    for rank, results in enumerate(collectives.spawn(body, 2, one_shot_bytes=1 << 20)):
        assert len({r for r in results}) == 1 and results[0][0] == ">f4", (rank, results)


def test_a_scan_into_a_recvbuf_that_overlaps_its_input_in_one_exchange():
    """recvbuf = sendbuf shifted by half: the input, copied over recvbuf first, was then read
    from sendbuf, half overwritten by that copy (the lane and the steps read it right)."""
    def body(comm, general):
        base = numpy.zeros(12)
        mine, out = base[:8], base[4:]
        mine[...] = numpy.arange(8) + 10 * comm.rank
        return (comm._scan if general else comm.scan)(mine, out).tolist()

    for general in (False, True):  # (the lane, and the general path)
        for rank, got in enumerate(collectives.spawn(body, 2, general,
                                                     one_shot_bytes=1 << 20)):
            want = sum(numpy.arange(8) + 10 * r for r in range(rank + 1))
            assert got == want.tolist(), (general, rank, got)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # (NumPy's, of matrix)
def test_an_ndarray_subclass_is_moved_as_its_array():
    """numpy.matrix stays 2-D when reshaped flat: it failed with NumPy's own error."""
    def body(comm):
        return [comm.all_reduce(numpy.asmatrix(numpy.ones((2, n)) * (comm.rank + 1))).tolist()
                for n in (3, 40_000)]

    for small, large in collectives.spawn(body, 2, one_shot_bytes=1 << 10):
        assert small == [[3.0] * 3] * 2 and large == [[3.0] * 40_000] * 2


def test_unchecked_small_inputs_of_different_sizes_are_named_on_every_rank(tmp_path):
    """With the check off, the one-shot exchange still carries each input's size (shm in its
    call line, mpi in its header), so the lane names inputs of different sizes on every rank
    instead of reading past the shorter one."""
    mpiexec(2, __file__, "unchecked", str(tmp_path), timeout=120)
    for transport in ("shm", "mpi"):
        for rank, (mine, theirs) in enumerate(((32, 40), (40, 32))):
            said = (tmp_path / f"{transport}-{rank}.txt").read_text()
            assert said.startswith(f"MismatchError: rank {rank} exchanges {mine} bytes but "
                                   f"rank {1 - rank} {theirs} during all_reduce #3"), said


def test_ranks_that_differ_on_the_check_are_refused_on_every_rank(tmp_path):
    """A checking rank would make exchanges that an unchecking one never joins: the
    communicator is refused when it is made, on every rank, naming each rank's setting."""
    mpiexec(2, __file__, "mixed", str(tmp_path), timeout=120)
    for transport in ("shm", "mpi"):
        for rank in range(2):
            said = (tmp_path / f"{transport}-{rank}.txt").read_text()
            assert said == ("InvalidArgumentError: the call check must be on on every rank or "
                            "off on every rank (check=, $RINGCC_CHECK); got, by rank: 0: on, "
                            "1: off"), said


if __name__ == "__main__" and sys.argv[1] == "mixed":
    from mpi4py import MPI

    for transport in ("shm", "mpi"):
        try:
            collectives.init(transport, check=MPI.COMM_WORLD.Get_rank() == 0).close()
            said = "no error"
        except collectives.InvalidArgumentError as error:
            said = f"InvalidArgumentError: {error}"
        Path(sys.argv[2], f"{transport}-{MPI.COMM_WORLD.Get_rank()}.txt").write_text(said)

if __name__ == "__main__" and sys.argv[1] == "unchecked":
    for transport in ("shm", "mpi"):
        comm = collectives.init(transport, check=False)
        comm.all_reduce(numpy.zeros(4))
        comm.all_reduce(numpy.zeros(4))  # the kind is known: the lane takes the next call
        try:
            comm.all_reduce(numpy.zeros(4 + comm.rank))
            said = "no error"
        except collectives.MismatchError as error:
            said = f"MismatchError: {error}"
        Path(sys.argv[2], f"{transport}-{comm.rank}.txt").write_text(said)
        comm.close()


@pytest.mark.parametrize("shape", [(2, 3), (40, 30)], ids=["in the description", "messages"])
def test_a_scatter_lane_reads_a_description_it_did_not_expect_as_the_general_path_does(shape):
    """Off the root a scatter takes the lane on its recvbuf's shape; when the root's blocks
    are another shape, the rank reads the root's description as the general path does: it
    raises that its recvbuf does not fit (having drained its block, when blocks follow as
    messages), and the communicator goes on."""
    blocks = numpy.arange(3.0 * math.prod(shape)).reshape(3, *shape)
    wrong = shape[::-1]

    def body(comm):
        root = 2
        comm.scatter(blocks if comm.rank == root else None, numpy.empty(shape), root=root)
        mine = numpy.empty(wrong if comm.rank == 1 else shape)  # as many bytes, but
        try:
            comm.scatter(blocks if comm.rank == root else None, mine, root=root)
            said = None
        except collectives.InvalidArgumentError as error:
            said = str(error)
        after = comm.scatter(blocks if comm.rank == root else None, numpy.empty(shape),
                             root=root)
        return said, after.tolist()

    for rank, (said, after) in enumerate(collectives.spawn(body, 3, one_shot_bytes=1 << 20)):
        assert said == (None if rank != 1 else f"recvbuf must have shape {shape} and dtype "
                        f"float64; got shape {wrong} and dtype float64"), said
        assert after == blocks[rank].tolist()
