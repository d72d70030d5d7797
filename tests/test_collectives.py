"""Property tests: every collective, on thread ranks and on real MPI ranks, against NumPy.

Rank counts 1..6, element counts from 0 through counts below the rank count and primes to
1e5, every dtype and op, every root, in place and not, contiguous or not, one segment or
many, ring or one-shot, with the call check or without; data depends on rank and index.
All-reduce results must be bitwise equal on all ranks, and the barrier must keep every rank in
until the last one has come.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import cases
from pool import MAX_RANKS, VARIANTS

examples = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

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


@pytest.mark.parametrize("size", range(1, MAX_RANKS + 1))
def test_barrier_keeps_every_rank_in_until_the_last_has_come(run, size, tmp_path):
    """Without the call check, itself a barrier: the transport's barrier must hold alone."""
    results = run("marked_barrier_case", size, "unchecked", folder=str(tmp_path), hold=0.2)
    marks = [f"mark-{rank}" for rank in range(size)]
    for rank, result in enumerate(results):
        assert result["result"] == marks, f"rank {rank} passed the barrier too early"
