"""Bad arguments: a clear error before anything is sent, and the communicator still works.

Runs on thread ranks (`collectives.spawn`). The error of each bad argument is pinned by a
table; a hypothesis test then feeds random arguments to every collective, decides from the
arguments alone whether the call is valid, and checks that a valid call gives NumPy's answer
and an invalid one raises the InvalidArgumentError or InvalidTypeError its arguments call for,
on a rank whose arguments are wrong, within the timeout.
"""

from __future__ import annotations

import re
import sys
import types

import numpy
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import cases
import collectives
from collectives import InvalidArgumentError, InvalidTypeError

TIMEOUT = 5  # seconds; a call that hangs fails with CollectiveTimeoutError instead


def read_only(shape, dtype="float64"):
    array = numpy.zeros(shape, dtype)
    array.flags.writeable = False
    return array


BAD = [
    # (call on every rank of 3, error class, message)
    (lambda c: c.all_reduce([1.0, 2.0]), TypeError, "expected a NumPy or CuPy array, got list"),
    (lambda c: c.all_reduce(None), TypeError, "expected a NumPy or CuPy array, got NoneType"),
    (lambda c: c.all_reduce(numpy.zeros(4), [0.0] * 4), TypeError, "got list"),
    (lambda c: c.all_reduce(numpy.zeros(4), numpy.zeros(5)), ValueError,
     r"recvbuf must have shape \(4,\) and dtype float64; got shape \(5,\)"),
    (lambda c: c.all_reduce(numpy.zeros(4), numpy.zeros(4, "float32")), ValueError,
     r"dtype float64; got shape \(4,\) and dtype float32"),
    (lambda c: c.all_reduce(numpy.zeros(4), read_only(4)), ValueError, "recvbuf is read-only"),
    (lambda c: c.all_reduce(numpy.zeros(4), op="mean"), ValueError, "unknown op 'mean'"),
    (lambda c: c.all_reduce(numpy.zeros(4), op=None), ValueError, "unknown op None"),
    (lambda c: c.all_reduce(numpy.arange(4), op="avg"), TypeError, "'avg' needs a floating"),
    (lambda c: c.all_reduce(numpy.ones(4, bool)), TypeError, "not defined on bool"),
    (lambda c: c.all_reduce(numpy.ones(4, "complex64"), op="max"), TypeError,
     "not defined on complex"),
    (lambda c: c.all_reduce(numpy.array(["a", "b"])), TypeError, "dtype <U1 is not numeric"),
    (lambda c: c.all_gather(numpy.array([None, 1])), TypeError, "dtype object is not numeric"),
    (lambda c: c.all_gather(numpy.zeros(2), numpy.zeros((2, 2))), ValueError,
     r"recvbuf must have shape \(3, 2\)"),
    (lambda c: c.all_gather(numpy.zeros(2, "int32"), numpy.zeros((3, 2))), ValueError,
     "and dtype int32"),
    (lambda c: c.broadcast(read_only(4)), ValueError, "buf is read-only"),
    (lambda c: c.broadcast(numpy.zeros(4), root=3), ValueError,
     r"root 3 is not a rank in \[0, 3\)"),
    (lambda c: c.broadcast(numpy.zeros(4), root=-1), ValueError, "root -1 is not a rank"),
    (lambda c: c.broadcast(numpy.zeros(4), root=True), ValueError, "root True is not a rank"),
    (lambda c: c.broadcast(numpy.zeros(4), root=1.0), ValueError, "root 1.0 is not a rank"),
    (lambda c: c.broadcast(numpy.zeros(4), root="0"), ValueError, "root '0' is not a rank"),
    (lambda c: c.scatter(numpy.zeros((3, 2)), root=5), ValueError, "root 5 is not a rank"),
    (lambda c: c.reduce_scatter(numpy.zeros((4, 2))), ValueError,
     r"sendbuf must have shape \(3, ...\)"),
    (lambda c: c.reduce_scatter(numpy.zeros(())), ValueError, r"one block per rank; got \(\)"),
    (lambda c: c.reduce_scatter(numpy.zeros((3, 2)), numpy.zeros(3)), ValueError,
     r"recvbuf must have shape \(2,\)"),
    (lambda c: c.reduce_scatter(numpy.zeros((3, 2)), op="median"), ValueError, "unknown op"),
    (lambda c: c.gather(numpy.zeros(2), root=3), ValueError, r"root 3 is not a rank in \[0, 3\)"),
    (lambda c: c.gather(["a"]), TypeError, "expected a NumPy or CuPy array, got list"),
    (lambda c: c.reduce(numpy.zeros(4), op="mean"), ValueError, "unknown op 'mean'"),
    (lambda c: c.reduce(numpy.arange(4), op="avg"), TypeError, "'avg' needs a floating"),
    (lambda c: c.reduce(numpy.zeros(4), root=-1), ValueError, "root -1 is not a rank"),
    (lambda c: c.all_to_all(numpy.zeros((4, 2))), ValueError,
     r"all_to_all: sendbuf must have shape \(3, ...\)"),
    (lambda c: c.all_to_all(numpy.zeros((3, 2)), numpy.zeros((3, 3))), ValueError,
     r"recvbuf must have shape \(3, 2\)"),
    (lambda c: c.scan(numpy.zeros(4), op="median"), ValueError, "unknown op"),
    (lambda c: c.scan(numpy.ones(4, bool), op="sum"), TypeError, "not defined on bool"),
    (lambda c: c.scan(numpy.zeros(4), numpy.zeros(4, "float32")), ValueError,
     "recvbuf must have shape"),
    (lambda c: c.all_gather(numpy.zeros(2), counts=[2, 2]), ValueError,
     r"counts must be 3 whole numbers >= 0, one per rank; got \[2, 2\]"),
    (lambda c: c.all_gather(numpy.zeros(2), counts=[2, -1, 2]), ValueError, "counts must be"),
    (lambda c: c.all_gather(numpy.zeros(2), counts=[2, 2.0, 2]), ValueError, "counts must be"),
    (lambda c: c.all_gather(numpy.zeros(2), counts=[True, 2, 2]), ValueError, "counts must be"),
    (lambda c: c.all_gather(numpy.zeros(2), counts="abc"), ValueError, "counts must be"),
    (lambda c: c.all_gather(numpy.zeros(3), counts=[2, 2, 2]), ValueError,
     "all_gather: by counts, sendbuf must hold 2 elements; got 3"),
    (lambda c: c.all_gather(numpy.zeros(2), numpy.zeros((3, 2)), counts=[2, 2, 2]), ValueError,
     r"recvbuf must have shape \(6,\)"),
    (lambda c: c.gather(numpy.zeros(1), counts=[2, 2, 2]), ValueError,
     "gather: by counts, sendbuf must hold"),
    (lambda c: c.reduce_scatter(numpy.zeros(5), counts=[2, 2, 2]), ValueError,
     "reduce_scatter: by counts, sendbuf must hold 6 elements; got 5"),
    (lambda c: c.all_to_all(numpy.zeros(5), counts=[[1, 1, 1]] * 3), ValueError,
     "all_to_all: by counts, sendbuf must hold 3 elements; got 5"),
    (lambda c: c.all_to_all(numpy.zeros(3), counts=[[1, 1, 1], [1, 1], [1, 1, 1]]), ValueError,
     r"counts must be 3 whole numbers >= 0, one per rank; got \[1, 1\]"),
    (lambda c: c.scatter(numpy.zeros(6), counts=[1, 2]), ValueError, "counts must be 3"),
    (lambda c: c.send(numpy.zeros(2), 3), ValueError, r"dst 3 is not a rank in \[0, 3\)"),
    (lambda c: c.send(numpy.zeros(2), 1.0), ValueError, "dst 1.0 is not a rank"),
    (lambda c: c.recv(numpy.zeros(2), -1), ValueError, "src -1 is not a rank"),
    (lambda c: c.recv(read_only(2), 0), ValueError, "buf is read-only"),
    (lambda c: c.send([1.0], 0), TypeError, "expected a NumPy or CuPy array, got list"),
    (lambda c: c.send(numpy.zeros(2), c.rank), ValueError,
     "cannot send to or receive from itself, but by a sendrecv"),
    (lambda c: c.sendrecv(numpy.zeros(2), c.rank, numpy.zeros(3)), ValueError,
     "cannot send to or receive from itself"),
    (lambda c: c.sendrecv(numpy.zeros(2), (c.rank + 1) % 3, read_only(2)), ValueError,
     "recvbuf is read-only"),
]


