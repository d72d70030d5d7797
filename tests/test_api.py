"""The public API: what a user gets back, and the errors that bad arguments raise."""

from __future__ import annotations

import subprocess
import sys

import numpy
import pytest

import collectives
from launch import ROOT, mpiexec, rank_env


def read_only(count):
    array = numpy.zeros(count)
    array.flags.writeable = False
    return array


def on_ranks(fn, size=3):
    return collectives.spawn(fn, size)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.all_reduce(numpy.zeros(4), numpy.zeros(5)),
     r"recvbuf must have shape \(4,\) and dtype float64; got shape \(5,\)"),
    (lambda c: c.all_reduce(numpy.zeros(4), numpy.zeros(4, numpy.float32)),
     r"recvbuf must have shape \(4,\) and dtype float64; got shape \(4,\) and dtype float32"),
    (lambda c: c.all_gather(numpy.zeros(2), numpy.zeros((2, 2))),
     r"recvbuf must have shape \(3, 2\)"),
    (lambda c: c.all_reduce(numpy.zeros(4), read_only(4)), "recvbuf is read-only"),
    (lambda c: c.broadcast(read_only(4)), "buf is read-only"),
    (lambda c: c.all_reduce(numpy.zeros(4), op="mean"), "unknown op 'mean'"),
    (lambda c: c.broadcast(numpy.zeros(4), root=3), r"root 3 is not a rank in \[0, 3\)"),
    (lambda c: c.broadcast(numpy.zeros(4), root=-1), r"root -1 is not a rank"),
    (lambda c: c.scatter(numpy.zeros((2, 4)) if c.rank == 0 else None, root=0),
     r"sendbuf must have shape \(3, ...\)"),
    (lambda c: c.reduce_scatter(numpy.zeros((4, 2))), r"sendbuf must have shape \(3, ...\)"),
])
def test_bad_arguments_raise_value_error_naming_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        on_ranks(call)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.all_reduce(numpy.arange(4), op="avg"), "'avg' needs a floating dtype"),
    (lambda c: c.all_reduce(numpy.ones(4, bool), op="sum"), "not defined on bool"),
    (lambda c: c.all_reduce([1.0, 2.0]), "expected a NumPy or CuPy array, got list"),
])
def test_bad_types_raise_type_error(call, message):
    with pytest.raises(TypeError, match=message):
        on_ranks(call)


def test_the_failing_rank_is_named():
    def fail_on_two(comm):
        if comm.rank == 2:
            raise KeyError("boom")
        comm.barrier()

    with pytest.raises(KeyError) as caught:
        on_ranks(fail_on_two)
    assert "raised on rank 2 of 3" in str(caught.value.__notes__)


def test_a_closed_communicator_says_so():
    def use_after_close(comm):
        comm.close()
        comm.all_reduce(numpy.zeros(2))

    with pytest.raises(ValueError, match="closed"):
        on_ranks(use_after_close, 2)


def test_results_keep_shape_and_layout_and_in_place_returns_the_same_array():
    def body(comm):
        x = numpy.arange(12.0).reshape(3, 4).T * (comm.rank + 1)  # transposed: not contiguous
        out = comm.all_reduce(x, x)
        return out is x, x.shape, x.copy()

    for same, shape, value in on_ranks(body):
        assert same and shape == (4, 3)
        numpy.testing.assert_array_equal(value, numpy.arange(12.0).reshape(3, 4).T * 6)


def test_avg_divides_once_by_the_number_of_ranks():
    results = on_ranks(lambda c: c.all_reduce(numpy.full(5, float(c.rank)), op="avg"), 4)
    for result in results:
        numpy.testing.assert_array_equal(result, numpy.full(5, 1.5))


def test_bool_min_max_are_all_and_any():
    def body(comm):
        flags = numpy.array([True, comm.rank == 0, False])
        return comm.all_reduce(flags, op="min"), comm.all_reduce(flags, op="max")

    for low, high in on_ranks(body):
        assert low.tolist() == [True, False, False] and high.tolist() == [True, True, False]


def test_context_manager_and_repr():
    def body(comm):
        with comm:
            text = repr(comm)
        return text, comm.transport, comm.rank, comm.size

    assert on_ranks(body, 2)[1] == ("<Communicator rank 1 of 2 over threads>", "threads", 1, 2)


def test_unknown_transport():
    with pytest.raises(ValueError, match="unknown transport 'carrier-pigeon'"):
        collectives.init("carrier-pigeon")


