"""Fit the alpha-beta cost model to measured times: `python -m benchmarks.fit results.json ...`.

A collective that takes m latency-bound steps and whose busiest link carries B bytes costs
about T = m a + B b, with a the time one message takes however small (latency) and b the time
per byte (inverse bandwidth). For ring all-reduce of S bytes on N ranks m = 2(N-1) and
B = 2(N-1)/N S. Given the JSON rows of the benchmarks (any sizes and rank counts, see
benchmarks/harness.py), this finds the a and b that fit them best, by least squares on the
relative error (the sizes span many decades, so each row counts alike), prints a table of
predicted against measured times, marks where the model stops fitting, and says what the same
a and b predict for the all-reduce algorithms other libraries use.

    mpiexec -n 4 python -m benchmarks.all_reduce -b 8 -e 16M -f 4 --transport mpi --json n4.json
    python -m benchmarks.fit n2.json n3.json n4.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy

from transports.base import DEFAULT_SEGMENT_BYTES

# The model of each collective as ringcc runs it: (steps, bytes on the critical path) for
# N ranks, S bytes (the nccl-tests size) and the segment size.
Model = Callable[[int, int, int], tuple[float, float]]


def _broadcast(n: int, s: int, segment: int) -> tuple[float, float]:
    pieces = max(1, math.ceil(s / segment))  # the chain is pieces + N - 2 segment-times long
    return pieces + n - 2, (pieces + n - 2) * s / pieces


MODELS: dict[str, tuple[str, Model]] = {
    "all_reduce": ("2(N-1) a + 2(N-1)/N S b",
                   lambda n, s, seg: (2 * (n - 1), 2 * (n - 1) / n * s)),
    "all_gather": ("(N-1) a + (N-1)/N S b", lambda n, s, seg: (n - 1, (n - 1) / n * s)),
    "reduce_scatter": ("(N-1) a + (N-1)/N S b", lambda n, s, seg: (n - 1, (n - 1) / n * s)),
    "broadcast": ("(m+N-2) a + (m+N-2) S/m b, m = S/segment", _broadcast),
    "scatter": ("N a + (N-1)/N S b (an exchange that describes the blocks, then each)",
                lambda n, s, seg: (n, (n - 1) / n * s)),
    "gather": ("(N-1) a + (N-1)/N S b", lambda n, s, seg: (n - 1, (n - 1) / n * s)),
    "reduce": ("2(N-1) a + 2(N-1)/N S b (the root's ring, then its gather)",
               lambda n, s, seg: (2 * (n - 1), 2 * (n - 1) / n * s)),
    "all_to_all": ("(N-1) a + (N-1)/N S b", lambda n, s, seg: (n - 1, (n - 1) / n * s)),
    "scan": ("L a + L S b, L = ceil(log2 N)",
             lambda n, s, seg: ((n - 1).bit_length(), (n - 1).bit_length() * s)),
    "sendrecv": ("a + S b", lambda n, s, seg: (1, s)),
}


@dataclass
class Fit:
    """a (us per step) and b (us per byte) fitted to `rows`, and each row's prediction."""

    impl: str
    collective: str
    a: float
    b: float
    rows: list[dict]
    predicted: list[float]

    def errors(self) -> list[float]:
        """(predicted - measured) / measured, per row."""
        return [p / r["time_us"] - 1 for p, r in zip(self.predicted, self.rows)]


def load(paths: list[str]) -> list[dict]:
    """The rows of every results file (the format of benchmarks/harness.py's --json).

    A size measured in several files (repeated runs) keeps its fastest time, with "runs" set
    to how many there were: on a shared machine the fastest run is the one least disturbed.
    """
    best: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as f:
            for row in json.load(f)["rows"]:
                key = (row["impl"], row["collective"], row["ranks"], row["bytes"], row["dtype"],
                       row.get("op"), row.get("root"), row.get("registered"))
                runs = best[key]["runs"] + 1 if key in best else 1
                if key not in best or row["time_us"] < best[key]["time_us"]:
                    best[key] = row
                best[key] = {**best[key], "runs": runs}
    return list(best.values())