@pytest.mark.parametrize("call, kind, message", BAD)
def test_a_bad_argument_raises_before_anything_is_sent(call, kind, message):
    """Every rank makes the same bad call: each raises at once, having sent nothing, and the
    communicator then works as before."""
    def body(comm):
        with pytest.raises(kind, match=message):
            call(comm)
        sent = comm.stats.bytes_sent
        total = comm.all_reduce(numpy.arange(5.0) * (comm.rank + 1))
        return sent, total

    for sent, total in collectives.spawn(body, 3, timeout=TIMEOUT):
        assert sent == 0
        numpy.testing.assert_array_equal(total, numpy.arange(5.0) * 6)


ROOT_ONLY = [
    # Only the root looks at sendbuf, so only the root can see what is wrong with it.
    (lambda c: c.scatter(None, numpy.zeros(2), root=0), r"the root \(rank 0\) must pass sendbuf"),
    (lambda c: c.scatter(numpy.zeros((2, 4)) if c.rank == 0 else None, root=0),
     r"sendbuf must have shape \(3, ...\)"),
    (lambda c: c.scatter(numpy.zeros(()) if c.rank == 0 else None, root=0),
     r"sendbuf must have shape \(3, ...\)"),
    (lambda c: c.scatter(numpy.zeros((3, 2)), numpy.zeros(3), root=0),
     r"recvbuf must have shape \(2,\)"),
    (lambda c: c.scatter(numpy.zeros(5), counts=[1, 2, 3]),
     "scatter: by counts, sendbuf must hold 6 elements; got 5"),
    (lambda c: c.gather(numpy.zeros(2), numpy.zeros((3, 3))), r"recvbuf must have shape \(3, 2\)"),
    (lambda c: c.reduce(numpy.zeros(2), numpy.zeros(2, "int8")), "and dtype float64"),
]


