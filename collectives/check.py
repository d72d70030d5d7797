"""Before any data moves, the ranks check that they all made the same call.

Each rank describes its call in six non-negative integers, its descriptor:

    call number  the call's number on this communicator (1 for the first collective)
    collective   which collective (its place in the communicator's list of calls), and above
                 its low 8 bits a 48-bit digest of the uneven block counts (`counts=`), which
                 every rank passes alike (0: none)
    count        1 + elements in the buffer, or in all blocks together with `counts` (0 for
                 scatter without counts: a rank may not know it)
    dtype        the dtype's NumPy code ("<f4") packed into an integer (0 for scatter)
    op           the reduction (0 where the collective takes none)
    root         1 + the root rank (0 where the collective has none)

and every rank reads every other rank's descriptor through the transport's exchange of small
inputs, the one small all-reduces use (one publish and one wait on shared memory). A call
that moves small inputs in one exchange (and every scatter) sends its descriptor with its
data, in that one exchange; gather and all-to-all hand the check to the transport's
`check_first`, which on shared memory makes it in their first exchange; the other calls make
an exchange of descriptors alone first. So every rank sees the same N descriptors, and if they
differ every rank raises the same `MismatchError`, naming the ranks that called something else
than the others and what differs, before it reads any peer's data: the communicator can still
be used afterwards.

The check is also a barrier: a rank that never makes the call holds the others at the check,
and their timeout names the call and, where the transport can tell, the rank they waited for.
It costs one small exchange per call (measured in the README, "Reliability").

Point-to-point calls (`send`, `recv`, `sendrecv`) involve two ranks, not all: there the pair
checks its message alone (`pair_agree`), see below.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from typing import Any

import numpy

from transports.base import MESSAGES, Heard, Transport, swapped_dtypes
from transports.errors import MismatchError

from .ops import OPS

# The fields a descriptor stands for, the counts' digest taken out of the collective's word.
FIELDS = ("call number", "collective", "counts", "count", "dtype", "op", "root")
_OP_CODES = {name: code for code, name in enumerate(OPS, start=1)}
COLLECTIVE_BITS = 8  # the collective's place in the list of calls; the counts' digest above


@functools.lru_cache(maxsize=None)
def dtype_code(dtype: numpy.dtype) -> int:
    """The dtype's NumPy code, "<f4" or "|b1", as a non-negative int64 (numeric codes fit)."""
    return int.from_bytes(dtype.str.encode()[:8], "little")


def dtype_text(code: int) -> str:
    return str(numpy.dtype(code.to_bytes(8, "little").rstrip(b"\0").decode()))


def counts_code(counts: tuple | None) -> int:
    """A 48-bit digest of uneven block counts (a tuple of ints, or of rows of ints), never 0;
    0 for None."""
    if counts is None:
        return 0
    array = numpy.asarray(counts, numpy.int64)
    digest = hashlib.blake2b(bytes([array.ndim]) + array.tobytes(), digest_size=6).digest()
    return int.from_bytes(digest, "little") or 1


def descriptor(seq: int, collective: int, count: int = -1, dtype: Any = None,
               op: str | None = None, root: int = -1,
               counts: tuple | None = None) -> tuple[int, ...]:
    """The integers that stand for one call (see the module docstring); `collective` is the
    call's index in the communicator's list of call names, -1 a missing count or root."""
    return (seq, collective | counts_code(counts) << COLLECTIVE_BITS, count + 1,
            0 if dtype is None else dtype_code(numpy.dtype(dtype)),
            0 if op is None else _OP_CODES[op], int(root) + 1)


def fields(call: tuple[int, ...]) -> tuple[int, ...]:
    """The values of FIELDS in a descriptor: the counts' digest apart from the collective."""
    seq, word, *rest = call
    mask = (1 << COLLECTIVE_BITS) - 1
    return (seq, word & mask, word >> COLLECTIVE_BITS, *rest)


def call_text(call: tuple[int, ...], names: tuple[str, ...]) -> str:
    """A call as the user wrote it: "all_reduce #4 (count 100, float32, sum)"; uneven counts
    show as their digest ("counts #3fa2c1"). A peer in a point-to-point call meets the check
    with a message's description instead: "recv #1 (count 3, float64)"."""
    if call[0] == MESSAGES:
        return _call_text(call)
    seq, collective, counts, count, dtype, op, root = fields(call)
    details = [f"counts #{counts:012x}"] if counts else []
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
    usual = fields(common)
    differ = [name for i, name in enumerate(FIELDS)
              if any(fields(c)[i] != usual[i] for c in odd)]
    if any(call[0] == MESSAGES for call in calls):  # a rank is in a send or a recv
        differ = ["collective"]
    if "collective" in differ:  # the other arguments then mean different things
        differ = differ[:differ.index("collective") + 1]
    others = [r for r, call in enumerate(calls) if call == common]
    said = "; ".join(f"{_ranks(ranks)} called {call_text(call, names)}"
                     for call, ranks in odd.items())
    verb = "differ" if len(differ) > 1 or differ == ["counts"] else "differs"
    return (f"rank {rank}: ranks disagree: {said}, but {_ranks(others)} called "
            f"{call_text(common, names)}; the {' and the '.join(differ)} {verb}")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


