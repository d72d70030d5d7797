"""Ranks on several nodes, as three transports: all of them, each node's, and across nodes.

    world    every rank, over a transport that spans nodes (mpi): what every collective but
             the hierarchical all-reduce uses, and the call check
    node     the ranks of this rank's node, over one node's memory (shm, or cuda_ipc for CuPy)
    across   the ranks with this rank's local index, one on each node (mpi)

With M nodes of k ranks, rank r = the j-th rank of node n is rank j of its node's transport
and rank n of its across transport (nodes numbered in the order of their first rank):

    node 0: ranks 0 1 2    node transports: {0 1 2} {3 4 5}
    node 1: ranks 3 4 5    across transports: {0 3} {1 4} {2 5}

The hierarchical all-reduce (collectives/hierarchical.py) runs on `node` and `across`; the
flat operations of the seam go to `world`. The three share one `stats`, which counts bytes
to and from other nodes apart, and one trace, whose records name world ranks and the part
that moved them ("node reduce-scatter"). Every node must hold as many ranks: `over` refuses
nodes that differ, on every rank, before it builds anything.

`over` builds the parts over MPI from the transport classes it is given (the registry gives
the ones "auto" picks on one node and across nodes), so this module knows no other transport;
`collectives.spawn(..., node_size=k)` builds them from thread ranks instead.
"""

from __future__ import annotations

from typing import Any, Callable

from .base import Heard, Reads, ReduceOp, Transport
from .errors import InvalidArgumentError


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _in_world(record: dict, ranks: list[int], part: str) -> dict:
    """A part's transfer record, its ranks made world ranks and its phase named after the part:
    in place, since the caller keeps the record to time it, and once, since the trace and the
    transfer hook get the same record."""
    if "part" not in record:
        record["part"] = part
        record["rank"] = ranks[record["rank"]]
        for peer in ("dst", "src"):
            if record[peer] is not None:
                record[peer] = ranks[record[peer]]
        record["phase"] = f"{part} {record['phase']}"
    return record


class _IntoWorld:
    """A part's trace: what it records goes, in world ranks, to the world's list."""

    def __init__(self, records: list[dict], ranks: list[int], part: str) -> None:
        self.records, self.ranks, self.part = records, ranks, part

    def append(self, record: dict) -> None:
        self.records.append(_in_world(record, self.ranks, self.part))