def fit(rows: list[dict], segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> Fit:
    """Least squares on relative error of T = steps a + bytes b over `rows` (one impl and one
    collective, more than one rank)."""
    impl, collective = rows[0]["impl"], rows[0]["collective"]
    model = MODELS[collective][1]
    terms = numpy.array([model(r["ranks"], r["bytes"], segment_bytes) for r in rows])
    times = numpy.array([r["time_us"] for r in rows])
    (a, b), *_ = numpy.linalg.lstsq(terms / times[:, None], numpy.ones(len(rows)), rcond=None)
    return Fit(impl, collective, float(a), float(b), rows, (terms @ [a, b]).tolist())


def human(nbytes: float) -> str:
    """8 B, 64 KiB, 16 MiB."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.3g} B"


def report(result: Fit, tolerance: float, segment_bytes: int) -> list[str]:
    """The fitted a and b, the table, and the rows the model misses by more than `tolerance`."""
    rows = result.rows
    ranks = sorted({r["ranks"] for r in rows})
    sizes = [r["bytes"] for r in rows]
    a, b = result.a, result.b
    runs = {r.get("runs", 1) for r in rows}
    best = f", each the fastest of {'/'.join(map(str, sorted(runs)))} runs" if runs != {1} else ""
    lines = [f"{result.impl} {result.collective}: T = {MODELS[result.collective][0]}, "
             f"fitted to {len(rows)} rows (ranks {', '.join(map(str, ranks))}; "
             f"{human(min(sizes))} to {human(max(sizes))}{best})",
             f"  a = {a:.3g} us per step   b = {b * 1e3:.3g} ns per byte"
             + (f" ({1e-3 / b:.3g} GB/s)" if b > 0 else "")]
    if a < 0 or b < 0:
        lines.append("  (a negative coefficient: these rows do not follow the model)")
    lines.append(f"  {'ranks':>5} {'bytes':>10} {'measured us':>12} {'predicted us':>13} "
                 f"{'error':>8}")
    missed = []
    for row, p, e in zip(rows, result.predicted, result.errors()):
        mark = ""
        if abs(e) > tolerance:
            mark = "  *"
            missed.append(row)
        lines.append(f"  {row['ranks']:>5} {human(row['bytes']):>10} {row['time_us']:>12.1f} "
                     f"{p:>13.1f} {e:>+8.1%}{mark}")
    errors = numpy.abs(result.errors())
    lines.append(f"  median |error| {numpy.median(errors):.1%}, largest {errors.max():.1%}; "
                 f"{len(rows) - len(missed)} of {len(rows)} rows within {tolerance:.0%}")
    for n in ranks:
        off = [human(r["bytes"]) for r in missed if r["ranks"] == n]
        if off:
            lines.append(f"  * the model misses on {n} ranks at {', '.join(off)}")
    if len(ranks) > 1:  # the model says a and b do not depend on N: do they?
        alone = [(n, fit([r for r in rows if r["ranks"] == n], segment_bytes)) for n in ranks]
        lines.append("  fitted on each rank count alone: " + "; ".join(
            f"{n} ranks a = {f.a:.3g} us, b = {f.b * 1e3:.3g} ns/B" for n, f in alone))
    return lines


def alternatives(result: Fit, ranks: list[int] | None = None) -> list[str]:
    """What the fitted a and b predict for all-reduce algorithms other libraries use, on
    `ranks` (default: the rank counts measured) at some of the sizes measured."""
    a, b = result.a, result.b
    sizes = sorted({r["bytes"] for r in result.rows})[::3]
    lines = ["  the same a, b for other all-reduce algorithms, in us (L = ceil(log2 N)): binomial",
             "  tree reduce + broadcast 2L (a + S b); recursive doubling L (a + S b)",
             f"  {'ranks':>5} {'bytes':>10} {'ring':>10} {'tree':>10} {'rec. doubling':>14}"]
    for n in ranks or sorted({r["ranks"] for r in result.rows}):
        log = math.ceil(math.log2(n))
        for s in sizes:
            ring = 2 * (n - 1) * a + 2 * (n - 1) / n * s * b
            lines.append(f"  {n:>5} {human(s):>10} {ring:>10.1f} {2 * log * (a + s * b):>10.1f} "
                         f"{log * (a + s * b):>14.1f}")
        gain = log - 2 * (n - 1) / n  # bytes the ring saves per S, against recursive doubling
        if gain > 0 and b > 0:
            cross = (2 * (n - 1) - log) * a / (gain * b)
            lines.append(f"        on {n} ranks the ring beats recursive doubling above "
                         f"S = {human(max(cross, 0))}")
        else:
            lines.append(f"        on {n} ranks recursive doubling sends no more than the ring, "
                         f"in fewer steps: it wins at every size")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fit",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="JSON written by a benchmark's --json")
    parser.add_argument("--impl", action="append",
                        help="fit this impl (repeatable; default: every ringcc:<transport>)")
    parser.add_argument("--collective", choices=list(MODELS), help="fit only this collective")
    parser.add_argument("--min-bytes", type=int, default=0, help="leave out smaller rows")
    parser.add_argument("--tolerance", type=float, default=0.25,
                        help="mark rows the model misses by more than this (0.25)")
    parser.add_argument("--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES,
                        help="the segment size the runs used (broadcast's model needs it)")
    parser.add_argument("--predict", metavar="N,N,...",
                        type=lambda text: [int(n) for n in text.split(",")],
                        help="rank counts to predict other all-reduce algorithms on "
                             "(default: those measured)")
    args = parser.parse_args(argv)
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in load(args.files):
        wanted = row["impl"] in args.impl if args.impl else row["impl"].startswith("ringcc:")
        if (wanted and row["collective"] in MODELS and row["ranks"] > 1 and not row["wrong"]
                and row["bytes"] >= args.min_bytes
                and args.collective in (None, row["collective"])):
            groups.setdefault((row["impl"], row["collective"]), []).append(row)
    if not groups:
        print("fit: no rows to fit (ringcc rows on 2 or more ranks, none wrong)", file=sys.stderr)
        return 2
    for k, (_, rows) in enumerate(sorted(groups.items())):
        rows.sort(key=lambda r: (r["ranks"], r["bytes"]))
        result = fit(rows, args.segment_bytes)
        print(*([""] if k else []), *report(result, args.tolerance, args.segment_bytes),
              sep="\n")
        if result.collective == "all_reduce":
            print(*alternatives(result, args.predict), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
