"""Hierarchical all-reduce: the ring inside each node, and only a shard of it between nodes.

Between nodes the wire is slow; inside a node, ranks share memory. A flat ring over all N
ranks sends each rank's 2(N-1)/N S bytes to its neighbour, and wherever the ring crosses from
one node to the next, all of it crosses the wire. With M nodes of k ranks (N = M k), three
passes send most bytes inside the nodes instead (as Horovod's hierarchical all-reduce and
NCCL's trees and rings between nodes do):

1. Reduce-scatter inside each node (ring_reduce_scatter over the node's transport): the
   buffer is cut into k shards; the j-th rank of each node ends with shard j reduced over
   its node.
2. All-reduce across nodes (ring_all_reduce over the across transport): the j-th ranks of
   the M nodes all-reduce shard j, so each holds shard j reduced over every rank. Only this
   pass crosses between nodes, and it moves a k-th of the buffer.
3. All-gather inside each node (ring_all_gather over the node's transport): each rank
   passes its finished shard round its node, and every rank ends with the whole result.

2 nodes of 2 ranks, S cut into shards a and b ("a01" is shard a reduced over ranks 0 and 1):

    node 0: rank 0  rank 1            node 1: rank 2  rank 3
    1. reduce-scatter in each node:   rank 0 a01   rank 1 b01   rank 2 a23   rank 3 b23
    2. all-reduce across nodes:       ranks 0, 2: a0123          ranks 1, 3: b0123
    3. all-gather in each node:       every rank a0123 b0123

Cost per rank, S bytes: 2(k-1)/k S inside the node (a reduce-scatter and an all-gather of
k shards), and 2(M-1)/M S/k between nodes, against up to 2(N-1)/N S for a flat ring (the
ranks at the ends of a node send all of theirs across). Each shard is reduced on one rank
per node and then once across nodes, in the same order for every rank, and then copied, so
every rank ends with bitwise the same result. For op "avg" each rank divides its shard by N
once it is reduced over every rank, before the all-gather.
"""

from __future__ import annotations

from typing import Any

from transports.base import ReduceOp, Transport
from transports.errors import InvalidArgumentError

from .all_gather import ring_all_gather
from .all_reduce import ring_all_reduce
from .chunking import chunk_bounds
from .reduce_scatter import ring_reduce_scatter


def hierarchical_all_reduce(transport: Transport, work: Any, op: ReduceOp,
                            average: bool = False, mine: Any | None = None) -> None:
    """All-reduce into the flat contiguous array `work` on every rank of a transport with
    `node` and `across` parts (transports/hierarchical.py); the input is `mine` when given,
    else `work` (in place)."""
    node, across = transport.node, transport.across
    if node is None or across is None:
        raise InvalidArgumentError(f"the hierarchical all-reduce needs the hierarchical "
                                   f"transport, which knows the nodes; this is {transport.name}")
    shards = chunk_bounds(work.size, node.size)
    ring_reduce_scatter(node, work if mine is None else mine, work, op, bounds=shards)
    shard = work[slice(*shards[node.rank])]
    ring_all_reduce(across, shard, op)
    if average:
        transport.xp.true_divide(shard, transport.size, out=shard)
    ring_all_gather(node, work, shards)
