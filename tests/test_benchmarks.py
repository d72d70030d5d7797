"""The benchmark harness: its options, the bus-bandwidth factors, the #wrong check, the JSON and
CSV it writes, the plot, and short real runs under mpiexec (a broken collective included)."""

from __future__ import annotations

import argparse
import csv
import json
import textwrap
import time

import numpy
import pytest

import collectives
from benchmarks import measure, options, peers, plot, report
from benchmarks.all_gather import ALL_GATHER
from benchmarks.all_reduce import ALL_REDUCE
from benchmarks.broadcast import BROADCAST
from benchmarks.reduce_scatter import REDUCE_SCATTER
from benchmarks.scatter import SCATTER
from launch import mpiexec

COLLECTIVES = [ALL_REDUCE, ALL_GATHER, BROADCAST, SCATTER, REDUCE_SCATTER]
SCHEMA_META = {"collective", "ranks", "host", "versions", "dtype", "op", "root", "iters",
               "warmup", "warmup_ms", "command"}
SCHEMA_ROW = ["impl", "collective", "ranks", "bytes", "count", "dtype", "op", "root", "time_us",
              "algbw_GBps", "busbw_GBps", "wrong", "registered", "rounds_us"]


def torch_here() -> bool:
    try:
        import torch.distributed
    except ImportError:
        return False
    return torch.distributed.is_gloo_available()


# ---- options ------------------------------------------------------------------------------

def test_sizes_take_nccl_tests_suffixes():
    assert [options.parse_size(s) for s in ("8", "512K", "64M", "1G", "2k")] == \
        [8, 512 << 10, 64 << 20, 1 << 30, 2048]
    for bad in ("1X", "M", "", "-8", "1.5M"):
        with pytest.raises(argparse.ArgumentTypeError):
            options.parse_size(bad)


def test_sizes_step_by_the_factor():
    assert options.sizes(8, 1024, 2) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert options.sizes(8, 100, 4) == [8, 32]
    assert options.sizes(64, 64, 1) == [64]
    for bad in ((8, 64, 1), (64, 8, 2), (0, 8, 2)):
        with pytest.raises(ValueError):
            options.sizes(*bad)


def test_options_in_nccl_tests_spelling():
    args = options.parse_args(ALL_REDUCE, [
        "-b", "1K", "-e", "1M", "-f", "4", "-n", "7", "-w", "1", "-c", "0", "-o", "max",
        "-d", "double", "-r", "1", "--transport", "shm,mpi", "--registered", "1",
        "--compare", "mpi,gloo,torch-ringcc", "--json", "out.json", "--csv", "out.csv"])
    assert args.sizes == [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20]
    assert (args.iters, args.warmup_iters, args.check, args.op, args.root) == (7, 1, 0, "max", 1)
    assert args.transport == ["shm", "mpi"] and args.compare == ["mpi", "gloo", "torch-ringcc"]
    assert args.registered == 1
    assert (args.json, args.csv) == ("out.json", "out.csv")
    assert options.cases(ALL_REDUCE, args) == ([("float64", "max")], [])
    defaults = options.parse_args(ALL_REDUCE, [])
    assert (defaults.sizes, defaults.iters, defaults.warmup_iters, defaults.check,
            defaults.warmup_ms, defaults.rounds) == ([32 << 20], 20, 5, 1, 20.0, 1)
    assert options.parse_args(ALL_REDUCE, ["--rounds", "5"]).rounds == 5
    assert options.parse_args(ALL_REDUCE, ["--warmup-ms", "0"]).warmup_ms == 0
    assert defaults.transport == ["auto"] and defaults.compare == [] and defaults.registered == 0