@pytest.mark.parametrize("call, message", ROOT_ONLY)
def test_a_bad_argument_only_the_root_sees_raises_there_before_it_sends(call, message):
    """The root raises at once; the others, already waiting for it, are released."""
    with pytest.raises(ValueError, match=message) as caught:
        collectives.spawn(call, 3, timeout=TIMEOUT)
    assert "raised on rank 0 of 3" in str(caught.value.__notes__)


@pytest.mark.parametrize("call", [
    lambda c, counts: c.all_gather(numpy.zeros(counts[c.rank]), counts=counts),
    lambda c, counts: c.gather(numpy.zeros(counts[c.rank]), counts=counts, root=1),
    lambda c, counts: c.scatter(numpy.zeros(sum(counts)) if c.rank == 0 else None,
                                counts=counts),
    lambda c, counts: c.reduce_scatter(numpy.zeros(sum(counts)), counts=counts),
    lambda c, counts: c.all_to_all(numpy.zeros(sum(counts)), counts=counts),
])
def test_counts_that_differ_between_ranks_raise_mismatch_on_every_rank(call):
    """Rank 1 cuts the same total otherwise: every rank raises before any block moves, naming
    the counts, and the communicator then works as before."""
    def body(comm):
        counts = [3, 1, 2] if comm.rank == 1 else [1, 3, 2]
        with pytest.raises(collectives.MismatchError) as caught:
            call(comm, counts)
        return str(caught.value), comm.stats.bytes_sent, comm.all_gather(numpy.arange(2))

    for rank, (message, sent, gathered) in enumerate(collectives.spawn(body, 3,
                                                                       timeout=TIMEOUT)):
        assert message.startswith(f"rank {rank}: ranks disagree: rank 1 called ")
        assert message.endswith("; the counts differ"), message
        assert sent == 0
        numpy.testing.assert_array_equal(gathered, [[0, 1]] * 3)


