"""Ring all-gather: rank r contributes block r; every rank ends with all N blocks in rank order.

In step s, rank r passes block (r - s) to its right neighbour and receives block (r - s - 1)
from its left (see all_reduce.py for the ring). After N-1 steps every block has gone round the
ring. Each rank sends and receives (N-1)/N of the output. Uneven blocks (`counts`, MPI's
Allgatherv) go round the same ring: each rank then sends every block but the one it would
receive last.

Small equal blocks take one exchange instead (`one_shot_all_gather`): every rank publishes its
block and reads every other's at once, the call's check riding along. It moves the same bytes
as the ring, (N-1)/N of the output each way, but waits once instead of N-1 times. Where the
transport reads each block straight out of its owner's memory into place
(`Transport.reads_in_place`: shm, where direct reads work), blocks of any size take it:
each is then copied once, as in the ring, with one wait. (On two ranks, a large block may be
written into place by its owner instead, where that measures cheaper: transports/slots.py,
"Pushed inputs".)
"""

from __future__ import annotations

from typing import Any

from transports.base import Transport

from .arrays import overlap
from .blocks import every_input
from .ring import all_gather_pass


def ring_all_gather(transport: Transport, work: Any, bounds: list[tuple[int, int]]) -> None:
    """`work` is the flat output, block `rank` already filled; fill the rest. Block r is at
    bounds[r]."""
    all_gather_pass(transport, work, bounds, first=0)


def one_shot_all_gather(transport: Transport, mine: Any, work: Any,
                        bounds: list[tuple[int, int]]) -> None:
    """Fill the flat output `work` with every rank's flat block `mine` (equal blocks, at
    bounds[r]) from one exchange (`Transport.all_inputs`), which also carries the call's
    descriptor when the caller checks."""
    transport.at("one-shot")
    reads = every_input(mine.nbytes, transport.size)
    if transport.reads_in_place(reads, mine.nbytes) and overlap(mine, work, transport.xp):
        mine = mine.copy()  # in place: peers read `mine` where it lies while blocks land
    transport.all_inputs(mine, reads=reads, into=work)
