"""Watch a collective run, step by step: `python -m collectives.explain all_reduce --ranks 4`.

The command line: which lesson, on how many ranks (thread ranks, or under `mpiexec` the job's
own), and where the pictures go. Rank 0 prints the text and writes the pictures.
"""

from __future__ import annotations

import argparse
import sys

from transports import registry
from transports.errors import CollectiveError

from . import picture
from .lessons import ALL_REDUCES, DTYPE, LESSONS, REDUCE, Setup
from .run import job_size, on_real_ranks, on_threads
from .text import explain


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, with those that do not fit the lesson refused."""
    parser = argparse.ArgumentParser(
        prog="python -m collectives.explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("collective", choices=list(LESSONS))
    parser.add_argument("--ranks", type=int, help="thread ranks (default 4); under mpiexec the "
                        "job's ranks")
    parser.add_argument("--count", type=int, default=8, help="elements in the buffer (all-gather,"
                        " gather: the output; reduce-scatter, scatter, all-to-all: the input)")
    parser.add_argument("--root", type=int, help="root rank (broadcast, scatter, gather, reduce)")
    parser.add_argument("--op", choices=list(REDUCE), help="reduction (default sum)")
    parser.add_argument("--node-size", type=int, help="hierarchical: ranks per node, "
                        "consecutive (default 2)")
    # Real ranks: the transports of an MPI job that move NumPy arrays, listed by name.
    launched = ["auto", *sorted(registry.names(device="cpu"))]
    parser.add_argument("--transport", default="threads", choices=["threads", *launched])
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
    if args.node_size is not None and args.collective != "hierarchical":
        parser.error(f"{args.collective} runs on flat ranks; --node-size does not apply")
    if args.count < 0:
        parser.error("--count must not be negative")
    for name in ("node_size", "segment_bytes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
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
    node_size = (2 if args.node_size is None else args.node_size) \
        if args.collective == "hierarchical" else 0
    if node_size and (node_size < 1 or size % node_size):
        raise ValueError(f"--node-size {node_size} does not cut {size} ranks into whole nodes")
    if lesson.blocks and args.count % size:
        raise ValueError(f"{args.collective} cuts the buffer into {size} equal blocks; "
                         f"--count {args.count} is not a multiple of {size}")
    # Broadcast pipelines segments: cut the buffer in N so the pipeline shows. The others
    # move whole chunks whatever the segment, so one segment per buffer keeps the trace short.
    pieces = size if args.collective == "broadcast" else 1
    segment = args.segment_bytes or -(-max(args.count, 1) // pieces) * DTYPE.itemsize
    return Setup(args.collective, size, args.count, root, args.op or "sum", segment, node_size)


def main(argv: list[str] | None = None) -> None:
    """Run the lessons the arguments ask for; rank 0 prints the text and draws the pictures."""
    args = parse(argv)
    names = ALL_REDUCES if args.collective in ALL_REDUCES else (args.collective,)
    threads = args.transport == "threads"
    if threads:
        size, rank = 4 if args.ranks is None else args.ranks, 0
    else:
        size, rank = job_size(args.transport)
    try:
        if not threads and args.ranks not in (None, size):
            raise ValueError(f"--ranks {args.ranks}, but the job has {size} ranks")
        setup = setup_for(args, size)
    except ValueError as error:
        sys.exit(f"explain: {error}" if rank == 0 else 1)  # every rank stops; rank 0 says why
    try:
        if threads:
            per_rank, transport = on_threads(setup, names), "threads"
        else:
            per_rank, transport = on_real_ranks(setup, args.transport, names)
    except CollectiveError as error:  # what the run refused (every rank raises it)
        sys.exit(f"explain: {error}" if rank == 0 else 1)
    if rank != 0:
        return
    try:
        text, run = explain(setup, per_rank, transport)
        pictures = {}
        if args.svg:
            pictures[args.svg] = picture.svg(run, still=args.frame)
        if args.html:
            pictures[args.html] = picture.html(run)
    except ValueError as error:
        sys.exit(f"explain: {error}")
    sys.stdout.write(text)
    for path, drawing in pictures.items():
        with open(path, "w") as out:
            out.write(drawing)
