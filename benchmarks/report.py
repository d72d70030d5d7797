"""Reporting: nccl-tests' table on rank 0's stdout, and the same rows as JSON and CSV.

The header names every implementation, the versions the numbers depend on and each rank's host.
Each row is one size: size, count, type, redop and root, then for each ringcc transport time,
algbw, busbw and #wrong, and for each peer time, ratio (peer time / main transport's time: above
1, ringcc is faster) and #wrong. The summary closes with nccl-tests' "Out of bounds values" and
"Avg bus bandwidth" lines (and, with --compare copy, busbw over the copy bandwidth; with
--compare memory, ringcc's time as a multiple of the memory bound).
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import platform

import numpy

from . import device
from .options import Collective
from .peers import Impl, memory_bounds

PREFIX = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}"
FULL = "  {:>7}  {:>6}  {:>6}  {:>6}"  # time algbw busbw #wrong: each ringcc transport
SHORT = "  {:>7}  {:>6}  {:>6}"  # time ratio #wrong: each peer


def versions(impls: list[Impl]) -> dict[str, str]:
    """Versions of everything the numbers depend on."""
    import mpi4py
    from mpi4py import MPI

    try:
        ringcc = importlib.metadata.version("ringcc")
    except importlib.metadata.PackageNotFoundError:
        ringcc = "(not installed)"
    out = {"ringcc": ringcc, "python": platform.python_version(), "numpy": numpy.__version__,
           "mpi4py": mpi4py.__version__,
           "mpi": " ".join(MPI.Get_library_version().splitlines()[0].split())}
    if any(impl.name in ("gloo", "torch-ringcc") for impl in impls):
        import torch

        out["torch"] = torch.__version__
    out.update(device.versions(impls[0].xp))
    return out


def format_time(us: float) -> str:
    """Seven characters, as nccl-tests prints times."""
    return f"{us:7.2f}" if us < 1e4 else f"{us:7.1f}" if us < 1e5 else f"{us:7.0f}"


def header(collective: Collective, args: argparse.Namespace, impls: list[Impl],
           meta: dict, ranks_at: list[tuple[int, str]], notes: list[str]) -> str:
    """The lines above the table: what is measured and with what, then the column titles."""
    main = impls[0].name
    peers = [impl.name for impl in impls if not impl.name.startswith("ringcc:")]
    lines = [
        f"# ringcc benchmark: {collective.name}",
        f"# ranks {meta['ranks']}  host {meta['host']}  measured: {main} (main)"
        + "".join(f", {impl.name}" for impl in impls[1:]),
        "# versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}(factor) "
        f"warmup iters: {args.warmup_iters} warmup ms: {args.warmup_ms:g} iters: {args.iters} "
        f"validation: {args.check} registered: {args.registered}",
        "# time: mean per call over the timed iterations, slowest rank (max over ranks)"
        + (f"; the median of {args.rounds} rounds, the implementations timed in turn"
           if args.rounds > 1 else ""),
    ]
    if peers:
        lines.append(f"# ratio: peer time / {main} time (>1: {main} is faster)")
    if "memory" in peers:
        lines.append("# memory: the least memory work of the call on every rank at once "
                     f"(ratio 0.5: {main} takes 2x it)")
    lines += [f"#  Rank {rank:2d} Pid {pid:7d} on {host}" for rank, (pid, host)
              in enumerate(ranks_at)]
    lines += [f"# {note}" for note in notes]
    groups = PREFIX.format("", "", "", "", "")
    titles = PREFIX.format("size", "count", "type", "redop", "root")
    units = PREFIX.format("(B)", "(elements)", "", "", "")
    for impl in impls:
        if impl.name.startswith("ringcc:"):
            groups += f"  {impl.name:^{len(FULL.format('', '', '', '')) - 2}}"
            titles += FULL.format("time", "algbw", "busbw", "#wrong")
            units += FULL.format("(us)", "(GB/s)", "(GB/s)", "")
        else:
            groups += f"  {impl.name:^{len(SHORT.format('', '', '')) - 2}}"
            titles += SHORT.format("time", "ratio", "#wrong")
            units += SHORT.format("(us)", "", "")
    lines += ["#", *("#" + line[1:].rstrip() for line in (groups, titles, units))]
    return "\n".join(lines)


def format_row(rows: dict[str, dict | None], impls: list[Impl]) -> str:
    """One line of the table from the JSON rows of one size (None: not measured)."""
    first = next(row for row in rows.values() if row is not None)
    line = PREFIX.format(first["bytes"], first["count"], first["dtype"], first["op"],
                         first["root"])
    main = rows[impls[0].name]
    for impl in impls:
        row = rows[impl.name]
        full = impl.name.startswith("ringcc:")
        if row is None:
            line += (FULL.format("n/a", "", "", "") if full else SHORT.format("n/a", "", ""))
            continue
        wrong = "N/A" if row["wrong"] is None else row["wrong"]
        if full:
            line += FULL.format(format_time(row["time_us"]), f"{row['algbw_GBps']:.2f}",
                                f"{row['busbw_GBps']:.2f}", wrong)
        else:
            ratio = f"{row['time_us'] / main['time_us']:.2f}" if main else "n/a"
            line += SHORT.format(format_time(row["time_us"]), ratio, wrong)
    return line.rstrip()


def summary(rows: list[dict], impls: list[Impl]) -> str:
    """nccl-tests' closing lines: wrong elements in all, and the average bus bandwidth; then how
    ringcc stands against the copy and memory bounds, where measured."""
    wrong = sum(row["wrong"] or 0 for row in rows)
    if rows and all(row["wrong"] is None for row in rows):
        lines = ["# Out of bounds values : N/A (not checked: -c 0)"]
    else:
        lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    for k, impl in enumerate(impls):
        mine = [row["busbw_GBps"] for row in rows if row["impl"] == impl.name]
        if mine:
            label = "# Avg bus bandwidth    :" if k == 0 else "#" + " " * 23
            lines.append(f"{label} {sum(mine) / len(mine):.4f} GB/s  {impl.name}")
    ringcc = [impl.name for impl in impls if impl.name.startswith("ringcc:")]
    lines += device.ceilings(rows, ringcc) + memory_bounds(rows, ringcc)
    return "\n".join(lines)


def write_json(path: str, meta: dict, rows: list[dict]) -> None:
    """The agreed format: {"meta": {...}, "rows": [{...}, ...]}."""
    with open(path, "w") as out:
        json.dump({"meta": meta, "rows": rows}, out, indent=1)
        out.write("\n")


def write_csv(path: str, rows: list[dict]) -> None:
    """The rows, one line each, with the JSON rows' keys as the header (a list, the rounds'
    times, as its numbers apart by spaces)."""
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["impl"])
        writer.writeheader()
        writer.writerows({key: " ".join(map(str, value)) if isinstance(value, list) else value
                          for key, value in row.items()} for row in rows)
