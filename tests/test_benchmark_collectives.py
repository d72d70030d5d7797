"""The benchmarks of gather, reduce, all-to-all, scan, sendrecv and send (a ping-pong): their
bus-bandwidth factors, the memory bound's work, a peer that lacks a collective, and real runs
checked against NumPy."""

from __future__ import annotations

import json
import types

import numpy
import pytest

from benchmarks import options, peers
from benchmarks.all_to_all import ALL_TO_ALL
from benchmarks.gather import GATHER
from benchmarks.reduce import REDUCE
from benchmarks.scan import SCAN
from benchmarks.send import SEND
from benchmarks.sendrecv import SENDRECV
from launch import mpiexec
from test_benchmarks import check_every_dtype_and_op, torch_here

COLLECTIVES = [GATHER, REDUCE, ALL_TO_ALL, SCAN, SENDRECV, SEND]


@pytest.mark.parametrize("collective, factor", [
    (GATHER, lambda n: (n - 1) / n), (ALL_TO_ALL, lambda n: (n - 1) / n),
    (REDUCE, lambda n: 1.0), (SENDRECV, lambda n: 1.0), (SCAN, lambda n: 1.0),
    (SEND, lambda n: 1.0)])
def test_bus_bandwidth_factors_are_nccl_tests_ones(collective, factor):
    """nccl-tests: alltoall and gather (n-1)/n, reduce and sendrecv 1; scan and a ping-pong
    have none."""
    for ranks in (1, 2, 3, 4, 8):
        assert collective.bus_factor(ranks) == pytest.approx(factor(ranks))


def test_counts_are_whole_blocks_per_rank():
    assert options.counts(GATHER, [8, 64], 4, 3) == [3, 15]
    assert options.counts(ALL_TO_ALL, [8], 1, 4) == [8]
    for collective in COLLECTIVES:
        for count in options.counts(collective, [8, 1000], 4, 3):
            send, recv = collective.shapes(count, 3)
            assert numpy.prod(recv if collective is GATHER else send) == count


def test_the_references_say_which_ranks_get_a_result():
    def data(rank):
        return numpy.arange(4.0) + 10 * rank

    assert GATHER.expected(data, 1, 3, "none", 0) is None
    assert GATHER.expected(data, 0, 3, "none", 0).shape == (3, 4)
    assert REDUCE.expected(data, 2, 3, "sum", 1) is None
    numpy.testing.assert_array_equal(REDUCE.expected(data, 1, 3, "max", 1), data(2))
    numpy.testing.assert_array_equal(SCAN.expected(data, 1, 3, "sum", -1), data(0) + data(1))
    numpy.testing.assert_array_equal(SENDRECV.expected(data, 0, 3, "none", -1), data(2))
    numpy.testing.assert_array_equal(SEND.expected(data, 0, 3, "none", -1), data(1))
    numpy.testing.assert_array_equal(SEND.expected(data, 1, 3, "none", -1), data(0))
    assert SEND.expected(data, 2, 3, "none", -1) is None  # (only ranks 0 and 1 play)
    assert SEND.expected(data, 0, 1, "none", -1) is None
    blocks = ALL_TO_ALL.expected(lambda r: data(r).reshape(2, 2), 1, 2, "none", -1)
    numpy.testing.assert_array_equal(blocks, [[2, 3], [12, 13]])


def test_the_memory_peer_does_the_least_work_of_each_new_call():
    peer = peers.MemoryPeer(rank=2, size=3)
    peer.scan(numpy.zeros(5), numpy.zeros(5))
    assert peer.buffers["inputs"].shape == (3, 5)  # rank 2 reduces ranks 0..2
    peer.close()
    peer.reduce(numpy.zeros(12), numpy.zeros(12), root=2)
    assert peer.buffers["inputs"].shape == (3, 4) and peer.buffers["copied"].shape == (2, 8)
    peer.close()
    peer.reduce(numpy.zeros(12), numpy.zeros(12), root=0)
    assert "copied" not in peer.buffers  # not the root: its share only
    peer.close()
    peer.gather(numpy.zeros(4), numpy.zeros((3, 4)), root=0)
    assert peer.buffers == {}
    for call in (lambda: peer.gather(numpy.zeros(4), numpy.zeros((3, 4)), root=2),
                 lambda: peer.all_to_all(numpy.zeros((3, 4)), numpy.zeros((3, 4))),
                 lambda: peer.sendrecv(numpy.zeros(12), 0, numpy.zeros(12), 1)):
        peer.close()
        call()
        assert peer.buffers["copied"].shape == (2, 12)


def test_an_implementation_without_the_collective_is_not_measured():
    mpi_only = peers.Impl("x", object())
    assert not mpi_only.can("scan", "float32")
    assert peers.Impl("memory", peers.MemoryPeer(0, 2)).can("scan", "float32")
    assert not peers.Impl("gloo", peers.GlooPeer, peers.GlooPeer.dtypes).can("scan", "float32")
    assert not peers.Impl("gloo", peers.GlooPeer, peers.GlooPeer.dtypes).can("gather",
                                                                             "uint64")
    ringcc_torch = peers.Impl("torch-ringcc", peers.TorchRingccPeer)
    assert not ringcc_torch.can("scan", "float32") and ringcc_torch.can("sendrecv", "uint64")
    # Gloo on CUDA tensors all-reduces and broadcasts them, and nothing else.
    gloo_on_cuda = types.SimpleNamespace(all_reduce=None, gather=None, offered=("all_reduce",))
    assert peers.Impl("gloo", gloo_on_cuda).can("all_reduce", "float32")
    assert not peers.Impl("gloo", gloo_on_cuda).can("gather", "float32")


def test_scan_beside_a_peer_that_has_none(tmp_path):
    result = mpiexec(2, "-m", "benchmarks.scan", "-b", "64", "-e", "4K", "-f", "64", "-n", "2",
                     "-w", "1", "--transport", "shm", "--compare", "mpi,gloo,torch-ringcc,memory",
                     "--json", str(tmp_path / "r.json"), timeout=120)
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {row["impl"] for row in rows} == {"ringcc:shm", "mpi", "memory"}
    assert all(row["wrong"] in (0, None) for row in rows)
    if torch_here():
        for peer in ("gloo", "torch-ringcc"):
            assert f"# {peer} does not do scan: not measured" in result.stdout
        table = [line.split() for line in result.stdout.splitlines()
                 if not line.startswith("#")]
        # size .. root, ringcc's 4 columns, mpi's 3, gloo's and torch-ringcc's "n/a", memory's 3
        assert [len(fields) for fields in table] == [5 + 4 + 3 + 1 + 1 + 3] * 2
        assert all(fields[12] == fields[13] == "n/a" for fields in table)


def test_every_new_collective_dtype_and_op_checks_out_on_three_ranks(tmp_path):
    check_every_dtype_and_op(tmp_path, COLLECTIVES, ["shm", "mpi"], "24")