def test_one_process_without_mpiexec_is_a_communicator_of_one():
    code = ("import collectives, numpy as np\n"
            "with collectives.init() as c:\n"
            "    x = c.all_reduce(np.arange(3.0))\n"
            "    print(c.rank, c.size, x, c.all_gather(x).shape, c.scatter(np.ones((1, 2))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=rank_env(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "0 1 [0. 1. 2.] (1, 3) [1. 1.]"


def test_the_readme_one_liner_on_three_ranks():
    code = ("import collectives, numpy as np; c = collectives.init(); "
            "print(c.rank, c.all_reduce(np.arange(5.0) * (c.rank + 1)))")
    env = rank_env()
    del env["PYTHONUNBUFFERED"]  # each rank then writes its line whole, at exit
    lines = sorted(mpiexec(3, "-c", code, timeout=60, env=env).stdout.splitlines())
    assert lines == [f"{rank} [ 0.  6. 12. 18. 24.]" for rank in range(3)]


@pytest.mark.parametrize("option", [{"segment_bytes": 0}, {"timeout": 0}, {"one_shot_bytes": -1}])
def test_nonsense_options_are_refused_not_replaced_by_defaults(option):
    with pytest.raises(ValueError, match=f"{next(iter(option))} must be"):
        collectives.spawn(lambda comm: None, 2, **option)


@pytest.mark.parametrize("transport", ["mpi", "shm"])
def test_ranks_that_would_cut_messages_differently_are_refused_on_every_rank(transport):
    code = ("import collectives\nfrom mpi4py import MPI\n"
            "rank = MPI.COMM_WORLD.Get_rank()\n"
            "try:\n"
            f"    collectives.init({transport!r}, segment_bytes=4096 * (rank + 1))\n"
            "except collectives.InvalidArgumentError as error:\n"
            "    print('refused:', error)\n")
    out = mpiexec(2, "-c", code, timeout=60).stdout  # the two ranks' lines may interleave
    assert out.count("refused:") == 2, out
    assert out.count("segment_bytes and one_shot_bytes must be the same on every rank; got, by "
                     "rank: 0: 4096,") == 2, out


@pytest.mark.parametrize("setting, said", [
    ("os.environ['RINGCC_NODE_SIZE'] = '1'", "node_size (or $RINGCC_NODE_SIZE) must be the "
                                             "same on every rank; got, by rank: 0: None, 1: 1"),
    ("os.environ['RINGCC_SEGMENT_BYTES'] = '0'", "rank 1: segment_bytes must be positive, got 0"),
    ("os.environ['RINGCC_TIMEOUT'] = 'soon'", "rank 1: timeout (or $RINGCC_TIMEOUT) must be a "
                                              "number, got 'soon'"),
    ("transport = 'mpi'", "transport must be the same on every rank; got, by rank: 0: 'auto', "
                          "1: 'mpi'"),
], ids=["node size", "segment", "timeout", "transport"])
def test_a_setting_bad_or_different_on_one_rank_is_refused_on_every_rank(setting, said):
    """Before anything collective depends on them: a rank alone with another setting once
    left the others waiting, with no timeout, in a collective it never made."""
    code = "\n".join(["import os", "from mpi4py import MPI", "import collectives",
                      "transport = 'auto'", "if MPI.COMM_WORLD.Get_rank() == 1:",
                      f"    {setting}", "try:", "    collectives.init(transport)",
                      "except collectives.InvalidArgumentError as error:",
                      "    print('refused:', error)"])
    out = mpiexec(2, "-c", code, timeout=60).stdout  # the two ranks' lines may interleave
    assert out.count("refused:") == 2 and out.count(said) == 2, out


@pytest.mark.parametrize("setting, said", [
    (dict(segment_bytes=0), "segment_bytes must be positive, got 0"),
    (dict(one_shot_bytes=-1), "one_shot_bytes must be >= 0, got -1"),
    (dict(timeout=0), "timeout must be positive, got 0"),
    (dict(node_size=0), "node_size"),
], ids=["segment", "one shot", "timeout", "node size"])
def test_spawn_refuses_bad_settings_as_init_does(setting, said):
    """With InvalidArgumentError, a CollectiveError as every error of ringcc (a plain
    ValueError came out of spawn)."""
    with pytest.raises(collectives.InvalidArgumentError, match=said):
        collectives.spawn(lambda comm: None, 2, **setting)


def test_registered_memory_asked_for_differently_is_refused_on_every_rank():
    """A rank that asks for another size, or whose arguments are refused: every rank raises
    (on shm the allocation is MPI collectives without a timeout: the others waited for ever),
    and the communicator goes on."""
    def body(comm, bad):
        shape = (-1,) if bad == "shape" and comm.rank == 1 else 10 + (comm.rank == 1)
        try:
            comm.zeros(shape)
        except collectives.InvalidArgumentError as error:
            said = str(error)
        else:
            said = None
        return said, comm.all_reduce(numpy.ones(2)).tolist()

    for bad, others in (("size", "got, by rank: 80, 88, 80 bytes"),
                        ("shape", "got, by rank: 80, -1, 80 bytes (-1: its arguments were "
                                  "refused)")):
        for rank, (said, after) in enumerate(collectives.spawn(body, 3, bad)):
            assert said is not None and after == [3.0, 3.0], (bad, rank, said)
            if bad == "shape" and rank == 1:
                assert "shape (-1,) must be whole numbers >= 0" in said
            else:
                assert said.startswith("every rank must ask for registered memory of the same "
                                       "size") and others in said, said


def test_registered_memory_refused_on_one_shm_rank_is_refused_on_every_rank():
    code = ("import collectives\n"
            "comm = collectives.init('shm', timeout=20)\n"
            "try:\n"
            "    comm.empty(-1 if comm.rank == 1 else 4)\n"
            "except collectives.InvalidArgumentError as error:\n"
            "    print('refused', flush=True)\n"
            "comm.close()\n")
    out = mpiexec(2, "-c", code, timeout=60).stdout  # (before: rank 0 waited for ever)
    assert out.count("refused") == 2, out


def test_registered_memory_on_mpi_with_the_check_off_and_no_one_shot():
    """comm.empty agrees on its size in a 0-d array, which the mpi transport's plain exchange
    (no check to carry, no one-shot packet) could not view as bytes."""
    code = ("import collectives\n"
            "comm = collectives.init('mpi', check=False, one_shot_bytes=0, timeout=20)\n"
            "shape = comm.empty((2, 3), 'uint32').shape\n"
            "print(f'registered {shape}\\n', end='', flush=True)\n"
            "comm.close()\n")
    out = mpiexec(2, "-c", code, timeout=60).stdout
    assert out.count("registered (2, 3)") == 2, out


def test_empty_and_zeros_give_arrays_every_collective_takes():
    def body(comm):
        zeros = comm.zeros((2, 3), "int16")
        assert zeros.shape == (2, 3) and zeros.dtype == numpy.int16 and not zeros.any()
        mine = comm.empty(4)
        mine[...] = numpy.arange(4.0) + comm.rank
        return comm.all_reduce(mine, mine).tolist()

    assert collectives.spawn(body, 3) == [[3.0, 6.0, 9.0, 12.0]] * 3


@pytest.mark.parametrize("shape, dtype, error, message", [
    ((2, -1), "float32", collectives.InvalidArgumentError, "whole numbers >= 0"),
    (2.5, "float32", collectives.InvalidArgumentError, "whole numbers >= 0"),
    (3, "U4", collectives.InvalidTypeError, "not numeric"),
])
def test_empty_refuses_what_no_collective_could_move(shape, dtype, error, message):
    with pytest.raises(error, match=message):
        collectives.spawn(lambda comm: comm.empty(shape, dtype), 1)


def test_the_new_calls_in_one_process_without_mpiexec():
    code = ("import collectives, numpy as np\n"
            "with collectives.init() as c:\n"
            "    x = np.arange(3.0)\n"
            "    print(c.gather(x).shape, c.reduce(x, op='max').tolist(),\n"
            "          c.all_to_all(np.ones((1, 2))).shape, c.scan(x).tolist(),\n"
            "          c.scan(x, op='min', exclusive=True).tolist(), c.sendrecv(x, 0).tolist(),\n"
            "          c.all_gather(x, counts=[3]).shape)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=rank_env(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == ("(1, 3) [0.0, 1.0, 2.0] (1, 2) [0.0, 1.0, 2.0] [inf, inf, inf] "
                           "[0.0, 1.0, 2.0] (3,)")


def test_the_new_calls_on_three_ranks_as_a_user_writes_them():
    code = ("import collectives, numpy as np\n"
            "c = collectives.init(); r, n = c.rank, c.size\n"
            "x = np.arange(4.0) + 10 * r\n"
            "g = c.gather(x, root=0)\n"
            "m = c.reduce(x, op='max', root=n - 1)\n"
            "a = c.all_to_all(np.tile(x, (n, 1)))\n"
            "offset = c.scan(np.array([r + 1]), exclusive=True)\n"
            "u = c.all_gather(np.full(r + 1, r), counts=[k + 1 for k in range(n)])\n"
            "s = c.sendrecv(x, (r + 1) % n, src=(r - 1) % n)\n"
            "if r == 0: c.send(x, 1)\n"
            "if r == 1: c.recv(x, 0)\n"
            "print(r, None if g is None else g[:, 0].tolist(), None if m is None else m.tolist(),"
            " a[:, 0].tolist(), offset.tolist(), u.tolist(), s[0], x[0])\n")
    env = rank_env()
    del env["PYTHONUNBUFFERED"]  # each rank then writes its line whole, at exit
    lines = sorted(mpiexec(3, "-c", code, timeout=60, env=env).stdout.splitlines())
    assert lines == [
        "0 [0.0, 10.0, 20.0] None [0.0, 10.0, 20.0] [0] [0, 1, 1, 2, 2, 2] 20.0 0.0",
        "1 None None [0.0, 10.0, 20.0] [1] [0, 1, 1, 2, 2, 2] 0.0 0.0",
        "2 None [20.0, 21.0, 22.0, 23.0] [0.0, 10.0, 20.0] [3] [0, 1, 1, 2, 2, 2] 10.0 20.0"]
