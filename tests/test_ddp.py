"""Data parallelism on thread ranks (`collectives.spawn`): the averaged gradients against a
single-process reference, the flat layout and its buckets, overlap, no_sync, and the errors.

Each rank trains on rank-dependent data; the reference computes the same gradients in one
process and averages them with NumPy.
"""

from __future__ import annotations


import numpy
import pytest

import collectives
from trainer.ddp import DistributedDataParallel, flat_layout
from trainer.nn import MLP, Linear, Module
from trainer.optim import SGD
from trainer.tensor import Tensor, cross_entropy
from gpu import needs_gpu

SIZES = [6, 5, 4, 3]


def rank_batch(rank: int, n: int = 4) -> tuple[numpy.ndarray, numpy.ndarray]:
    rng = numpy.random.default_rng(100 + rank)
    return rng.standard_normal((n, SIZES[0])), rng.integers(0, SIZES[-1], n)


def local_gradients(model: Module, rank: int) -> dict[str, numpy.ndarray]:
    x, y = rank_batch(rank)
    model.zero_grad()
    cross_entropy(model(Tensor(x)), y).backward()
    return {name: p.grad.copy() for name, p in model.named_parameters()}


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("bucket_mb", [25.0, 1e-4])
def test_gradients_are_averaged_and_parameters_broadcast(size, overlap, bucket_mb):
    reference = MLP(SIZES, seed=0, dtype=numpy.float64)  # rank 0's seed
    expected = [local_gradients(reference, r) for r in range(size)]
    average = {k: numpy.mean([g[k] for g in expected], axis=0) for k in expected[0]}

    def body(comm):
        model = MLP(SIZES, seed=comm.rank, dtype=numpy.float64)  # ranks start different
        with DistributedDataParallel(model, comm, bucket_mb=bucket_mb, overlap=overlap) as ddp:
            start = model.state_dict()
            x, y = rank_batch(comm.rank)
            cross_entropy(ddp(Tensor(x)), y).backward()
            return start, {name: p.grad.copy() for name, p in model.named_parameters()}

    for start, grads in collectives.spawn(body, size):
        for name, value in reference.state_dict().items():
            numpy.testing.assert_array_equal(start[name], value)
        for name, value in average.items():
            numpy.testing.assert_allclose(grads[name], value, rtol=1e-12, atol=1e-15)


def test_the_flat_layout_puts_the_last_parameters_first_and_buckets_cut_through_them():
    model = MLP([10, 20, 30, 4], seed=0)  # float32: 200 + 20 + 600 + 30 + 120 + 4 elements
    names = [n for n, _ in model.named_parameters()]
    layout = flat_layout(list(model.named_parameters()), bucket_bytes=1000)
    assert layout.names == names[::-1]
    assert layout.offsets == [0, 4, 124, 154, 754, 774] and layout.real == layout.size == 974
    assert layout.buckets == [(0, 250), (250, 500), (500, 750), (750, 974)]
    assert layout.pieces(2) == [(0, 124, 154)]  # layers.2.bias, inside the first bucket
    assert layout.pieces(3) == [(0, 154, 250), (1, 250, 500), (2, 500, 750), (3, 750, 754)]
    aligned = flat_layout(list(model.named_parameters()), bucket_bytes=1000, align=3)
    assert aligned.size == 975 and aligned.buckets[:2] == [(0, 249), (249, 498)]
    assert all((hi - lo) % 3 == 0 for lo, hi in aligned.buckets)
    assert flat_layout(list(model.named_parameters()), 1, align=4).bucket == 4  # never empty
    mixed = [("a", Tensor(numpy.ones(2, numpy.float32), requires_grad=True)),
             ("b", Tensor(numpy.ones(2, numpy.float64), requires_grad=True))]
    with pytest.raises(ValueError, match="same dtype"):
        flat_layout(mixed, 1 << 20)


@pytest.mark.parametrize("overlap", [True, False])
def test_one_all_reduce_per_bucket_in_bucket_order_async_with_overlap(overlap):
    def body(comm):
        model = MLP(SIZES, seed=0, dtype=numpy.float64)
        calls = []
        all_reduce = comm.all_reduce

        def recording(buf, *args, **kwargs):
            calls.append((buf.size, kwargs.get("async_op", False)))
            return all_reduce(buf, *args, **kwargs)

        comm.all_reduce = recording
        with DistributedDataParallel(model, comm, bucket_mb=1e-4, overlap=overlap) as ddp:
            x, y = rank_batch(comm.rank)
            cross_entropy(ddp(Tensor(x)), y).backward()
            return calls, [hi - lo for lo, hi in ddp.layout.buckets]

    for calls, bucket_sizes in collectives.spawn(body, 2):
        assert len(bucket_sizes) > 3 and [size for size, _ in calls] == bucket_sizes
        assert all(async_op is overlap for _, async_op in calls)


