"""Property tests: every collective, on thread ranks and on real MPI ranks, against NumPy.

Rank counts 1..6, element counts from 0 through counts below the rank count and primes to
1e5, every dtype and op, every root, in place and not, contiguous or not, one segment or
many, ring or one-shot, with the call check or without, equal blocks or uneven ones
(`counts=`); data depends on rank and index. All-reduce results must be bitwise equal on all
ranks, and the barrier must keep every rank in until the last one has come. Point-to-point
calls run as a ring shift (`sendrecv`) and a chain of `send`s and `recv`s.
"""

from __future__ import annotations

import numpy
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import cases
import collectives
from pool import MAX_RANKS, VARIANTS

examples = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
fewer = settings(examples, max_examples=40)  # the collectives added later: a shorter suite

sizes = st.integers(1, MAX_RANKS)
counts = st.one_of(st.integers(0, 12), st.sampled_from([13, 31, 97, 1009, 7919]),
                   st.integers(0, 100_000))
variants = st.sampled_from(sorted(VARIANTS))
dtypes = st.sampled_from(cases.DTYPES)
layouts = st.sampled_from(cases.LAYOUTS)


@st.composite
def dtype_and_op(draw: st.DrawFn) -> tuple[str, str]:
    dtype = draw(dtypes)
    return dtype, draw(st.sampled_from(cases.ops_for(dtype)))


@st.composite
def size_and_root(draw: st.DrawFn) -> tuple[int, int]:
    size = draw(sizes)
    return size, draw(st.integers(0, size - 1))


@examples
@given(size=sizes, count=counts, dtype_op=dtype_and_op(), layout=layouts,
       in_place=st.booleans(), variant=variants)
@example(size=6, count=0, dtype_op=("float32", "sum"), layout="flat", in_place=False,
         variant="auto")
@example(size=5, count=3, dtype_op=("int64", "prod"), layout="flat", in_place=True,
         variant="auto")
@example(size=3, count=7919, dtype_op=("float64", "avg"), layout="strided", in_place=False,
         variant="ring")
def test_all_reduce(run, size, count, dtype_op, layout, in_place, variant):
    dtype, op = dtype_op
    results = run("all_reduce_case", size, variant, count=count, dtype=dtype, op=op,
                  layout=layout, in_place=in_place)
    cases.check_all_reduce(results, count, dtype, op, layout)


@fewer
@given(size=sizes, count=counts, dtype_op=dtype_and_op(), layout=layouts,
       in_place=st.booleans())
@example(size=4, count=4 * 4099, dtype_op=("float64", "avg"), layout="flat", in_place=True)
@example(size=5, count=1009, dtype_op=("int32", "max"), layout="strided", in_place=False)
def test_all_reduce_by_its_reduce_scatter_and_all_gather_exchanges(run, size, count, dtype_op,
                                                                   layout, in_place):
    """algorithm="reduce_scatter_all_gather" (all_reduce.py) on every transport: NumPy's
    result, bitwise the same on every rank, in the ring's bytes: 2(N-1) chunks of S/N sent and
    received by each rank, 2(N-1) S over all ranks (uneven chunks too, gathered by the
    ring's pass)."""
    dtype, op = dtype_op
    results = run("all_reduce_case", size, "auto", count=count, dtype=dtype, op=op,
                  layout=layout, in_place=in_place, algorithm="reduce_scatter_all_gather")
    cases.check_all_reduce(results, count, dtype, op, layout)
    moved = 2 * (size - 1) * count * numpy.dtype(dtype).itemsize
    assert sum(r["stats"]["bytes_sent"] for r in results) == moved, results[0]["stats"]
    assert sum(r["stats"]["bytes_received"] for r in results) == moved, results[0]["stats"]


@examples
@given(size=sizes, count=counts, dtype=dtypes, layout=layouts, given_out=st.booleans(),
       variant=variants)
@example(size=4, count=0, dtype="int8", layout="flat", given_out=True, variant="auto")
def test_all_gather(run, size, count, dtype, layout, given_out, variant):
    results = run("all_gather_case", size, variant, count=count, dtype=dtype, layout=layout,
                  given=given_out)
    cases.check_all_gather(results, count, dtype, layout)


@examples
@given(size_root=size_and_root(), count=counts, dtype=dtypes, layout=layouts,
       variant=variants)
