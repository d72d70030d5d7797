"""From trace records to a schedule: the messages of each step, and their replay with NumPy."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import numpy

from .lessons import EMPTY, REDUCE, Lesson, Setup


@dataclass(frozen=True)
class Move:
    """One message: `src` sent elements send=(offset, count) to `dst`, which received them
    into recv=(offset, count), copying or reducing ("copy" / "reduce")."""

    src: int
    dst: int
    send: tuple[int, int]
    recv: tuple[int, int]
    kind: str
    phase: str
    nbytes: int


@dataclass(frozen=True)
class Divide:
    """Op "avg": after a step, `rank` divides its elements [lo, hi) by `by` (the ranks it
    has reduced: N, or for a scan r + 1)."""

    rank: int
    lo: int
    hi: int
    by: int


def schedule(records: list[list[dict]]) -> list[list[Move]]:
    """Group the recorded transfers of every rank into steps that happen together.

    A send on one rank and its receive on another are one message (messages between two ranks
    arrive in order, so the k-th send from a to b is the k-th receive on b from a), and belong
    to the same step; each rank takes part in at most one step at a time, in the order it
    recorded. Each step is as early as these two rules allow.

    A record that both sends and receives (a sendrecv) is one step where the rules allow it.
    Where they do not, a rank moved its halves apart: a sendrecv with two peers does where one
    peer comes first (`point_to_point.two_peers`), and the ring of its peers, who moved both
    halves at once, then cannot be put in steps with each sendrecv whole. Then every sendrecv
    is a send and a receive, in one step or either one first: a rank that moved both at once
    may have received before it sent, or after.
    """
    try:
        return _steps(records, split=False)
    except CycleOfWaits:
        return _steps(records, split=True)


class CycleOfWaits(ValueError):
    """The recorded transfers cannot be put in steps (`schedule`)."""


def _steps(records: list[list[dict]], split: bool) -> list[list[Move]]:
    """`schedule`, each sendrecv whole, or `split` into its send and its receive."""
    # Each rank's events: (its record, what of it: "send", "recv" or both), in order.
    events = [[(index, part) for index, record in enumerate(mine)
               for part in (("send", "recv") if split else ("both",))
               if part == "both" or record["dst" if part == "send" else "src"] is not None]
              for mine in records]
    sends: dict[tuple[int, int], deque] = defaultdict(deque)
    for rank, mine in enumerate(events):
        for event, (index, part) in enumerate(mine):
            if part != "recv" and records[rank][index]["dst"] is not None:
                sends[(rank, records[rank][index]["dst"])].append(event)
    pairs = []  # (sender, its event, receiver, its event)
    for rank, mine in enumerate(events):
        for event, (index, part) in enumerate(mine):
            record = records[rank][index]
            if part != "send" and record["src"] is not None:
                queue = sends[(record["src"], rank)]
                if not queue:
                    raise ValueError(f"rank {rank} received from rank {record['src']}, "
                                     f"which recorded no matching send")
                pairs.append((record["src"], queue.popleft(), rank, event))
    if any(sends.values()):
        raise ValueError("the trace has sends that no rank received")

    # The events of one record (a split sendrecv's halves) may share a step or come in either
    # order; each event of a rank's next record comes a step after all of them.
    time = [[0] * len(mine) for mine in events]
    for _ in range(sum(map(len, events)) + 1):
        changed = False
        for a, i, b, j in pairs:
            both = max(time[a][i], time[b][j])
            changed |= (time[a][i], time[b][j]) != (both, both)
            time[a][i] = time[b][j] = both
        for mine, when in zip(events, time):
            latest, record, earliest = -1, None, 0
            for k, (index, _) in enumerate(mine):
                if index != record:
                    record, earliest = index, latest + 1
                if when[k] < earliest:
                    when[k], changed = earliest, True
                latest = max(latest, when[k])
        if not changed:
            break
    else:
        raise CycleOfWaits("the recorded transfers cannot be put in steps (a cycle of waits)")

    steps = sorted({t for mine in time for t in mine})
    frames: list[list[Move]] = [[] for _ in steps]
    for a, i, b, j in sorted(pairs, key=lambda p: (time[p[0]][p[1]], p[0])):
        sent, received = records[a][events[a][i][0]], records[b][events[b][j][0]]
        frames[steps.index(time[a][i])].append(Move(
            a, b, tuple(sent["send"]), tuple(received["recv"]), received["kind"],
            received["phase"], sent["bytes"]))
    return frames


def replay(lesson: Lesson, setup: Setup, frames: list[list[Move]],
           records: list[list[dict]]) -> tuple[list[list[numpy.ndarray]], list[list[Divide]]]:
    """Every rank's buffer at the start and after each step, by replaying the moves with NumPy;
    and, for each step, the ranges ranks divide after it (op "avg").

    Each step first reads everything that is sent, then lands it: a rank never sends what it
    receives in the same step. For op "avg", a rank that received during
    `lesson.average_phase` divides its reduced range (by N, or as the lesson says) after its
    last step of that phase, as the algorithms do; or, for `lesson.divide_before`, every rank
    divides before its first step of that phase.
    """
    op = REDUCE[setup.op]
    shown = [lesson.start(r, setup) for r in range(setup.size)]
    moved = [numpy.concatenate([b, numpy.full(b.size, EMPTY)]) if lesson.boxes else b
             for b in shown]
    divide_after = {}  # rank -> after how many of its steps it divides
    if setup.op == "avg":
        for rank, mine in enumerate(records):
            if lesson.divide_before:
                later = [k for k, r in enumerate(mine) if r["phase"] == lesson.divide_before]
                divide_after[rank] = later[0] if later else len(mine)
                continue
            steps = [k for k, r in enumerate(mine) if r["phase"] == lesson.average_phase]
            if any(mine[k]["recv"] is not None for k in steps):
                divide_after[rank] = steps[-1] + 1
    done = [0] * setup.size
    states, divides = [[b.copy() for b in shown]], []
    for frame in frames:
        data = [moved[m.src][m.send[0]: m.send[0] + m.send[1]].copy() for m in frame]
        for move, payload in zip(frame, data):
            lo, n = move.recv
            target = moved[move.dst][lo: lo + n]
            if move.kind == "reduce":
                op(target, payload, out=target)
            else:
                target[...] = payload
            if lesson.boxes:
                op(shown[move.dst], target, out=shown[move.dst])
        divides.append([])
        for rank in sorted({r for m in frame for r in (m.src, m.dst)}):
            done[rank] += 1
            if divide_after.get(rank) == done[rank]:
                lo, hi = lesson.averaged(rank, setup)
                by = lesson.divisor(rank, setup)
                numpy.true_divide(shown[rank][lo:hi], by, out=shown[rank][lo:hi])
                divides[-1].append(Divide(rank, lo, hi, by))
        states.append([b.copy() for b in shown])
    return states, divides
