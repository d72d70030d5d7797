"""What the explainer runs: readable data, and one lesson per collective or naive algorithm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy

from transports.base import segments

from ..chunking import chunk_bounds
from ..communicator import Communicator

DTYPE = numpy.dtype(numpy.float64)
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
    node_size: int = 0  # hierarchical: ranks per node (nodes of consecutive ranks)

    @property
    def block(self) -> int:
        return self.count // self.size

    @property
    def nbytes(self) -> int:
        return self.count * DTYPE.itemsize


def readable(rank: int, count: int) -> numpy.ndarray:
    """The data rank `rank` starts with: r*10 + i, so every value says where it came from."""
    return rank * 10 + numpy.arange(count, dtype=DTYPE)


def _own_data(rank: int, setup: Setup) -> numpy.ndarray:
    return readable(rank, setup.count)


def _everything(rank: int, setup: Setup) -> tuple[int, int]:
    return 0, setup.count


def _every_rank_reduced(rank: int, setup: Setup) -> int:
    return setup.size


@dataclass(frozen=True, kw_only=True)
class Lesson:
    """How to show one collective: how a rank's buffer starts (`start`: the array the trace's
    offsets refer to, which is also what the explainer shows), how to run the real collective
    on it (`run`), what each rank's buffer should hold at the end (`target`: NaN where the
    collective leaves no result), and what each rank should send (`sends`)."""

    title: str
    piece: str  # what the schedule moves: "chunk", "block", "segment" or "buffer"
    grid: Callable[[Setup], list[tuple[int, int]]]  # the pieces, as [lo, hi) ranges
    run: Callable[[Communicator, numpy.ndarray, Setup], Any]
    target: Callable[[int, Setup], numpy.ndarray]
    sends: Callable[[Setup], tuple[list[float], str]]  # bytes each rank should send, and why
    start: Callable[[int, Setup], numpy.ndarray] = _own_data
    reduces: bool = False
    rooted: bool = False
    blocks: bool = False  # the buffer is cut into N equal blocks, so N must divide count
    # op "avg": the phase after whose last move a rank that received in it divides
    # `averaged(rank)` by N; or, where every rank divides whatever it received, the phase
    # before whose first move it does (at its end if it has none): `divide_before`.
    average_phase: str = ""
    divide_before: str = ""
    averaged: Callable[[int, Setup], tuple[int, int]] = _everything
    divisor: Callable[[int, Setup], int] = _every_rank_reduced  # what "avg" divides by
    boxes: bool = False  # naive ring: moves land in two boxes, then reduce into the buffer


def _reduced(setup: Setup, ranks: int | None = None) -> numpy.ndarray:
    """NumPy's reduction of the readable buffers of ranks 0..ranks-1 (default: every rank):
    the reference for the reductions."""
    ranks = setup.size if ranks is None else ranks
    stack = numpy.stack([readable(r, setup.count) for r in range(ranks)])
    total = REDUCE[setup.op].reduce(stack, axis=0)
    return total / ranks if setup.op == "avg" else total


def _blocks(setup: Setup) -> list[tuple[int, int]]:
    return [(r * setup.block, (r + 1) * setup.block) for r in range(setup.size)]


def _whole(setup: Setup) -> list[tuple[int, int]]:
    return [(0, setup.count)]


def _only(target: numpy.ndarray, lo: int, hi: int) -> numpy.ndarray:
    """`target` with every element outside [lo, hi) marked as not part of the result."""
    out = numpy.full_like(target, EMPTY)
    out[lo:hi] = target[lo:hi]
    return out


def _every_rank(per_rank: Callable[[Setup], float],
                text: str) -> Callable[[Setup], tuple[list[float], str]]:
    """The same for every rank: `per_rank(setup)` bytes."""
    return lambda s: ([per_rank(s)] * s.size, text)


def _all_reduce_target(rank: int, setup: Setup) -> numpy.ndarray:
    return _reduced(setup)


def _naive(algorithm: str) -> Callable[[Communicator, numpy.ndarray, Setup], Any]:
    """Run the naive all-reduce `algorithm` of naive.py in place."""
    return lambda comm, buf, s: comm.all_reduce(buf, buf, op=s.op, algorithm=algorithm)


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


def _nothing(setup: Setup) -> numpy.ndarray:
    """A rank's result where the collective leaves it none (a gather's other ranks)."""
    return numpy.full(setup.count, EMPTY)


def _gather_run(comm: Communicator, start: numpy.ndarray, setup: Setup) -> numpy.ndarray:
    lo, hi = _blocks(setup)[comm.rank]
    if comm.rank != setup.root:
        comm.gather(start[lo:hi], None, setup.root)
        return numpy.empty(0)
    # In place: the root's own block is already where the result wants it.
    return comm.gather(start[lo:hi], start.reshape(setup.size, setup.block), setup.root)


def _gather_target(rank: int, setup: Setup) -> numpy.ndarray:
    if rank != setup.root:
        return _nothing(setup)
    return numpy.concatenate([readable(k, setup.block) for k in range(setup.size)])


def _gather_sends(setup: Setup) -> tuple[list[float], str]:
    sent = [setup.nbytes / setup.size] * setup.size
    sent[setup.root] = 0.0
    return sent, "S/N each, its block, but the root: the least possible"


def _reduce_run(comm: Communicator, start: numpy.ndarray, setup: Setup) -> numpy.ndarray:
    result = comm.reduce(start, None, op=setup.op, root=setup.root)
    return numpy.empty(0) if result is None else result


def _reduce_sends(setup: Setup) -> tuple[list[float], str]:
    sent = [float(setup.nbytes)] * setup.size
    lo, hi = chunk_bounds(setup.count, setup.size)[setup.root]
    sent[setup.root] -= (hi - lo) * DTYPE.itemsize
    return sent, "S each: every chunk round the ring but its own, then its own to the root"


def _all_to_all_start(rank: int, setup: Setup) -> numpy.ndarray:
    """The buffer sent, then the one received, whose own block a rank copies itself: shown
    in place from the start, since no message carries it."""
    out = numpy.full(2 * setup.count, EMPTY)
    out[:setup.count] = readable(rank, setup.count)
    lo, hi = _blocks(setup)[rank]
    out[setup.count + lo:setup.count + hi] = out[lo:hi]
    return out


def _all_to_all_run(comm: Communicator, start: numpy.ndarray, setup: Setup) -> numpy.ndarray:
    halves = start.reshape(2, setup.size, setup.block)
    comm.all_to_all(halves[0], halves[1])
    return start


def _all_to_all_target(rank: int, setup: Setup) -> numpy.ndarray:
    lo, hi = _blocks(setup)[rank]
    received = [readable(k, setup.count)[lo:hi] for k in range(setup.size)]
    return numpy.concatenate([readable(rank, setup.count), *received])


def _scan_sends(setup: Setup) -> tuple[list[float], str]:
    distances = [1 << k for k in range((setup.size - 1).bit_length())]
    return ([sum(r + d < setup.size for d in distances) * float(setup.nbytes)
             for r in range(setup.size)],
            "S in each step k where r + 2^k < N: ceil(log2(N - r)) S from rank r")


def _shards(setup: Setup) -> list[tuple[int, int]]:
    """The hierarchical all-reduce's shards: the buffer cut in one per rank of a node."""
    return chunk_bounds(setup.count, setup.node_size)


