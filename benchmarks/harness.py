"""The harness every benchmark shares, in the manner of nccl-tests' common.cu.

A benchmark file supplies a `Collective`: its name, buffer shapes, the call, the reference and
its bus-bandwidth factor. The harness parses nccl-tests' options, opens ringcc on each transport
asked for and the peers (the MPI library's own collectives through mpi4py, torch.distributed
with Gloo), and for every size checks each implementation against a NumPy reference before it
times it: all in the same job, on the same buffers.

    mpiexec -n 4 python -m benchmarks.all_reduce -b 8 -e 64M -f 2 --compare mpi,gloo

With --device cuda, ringcc moves CuPy arrays (device.py: copies of the same buffers on the
device, a clock that waits for it) and --compare copy times a plain device copy beside it.

time:  mean per call over -n iterations (after -w warm-up ones), the slowest rank's.
algbw: bytes / time.
busbw: algbw * the collective's factor (all-reduce 2(n-1)/n, ...): what each rank's link
       carries, so it can be held against the link's bandwidth whatever the collective and
       rank count (nccl-tests' doc/PERFORMANCE.md).

mpi4py is imported where MPI is used, so that importing the harness (the tests, the plot, the
trainer) does not start MPI.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import numpy

import collectives
from collectives.communicator import array_module
from collectives.ops import resolve_op

from . import device

if TYPE_CHECKING:
    from mpi4py import MPI

DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64")
DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "int": "int32"}
PEERS = ("mpi", "gloo", "copy")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class Collective:
    """What one benchmark supplies; the harness does the rest.

    shapes(count, ranks) -> (send shape, recv shape), where count is the elements of the
    nccl-tests size (the buffer; all-gather's whole output; scatter's and reduce-scatter's whole
    input) and a recv shape of None means the call works in place on the send buffer.
    run(comm, send, recv, op, root) makes the call on a Communicator or a peer.
    expected(data, rank, ranks, op, root) is what `rank`'s result must hold, where data(r) is
    rank r's send buffer.
    """

    name: str
    bus_factor: Callable[[int], float]
    shapes: Callable[[int, int], tuple[tuple[int, ...], tuple[int, ...] | None]]
    run: Callable[[Any, Any, Any, str, int], Any]
    expected: Callable[[Callable[[int], numpy.ndarray], int, int, str, int], numpy.ndarray]
    blocks: bool = False  # one block per rank: the count is a multiple of the rank count
    reduces: bool = False  # takes an op (-o); otherwise the redop column says "none"
    rooted: bool = False  # takes a root (-r); otherwise the root column says -1


def reduce_ranks(data: Callable[[int], numpy.ndarray], ranks: int, op: str) -> numpy.ndarray:
    """The reference reduction of data(0) .. data(ranks-1).

    Integers wrap as they do in every implementation; floats are reduced in float64, and the
    check allows the rounding of the dtype (see `tolerance`).
    """
    def widened(rank: int) -> numpy.ndarray:
        block = data(rank)
        return block.astype(numpy.float64) if block.dtype.kind == "f" else block

    total = widened(0).copy()
    fold = resolve_op(op, total.dtype, numpy)
    for rank in range(1, ranks):
        fold(total, widened(rank), out=total)
    if op == "avg":
        total /= ranks
    return total


# ---- data and the check -------------------------------------------------------------------

PERIOD = 65521  # a prime: the pattern repeats only after this many elements
RANK_SHIFT = 7919  # how far along the pattern each rank starts
HASHED = numpy.arange(PERIOD, dtype=numpy.int64) * 2654435761 % PERIOD  # a scrambled 0..PERIOD-1
DATA_MAX = 4.0  # largest magnitude of a float input


def rank_data(rank: int, shape: tuple[int, ...], dtype: str, op: str) -> numpy.ndarray:
    """Rank `rank`'s input: a scrambled function of (rank, index), never uniform, so a block
    sent to the wrong place or taken from the wrong rank shows.

    Values are small: multiples of 1/8 in [-4, 4) for floats (exact even in float16), 0..63 for
    integers, and 1..2 under "prod" so that products stay finite.
    """
    pattern = numpy.roll(HASHED, -RANK_SHIFT * rank)
    if numpy.dtype(dtype).kind == "f":
        values = 1 + (pattern % 8) / 8 if op == "prod" else (pattern % 64 - 32) / 8
    else:
        values = 1 + pattern % 2 if op == "prod" else pattern % 64
    return numpy.resize(values.astype(dtype), shape)


def tolerance(dtype: numpy.dtype, ranks: int) -> tuple[float, float]:
    """(rtol, atol) for a float result of `ranks` contributions of magnitude <= DATA_MAX.

    Each of the ranks-1 additions rounds by at most half an ulp of a partial sum of magnitude
    <= ranks * DATA_MAX, in whatever order the implementation adds; products round relatively.
    """
    eps = float(numpy.finfo(dtype).eps)
    return ranks * eps, ranks * ranks * eps * DATA_MAX


def count_wrong(result: numpy.ndarray, expected: numpy.ndarray, ranks: int) -> int:
    """Elements of `result` that differ from `expected`: exactly for integers, beyond the
    rounding of `ranks` contributions for floats (NaN always differs)."""
    if result.dtype.kind != "f":
        return int(numpy.count_nonzero(result != expected))
    rtol, atol = tolerance(result.dtype, ranks)
    return int(numpy.count_nonzero(~numpy.isclose(result, expected, rtol=rtol, atol=atol)))


def poison(result: numpy.ndarray, expected: numpy.ndarray) -> None:
    """Fill a result buffer with values that are all wrong, so a call that leaves it is caught
    (and one implementation's result cannot pass for the next one's)."""
    if result.dtype.kind == "f":
        result.fill(numpy.nan)
    else:
        result[...] = array_module(result).asarray(expected + 1)


# ---- options ------------------------------------------------------------------------------

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


def comma_list(choices: tuple[str, ...] | None = None) -> Callable[[str], list[str]]:
    """An argparse type for "a,b,c", each name among `choices` when given."""
    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if choices and name not in choices]
        if not names or unknown:
            among = f" of {', '.join(choices)}" if choices else ""
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list{among}")
        return names
    return parse


def parse_args(collective: Collective, argv: list[str] | None = None) -> argparse.Namespace:
    """nccl-tests' options plus --transport, --compare, --json and --csv."""
    parser = argparse.ArgumentParser(
        prog=f"mpiexec -n N python -m benchmarks.{collective.name}",
        description=f"Time ringcc's {collective.name} against a reference, nccl-tests style.")
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"),
                        help="smallest size in bytes, K/M/G suffixes allowed (default 32M)")
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"),
                        help="largest size in bytes (default 32M)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2,
                        help="multiply the size by this from -b to -e (default 2)")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (20)")
    parser.add_argument("-w", "--warmup_iters", type=int, default=5,
                        help="untimed iterations first (5)")
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
    parser.add_argument("--compare", type=comma_list(PEERS), default=[],
                        help="peers measured in the same job: mpi (the MPI library's own "
                             "collective), gloo (torch.distributed, when torch is installed), "
                             "copy (a plain copy of the same size on the --device, rank 0 "
                             "alone: the copy bandwidth)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup_iters < 0:
        parser.error("-n must be at least 1 and -w at least 0")
    args.device = args.device or ("cuda" if "cuda_ipc" in args.transport else "cpu")
    try:
        args.sizes = sizes(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as error:
        parser.error(str(error))
    return args


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


# ---- what is measured ---------------------------------------------------------------------

@dataclass
class Impl:
    """One implementation: `comm` offers the Communicator's collective methods and close()."""

    name: str  # "ringcc:<transport>", "mpi", "gloo" or "copy"
    comm: Any
    dtypes: tuple[str, ...] = DTYPES
    xp: ModuleType = numpy  # the arrays it moves: the harness's host buffers, or device copies
    reference: bool = False  # a plain copy, not the collective: unchecked, and busbw = algbw


class MPIPeer:
    """The MPI library's own collectives, through mpi4py's buffer methods on a Dup'd
    communicator (so no message can match ringcc's or the harness's)."""

    def __init__(self, world: MPI.Comm) -> None:
        from mpi4py import MPI

        self.comm = world.Dup()
        self.size = self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                    "avg": MPI.SUM}

    def _average(self, buf: numpy.ndarray, op: str) -> None:
        if op == "avg":  # MPI has no average: sum, then divide once, as ringcc does
            numpy.divide(buf, self.size, out=buf)

    def all_reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        self.comm.Allreduce(sendbuf, recvbuf, self.ops[op])
        self._average(recvbuf, op)

    def all_gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self.comm.Allgather(sendbuf, recvbuf)

    def broadcast(self, buf: numpy.ndarray, root: int = 0) -> None:
        self.comm.Bcast(buf, root)

    def scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        self.comm.Scatter(sendbuf, recvbuf, root)

    def reduce_scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray,
                       op: str = "sum") -> None:
        self.comm.Reduce_scatter_block(sendbuf, recvbuf, self.ops[op])
        self._average(recvbuf, op)

    def close(self) -> None:
        self.comm.Free()