@pytest.mark.parametrize("argv", [["--compare", "nccl"], ["-f", "1", "-b", "8", "-e", "64"],
                                  ["-n", "0"], ["--rounds", "0"], ["--warmup-ms", "-1"],
                                  ["-d", "bfloat16"],
                                  ["-o", "xor"], ["-c", "2"],
                                  ["--registered", "2"],
                                  ["--compare", "memory", "--device", "cuda"],
                                  ["--transport", "cuda_ipc", "--compare", "mpi,memory"],
                                  ["--warmup-ms", "nan"], ["--warmup-ms", "inf"],
                                  ["--compare", "mpi,memory,mpi"], ["--transport", "shm,shm"],
                                  ["--algorithms", "tree"], ["--algorithms", "ring,ring"]])
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        options.parse_args(ALL_REDUCE, argv)
    assert "error" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # every rank parses; only the first says so
        options.parse_args(ALL_REDUCE, argv, quiet=True)
    assert capsys.readouterr() == ("", "")


def test_algorithms_are_all_reduces_own(capsys):
    args = options.parse_args(ALL_REDUCE, ["--algorithms", "ring,reduce_scatter_all_gather"])
    assert args.algorithms == ["ring", "reduce_scatter_all_gather"]
    assert options.parse_args(ALL_REDUCE, []).algorithms == []
    with pytest.raises(SystemExit):
        options.parse_args(ALL_GATHER, ["--algorithms", "ring"])
    assert "--algorithms chooses among all_reduce's algorithms" in capsys.readouterr().err


def test_an_algorithm_peer_asks_for_its_algorithm():
    asked = []

    class Main:
        def all_reduce(self, sendbuf, recvbuf, op, algorithm):
            asked.append((sendbuf, recvbuf, op, algorithm))

    peer = peers.AlgorithmPeer(Main(), "reduce_scatter_all_gather")
    peer.all_reduce("in", "out", "max")
    assert asked == [("in", "out", "max", "reduce_scatter_all_gather")]
    assert peer.offered == ("all_reduce",)


def test_results_that_could_not_be_written_are_refused_at_the_start(tmp_path):
    for option in ("--json", "--csv"):
        args = options.parse_args(ALL_REDUCE, [option, "/no/such/folder/r.out"])
        assert options.unwritable(args) == (f"{option} /no/such/folder/r.out: /no/such/folder "
                                            f"is not a folder this user can write in")
        args = options.parse_args(ALL_REDUCE, [option, str(tmp_path / "r.out")])
        assert options.unwritable(args) is None


def test_a_results_file_that_could_not_be_written_ends_the_run_before_it_starts():
    job = mpiexec(2, "-m", "benchmarks.all_reduce", "-b", "8", "-e", "8", "-n", "1",
                  "--json", "/no/such/folder/r.json", check=False, timeout=120)
    assert job.returncode == 2 and "is not a folder this user can write in" in job.stderr
    assert "Out of bounds" not in job.stdout, job.stdout  # nothing was measured


def test_all_ops_and_dtypes_leave_out_averages_of_integers():
    args = options.parse_args(ALL_REDUCE, ["-o", "all", "-d", "all"])
    pairs, notes = options.cases(ALL_REDUCE, args)
    assert ("int8", "avg") not in pairs and ("float16", "avg") in pairs
    assert len(pairs) == 6 * 4 + 3 * 5 and len(notes) == 6
    pairs, notes = options.cases(ALL_GATHER, args)
    assert pairs == [(d, "none") for d in options.DTYPES] and notes == []


def test_counts_are_whole_blocks_per_rank():
    assert options.counts(ALL_GATHER, [8, 16, 64], 4, 3) == [3, 15]
    assert options.counts(SCATTER, [8], 1, 4) == [8]
    assert options.counts(ALL_REDUCE, [8, 64], 4, 3) == [2, 16]
    for collective in COLLECTIVES:
        for count in options.counts(collective, [8, 1000], 4, 3):
            send, recv = collective.shapes(count, 3)
            assert numpy.prod(recv if collective is ALL_GATHER else send) == count


