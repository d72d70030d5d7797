"""Every transport, and what it serves: the one list that `init`, the benchmarks, the explainer
and the tests ask instead of naming transports themselves.

Adding a transport is its own file plus one line here. A transport's module is imported only
when that transport is used, so a transport's optional dependency (CuPy for cuda_ipc) is needed
only by those who use it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

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


# In order of preference: "auto" takes the first that serves the device where the ranks are.
TRANSPORTS = {info.name: info for info in (
    TransportInfo("shm", "transports.shm", "ShmTransport", ("cpu",), one_node=True),
    TransportInfo("cuda_ipc", "transports.cuda_ipc", "CudaIpcTransport", ("cuda",),
                  one_node=True),
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


def choose(device: str, one_node: bool) -> str:
    """What transport="auto" picks: the first that moves `device`'s arrays where the ranks are."""
    return next(name for name in names(device) if one_node or not TRANSPORTS[name].one_node)


def load(name: str) -> type[Transport]:
    """The class of transport `name`, its module imported now."""
    entry = info(name)
    return getattr(importlib.import_module(entry.module), entry.cls)