@pytest.mark.parametrize("call", [
    lambda c, x: c.broadcast(x, root=1),
    lambda c, x: c.gather(x, root=0),
    lambda c, x: c.reduce(x, root=1),
    lambda c, x: c.reduce_scatter(x.reshape(2, -1)),
    lambda c, x: c.all_to_all(x.reshape(2, -1)),
])
def test_a_rank_in_one_exchange_and_one_in_steps_raise_mismatch_on_both(call):
    """Counts that differ so that one rank's call fits one exchange and the other's takes
    the step-by-step algorithm: both raise, naming the calls, and both go on."""
    def body(comm):
        mine = numpy.ones(10 if comm.rank == 0 else 1000)  # 80 B and 8000 B: 1 KiB is the line
        with pytest.raises(collectives.MismatchError, match="ranks disagree: rank 1 called "):
            call(comm, mine)
        return comm.all_reduce(numpy.ones(3))

    for total in collectives.spawn(body, 2, timeout=TIMEOUT, one_shot_bytes=1024):
        numpy.testing.assert_array_equal(total, [2, 2, 2])


def test_counts_on_some_ranks_only_raise_mismatch_on_every_rank():
    def body(comm):
        mine = numpy.arange(2.0)
        with pytest.raises(collectives.MismatchError, match="the counts and the count differ"):
            comm.all_gather(mine, counts=[2, 2] if comm.rank == 0 else None)

    collectives.spawn(body, 2, timeout=TIMEOUT)


def test_errors_raised_by_the_communicator_are_collective_errors():
    def body(comm):
        errors = []
        for call in (lambda: comm.all_reduce([1.0]),
                     lambda: comm.all_reduce(numpy.zeros(4), numpy.zeros(5)),
                     lambda: comm.broadcast(numpy.zeros(2), root=7)):
            try:
                call()
            except collectives.CollectiveError as error:
                errors.append(error)
        return errors

    invalid_type, invalid_argument, bad_root = collectives.spawn(body, 2)[0]
    assert isinstance(invalid_type, TypeError) and isinstance(invalid_argument, ValueError)
    assert isinstance(bad_root, ValueError)


def test_a_bad_argument_on_one_rank_is_raised_there_and_releases_the_others():
    """Rank 1's recvbuf is wrong; the others are already waiting for it at the check."""
    def body(comm):
        recvbuf = numpy.zeros(5 if comm.rank == 1 else 4)
        comm.all_reduce(numpy.zeros(4), recvbuf)

    with pytest.raises(ValueError, match=r"recvbuf must have shape \(4,\)") as caught:
        collectives.spawn(body, 3, timeout=TIMEOUT)
    assert "raised on rank 1 of 3" in str(caught.value.__notes__)


def test_mixed_numpy_and_cupy_buffers(monkeypatch):
    """Without a GPU, a stand-in type from a module named cupy is enough to take the path."""
    fake = types.ModuleType("cupy")
    fake.ndarray = type("ndarray", (), {"__module__": "cupy._core.core", "dtype":
                                        numpy.dtype("float64"), "shape": (4,)})
    monkeypatch.setitem(sys.modules, "cupy", fake)

    def mixed(comm):
        comm.all_reduce(numpy.zeros(4), fake.ndarray())

    with pytest.raises(TypeError, match="buffers mix NumPy and CuPy arrays"):
        collectives.spawn(mixed, 2, timeout=TIMEOUT)
    with pytest.raises(TypeError, match="the threads transport moves numpy arrays, got a cupy"):
        collectives.spawn(lambda comm: comm.broadcast(fake.ndarray()), 2, timeout=TIMEOUT)


@pytest.mark.parametrize("op", ["sum", "prod", "avg", "min", "max"])
def test_nan_propagates_as_in_numpy(op):
    """A NaN on one rank makes that element NaN under every op, as NumPy's reductions do
    (min and max are numpy.minimum and numpy.maximum, which propagate NaN)."""
    def data(rank):
        x = cases.values(rank, 7, "float64")
        x[rank] = numpy.nan  # rank r poisons element r
        return x

    def body(comm):
        return comm.all_reduce(data(comm.rank), op=op), \
            comm.reduce_scatter(numpy.tile(data(comm.rank), (comm.size, 1)), op=op)

    want = cases.reduce_reference(op, [data(r) for r in range(3)])
    for total, block in collectives.spawn(body, 3, timeout=TIMEOUT):
        numpy.testing.assert_allclose(total, want, rtol=1e-14)
        numpy.testing.assert_allclose(block, want, rtol=1e-14)
        assert numpy.isnan(total[:3]).all() and not numpy.isnan(total[3:]).any()


