"""All-to-all by pairwise exchange: block j of rank i's buffer ends as block i of rank j's.

Each rank copies the block it keeps, then makes N-1 exchanges: in step s, rank r sends its
block for rank r+s and receives rank r-s's block for it (mod N), both at once. Each step every
rank sends one message and receives one, so no rank waits on a busy one, and every block
travels once, straight to where it belongs. The schedule for 4 ranks, as "sent/received"
(block number sent / rank it came from; a test runs the code and checks this table):

    phase       step   rank 0   rank 1   rank 2   rank 3
    all-to-all  0      1/3      2/0      3/1      0/2
    all-to-all  1      2/2      3/3      0/0      1/1
    all-to-all  2      3/1      0/2      1/3      2/0

Cost: each rank sends and receives (N-1)/N S of a buffer of S bytes in N-1 steps, the least
possible; on a network where a message's latency dominates, Bruck's algorithm takes log2 N
steps by forwarding blocks, at log2 N / 2 times the bytes.

Uneven blocks (`counts`, MPI's Alltoallv) follow the same schedule: `send_bounds[j]` is the
block for rank j, `recv_bounds[i]` the one from rank i.
"""

from __future__ import annotations

from typing import Any

from transports.base import Transport


def pairwise_all_to_all(transport: Transport, mine: Any, work: Any,
                        send_bounds: list[tuple[int, int]],
                        recv_bounds: list[tuple[int, int]]) -> None:
    """Send block j of the flat array `mine` (at send_bounds[j]) to rank j, and receive rank
    i's block for this rank into `work` (flat) at recv_bounds[i]. `mine` is only read."""
    rank, size = transport.rank, transport.size
    work[slice(*recv_bounds[rank])] = mine[slice(*send_bounds[rank])]
    for step in range(size - 1):
        dst, src = (rank + 1 + step) % size, (rank - 1 - step) % size
        transport.at("all-to-all", step)
        transport.sendrecv(mine[slice(*send_bounds[dst])], dst,
                           work[slice(*recv_bounds[src])], src)
