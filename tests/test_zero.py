"""ZeRO stages 1 and 2 on thread ranks (`collectives.spawn`), in float64: the same training as
DDP, optimizer state cut N ways, LAMB's norms over shards, gradients in float16, and the state
gathered from N ranks resuming on M.

Every run trains on the same global batches, each rank on its slice with its loss scaled by
size / global batch (the trainer's rule), so any number of ranks takes the same steps.
"""

from __future__ import annotations

import functools

import numpy
import pytest

import collectives
from trainer.ddp import DistributedDataParallel
from trainer.nn import MLP
from trainer.optim import LAMB, SGD, Adam
from trainer.tensor import Tensor, cross_entropy
from trainer.zero import ShardedOptimizer, ZeroDataParallel

SIZES = [6, 5, 4, 3]  # 74 parameters: buckets of 1e-4 MB cut through them
BATCH, STEPS = 12, 6
rng = numpy.random.default_rng(7)
XS, YS = rng.standard_normal((STEPS, BATCH, SIZES[0])), rng.integers(0, 3, (STEPS, BATCH))
KINDS = {"sgd": lambda params: SGD(params, 0.1, momentum=0.9, weight_decay=0.01),
         "adam": lambda params: Adam(params, 0.05, weight_decay=0.1),
         "lamb": lambda params: LAMB(params, 0.05, weight_decay=0.1)}


def train(comm, kind: str, zero: int, steps: range = range(STEPS), resume: dict | None = None,
          bucket_mb: float = 1e-4, overlap: bool = True, grad_dtype: str = "float32") -> dict:
    """Train `steps` of the global batches; return parameters, optimizer state and memory."""
    model = MLP(SIZES, seed=0, dtype=numpy.float64)
    options = dict(bucket_mb=bucket_mb, overlap=overlap, grad_dtype=grad_dtype)
    if zero:
        wrapper = ZeroDataParallel(model, comm, zero, **options)
        optimizer = ShardedOptimizer(wrapper, KINDS[kind](wrapper.shards))
    else:
        wrapper = DistributedDataParallel(model, comm, **options)
        optimizer = KINDS[kind](model.parameters())
    if resume is not None:
        model.load_state_dict(resume["params"])
        optimizer.load_state_dict(resume["optimizer"])
    lo, hi = collectives.chunk_bounds(BATCH, comm.size)[comm.rank]
    comm.stats.reset()
    with wrapper:
        for t in steps:
            optimizer.zero_grad()
            loss = cross_entropy(wrapper(Tensor(XS[t, lo:hi])), YS[t, lo:hi], "sum")
            (loss * (comm.size / BATCH)).backward()
            optimizer.step()
    return {"params": model.state_dict(), "optimizer": optimizer.state_dict(),
            "memory": wrapper.memory_bytes(), "state_bytes": optimizer.state_bytes(),
            "sent": comm.stats.bytes_sent, "grads": [p.grad for p in model.parameters()]}


def assert_same_params(got: dict, want: dict, rtol: float = 1e-10) -> None:
    for name, value in want.items():
        numpy.testing.assert_allclose(got[name], value, rtol=rtol, atol=rtol, err_msg=name)