def test_registered_buffers_fit_the_largest_size_of_any_dtype():
    # int8's 63 elements (64 B rounded to 3 blocks) outgrow float32's 15.
    pairs = [("float32", "none"), ("int8", "none")]
    assert options.buffer_bytes(ALL_GATHER, pairs, [8, 64], 3) == {"send": 21, "recv": 63}
    assert options.buffer_bytes(BROADCAST, pairs[:1], [8, 64], 3) == {"send": 64}  # in place


# ---- bus bandwidth ------------------------------------------------------------------------

@pytest.mark.parametrize("collective, factor", [
    (ALL_REDUCE, lambda n: 2 * (n - 1) / n), (ALL_GATHER, lambda n: (n - 1) / n),
    (REDUCE_SCATTER, lambda n: (n - 1) / n), (SCATTER, lambda n: (n - 1) / n),
    (BROADCAST, lambda n: 1.0)])
def test_bus_bandwidth_factors_are_nccl_tests_ones(collective, factor):
    for ranks in (1, 2, 3, 4, 8):
        assert collective.bus_factor(ranks) == pytest.approx(factor(ranks))
    assert collective.bus_factor(4) == {"all_reduce": 1.5, "broadcast": 1.0}.get(
        collective.name, 0.75)


# ---- data and the check -------------------------------------------------------------------

def test_data_depends_on_rank_and_index():
    a = measure.rank_data(0, (4096,), "float32", "sum")
    b = measure.rank_data(1, (4096,), "float32", "sum")
    assert len(numpy.unique(a)) == 64 and numpy.mean(a != b) > 0.9
    assert numpy.array_equal(a, measure.rank_data(0, (4096,), "float16", "sum"))  # exact
    assert numpy.abs(a).max() <= measure.DATA_MAX
    products = measure.rank_data(2, (8, 512), "int8", "prod")
    assert products.shape == (8, 512) and set(numpy.unique(products)) == {1, 2}


def test_references_reduce_over_ranks():
    def data(rank):
        return measure.rank_data(rank, (1000,), "int8", "sum")

    total = measure.reduce_ranks(data, 5, "sum")
    wide = sum(data(r).astype(numpy.int64) for r in range(5))
    assert total.dtype == numpy.int8 and numpy.array_equal(total, wide.astype(numpy.int8))
    average = measure.reduce_ranks(lambda r: data(r).astype(numpy.float16), 5, "avg")
    assert average.dtype == numpy.float64 and numpy.allclose(average, wide / 5)
    assert numpy.array_equal(measure.reduce_ranks(data, 5, "max"),
                             numpy.max([data(r) for r in range(5)], axis=0))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_check_allows_rounding_and_counts_every_wrong_element(dtype):
    ranks = 8
    inputs = [measure.rank_data(r, (5000,), dtype, "sum") for r in range(ranks)]
    expected = measure.reduce_ranks(lambda r: inputs[r], ranks, "sum")
    result = inputs[0].copy()
    for block in reversed(inputs[1:]):  # another order of additions, rounding in `dtype`
        result += block
    result /= 1 + numpy.finfo(dtype).eps  # and one more rounding step
    assert measure.count_wrong(result, expected, ranks) == 0
    result[[3, 100, 4999]] += 0.5
    result[7] = numpy.nan
    assert measure.count_wrong(result, expected, ranks) == 4


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_check_asks_for_sums_min_and_max_exactly_where_the_data_make_them_exact(dtype):
    """The data are multiples of 1/8 of at most DATA_MAX: on 8 ranks a sum comes out exact in
    any order, even in float16, so one ulp off is wrong; a product may round."""
    ranks = 8
    inputs = [measure.rank_data(r, (5000,), dtype, "sum") for r in range(ranks)]
    expected = measure.reduce_ranks(lambda r: inputs[r], ranks, "sum")
    result = inputs[0].copy()
    for block in reversed(inputs[1:]):  # another order of additions, in `dtype`
        result += block
    assert measure.count_wrong(result, expected, ranks, op="sum") == 0
    result[[3, 100]] = numpy.nextafter(result[[3, 100]], numpy.inf)
    assert measure.count_wrong(result, expected, ranks, op="sum") == 2
    assert measure.count_wrong(result, expected, ranks, op="prod") == 0  # (within rounding)
    assert measure.exact(numpy.dtype(dtype), ranks, "max")
    assert not measure.exact(numpy.dtype("float16"), 65, "sum")