class HierarchicalTransport(Transport):
    """One rank's `world`, `node` and `across` transports; `node_ranks` and `across_ranks` are
    the world ranks of the ranks of `node` and of `across`, in their order."""

    name = "hierarchical"

    def __init__(self, world: Transport, node: Transport, across: Transport, *,
                 node_ranks: list[int], across_ranks: list[int]) -> None:
        self.world, self.node, self.across = world, node, across
        # Each part: its world ranks (which its error messages give, `named`), its name in
        # traces, and in error messages.
        node.world_ranks, across.world_ranks = node_ranks, across_ranks
        self._parts = [
            (node, node_ranks, "node", f"inside the node of ranks {_listed(node_ranks)}"),
            (across, across_ranks, "across", f"across nodes among ranks {_listed(across_ranks)}")]
        super().__init__(world.rank, world.size, segment_bytes=world.segment_bytes,
                         one_shot_bytes=world.one_shot_bytes, timeout=world.timeout,
                         xp=world.xp)
        for part in (world, node, across):
            part.stats = self.stats
        self.off_node = world.off_node = frozenset(range(self.size)) - set(node_ranks)
        across.off_node = frozenset(range(across.size)) - {across.rank}

    @classmethod
    def over(cls, comm: Any = None, *, local: Callable[..., Transport],
             flat: Callable[..., Transport], device: str = "cpu",
             node_size: int | None = None, **options: Any) -> HierarchicalTransport:
        """The ranks of `comm` (default `MPI.COMM_WORLD`): `flat` (a transport class that spans
        nodes) over all of them and across nodes, `local` (one of one node) inside each node;
        nodes are virtual ones of `node_size` ranks where `bootstrap.virtual_node_size` says.
        `options` go to every part. Collective."""
        # MPI only here: thread ranks (collectives.spawn) build the transport without it.
        from mpi4py import MPI

        from .bootstrap import nodes, split_node, virtual_node_size

        comm = comm if comm is not None else MPI.COMM_WORLD
        node_size = virtual_node_size(node_size)
        where = nodes(comm, node_size)
        held = [where.count(n) for n in range(max(where) + 1)]
        if len(set(held)) > 1:
            raise InvalidArgumentError(
                f"the hierarchical transport needs as many ranks on every node, but its "
                f"{len(held)} nodes hold {', '.join(map(str, held))} ranks"
                + (f" (node_size={node_size})" if node_size else "")
                + "; use transport='mpi', or 'auto', which picks mpi there")
        rank = comm.Get_rank()
        parts: list[Transport] = []
        local_comm = split_node(comm, node_size)
        across_comm = comm.Split(local_comm.Get_rank(), rank)
        try:
            parts.append(flat(comm, device=device, node_size=node_size, **options))
            parts.append(local(local_comm, device=device, node_size=node_size, **options))
            # Each rank of `across` is on a node of its own.
            parts.append(flat(across_comm, device=device, node_size=1, **options))
            return cls(*parts, node_ranks=local_comm.allgather(rank),
                       across_ranks=across_comm.allgather(rank))
        except BaseException:
            for part in parts:
                part.close()
            raise
        finally:
            local_comm.Free()
            across_comm.Free()

    # ---- what the caller is doing reaches the parts ------------------------------------------

    @property
    def trace(self) -> list[dict] | None:
        return self._trace

    @trace.setter
    def trace(self, records: list[dict] | None) -> None:
        self._trace = records
        for part, ranks, name, _ in self._parts:
            part.trace = None if records is None else _IntoWorld(records, ranks, name)

    @property
    def on_transfer(self) -> Callable[[dict], None] | None:
        return self._on_transfer

    @on_transfer.setter
    def on_transfer(self, hook: Callable[[dict], None] | None) -> None:
        self._on_transfer = hook
        for part, ranks, name, _ in self._parts:
            part.on_transfer = None if hook is None else (
                lambda record, ranks=ranks, name=name: hook(_in_world(record, ranks, name)))

    def begin(self, where: Any, call: tuple[int, ...] | None = None, phase: str = "") -> None:
        super().begin(where, call, phase)
        self.world.begin(where, None, phase)
        for part, _, _, label in self._parts:
            part.begin(f"{where} {label}")

    def at(self, phase: str, step: int = 0) -> None:
        super().at(phase, step)
        self.world.at(phase, step)

    # ---- the flat operations go to the world -------------------------------------------------

    def _sendrecv(self, sendbuf: Any | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> None:
        self.world._sendrecv(sendbuf, dst, recvbuf, src)

    def _sendrecv_reduce(self, sendbuf: Any | None, dst: int | None,
                         accbuf: Any, src: int, op: ReduceOp, inbuf: Any) -> None:
        self.world._sendrecv_reduce(sendbuf, dst, accbuf, src, op, inbuf)

    def _send_reduced(self, sendbuf: Any, dst: int) -> None:
        self.world._send_reduced(sendbuf, dst)

    def _all_inputs(self, buf: Any, call: tuple[int, ...] | None, reads: Reads | None = None,
                    into: Any | None = None) -> list[Any] | None:
        return self.world._all_inputs(buf, call, reads, into)

    def reads_in_place(self, reads: Reads, nbytes: int) -> bool:
        return self.world.reads_in_place(reads, nbytes)

    def _barrier(self) -> None:
        self.world._barrier()

    def sends_ahead(self, nbytes: int, reduced: bool = False) -> int:
        return self.world.sends_ahead(nbytes, reduced)

    def _isend(self, buf: Any, dst: int) -> Callable[[], None]:
        return self.world._isend(buf, dst)

    def say_pairs(self, said: dict[int, tuple[int, ...]]) -> Heard:
        # (The mpi transport's words have room for a collective's packet.)
        return self.world.say_pairs(said)

    def register(self, nbytes: int) -> Any:
        """In the node's memory, where its peers read it in place (shm): the hierarchical
        all-reduce moves most of its bytes inside the node."""
        return self.node.register(nbytes)

    def abandon(self, why: str) -> None:
        for part in (self.across, self.node, self.world):
            part.abandon(why)
        super().abandon(why)

    def check_thread(self) -> None:
        for part in (self.across, self.node, self.world):
            part.check_thread()

    def close(self) -> None:
        for part in (self.across, self.node, self.world):
            part.close()
        super().close()