def test_no_sync_accumulates_locally_then_averages_everything():
    size, micro = 3, 2
    reference = MLP(SIZES, seed=0, dtype=numpy.float64)
    total = {k: 0.0 for k, _ in reference.named_parameters()}
    for r in range(size):
        for m in range(micro):
            x, y = rank_batch(10 * r + m)
            reference.zero_grad()
            cross_entropy(reference(Tensor(x)), y).backward()
            for k, p in reference.named_parameters():
                total[k] = total[k] + p.grad / size

    def body(comm):
        model = MLP(SIZES, seed=0, dtype=numpy.float64)
        with DistributedDataParallel(model, comm, bucket_mb=1e-4) as ddp:
            with comm.trace() as records:
                with ddp.no_sync():
                    x, y = rank_batch(10 * comm.rank)
                    cross_entropy(ddp(Tensor(x)), y).backward()
                quiet = len(records)
                x, y = rank_batch(10 * comm.rank + 1)
                cross_entropy(ddp(Tensor(x)), y).backward()
            return quiet, {k: p.grad.copy() for k, p in model.named_parameters()}

    for quiet, grads in collectives.spawn(body, size):
        assert quiet == 0
        for k, value in total.items():
            numpy.testing.assert_allclose(grads[k], value, rtol=1e-12, atol=1e-15)


def test_uneven_shards_match_one_process_when_loss_is_scaled_by_the_global_batch():
    """The trainer's rule: loss_r = sum over rank r's samples * size / global batch."""
    batch, steps = 13, 6
    rng = numpy.random.default_rng(1)
    xs, ys = rng.standard_normal((steps, batch, SIZES[0])), rng.integers(0, 3, (steps, batch))

    def train(comm):
        model = MLP(SIZES, seed=0, dtype=numpy.float64)
        optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        lo, hi = collectives.chunk_bounds(batch, comm.size)[comm.rank]
        with DistributedDataParallel(model, comm) as ddp:
            for x, y in zip(xs, ys):
                optimizer.zero_grad()
                loss = cross_entropy(ddp(Tensor(x[lo:hi])), y[lo:hi], "sum") * (comm.size / batch)
                loss.backward()
                optimizer.step()
        return model.state_dict()

    (one,) = collectives.spawn(train, 1)
    for params in collectives.spawn(train, 3):  # shards of 5, 4 and 4 samples
        for k in one:
            numpy.testing.assert_allclose(params[k], one[k], rtol=1e-12, atol=1e-14)


def test_a_parameter_without_gradient_is_reported_at_the_next_forward():
    class TwoHeads(Module):
        def __init__(self):
            rng = numpy.random.default_rng(0)
            self.used, self.unused = Linear(3, 2, rng), Linear(3, 2, rng)

        def forward(self, x):
            return self.used(x)

    def body(comm):
        with DistributedDataParallel(TwoHeads(), comm) as ddp:
            ddp(Tensor(numpy.ones((2, 3), numpy.float32))).sum().backward()
            with pytest.raises(RuntimeError, match="unused.weight"):
                ddp(Tensor(numpy.ones((2, 3), numpy.float32)))
        return True

    assert collectives.spawn(body, 2) == [True, True]


def test_a_broadcast_weight_is_averaged_too():
    """A weight of (1, 3, 2) applied to a batch of (4, 5, 3): DDP computes gradients into the
    flat vector where it can, which for a weight summed over the batch it cannot."""
    class Batched(Module):
        def __init__(self) -> None:
            self.weight = Tensor(numpy.ones((1, 3, 2)), requires_grad=True)

        def forward(self, x: Tensor) -> Tensor:
            return x @ self.weight

    def grad(comm):
        model = Batched()
        with DistributedDataParallel(model, comm) as ddp:
            ddp(Tensor(numpy.full((4, 5, 3), comm.rank + 1.0))).sum().backward()
        return model.weight.grad

    for got in collectives.spawn(grad, 2):
        numpy.testing.assert_array_equal(got, numpy.full((1, 3, 2), 20 * 1.5))


def test_one_rank_is_left_alone_and_bad_bucket_sizes_are_refused():
    def body(comm):
        model = MLP(SIZES, seed=0, dtype=numpy.float64)
        with pytest.raises(ValueError, match="bucket_mb"):
            DistributedDataParallel(model, comm, bucket_mb=0)
        with DistributedDataParallel(model, comm) as ddp, comm.trace() as records:
            x, y = rank_batch(0)
            cross_entropy(ddp(Tensor(x)), y).backward()
        return records, ddp.comm_seconds

    assert collectives.spawn(body, 1) == [([], 0.0)]


@needs_gpu
def test_cupy_parameters_travel_through_host_memory():
    import cupy


    def body(comm, xp):
        model = MLP(SIZES, seed=comm.rank, xp=xp, dtype=numpy.float64)
        with DistributedDataParallel(model, comm, bucket_mb=1e-4) as ddp:
            x, y = rank_batch(comm.rank)
            cross_entropy(ddp(Tensor(xp.asarray(x))), xp.asarray(y)).backward()
            return {k: cupy.asnumpy(p.grad) for k, p in model.named_parameters()}

    on_gpu, on_cpu = collectives.spawn(body, 2, cupy), collectives.spawn(body, 2, numpy)
    for mine, theirs in zip(on_gpu, on_cpu):
        for k in theirs:
            numpy.testing.assert_allclose(mine[k], theirs[k], rtol=1e-10)
