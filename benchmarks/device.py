"""Device buffers for the benchmarks, and the copy bandwidth that busbw is held against.

With `--device cuda` ringcc's communicators move CuPy arrays. The harness makes every buffer on
the host; an implementation that moves CuPy arrays gets copies of them on the device
(`mirror`), its clock stops only once the device has finished (`synchronize`), and its result
comes back to the host to be checked (`collectives.to_numpy`).

`--compare copy` adds `CopyPeer`: rank 0 copies a buffer of the same size while the other
ranks wait, so its row is the bandwidth of one plain copy on the device (the host's, with
`--device cpu`), measured in the same job as the collectives. `ceilings` closes the report
with each ringcc transport's busbw as a share of it, and the main transport's busbw over the
others' (cuda_ipc over the MPI transport staging through host memory, say):

    mpiexec -n 4 python -m benchmarks.all_reduce -b 1M -e 256M -f 4 \\
        --transport cuda_ipc,mpi --device cuda --compare copy
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy


def mirror(xp: ModuleType, send: numpy.ndarray, recv: numpy.ndarray,
           own: numpy.ndarray) -> tuple[Any, Any, Any]:
    """The harness's host buffers as arrays of `xp` (themselves for NumPy). A collective that
    works in place (recv is send) still does."""
    if xp is numpy:
        return send, recv, own
    on_device = xp.asarray(send)
    return on_device, on_device if recv is send else xp.asarray(recv), xp.asarray(own)


def synchronize(xp: ModuleType) -> None:
    """Wait until the device has done what was queued on this thread's stream (no-op on the
    host), so that a clock read next counts it."""
    if xp is not numpy:
        xp.cuda.get_current_stream().synchronize()


def versions(xp: ModuleType) -> dict[str, str]:
    """CuPy's version and the GPU's name, when the buffers are on a device."""
    if xp is numpy:
        return {}
    properties = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    return {"cupy": xp.__version__, "gpu": properties["name"].decode()}


class CopyPeer:
    """A plain copy of the call's largest buffer (the nccl-tests size) into one of its own.

    Only rank 0 copies; the other ranks return at once. The harness's time, the slowest rank's,
    is then that of one copy on a device (or host) that no other rank uses, and its algbw the
    copy bandwidth: bytes copied per second, each read once and written once. (CUDA's
    bandwidthTest counts both, reporting twice this.)
    """

    def __init__(self, xp: ModuleType, rank: int, size: int = 1) -> None:
        self.xp, self.rank, self.size = xp, rank, size
        self.target: Any = None

    def _copy(self, *buffers: Any) -> None:
        if self.rank != 0:
            return
        largest = max((b for b in buffers if b is not None), key=lambda b: b.nbytes)
        if self.target is None or self.target.shape != largest.shape \
                or self.target.dtype != largest.dtype:
            self.target = self.xp.empty_like(largest)
        self.xp.copyto(self.target, largest)  # cudaMemcpyAsync for CuPy's contiguous arrays

    def all_reduce(self, sendbuf: Any, recvbuf: Any, op: str = "sum") -> None:
        self._copy(sendbuf, recvbuf)

    def all_gather(self, sendbuf: Any, recvbuf: Any) -> None:
        self._copy(sendbuf, recvbuf)

    def broadcast(self, buf: Any, root: int = 0) -> None:
        self._copy(buf)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        self._copy(sendbuf, recvbuf)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: str = "sum") -> None:
        self._copy(sendbuf, recvbuf)

    def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        self._copy(sendbuf, recvbuf)

    def reduce(self, sendbuf: Any, recvbuf: Any, op: str = "sum", root: int = 0) -> None:
        self._copy(sendbuf, recvbuf)

    def all_to_all(self, sendbuf: Any, recvbuf: Any) -> None:
        self._copy(sendbuf, recvbuf)

    def scan(self, sendbuf: Any, recvbuf: Any, op: str = "sum") -> None:
        self._copy(sendbuf, recvbuf)

    def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int) -> None:
        self._copy(sendbuf, recvbuf)

    def close(self) -> None:
        self.target = None


def at_largest(rows: list[dict], impl: str) -> list[dict[str, dict]]:
    """For each (dtype, op) that `impl` was measured with, the rows at its largest size there,
    by implementation name: what a bound's closing line compares."""
    largest: dict[tuple[str, str], int] = {}
    for row in rows:
        if row["impl"] == impl:
            key = (row["dtype"], row["op"])
            largest[key] = max(largest.get(key, -1), row["bytes"])
    return [{row["impl"]: row for row in rows
             if (row["dtype"], row["op"], row["bytes"]) == (dtype, op, nbytes)}
            for (dtype, op), nbytes in largest.items()]


def ceilings(rows: list[dict], ringcc: list[str]) -> list[str]:
    """Closing lines, one per (dtype, op) with a copy row: at its largest size, the busbw of each
    of the `ringcc` implementations (main first) over the copy bandwidth, and the main one's
    busbw over each other's."""
    lines = []
    for at in at_largest(rows, "copy"):
        copy = at["copy"]
        busbw = {name: at[name]["busbw_GBps"] for name in ringcc if name in at}
        if not busbw:
            continue
        line = (f"# {copy['bytes']} B {copy['dtype']} {copy['op']}: busbw / copy bandwidth "
                f"({copy['algbw_GBps']:.2f} GB/s): "
                + ", ".join(f"{name} {value / copy['algbw_GBps']:.2f}"
                            for name, value in busbw.items()))
        main, *others = busbw
        if others:
            line += "; busbw " + ", ".join(f"{main} / {name} {busbw[main] / busbw[name]:.1f}x"
                                           for name in others)
        lines.append(line)
    return lines
