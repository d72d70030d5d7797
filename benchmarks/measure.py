"""Measuring: the same buffers for every implementation, checked once, then timed.

Each rank's input is a scrambled function of (rank, index) (`rank_data`), and the result every
rank must hold comes from a NumPy reference (`reduce_ranks` for the reductions). After its
warm-up (at least one call, so that the path checked is the path timed) and before it is
timed, an implementation makes one call into a poisoned result buffer and the wrong elements
are counted over ranks: the #wrong column (exactly, for what a collective only moves; within
the rounding of the ranks' contributions, for a float reduction).

time:  mean per call over -n iterations, the slowest rank's. Every implementation is checked
       and warmed up (-w calls) on a size's buffers before any is timed, and before the first
       size each makes -w calls at the largest size and the smallest, as nccl-tests does:
       otherwise the cold start (the job's, and each size's fresh buffers: pages mapped on
       first touch, the interpreter and the machine warming up) falls on whichever is timed
       first. Right before its timed loop, each calls on for --warmup-ms (`warm_clock`), so
       that its cores run at their working clock.
algbw: bytes / time.
busbw: algbw * the collective's factor (all-reduce 2(n-1)/n, ...): what each rank's link
       carries, so it can be held against the link's bandwidth whatever the collective and
       rank count (nccl-tests' doc/PERFORMANCE.md). The memory bound's too (it moves the
       call's bytes); a device copy's is its algbw, the hardware's own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy

from collectives import array_module_of, to_numpy
from collectives.ops import resolve_op

from . import device
from .options import Collective
from .peers import Impl

if TYPE_CHECKING:
    from mpi4py import MPI


# ---- data and the check -------------------------------------------------------------------

PERIOD = 65521  # a prime: the pattern repeats only after this many elements
RANK_SHIFT = 7919  # how far along the pattern each rank starts
HASHED = numpy.arange(PERIOD, dtype=numpy.int64) * 2654435761 % PERIOD  # a scrambled 0..PERIOD-1
DATA_MAX = 4.0  # largest magnitude of a float input


def reduce_ranks(data: Callable[[int], numpy.ndarray], ranks: int, op: str) -> numpy.ndarray:
    """The reference reduction of data(0) .. data(ranks-1).

    Integers wrap as they do in every implementation; floats are reduced in float64, and the
    check asks for them exactly where the data make every order exact (`exact`), else allows
    the rounding of the dtype (`tolerance`).
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


def exact(dtype: numpy.dtype, ranks: int, op: str | None) -> bool:
    """Whether `op` over the inputs of `ranks` ranks (`rank_data`) is exact in float `dtype`
    in any order: min and max always; a sum while every partial sum, a multiple of 1/8 of at
    most ranks * DATA_MAX, fits the dtype's mantissa (float16: up to 64 ranks)."""
    if op in ("min", "max"):
        return True
    return op == "sum" and ranks * DATA_MAX * 8 <= 2 ** (numpy.finfo(dtype).nmant + 1)


def count_wrong(result: numpy.ndarray, expected: numpy.ndarray, ranks: int,
                reduced: bool = True, op: str | None = None) -> int:
    """Elements of `result` that differ from `expected`: exactly for integers, for what is
    only moved (not `reduced`) and for a reduction by `op` that the data make exact
    (`exact`); else beyond the rounding of `ranks` contributions (NaN always differs)."""
    if result.dtype.kind != "f" or not reduced or exact(result.dtype, ranks, op):
        return int(numpy.count_nonzero(result != expected))  # (the poison is NaN)
    rtol, atol = tolerance(result.dtype, ranks)
    return int(numpy.count_nonzero(~numpy.isclose(result, expected, rtol=rtol, atol=atol)))


def poison(result: numpy.ndarray, expected: numpy.ndarray) -> None:
    """Fill a result buffer with values that are all wrong, so a call that leaves it is caught
    (and one implementation's result cannot pass for the next one's)."""
    if result.dtype.kind == "f":
        result.fill(numpy.nan)
    else:
        result[...] = array_module_of(result).asarray(expected + 1)


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


def place(impl: Impl, send: numpy.ndarray, recv: numpy.ndarray,
          own: numpy.ndarray) -> tuple[Any, Any, Any]:
    """The harness's host buffers as the arrays `impl` moves: copies at the front of its
    registered buffers (--registered 1), else `device.mirror`'s. A collective that works in
    place (recv is send) still does."""
    if impl.registered is None:
        return device.mirror(impl.xp, send, recv, own)

    def fill(role: str, host: numpy.ndarray) -> Any:
        out = impl.registered[role][:host.nbytes].view(host.dtype).reshape(host.shape)
        out[...] = impl.xp.asarray(host)
        return out

    on_send = fill("send", send)
    return on_send, on_send if recv is send else fill("recv", recv), impl.xp.asarray(own)