class GlooPeer:
    """torch.distributed with the Gloo backend, on tensors that share the NumPy buffers.

    Rank and size come from MPI; rank 0 opens a TCP store (on 127.0.0.1 when every rank runs
    on one host) and broadcasts its port over MPI.
    """

    dtypes = tuple(d for d in DTYPES if d not in ("uint32", "uint64"))  # Gloo has neither

    def __init__(self, world: MPI.Comm) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # ranks share the cores
        self.torch, self.dist = torch, dist
        rank, size = world.Get_rank(), world.Get_size()
        hosts = world.allgather(platform.node())
        address = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
        store = dist.TCPStore(address, 0, size, is_master=True, wait_for_workers=False) \
            if rank == 0 else None
        port = world.bcast(store.port if rank == 0 else None, root=0)
        if rank != 0:
            store = dist.TCPStore(address, port, size, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                                timeout=timedelta(seconds=300))
        self.rank = rank
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
                    "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
        # The names of torch >= 2.13, else the older ones.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                                or dist.reduce_scatter_tensor)

    def _tensor(self, buf: numpy.ndarray) -> Any:
        return self.torch.from_numpy(buf).reshape(-1)

    def all_reduce(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, op: str = "sum") -> None:
        numpy.copyto(recvbuf, sendbuf)  # Gloo reduces in place
        self.dist.all_reduce(self._tensor(recvbuf), op=self.ops[op])

    def all_gather(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray) -> None:
        self._all_gather(self._tensor(recvbuf), self._tensor(sendbuf))

    def broadcast(self, buf: numpy.ndarray, root: int = 0) -> None:
        self.dist.broadcast(self._tensor(buf), src=root)

    def scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray, root: int = 0) -> None:
        blocks = list(self.torch.from_numpy(sendbuf)) if self.rank == root else None
        self.dist.scatter(self._tensor(recvbuf), blocks, src=root)

    def reduce_scatter(self, sendbuf: numpy.ndarray, recvbuf: numpy.ndarray,
                       op: str = "sum") -> None:
        self._reduce_scatter(self._tensor(recvbuf), self._tensor(sendbuf), op=self.ops[op])

    def close(self) -> None:
        self.dist.destroy_process_group()