def test_the_clock_warm_up_calls_on_for_its_milliseconds_and_stops():
    from mpi4py import MPI
    calls = []

    def call() -> None:
        calls.append(time.perf_counter())

    impl = peers.Impl(name="probe", comm=None)
    start = time.perf_counter()
    measure.warm_clock(call, impl, argparse.Namespace(warmup_ms=5.0), MPI.COMM_SELF)
    assert calls and time.perf_counter() - start >= 0.005  # not back before 5 ms have passed
    calls.clear()
    measure.warm_clock(call, impl, argparse.Namespace(warmup_ms=0.0), MPI.COMM_SELF)
    assert calls == []


def test_check_is_exact_for_what_is_only_moved():
    """A float moved (gathered, broadcast) must arrive as it was sent: no rounding allowed."""
    expected = measure.rank_data(0, (100,), "float16", "none")
    result = expected.copy()
    result[42] += numpy.float16(0.125)  # within 6 ranks' rounding of a sum
    assert measure.count_wrong(result, expected, 6) == 0
    assert measure.count_wrong(result, expected, 6, reduced=False) == 1


def test_the_checked_call_takes_the_path_the_timed_calls_take():
    """An implementation whose first call takes another path than the later ones (ringcc's
    small-call lane learns a kind of call on the general path) is checked on a later call,
    even with no warm-up asked for."""
    from mpi4py import MPI

    made = []

    def run(comm, send, recv, op, root):  # right the first time only
        recv[...] = send if not made else send + 1
        made.append(1)

    collective = options.Collective(name="all_gather", bus_factor=lambda n: 1.0,
                                    shapes=lambda count, n: ((count,), (count,)), run=run,
                                    expected=lambda data, rank, ranks, op, root: data(rank))
    own = numpy.arange(4.0)
    call, wrong = measure.prepare(peers.Impl("probe", None), collective, own.copy(),
                                  numpy.empty(4), own, True, own, "none", -1,
                                  argparse.Namespace(warmup_iters=0), MPI.COMM_SELF)
    assert wrong == 4 and len(made) == 2


def test_check_is_exact_for_integers():
    expected = measure.rank_data(0, (100,), "uint64", "sum")
    result = expected.copy()
    result[42] += 1
    assert measure.count_wrong(result, expected, 4) == 1


@pytest.mark.parametrize("dtype", ["int8", "uint8", "uint64", "float16", "float64"])
def test_poison_makes_every_element_wrong(dtype):
    expected = measure.reduce_ranks(lambda r: measure.rank_data(r, (300,), dtype, "sum"), 3,
                                    "sum")
    result = numpy.empty(300, dtype)
    measure.poison(result, expected)
    assert measure.count_wrong(result, expected, 3) == 300


# ---- what it writes -----------------------------------------------------------------------

def example_rows(ranks: int) -> list[dict]:
    return [dict(zip(SCHEMA_ROW, [impl, "all_reduce", ranks, size, size // 4, "float32", "sum",
                                  -1, 10.0 + size / 1e3, size / 1e4, 1.5 * size / 1e4, 0,
                                  False, [10.0 + size / 1e3, 11.5 + size / 1e3]]))
            for impl in ("ringcc:mpi", "mpi") for size in (1024, 4096)]


