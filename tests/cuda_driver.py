"""Run on every rank by test_cuda.py: the collectives (and point-to-point calls) on CuPy arrays,
checked against NumPy.

    mpiexec -n 3 python tests/cuda_driver.py collectives cuda_ipc
    RINGCC_MPI_CUDA=0 mpiexec -n 2 python tests/cuda_driver.py collectives mpi
    mpiexec -n 3 python tests/cuda_driver.py lifecycle
    mpiexec -n 3 python tests/cuda_driver.py failure
    mpiexec -n 1 python tests/cuda_driver.py unavailable

The bodies and references are those of cases.py, run through `OnDevice`: every buffer goes to
the GPU in its own layout, the collective moves CuPy arrays, and the results come back to be
checked. Rank 0 checks and prints what passed; a failure raises, which ends the job.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import threading
from typing import Any, Callable

import numpy
from mpi4py import MPI

import cases
import collectives

SMALL_SEGMENT = 4096  # many segments per chunk on small buffers
COUNTS = (0, 1, 2, 7, 97, 1009, 20011)  # empty, below the rank count, primes
NEW_COUNTS = (0, 7, 20011)  # the later collectives: a quarter more time on the sweep
# (layout, flag): the flag is in_place for all-reduce, given (a recvbuf passed) for all-gather
LAYOUTS = (("flat", False), ("matrix", True), ("strided", False), ("strided", True))


def on_device(host: numpy.ndarray) -> Any:
    """A CuPy copy of `host` with its shape and strides: a non-contiguous view stays one."""
    import cupy

    span = host.itemsize + sum((n - 1) * s for n, s in zip(host.shape, host.strides)) \
        if host.size else 0
    out = cupy.ndarray(host.shape, host.dtype, cupy.cuda.alloc(span), strides=host.strides)
    out[...] = cupy.asarray(host)
    return out


def back(result: Any, given: numpy.ndarray | None) -> numpy.ndarray:
    """A device result on the host: written into `given` (and `given` returned) if there is one."""
    if given is None:
        return result.get()
    given[...] = result.get()
    return given


class OnDevice:
    """A communicator over CuPy arrays, seen through NumPy arrays so that the bodies of cases.py
    run unchanged. What a collective writes into a buffer the body passed (its sendbuf too)
    comes back into that NumPy array, so the bodies' checks of it still hold."""

    def __init__(self, comm: collectives.Communicator) -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    @property
    def stats(self) -> Any:
        return self.comm.stats

    def all_reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray | None = None,
                   op: str = "sum") -> numpy.ndarray:
        send = on_device(sendbuf)
        recv = send if recvbuf is sendbuf else None if recvbuf is None else on_device(recvbuf)
        out = self.comm.all_reduce(send, recv, op=op)
        assert recv is None or out is recv
        sendbuf[...] = send.get()
        return back(out, recvbuf)

    def all_gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray | None = None,
                   counts: list | None = None) -> numpy.ndarray:
        recv = None if recvbuf is None else on_device(recvbuf)
        out = self.comm.all_gather(on_device(sendbuf), recv, counts=counts)
        assert recv is None or out is recv
        return back(out, recvbuf)

    def broadcast(self, buf: numpy.ndarray, root: int = 0) -> numpy.ndarray:
        work = on_device(buf)
        assert self.comm.broadcast(work, root=root) is work
        return back(work, buf)

    def scatter(self, sendbuf: numpy.ndarray | None = None, recvbuf: numpy.ndarray | None = None,
                root: int = 0, counts: list | None = None) -> numpy.ndarray:
        recv = None if recvbuf is None else on_device(recvbuf)
        out = self.comm.scatter(None if sendbuf is None else on_device(sendbuf), recv, root=root,
                                counts=counts)
        assert recv is None or out is recv
        return back(out, recvbuf)

    def reduce_scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray | None = None,
                       op: str = "sum", counts: list | None = None) -> numpy.ndarray:
        send = on_device(sendbuf)
        out = self.comm.reduce_scatter(send, None if recvbuf is None else on_device(recvbuf),
                                       op=op, counts=counts)
        sendbuf[...] = send.get()
        return back(out, recvbuf)

    def gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray | None = None,
               root: int = 0, counts: list | None = None) -> numpy.ndarray | None:
        recv = None if recvbuf is None else on_device(recvbuf)
        out = self.comm.gather(on_device(sendbuf), recv, root=root, counts=counts)
        return None if out is None else back(out, recvbuf)

    def reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray | None = None,
               op: str = "sum", root: int = 0) -> numpy.ndarray | None:
        send = on_device(sendbuf)
        recv = send if recvbuf is sendbuf else None if recvbuf is None else on_device(recvbuf)
        out = self.comm.reduce(send, recv, op=op, root=root)
        sendbuf[...] = send.get()
        return None if out is None else back(out, recvbuf)

    def all_to_all(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray | None = None,
                   counts: list | None = None) -> numpy.ndarray:
        send = on_device(sendbuf)
        recv = send if recvbuf is sendbuf else None if recvbuf is None else on_device(recvbuf)
        out = self.comm.all_to_all(send, recv, counts=counts)
        sendbuf[...] = send.get()
        return back(out, recvbuf)

    def scan(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray | None = None,
             op: str = "sum", exclusive: bool = False) -> numpy.ndarray:
        send = on_device(sendbuf)
        recv = send if recvbuf is sendbuf else None if recvbuf is None else on_device(recvbuf)
        out = self.comm.scan(send, recv, op=op, exclusive=exclusive)
        sendbuf[...] = send.get()
        return back(out, recvbuf)

    def sendrecv(self, sendbuf: numpy.ndarray, dst: int, recvbuf: numpy.ndarray,
                 src: int) -> numpy.ndarray:
        recv = on_device(recvbuf)
        assert self.comm.sendrecv(on_device(sendbuf), dst, recv, src) is recv
        return back(recv, recvbuf)

    def send(self, buf: numpy.ndarray, dst: int) -> None:
        self.comm.send(on_device(buf), dst)

    def recv(self, buf: numpy.ndarray, src: int) -> numpy.ndarray:
        work = on_device(buf)
        assert self.comm.recv(work, src) is work
        return back(work, buf)

    def barrier(self) -> None:
        self.comm.barrier()


