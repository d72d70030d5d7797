"""Running the lessons, traced, on thread ranks or the ranks of an MPI job; and digesting what
every rank recorded into a `Run`."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import numpy

import collectives

from transports.errors import InvalidArgumentError

from ..communicator import Communicator
from ..two_shot import AUTO_CHUNK_BYTES, two_shot_pays
from .lessons import DTYPE, LESSONS, Lesson, Setup
from .schedule import Divide, Move, replay, schedule


def run_rank(comm: Communicator, setup: Setup, names: tuple[str, ...]) -> dict:
    """What each rank does: run every lesson in `names` on its readable data, traced."""
    out = {}
    for name in names:
        lesson = LESSONS[name]
        block = setup.count // max(setup.size, 1) * DTYPE.itemsize
        if name == "reduce_scatter" and two_shot_pays(comm._transport, [block] * comm.size):
            raise InvalidArgumentError(
                f"on {comm.size} ranks that outnumber the cores, a reduce-scatter of blocks "
                f"of {AUTO_CHUNK_BYTES} bytes or more takes the two-shot algorithm "
                f"(collectives/two_shot.py), not the ring this lesson shows: give a smaller "
                f"--count")
        start = lesson.start(comm.rank, setup)
        with comm.trace() as records:
            result = lesson.run(comm, start, replace(setup, collective=name))
        out[name] = {"records": [dict(r) for r in records],
                     "result": numpy.asarray(result).ravel().tolist()}
    return out


def gather_json(comm: Communicator, payload: Any) -> list[Any]:
    """Every rank's `payload` (anything JSON can carry) on every rank, in rank order."""
    data = numpy.frombuffer(json.dumps(payload).encode(), numpy.uint8)
    sizes = comm.all_gather(numpy.array([data.size])).ravel()
    padded = numpy.zeros(int(sizes.max()), numpy.uint8)
    padded[: data.size] = data
    rows = comm.all_gather(padded)
    return [json.loads(bytes(row[:n])) for row, n in zip(rows, sizes)]


def on_threads(setup: Setup, names: tuple[str, ...]) -> list[dict]:
    """Run the lessons on `setup.size` thread ranks; every rank's records and results."""
    per_rank = collectives.spawn(run_rank, setup.size, setup, names,
                                 segment_bytes=setup.segment_bytes,
                                 one_shot_bytes=0,  # the ring, however small the buffer
                                 node_size=setup.node_size or None)
    return json.loads(json.dumps(per_rank))  # the same form as from real ranks


def job_size(transport: str) -> tuple[int, int]:
    """This rank's job: (size, rank). The Setup depends on the size, so a communicator is
    opened only to learn it."""
    with collectives.init(transport) as probe:
        return probe.size, probe.rank


def on_real_ranks(setup: Setup, transport: str,
                  names: tuple[str, ...]) -> tuple[list[dict], str]:
    """Run the lessons on the ranks of this MPI job; every rank gets every rank's records and
    results. Also returns the name of the transport that ran them."""
    with collectives.init(transport, segment_bytes=setup.segment_bytes,
                          one_shot_bytes=0,  # the ring, however small the buffer
                          node_size=setup.node_size or None) as comm:
        return gather_json(comm, run_rank(comm, setup, names)), comm.transport


@dataclass
class Run:
    """One lesson's recorded run, digested: the schedule, the buffers, and what was sent."""

    setup: Setup
    lesson: Lesson
    frames: list[list[Move]]
    states: list[list[numpy.ndarray]]  # every rank's buffer at the start and after each step
    divides: list[list[Divide]]  # what ranks divide after each step (op "avg")
    sent: list[int]  # bytes each rank sent, from the trace
    across: list[int]  # of which between nodes (the hierarchical transport's across part)
    replay_matches: bool
    reference_matches: bool

    @property
    def serial_bytes(self) -> int:
        """Bytes on the critical path: the largest message of each step, summed."""
        return sum(max(m.nbytes for m in frame) for frame in self.frames)

    def piece(self, move: Move) -> int | None:
        """Which piece of the grid a move carries (None: not one piece)."""
        lo, n = move.send
        grid = self.lesson.grid(self.setup)
        return grid.index((lo, lo + n)) if (lo, lo + n) in grid else None

    def note(self, divide: Divide) -> str:
        """'rank 1 divides [2:4) by 4 (op avg)'."""
        return (f"rank {divide.rank} divides [{divide.lo}:{divide.hi}) by {divide.by} "
                f"(op avg)")

    def written(self, step: int) -> list[numpy.ndarray]:
        """Which elements of each rank's buffer step `step` (from 1) writes."""
        marks = [numpy.zeros(b.size, bool) for b in self.states[0]]
        for move in self.frames[step - 1]:
            lo, n = move.recv
            # The naive ring receives into boxes, then reduces into the whole buffer.
            marks[move.dst][slice(None) if self.lesson.boxes else slice(lo, lo + n)] = True
        for d in self.divides[step - 1]:
            marks[d.rank][d.lo: d.hi] = True
        return marks

    def action(self, move: Move) -> str:
        """What the receiver does with a move: "reduce" or "copy"."""
        return "copy, then reduce into the buffer" if self.lesson.boxes else move.kind

    def label(self, move: Move, short: bool = False) -> str:
        """What a move carries: 'chunk 3 [6:8)' ('chunk 3' if short), 'whole buffer', '[lo:hi)'."""
        lo, n = move.send
        if self.lesson.piece == "buffer" and n == self.setup.count:
            return "whole buffer"
        where, k = f"[{lo}:{lo + n})", self.piece(move)
        if k is None:
            return where
        return f"{self.lesson.piece} {k}" if short else f"{self.lesson.piece} {k} {where}"


def digest(setup: Setup, name: str, per_rank: list[dict]) -> Run:
    """Turn every rank's records and result for lesson `name` into a `Run`."""
    lesson, setup = LESSONS[name], replace(setup, collective=name)
    records = [p[name]["records"] for p in per_rank]
    sent = [sum(r["bytes"] for r in mine) for mine in records]
    across = [sum(r["bytes"] for r in mine if r.get("part") == "across") for mine in records]
    frames = schedule(records)
    states, divides = replay(lesson, setup, frames, records)
    replay_ok, reference_ok = True, True
    for rank, p in enumerate(per_rank):
        result = numpy.array(p[name]["result"], dtype=DTYPE)
        target = lesson.target(rank, setup)
        kept = ~numpy.isnan(target)
        replay_ok &= numpy.array_equal(states[-1][rank][kept], result)
        reference_ok &= numpy.array_equal(target[kept], result)
    return Run(setup, lesson, frames, states, divides, sent, across,
               bool(replay_ok), bool(reference_ok))