def open_impls(args: argparse.Namespace, world: MPI.Comm,
               stack: contextlib.ExitStack) -> tuple[list[Impl], list[str]]:
    """ringcc on each --transport (main first), then each --compare peer; and notes on peers
    that cannot be had. Raises LookupError when ringcc lacks a transport asked for."""
    impls, notes = [], []
    for transport in args.transport:
        try:
            comm = stack.enter_context(collectives.init(transport, device=args.device))
        except collectives.CollectiveError as error:
            raise LookupError(f"ringcc cannot open the {transport!r} transport here: {error}")
        name = f"ringcc:{comm.transport}"
        if any(impl.name == name for impl in impls):
            raise LookupError(f"--transport {','.join(args.transport)} measures {name} twice")
        impls.append(Impl(name, comm, xp=device.array_module(args.device)))
    for peer in args.compare:
        if peer == "gloo":
            try:
                import torch.distributed
            except ImportError:
                notes.append("gloo: torch is not installed here (pip install torch); "
                             "the gloo peer is skipped")
                continue
            if not torch.distributed.is_gloo_available():
                notes.append("gloo: this torch has no Gloo backend; the gloo peer is skipped")
                continue
            comm = GlooPeer(world)
        elif peer == "copy":
            xp = device.array_module(args.device)
            comm = device.CopyPeer(xp, world.Get_rank())
            stack.callback(comm.close)
            impls.append(Impl(peer, comm, xp=xp, reference=True))
            continue
        else:
            comm = MPIPeer(world)
        stack.callback(comm.close)
        impls.append(Impl(peer, comm, getattr(comm, "dtypes", DTYPES)))
    return impls, notes


