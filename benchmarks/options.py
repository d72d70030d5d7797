"""What a benchmark measures: the `Collective` a benchmark file supplies, and nccl-tests' options.

The options keep nccl-tests' spelling (-b/-e/-f for the sizes, -n/-w for the iterations, -o,
-d, -r, -c), so a command line moves between the two; ringcc adds --transport, --device,
--registered, --compare, --json and --csv.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy

import collectives
from collectives.ops import resolve_op

DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64")
DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "int": "int32"}
PEERS = ("mpi", "gloo", "torch-ringcc", "copy", "memory")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


Data = Callable[[int], numpy.ndarray]  # rank r -> its send buffer, for a reference


@dataclass(frozen=True)
class Collective:
    """What one benchmark supplies; the harness does the rest.

    shapes(count, ranks) -> (send shape, recv shape), where count is the elements of the
    nccl-tests size (the buffer; all-gather's whole output; scatter's and reduce-scatter's whole
    input) and a recv shape of None means the call works in place on the send buffer.
    run(comm, send, recv, op, root) makes the call on a Communicator or a peer.
    expected(data, rank, ranks, op, root) is what `rank`'s result must hold, where data(r) is
    rank r's send buffer, or None where the rank gets no result (a gather's other ranks).
    The harness calls the method named `name` on each implementation: one without it does
    not do the collective and is not measured.
    """

    name: str
    bus_factor: Callable[[int], float]
    shapes: Callable[[int, int], tuple[tuple[int, ...], tuple[int, ...] | None]]
    run: Callable[[Any, Any, Any, str, int], Any]
    expected: Callable[[Data, int, int, str, int], numpy.ndarray | None]
    blocks: bool = False  # one block per rank: the count is a multiple of the rank count
    reduces: bool = False  # takes an op (-o); otherwise the redop column says "none"
    rooted: bool = False  # takes a root (-r); otherwise the root column says -1


def parse_size(text: str) -> int:
    """Bytes from nccl-tests' spelling: 8, 512K, 64M, 1G (powers of 1024)."""
    text = text.strip()
    unit = UNITS.get(text[-1:].upper(), 1)
    digits = text[:-1] if unit > 1 else text
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 8, 512K, 64M or 1G")
    return int(digits) * unit


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes*factor, ... up to max_bytes, as nccl-tests' -b/-e/-f."""
    if not 0 < min_bytes <= max_bytes:
        raise ValueError(f"need 0 < minbytes <= maxbytes, got {min_bytes} and {max_bytes}")
    if factor < 2 and min_bytes < max_bytes:
        raise ValueError(f"the step factor must be at least 2, got {factor}")
    out = [min_bytes]
    while out[-1] * factor <= max_bytes and min_bytes < max_bytes:
        out.append(out[-1] * factor)
    return out