def check_everywhere(comm: OnDevice, case: str, check: Callable[..., None],
                     **example: Any) -> None:
    """Run `cases.<case>` on every rank; rank 0 checks all the results with `check`."""
    results = MPI.COMM_WORLD.gather(getattr(cases, case)(comm, **example))
    if comm.rank == 0:
        wanted = inspect.signature(check).parameters
        try:
            check(results, **{k: v for k, v in example.items() if k in wanted})
        except AssertionError as error:
            raise AssertionError(f"{case} {example}: {error}") from None


def sweep(comm: OnDevice) -> int:
    """Every collective, dtype, op, count, layout and root against NumPy; the examples run."""
    examples = 0
    for dtype in cases.DTYPES:
        for count in COUNTS:
            all_reduce_kinds(comm, count, dtype)
            for op in cases.ops_for(dtype):
                check_everywhere(comm, "reduce_scatter_case", cases.check_reduce_scatter,
                                 count=count, dtype=dtype, op=op)
            for layout, given in LAYOUTS:
                check_everywhere(comm, "all_gather_case", cases.check_all_gather, count=count,
                                 dtype=dtype, layout=layout, given=given)
            for root in range(comm.size):
                check_everywhere(comm, "broadcast_case", cases.check_broadcast, count=count,
                                 dtype=dtype, layout=LAYOUTS[root % len(LAYOUTS)][0], root=root)
                check_everywhere(comm, "scatter_case", cases.check_scatter, count=count,
                                 dtype=dtype, root=root, given=root % 2 == 0)
                check_everywhere(comm, "gather_case", cases.check_gather, count=count,
                                 dtype=dtype, layout=LAYOUTS[root % len(LAYOUTS)][0], root=root,
                                 recv=("none", "given", "in place")[root % 3])
            if count in NEW_COUNTS:
                sweep_new(comm, count, dtype)
            examples += 1
    check_everywhere(comm, "barrier_case", lambda results: None)
    return examples


def all_reduce_kinds(comm: OnDevice, count: int, dtype: str) -> None:
    """All-reduce at one count and dtype: every op, layout, in place and not."""
    for op in cases.ops_for(dtype):
        for layout, in_place in LAYOUTS:
            check_everywhere(comm, "all_reduce_case", cases.check_all_reduce, count=count,
                             dtype=dtype, op=op, layout=layout, in_place=in_place)


def sweep_all_reduce(comm: OnDevice) -> int:
    """The all-reduce part of `sweep` alone."""
    for dtype in cases.DTYPES:
        for count in COUNTS:
            all_reduce_kinds(comm, count, dtype)
    return len(cases.DTYPES) * len(COUNTS)


