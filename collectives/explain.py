"""Watch a collective run, step by step: `python -m collectives.explain all_reduce --ranks 4`.

The explainer runs the real collective on readable data (rank r holds r*10 + i), on thread ranks
or, under `mpiexec` with `--transport mpi`, on the real ranks, and records every transfer with
`comm.trace()`. From the records alone it rebuilds the schedule: which rank sent which chunk to
which rank in each step. It replays those moves with NumPy on the starting buffers to show every
rank's buffer after every step, checks that the replay ends exactly where the collective did,
and counts the bytes each rank sent against the bound for the collective. For all-reduce it
also runs the two naive algorithms of `naive.py`, so the ring's savings are there to see.

    python -m collectives.explain all_reduce --ranks 4 --count 8 --svg ring.svg
    mpiexec -n 4 python -m collectives.explain broadcast --root 2 --transport mpi
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy

import collectives
from transports.base import segments

from . import naive, ring_picture
from .chunking import chunk_bounds
from .communicator import Communicator

DTYPE = numpy.dtype(numpy.float64)
MAX_SHOWN = 48  # longer buffers are not printed element by element
EMPTY = numpy.nan  # an element nothing has been written to yet
REDUCE = {"sum": numpy.add, "prod": numpy.multiply, "min": numpy.minimum,
          "max": numpy.maximum, "avg": numpy.add}


@dataclass(frozen=True)
class Setup:
    """What to run: a collective (or naive algorithm) on `size` ranks of `count` elements."""

    collective: str
    size: int
    count: int
    root: int = 0
    op: str = "sum"
    segment_bytes: int = DTYPE.itemsize

    @property
    def block(self) -> int:
        return self.count // self.size

    @property
    def nbytes(self) -> int:
        return self.count * DTYPE.itemsize


def readable(rank: int, count: int) -> numpy.ndarray:
    """The data rank `rank` starts with: r*10 + i, so every value says where it came from."""
    return rank * 10 + numpy.arange(count, dtype=DTYPE)


def _reduced(setup: Setup) -> numpy.ndarray:
    """NumPy's reduction of every rank's readable buffer: the reference for the reductions."""
    stack = numpy.stack([readable(r, setup.count) for r in range(setup.size)])
    total = REDUCE[setup.op].reduce(stack, axis=0)
    return total / setup.size if setup.op == "avg" else total


def _blocks(setup: Setup) -> list[tuple[int, int]]:
    return [(r * setup.block, (r + 1) * setup.block) for r in range(setup.size)]


def _only(target: numpy.ndarray, lo: int, hi: int) -> numpy.ndarray:
    """`target` with every element outside [lo, hi) marked as not part of the result."""
    out = numpy.full_like(target, EMPTY)
    out[lo:hi] = target[lo:hi]
    return out


# ---- the lessons ----------------------------------------------------------------------------
#
# Each lesson says how to start a rank's buffer (`start`: the array the trace's offsets refer
# to, which is also what the explainer shows), how to run the real collective on it (`run`),
# and what each rank's buffer should hold at the end (`target`: NaN where the collective leaves
# no result). `sends` says what each rank should send.


@dataclass(frozen=True)
class Lesson:
    title: str
    piece: str  # what the schedule moves: "chunk", "block", "segment" or "buffer"
    grid: Callable[[Setup], list[tuple[int, int]]]
    start: Callable[[int, Setup], numpy.ndarray]
    run: Callable[[Communicator, numpy.ndarray, Setup], Any]
    target: Callable[[int, Setup], numpy.ndarray]
    sends: Callable[[Setup], tuple[list[float], str]]  # bytes each rank should send, and why
    reduces: bool = False
    rooted: bool = False
    blocks: bool = False  # the buffer is cut into N equal blocks, so N must divide count
    # op "avg": the phase after whose last move a rank divides `averaged(rank)` by N.
    average_phase: str = ""
    averaged: Callable[[int, Setup], tuple[int, int]] = field(default=lambda r, s: (0, s.count))
    boxes: bool = False  # naive ring: moves land in two boxes, then reduce into the buffer


def _whole(setup: Setup) -> list[tuple[int, int]]:
    return [(0, setup.count)]


def _every_rank(per_rank: Callable[[Setup], float],
                text: str) -> Callable[[Setup], tuple[list[float], str]]:
    """The same for every rank: `per_rank(setup)` bytes."""
    return lambda s: ([per_rank(s)] * s.size, text)


def _all_reduce_target(rank: int, setup: Setup) -> numpy.ndarray:
    return _reduced(setup)


def _reduce_broadcast_sends(setup: Setup) -> tuple[list[float], str]:
    others = setup.nbytes if setup.size > 1 else 0
    sent = [float(others)] * setup.size
    sent[setup.root] = (setup.size - 1) * setup.nbytes
    return sent, "the root sends (N-1) S, every other rank S"


def _broadcast_sends(setup: Setup) -> tuple[list[float], str]:
    sent = [float(setup.nbytes)] * setup.size
    sent[(setup.root - 1) % setup.size] = 0.0  # the end of the chain forwards nothing
    return sent, "every rank but the end of the chain forwards S once"


def _scatter_sends(setup: Setup) -> tuple[list[float], str]:
    sent = [0.0] * setup.size
    sent[setup.root] = (setup.size - 1) * setup.nbytes / setup.size
    return sent, "the root sends (N-1)/N S: every block but its own, once"


def _scatter_start(rank: int, setup: Setup) -> numpy.ndarray:
    if rank == setup.root:
        return readable(rank, setup.count)
    return numpy.full(setup.block, EMPTY)


def _scatter_run(comm: Communicator, start: numpy.ndarray, setup: Setup) -> numpy.ndarray:
    if comm.rank == setup.root:
        return comm.scatter(start.reshape(setup.size, setup.block), None, setup.root)
    return comm.scatter(None, start, setup.root)


def _scatter_target(rank: int, setup: Setup) -> numpy.ndarray:
    lo, hi = _blocks(setup)[rank]
    sent = readable(setup.root, setup.count)
    return _only(sent, lo, hi) if rank == setup.root else sent[lo:hi]


def _all_gather_start(rank: int, setup: Setup) -> numpy.ndarray:
    out = numpy.full(setup.count, EMPTY)
    lo, hi = _blocks(setup)[rank]
    out[lo:hi] = readable(rank, setup.block)
    return out


def _all_gather_run(comm: Communicator, start: numpy.ndarray, setup: Setup) -> numpy.ndarray:
    lo, hi = _blocks(setup)[comm.rank]
    return comm.all_gather(start[lo:hi].copy(), start.reshape(setup.size, setup.block))


def _reduce_scatter_target(rank: int, setup: Setup) -> numpy.ndarray:
    return _only(_reduced(setup), *_blocks(setup)[rank])


LESSONS: dict[str, Lesson] = {
    "all_reduce": Lesson(
        "ring all-reduce", "chunk", lambda s: chunk_bounds(s.count, s.size),
        lambda r, s: readable(r, s.count),
        lambda comm, buf, s: comm.all_reduce(buf, buf, op=s.op),
        _all_reduce_target,
        _every_rank(lambda s: 2 * (s.size - 1) * s.nbytes / s.size,
                    "2(N-1)/N S each, the least the busiest rank can send"),
        reduces=True, average_phase="reduce-scatter",
        averaged=lambda r, s: chunk_bounds(s.count, s.size)[(r + 1) % s.size]),
    "all_gather": Lesson(
        "ring all-gather", "block", _blocks, _all_gather_start, _all_gather_run,
        lambda r, s: numpy.concatenate([readable(k, s.block) for k in range(s.size)]),
        _every_rank(lambda s: (s.size - 1) * s.nbytes / s.size,
                    "(N-1)/N S each, S the whole output: the least possible"),
        blocks=True),
    "reduce_scatter": Lesson(
        "ring reduce-scatter", "block", _blocks, lambda r, s: readable(r, s.count),
        lambda comm, buf, s: comm.reduce_scatter(buf.reshape(s.size, s.block), op=s.op),
        _reduce_scatter_target,
        _every_rank(lambda s: (s.size - 1) * s.nbytes / s.size,
                    "(N-1)/N S each, S the whole input: the least possible"),
        reduces=True, blocks=True, average_phase="reduce-scatter",
        averaged=lambda r, s: _blocks(s)[r]),
    "broadcast": Lesson(
        "pipelined ring broadcast", "segment",
        lambda s: segments(s.count, DTYPE.itemsize, s.segment_bytes),
        lambda r, s: readable(r, s.count),
        lambda comm, buf, s: comm.broadcast(buf, s.root),
        lambda r, s: readable(s.root, s.count), _broadcast_sends, rooted=True),
    "scatter": Lesson(
        "scatter from the root", "block", _blocks, _scatter_start, _scatter_run,
        _scatter_target, _scatter_sends, rooted=True, blocks=True),
    "naive_ring": Lesson(
        "whole-buffer ring all-reduce (naive)", "buffer", _whole,
        lambda r, s: readable(r, s.count),
        lambda comm, buf, s: naive.all_reduce(comm, buf, "naive_ring", s.op),
        _all_reduce_target, _every_rank(lambda s: (s.size - 1) * s.nbytes, "(N-1) S each"),
        reduces=True, average_phase="whole-buffer ring", boxes=True),
    "reduce_broadcast": Lesson(
        "reduce to the root, then broadcast (naive)", "buffer", _whole,
        lambda r, s: readable(r, s.count),
        lambda comm, buf, s: naive.all_reduce(comm, buf, "reduce_broadcast", s.op),
        _all_reduce_target, _reduce_broadcast_sends, reduces=True, average_phase="reduce"),
}
ALL_REDUCES = ("all_reduce", "naive_ring", "reduce_broadcast")


# ---- from records to a schedule -------------------------------------------------------------


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
    """Op "avg": after a step, `rank` divides its elements [lo, hi) by N."""

    rank: int
    lo: int
    hi: int


def _drop_scatter_headers(records: list[dict]) -> list[dict]:
    """Scatter sends each rank a small header (the block's shape) before its block; the
    header is not part of the schedule."""
    return [record for record in records if record["phase"] != "scatter header"]


def schedule(records: list[list[dict]]) -> list[list[Move]]:
    """Group the recorded transfers of every rank into steps that happen together.

    A send on one rank and its receive on another are one message (messages between two ranks
    arrive in order, so the k-th send from a to b is the k-th receive on b from a), and belong
    to the same step; each rank takes part in at most one step at a time, in the order it
    recorded. Each step is as early as these two rules allow.
    """
    sends: dict[tuple[int, int], deque] = defaultdict(deque)
    for rank, mine in enumerate(records):
        for index, record in enumerate(mine):
            if record["dst"] is not None:
                sends[(rank, record["dst"])].append(index)
    pairs = []  # (sender, its record, receiver, its record)
    for rank, mine in enumerate(records):
        for index, record in enumerate(mine):
            if record["src"] is not None:
                queue = sends[(record["src"], rank)]
                if not queue:
                    raise ValueError(f"rank {rank} received from rank {record['src']}, "
                                     f"which recorded no matching send")
                pairs.append((record["src"], queue.popleft(), rank, index))
    if any(sends.values()):
        raise ValueError("the trace has sends that no rank received")

    time = [list(range(len(mine))) for mine in records]
    for _ in range(sum(map(len, records)) + 1):
        changed = False
        for a, i, b, j in pairs:
            both = max(time[a][i], time[b][j])
            changed |= (time[a][i], time[b][j]) != (both, both)
            time[a][i] = time[b][j] = both
        for mine in time:
            for index in range(1, len(mine)):
                if mine[index] <= mine[index - 1]:
                    mine[index], changed = mine[index - 1] + 1, True
        if not changed:
            break
    else:
        raise ValueError("the recorded transfers cannot be put in steps (a cycle of waits)")

    steps = sorted({t for mine in time for t in mine})
    frames: list[list[Move]] = [[] for _ in steps]
    for a, i, b, j in sorted(pairs, key=lambda p: (time[p[0]][p[1]], p[0])):
        sent, received = records[a][i], records[b][j]
        frames[steps.index(time[a][i])].append(Move(
            a, b, tuple(sent["send"]), tuple(received["recv"]), received["kind"],
            received["phase"], sent["bytes"]))
    return frames


def replay(lesson: Lesson, setup: Setup, frames: list[list[Move]],
           records: list[list[dict]]) -> tuple[list[list[numpy.ndarray]], list[list[Divide]]]:
    """Every rank's buffer at the start and after each step, by replaying the moves with NumPy;
    and, for each step, the ranges ranks divide after it (op "avg").

    Each step first reads everything that is sent, then lands it: a rank never sends what it
    receives in the same step. For op "avg", a rank divides its reduced range by N after the
    last step in which it received during `lesson.average_phase`, as the algorithms do.
    """
    op = REDUCE[setup.op]
    shown = [lesson.start(r, setup) for r in range(setup.size)]
    moved = [numpy.concatenate([b, numpy.full(b.size, EMPTY)]) if lesson.boxes else b
             for b in shown]
    divide_after = {}  # rank -> after how many of its steps it divides
    if setup.op == "avg":
        for rank, mine in enumerate(records):
            reduced = [k for k, r in enumerate(mine)
                       if r["phase"] == lesson.average_phase and r["recv"] is not None]
            if reduced:
                divide_after[rank] = reduced[-1] + 1
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
                numpy.true_divide(shown[rank][lo:hi], setup.size, out=shown[rank][lo:hi])
                divides[-1].append(Divide(rank, lo, hi))
        states.append([b.copy() for b in shown])
    return states, divides


# ---- running it -----------------------------------------------------------------------------


def run_rank(comm: Communicator, setup: Setup, names: tuple[str, ...]) -> dict:
    """What each rank does: run every lesson in `names` on its readable data, traced."""
    out = {}
    for name in names:
        lesson = LESSONS[name]
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


@dataclass
class Run:
    """One lesson's recorded run, digested: the schedule, the buffers, and what was sent."""

    setup: Setup
    lesson: Lesson
    frames: list[list[Move]]
    states: list[list[numpy.ndarray]]  # every rank's buffer at the start and after each step
    divides: list[list[Divide]]  # what ranks divide after each step (op "avg")
    sent: list[int]  # bytes each rank sent, from the trace
    header_bytes: list[int]  # of which scatter's shape headers
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
        return (f"rank {divide.rank} divides [{divide.lo}:{divide.hi}) by {self.setup.size} "
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
    if name == "scatter":
        records = [_drop_scatter_headers(mine) for mine in records]
    header_bytes = [s - sum(r["bytes"] for r in mine) for s, mine in zip(sent, records)]
    frames = schedule(records)
    states, divides = replay(lesson, setup, frames, records)
    replay_ok, reference_ok = True, True
    for rank, p in enumerate(per_rank):
        result = numpy.array(p[name]["result"], dtype=DTYPE)
        target = lesson.target(rank, setup)
        kept = ~numpy.isnan(target)
        replay_ok &= numpy.array_equal(states[-1][rank][kept], result)
        reference_ok &= numpy.array_equal(target[kept], result)
    return Run(setup, lesson, frames, states, divides, sent, header_bytes, bool(replay_ok),
               bool(reference_ok))


# ---- printing it ----------------------------------------------------------------------------


def _number(value: float) -> str:
    return "-" if numpy.isnan(value) else f"{value:g}"


def buffer_rows(run: Run, state: list[numpy.ndarray], width: int) -> list[str]:
    """`rank r  [ a b | c d ]`, with a bar between the pieces of the grid."""
    if run.setup.count > MAX_SHOWN:
        return []
    cuts = {hi for lo, hi in run.lesson.grid(run.setup)[:-1]}
    rows = []
    for rank, values in enumerate(state):
        cells = []
        for i, v in enumerate(values):
            if i in cuts and values.size == run.setup.count:
                cells.append("|")
            cells.append(_number(v).rjust(width))
        rows.append(f"  rank {rank}  [ {' '.join(cells)} ]")
    return rows


def _arrow(run: Run, move: Move) -> str:
    text = f"  rank {move.src} -> rank {move.dst}: {run.label(move)}"
    if move.recv != move.send and not run.lesson.boxes:
        text += f" into [{move.recv[0]}:{move.recv[0] + move.recv[1]})"
    return f"{text} {run.action(move)}"


def _size(nbytes: float, whole: int) -> str:
    """'96 B = 1.5 S'."""
    ratio = f" = {nbytes / whole:.3g} S" if whole else ""
    return f"{nbytes:g} B{ratio}"


def describe(run: Run, transport: str) -> list[str]:
    """The step-by-step text for one run."""
    s, lesson = run.setup, run.lesson
    head = f"{lesson.title}: {s.size} rank{'s' if s.size > 1 else ''}, {s.count} {DTYPE.name}"
    head += f" ({s.nbytes} bytes)"
    if lesson.reduces:
        head += f", op {s.op}"
    if lesson.rooted:
        head += f", root {s.root}"
    lines = [head + f", {transport} transport"]
    grid = lesson.grid(s)
    if lesson.piece == "buffer":
        lines.append("rank r starts with r*10 + i; every message carries a whole buffer")
    else:
        pieces = "  ".join(f"{k}=[{lo}:{hi})" for k, (lo, hi) in enumerate(grid))
        lines.append(f"rank r starts with r*10 + i; {lesson.piece}s: {pieces or 'none'}")
    if lesson.boxes:
        lines.append("each rank forwards what it received last and adds it into its buffer")
    if s.count > MAX_SHOWN:
        lines.append(f"(buffers of more than {MAX_SHOWN} elements are not printed)")
    width = max(len(_number(v)) for state in run.states for b in state for v in b.tolist() + [0])
    start = buffer_rows(run, run.states[0], width)
    lines += ["", "start", *start] if start else []
    for k, (frame, state) in enumerate(zip(run.frames, run.states[1:]), start=1):
        phases = " + ".join(dict.fromkeys(m.phase for m in frame))
        lines += ["", f"step {k} of {len(run.frames)}: {phases}"]
        lines += [_arrow(run, m) for m in frame]
        lines += [f"  {run.note(d)}" for d in run.divides[k - 1]]
        lines += buffer_rows(run, state, width)
    if not run.frames:
        lines += ["", "nothing moves: " + ("one rank already holds everything" if s.size == 1
                                           else "the buffer is empty")]
    yes = {True: "yes", False: "NO"}
    lines += ["", f"replay of the recorded moves ends where the collective did, on every rank: "
                  f"{yes[run.replay_matches]}",
              f"the result equals NumPy's reference: {yes[run.reference_matches]}"]
    bounds, text = lesson.sends(s)
    lines += ["", f"bytes each rank sent (S = {s.nbytes} bytes; expected: {text})"]
    for rank in range(s.size):
        note = ""
        if run.header_bytes[rank]:
            note = f" + {run.header_bytes[rank]} B of shape header"
        moved = run.sent[rank] - run.header_bytes[rank]
        at = "as expected" if moved == bounds[rank] else f"expected {bounds[rank]:g} B"
        lines.append(f"  rank {rank}: {_size(moved, s.nbytes)}{note}  ({at})")
    if lesson.piece == "chunk" and any(m != b for m, b in
                                       zip(numpy.subtract(run.sent, run.header_bytes), bounds)):
        lines.append(f"  chunks differ in size, so ranks differ; together they send "
                     f"2(N-1) S = {2 * (s.size - 1) * s.nbytes} B, the bound times N")
    return lines


def compare(runs: dict[str, Run]) -> list[str]:
    """The all-reduce algorithms side by side: steps, bytes, and the alpha-beta time."""
    s = next(iter(runs.values())).setup
    lines = [f"all-reduce three ways on the same data ({s.size} ranks, S = {s.nbytes} bytes); "
             f"time ~ steps * a + serial bytes * b",
             f"  {'algorithm':<18} {'steps':>5}  {'most sent by a rank':>20}  "
             f"{'sent by all ranks':>18}  {'serial bytes':>16}"]
    for name, run in runs.items():
        name = "all_reduce (ring)" if name == "all_reduce" else name
        lines.append(f"  {name:<18} {len(run.frames):>5}  {_size(max(run.sent), s.nbytes):>20}  "
                     f"{_size(sum(run.sent), s.nbytes):>18}  "
                     f"{_size(run.serial_bytes, s.nbytes):>16}")
    return lines


def explain(setup: Setup, per_rank: list[dict], transport: str) -> tuple[str, Run]:
    """The whole text for `setup`, from every rank's recorded runs; and the main Run."""
    run = digest(setup, setup.collective, per_rank)
    lines = describe(run, transport)
    if setup.collective in ALL_REDUCES:
        lines += ["", *compare({n: digest(setup, n, per_rank) for n in ALL_REDUCES})]
    return "\n".join(lines) + "\n", run


# ---- the command line -----------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m collectives.explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("collective", choices=list(LESSONS))
    parser.add_argument("--ranks", type=int, help="thread ranks (default 4); under mpiexec the "
                        "job's ranks")
    parser.add_argument("--count", type=int, default=8, help="elements in the buffer (all-gather:"
                        " the output; reduce-scatter, scatter: the input)")
    parser.add_argument("--root", type=int, help="root rank (broadcast, scatter, "
                        "reduce_broadcast)")
    parser.add_argument("--op", choices=list(REDUCE), help="reduction (default sum)")
    host_transports = [t for t in collectives.TRANSPORTS if t != "cuda_ipc"]  # NumPy data
    parser.add_argument("--transport", default="threads", choices=["threads", *host_transports])
    parser.add_argument("--segment-bytes", type=int, help="pipelining segment (default: the "
                        "whole buffer; for broadcast, the buffer cut in N so its pipeline shows)")
    parser.add_argument("--svg", metavar="FILE", help="draw the schedule as an animated SVG")
    parser.add_argument("--html", metavar="FILE", help="draw it as a page that steps through it")
    parser.add_argument("--frame", type=int, metavar="K",
                        help="with --svg: a still of step K only (0: the start)")
    args = parser.parse_args(argv)
    lesson = LESSONS[args.collective]
    if args.op is not None and not lesson.reduces:
        parser.error(f"{args.collective} does not reduce; --op does not apply")
    if args.root is not None and not lesson.rooted:
        parser.error(f"{args.collective} has no root; --root does not apply")
    if args.count < 0:
        parser.error("--count must not be negative")
    if args.frame is not None and not args.svg:
        parser.error("--frame draws a still SVG; give --svg too")
    return args


def setup_for(args: argparse.Namespace, size: int) -> Setup:
    """The Setup the arguments describe on `size` ranks; ValueError if they do not fit."""
    lesson = LESSONS[args.collective]
    root = args.root or 0
    if size < 1:
        raise ValueError("--ranks must be at least 1")
    if not 0 <= root < size:
        raise ValueError(f"--root {root} is not a rank in [0, {size})")
    if lesson.blocks and args.count % size:
        raise ValueError(f"{args.collective} cuts the buffer into {size} equal blocks; "
                         f"--count {args.count} is not a multiple of {size}")
    # Broadcast pipelines segments: cut the buffer in N so the pipeline shows. The others
    # move whole chunks whatever the segment, so one segment per buffer keeps the trace short.
    pieces = size if args.collective == "broadcast" else 1
    segment = args.segment_bytes or -(-max(args.count, 1) // pieces) * DTYPE.itemsize
    return Setup(args.collective, size, args.count, root, args.op or "sum", segment)


def on_real_ranks(args: argparse.Namespace,
                  names: tuple[str, ...]) -> tuple[Setup, list[dict], int, str]:
    """Run the lessons on the ranks of this MPI job; every rank gets every rank's records.
    Returns (setup, per-rank records and results, this rank, the transport's name)."""
    with collectives.init(args.transport) as probe:  # only to learn the job's size
        size, rank = probe.size, probe.rank
    try:
        if args.ranks is not None and args.ranks != size:
            raise ValueError(f"--ranks {args.ranks}, but the job has {size} ranks")
        setup = setup_for(args, size)
    except ValueError as error:
        sys.exit(f"explain: {error}" if rank == 0 else 1)
    with collectives.init(args.transport, segment_bytes=setup.segment_bytes,
                          one_shot_bytes=0) as comm:  # the ring, however small the buffer
        return setup, gather_json(comm, run_rank(comm, setup, names)), rank, comm.transport


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    names = ALL_REDUCES if args.collective in ALL_REDUCES else (args.collective,)
    if args.transport == "threads":
        try:
            setup = setup_for(args, 4 if args.ranks is None else args.ranks)
        except ValueError as error:
            sys.exit(f"explain: {error}")
        per_rank = collectives.spawn(run_rank, setup.size, setup, names,
                                     segment_bytes=setup.segment_bytes,
                                     one_shot_bytes=0)  # the ring, however small the buffer
        per_rank = json.loads(json.dumps(per_rank))  # the same form as from real ranks
        rank, transport = 0, "threads"
    else:
        setup, per_rank, rank, transport = on_real_ranks(args, names)
    if rank != 0:
        return
    try:
        text, run = explain(setup, per_rank, transport)
        pictures = {}
        if args.svg:
            pictures[args.svg] = ring_picture.svg(run, still=args.frame)
        if args.html:
            pictures[args.html] = ring_picture.html(run)
    except ValueError as error:
        sys.exit(f"explain: {error}")
    sys.stdout.write(text)
    for path, picture in pictures.items():
        with open(path, "w") as out:
            out.write(picture)


if __name__ == "__main__":
    main()
