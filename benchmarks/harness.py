"""The harness every benchmark shares, in the manner of nccl-tests' common.cu.

A benchmark file supplies a `Collective`: its name, buffer shapes, the call, the reference and
its bus-bandwidth factor. The harness parses nccl-tests' options, opens ringcc on each transport
asked for and the peers (the MPI library's own collectives through mpi4py, torch.distributed
with Gloo, and torch.distributed on ringcc's own backend), and for every size checks each
implementation against a NumPy reference before it times it: all in the same job, on the same
buffers.

    mpiexec -n 4 python -m benchmarks.all_reduce -b 8 -e 64M -f 2 --compare mpi,gloo

With --device cuda, ringcc moves CuPy arrays (device.py: copies of the same buffers on the
device, a clock that waits for it) and --compare copy times a plain device copy beside it. On
the host, --compare memory times the least memory work of the call on every rank at once (the
memory bound: peers.MemoryPeer), so the table shows how close ringcc comes to the machine.

With --registered 1, ringcc's send and receive buffers are registered memory from its
`comm.empty` (on the shm transport, regions every peer maps and reads in place, with no staging
copy), filled from the same host buffers; the peers keep ordinary ones. Each ringcc transport
registers one buffer per role, of the largest size measured, up front (comm.empty is
collective) and measures every size in a view at its front; on shm each rank also maps its
peers' buffers, so it maps ranks times the largest send and receive sizes. With --device cuda
the cuda_ipc transport's comm.empty gives ordinary CuPy arrays: allowed, and no faster.

The pieces, one job each:

    options.py  the Collective, nccl-tests' options, the sizes and (dtype, op) cases
    peers.py    the implementations: ringcc on each transport, the mpi, gloo, torch-ringcc and
                memory peers
    measure.py  the data, the reference and the check; time, algbw and busbw
    report.py   the table, the versions, the JSON and CSV files

mpi4py is imported where MPI is used, so that importing the harness (the tests, the plot, the
trainer) does not start MPI.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys

import numpy

from .measure import measure_size, warm_up
from .options import Collective, buffer_bytes, cases, counts, parse_args, unwritable
from .peers import open_impls, register
from .report import format_row, header, summary, versions, write_csv, write_json


def main(collective: Collective, argv: list[str] | None = None) -> int:
    """Run the benchmark; the exit status: 0, 1 when any element was wrong, 2 on bad usage."""
    from mpi4py import MPI

    argv = sys.argv[1:] if argv is None else argv
    world = MPI.COMM_WORLD
    args = parse_args(collective, argv, quiet=world.Get_rank() != 0)
    rank, ranks = world.Get_rank(), world.Get_size()
    say = print if rank == 0 else (lambda *_, **__: None)
    problem = world.bcast(unwritable(args) if rank == 0 else None, root=0)  # (rank 0 writes)
    if problem:
        say(f"benchmarks: {problem}", file=sys.stderr)
        return 2
    if collective.rooted and not 0 <= args.root < ranks:
        say(f"benchmarks: root {args.root} is not a rank in [0, {ranks})", file=sys.stderr)
        return 2
    pairs, notes = cases(collective, args)
    if not pairs:
        say(f"benchmarks: nothing to measure: {'; '.join(notes)}", file=sys.stderr)
        return 2
    root = args.root if collective.rooted else -1
    with contextlib.ExitStack() as stack:
        try:
            impls, peer_notes = open_impls(args, world, stack)
        except LookupError as error:
            say(f"benchmarks: {error}", file=sys.stderr)
            return 2
        if args.registered:
            register(impls, buffer_bytes(collective, pairs, args.sizes, ranks))
        ranks_at = world.gather((os.getpid(), MPI.Get_processor_name()), root=0)
        meta = {"collective": collective.name, "ranks": ranks,
                "host": ",".join(sorted({host for _, host in ranks_at or []})),
                "versions": versions(impls), "dtype": args.datatype,
                "op": args.op if collective.reduces else "none", "root": root,
                "iters": args.iters, "warmup": args.warmup_iters, "warmup_ms": args.warmup_ms,
                "rounds": args.rounds,
                "check": bool(args.check),
                "registered": bool(args.registered),
                "impls": [impl.name for impl in impls],
                "command": f"mpiexec -n {ranks} python -m benchmarks.{collective.name} "
                           + shlex.join(argv)}
        if rank == 0:
            print(header(collective, args, impls, meta, ranks_at, notes + peer_notes), flush=True)
        rows = []
        for impl in impls:
            if not hasattr(impl.comm, collective.name):
                say(f"# {impl.name} does not do {collective.name}: not measured")
        for dtype, op in pairs:
            for impl in impls:
                if hasattr(impl.comm, collective.name) and not impl.can(collective.name, dtype):
                    say(f"# {impl.name} cannot move {dtype} in {collective.name}: not measured")
            itemsize = numpy.dtype(dtype).itemsize
            sizes = counts(collective, args.sizes, itemsize, ranks)
            if sizes[0] * itemsize > args.sizes[0]:
                say(f"# {args.sizes[0]} B holds no whole {dtype} element"
                    f"{' per rank' if collective.blocks else ''}: measured at "
                    f"{sizes[0] * itemsize} B")
            if (dtype, op) == pairs[0]:
                warm_up(collective, impls, sizes, dtype, op, root, args, world)
            for count in sizes:
                measured = measure_size(collective, impls, count, dtype, op, root, args, world)
                rows += [row for row in measured.values() if row is not None]
                say(format_row(measured, impls), flush=True)
    say(summary(rows, impls))
    if rank == 0 and args.json:
        write_json(args.json, meta, rows)
    if rank == 0 and args.csv:
        write_csv(args.csv, rows)
    return 1 if any(row["wrong"] for row in rows) else 0
