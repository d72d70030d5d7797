"""Run a function on N in-process ranks (threads), each with its own Communicator.

Like Gloo's `spawnThreads`: the quickest way to try a collective, teach it, or test it at
several sizes without starting processes. With `node_size`, the ranks stand in virtual nodes
of that many, over the hierarchical transport made of thread ranks: one group of all of them,
one per node, one per local index across nodes.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from transports.base import Transport
from transports.errors import InvalidArgumentError
from transports.hierarchical import HierarchicalTransport
from transports.threads import ThreadGroup, ThreadTransport

from .communicator import Communicator


def spawn(fn: Callable[..., Any], size: int, *args: Any, segment_bytes: int | None = None,
          one_shot_bytes: int | None = None, timeout: float | None = None,
          trace: bool = False, check: bool | None = None,
          node_size: int | None = None) -> list[Any]:
    """Call `fn(comm, *args)` on `size` thread ranks; return their results in rank order.

    The options are those of `collectives.init`; `node_size` k puts ranks in nodes of k
    consecutive ranks, over the hierarchical transport (k must divide `size`). If any rank
    raises, the others are released from their waits (with `PeerFailedError`) and the first
    exception is raised again here, with its rank named.
    """
    if size < 1:
        raise InvalidArgumentError(f"spawn needs at least one rank, got {size}")
    if node_size is not None and (node_size < 1 or size % node_size):
        raise InvalidArgumentError(f"spawn cuts {size} ranks into nodes of node_size ranks, "
                                   f"which must divide it; got {node_size}")
    options = {"segment_bytes": segment_bytes, "one_shot_bytes": one_shot_bytes,
               "timeout": timeout}
    group = ThreadGroup(size)
    k = node_size or size
    node_groups = [ThreadGroup(k) for _ in range(size // k)]
    across_groups = [ThreadGroup(size // k) for _ in range(k)]

    def transport_of(rank: int) -> Transport:
        world = ThreadTransport(group, rank, **options)
        if node_size is None:
            return world
        node, local = divmod(rank, k)
        return HierarchicalTransport(
            world, ThreadTransport(node_groups[node], local, **options),
            ThreadTransport(across_groups[local], node, **options),
            node_ranks=[node * k + j for j in range(k)],
            across_ranks=[n * k + local for n in range(size // k)])
    results: list[Any] = [None] * size
    failures: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def run(rank: int) -> None:
        try:
            with Communicator(transport_of(rank), trace=trace, check=check) as comm:
                results[rank] = fn(comm, *args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            with lock:
                failures.append((rank, error))
            for failed in (group, *node_groups, *across_groups):
                failed.fail()

    threads = [threading.Thread(target=run, args=(rank,), name=f"rank-{rank}", daemon=True)
               for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        rank, error = failures[0]
        error.add_note(f"raised on rank {rank} of {size}")
        raise error
    return results