# ---- point to point -------------------------------------------------------------------------
#
# A message concerns two ranks only, so its two ends check it between themselves. To each
# peer of a call (its dst, its src) a rank sends once six integers that describe the messages
# between the two: the number (the k-th from that sender to that receiver), 1 + elements and
# dtype of the message it sends the peer, and of the one it expects from it (0: none); and it
# takes the peer's six (`Transport.say_pairs`: each transport carries them its own way). A
# rank says its words to every peer of the call before it waits for any, so a check waits in
# a circle only where the messages would. (A sendrecv with two peers moves the half whose
# peer has come first: point_to_point.py, `two_peers`.) Both ends then hold both
# descriptions of each message, and if they differ (a count, a dtype, two ranks that both
# send, or both receive) both raise MessagesDiffer (a MismatchError) before any data of that
# message moves, in the same words, and can go on.
# The first word is never a call number, so the collectives' check and this one each tell the
# other's description from their own: a rank in a collective meets a rank in a send, both say
# so, and the collective takes back its call number (`Communicator._disagreement`). (On shm,
# where the two travel in lines of their own, each answers the other's: slots.py, "Folded
# checks".)

_MESSAGE_FIELDS = ("number", "count", "dtype")


class MessagesDiffer(MismatchError):
    """The two ends of a message described it differently: both raise it, and neither has
    sent or received any of its data, so the communicator can go on. `agreed`: the peers
    whose messages with this rank were described alike and have not moved yet (a sendrecv's
    other half, which its caller still moves: that peer raises nothing, and waits for it)."""

    def __init__(self, message: str, agreed: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.agreed = agreed


def messages(sent: tuple[int, Any] | None, expected: tuple[int, Any] | None) -> tuple[int, ...]:
    """A rank's description of the messages between it and one peer (see above): `sent`, the
    number and the flat array of the one it sends the peer, `expected` those of the one it
    receives from it; None where there is none."""
    n_sent, c_sent, d_sent = _describe(sent)
    n_expected, c_expected, d_expected = _describe(expected)
    return (MESSAGES, n_sent, n_expected, c_sent, c_expected, d_sent << 32 | d_expected)


def pair_kind(mine: Any | None, into: Any | None) -> tuple[int, int, int]:
    """What a sendrecv's description (`messages`) says of its two flat arrays, whatever their
    numbers: the count of each, and both dtypes (None: no such array, a send or a recv
    alone)."""
    c_sent, d_sent = (0, 0) if mine is None else (mine.size + 1, dtype_code(mine.dtype))
    c_expected, d_expected = (0, 0) if into is None else (into.size + 1, dtype_code(into.dtype))
    return c_sent, c_expected, d_sent << 32 | d_expected


def pair_said(n_sent: int, n_expected: int,
              kind: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A sendrecv's description with one peer from its two numbers and its `pair_kind`, as
    `messages` makes it, and the peer's when it agrees, as `mirrored` makes it (a small
    message makes both in one go)."""
    c_sent, c_expected, dtypes = kind
    return ((MESSAGES, n_sent, n_expected, c_sent, c_expected, dtypes),
            (MESSAGES, n_expected, n_sent, c_expected, c_sent, swapped_dtypes(dtypes)))


def _describe(message: tuple[int, Any] | None) -> tuple[int, int, int]:
    if message is None:
        return 0, 0, 0
    number, buf = message
    return number, buf.size + 1, dtype_code(buf.dtype)


def mirrored(said: tuple[int, ...]) -> tuple[int, ...]:
    """What the peer says of the same messages when it agrees: sent and expected swapped."""
    word, n_sent, n_expected, c_sent, c_expected, dtypes = said
    return (word, n_expected, n_sent, c_expected, c_sent, swapped_dtypes(dtypes))


def pair_agree(transport: Transport, said: dict[int, tuple[int, ...]]) -> None:
    """Give each peer this rank's description of the messages between them, `said[peer]`, and
    take the peer's; MessagesDiffer on both ends where any differ. Uncounted and untraced:
    stats and traces show only the messages' data."""
    heard = transport.say_pairs(said)
    judge_pair(transport, said, {peer: hear(transport, heard, peer) for peer in said})


def hear(transport: Transport, heard: Heard, peer: int) -> tuple[int, ...]:
    """`peer`'s words of a check whose own `say_pairs` gave `heard`, waiting for them."""
    words = heard(peer)
    if words is None:
        phase, step = transport.phase, transport.step
        transport.at("check")
        transport.wait(lambda: heard(peer) is not None, peer, "a message")
        transport.at(phase, step)
        words = heard(peer)
    return words


def judge_pair(transport: Transport, said: dict[int, tuple[int, ...]],
               heard: dict[int, tuple[int, ...]]) -> None:
    """Nothing where each peer said of the messages what this rank `said` (mirrored), else
    MessagesDiffer naming what differs (see `pair_agree`)."""
    for peer, words in heard.items():
        if words != mirrored(said[peer]):
            break
    else:
        return
    problems = [_pair_problem(transport.rank, peer, said[peer], heard[peer]) for peer in heard]
    said_here = f"rank {transport.rank}: " + "; and ".join(p for p in problems if p)
    if transport.size > 2 and not transport.answers_messages_met \
            and any(words[0] != MESSAGES for words in heard.values()):
        # The collective's other ranks still wait for this rank's part, and would take its
        # next call's for it: a plain MismatchError, which breaks the communicator.
        raise MismatchError(said_here + LEFT_WAITING)
    raise MessagesDiffer(said_here, tuple(peer for peer, words in heard.items()
                                          if words == mirrored(said[peer])))


LEFT_WAITING = ("; on more than 2 ranks the collective's other ranks still wait for this "
                "rank, so this communicator cannot go on (on shm it can)")


def _pair_problem(rank: int, peer: int, mine: tuple[int, ...], theirs: tuple[int, ...]) -> str:
    """'' if `rank` and `peer` describe the messages between them alike, else what differs,
    in the same words on both ends (the lower rank's message first)."""
    if theirs[0] != MESSAGES:  # the collectives' check: the peer is in a collective
        return (f"rank {rank} calls {_call_text(mine)} with rank {peer}, which makes a "
                f"collective call")
    # Each message as (sender, receiver, the sender's view, the receiver's view).
    low, high = sorted([(rank, peer, _part(mine, 0), _part(theirs, 1)),
                        (peer, rank, _part(theirs, 0), _part(mine, 1))], key=lambda m: m[0])
    if all(m[2] and not m[3] for m in (low, high)):
        return (f"{_sends(low)}, but {_sends(high)} at the same time; a send needs a matching "
                f"recv (sendrecv sends and receives at once)")
    if all(m[3] and not m[2] for m in (low, high)):
        return (f"{_receives(low)}, but {_receives(high)} at the same time; a recv needs a "
                f"matching send")
    return "; and ".join(p for p in (_message_problem(low), _message_problem(high)) if p)


def _part(description: tuple[int, ...], which: int) -> tuple[int, int, int] | None:
    """(number, 1 + count, dtype code) of the message sent (`which` 0) or expected (1) in a
    description, or None."""
    number, count = description[1 + which], description[3 + which]
    dtype = description[5] >> 32 if which == 0 else description[5] & 0xFFFFFFFF
    return (number, count, dtype) if count else None


def _message_problem(message: tuple) -> str:
    """What is wrong with a message (sender, receiver, the sender's view, the receiver's)."""
    sender, receiver, sent, expected = message
    if sent is None and expected is None:
        return ""
    if expected is None:
        return f"{_sends(message)}, which receives nothing from it"
    if sent is None:
        return f"{_receives(message)}, which sends nothing to it"
    differ = [name for name, a, b in zip(_MESSAGE_FIELDS, sent, expected) if a != b]
    if not differ:
        return ""
    return (f"{_sends(message)}, but {_receives(message)}; the {' and the '.join(differ)} "
            f"{'differs' if len(differ) == 1 else 'differ'}")


def _sends(message: tuple) -> str:
    sender, receiver, sent, _ = message
    return f"rank {sender} sends message #{sent[0]} {_what(sent)} to rank {receiver}"


def _receives(message: tuple) -> str:
    sender, receiver, _, expected = message
    return f"rank {receiver} receives message #{expected[0]} {_what(expected)} from rank {sender}"


def _what(part: tuple[int, int, int]) -> str:
    return f"(count {part[1] - 1}, {dtype_text(part[2])})"


def _call_text(description: tuple[int, ...]) -> str:
    """A rank's point-to-point call, from its description to one peer: 'recv #1 (count 3,
    float64)'."""
    sent, expected = _part(description, 0), _part(description, 1)
    calls = [f"{kind} #{part[0]} {_what(part)}"
             for kind, part in (("send", sent), ("recv", expected)) if part]
    return calls[0] if len(calls) == 1 else f"sendrecv ({', '.join(calls)})"
