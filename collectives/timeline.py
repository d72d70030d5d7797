"""A timeline of what every rank did when, as Chrome trace events (Perfetto, chrome://tracing).

While tracing, the transport records every transfer with its start and end (transports/base.py)
and the communicator records every call, and every `comm.span("backward")` of the caller's
own work, in the trace's `calls`. `write_timeline` gathers every rank's records at rank 0 and
writes one JSON file in the trace-event format, as Horovod's timeline does:

- one process per rank ("rank 0", "rank 1", ...);
- one row per kind of work: "spans" (the caller's own), "calls" (each collective, from its
  start to its end, on whichever thread ran it), and one row per phase of the algorithms
  ("reduce-scatter", "all-gather", ...), where each step is one event with its call, step,
  bytes and peers;
- times in microseconds from the earliest event of the job.

Within a row a rank's events never overlap: one call runs at a time (work.py), and the steps
of a call follow each other. Transfers of one call and phase that run at once (the exchange of
a one-shot call, the sends a two-shot pass keeps under way) become one event, from the first
start to the last end, their bytes and peers summed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy

from .arrays import module_for_device, to_numpy

CALLS_ROW, SPANS_ROW = "calls", "spans"


class Trace(list):
    """The transfers one rank recorded (dicts; see `Communicator.trace`), and in `calls` each
    call's and span's (row, name, start, end) in `time.perf_counter()` seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, float, float]] = []


def record_call(trace: list, name: str, start: float, end: float) -> None:
    """A call ran from `start` to `end` (a plain list, traced by hand, keeps no calls)."""
    if isinstance(trace, Trace):
        trace.calls.append((CALLS_ROW, name, start, end))


def record_span(trace: list, name: str, start: float, end: float) -> None:
    """The caller's own work `name` ran from `start` to `end`."""
    if isinstance(trace, Trace):
        trace.calls.append((SPANS_ROW, name, start, end))


def rank_events(rank: int, trace: list) -> dict:
    """This rank's records as complete ("X") trace events with their row's name in "tid", in
    microseconds from this rank's first event, which began at "origin" (wall-clock seconds)."""
    events: list[tuple[str, str, float, float, dict]] = [
        (row, name, start, end, {}) for row, name, start, end in getattr(trace, "calls", ())]
    merged: dict[float, dict] = {}  # the records of one exchange share their start
    for record in trace:
        if record.get("end") is None:
            continue  # interrupted by a failure
        args = merged.get(record["start"])
        if args is None:
            args = merged[record["start"]] = {"call": record["where"], "step": record["step"],
                                              "kind": record["kind"], "bytes": 0, "to": [],
                                              "from": []}
            events.append((record["phase"] or "transfers",
                           f"{record['phase'] or record['kind']} step {record['step']}",
                           record["start"], record["end"], args))
        args["bytes"] += record["bytes"]
        if record["dst"] is not None:
            args["to"].append(record["dst"])
        if record["src"] is not None:
            args["from"].append(record["src"])
    events = _merge_overlapping(events)
    first = min((start for _, _, start, _, _ in events), default=0.0)
    # Rounded ends, not rounded durations: an event that ends before the next one in its row
    # begins still does once rounded.
    return {"origin": time.time() - time.perf_counter() + first,
            "events": [{"name": name, "ph": "X", "pid": rank, "tid": row,
                        "ts": round((start - first) * 1e6, 3),
                        "dur": round(round((end - first) * 1e6, 3)
                                     - round((start - first) * 1e6, 3), 3),
                        "args": args}
                       for row, name, start, end, args in events]}


def _merge_overlapping(events: list[tuple]) -> list[tuple]:
    """Transfer events of one call in one row that overlap, as one event (see above); the
    calls' and spans' rows as they are."""
    out: list[list] = []
    for row, name, start, end, args in sorted(events, key=lambda e: (e[0], e[2])):
        last = out[-1] if out and out[-1][0] == row else None
        if last is not None and args and last[4] and args["call"] == last[4]["call"] \
                and start < last[3]:
            last[3] = max(last[3], end)
            held = last[4]
            held["bytes"] += args["bytes"]
            held["to"] += [peer for peer in args["to"] if peer not in held["to"]]
            held["from"] += [peer for peer in args["from"] if peer not in held["from"]]
            continue
        out.append([row, name, start, end, args])
    return [tuple(event) for event in out]


def chrome_trace(per_rank: list[dict]) -> dict:
    """Every rank's events as one trace: rows numbered and named, times from the first."""
    origin = min((rank["origin"] for rank in per_rank if rank["events"]), default=0.0)
    events = [{**e, "ts": round(e["ts"] + round((rank["origin"] - origin) * 1e6, 3), 3)}
              for rank in per_rank for e in rank["events"]]
    rows = [SPANS_ROW, CALLS_ROW]
    rows += sorted({e["tid"] for e in events} - set(rows))
    out: list[dict] = []
    for rank in range(len(per_rank)):
        out.append({"name": "process_name", "ph": "M", "pid": rank,
                    "args": {"name": f"rank {rank}"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": rank,
                    "args": {"sort_index": rank}})
        for tid, row in enumerate(rows):
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                        "args": {"name": row}})
    for e in sorted(events, key=lambda e: (e["pid"], e["ts"])):
        out.append({**e, "tid": rows.index(e["tid"])})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_timeline(comm: Any, path: str, trace: list) -> None:
    """Gather every rank's events at rank 0 of `comm` (the Communicator whose calls `trace`
    recorded), which writes them to `path`. Collective."""
    xp = module_for_device(comm.device)
    mine = numpy.frombuffer(json.dumps(rank_events(comm.rank, trace)).encode(), numpy.uint8)
    lengths = to_numpy(comm.all_gather(xp.asarray([mine.size], numpy.int64))).reshape(-1)
    gathered = comm.gather(xp.asarray(mine), root=0, counts=lengths.tolist())
    if comm.rank != 0:
        return
    gathered = to_numpy(gathered)
    per_rank, at = [], 0
    for length in lengths.tolist():
        per_rank.append(json.loads(gathered[at: at + length].tobytes()))
        at += length
    with open(path, "w") as file:
        json.dump(chrome_trace(per_rank), file)