def _hierarchical_sends(setup: Setup) -> tuple[list[float], str]:
    """Inside its node, a ring reduce-scatter and all-gather of the shards: every shard but
    one each (hierarchical.py); across nodes, the ring all-reduce of its shard."""
    k, nodes = setup.node_size, setup.size // setup.node_size
    shards = _shards(setup)
    sent = []
    for rank in range(setup.size):
        node, local = divmod(rank, k)
        inside = 2 * setup.count - _length(shards[local]) - _length(shards[(local + 1) % k])
        chunks = chunk_bounds(_length(shards[local]), nodes)
        across = 2 * _length(shards[local]) - _length(chunks[(node + 1) % nodes]) \
            - _length(chunks[(node + 2) % nodes])
        sent.append(float((inside + across) * DTYPE.itemsize))
    return sent, ("2(k-1)/k S inside its node, 2(M-1)/M S/k across nodes, "
                  "with k ranks on each of M nodes")


def _length(bounds: tuple[int, int]) -> int:
    return bounds[1] - bounds[0]


def _sendrecv_start(rank: int, setup: Setup) -> numpy.ndarray:
    """The buffer sent, then the one received (on one rank, which copies: shown done)."""
    out = numpy.full(2 * setup.count, EMPTY)
    out[:setup.count] = readable(rank, setup.count)
    if setup.size == 1:
        out[setup.count:] = out[:setup.count]
    return out


def _sendrecv_run(comm: Communicator, start: numpy.ndarray, setup: Setup) -> numpy.ndarray:
    rank, size, count = comm.rank, comm.size, setup.count
    comm.sendrecv(start[:count], (rank + 1) % size, start[count:], (rank - 1) % size)
    return start


def _sendrecv_target(rank: int, setup: Setup) -> numpy.ndarray:
    return numpy.concatenate([readable(rank, setup.count),
                              readable((rank - 1) % setup.size, setup.count)])