# ---- random arguments ---------------------------------------------------------------------

DTYPES = ("float64", "int32", "bool", "complex64", "<U3", "object", "datetime64[s]")
SHAPES = ("scalar", "empty", "vector", "matrix", "blocks", "too many blocks")
RECVBUFS = ("none", "right", "same", "wrong shape", "wrong dtype", "read-only", "strided",
            "list")
OPS = ("sum", "prod", "min", "max", "avg", "mean", "", None, 3)
ROOTS = (0, 1, -1, "size", True, 1.0, "0", numpy.int64(1))


def shape_of(name, size):
    return {"scalar": (), "empty": (0,), "vector": (3,), "matrix": (2, 3),
            "blocks": (size, 2), "too many blocks": (size + 1, 2)}[name]


def buffer(rank, shape, dtype):
    count = int(numpy.prod(shape))
    if numpy.dtype(dtype).kind in "biufc":
        return cases.values(rank, count, dtype).reshape(shape)
    return numpy.zeros(shape, dtype)  # strings, objects, dates: refused before anything moves


def recvbuf_for(kind, sendbuf, want_shape):
    if kind == "none":
        return None
    if kind == "same":
        return sendbuf
    if kind == "list":
        return [0] * 3
    shape, dtype = want_shape, sendbuf.dtype
    if kind == "wrong shape":
        shape = (*shape, 2)
    if kind == "wrong dtype":
        dtype = numpy.dtype("float32") if dtype != numpy.float32 else numpy.dtype("float64")
    if kind == "read-only":
        return read_only(shape, dtype)
    if kind == "strided":
        return numpy.zeros((*shape, 2), dtype)[..., 0]
    return numpy.zeros(shape, dtype)


IN_PLACE = ("all_reduce", "reduce", "all_to_all", "scan")  # recvbuf may be sendbuf
ROOT_RESULT = ("gather", "reduce")  # only the root looks at recvbuf, and gets a result


def make_call(comm, collective, dtype, shape_name, recv, op, root):
    """Make one call with arguments from the example; rank-dependent data, the same kind of
    argument on every rank."""
    size = comm.size
    root = size if root == "size" else root
    shape = shape_of(shape_name, size)
    send = buffer(comm.rank, shape, dtype)
    block = shape[1:]
    if collective == "all_reduce":
        return comm.all_reduce(send, recvbuf_for(recv, send, shape), op=op)
    if collective == "all_gather":
        return comm.all_gather(send, recvbuf_for(recv, send, (size, *shape)))
    if collective == "gather":
        return comm.gather(send, recvbuf_for(recv, send, (size, *shape)), root=root)
    if collective == "reduce":
        return comm.reduce(send, recvbuf_for(recv, send, shape), op=op, root=root)
    if collective == "broadcast":
        return comm.broadcast(send, root=root)
    if collective == "scatter":
        mine = send if comm.rank == root else None
        return comm.scatter(mine, recvbuf_for(recv, send, block), root=root)
    if collective == "all_to_all":
        return comm.all_to_all(send, recvbuf_for(recv, send, shape))
    if collective == "scan":
        return comm.scan(send, recvbuf_for(recv, send, shape), op=op)
    return comm.reduce_scatter(send, recvbuf_for(recv, send, block), op=op)


def reference(collective, dtype, shape_name, op, root, size, rank):
    """What `rank` must end with when the call works (None: no result on this rank)."""
    root = size if root == "size" else root
    shape = shape_of(shape_name, size)
    inputs = [buffer(r, shape, dtype) for r in range(size)]
    if collective in ROOT_RESULT and rank != root:
        return None
    if collective == "all_reduce" or collective == "reduce":
        return cases.reduce_reference(op, inputs)
    if collective in ("all_gather", "gather"):
        return numpy.stack(inputs)
    if collective == "broadcast":
        return inputs[root]
    if collective == "scatter":
        return inputs[root][rank]
    if collective == "all_to_all":
        return numpy.stack([inputs[i][rank] for i in range(size)])
    if collective == "scan":
        return cases.reduce_reference(op, inputs[:rank + 1])
    return cases.reduce_reference(op, inputs)[rank]