def counts(collective: Collective, nbytes: list[int], itemsize: int, ranks: int) -> list[int]:
    """Element counts for the sizes, rounded down to whole blocks where the collective needs
    one per rank (at least one element per block); sizes that round alike are measured once."""
    unit = ranks if collective.blocks else 1
    out: list[int] = []
    for size in nbytes:
        count = max(unit, size // itemsize // unit * unit)
        if count not in out:
            out.append(count)
    return out


def buffer_bytes(collective: Collective, pairs: list[tuple[str, str]], nbytes: list[int],
                 ranks: int) -> dict[str, int]:
    """The most bytes the "send" and the "recv" buffer take over every (dtype, op) pair and
    size measured; no "recv" when the call works in place."""
    most: dict[str, int] = {}
    for dtype in dict.fromkeys(dtype for dtype, _ in pairs):
        itemsize = numpy.dtype(dtype).itemsize
        for count in counts(collective, nbytes, itemsize, ranks):
            for role, shape in zip(("send", "recv"), collective.shapes(count, ranks)):
                if shape is not None:
                    most[role] = max(most.get(role, 0), math.prod(shape) * itemsize)
    return most


def comma_list(choices: tuple[str, ...] | None = None) -> Callable[[str], list[str]]:
    """An argparse type for "a,b,c", each name among `choices` when given."""
    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if choices and name not in choices]
        if not names or unknown:
            among = f" of {', '.join(choices)}" if choices else ""
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list{among}")
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(twice)} twice")
        return names
    return parse


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that says nothing when `quiet`: every rank parses, one speaks."""

    quiet = False

    def _print_message(self, message: str, file: Any = None) -> None:
        if not self.quiet:
            super()._print_message(message, file)


def parse_args(collective: Collective, argv: list[str] | None = None,
               quiet: bool = False) -> argparse.Namespace:
    """nccl-tests' options plus --transport, --device, --registered, --compare, --json and
    --csv. `quiet`: errors and help exit as usual, without a word (ranks but the first)."""
    parser = _Parser(
        prog=f"mpiexec -n N python -m benchmarks.{collective.name}",
        description=f"Time ringcc's {collective.name} against a reference, nccl-tests style.")
    parser.quiet = quiet
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"),
                        help="smallest size in bytes, K/M/G suffixes allowed (default 32M)")
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"),
                        help="largest size in bytes (default 32M)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2,
                        help="multiply the size by this from -b to -e (default 2)")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (20)")
    parser.add_argument("-w", "--warmup_iters", type=int, default=5,
                        help="untimed iterations first (5)")
    parser.add_argument("--warmup-ms", type=float, default=20.0,
                        help="before each timed loop, call on until every rank has spent "
                             "this long in it (20): a core that has been waiting or idle "
                             "runs at a lower clock for its first milliseconds of work")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every implementation this many times at each size, "
                             "taking turns, and give each its median round (1): on a shared "
                             "machine whose speed swings within minutes, a peer timed at "
                             "another moment than ringcc is timed on another machine")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                        help="check every size against a NumPy reference first (1)")
    parser.add_argument("-o", "--op", choices=(*collectives.OPS, "all"), default="sum",
                        help="reduction (sum); ignored by collectives that do not reduce")
    parser.add_argument("-d", "--datatype", default="float32",
                        choices=(*DTYPES, *DTYPE_ALIASES, "all"), help="element type (float32)")
    parser.add_argument("-r", "--root", type=int, default=0,
                        help="root rank (0); ignored by collectives without one")
    parser.add_argument("--transport", type=comma_list(), default=["auto"],
                        help="ringcc transports to measure, e.g. shm,mpi; the first is the "
                             "main one, which peers are compared with (default auto)")
    parser.add_argument("--device", choices=collectives.DEVICES,
                        help="where ringcc's buffers live: cpu (NumPy) or cuda (CuPy); "
                             "default cuda when --transport has cuda_ipc, else cpu")
    parser.add_argument("--registered", type=int, choices=(0, 1), default=0,
                        help="1: ringcc's buffers come from its comm.empty (registered "
                             "memory, which peers read in place on the shm transport), "
                             "filled from the same data; peers keep ordinary buffers (0)")
    parser.add_argument("--compare", type=comma_list(PEERS), default=[],
                        help="peers measured in the same job: mpi (the MPI library's own "
                             "collective), gloo (torch.distributed, when torch is installed), "
                             "torch-ringcc (torch.distributed on ringcc's backend, over "
                             "the main transport: the torch layer's cost), copy (a plain "
                             "copy of the same size on the --device, rank 0 alone: the "
                             "copy bandwidth), memory (the least memory work of the call, "
                             "on every rank at once: the memory bound; --device cpu only)")
    parser.add_argument("--algorithms", type=comma_list(tuple(collectives.ALL_REDUCE_ALGORITHMS)),
                        default=[],
                        help="all_reduce only: also time the main transport's all_reduce with "
                             "each of these algorithms (e.g. ring,reduce_scatter_all_gather), "
                             "in the same job, beside `auto`'s choice: each is a peer named "
                             "algorithm:<name>, its ratio its time / the main's")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup_iters < 0 or not 0 <= args.warmup_ms < math.inf \
            or args.rounds < 1:
        parser.error("-n and --rounds must be at least 1, -w at least 0, and --warmup-ms a "
                     "number of milliseconds, at least 0")
    if args.algorithms and collective.name != "all_reduce":
        parser.error("--algorithms chooses among all_reduce's algorithms: "
                     f"{collective.name} has one")
    args.device = args.device or ("cuda" if "cuda_ipc" in args.transport else "cpu")
    if "memory" in args.compare and args.device != "cpu":
        parser.error("--compare memory times host memory: with --device cuda, "
                     "--compare copy gives the device's copy bandwidth instead")
    try:
        args.sizes = sizes(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as error:
        parser.error(str(error))
    return args


def unwritable(args: argparse.Namespace) -> str | None:
    """What is wrong with where --json and --csv go, if anything: asked at the start, on the
    rank that writes them, so that a run does not end by losing its results."""
    for option, path in (("--json", args.json), ("--csv", args.csv)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
            return f"{option} {path}: {folder} is not a folder this user can write in"
    return None


def cases(collective: Collective,
          args: argparse.Namespace) -> tuple[list[tuple[str, str]], list[str]]:
    """The (dtype, op) pairs to measure, and a note for each pair -o all / -d all leave out."""
    dtype = DTYPE_ALIASES.get(args.datatype, args.datatype)
    dtypes = DTYPES if dtype == "all" else (dtype,)
    if not collective.reduces:
        return [(d, "none") for d in dtypes], []
    ops = collectives.OPS if args.op == "all" else (args.op,)
    pairs, notes = [], []
    for d in dtypes:
        for op in ops:
            try:
                resolve_op(op, d, numpy)
                pairs.append((d, op))
            except TypeError as error:
                notes.append(f"skipping {op} on {d}: {error}")
    return pairs, notes