def test_fit_and_plot_keep_registered_and_ordinary_runs_apart(tmp_path):
    """The same sizes measured with and without --registered 1: two series, not one."""
    from benchmarks import fit

    paths = []
    for registered in (False, True):
        rows = [{**row, "registered": registered, "time_us": row["time_us"] + registered}
                for row in example_rows(2) if row["impl"] == "ringcc:mpi"]
        paths.append(str(tmp_path / f"r{int(registered)}.json"))
        report.write_json(paths[-1], {"collective": "all_reduce", "ranks": 2}, rows)
    loaded = fit.load(paths)
    assert len(loaded) == 4 and {row["runs"] for row in loaded} == {1}
    lines = plot.series(plot.load_rows(paths)[0])
    assert sorted(lines) == [("ringcc:mpi", "ordinary"), ("ringcc:mpi", "registered")], lines


def test_json_and_csv_round_trip(tmp_path):
    meta = {"collective": "all_reduce", "ranks": 4}
    rows = example_rows(4)
    report.write_json(str(tmp_path / "r.json"), meta, rows)
    report.write_csv(str(tmp_path / "r.csv"), rows)
    assert json.loads((tmp_path / "r.json").read_text()) == {"meta": meta, "rows": rows}
    with open(tmp_path / "r.csv") as source:
        read = list(csv.DictReader(source))
    assert list(read[0]) == SCHEMA_ROW and [r["impl"] for r in read] == [r["impl"] for r in rows]
    assert [float(r["time_us"]) for r in read] == [r["time_us"] for r in rows]
    assert [[float(t) for t in r["rounds_us"].split()] for r in read] == \
        [r["rounds_us"] for r in rows]


def test_table_rows_show_ratio_and_missing_peers():
    impls = [peers.Impl("ringcc:mpi", None), peers.Impl("mpi", None),
             peers.Impl("gloo", None)]
    ours, theirs = example_rows(2)[0], dict(example_rows(2)[0], impl="mpi", time_us=21.0)
    line = report.format_row({"ringcc:mpi": ours, "mpi": theirs, "gloo": None}, impls)
    assert line.split() == ["1024", "256", "float32", "sum", "-1", "11.02", "0.10", "0.15", "0",
                            "21.00", f"{21 / 11.024:.2f}", "0", "n/a"]
    assert "0 OK" in report.summary(example_rows(2), impls)
    unchecked = [dict(row, wrong=None) for row in example_rows(2)]  # -c 0
    assert "# Out of bounds values : N/A (not checked: -c 0)" in report.summary(unchecked, impls)


def test_a_peer_that_works_in_place_gets_a_buffer_of_its_own():
    """torch.distributed reduces in place: its peers get the input in one buffer of their own,
    so that the time is the call's alone and their result leaves the others' input as it was."""
    own = numpy.arange(6.0)
    send, recv = own.copy(), numpy.empty(6)
    torch_like = peers.Impl("gloo", None, in_place=("all_reduce", "reduce"))
    mine, result = measure.own_buffers(torch_like, ALL_REDUCE, send, recv, own)
    assert mine is result and mine is not send and mine is not own
    numpy.testing.assert_array_equal(mine, own)
    assert measure.own_buffers(torch_like, ALL_GATHER, send, recv, own) == (send, recv)
    assert measure.own_buffers(peers.Impl("mpi", None), ALL_REDUCE, send, recv, own) == \
        (send, recv)


def test_the_memory_peer_does_the_least_work_of_each_call():
    peer = peers.MemoryPeer(rank=1, size=3)
    peer.all_reduce(numpy.zeros(12), numpy.zeros(12, "int8"))
    # This rank's share, 4 of 12 elements, reduced from 3 inputs; the other 8 copied.
    assert peer.buffers["inputs"].shape == (3, 4) and peer.buffers["inputs"].dtype == numpy.int8
    assert numpy.all(peer.buffers["reduced"] == 3) and peer.buffers["copied"].shape == (2, 8)
    peer.close()
    peer.reduce_scatter(numpy.zeros((3, 4)), numpy.zeros(4))
    assert numpy.all(peer.buffers["reduced"] == 3) and "copied" not in peer.buffers
    peer.close()
    peer.scatter(numpy.zeros((3, 4)), numpy.zeros(4))
    assert peer.buffers["copied"].shape == (2, 4) and "inputs" not in peer.buffers
    peer.close()
    peer.broadcast(numpy.zeros(12), root=1)
    assert peer.buffers == {}  # the root does nothing
    for call in (lambda: peer.broadcast(numpy.zeros(12), root=0),
                 lambda: peer.all_gather(numpy.zeros(4), numpy.zeros((3, 4)))):
        peer.close()
        call()
        assert peer.buffers["copied"].shape == (2, 12)  # a copy of the whole result