def recvbuf_errors(recv, numeric, collective):
    """The errors a recvbuf of kind `recv` calls for; it has sendbuf's dtype unless it is the
    wrong one (float32 or float64)."""
    if recv == "list":
        return {InvalidTypeError}
    errors = set()
    if recv not in ("none", "wrong dtype") and not numeric:
        errors.add(InvalidTypeError)
    if recv in ("wrong shape", "wrong dtype", "read-only") or \
            (recv == "same" and collective not in IN_PLACE):
        errors.add(InvalidArgumentError)
    return errors


def errors_for(rank, collective, dtype, shape_name, recv, op, root, size):
    """The errors that `rank`'s own arguments call for, decided from the arguments alone: none
    when they are all good, else one for each thing wrong (a rank raises the first it finds)."""
    root = size if root == "size" else root
    shape = shape_of(shape_name, size)
    numeric = numpy.dtype(dtype).kind in "biufc"
    passes_sendbuf = collective != "scatter" or rank == root  # as make_call does
    root_ok = type(root) in (int, numpy.int64) and 0 <= root < size  # not True, 1.0, "0"
    errors = set()
    if collective in ("all_reduce", "reduce_scatter", "reduce", "scan"):
        if op not in collectives.OPS:
            errors.add(InvalidArgumentError)
        elif numeric and op not in cases.ops_for(dtype):  # bool sum, integer avg, complex max
            errors.add(InvalidTypeError)
    if collective in ("broadcast", "scatter", *ROOT_RESULT) and not root_ok:
        errors.add(InvalidArgumentError)
    if passes_sendbuf and not numeric:
        errors.add(InvalidTypeError)
    if collective in ("reduce_scatter", "all_to_all") or \
            (collective == "scatter" and passes_sendbuf):
        if not shape or shape[0] != size:  # one block per rank
            errors.add(InvalidArgumentError)
    if collective != "broadcast" and (collective not in ROOT_RESULT or rank == root):
        errors |= recvbuf_errors(recv, numeric, collective)
    return tuple(sorted(errors, key=lambda error: error.__name__))


@settings(max_examples=250, deadline=None)
@given(collective=st.sampled_from(["all_reduce", "all_gather", "broadcast", "scatter",
                                   "reduce_scatter", "gather", "reduce", "all_to_all", "scan"]),
       size=st.integers(1, 4), dtype=st.sampled_from(DTYPES), shape=st.sampled_from(SHAPES),
       recv=st.sampled_from(RECVBUFS), op=st.sampled_from(OPS), root=st.sampled_from(ROOTS))
def test_random_arguments_work_or_raise_the_error_they_call_for(collective, size, dtype, shape,
                                                                recv, op, root):
    """A valid call gives NumPy's answer; an invalid one raises, on a rank whose own arguments
    are wrong, an error that they call for."""
    arguments = (collective, dtype, shape, recv, op, root)
    expected = [errors_for(rank, *arguments, size) for rank in range(size)]
    if not any(expected):
        event("valid")
        results = collectives.spawn(make_call, size, *arguments, timeout=TIMEOUT)
        for rank, result in enumerate(results):
            want = reference(collective, dtype, shape, op, root, size, rank)
            if want is None:
                assert result is None, f"rank {rank} is not the root but got a result"
            else:
                cases.assert_matches(numpy.asarray(result), numpy.asarray(want),
                                     numpy.dtype(dtype).name)
        return
    with pytest.raises(collectives.CollectiveError) as caught:
        collectives.spawn(make_call, size, *arguments, timeout=TIMEOUT)
    error = caught.value
    event(f"raised {type(error).__name__}")
    rank = int(re.search(r"raised on rank (\d+) of", " ".join(error.__notes__)).group(1))
    called_for = " or ".join(kind.__name__ for kind in expected[rank]) or "no error"
    assert isinstance(error, expected[rank]), \
        f"rank {rank} raised {type(error).__name__}: {error}; its arguments call for {called_for}"
