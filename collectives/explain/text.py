"""The explainer's text: every step of a run with the buffers after it, and the bytes sent."""

from __future__ import annotations

import numpy

from .lessons import ALL_REDUCES, DTYPE, Setup
from .run import Run, digest
from .schedule import Move

MAX_SHOWN = 48  # longer buffers are not printed element by element


def _number(value: float) -> str:
    return "-" if numpy.isnan(value) else f"{value:g}"


def buffer_rows(run: Run, state: list[numpy.ndarray], width: int) -> list[str]:
    """`rank r  [ a b | c d ]`, with a bar between the pieces of the grid (and two between a
    buffer sent and the one received, where a lesson shows both)."""
    if run.setup.count > MAX_SHOWN:
        return []
    count = run.setup.count
    cuts = {hi for lo, hi in run.lesson.grid(run.setup)[:-1]}
    rows = []
    for rank, values in enumerate(state):
        cells = []
        for i, v in enumerate(values):
            whole = count and values.size % count == 0  # the buffer, or sent then received
            if whole and i and i % count == 0:
                cells.append("||")
            elif whole and i % count in cuts:
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


def narrate(run: Run, transport: str) -> list[str]:
    """The step-by-step text for one run."""
    s, lesson = run.setup, run.lesson
    head = f"{lesson.title}: {s.size} rank{'s' if s.size > 1 else ''}, {s.count} {DTYPE.name}"
    head += f" ({s.nbytes} bytes)"
    if lesson.reduces:
        head += f", op {s.op}"
    if lesson.rooted:
        head += f", root {s.root}"
    if s.node_size:
        head += f", {s.size // s.node_size} nodes of {s.node_size} ranks"
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
        moved = run.sent[rank]
        at = "as expected" if moved == bounds[rank] else f"expected {bounds[rank]:g} B"
        lines.append(f"  rank {rank}: {_size(moved, s.nbytes)}  ({at})")
    if s.node_size:
        k, nodes = s.node_size, s.size // s.node_size
        # 2(M-1) chunks of a shard cut in M, the shard a k-th of S: in whole elements.
        shard = -(-s.count // k)
        bound = 2 * (nodes - 1) * -(-shard // nodes) * DTYPE.itemsize
        flat = 2 * (s.size - 1) * s.nbytes / s.size
        lines += ["", f"of which between nodes (at most 2(M-1)/M S/k, in whole elements "
                      f"{bound} B; a flat ring's busiest rank sends 2(N-1)/N S = {flat:g} B "
                      f"across)"]
        lines += [f"  rank {rank}: {_size(b, s.nbytes)}  "
                  f"({'within the bound' if b <= bound else 'OVER THE BOUND'})"
                  for rank, b in enumerate(run.across)]
    if lesson.piece == "chunk" and any(m != b for m, b in zip(run.sent, bounds)):
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
    lines = narrate(run, transport)
    if setup.collective in ALL_REDUCES:
        lines += ["", *compare({n: digest(setup, n, per_rank) for n in ALL_REDUCES})]
    return "\n".join(lines) + "\n", run
