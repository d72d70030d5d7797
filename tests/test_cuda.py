"""CuPy arrays through every collective, on the cuda_ipc transport and on the MPI transport
(staged through host memory, or direct where the MPI library takes device memory), checked
against the NumPy references of cases.py on real ranks (cuda_driver.py). These skip, saying
why, where CuPy or a GPU is missing; what needs neither runs everywhere.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy
import pytest

import collectives
from benchmarks import device
from gpu import MISSING, needs_gpu
from launch import ROOT, mpiexec, rank_env

DRIVER = str(Path(__file__).with_name("cuda_driver.py"))
# Kernels compile on first use in every rank (then come from CuPy's cache): be patient.
GPU_TIMEOUT = 600


needs_no_gpu = pytest.mark.skipif(MISSING is None, reason="a GPU is present here")


# ---- on a GPU ----------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_collective_on_cuda_ipc(ranks):
    job = mpiexec(ranks, DRIVER, "collectives", "cuda_ipc", timeout=GPU_TIMEOUT)
    assert job.stdout.count("collectives ok: cuda_ipc") == 2, job.stdout
    assert "all-reduce one-shot in pieces ok" in job.stdout, job.stdout


@needs_gpu
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_collective_on_mpi_staged_through_host_memory(ranks):
    job = mpiexec(ranks, DRIVER, "collectives", "mpi", timeout=GPU_TIMEOUT,
                  env=rank_env(RINGCC_MPI_CUDA="0"))
    assert job.stdout.count("staged True") == 2, job.stdout


@needs_gpu
def test_every_collective_on_cuda_aware_mpi():
    probe = mpiexec(1, DRIVER, "mpi_library", timeout=120)
    if "RINGCC_MPI_CUDA=None: True" not in probe.stdout:
        pytest.skip("this MPI library does not take device memory")
    job = mpiexec(2, DRIVER, "collectives", "mpi", timeout=GPU_TIMEOUT)
    assert job.stdout.count("staged False") == 2, job.stdout


@needs_gpu
def test_cuda_ipc_devices_memory_handles_streams_and_close():
    job = mpiexec(3, DRIVER, "lifecycle", timeout=GPU_TIMEOUT)
    assert job.stdout.count("lifecycle ok") == 3, job.stdout


@needs_gpu
def test_a_failing_rank_stops_every_rank_and_all_close():
    job = mpiexec(3, DRIVER, "failure", timeout=GPU_TIMEOUT)
    assert "rank 1 raised RuntimeError" in job.stdout, job.stdout
    assert job.stdout.count("closed") == 3, job.stdout


@needs_gpu
def test_the_benchmark_on_device_buffers_checks_and_compares():
    job = mpiexec(2, "-m", "benchmarks.all_reduce", "-b", "1M", "-e", "4M", "-f", "4", "-n", "3",
                  "-w", "1", "--transport", "cuda_ipc,mpi", "--compare", "copy",
                  timeout=GPU_TIMEOUT)
    assert "# Out of bounds values : 0 OK" in job.stdout, job.stdout
    assert "busbw / copy bandwidth" in job.stdout and "ringcc:cuda_ipc / ringcc:mpi" in job.stdout


# ---- anywhere ----------------------------------------------------------------------------------

@needs_no_gpu
def test_without_a_gpu_asking_for_one_says_what_is_missing():
    job = mpiexec(1, DRIVER, "unavailable", timeout=120)
    missing = "needs CuPy" if "CuPy is not installed" in MISSING else "needs a CUDA GPU"
    for transport in ("cuda_ipc", "auto", "mpi"):
        assert f"{transport}: device='cuda' {missing}" in job.stdout, job.stdout
    assert "RINGCC_MPI_CUDA=0: False" in job.stdout and "RINGCC_MPI_CUDA=1: True" in job.stdout
    assert "RINGCC_MPI_CUDA=None: " in job.stdout


@needs_no_gpu
def test_the_trainer_on_cuda_without_a_gpu_exits_with_the_reason():
    result = subprocess.run([sys.executable, "-m", "trainer", "--device", "cuda", "--epochs", "1"],
                            cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "python -m trainer: device='cuda' needs" in result.stderr, result.stderr


@needs_no_gpu
def test_the_trainer_benchmark_on_cuda_without_a_gpu_exits_with_the_reason():
    job = mpiexec(1, "-m", "benchmarks.trainer", "--device", "cuda", "--zero", "0", timeout=120,
                  check=False)
    assert job.returncode != 0
    assert "python -m benchmarks.trainer: device='cuda' needs" in job.stderr, job.stderr
    assert "Traceback" not in job.stderr, job.stderr


@needs_no_gpu
def test_the_benchmark_on_cuda_ipc_without_a_gpu_says_why():
    job = mpiexec(1, "-m", "benchmarks.all_reduce", "--transport", "cuda_ipc", timeout=120,
                  check=False)
    assert job.returncode == 2
    assert "ringcc cannot open the 'cuda_ipc' transport here: device='cuda' needs" in job.stderr


@pytest.mark.parametrize("transport, device_, message", [
    ("shm", "cuda", "the shm transport does not move cuda arrays"),
    ("cuda_ipc", "cpu", "the cuda_ipc transport does not move cpu arrays"),
    ("auto", "tpu", "unknown device 'tpu'"),
])
def test_transport_and_device_must_agree(transport, device_, message):
    # Refused before MPI or CuPy is touched, so this runs in the test process.
    with pytest.raises(collectives.InvalidArgumentError, match=message):
        collectives.init(transport, device=device_)


def test_no_algorithm_imports_cupy_or_mpi4py():
    """Algorithms see arrays and a transport only; the array module comes from the arrays."""
    algorithms = ["all_reduce", "all_gather", "broadcast", "scatter", "reduce_scatter", "ring",
                  "chunking", "ops", "check", "naive"]
    for name in algorithms:
        tree = ast.parse((ROOT / "collectives" / f"{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     if node.module}
        assert not {m for m in imported if m.split(".")[0] in ("cupy", "mpi4py")}, name


def test_device_helpers_are_identities_on_the_host():
    send, own = numpy.arange(6.0), numpy.ones(6)
    assert device.mirror(numpy, send, send, own) == (send, send, own)
    assert collectives.to_numpy(send) is send
    assert collectives.module_for_device("cpu") is numpy and device.versions(numpy) == {}
    device.synchronize(numpy)


def test_the_copy_peer_copies_the_largest_buffer_on_rank_0_only():
    send, recv = numpy.arange(4.0), numpy.arange(12.0).reshape(3, 4)
    first, other = device.CopyPeer(numpy, 0), device.CopyPeer(numpy, 1)
    first.all_gather(send, recv)
    other.all_gather(send, recv)
    assert numpy.array_equal(first.target, recv) and first.target is not recv
    assert other.target is None
    first.broadcast(send)
    assert numpy.array_equal(first.target, send)


def test_ceilings_hold_busbw_against_the_copy_bandwidth():
    def row(impl, nbytes, busbw, algbw=None, dtype="float32"):
        return {"impl": impl, "bytes": nbytes, "dtype": dtype, "op": "sum",
                "busbw_GBps": busbw, "algbw_GBps": busbw if algbw is None else algbw}

    rows = [row("ringcc:cuda_ipc", 1024, 1.0), row("ringcc:mpi", 1024, 0.5), row("copy", 1024, 9),
            row("ringcc:cuda_ipc", 4096, 300.0), row("ringcc:mpi", 4096, 10.0),
            row("copy", 4096, 1000.0), row("mpi", 4096, 5.0),
            row("ringcc:cuda_ipc", 4096, 2.0, dtype="int8")]  # no copy row for int8
    assert device.ceilings(rows, ["ringcc:cuda_ipc", "ringcc:mpi"]) == [
        "# 4096 B float32 sum: busbw / copy bandwidth (1000.00 GB/s): ringcc:cuda_ipc 0.30, "
        "ringcc:mpi 0.01; busbw ringcc:cuda_ipc / ringcc:mpi 30.0x"]
    assert device.ceilings(rows[:2], ["ringcc:cuda_ipc"]) == []


def test_the_benchmark_compares_with_a_plain_copy_on_the_host():
    job = mpiexec(2, "-m", "benchmarks.all_reduce", "-b", "64K", "-e", "256K", "-f", "4", "-n",
                  "2", "-w", "1", "--transport", "shm,mpi", "--compare", "copy", timeout=120)
    assert "# Out of bounds values : 0 OK" in job.stdout, job.stdout
    assert "measured: ringcc:shm (main), ringcc:mpi, copy" in job.stdout
    assert "262144 B float32 sum: busbw / copy bandwidth" in job.stdout, job.stdout



def test_the_first_communicator_on_the_gpu_chooses_it_for_every_later_one(monkeypatch):
    """A process's GPU is its place on its node in its first communicator on the GPU, mod the
    GPUs: a later one over other ranks (a subgroup, a hierarchical part), where its place is
    another, keeps it. (A stand-in for CuPy counts 4 GPUs and records which is made current.)"""
    from transports import cuda

    made_current = []

    class Device:
        def __init__(self, index: int) -> None:
            self.index = index

        def use(self) -> None:
            made_current.append(self.index)

    runtime = types.SimpleNamespace(getDeviceCount=lambda: 4)
    stand_in = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device, runtime=runtime))
    places = iter([5, 0, 2])  # this rank's place on its node in each communicator
    monkeypatch.setattr(cuda, "cupy", stand_in)
    monkeypatch.setattr(cuda, "_gpu", None)
    monkeypatch.setattr(cuda, "local_rank", lambda comm: next(places))
    for _ in range(3):
        assert cuda.use_gpu(None) is stand_in
    assert made_current == [1, 1, 1]


def test_a_call_on_the_progress_thread_runs_on_the_stream_current_where_it_was_made():
    """CuPy's current stream is per thread: a call queued on the progress thread runs in the
    stream that was current where it was made, not the thread's own. (A stand-in for CuPy
    records the streams entered, and on which thread.)"""
    from collectives.calls import on_callers_stream
    from collectives.work import Progress

    entered = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> "Stream":
            entered.append((self.name, threading.current_thread().name))
            return self

        def __exit__(self, *exc_info: object) -> None:
            entered.append(("left", self.name))

    current = [Stream("the caller's")]
    stand_in = types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_current_stream=lambda: current[0]))
    # (As a GPU communicator's: its calls run on the thread, never on a waiter's.)
    progress = Progress("progress", None, on_callers_stream(stand_in), inline=False)
    held = threading.Lock()
    held.acquire()
    first = progress.submit("a call that waits", held.acquire)
    second = progress.submit("a call", lambda: threading.current_thread().name)
    current[0] = Stream("a later one")  # made current after the call: the call keeps its own
    held.release()
    assert first.wait() and second.wait() == "progress"
    progress.close()
    assert entered == [("the caller's", "progress"), ("left", "the caller's")] * 2, entered
    assert on_callers_stream(numpy) is None