def test_the_summary_holds_each_transport_against_the_memory_bound():
    rows = example_rows(2) + [dict(example_rows(2)[1], impl=impl, time_us=time_us)
                              for impl, time_us in (("ringcc:shm", 5.0), ("memory", 2.0))]
    impls = [peers.Impl(name, None) for name in ("ringcc:shm", "ringcc:mpi", "mpi", "memory")]
    assert report.summary(rows, impls).splitlines()[-1] == \
        "# 4096 B float32 sum: time / memory bound (2.00 us): ringcc:shm 2.50x, ringcc:mpi 7.05x"
    assert peers.memory_bounds(example_rows(2), ["ringcc:mpi"]) == []


def test_plot_draws_one_line_per_implementation_and_rank_count(tmp_path):
    for ranks in (2, 4):
        report.write_json(str(tmp_path / f"{ranks}.json"),
                           {"collective": "all_reduce", "ranks": ranks, "host": "h"},
                           example_rows(ranks))
    paths = [str(tmp_path / "2.json"), str(tmp_path / "4.json")]
    lines = plot.series(plot.load_rows(paths)[0])
    assert list(lines) == [("ringcc:mpi", "2 ranks"), ("mpi", "2 ranks"),
                           ("ringcc:mpi", "4 ranks"), ("mpi", "4 ranks")]
    assert plot.size_label(8) == "8" and plot.size_label(64 << 20) == "64M"
    plot.main([*paths, "-o", str(tmp_path / "p.png")])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# ---- real runs ----------------------------------------------------------------------------

def test_all_reduce_under_mpiexec_beside_the_peers(tmp_path):
    result = mpiexec(2, "-m", "benchmarks.all_reduce", "-b", "8", "-e", "4K", "-f", "8",
                     "-n", "2", "-w", "1", "--transport", "mpi",
                     "--compare", "mpi,gloo,torch-ringcc",
                     "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
                     timeout=120)
    results = json.loads((tmp_path / "r.json").read_text())
    impls = ["ringcc:mpi", "mpi"] + (["gloo", "torch-ringcc"] if torch_here() else [])
    assert SCHEMA_META <= set(results["meta"]) and results["meta"]["impls"] == impls
    rows = results["rows"]
    assert [(r["impl"], r["bytes"]) for r in rows] == \
        [(impl, size) for size in (8, 64, 512, 4096) for impl in impls]
    for row in rows:
        assert list(row) == SCHEMA_ROW and row["wrong"] == 0 and row["time_us"] > 0
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # 2(n-1)/n = 1 at n = 2
    assert "# Out of bounds values : 0 OK" in result.stdout
    assert "# Avg bus bandwidth" in result.stdout and "ratio: peer time" in result.stdout
    with open(tmp_path / "r.csv") as source:
        assert len(list(csv.DictReader(source))) == len(rows)


def test_all_reduce_algorithms_beside_autos_choice(tmp_path):
    """--algorithms times the main transport's all_reduce with each algorithm named, in the
    same job, as peers: each checked against NumPy, its ratio its time / auto's."""
    result = mpiexec(2, "-m", "benchmarks.all_reduce", "-b", "8", "-e", "64K", "-f", "64",
                     "-n", "2", "-w", "1", "--transport", "mpi",
                     "--algorithms", "ring,reduce_scatter_all_gather",
                     "--json", str(tmp_path / "r.json"), timeout=120)
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    impls = ["ringcc:mpi", "algorithm:ring", "algorithm:reduce_scatter_all_gather"]
    assert [(r["impl"], r["bytes"]) for r in rows] == \
        [(impl, size) for size in (8, 512, 32768) for impl in impls]
    assert all(row["wrong"] == 0 and row["time_us"] > 0 for row in rows)
    assert "algorithm:reduce_scatter_all_gather" in result.stdout


