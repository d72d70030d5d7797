"""What is measured: ringcc on each transport asked for, and the peers it is held against.

Every implementation offers the Communicator's collective methods on the harness's buffers:

- ringcc: a Communicator from `collectives.init`, one per --transport (the first is the main one);
- mpi: the MPI library's own collectives through mpi4py (`MPIPeer`);
- gloo: torch.distributed with the Gloo backend (`GlooPeer`), when torch is installed;
- copy: a plain copy of the same size on the device (`device.CopyPeer`), the copy bandwidth.

mpi4py and torch are imported where they are used, so that importing this module starts neither.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy

import collectives
from collectives import module_for_device

from . import device
from .options import DTYPES

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass
class Impl:
    """One implementation: `comm` offers the Communicator's collective methods and close()."""

    name: str  # "ringcc:<transport>", "mpi", "gloo" or "copy"
    comm: Any
    dtypes: tuple[str, ...] = DTYPES
    xp: ModuleType = numpy  # the arrays it moves: the harness's host buffers, or device copies
    reference: bool = False  # a plain copy, not the collective: unchecked, and busbw = algbw


class MPIPeer:
    """The MPI library's own collectives, through mpi4py's buffer methods on a Dup'd
    communicator (so no message can match ringcc's or the harness's)."""

    def __init__(self, world: MPI.Comm) -> None:
        from mpi4py import MPI

        self.comm = world.Dup()
        self.size = self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                    "avg": MPI.SUM}

    def _average(self, buf: numpy.ndarray, op: str) -> None:
        if op == "avg":  # MPI has no average: sum, then divide once, as ringcc does
            numpy.divide(buf, self.size, out=buf)

    def all_reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        self.comm.Allreduce(sendbuf, recvbuf, self.ops[op])
        self._average(recvbuf, op)

    def all_gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self.comm.Allgather(sendbuf, recvbuf)

    def broadcast(self, buf: numpy.ndarray, root: int = 0) -> None:
        self.comm.Bcast(buf, root)

    def scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        self.comm.Scatter(sendbuf, recvbuf, root)

    def reduce_scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray,
                       op: str = "sum") -> None:
        self.comm.Reduce_scatter_block(sendbuf, recvbuf, self.ops[op])
        self._average(recvbuf, op)

    def close(self) -> None:
        self.comm.Free()


class GlooPeer:
    """torch.distributed with the Gloo backend, on tensors that share the NumPy buffers.

    Rank and size come from MPI; rank 0 opens a TCP store (on 127.0.0.1 when every rank runs
    on one host) and broadcasts its port over MPI.
    """

    dtypes = tuple(d for d in DTYPES if d not in ("uint32", "uint64"))  # Gloo has neither

    def __init__(self, world: MPI.Comm) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # ranks share the cores
        self.torch, self.dist = torch, dist
        rank, size = world.Get_rank(), world.Get_size()
        hosts = world.allgather(platform.node())
        address = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
        store = dist.TCPStore(address, 0, size, is_master=True, wait_for_workers=False) \
            if rank == 0 else None
        port = world.bcast(store.port if rank == 0 else None, root=0)
        if rank != 0:
            store = dist.TCPStore(address, port, size, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                                timeout=timedelta(seconds=300))
        self.rank = rank
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
                    "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
        # The names of torch >= 2.13, else the older ones.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                                or dist.reduce_scatter_tensor)

    def _tensor(self, buf: numpy.ndarray) -> Any:
        return self.torch.from_numpy(buf).reshape(-1)

    def all_reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        numpy.copyto(recvbuf, sendbuf)  # Gloo reduces in place
        self.dist.all_reduce(self._tensor(recvbuf), op=self.ops[op])

    def all_gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self._all_gather(self._tensor(recvbuf), self._tensor(sendbuf))

    def broadcast(self, buf: numpy.ndarray, root: int = 0) -> None:
        self.dist.broadcast(self._tensor(buf), src=root)

    def scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        blocks = list(self.torch.from_numpy(sendbuf)) if self.rank == root else None
        self.dist.scatter(self._tensor(recvbuf), blocks, src=root)

    def reduce_scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray,
                       op: str = "sum") -> None:
        self._reduce_scatter(self._tensor(recvbuf), self._tensor(sendbuf), op=self.ops[op])

    def close(self) -> None:
        self.dist.destroy_process_group()


def open_impls(args: argparse.Namespace, world: MPI.Comm,
               stack: contextlib.ExitStack) -> tuple[list[Impl], list[str]]:
    """ringcc on each --transport (main first), then each --compare peer; and notes on peers
    that cannot be had. Raises LookupError when ringcc lacks a transport asked for."""
    impls, notes = [], []
    for transport in args.transport:
        try:
            comm = stack.enter_context(collectives.init(transport, device=args.device))
        except collectives.CollectiveError as error:
            raise LookupError(f"ringcc cannot open the {transport!r} transport here: {error}")
        name = f"ringcc:{comm.transport}"
        if any(impl.name == name for impl in impls):
            raise LookupError(f"--transport {','.join(args.transport)} measures {name} twice")
        impls.append(Impl(name, comm, xp=module_for_device(args.device)))
    for peer in args.compare:
        if peer == "gloo":
            try:
                import torch.distributed
            except ImportError:
                notes.append("gloo: torch is not installed here (pip install torch); "
                             "the gloo peer is skipped")
                continue
            if not torch.distributed.is_gloo_available():
                notes.append("gloo: this torch has no Gloo backend; the gloo peer is skipped")
                continue
            comm = GlooPeer(world)
        elif peer == "copy":
            xp = module_for_device(args.device)
            comm = device.CopyPeer(xp, world.Get_rank())
            stack.callback(comm.close)
            impls.append(Impl(peer, comm, xp=xp, reference=True))
            continue
        else:
            comm = MPIPeer(world)
        stack.callback(comm.close)
        impls.append(Impl(peer, comm, getattr(comm, "dtypes", DTYPES)))
    return impls, notes