@example(size_root=(6, 5), count=1, dtype="uint16", layout="flat", variant="auto")
def test_broadcast(run, size_root, count, dtype, layout, variant):
    size, root = size_root
    results = run("broadcast_case", size, variant, count=count, dtype=dtype, layout=layout,
                  root=root)
    cases.check_broadcast(results, count, dtype, layout, root)


@examples
@given(size_root=size_and_root(), count=counts, dtype=dtypes, given_out=st.booleans(),
       variant=variants)
@example(size_root=(5, 3), count=0, dtype="float16", given_out=False, variant="auto")
def test_scatter(run, size_root, count, dtype, given_out, variant):
    size, root = size_root
    results = run("scatter_case", size, variant, count=count, dtype=dtype, root=root,
                  given=given_out)
    cases.check_scatter(results, count, dtype, root)


@examples
@given(size=sizes, count=st.integers(0, 20_000), dtype_op=dtype_and_op(), variant=variants)
@example(size=6, count=0, dtype_op=("uint8", "max"), variant="auto")
def test_reduce_scatter(run, size, count, dtype_op, variant):
    dtype, op = dtype_op
    results = run("reduce_scatter_case", size, variant, count=count, dtype=dtype, op=op)
    cases.check_reduce_scatter(results, count, dtype, op)


@fewer
@given(size_root=size_and_root(), count=counts, dtype=dtypes, layout=layouts,
       recv=st.sampled_from(["none", "given", "in place", "another block"]), variant=variants)
@example(size_root=(5, 2), count=13, dtype="complex64", layout="strided", recv="in place",
         variant="auto")
@example(size_root=(2, 0), count=5, dtype="int32", layout="flat", recv="another block",
         variant="auto")
@example(size_root=(1, 0), count=0, dtype="bool", layout="flat", recv="given", variant="auto")
def test_gather(run, size_root, count, dtype, layout, recv, variant):
    size, root = size_root
    results = run("gather_case", size, variant, count=count, dtype=dtype, layout=layout,
                  root=root, recv=recv)
    cases.check_gather(results, count, dtype, layout, root)


@fewer
@given(size_root=size_and_root(), count=counts, dtype_op=dtype_and_op(), layout=layouts,
       in_place=st.booleans(), variant=variants)
@example(size_root=(5, 4), count=1009, dtype_op=("float64", "avg"), layout="strided",
         in_place=True, variant="ring")
@example(size_root=(3, 1), count=2, dtype_op=("uint8", "prod"), layout="flat",
         in_place=False, variant="auto")
def test_reduce(run, size_root, count, dtype_op, layout, in_place, variant):
    size, root = size_root
    dtype, op = dtype_op
    results = run("reduce_case", size, variant, count=count, dtype=dtype, op=op, layout=layout,
                  root=root, in_place=in_place)
    cases.check_reduce(results, count, dtype, op, layout, root)


@fewer
@given(size=sizes, count=st.integers(0, 20_000), dtype=dtypes, layout=layouts,
       in_place=st.booleans(), variant=variants)
@example(size=5, count=7, dtype="int16", layout="strided", in_place=True, variant="ring")
def test_all_to_all(run, size, count, dtype, layout, in_place, variant):
    results = run("all_to_all_case", size, variant, count=count, dtype=dtype, layout=layout,
                  in_place=in_place)
    cases.check_all_to_all(results, count, dtype)


@fewer
@given(size=sizes, count=counts, dtype_op=dtype_and_op(), layout=layouts,
       in_place=st.booleans(), exclusive=st.booleans(), variant=variants)
@example(size=5, count=97, dtype_op=("int32", "min"), layout="flat", in_place=False,
         exclusive=True, variant="ring")
@example(size=3, count=31, dtype_op=("float32", "avg"), layout="strided", in_place=True,
         exclusive=False, variant="unchecked")
def test_scan(run, size, count, dtype_op, layout, in_place, exclusive, variant):
    dtype, op = dtype_op
    results = run("scan_case", size, variant, count=count, dtype=dtype, op=op, layout=layout,
                  in_place=in_place, exclusive=exclusive)
    cases.check_scan(results, count, dtype, op, layout, exclusive)


