"""Synchronous data parallelism over a `Communicator`, in the manner of PyTorch DDP.

Every rank holds the whole model and runs forward and backward on its own share of the
batch; before the optimizer step, the gradients are averaged over ranks, so every rank takes
the same step and the models never drift apart.

- Construction broadcasts every parameter from rank 0: the ranks start identical.
- The gradients lie back to back in one flat vector (`Layout`), the parameters last first,
  the order backward completes them in. Buckets of `bucket_mb` megabytes (PyTorch's
  `bucket_cap_mb`) cut the vector, across parameter boundaries where they fall, and each
  bucket is one all-reduce. A bucket is complete when all of its elements have arrived.
- With `overlap`, a complete bucket's all-reduce is started with `async_op=True`: it runs on
  the communicator's progress thread while backward goes on with the layers below, and
  backward waits for every bucket's `Work` before it returns. Without, each bucket is
  all-reduced on the main thread at once. A bucket whose collective takes several steps
  (float16 with its scale, or staging through host memory) goes as one `comm.submit`.
- With `grad_dtype="float16"`, gradients travel in half precision (compress.py): half the
  bytes, at the cost of two conversions and float16 arithmetic.
- Inside `with ddp.no_sync():` gradients only accumulate locally (gradient accumulation);
  the first backward outside it averages everything accumulated.

When `loss.backward()` returns, `.grad` of every parameter is the average over ranks (a view
of the flat vector). A parameter that gets no gradient stalls its bucket; the next forward
reports it, as PyTorch's "Expected to have finished reduction in the prior iteration" does.

Averaging weighs every rank alike. When the shards differ in size, scale each rank's loss
so the average is the global batch's mean: sum over the rank's samples * size / global batch
(what `python -m trainer` does).

Overlap pays where the progress thread finds a free core. Where every rank already keeps a
core busy (2 ranks on 2 cores), the thread competes with backward for it, and
`overlap=False` can be as fast or faster: the benchmark shows which.

ZeRO (zero.py) is this class with another collective per bucket: a reduce-scatter.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy

from collectives import Communicator, Work

from .compress import GRAD_DTYPES, from_float16, to_float16
from .nn import Module
from .tensor import Tensor


@dataclass
class Layout:
    """Where each parameter's gradient lies in the flat vector, and the buckets that cut it."""

    names: list[str]  # the parameters, last first
    params: list[Tensor]
    offsets: list[int]  # where each starts
    real: int  # elements of all parameters
    size: int  # `real` padded to a multiple of the alignment: zeros at the end
    bucket: int  # elements per bucket, a multiple of the alignment (the last may be shorter)
    buckets: list[tuple[int, int]]  # [lo, hi) of each, in the order they are reduced

    def pieces(self, i: int) -> list[tuple[int, int, int]]:
        """(bucket, lo, hi): the parts of parameter `i`'s range [lo, hi) in each bucket."""
        start, end = self.offsets[i], self.offsets[i] + self.params[i].data.size
        return [(k, max(start, k * self.bucket), min(end, (k + 1) * self.bucket))
                for k in range(start // self.bucket, -(-end // self.bucket))]


def flat_layout(named_params: list[tuple[str, Tensor]], bucket_bytes: int,
                align: int = 1) -> Layout:
    """Lay the parameters out last first; buckets of about `bucket_bytes`, each a multiple of
    `align` elements, and the whole padded to a multiple of `align` (ZeRO's rank count)."""
    if len({p.dtype for _, p in named_params}) > 1:
        raise ValueError("every parameter must have the same dtype: the gradients travel in "
                         "one flat vector")
    ordered = list(reversed(named_params))
    sizes = [p.data.size for _, p in ordered]
    real = sum(sizes)
    size = -(-real // align) * align
    itemsize = ordered[0][1].data.itemsize if ordered else 1
    bucket = max(align, bucket_bytes // itemsize // align * align)
    return Layout([n for n, _ in ordered], [p for _, p in ordered],
                  numpy.cumsum([0] + sizes[:-1]).tolist() if ordered else [], real, size,
                  bucket, [(lo, min(lo + bucket, size)) for lo in range(0, size, bucket)])


class DistributedDataParallel(Module):
    """Wrap `module` so that backward leaves gradients averaged over the ranks of `comm`."""

    sharded = False  # ZeRO reduce-scatters and needs its machinery even on one rank

    def __init__(self, module: Module, comm: Communicator, bucket_mb: float = 25.0,
                 overlap: bool = True, grad_dtype: str = "float32") -> None:
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        if grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"grad_dtype must be one of {GRAD_DTYPES}, got {grad_dtype!r}")
        self.module, self.comm, self.overlap = module, comm, overlap
        self.half = grad_dtype == "float16"
        self.comm_seconds = 0.0  # time spent inside collectives, on whichever thread
        self._works: list[Work] = []  # the buckets in flight, in order (with overlap)
        self._launched = self._completed = 0  # buckets go in order on every rank
        self.layout = flat_layout(list(module.named_parameters()), int(bucket_mb * 2**20),
                                  comm.size if self.sharded else 1)
        self._sync = True
        self._arrived: set[int] = set()  # indices of the parameters whose gradient is in
        self.grads: Any = None  # the flat gradient vector, where one is kept
        self._host: Any = None  # its copy in host memory, where it must travel through one
        self._half: Any = None  # a bucket in float16, to send
        if (comm.size == 1 and not self.sharded) or not self.layout.params:
            return  # nothing to average: the wrapper stays out of the way
        xp = self.layout.params[0].xp
        # Device gradients are staged through host memory when the communicator moves host
        # arrays (plain averaging only).
        staged = xp is not numpy and comm.device == "cpu"
        if staged and (self.sharded or self.half):
            raise ValueError("ZeRO and float16 gradients need a communicator that moves the "
                             "parameters' arrays (device='cuda' for CuPy)")
        self._broadcast_parameters(staged)
        self._allocate(xp, staged)
        if staged:
            self._host = comm.zeros(self.layout.size, self.grads.dtype)
        if self.half:  # one bucket at a time is in flight, so one buffer serves every bucket
            self._half = comm.empty(self.layout.buckets[0][1], numpy.float16)
        buckets = self.layout.buckets
        self._filled = [0] * len(buckets)  # elements of each bucket in place
        self._need = [min(hi, self.layout.real) - lo for lo, hi in buckets]
        self._where = {id(p): i for i, p in enumerate(self.layout.params)}
        for param in self.layout.params:
            param.register_hook(self._grad_ready)
        if self.grads is not None:  # backward computes weight gradients straight into place
            for param, view in zip(self.layout.params, self._views()):
                param.grad_out = view

    def forward(self, x: Tensor) -> Tensor:
        if self._arrived:
            missing = [name for i, name in enumerate(self.layout.names)
                       if i not in self._arrived]
            raise RuntimeError("the previous backward did not finish averaging gradients: "
                               "every parameter must get a gradient in every backward "
                               f"({missing} got none)")
        return self.module(x)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside this block only accumulates gradients on this rank."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank keeps for the parameters and for their gradients between steps."""
        params = sum(p.data.nbytes for p in self.layout.params)
        if self.grads is None:  # one rank: the gradients stay in the parameters' `.grad`
            return {"parameters": params, "gradients": params}
        kept = [self.grads, self._host, self._half]
        return {"parameters": params, "gradients": sum(b.nbytes for b in kept if b is not None)}

    def close(self) -> None:
        """Wait for the buckets still in flight (a backward that raised may leave some); their
        errors were raised, or are raised by the communicator's next call."""
        works, self._works = self._works[self._completed:], []
        for work in works:
            work.exception()

    def __enter__(self) -> DistributedDataParallel:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ---- what ZeRO changes -----------------------------------------------------------------

    def _allocate(self, xp: Any, staged: bool) -> None:
        """The flat gradient vector, in registered memory so that peers reduce straight out of
        it (see Communicator.empty), unless it must be staged through host memory."""
        allocate = xp.zeros if staged else self.comm.zeros
        self.grads = allocate(self.layout.size, self.layout.params[0].dtype)

    def _bucket(self, k: int) -> Any:
        """Where bucket `k`'s gradients are gathered before its collective."""
        lo, hi = self.layout.buckets[k]
        return self.grads[lo:hi]

    def _reduce(self, k: int, async_op: bool = False) -> Work | None:
        """Bucket `k`'s collective: average it over the ranks, in place; with `async_op`, in
        the background, returning its `Work`."""
        grads, comm = self._bucket(k), self.comm
        if self._host is None and not self.half:
            work = comm.all_reduce(grads, grads, op="avg", async_op=async_op)
            return work if async_op else None
        if async_op:  # several steps: queued as one
            return comm.submit(self._reduce, k)
        if self._host is not None:
            lo, hi = self.layout.buckets[k]
            host = self._host[lo:hi]
            grads.device.use()  # CUDA's current device is per thread: this may be another
            grads.get(out=host)
            comm.all_reduce(host, host, op="avg")
            grads.set(host)
        elif self.half:
            half = self._half[:grads.size]
            scale = to_float16(comm, grads, half)
            comm.all_reduce(half, half, op="sum")
            from_float16(half, scale * comm.size, grads)
        return None

    def _hand_out(self) -> None:
        """After the last bucket: each parameter's `.grad` becomes its averaged gradient."""
        for param, view in zip(self.layout.params, self._views()):
            param.grad = view

    def _views(self) -> list[Any]:
        """Each parameter's part of the flat gradient vector, in its shape."""
        return [self.grads[offset: offset + param.data.size].reshape(param.shape)
                for param, offset in zip(self.layout.params, self.layout.offsets)]

    def _broadcast_parameters(self, staged: bool) -> None:
        """Give every rank rank 0's parameters."""
        for param in self.layout.params:
            if staged:
                host = param.data.get()
                self.comm.broadcast(host, root=0)
                param.data.set(host)
            else:
                self.comm.broadcast(param.data, root=0)

    # ---- inside backward -------------------------------------------------------------------

    def _grad_ready(self, param: Tensor) -> None:
        """Hook: `param`'s gradient is complete. Copy it in; start every complete bucket."""
        if not self._sync:
            return
        i = self._where[id(param)]
        grad, start = param.grad.reshape(-1), self.layout.offsets[i]
        copy = param.grad is not param.grad_out  # else backward wrote it in place
        for k, lo, hi in self.layout.pieces(i):
            if copy:
                bucket_lo = self.layout.buckets[k][0]
                self._bucket(k)[lo - bucket_lo: hi - bucket_lo] = grad[lo - start: hi - start]
            self._filled[k] += hi - lo
            self._launch_complete()  # at once: ZeRO-2 reuses a bucket's buffer two buckets on
        self._arrived.add(i)
        if self.sharded:  # the gradient lives on only as this rank's shard
            param.grad = None
        if self._launched == len(self._filled):
            self._finish()

    def _launch_complete(self) -> None:
        """Start the complete buckets, in order."""
        while self._launched < len(self._filled) and \
                self._filled[self._launched] == self._need[self._launched]:
            if self.overlap:
                self._works.append(self._reduce(self._launched, async_op=True))
            else:
                self._run(self._launched)
                self._completed += 1
            self._launched += 1

    def _wait(self, buckets: int) -> None:
        """Return once the first `buckets` buckets are reduced; raise a failure of theirs."""
        while self._completed < buckets:
            work = self._works[self._completed]
            self._completed += 1
            work.wait()
            self.comm_seconds += work.seconds

    def _finish(self) -> None:
        """Every bucket is launched: wait for them, then hand out the averaged gradients."""
        self._wait(len(self._filled))
        self._works = []
        self._launched = self._completed = 0
        self._filled = [0] * len(self._filled)
        self._arrived = set()
        self._hand_out()

    def _run(self, k: int) -> None:
        start = time.perf_counter()
        self._reduce(k)
        self.comm_seconds += time.perf_counter() - start
