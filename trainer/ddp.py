"""Synchronous data parallelism over a `Communicator`, in the manner of PyTorch DDP.

Every rank holds the whole model and runs forward and backward on its own share of the
batch; before the optimizer step, the gradients are averaged over ranks, so every rank takes
the same step and the models never drift apart.

- Construction broadcasts every parameter from rank 0: the ranks start identical.
- Gradients travel in buckets of about `bucket_mb` megabytes (PyTorch's `bucket_cap_mb`),
  one all-reduce per bucket rather than one per parameter. Buckets are filled in reverse
  parameter order, the order backward produces gradients in.
- With `overlap`, a bucket is all-reduced on a communication thread as soon as its last
  gradient is complete, while backward goes on with the layers below. The communicator is
  not thread-safe, so during backward only that thread calls collectives; the main thread
  waits for every bucket before backward returns.
- Inside `with ddp.no_sync():` gradients only accumulate locally (gradient accumulation);
  the first backward outside it averages everything accumulated.

When `loss.backward()` returns, `.grad` of every parameter is the average over ranks. A
parameter that gets no gradient stalls its bucket; the next forward reports it, as PyTorch's
"Expected to have finished reduction in the prior iteration" does.

Averaging weighs every rank alike. When the shards differ in size, scale each rank's loss
so the average is the global batch's mean: sum over the rank's samples * size / global batch
(what `python -m trainer` does).

Overlap pays where the communication thread finds a free core. Where every rank already
keeps a core busy (2 ranks on 2 cores), the thread competes with backward for it, and
`overlap=False` can be as fast or faster: the benchmark shows which.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy

from collectives import Communicator

from .nn import Module
from .tensor import Tensor


@dataclass
class Bucket:
    """Parameters whose gradients travel together, and the flat buffer they travel in."""

    params: list[Tensor]
    offsets: list[int]
    flat: Any  # device (or host) array holding the gradients back to back
    host: Any | None = None  # host copy, when the transport cannot move device arrays
    ready: int = 0  # how many of `params` have their gradient copied into `flat`
    names: list[str] = field(default_factory=list)

    def views(self) -> Iterator[tuple[Tensor, Any]]:
        """(parameter, its slice of `flat` in the parameter's shape)."""
        for param, offset in zip(self.params, self.offsets):
            yield param, self.flat[offset: offset + param.data.size].reshape(param.shape)


def make_buckets(named_params: list[tuple[str, Tensor]], bucket_bytes: int) -> list[Bucket]:
    """Group parameters, last first, into buckets of at least one parameter and about
    `bucket_bytes` each; one dtype per bucket."""
    buckets: list[Bucket] = []
    group: list[tuple[str, Tensor]] = []
    nbytes = 0
    for name, param in reversed(named_params):
        full = nbytes + param.data.nbytes > bucket_bytes
        if group and (full or param.dtype != group[0][1].dtype):
            buckets.append(_bucket(group))
            group, nbytes = [], 0
        group.append((name, param))
        nbytes += param.data.nbytes
    if group:
        buckets.append(_bucket(group))
    return buckets


def _bucket(group: list[tuple[str, Tensor]]) -> Bucket:
    params = [param for _, param in group]
    offsets = numpy.cumsum([0] + [p.data.size for p in params[:-1]]).tolist()
    flat = params[0].xp.empty(sum(p.data.size for p in params), params[0].dtype)
    return Bucket(params, offsets, flat, names=[name for name, _ in group])


class DistributedDataParallel(Module):
    """Wrap `module` so that backward leaves gradients averaged over the ranks of `comm`."""

    def __init__(self, module: Module, comm: Communicator, bucket_mb: float = 25.0,
                 overlap: bool = True) -> None:
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        self.module = module
        self.comm = comm
        self.overlap = overlap
        self.comm_seconds = 0.0  # time spent inside all-reduce calls, on whichever thread
        # The buckets, in the order they are all-reduced (last parameters first).
        self.buckets = make_buckets(list(module.named_parameters()), int(bucket_mb * 2**20))
        self._sync = True
        self._next = 0  # the next bucket to all-reduce: buckets go in order on every rank
        self._thread: threading.Thread | None = None
        if comm.size == 1:  # nothing to average: the wrapper stays out of the way
            return
        # Each bucket's buffer in registered memory, so that peers reduce straight out of it
        # (see Communicator.empty); device gradients are staged through host memory when the
        # communicator moves host arrays.
        staged = bool(self.buckets) and self.buckets[0].params[0].xp is not numpy \
            and comm.device == "cpu"
        for bucket in self.buckets:
            if staged:
                bucket.host = comm.empty(bucket.flat.shape, bucket.flat.dtype)
            else:
                bucket.flat = comm.empty(bucket.flat.shape, bucket.flat.dtype)
        self._broadcast_parameters()
        for bucket in self.buckets:
            for param in bucket.params:
                param.register_hook(self._grad_ready)
        self._where = {id(p): (b, offset) for b in self.buckets
                       for p, offset in zip(b.params, b.offsets)}
        if overlap and self.buckets:
            self._todo: queue.SimpleQueue[Bucket | None] = queue.SimpleQueue()
            self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._communicate, daemon=True,
                                            name=f"ddp-comm-rank-{comm.rank}")
            self._thread.start()

    def forward(self, x: Tensor) -> Tensor:
        stalled = [name for b in self.buckets if b.ready for name in b.names]
        if stalled:
            raise RuntimeError("the previous backward did not finish averaging gradients: "
                               "every parameter must get a gradient in every backward "
                               f"(bucket holding {stalled} was left incomplete)")
        return self.module(x)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside this block only accumulates gradients on this rank."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def close(self) -> None:
        """Stop the communication thread. The wrapper cannot average afterwards."""
        if self._thread is not None:
            self._todo.put(None)
            self._thread.join()
            self._thread = None

    def __enter__(self) -> DistributedDataParallel:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ---- inside backward -------------------------------------------------------------------

    def _grad_ready(self, param: Tensor) -> None:
        """Hook: `param`'s gradient is complete. Start every bucket that is now full."""
        if not self._sync:
            return
        bucket, offset = self._where[id(param)]
        bucket.flat[offset: offset + param.data.size] = param.grad.reshape(-1)
        bucket.ready += 1
        while self._next < len(self.buckets) and \
                self.buckets[self._next].ready == len(self.buckets[self._next].params):
            if self.overlap:
                self._todo.put(self.buckets[self._next])
            self._next += 1
        if self._next == len(self.buckets):
            self._finish()

    def _finish(self) -> None:
        """Every bucket is launched: wait for them, then hand out the averaged gradients."""
        self._next = 0
        for bucket in self.buckets:
            bucket.ready = 0
        if self.overlap:
            errors = [self._done.get() for _ in self.buckets]
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
        else:
            for bucket in self.buckets:
                self._all_reduce(bucket)
        for bucket in self.buckets:
            for param, view in bucket.views():
                param.grad = view

    def _communicate(self) -> None:
        """The communication thread: all-reduce buckets in the order they come."""
        if self.buckets[0].params[0].xp is not numpy:
            self.buckets[0].flat.device.use()  # CUDA's current device is per thread
        while (bucket := self._todo.get()) is not None:
            try:
                self._all_reduce(bucket)
                self._done.put(None)
            except BaseException as error:  # noqa: BLE001 - raised again on the main thread
                self._done.put(error)

    def _all_reduce(self, bucket: Bucket) -> None:
        start = time.perf_counter()
        self._on_transport(bucket, lambda buf: self.comm.all_reduce(buf, buf, op="avg"))
        self.comm_seconds += time.perf_counter() - start

    def _broadcast_parameters(self) -> None:
        """Give every rank rank 0's parameters, one broadcast per bucket."""
        for bucket in self.buckets:
            for param, view in bucket.views():
                view[...] = param.data
            self._on_transport(bucket, lambda buf: self.comm.broadcast(buf, root=0))
            for param, view in bucket.views():
                param.data[...] = view

    @staticmethod
    def _on_transport(bucket: Bucket, collective: Callable[[Any], Any]) -> None:
        """Run `collective` on the bucket's buffer, through host memory if it must."""
        if bucket.host is None:
            collective(bucket.flat)
        else:
            bucket.flat.get(out=bucket.host)
            collective(bucket.host)
            bucket.flat.set(bucket.host)