def own_buffers(impl: Impl, collective: Collective, send: numpy.ndarray, recv: numpy.ndarray,
                own: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
    """The send and recv buffers `impl` gets: the harness's, or for a collective it makes in
    place (`Impl.in_place`, torch.distributed's all_reduce) one buffer of its own holding the
    input as both, so that its results do not overwrite the input the others read."""
    if collective.name in impl.in_place and recv is not send:
        mine = own.copy()
        return mine, mine
    return send, recv


def prepare(impl: Impl, collective: Collective, send: numpy.ndarray, recv: numpy.ndarray,
            own: numpy.ndarray, check: bool, expected: numpy.ndarray | None, op: str,
            root: int, args: argparse.Namespace,
            world: MPI.Comm) -> tuple[Callable[[], None], int | None]:
    """Place the buffers, check once (with `check`, every rank alike; `expected` None on a rank
    that gets no result, as a gather's non-roots) and warm up: the call to time, and the
    elements wrong summed over ranks (None when unchecked)."""
    from mpi4py import MPI

    send, recv, own = place(impl, send, recv, own)

    def call() -> None:
        collective.run(impl.comm, send, recv, op, root)

    # The warm-up first, at least one call: a path that a first call of its kind sets up
    # (ringcc's small-call lane learns a kind on the general path) is then the one checked,
    # as it is the one timed.
    for _ in range(max(1, args.warmup_iters)):
        call()
    wrong = None
    if check:
        send[...] = own  # an in-place call (recv is send) has overwritten it
        if recv is not send and expected is not None:
            poison(recv, expected)
        call()
        here = 0 if expected is None else count_wrong(to_numpy(recv), expected, world.size,
                                                      collective.reduces, op)
        wrong = int(reduce_scalar(world, here, MPI.SUM))
    device.synchronize(impl.xp)
    return call, wrong


def time_calls(call: Callable[[], None], impl: Impl, args: argparse.Namespace,
               world: MPI.Comm) -> float:
    """Mean us per call over -n iterations, the slowest rank's, right after `warm_clock`."""
    from mpi4py import MPI

    warm_clock(call, impl, args, world)
    settle(world.Ibarrier())
    start = time.perf_counter()
    for _ in range(args.iters):
        call()
    device.synchronize(impl.xp)
    elapsed = (time.perf_counter() - start) / args.iters
    return reduce_scalar(world, elapsed, MPI.MAX) * 1e6


def warm_clock(call: Callable[[], None], impl: Impl, args: argparse.Namespace,
               world: MPI.Comm) -> None:
    """Call on until every rank has spent --warmup-ms in calls, right before they are timed.

    A core that has been waiting (in the previous implementation's MPI, or idle) runs at a
    lower clock for its first milliseconds of work. Measured on the 2-core build machine: a
    1 MiB memcpy took 70-79 us for its first 20 calls after 50 ms idle, then 45 us, and ringcc's
    1 MiB sendrecv took about 220 us for 6 calls after MPICH's timed loop, then 160, then
    125-135. -n 20 calls of a megabyte last a few milliseconds: without this, they would time
    the ramp, and whichever implementation runs after a more restful one would pay for it.
    Every rank makes the same number of calls: they agree after each whether to go on."""
    from mpi4py import MPI

    if args.warmup_ms <= 0:
        return
    start = time.perf_counter()
    while True:
        call()
        if reduce_scalar(world, time.perf_counter() - start, MPI.MIN) * 1e3 >= args.warmup_ms:
            break
    device.synchronize(impl.xp)


def warm_up(collective: Collective, impls: list[Impl], counts: list[int], dtype: str, op: str,
            root: int, args: argparse.Namespace, world: MPI.Comm) -> None:
    """-w untimed calls of every implementation at the largest count, then at the smallest
    (nccl-tests' warm-up before its sizes)."""
    rank, ranks = world.Get_rank(), world.Get_size()
    for count in dict.fromkeys((max(counts), min(counts))):
        send_shape, recv_shape = collective.shapes(count, ranks)
        send = rank_data(rank, send_shape, dtype, op)
        recv = send if recv_shape is None else numpy.empty(recv_shape, dtype)
        for impl in impls:
            if impl.can(collective.name, dtype):
                on_send, on_recv, _ = place(impl, *own_buffers(impl, collective, send, recv,
                                                                send), send)
                for _ in range(args.warmup_iters):
                    collective.run(impl.comm, on_send, on_recv, op, root)
                device.synchronize(impl.xp)


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
    # Every implementation is checked and warmed up on these buffers before any is timed, so
    # that none is timed while they are still cold and the next one finds them warm.
    ready = {impl.name: prepare(impl, collective, *own_buffers(impl, collective, send, recv, own),
                                own, bool(args.check) and not impl.reference, expected, op,
                                root, args, world)
             for impl in impls if impl.can(collective.name, dtype)}
    # Each round times every implementation once, in turn, so that each is timed across the
    # same spells of the machine: the median round of each is compared.
    rounds: dict[str, list[float]] = {name: [] for name in ready}
    for _ in range(args.rounds):
        for impl in impls:
            if impl.name in ready:
                rounds[impl.name].append(time_calls(ready[impl.name][0], impl, args, world))
    measured: dict[str, dict | None] = {}
    for impl in impls:
        if impl.name not in ready:
            measured[impl.name] = None
            continue
        wrong = ready[impl.name][1]
        time_us = statistics.median(rounds[impl.name])
        algbw = nbytes / time_us / 1e3
        # The memory bound moves the call's bytes, so its busbw takes the call's factor; a
        # device copy's is the hardware's own, a copy's bandwidth.
        factor = 1.0 if impl.name == "copy" else collective.bus_factor(ranks)
        measured[impl.name] = {
            "impl": impl.name, "collective": collective.name, "ranks": ranks, "bytes": nbytes,
            "count": count, "dtype": dtype, "op": op, "root": root, "time_us": time_us,
            "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
            "wrong": wrong, "registered": impl.registered is not None,
            "rounds_us": rounds[impl.name]}
    return measured