def test_the_torch_peers_are_skipped_by_name_without_torch(tmp_path):
    script = tmp_path / "no_torch.py"
    script.write_text(textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # as if PyTorch were not installed: importing it fails
        from benchmarks.all_reduce import ALL_REDUCE
        from benchmarks.harness import main
        sys.exit(main(ALL_REDUCE, sys.argv[1:]))
    """))
    result = mpiexec(2, str(script), "-b", "64", "-e", "64", "-n", "1", "-w", "0",
                     "--warmup-ms", "0", "--transport", "mpi", "--compare", "torch-ringcc,gloo",
                     "--json", str(tmp_path / "r.json"), timeout=120)
    for peer in ("torch-ringcc", "gloo"):
        assert f"# {peer}: torch is not installed here (pip install torch); the {peer} peer " \
            "is skipped" in result.stdout
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [row["impl"] for row in rows] == ["ringcc:mpi"] and rows[0]["wrong"] == 0


@pytest.mark.skipif(not torch_here(), reason="PyTorch is not installed: pip install torch")
def test_the_trainer_beside_pytorch_ddp_on_gloo_on_ringcc_and_with_its_hook():
    result = mpiexec(2, "-m", "benchmarks.trainer", "--compare", "torch", "--zero", "0",
                     "--warmup", "1", "--steps", "2", "--rounds", "1", timeout=240)
    lines = result.stdout.splitlines()
    rows = ("torch DDP (gloo)", "torch DDP on ringcc", "torch DDP + ringcc hook")
    for name in rows:
        assert any(line.strip().startswith(name) for line in lines), result.stdout
    for name in rows[1:]:
        assert any(line.startswith(f"# {name} / torch DDP (gloo): ") and
                   line.endswith("x steps/s") for line in lines), result.stdout
    check = next(line for line in lines if "relative difference from torch DDP (gloo)" in line)
    assert check.count(" yes") == 2 and "NO" not in check, check


def test_all_reduce_beside_the_memory_bound(tmp_path):
    """With --rounds 3, each implementation is timed three times at each size, and its time is
    the median of those, which the table and the JSON give."""
    result = mpiexec(2, "-m", "benchmarks.all_reduce", "-b", "1K", "-e", "64K", "-f", "8",
                     "-n", "3", "-w", "1", "--compare", "memory,mpi", "--rounds", "3",
                     "--json", str(tmp_path / "r.json"), timeout=120)
    results = json.loads((tmp_path / "r.json").read_text())
    rows = results["rows"]
    main = rows[0]["impl"]
    assert [row["impl"] for row in rows] == [main, "memory", "mpi"] * 3
    assert results["meta"]["rounds"] == 3 and "the median of 3 rounds" in result.stdout
    for row in rows:
        assert list(row) == SCHEMA_ROW and row["time_us"] > 0
        assert len(row["rounds_us"]) == 3 and row["time_us"] == sorted(row["rounds_us"])[1]
        assert row["wrong"] == (None if row["impl"] == "memory" else 0)
    table = [line.split() for line in result.stdout.splitlines() if not line.startswith("#")]
    assert [len(fields) for fields in table] == [5 + 4 + 3 + 3] * 3  # main's 4, 3 per peer
    for fields in table:  # memory: time, ratio, #wrong
        assert float(fields[9]) > 0 and float(fields[10]) > 0 and fields[11] == "N/A"
    last = result.stdout.splitlines()[-1]
    assert last.startswith("# 65536 B float32 sum: time / memory bound") and f" {main} " in last


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "broadcast"])
def test_registered_buffers_check_out(name, tmp_path):
    """ringcc on registered buffers (broadcast: in place), sizes sliced from one registration."""
    mpiexec(2, "-m", f"benchmarks.{name}", "-b", "1K", "-e", "1M", "-f", "32", "-n", "3",
            "-w", "1", "--registered", "1", "--transport", "shm,mpi", "--compare", "mpi",
            "--json", str(tmp_path / "r.json"), timeout=120)
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["meta"]["registered"] is True
    rows = results["rows"]
    assert [(r["impl"], r["bytes"]) for r in rows] == \
        [(impl, size) for size in (1 << 10, 1 << 15, 1 << 20)
         for impl in ("ringcc:shm", "ringcc:mpi", "mpi")]
    assert all(row["wrong"] == 0 for row in rows)


def check_every_dtype_and_op(tmp_path, collectives_: list, transports: list[str],
                             smallest: str) -> None:
    """Run the benchmarks of `collectives_` on 3 ranks, a root that is not 0, every dtype and
    every op, from `smallest` bytes up to 1K, with the MPI, Gloo and torch-ringcc peers; every
    implementation must agree with the references. (torch.distributed has no scan.)"""
    names = [c.name for c in collectives_]
    script = tmp_path / "all.py"
    script.write_text(textwrap.dedent(f"""
        import importlib, sys
        from benchmarks.harness import main

        status = 0
        for name in {names!r}:
            collective = getattr(importlib.import_module("benchmarks." + name), name.upper())
            status |= main(collective, ["-b", "{smallest}", "-e", "1K", "-f", "64", "-n", "1",
                                        "-w", "0", "--warmup-ms", "0", "-d", "all",
                                        "-o", "all", "-r", "1",
                                        "--transport", "{','.join(transports)}",
                                        "--compare", "mpi,gloo,torch-ringcc",
                                        "--json", rf"{tmp_path}/" + name + ".json"])
        sys.exit(status)
    """))
    mpiexec(3, str(script), timeout=240)
    for collective in collectives_:
        rows = json.loads((tmp_path / f"{collective.name}.json").read_text())["rows"]
        assert rows and all(row["wrong"] == 0 for row in rows)
        assert {row["dtype"] for row in rows} == set(options.DTYPES)
        torch_peers = {"gloo", "torch-ringcc"} if torch_here() and collective.name != "scan" \
            else set()
        assert {row["impl"] for row in rows} == \
            {f"ringcc:{t}" for t in transports} | {"mpi"} | torch_peers
        if collective.reduces:
            assert {row["op"] for row in rows} == set(collectives.OPS)


def test_every_collective_dtype_and_op_checks_out_on_three_ranks(tmp_path):
    """Sizes that are not whole blocks, too."""
    check_every_dtype_and_op(tmp_path, COLLECTIVES, ["mpi"], "16")


def test_a_broken_collective_is_caught(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent("""
        import dataclasses, sys
        from mpi4py import MPI
        from benchmarks.all_reduce import ALL_REDUCE
        from benchmarks.harness import main

        def run(comm, send, recv, op, root):
            ALL_REDUCE.run(comm, send, recv, op, root)
            if MPI.COMM_WORLD.rank == 1:
                recv[5] += 1  # one wrong element on one rank, whoever made the call
        sys.exit(main(dataclasses.replace(ALL_REDUCE, run=run), sys.argv[1:]))
    """))
    result = mpiexec(2, str(script), "-b", "64", "-e", "1K", "-f", "4", "-n", "1", "-w", "0",
                     "--warmup-ms", "0",
                     "--transport", "mpi", "--compare", "mpi", "--json",
                     str(tmp_path / "r.json"), check=False, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [row["wrong"] for row in rows] == [1] * 6
    assert "FAILED" in result.stdout


def test_a_missing_transport_is_named():
    result = mpiexec(1, "-m", "benchmarks.all_reduce", "--transport", "mpi,nosuch",
                     check=False, timeout=60)
    assert result.returncode == 2
    assert "cannot open the 'nosuch' transport" in result.stderr
