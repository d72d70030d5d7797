"""The CuPy helpers of the transports that move device arrays (cuda_ipc, and mpi when staged).

CuPy is optional: this module imports without it, and `require_cupy` says what is missing
when a caller asks for the GPU.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy
from mpi4py import MPI

from .base import buffer_address
from .bootstrap import local_rank
from .errors import CollectiveError

try:
    import cupy
    import cupyx
except ImportError:
    cupy = cupyx = None


def require_cupy() -> ModuleType:
    """CuPy, once it is known to see a GPU; a CollectiveError that says what is missing if not."""
    if cupy is None:
        raise CollectiveError("device='cuda' needs CuPy, which is not installed here: "
                              "pip install 'ringcc[cuda12]' (or cuda13)")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise CollectiveError(f"device='cuda' needs a CUDA GPU, but CuPy finds none here "
                              f"({error})") from None
    if count == 0:
        raise CollectiveError("device='cuda' needs a CUDA GPU, but CuPy finds none here")
    return cupy


_gpu: int | None = None  # this process's GPU, once its first communicator on one chose it


def use_gpu(comm: MPI.Comm) -> ModuleType:
    """CuPy, with this process's GPU made current on this thread. Collective.

    The first communicator on the GPU chooses it: (this rank's place on its node in `comm`)
    mod (GPUs). Every later one keeps it, since a communicator over other ranks (a subgroup,
    the parts of the hierarchical transport, one rank per node) would count places anew and
    move the process, with the arrays it already has, to another GPU."""
    global _gpu
    cp = require_cupy()
    place = local_rank(comm)  # (on every rank of `comm`, chosen or not: it is collective)
    if _gpu is None:
        _gpu = place % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(_gpu).use()
    return cp


def copy_bytes(dst: Any, src: Any) -> None:
    """Copy contiguous `src` into `dst` (of as many bytes), each on the host or a device, on the
    current stream; complete when it returns."""
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memcpyAsync(buffer_address(dst), buffer_address(src), dst.nbytes,
                                  cupy.cuda.runtime.memcpyDefault, stream.ptr)
    stream.synchronize()


def pinned_empty(nbytes: int) -> numpy.ndarray:
    """`nbytes` of page-locked host memory as a NumPy array: the GPU copies it by DMA."""
    return cupyx.empty_pinned(nbytes, numpy.uint8)