def sweep_new(comm: OnDevice, count: int, dtype: str) -> None:
    """Reduce, all-to-all, scan, uneven blocks and point to point at one count and dtype."""
    size = comm.size
    for k, op in enumerate(cases.ops_for(dtype)):
        layout, in_place = LAYOUTS[k % len(LAYOUTS)]
        check_everywhere(comm, "reduce_case", cases.check_reduce, count=count, dtype=dtype,
                         op=op, layout=layout, root=k % size, in_place=in_place)
        for exclusive in (False, True):
            check_everywhere(comm, "scan_case", cases.check_scan, count=count, dtype=dtype,
                             op=op, layout="strided", in_place=exclusive, exclusive=exclusive)
    for layout, in_place in LAYOUTS:
        check_everywhere(comm, "all_to_all_case", cases.check_all_to_all, count=count,
                         dtype=dtype, layout=layout, in_place=in_place)
    counts = [(count + 3 * r) % (count + 1) for r in range(size)]  # uneven, some empty
    for collective in ("all_gather", "gather", "scatter", "reduce_scatter", "all_to_all"):
        check_everywhere(comm, "uneven_case", cases.check_uneven, collective=collective,
                         counts=counts, dtype=dtype, op=cases.ops_for(dtype)[0],
                         root=size - 1)
    check_everywhere(comm, "sendrecv_case", cases.check_sendrecv, count=count, dtype=dtype,
                     layout="strided", shift=1)
    check_everywhere(comm, "chain_case", cases.check_chain, count=count, dtype=dtype)


# ---- the scenarios ---------------------------------------------------------------------------

def collectives_scenario(transport: str) -> None:
    """The sweep with the transport's defaults, then with small segments and always the ring."""
    for options in ({}, {"segment_bytes": SMALL_SEGMENT, "one_shot_bytes": 0}):
        with collectives.init(transport, device="cuda", timeout=60, **options) as comm:
            assert (comm.transport, comm.device) == (transport, "cuda"), comm
            staged = getattr(comm._transport, "staged", None)
            examples = sweep(OnDevice(comm))
        if comm.rank == 0:
            print(f"collectives ok: {transport} {options or 'defaults'}, "
                  f"{examples} dtype x count sweeps, staged {staged}", flush=True)
    if transport != "cuda_ipc":
        return
    # On one GPU every all-reduce goes one-shot, here 4 KiB at a time: many pieces per call.
    with collectives.init(transport, device="cuda", timeout=60, one_shot_bytes=4096) as comm:
        assert comm._transport.one_shot_at_any_size, "the ranks share one GPU"
        examples = sweep_all_reduce(OnDevice(comm))
    if comm.rank == 0:
        print(f"all-reduce one-shot in pieces ok: {examples} dtype x count sweeps", flush=True)


# out[i] = value * i, once each thread has spun `cycles` clocks: an input written late.
SPIN_THEN_FILL = r"""
extern "C" __global__ void spin_then_fill(double* out, long long n, double value,
                                          long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        out[i] = value * i;
    }
}
"""