@st.composite
def uneven_blocks(draw: st.DrawFn) -> tuple[int, int, str, list]:
    """(size, root, collective, counts): uneven blocks, some empty, some of many segments; for
    all-to-all a matrix or the numbers that stand for every row."""
    size, root = draw(size_and_root())
    collective = draw(st.sampled_from(["all_gather", "gather", "scatter", "reduce_scatter",
                                       "all_to_all"]))
    block = st.one_of(st.integers(0, 5), st.integers(0, 3000))
    if collective == "all_to_all" and draw(st.booleans()):
        return size, root, collective, [[draw(block) for _ in range(size)] for _ in range(size)]
    return size, root, collective, [draw(block) for _ in range(size)]


@fewer
@given(uneven=uneven_blocks(), dtype_op=dtype_and_op(), variant=variants)
@example(uneven=(5, 3, "reduce_scatter", [0, 2000, 1, 0, 7]), dtype_op=("float64", "sum"),
         variant="ring")
@example(uneven=(3, 0, "all_to_all", [[0, 3000, 1], [2, 0, 0], [5, 4, 3]]),
         dtype_op=("int8", "max"), variant="ring")
def test_uneven_blocks(run, uneven, dtype_op, variant):
    size, root, collective, counts = uneven
    dtype, op = dtype_op
    results = run("uneven_case", size, variant, collective=collective, counts=counts,
                  dtype=dtype, op=op, root=root)
    cases.check_uneven(results, collective, counts, dtype, op, root)


@st.composite
def size_and_shift(draw: st.DrawFn) -> tuple[int, int]:
    size = draw(sizes)
    return size, draw(st.integers(0, size - 1))


@fewer
@given(size_shift=size_and_shift(), count=counts, dtype=dtypes, layout=layouts,
       variant=variants)
@example(size_shift=(5, 2), count=7919, dtype="float16", layout="strided", variant="ring")
def test_sendrecv(run, size_shift, count, dtype, layout, variant):
    size, shift = size_shift
    results = run("sendrecv_case", size, variant, count=count, dtype=dtype, layout=layout,
                  shift=shift)
    cases.check_sendrecv(results, count, dtype, layout, shift)


@fewer
@given(size=sizes, count=counts, dtype=dtypes, variant=variants)
@example(size=5, count=1009, dtype="uint64", variant="unchecked")
def test_send_and_recv_in_a_chain(run, size, count, dtype, variant):
    results = run("chain_case", size, variant, count=count, dtype=dtype)
    cases.check_chain(results, count, dtype)


@pytest.mark.parametrize("variant", ["unchecked", "auto"])
@pytest.mark.parametrize("size", range(1, MAX_RANKS + 1))
def test_barrier_keeps_every_rank_in_until_the_last_has_come(run, size, variant, tmp_path):
    """Without the call check, itself a barrier: the transport's barrier must hold alone.
    With it, the check's exchange is the barrier, made by the lane (small.py)."""
    results = run("marked_barrier_case", size, variant, folder=str(tmp_path), hold=0.2)
    marks = [f"mark-{rank}" for rank in range(size)]
    for rank, result in enumerate(results):
        assert result["result"] == marks, f"rank {rank} passed the barrier too early"


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_one_shot_all_reduce_in_pieces_is_bitwise_one_exchange(op):
    """One-shot all-reduces larger than `one_shot_bytes` go a piece at a time (every
    all-reduce does on ranks that share one GPU): bitwise what one exchange gives, on every
    rank, moving the same bytes."""
    def body(comm, size_of_piece):
        mine = numpy.random.default_rng(comm.rank).standard_normal(5003).astype(numpy.float32)
        result = comm.all_reduce(mine, op=op, algorithm="one_shot")
        return result, comm.stats.bytes_sent, comm.stats.messages

    whole = collectives.spawn(body, 3, 1 << 20, one_shot_bytes=1 << 20)
    pieces = collectives.spawn(body, 3, 4096, one_shot_bytes=4096)
    for (one, sent, messages), (many, sent_in_pieces, messages_in_pieces) in zip(whole, pieces):
        assert one.tobytes() == many.tobytes() == whole[0][0].tobytes()
        assert sent == sent_in_pieces == 2 * 5003 * 4
        assert (messages, messages_in_pieces) == (2, 2 * 5)  # 5003 floats: 5 pieces of 1024
