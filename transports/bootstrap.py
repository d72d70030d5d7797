"""What every transport of a real job does over MPI before any data moves.

The transports that run under `mpiexec` (mpi, shm, cuda_ipc) start the same way: take a `Dup`
of the caller's communicator (so their messages can never match the caller's own), learn which
ranks share this node, agree that every rank chose the same options, and, when ranks outnumber
cores, stop spinning before a wait yields the CPU. These helpers do each of those once, for all
of them; a transport imports them and nothing from another transport.

Nodes are MPI's shared split, or virtual nodes of `node_size` consecutive ranks
(`init(node_size=k)`, `$RINGCC_NODE_SIZE`) where one host stands for several: every notion of
which ranks share a node follows them. Cores and GPUs are still counted on the real node.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from mpi4py import MPI

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .base import Transport


@contextmanager
def duplicated(comm: MPI.Comm | None) -> Iterator[MPI.Comm]:
    """A `Dup` of `comm` (default `MPI.COMM_WORLD`), freed again if the block raises.

    A transport builds itself inside the block: a constructor that fails leaves no
    communicator behind.
    """
    dup = (comm if comm is not None else MPI.COMM_WORLD).Dup()
    try:
        yield dup
    except BaseException:
        dup.Free()
        raise


@contextmanager
def node_of(comm: MPI.Comm, node_size: int | None = None) -> Iterator[MPI.Comm]:
    """The ranks of `comm` that share memory with this one (MPI's shared split), freed after;
    with `node_size` k, the k consecutive ranks of that split this one falls among (a virtual
    node)."""
    node = split_node(comm, node_size)
    try:
        yield node
    finally:
        node.Free()


def split_node(comm: MPI.Comm, node_size: int | None = None) -> MPI.Comm:
    """`node_of`'s communicator, for the caller to free. Collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if node_size is None:
        return node
    try:  # a virtual node never spans two real ones, so its ranks still share memory
        return node.Split(node.Get_rank() // node_size, comm.Get_rank())
    finally:
        node.Free()


def virtual_node_size(node_size: int | None = None) -> int | None:
    """`node_size`, else $RINGCC_NODE_SIZE, else None (nodes as MPI finds them): ranks are cut
    into virtual nodes of this many, so that one host can stand for several."""
    if node_size is None:
        node_size = os.environ.get("RINGCC_NODE_SIZE") or None
    if node_size is None:
        return None
    if isinstance(node_size, bool) or not str(node_size).isdigit() or int(node_size) < 1:
        raise InvalidArgumentError(f"node_size (or $RINGCC_NODE_SIZE) must be a whole number "
                                   f">= 1, got {node_size!r}")
    return int(node_size)


def nodes(comm: MPI.Comm, node_size: int | None = None) -> list[int]:
    """The node of every rank of `comm`, in rank order, nodes numbered from 0 in the order of
    their first rank; virtual nodes where `virtual_node_size` says. Collective."""
    with node_of(comm, virtual_node_size(node_size)) as node:
        first = node.allreduce(comm.Get_rank(), op=MPI.MIN)
    firsts = comm.allgather(first)
    number = {f: n for n, f in enumerate(sorted(set(firsts)))}
    return [number[f] for f in firsts]


def on_one_node(comm: MPI.Comm, node_size: int | None = None) -> bool:
    """True when every rank of `comm` is on one node (a virtual one where
    `virtual_node_size` says), so can share memory with every other. Collective."""
    return max(nodes(comm, node_size)) == 0


def local_rank(comm: MPI.Comm) -> int:
    """This rank's position among the ranks of `comm` on its node. Collective."""
    with node_of(comm) as node:
        return node.Get_rank()


def oversubscribed(comm: MPI.Comm) -> bool:
    """True when the ranks of `comm` on this node outnumber the cores they may run on."""
    with node_of(comm) as node:
        cores = set().union(*node.allgather(os.sched_getaffinity(0)))
        return node.Get_size() > len(cores)


def start(comm: MPI.Comm, transport: Transport) -> None:
    """The checks every transport of a real job makes once its options are set. Collective.

    Every rank must cut messages into the same segments and choose the same all-reduce path:
    a rank whose `segment_bytes` or `one_shot_bytes` (arguments or environment) differ would
    read its peers' messages wrongly or wait for messages that never come. And where ranks
    outnumber cores, a wait yields the CPU at once, since the rank it waits for may be waiting
    for this core.
    """
    chosen = comm.allgather((transport.segment_bytes, transport.one_shot_bytes))
    if len(set(chosen)) > 1:
        raise InvalidArgumentError(
            "segment_bytes and one_shot_bytes must be the same on every rank; got, by rank: "
            + ", ".join(f"{r}: {s}, {o}" for r, (s, o) in enumerate(chosen)))
    if oversubscribed(comm):
        transport.oversubscribed, transport.spin = True, 0