LESSONS: dict[str, Lesson] = {
    "all_reduce": Lesson(
        title="ring all-reduce", piece="chunk", grid=lambda s: chunk_bounds(s.count, s.size),
        run=lambda comm, buf, s: comm.all_reduce(buf, buf, op=s.op, algorithm="ring"),
        target=_all_reduce_target,
        sends=_every_rank(lambda s: 2 * (s.size - 1) * s.nbytes / s.size,
                          "2(N-1)/N S each, the least the busiest rank can send"),
        reduces=True, average_phase="reduce-scatter",
        averaged=lambda r, s: chunk_bounds(s.count, s.size)[(r + 1) % s.size]),
    "all_gather": Lesson(
        title="ring all-gather", piece="block", grid=_blocks, start=_all_gather_start,
        run=_all_gather_run,
        target=lambda r, s: numpy.concatenate([readable(k, s.block) for k in range(s.size)]),
        sends=_every_rank(lambda s: (s.size - 1) * s.nbytes / s.size,
                          "(N-1)/N S each, S the whole output: the least possible"),
        blocks=True),
    "reduce_scatter": Lesson(
        title="ring reduce-scatter", piece="block", grid=_blocks,
        run=lambda comm, buf, s: comm.reduce_scatter(buf.reshape(s.size, s.block), op=s.op),
        target=_reduce_scatter_target,
        sends=_every_rank(lambda s: (s.size - 1) * s.nbytes / s.size,
                          "(N-1)/N S each, S the whole input: the least possible"),
        reduces=True, blocks=True, average_phase="reduce-scatter",
        averaged=lambda r, s: _blocks(s)[r]),
    "broadcast": Lesson(
        title="pipelined ring broadcast", piece="segment",
        grid=lambda s: segments(s.count, DTYPE.itemsize, s.segment_bytes),
        run=lambda comm, buf, s: comm.broadcast(buf, s.root),
        target=lambda r, s: readable(s.root, s.count), sends=_broadcast_sends, rooted=True),
    "scatter": Lesson(
        title="scatter from the root", piece="block", grid=_blocks, start=_scatter_start,
        run=_scatter_run, target=_scatter_target, sends=_scatter_sends, rooted=True,
        blocks=True),
    "gather": Lesson(
        title="gather to the root", piece="block", grid=_blocks, start=_all_gather_start,
        run=_gather_run, target=_gather_target, sends=_gather_sends, rooted=True, blocks=True),
    "reduce": Lesson(
        title="reduce to the root: ring reduce-scatter, then gather", piece="chunk",
        grid=lambda s: chunk_bounds(s.count, s.size), run=_reduce_run,
        target=lambda r, s: _reduced(s) if r == s.root else _nothing(s), sends=_reduce_sends,
        reduces=True, rooted=True, average_phase="reduce-scatter",
        averaged=lambda r, s: chunk_bounds(s.count, s.size)[r]),
    "all_to_all": Lesson(
        title="pairwise all-to-all (sent, then received)", piece="block", grid=_blocks,
        start=_all_to_all_start, run=_all_to_all_run, target=_all_to_all_target,
        sends=_every_rank(lambda s: (s.size - 1) * s.nbytes / s.size,
                          "(N-1)/N S each, S the buffer: every block but its own, once"),
        blocks=True),
    "scan": Lesson(
        title="inclusive scan by recursive doubling", piece="buffer", grid=_whole,
        run=lambda comm, buf, s: comm.scan(buf, op=s.op),
        target=lambda r, s: _reduced(s, r + 1), sends=_scan_sends, reduces=True,
        average_phase="scan", divisor=lambda r, s: r + 1),
    "sendrecv": Lesson(
        title="ring shift by sendrecv (sent, then received)", piece="buffer",
        grid=_whole, start=_sendrecv_start, run=_sendrecv_run, target=_sendrecv_target,
        sends=_every_rank(lambda s: s.nbytes if s.size > 1 else 0,
                          "S each, to the next rank; a rank alone copies")),
    "naive_ring": Lesson(
        title="whole-buffer ring all-reduce (naive)", piece="buffer", grid=_whole,
        run=_naive("naive_ring"), target=_all_reduce_target,
        sends=_every_rank(lambda s: (s.size - 1) * s.nbytes, "(N-1) S each"),
        reduces=True, average_phase="whole-buffer ring", boxes=True),
    "reduce_broadcast": Lesson(
        title="reduce to the root, then broadcast (naive)", piece="buffer", grid=_whole,
        run=_naive("reduce_broadcast"), target=_all_reduce_target,
        sends=_reduce_broadcast_sends, reduces=True, average_phase="reduce"),
    "hierarchical": Lesson(
        title="hierarchical all-reduce: reduce-scatter in each node, all-reduce across nodes, "
              "all-gather in each node", piece="shard", grid=_shards,
        run=lambda comm, buf, s: comm.all_reduce(buf, buf, op=s.op, algorithm="hierarchical"),
        target=_all_reduce_target, sends=_hierarchical_sends, reduces=True,
        divide_before="node all-gather", averaged=lambda r, s: _shards(s)[r % s.node_size]),
}
ALL_REDUCES = ("all_reduce", "naive_ring", "reduce_broadcast")
