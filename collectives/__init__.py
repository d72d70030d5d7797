"""ringcc's collectives: ring all-reduce, all-gather, broadcast, scatter, reduce-scatter,
gather, reduce, all-to-all and scan, uneven blocks (`counts=`), and send, recv and sendrecv.

    import collectives, numpy as np
    comm = collectives.init()                  # under mpiexec
    total = comm.all_reduce(np.arange(4.0) * comm.rank)

    work = comm.all_reduce(np.ones(3), async_op=True)   # returns at once: a Work
    total = work.wait()

    collectives.spawn(lambda comm: comm.all_reduce(np.ones(3)), 4)   # 4 thread ranks
"""

from __future__ import annotations

from typing import Any

from transports import registry
from transports.errors import (CollectiveError, CollectiveTimeoutError, InvalidArgumentError,
                               InvalidTypeError, MismatchError, PeerFailedError, TimeoutError)

from .arrays import array_module_of, module_for_device, to_numpy
from .chunking import chunk_bounds
from .communicator import ALL_REDUCE_ALGORITHMS, Communicator
from .job import guard_job
from .ops import OPS
from .spawn import spawn
from .work import Work

TRANSPORTS = ("auto", *registry.names())  # what `init` takes, from the transport registry
DEVICES = registry.DEVICES

__all__ = ["init", "spawn", "Communicator", "Work", "chunk_bounds", "array_module_of",
           "module_for_device", "to_numpy", "OPS",
           "TRANSPORTS", "DEVICES", "ALL_REDUCE_ALGORITHMS", "CollectiveError",
           "CollectiveTimeoutError", "InvalidArgumentError", "InvalidTypeError",
           "MismatchError", "PeerFailedError", "TimeoutError"]


def _device_for(transport: str, device: str | None) -> str:
    """The device `init` serves: `device`, else the transport's first; InvalidArgumentError
    for a transport or device that is not one, or not one together."""
    if transport not in TRANSPORTS:
        raise InvalidArgumentError(f"unknown transport {transport!r}; expected one of "
                                   f"{', '.join(TRANSPORTS)} (use collectives.spawn for threads)")
    if device is None:
        device = "cpu" if transport == "auto" else registry.info(transport).devices[0]
    if device not in DEVICES:
        raise InvalidArgumentError(f"unknown device {device!r}; expected one of "
                                   f"{', '.join(DEVICES)}")
    if transport != "auto" and device not in registry.info(transport).devices:
        serving = ", ".join(["auto", *registry.names(device)])
        raise InvalidArgumentError(f"the {transport} transport does not move {device} arrays; "
                                   f"for device={device!r} use one of {serving}")
    return device


def _agree_on_settings(said: list[tuple[str, str, int | None, str | None]]) -> None:
    """Raise the same InvalidArgumentError on every rank if any rank's settings were bad
    (`said[rank]`: transport, device, node_size, and what was wrong, or None), or if ranks
    differ in them."""
    for rank, (*_, problem) in enumerate(said):
        if problem is not None:
            raise InvalidArgumentError(f"rank {rank}: {problem}")
    for index, name in enumerate(("transport", "device", "node_size (or $RINGCC_NODE_SIZE)")):
        values = [setting[index] for setting in said]
        if len(set(values)) > 1:
            raise InvalidArgumentError(
                f"{name} must be the same on every rank; got, by rank: "
                + ", ".join(f"{rank}: {value!r}" for rank, value in enumerate(values)))


def init(transport: str = "auto", comm: Any = None, *, device: str | None = None,
         segment_bytes: int | None = None, one_shot_bytes: int | None = None,
         timeout: float | None = None, trace: bool = False, check: bool | None = None,
         node_size: int | None = None) -> Communicator:
    """A Communicator over the ranks of `comm` (an mpi4py communicator, default COMM_WORLD).

    transport: "shm" is shared memory among ranks on one node, "cuda_ipc" device memory
        shared among ranks on one node through CUDA IPC, "mpi" point-to-point MPI,
        "hierarchical" shm or cuda_ipc inside each node and mpi between nodes (every node
        must hold as many ranks); "auto" picks the first of these that moves the device's
        arrays where the ranks are: shm for "cpu" and cuda_ipc for "cuda" on one node,
        hierarchical on several nodes with as many ranks, more than one, on each, else mpi
        (see transports/registry.py).
    device: the arrays the communicator moves: "cpu" NumPy arrays, "cuda" CuPy arrays, on
        the process's GPU: (its rank on its node in the first communicator on a GPU) mod
        (GPUs), kept for every later communicator (the mpi transport stages
        them through pinned host memory unless the MPI library takes device memory). Default:
        "cuda" for transport "cuda_ipc", else "cpu". "auto" never picks the device itself: a
        communicator moves one kind of array, fixed here, before it sees any.
    segment_bytes: how large messages are cut for pipelining (also bounds scratch memory).
    one_shot_bytes: buffers (or blocks) up to this size make one exchange instead of the
        step-by-step algorithm, in every collective but scatter, and in the small-call lanes
        (default: the transport's measured crossover, or $RINGCC_ONE_SHOT_BYTES; 0: never).
    timeout: seconds any wait may last (default 300, or $RINGCC_TIMEOUT).
    trace: record every transfer from the start (see `Communicator.trace`).
    check: compare every call across ranks before data moves (default on; $RINGCC_CHECK=0).
    node_size: cut each host's ranks into virtual nodes of this many consecutive ranks, so
        that one host stands for several (default $RINGCC_NODE_SIZE, else the real nodes).

    In a job of several processes it also makes an uncaught exception abort the job (see job.py).
    """
    from mpi4py import MPI

    from transports.base import configured
    from transports.bootstrap import nodes, virtual_node_size

    guard_job()
    comm = comm if comm is not None else MPI.COMM_WORLD
    # Every rank checks what it was given (arguments and $RINGCC_*), then all compare, before
    # anything collective depends on it: a rank alone with a bad or different setting would
    # leave the others waiting in a collective it never makes.
    problem = None
    try:
        device = _device_for(transport, device)
        node_size = virtual_node_size(node_size)
        configured(segment_bytes, one_shot_bytes, timeout)
    except ValueError as error:
        problem = str(error)
    _agree_on_settings(comm.allgather((transport, device, node_size, problem)))
    if transport == "auto":
        node = nodes(comm, node_size)
        transport = registry.choose(device, [node.count(n) for n in range(max(node) + 1)])
    return Communicator(registry.build(transport, comm, device=device, node_size=node_size,
                                       segment_bytes=segment_bytes,
                                       one_shot_bytes=one_shot_bytes, timeout=timeout),
                        trace=trace, check=check)
