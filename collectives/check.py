"""Before any data moves, the ranks check that they all made the same call.

Each rank describes its call in six non-negative integers, its descriptor:

    call number  the call's number on this communicator (1 for the first collective)
    collective   which collective (its place in the communicator's list of calls)
    count        1 + elements in the buffer (0 for scatter: a rank may not know it)
    dtype        the dtype's NumPy code ("<f4") packed into an integer (0 for scatter)
    op           the reduction (0 where the collective takes none)
    root         1 + the root rank (0 where the collective has none)

and every rank reads every other rank's descriptor through the transport's exchange of small
inputs, the one small all-reduces use (one publish and one wait on shared memory). A small
all-reduce sends its descriptor with its data, in that one exchange; every other call makes
an exchange of descriptors alone first. So every rank sees the same N descriptors, and if they
differ every rank raises the same `MismatchError`, naming the ranks that called something else
than the others and what differs, before it reads any peer's data: the communicator can still
be used afterwards.

The check is also a barrier: a rank that never makes the call holds the others at the check,
and their timeout names the call and, where the transport can tell, the rank they waited for.
It costs one small exchange per call (measured in the README, "Reliability").
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import numpy

from transports.base import Transport

from .ops import OPS

FIELDS = ("call number", "collective", "count", "dtype", "op", "root")
_OP_CODES = {name: code for code, name in enumerate(OPS, start=1)}


@functools.lru_cache(maxsize=None)
def dtype_code(dtype: numpy.dtype) -> int:
    """The dtype's NumPy code, "<f4" or "|b1", as a non-negative int64 (numeric codes fit)."""
    return int.from_bytes(dtype.str.encode()[:8], "little")


def dtype_text(code: int) -> str:
    return str(numpy.dtype(code.to_bytes(8, "little").rstrip(b"\0").decode()))


def descriptor(seq: int, collective: int, count: int = -1, dtype: Any = None,
               op: str | None = None, root: int = -1) -> tuple[int, ...]:
    """The integers that stand for one call (see the module docstring); `collective` is the
    call's index in the communicator's list of call names, -1 a missing count or root."""
    return (seq, collective, count + 1, 0 if dtype is None else dtype_code(numpy.dtype(dtype)),
            0 if op is None else _OP_CODES[op], int(root) + 1)


def call_text(call: tuple[int, ...], names: tuple[str, ...]) -> str:
    """A call as the user wrote it: "all_reduce #4 (count 100, float32, sum)"."""
    seq, collective, count, dtype, op, root = call
    details = []
    if count:
        details.append(f"count {count - 1}")
    if dtype:
        details.append(dtype_text(dtype))
    if op:
        details.append(OPS[op - 1])
    if root:
        details.append(f"root {root - 1}")
    return f"{names[collective]} #{seq}" + (f" ({', '.join(details)})" if details else "")


def agree(transport: Transport) -> None:
    """Exchange the descriptor given to `transport.begin` with every rank, alone; raises
    `CallsDiffer` on every rank if any differs.

    Collective: every rank calls it before the data of a call moves. The exchange is
    uncounted, so traces and byte counts show only the collective's own traffic.
    """
    transport.at("check")
    transport.all_inputs(transport.xp.empty(0, transport.xp.uint8), counted=False)
    transport.at("")  # until the algorithm names its own phase


def disagreement(calls: list[tuple[int, ...]], rank: int, names: tuple[str, ...]) -> str:
    """What rank `rank` says when ranks made the calls `calls` (in rank order), not all alike."""
    common = Counter(calls).most_common(1)[0][0]  # on a tie, the lowest rank's call
    odd: dict[tuple[int, ...], list[int]] = {}
    for r, call in enumerate(calls):
        if call != common:
            odd.setdefault(call, []).append(r)
    differ = [name for i, name in enumerate(FIELDS) if any(c[i] != common[i] for c in odd)]
    if "collective" in differ:  # the other arguments then mean different things
        differ = differ[:differ.index("collective") + 1]
    others = [r for r, call in enumerate(calls) if call == common]
    said = "; ".join(f"{_ranks(ranks)} called {call_text(call, names)}"
                     for call, ranks in odd.items())
    verb = "differs" if len(differ) == 1 else "differ"
    return (f"rank {rank}: ranks disagree: {said}, but {_ranks(others)} called "
            f"{call_text(common, names)}; the {' and the '.join(differ)} {verb}")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"