# ---- measuring ----------------------------------------------------------------------------

def settle(request: MPI.Request) -> None:
    """Complete `request` without spinning in MPI: MPICH busy-polls inside a blocking call,
    which would take the core of a rank still in its timed loop when ranks outnumber cores."""
    while not request.Test():
        os.sched_yield()


def reduce_scalar(world: MPI.Comm, value: float, op: MPI.Op) -> float:
    """`op` (MPI.SUM, MPI.MAX) of one number over all ranks (see `settle`)."""
    out = numpy.empty(1)
    settle(world.Iallreduce(numpy.array([value], dtype=numpy.float64), out, op))
    return float(out[0])


def measure(impl: Impl, collective: Collective, send: numpy.ndarray, recv: numpy.ndarray,
            own: numpy.ndarray, expected: numpy.ndarray | None, op: str, root: int,
            args: argparse.Namespace, world: MPI.Comm) -> tuple[float, int | None]:
    """Check once (when `expected` is given), then time: (mean us per call on the slowest
    rank, elements wrong summed over ranks or None when unchecked)."""
    from mpi4py import MPI

    send, recv, own = device.mirror(impl.xp, send, recv, own)

    def call() -> None:
        collective.run(impl.comm, send, recv, op, root)

    wrong = None
    if expected is not None:
        send[...] = own  # an in-place call (recv is send) has overwritten it
        if recv is not send:
            poison(recv, expected)
        call()
        wrong = int(reduce_scalar(world, count_wrong(device.host(recv), expected, world.size),
                                  MPI.SUM))
    for _ in range(args.warmup_iters):
        call()
    device.synchronize(impl.xp)
    settle(world.Ibarrier())
    start = time.perf_counter()
    for _ in range(args.iters):
        call()
    device.synchronize(impl.xp)
    elapsed = (time.perf_counter() - start) / args.iters
    return reduce_scalar(world, elapsed, MPI.MAX) * 1e6, wrong


def measure_size(collective: Collective, impls: list[Impl], count: int, dtype: str, op: str,
                 root: int, args: argparse.Namespace, world: MPI.Comm) -> dict[str, dict | None]:
    """Every implementation at one size, on the same buffers: its JSON row by name (None for
    one that cannot move `dtype`)."""
    rank, ranks = world.Get_rank(), world.Get_size()
    send_shape, recv_shape = collective.shapes(count, ranks)
    own = rank_data(rank, send_shape, dtype, op)
    send = own.copy()
    recv = send if recv_shape is None else numpy.empty(recv_shape, dtype)
    expected = None if not args.check else collective.expected(
        lambda r: rank_data(r, send_shape, dtype, op), rank, ranks, op, root)
    nbytes = count * numpy.dtype(dtype).itemsize
    measured: dict[str, dict | None] = {}
    for impl in impls:
        if dtype not in impl.dtypes:
            measured[impl.name] = None
            continue
        time_us, wrong = measure(impl, collective, send, recv, own,
                                 None if impl.reference else expected, op, root, args, world)
        algbw = nbytes / time_us / 1e3
        factor = 1.0 if impl.reference else collective.bus_factor(ranks)
        measured[impl.name] = {
            "impl": impl.name, "collective": collective.name, "ranks": ranks, "bytes": nbytes,
            "count": count, "dtype": dtype, "op": op, "root": root, "time_us": time_us,
            "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
            "wrong": wrong}
    return measured


