"""What is measured: ringcc on each transport asked for, and the peers it is held against.

Every implementation offers the Communicator's collective methods on the harness's buffers:

- ringcc: a Communicator from `collectives.init`, one per --transport (the first is the main one);
- mpi: the MPI library's own collectives through mpi4py (`MPIPeer`);
- gloo: torch.distributed with the Gloo backend (`GlooPeer`), when torch is installed;
- torch-ringcc: torch.distributed on ringcc's own backend (`TorchRingccPeer`): the cost of the
  torch layer over ringcc's call;
- algorithm:<name>: the main transport's all_reduce with that algorithm (`AlgorithmPeer`,
  --algorithms), beside `auto`'s choice;
- copy: a plain copy of the same size on the device (`device.CopyPeer`), the copy bandwidth;
- memory: the least memory work of the call on every rank at once (`MemoryPeer`), the memory
  bound.

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

    name: str  # "ringcc:<transport>", "mpi", "gloo", "torch-ringcc", "copy" or "memory"
    comm: Any
    dtypes: tuple[str, ...] = DTYPES
    xp: ModuleType = numpy  # the arrays it moves: the harness's host buffers, or device copies
    reference: bool = False  # a bound (copy, memory), not the collective: unchecked, busbw = algbw
    registered: dict[str, Any] | None = None  # --registered 1: flat bytes per role, see `register`
    in_place: tuple[str, ...] = ()  # collectives it makes in place: see `measure.own_buffers`

    def can(self, collective: str, dtype: str) -> bool:
        """Whether it has the collective (a method of that name, and offered on its device) and
        moves `dtype`."""
        offered = getattr(self.comm, "offered", None)
        return hasattr(self.comm, collective) and dtype in self.dtypes \
            and (offered is None or collective in offered)


class MPIPeer:
    """The MPI library's own collectives, through mpi4py's buffer methods on a Dup'd
    communicator (so no message can match ringcc's or the harness's)."""

    def __init__(self, world: MPI.Comm) -> None:
        from mpi4py import MPI

        self.comm = world.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                    "avg": MPI.SUM}

    def _average(self, buf: numpy.ndarray, op: str, ranks: int | None = None) -> None:
        if op == "avg":  # MPI has no average: sum, then divide once, as ringcc does
            numpy.divide(buf, ranks or self.size, out=buf)

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

    def gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        self.comm.Gather(sendbuf, recvbuf, root)

    def reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum",
               root: int = 0) -> None:
        self.comm.Reduce(sendbuf, recvbuf, self.ops[op], root)
        if self.rank == root:
            self._average(recvbuf, op)

    def all_to_all(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self.comm.Alltoall(sendbuf, recvbuf)

    def scan(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        self.comm.Scan(sendbuf, recvbuf, self.ops[op])
        self._average(recvbuf, op, self.rank + 1)

    def sendrecv(self, sendbuf: numpy.ndarray, dst: int, recvbuf: numpy.ndarray,
                 src: int) -> None:
        self.comm.Sendrecv(sendbuf, dst, recvbuf=recvbuf, source=src)

    def send(self, buf: numpy.ndarray, dst: int) -> None:
        self.comm.Send(buf, dst)

    def recv(self, buf: numpy.ndarray, src: int) -> None:
        self.comm.Recv(buf, src)

    def close(self) -> None:
        self.comm.Free()


class AlgorithmPeer:
    """ringcc's all_reduce on `comm` (the main transport's communicator) with one named
    algorithm (`Communicator.all_reduce`'s `algorithm`)."""

    offered = ("all_reduce",)

    def __init__(self, comm: Any, algorithm: str) -> None:
        self.comm, self.algorithm = comm, algorithm

    def all_reduce(self, sendbuf: Any, recvbuf: Any, op: str = "sum") -> None:
        self.comm.all_reduce(sendbuf, recvbuf, op=op, algorithm=self.algorithm)

    def close(self) -> None:
        """(The main transport's communicator closes with it.)"""


class TorchPeer:
    """torch.distributed's calls on one process group (`group`; None: the default one), on
    tensors that share the harness's buffers: NumPy ones, or CuPy ones (through DLPack) when
    `xp` is CuPy. Roots are group ranks (group_src=, group_dst=).

    torch.distributed reduces in place, so the harness hands its all_reduce and reduce one
    buffer (`in_place`): the time is the call's alone, without a copy of the input first.
    """

    dtypes = DTYPES
    in_place = ("all_reduce", "reduce")
    offered: tuple[str, ...] | None = None  # the collectives it makes, if not all it has

    def __init__(self, group: Any, rank: int, size: int, xp: ModuleType = numpy) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group = torch, dist, group
        self.rank, self.size, self.xp = rank, size, xp
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
                    "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
        # The names of torch >= 2.13, else the older ones.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                                or dist.reduce_scatter_tensor)

    def _rows(self, buf: Any) -> Any:
        """A tensor over `buf`'s memory, its shape kept."""
        return self.torch.from_numpy(buf) if self.xp is numpy else self.torch.from_dlpack(buf)

    def _tensor(self, buf: Any) -> Any:
        return self._rows(buf).reshape(-1)

    def all_reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        if recvbuf is not sendbuf:
            self.xp.copyto(recvbuf, sendbuf)
        self.dist.all_reduce(self._tensor(recvbuf), op=self.ops[op], group=self.group)

    def all_gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self._all_gather(self._tensor(recvbuf), self._tensor(sendbuf), group=self.group)

    def broadcast(self, buf: numpy.ndarray, root: int = 0) -> None:
        self.dist.broadcast(self._tensor(buf), group=self.group, group_src=root)

    def scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        blocks = list(self._rows(sendbuf)) if self.rank == root else None
        self.dist.scatter(self._tensor(recvbuf), blocks, group=self.group, group_src=root)

    def reduce_scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray,
                       op: str = "sum") -> None:
        self._reduce_scatter(self._tensor(recvbuf), self._tensor(sendbuf), op=self.ops[op],
                             group=self.group)

    def gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        rows = list(self._rows(recvbuf)) if self.rank == root else None
        self.dist.gather(self._tensor(sendbuf), rows, group=self.group, group_dst=root)

    def reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum",
               root: int = 0) -> None:
        if recvbuf is not sendbuf:
            self.xp.copyto(recvbuf, sendbuf)
        self.dist.reduce(self._tensor(recvbuf), op=self.ops[op], group=self.group,
                         group_dst=root)

    def all_to_all(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self.dist.all_to_all_single(self._tensor(recvbuf), self._tensor(sendbuf),
                                    group=self.group)

    def send(self, buf: numpy.ndarray, dst: int) -> None:
        self.dist.send(self._tensor(buf), dst, group=self.group)

    def recv(self, buf: numpy.ndarray, src: int) -> None:
        self.dist.recv(self._tensor(buf), src, group=self.group)


class GlooPeer(TorchPeer):
    """torch.distributed with the Gloo backend, as the default process group, on CPU tensors,
    or on CUDA ones with `device="cuda"` (Gloo copies them through host memory; it all-reduces
    and broadcasts them, and nothing else).

    Rank and size come from MPI; rank 0 opens a TCP store (on 127.0.0.1 when every rank runs
    on one host) and broadcasts its port over MPI.
    """

    dtypes = tuple(d for d in DTYPES if d not in ("uint32", "uint64"))  # Gloo has neither

    def __init__(self, world: MPI.Comm, device: str = "cpu") -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # ranks share the cores
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
        xp = module_for_device(device)
        super().__init__(None, rank, size, xp)
        if device == "cuda":
            torch.cuda.set_device(xp.cuda.Device().id)  # the GPU ringcc gives this rank
            self.offered = ("all_reduce", "broadcast")

    def sendrecv(self, sendbuf: numpy.ndarray, dst: int, recvbuf: numpy.ndarray,
                 src: int) -> None:
        sends = [self.dist.isend(self._tensor(sendbuf), dst),
                 self.dist.irecv(self._tensor(recvbuf), src)]
        for request in sends:
            request.wait()

    def close(self) -> None:
        self.dist.destroy_process_group()


class TorchRingccPeer(TorchPeer):
    """torch.distributed's calls on the ringcc backend (`collectives.torch.process_group`) over
    a communicator of its own on the main transport (on `device`): beside ringcc's own call,
    the cost of the torch layer."""

    def __init__(self, transport: str, device: str = "cpu") -> None:
        import torch

        import collectives.torch

        torch.set_num_threads(1)  # ranks share the cores
        self.comm = collectives.init(transport, device=device)
        super().__init__(collectives.torch.process_group(self.comm), self.comm.rank,
                         self.comm.size, module_for_device(device))

    def sendrecv(self, sendbuf: numpy.ndarray, dst: int, recvbuf: numpy.ndarray,
                 src: int) -> None:
        # A rank's calls run in order, one after another, and a send waits for its receiver:
        # round a ring, every rank sending first would wait for ever. Even ranks send first and
        # odd ones receive first (with an odd count ranks n-1 and 0 both send first, and the
        # chain still unwinds from rank 1, which receives). The group's own send and recv,
        # as torch.distributed's functions make them: dist.recv names the sender by its
        # global rank, which only a group made by dist.new_group has.
        sent, received = [self._tensor(sendbuf)], [self._tensor(recvbuf)]
        if self.rank % 2 == 0:
            self.group.send(sent, dst, 0).wait()
            self.group.recv(received, src, 0).wait()
        else:
            self.group.recv(received, src, 0).wait()
            self.group.send(sent, dst, 0).wait()

    def send(self, buf: numpy.ndarray, dst: int) -> None:
        self.group.send([self._tensor(buf)], dst, 0).wait()  # (the group's own: see sendrecv)

    def recv(self, buf: numpy.ndarray, src: int) -> None:
        self.group.recv([self._tensor(buf)], src, 0).wait()

    def close(self) -> None:
        self.comm.close()


class MemoryPeer:
    """The memory bound: the least memory work of the call on one node with shared memory, done
    by every rank at once on buffers of its own (none left in cache by the call timed before).

    What each rank does for a call of S bytes (the nccl-tests size) on n ranks:

        all_reduce      reduce its S/n share of the n inputs (the first add writing the
                        result), then copy the other (n-1)/n S of the result
        all_gather      copy S: the whole result written
        broadcast       copy S on every rank but the root, whose buffer already holds it
        scatter         copy S/n: the rank's block written
        reduce_scatter  reduce its block of S/n from the n inputs (the first add writing it)
        gather          copy S at the root: the whole result written; nothing elsewhere
        reduce          reduce its S/n share of the n inputs; the root then copies the other
                        (n-1)/n S of the result
        all_to_all      copy S: the whole result written
        scan            rank r reduces the r+1 inputs of ranks 0..r (the first add writing S)
        sendrecv        copy S: the message written into place

    That is what a rank must at least read and write when it can read its peers' memory in
    place: no algorithm moves less. The add is numpy.add whatever the op: other ops move the
    same bytes.
    """

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.buffers: dict[str, numpy.ndarray] = {}

    def _buffer(self, name: str, shape: tuple[int, ...], like: numpy.ndarray) -> numpy.ndarray:
        """This rank's own buffer `name`, made at the first call of a size, then reused."""
        buffer = self.buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype:
            self.buffers.pop(name, None)  # let the last size's buffer go before the next one
            buffer = self.buffers[name] = numpy.ones(shape, like.dtype)  # no page faults later
        return buffer

    def _work(self, like: numpy.ndarray, reduced: int, copied: int,
              inputs: int | None = None) -> None:
        """Reduce `inputs` (default n) blocks of `reduced` elements into one, then copy `copied`
        elements."""
        if reduced:
            inputs = self._buffer("inputs", (inputs or self.size, reduced), like)
            out = self._buffer("reduced", (reduced,), like)
            if len(inputs) == 1:
                numpy.copyto(out, inputs[0])
            else:
                numpy.add(inputs[0], inputs[1], out=out)
            for block in inputs[2:]:
                numpy.add(out, block, out=out)
        if copied:
            numpy.copyto(*self._buffer("copied", (2, copied), like))

    def all_reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        share = -(-recvbuf.size // self.size)
        self._work(recvbuf, share, recvbuf.size - share)

    def all_gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self._work(recvbuf, 0, recvbuf.size)

    def broadcast(self, buf: numpy.ndarray, root: int = 0) -> None:
        if self.rank != root:
            self._work(buf, 0, buf.size)

    def scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        self._work(recvbuf, 0, recvbuf.size)

    def reduce_scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray,
                       op: str = "sum") -> None:
        self._work(recvbuf, recvbuf.size, 0)

    def gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        if self.rank == root:
            self._work(recvbuf, 0, recvbuf.size)

    def reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum",
               root: int = 0) -> None:
        share = -(-recvbuf.size // self.size)
        self._work(recvbuf, share, recvbuf.size - share if self.rank == root else 0)

    def all_to_all(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self._work(recvbuf, 0, recvbuf.size)

    def scan(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        self._work(recvbuf, recvbuf.size, 0, inputs=self.rank + 1)

    def sendrecv(self, sendbuf: numpy.ndarray, dst: int, recvbuf: numpy.ndarray,
                 src: int) -> None:
        self._work(recvbuf, 0, recvbuf.size)

    def close(self) -> None:
        self.buffers = {}


def memory_bounds(rows: list[dict], ringcc: list[str]) -> list[str]:
    """Closing lines, one per (dtype, op) with a memory row: at its largest size, the time of
    each of the `ringcc` implementations (main first) as a multiple of the memory bound's."""
    lines = []
    for at in device.at_largest(rows, "memory"):
        bound = at["memory"]
        measured = [name for name in ringcc if name in at]
        if measured:
            lines.append(f"# {bound['bytes']} B {bound['dtype']} {bound['op']}: time / memory "
                         f"bound ({bound['time_us']:.2f} us): "
                         + ", ".join(f"{name} {at[name]['time_us'] / bound['time_us']:.2f}x"
                                     for name in measured))
    return lines


def register(impls: list[Impl], nbytes: dict[str, int]) -> None:
    """Give each ringcc implementation one buffer per role ("send", "recv") of nbytes[role]
    bytes from its `comm.empty`: registered memory, whose front every size measured is a view
    of (`measure.place`). Collective: every rank registers the same sizes in the same order.
    The peers keep ordinary buffers."""
    for impl in impls:
        if impl.name.startswith("ringcc:"):
            impl.registered = {role: impl.comm.empty(size, numpy.uint8)
                               for role, size in nbytes.items()}


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
    impls += [Impl(f"algorithm:{algorithm}", AlgorithmPeer(impls[0].comm, algorithm),
                   xp=impls[0].xp) for algorithm in args.algorithms]
    for peer in args.compare:
        if peer in ("gloo", "torch-ringcc"):
            try:
                import torch.distributed
            except ImportError:
                notes.append(f"{peer}: torch is not installed here (pip install torch); "
                             f"the {peer} peer is skipped")
                continue
            if peer == "gloo" and not torch.distributed.is_gloo_available():
                notes.append("gloo: this torch has no Gloo backend; the gloo peer is skipped")
                continue
            comm = GlooPeer(world, args.device) if peer == "gloo" else \
                TorchRingccPeer(args.transport[0], args.device)
        elif peer == "copy":
            comm = device.CopyPeer(module_for_device(args.device), world.Get_rank(),
                                   world.Get_size())
        elif peer == "memory":
            comm = MemoryPeer(world.Get_rank(), world.Get_size())
        else:
            comm = MPIPeer(world)
        stack.callback(comm.close)
        impls.append(Impl(peer, comm, getattr(comm, "dtypes", DTYPES), getattr(comm, "xp", numpy),
                          reference=peer in ("copy", "memory"),
                          in_place=getattr(comm, "in_place", ())))
    return impls, notes

