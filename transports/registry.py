"""Every transport, and what it serves: the one list that `init`, the benchmarks, the explainer
and the tests ask instead of naming transports themselves.

Adding a transport is its own file plus one line here. A transport's module is imported only
when that transport is used, so a transport's optional dependency (CuPy for cuda_ipc) is needed
only by those who use it.

A hierarchical transport is made of two others, each the one "auto" picks where its ranks
are: one among the ranks of each node, one among the ranks across nodes. `build` makes it
from them, so that it need not know any transport by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .base import Transport
from .errors import InvalidArgumentError

DEVICES = ("cpu", "cuda")  # "cpu": NumPy arrays; "cuda": CuPy arrays


@dataclass(frozen=True)
class TransportInfo:
    """What one transport serves, and where its class lives."""

    name: str
    module: str  # imported on first use
    cls: str
    devices: tuple[str, ...]  # the kinds of array it moves
    one_node: bool  # every rank must share memory with every other
    launched: bool = True  # its ranks are the processes of an MPI job (False: threads)
    # Made of a node transport and an across-nodes one; "auto" takes it only where the ranks
    # span nodes with as many, and more than one, on each.
    hierarchical: bool = False


# In order of preference: "auto" takes the first that serves the device where the ranks are.
TRANSPORTS = {info.name: info for info in (
    TransportInfo("shm", "transports.shm", "ShmTransport", ("cpu",), one_node=True),
    TransportInfo("cuda_ipc", "transports.cuda_ipc", "CudaIpcTransport", ("cuda",),
                  one_node=True),
    TransportInfo("hierarchical", "transports.hierarchical", "HierarchicalTransport",
                  ("cpu", "cuda"), one_node=False, hierarchical=True),
    TransportInfo("mpi", "transports.mpi", "MPITransport", ("cpu", "cuda"), one_node=False),
    TransportInfo("threads", "transports.threads", "ThreadTransport", ("cpu",), one_node=True,
                  launched=False),
)}


def names(device: str | None = None, launched: bool = True) -> list[str]:
    """The transports that move `device`'s arrays (any device if None), in order of preference;
    by default those an MPI job can choose (not the in-process threads)."""
    return [info.name for info in TRANSPORTS.values()
            if info.launched == launched and (device is None or device in info.devices)]


def info(name: str) -> TransportInfo:
    """What `name` serves; InvalidArgumentError naming the choices if there is no such one."""
    if name not in TRANSPORTS:
        raise InvalidArgumentError(f"unknown transport {name!r}; expected one of "
                                   f"{', '.join(['auto', *names()])}")
    return TRANSPORTS[name]


def choose(device: str, ranks_per_node: list[int]) -> str:
    """What transport="auto" picks: the first that moves `device`'s arrays where the ranks are,
    given how many ranks each node holds."""
    one_node = len(ranks_per_node) == 1
    shared = not one_node and len(set(ranks_per_node)) == 1 and ranks_per_node[0] > 1
    return next(name for name in names(device)
                if (one_node or not TRANSPORTS[name].one_node)
                and (shared or not TRANSPORTS[name].hierarchical))


def build(name: str, comm: Any, *, device: str, **options: Any) -> Transport:
    """Transport `name` over the ranks of `comm` (an mpi4py communicator), with `options` (those
    of `collectives.init`): how `init` makes one. Collective."""
    kind = load(name)
    if not TRANSPORTS[name].hierarchical:
        return kind(comm, device=device, **options)
    return kind.over(comm, local=load(choose(device, [1])), flat=load(choose(device, [1, 1])),
                     device=device, **options)


def load(name: str) -> type[Transport]:
    """The class of transport `name`, its module imported now."""
    entry = info(name)
    return getattr(importlib.import_module(entry.module), entry.cls)