# ---- reporting ----------------------------------------------------------------------------

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
    if any(impl.name == "gloo" for impl in impls):
        import torch

        out["torch"] = torch.__version__
    out.update(device.versions(impls[0].xp))
    return out


def format_time(us: float) -> str:
    """Seven characters, as nccl-tests prints times."""
    return f"{us:7.2f}" if us < 1e4 else f"{us:7.1f}" if us < 1e5 else f"{us:7.0f}"


def header(collective: Collective, args: argparse.Namespace, impls: list[Impl],
           meta: dict, ranks_at: list[tuple[int, str]], notes: list[str]) -> str:
    main = impls[0].name
    peers = [impl.name for impl in impls if not impl.name.startswith("ringcc:")]
    lines = [
        f"# ringcc benchmark: {collective.name}",
        f"# ranks {meta['ranks']}  host {meta['host']}  measured: {main} (main)"
        + "".join(f", {impl.name}" for impl in impls[1:]),
        "# versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}(factor) "
        f"warmup iters: {args.warmup_iters} iters: {args.iters} validation: {args.check}",
        "# time: mean per call over the timed iterations, slowest rank (max over ranks)",
    ]
    if peers:
        lines.append(f"# ratio: peer time / {main} time (>1: {main} is faster)")
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
    """nccl-tests' closing lines: wrong elements in all, and the average bus bandwidth."""
    wrong = sum(row["wrong"] or 0 for row in rows)
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    for k, impl in enumerate(impls):
        mine = [row["busbw_GBps"] for row in rows if row["impl"] == impl.name]
        if mine:
            label = "# Avg bus bandwidth    :" if k == 0 else "#" + " " * 23
            lines.append(f"{label} {sum(mine) / len(mine):.4f} GB/s  {impl.name}")
    lines += device.ceilings(rows, [impl.name for impl in impls if impl.name.startswith("ringcc:")])
    return "\n".join(lines)


def write_json(path: str, meta: dict, rows: list[dict]) -> None:
    """The agreed format: {"meta": {...}, "rows": [{...}, ...]}."""
    with open(path, "w") as out:
        json.dump({"meta": meta, "rows": rows}, out, indent=1)
        out.write("\n")


def write_csv(path: str, rows: list[dict]) -> None:
    """The rows, one line each, with the JSON rows' keys as the header."""
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["impl"])
        writer.writeheader()
        writer.writerows(rows)


# ---- the benchmark ------------------------------------------------------------------------

def main(collective: Collective, argv: list[str] | None = None) -> int:
    """Run the benchmark; the exit status: 0, 1 when any element was wrong, 2 on bad usage."""
    from mpi4py import MPI

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(collective, argv)
    world = MPI.COMM_WORLD
    rank, ranks = world.Get_rank(), world.Get_size()
    say = print if rank == 0 else (lambda *_, **__: None)
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
        ranks_at = world.gather((os.getpid(), MPI.Get_processor_name()), root=0)
        meta = {"collective": collective.name, "ranks": ranks,
                "host": ",".join(sorted({host for _, host in ranks_at or []})),
                "versions": versions(impls), "dtype": args.datatype,
                "op": args.op if collective.reduces else "none", "root": root,
                "iters": args.iters, "warmup": args.warmup_iters, "check": bool(args.check),
                "impls": [impl.name for impl in impls],
                "command": f"mpiexec -n {ranks} python -m benchmarks.{collective.name} "
                           + shlex.join(argv)}
        if rank == 0:
            print(header(collective, args, impls, meta, ranks_at, notes + peer_notes), flush=True)
        rows = []
        for dtype, op in pairs:
            for impl in impls:
                if dtype not in impl.dtypes:
                    say(f"# {impl.name} cannot move {dtype}: not measured")
            for count in counts(collective, args.sizes, numpy.dtype(dtype).itemsize, ranks):
                measured = measure_size(collective, impls, count, dtype, op, root, args, world)
                rows += [row for row in measured.values() if row is not None]
                say(format_row(measured, impls), flush=True)
    say(summary(rows, impls))
    if rank == 0 and args.json:
        write_json(args.json, meta, rows)
    if rank == 0 and args.csv:
        write_csv(args.csv, rows)
    return 1 if any(row["wrong"] for row in rows) else 0