def lifecycle_scenario() -> None:
    """What is particular to cuda_ipc: devices, memory, handles, streams, threads, close."""
    import cupy

    from transports import cuda_ipc

    pool = cupy.get_default_memory_pool()
    pooled = pool.used_bytes()
    comm = collectives.init("auto", device="cuda", timeout=60)
    transport = comm._transport  # white box: what cuda_ipc holds, before and after close
    memory = transport.memory
    rank, size = comm.rank, comm.size
    assert comm.transport == "cuda_ipc" and comm.device == "cuda", comm
    count = cupy.cuda.runtime.getDeviceCount()
    assert cupy.cuda.Device().id == memory.gpu.id == rank % count
    # The slots and one-shot areas are one cudaMalloc, outside CuPy's pool.
    assert type(memory.own) is cupy.cuda.Memory, type(memory.own)
    # (What the communicator allocated while starting, and has freed, may stay cached in it.)
    assert pool.used_bytes() == pooled, "the transport holds memory from CuPy's pool"
    # Every peer's memory is mapped, and this rank's own is used directly.
    assert len(memory.opened) == size - 1
    assert transport._data[rank].data.ptr == memory.own.ptr
    # The control lines' host region is mapped, yet already unlinked.
    maps = open("/proc/self/maps").read()
    assert re.search(r"/dev/shm/ringcc-\w+ \(deleted\)", maps), maps

    try:
        comm.all_reduce(numpy.ones(3))
    except collectives.InvalidTypeError as error:
        assert "cupy" in str(error), error
    else:
        raise AssertionError("a NumPy array went through a cuda_ipc communicator")

    # Ordered on the caller's stream, whichever it is: a non-blocking one here, whose kernel
    # writes the input only after spinning some 20 ms; blocking, and queued on the progress
    # thread (which must take the caller's stream, not its own).
    expected = numpy.arange(1 << 20, dtype=numpy.float64) * (size * (size + 1) // 2)
    spin_then_fill = cupy.RawKernel(SPIN_THEN_FILL, "spin_then_fill")
    for async_op in (False, True):
        with cupy.cuda.Stream(non_blocking=True) as stream:
            work = cupy.zeros(1 << 20, dtype=cupy.float64)
            spin_then_fill((256,), (256,), (work, numpy.int64(work.size),
                                            numpy.float64(rank + 1), numpy.int64(40_000_000)))
            done = comm.all_reduce(work, work, async_op=async_op)
            assert (done.wait() if async_op else done) is work
            stream.synchronize()
            assert numpy.array_equal(work.get(), expected), f"async_op={async_op}"

    # From another thread, once it has made the communicator's GPU current (CUDA's current
    # device is per thread), as the trainer's communication thread does.
    result: list[Any] = []

    def on_thread() -> None:
        memory.gpu.use()
        result.append(comm.all_gather(cupy.full(5, rank, cupy.int32)).get())

    thread = threading.Thread(target=on_thread)
    thread.start()
    thread.join()
    assert numpy.array_equal(result[0], numpy.repeat(numpy.arange(size), 5).reshape(size, 5))
    assert comm.stats.bytes_sent > 0

    comm.close()
    assert memory.opened == [] and memory.own is None and not cuda_ipc._kept
    # Everything was released: a new communicator maps fresh memory and works.
    with collectives.init("cuda_ipc", timeout=60) as again:
        assert int(again.all_reduce(cupy.ones(7, cupy.int64)).sum()) == 7 * size
    print("lifecycle ok", flush=True)


def failure_scenario() -> None:
    """Rank 1 fails in the middle of an all-reduce: every rank raises, then closes cleanly."""
    import cupy

    comm = collectives.init("cuda_ipc", segment_bytes=SMALL_SEGMENT, one_shot_bytes=0, timeout=3)
    work = cupy.arange(1 << 16, dtype=cupy.float32)
    if comm.rank == 1:
        transfers = 0

        def fail_at_the_third(record: dict) -> None:
            nonlocal transfers
            transfers += 1  # one per ring step: 4 on 3 ranks
            if transfers == 3:
                raise RuntimeError("rank 1 fails on purpose")

        comm.on_transfer(fail_at_the_third)
    try:
        comm.all_reduce(work)
    except (RuntimeError, collectives.CollectiveError) as error:
        print(f"rank {comm.rank} raised {type(error).__name__}", flush=True)
    else:
        raise AssertionError("an all-reduce with a failing rank succeeded")
    comm.close()
    from transports import cuda_ipc

    assert not cuda_ipc._kept, "a peer did not come to close: its memory was kept"
    print("closed", flush=True)


def unavailable_scenario() -> None:
    """Without CuPy or a GPU, asking for one says which is missing; and the MPI library says
    whether it takes device memory."""
    for transport in ("cuda_ipc", "auto", "mpi"):
        try:
            collectives.init(transport, device="cuda")
        except collectives.CollectiveError as error:
            print(f"{transport}: {error}", flush=True)
        else:
            raise AssertionError(f"{transport} with device='cuda' opened without a GPU")
    mpi_library_scenario()


def mpi_library_scenario() -> None:
    """Whether the MPI library takes device memory, as found and as forced."""
    from transports.mpi import cuda_aware

    for forced in ("0", "1", None):
        if forced is None:
            os.environ.pop("RINGCC_MPI_CUDA", None)
        else:
            os.environ["RINGCC_MPI_CUDA"] = forced
        print(f"cuda_aware with RINGCC_MPI_CUDA={forced}: {cuda_aware(MPI.COMM_WORLD)}",
              flush=True)


SCENARIOS = {"collectives": collectives_scenario, "lifecycle": lifecycle_scenario,
             "failure": failure_scenario, "unavailable": unavailable_scenario,
             "mpi_library": mpi_library_scenario}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