@pytest.mark.parametrize("kind", ["sgd", "adam", "lamb"])
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("size,overlap", [(2, True), (3, False), (4, True)])
def test_zero_trains_as_ddp_with_a_shard_of_the_state(kind, stage, size, overlap):
    ddp = collectives.spawn(train, size, kind, 0)
    zero = collectives.spawn(functools.partial(train, overlap=overlap), size, kind, stage)
    for rank, run in enumerate(zero):
        assert_same_params(run["params"], ddp[rank]["params"])
        numpy.testing.assert_array_equal(run["params"]["layers.0.weight"],
                                         zero[0]["params"]["layers.0.weight"])
        assert all(grad is None for grad in run["grads"])  # only the shard is kept
        padded = -(-74 // size) * size  # the flat vector, padded to a multiple of the ranks
        assert run["state_bytes"] * size == ddp[rank]["state_bytes"] * padded // 74
        for name, value in ddp[rank]["optimizer"].items():  # gathered: the whole state
            numpy.testing.assert_allclose(run["optimizer"][name], value, rtol=1e-9, atol=1e-12)
    assert ddp[0]["state_bytes"] == (74 * 8 * (1 if kind == "sgd" else 2))


def test_stage_2_keeps_two_buckets_and_the_shard_of_the_gradients():
    bucket = 2 * 4 * 8  # 1e-4 MB is 13 float64s, 12 of them a multiple of 4 ranks
    one, two = (collectives.spawn(train, 4, "adam", stage)[1]["memory"] for stage in (1, 2))
    assert one == {"parameters": 76 * 8, "gradients": 76 * 8 + 19 * 8}  # padded to 76
    assert two == {"parameters": 76 * 8, "gradients": 2 * 12 * 8 + 19 * 8}
    assert bucket < 76 * 8
    # with one bucket, stage 2's staging buffer is the whole vector
    whole = collectives.spawn(functools.partial(train, bucket_mb=1.0), 4, "adam", 2)[0]["memory"]
    assert whole["gradients"] == 76 * 8 + 19 * 8


def flat_gradients(comm, zero: int, backwards: int, steps: int = 0) -> numpy.ndarray:
    """The averaged gradients after `backwards` backwards on batches 0, 1, ... with no
    zero_grad between them, then `steps` times zero_grad and step (with no backward); every
    rank's whole flat vector (ZeRO's shards gathered)."""
    model = MLP(SIZES, seed=0, dtype=numpy.float64)
    lo, hi = collectives.chunk_bounds(BATCH, comm.size)[comm.rank]
    if zero:
        wrapper = ZeroDataParallel(model, comm, zero, bucket_mb=1e-4)
        optimizer = ShardedOptimizer(wrapper, SGD(wrapper.shards, 0.1))
    else:
        wrapper = DistributedDataParallel(model, comm, bucket_mb=1e-4)
        optimizer = SGD(model.parameters(), 0.1)
    with wrapper:
        for t in range(backwards):
            loss = cross_entropy(wrapper(Tensor(XS[t, lo:hi])), YS[t, lo:hi], "sum")
            (loss * (comm.size / BATCH)).backward()
        grads = wrapper.gather_flat([s.grad for s in wrapper.shards])[:wrapper.layout.real] \
            if zero else numpy.concatenate([g.reshape(-1) for g in wrapper._views()])
        before = model.state_dict()
        for _ in range(steps):
            optimizer.zero_grad()
            optimizer.step()
        assert_same_params(model.state_dict(), before, rtol=0)  # no gradient: no move
    return grads


def test_zero_gradients_add_up_over_backwards_until_zero_grad():
    """As DDP's (and PyTorch's): two backwards without zero_grad leave the sum of both
    averages in the shards, not the second alone; a step after zero_grad moves nothing."""
    want = collectives.spawn(flat_gradients, 2, 0, 2)[0]
    once = collectives.spawn(flat_gradients, 2, 0, 1)[0]
    assert numpy.abs(want - once).max() > 1e-3
    for stage in (1, 2):
        for got in collectives.spawn(flat_gradients, 2, stage, 2, 1):
            numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_a_state_of_other_shapes_is_refused():
    def load(comm):
        model = MLP([6, 5, 4, 3], seed=0, dtype=numpy.float64)
        zero = ZeroDataParallel(model, comm, 1)
        optimizer = ShardedOptimizer(zero, Adam(zero.shards, 0.1))
        other = MLP([6, 4, 4, 3], seed=0, dtype=numpy.float64).parameters()
        with pytest.raises(ValueError, match=r"has shape \(6, 4\), but its parameter has "
                                             r"shape \(6, 5\)"):
            optimizer.load_state_dict(Adam(other, 0.1).state_dict())
    collectives.spawn(load, 2)


def test_a_state_gathered_on_four_ranks_resumes_on_three_and_on_ddp():
    whole = collectives.spawn(train, 1, "lamb", 0)[0]
    first = collectives.spawn(train, 4, "lamb", 1, range(3))[0]
    resume = {"params": first["params"], "optimizer": first["optimizer"]}
    for size, stage in ((3, 2), (3, 1), (2, 0)):
        for run in collectives.spawn(train, size, "lamb", stage, range(3, STEPS), resume):
            assert_same_params(run["params"], whole["params"], rtol=1e-9)


def test_float16_gradients_average_within_half_precision_and_send_half_the_bytes():
    def backward(comm, grad_dtype, zero, loss_scale):
        model = MLP([SIZES[0], 64, 3], seed=0, dtype=numpy.float32)  # 643 parameters
        kind = ZeroDataParallel if zero else DistributedDataParallel
        extra = {"stage": 1} if zero else {}
        with kind(model, comm, overlap=False, grad_dtype=grad_dtype, **extra) as wrapper:
            x = numpy.random.default_rng(comm.rank).standard_normal((8, SIZES[0]))
            comm.stats.reset()
            loss = cross_entropy(wrapper(Tensor(x.astype(numpy.float32))), numpy.arange(8) % 3)
            (loss * loss_scale).backward()
            grads = wrapper.grad_shard if zero else numpy.concatenate(
                [p.grad.reshape(-1) for p in model.parameters()])
            return grads.copy(), comm.stats.bytes_sent

    for zero in (False, True):
        for loss_scale in (1.0, 1e8, 1e-12):  # far above and below float16's range
            exact = collectives.spawn(backward, 4, "float32", zero, loss_scale, one_shot_bytes=0)
            half = collectives.spawn(backward, 4, "float16", zero, loss_scale, one_shot_bytes=0)
            for (want, sent32), (got, sent16) in zip(exact, half):
                assert got.dtype == numpy.float32
                numpy.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * abs(want).max())
                assert sent16 <= 0.52 * sent32


def test_nan_gradients_stay_nan_in_float16():
    def body(comm):
        model = MLP(SIZES, seed=0, dtype=numpy.float32)
        with DistributedDataParallel(model, comm, grad_dtype="float16") as ddp:
            x = numpy.ones((2, SIZES[0]), numpy.float32) * (numpy.nan if comm.rank else 1.0)
            cross_entropy(ddp(Tensor(x)), numpy.zeros(2, numpy.int64)).backward()
            return numpy.isnan(model.parameters()[-1].grad).all()

    assert collectives.spawn(body, 2) == [True, True]


def test_bad_stages_and_optimizers_are_refused():
    def body(comm):
        model = MLP(SIZES, seed=0, dtype=numpy.float64)
        with pytest.raises(ValueError, match="stage"):
            ZeroDataParallel(model, comm, stage=3)
        with ZeroDataParallel(model, comm) as zero:
            with pytest.raises(ValueError, match="zero.shards"):
                ShardedOptimizer(zero, Adam(model.parameters(), 0.1))
        with pytest.raises(ValueError, match="grad_dtype"):
            DistributedDataParallel(model, comm, grad_dtype="bfloat16")
        return True

    assert collectives.spawn(body, 2) == [True, True]
