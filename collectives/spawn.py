"""Run a function on N in-process ranks (threads), each with its own Communicator.

Like Gloo's `spawnThreads`: the quickest way to try a collective, teach it, or test it at
several sizes without starting processes.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from transports.errors import InvalidArgumentError
from transports.threads import ThreadGroup, ThreadTransport

from .communicator import Communicator


def spawn(fn: Callable[..., Any], size: int, *args: Any, segment_bytes: int | None = None,
          one_shot_bytes: int | None = None, timeout: float | None = None,
          trace: bool = False, check: bool | None = None) -> list[Any]:
    """Call `fn(comm, *args)` on `size` thread ranks; return their results in rank order.

    The options are those of `collectives.init`. If any rank raises, the others are released
    from their waits (with `PeerFailedError`) and the first exception is raised again here,
    with its rank named.
    """
    if size < 1:
        raise InvalidArgumentError(f"spawn needs at least one rank, got {size}")
    group = ThreadGroup(size)
    results: list[Any] = [None] * size
    failures: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def run(rank: int) -> None:
        try:
            transport = ThreadTransport(group, rank, segment_bytes=segment_bytes,
                                        one_shot_bytes=one_shot_bytes, timeout=timeout)
            with Communicator(transport, trace=trace, check=check) as comm:
                results[rank] = fn(comm, *args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            with lock:
                failures.append((rank, error))
            group.fail()

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
