"""ZeRO (Rajbhandari et al. 2020), stages 1 and 2: data parallelism whose optimizer state is
cut into one shard per rank.

Like `DistributedDataParallel`, every rank holds every parameter and computes gradients on its
share of the batch. The flat vector of parameters and gradients (ddp.Layout) is padded with
zeros to a multiple of N ranks, and each bucket is a multiple of N long, so that it cuts into
N equal blocks; rank r owns block r of every bucket, as each FSDP unit is sharded.

- Backward reduce-scatters each bucket (averaging): rank r receives only the average of its
  blocks, its gradient shard (`grad_shard`). As gradients do, shards add up over backwards
  until `zero_grad` clears them (`shards[k].grad` None; the next backward writes in place).
- The optimizer (`ShardedOptimizer`) updates only the rank's blocks of the parameters, with
  state for those alone: 1/N of DDP's optimizer state.
- Each bucket of parameters is then all-gathered, so every rank again holds them all.

A reduce-scatter and an all-gather move what one all-reduce moves, so ZeRO costs DDP's bytes.

Stage 1 keeps the full flat gradient vector (the reduce-scatter's input) between steps; stage 2
keeps only the shard, staging each bucket's gradients in one of two bucket-sized buffers that
take turns (one filling while the other is on the wire), so its gradient memory is the shard
plus two buckets: it saves memory where buckets are small beside the model (`bucket_mb`).

After backward, `.grad` of the parameters is None: the averaged gradient exists only as shards.
The parameters themselves become views of one flat vector in registered memory, which the
all-gather fills in place.
"""

from __future__ import annotations

import time
from typing import Any

import numpy

from collectives import Communicator, Work, module_for_device, to_numpy

from .compress import from_float16, to_float16
from .ddp import DistributedDataParallel
from .nn import Module
from .optim import Optimizer, state_array
from .tensor import Tensor


class ZeroDataParallel(DistributedDataParallel):
    """Wrap `module` so that backward leaves this rank's shard of the averaged gradients in
    `grad_shard`, and `shards[k].grad`. Step with a `ShardedOptimizer` built on `shards`."""

    sharded = True

    def __init__(self, module: Module, comm: Communicator, stage: int = 1,
                 bucket_mb: float = 25.0, overlap: bool = True,
                 grad_dtype: str = "float32") -> None:
        if stage not in (1, 2):
            raise ValueError(f"ZeRO stage must be 1 or 2, got {stage}")
        self.stage = stage
        super().__init__(module, comm, bucket_mb, overlap, grad_dtype)

    def _allocate(self, xp: Any, staged: bool) -> None:
        layout, comm = self.layout, self.comm
        size, rank = comm.size, comm.rank
        dtype = layout.params[0].dtype
        self.flat_params = comm.zeros(layout.size, dtype)
        for param, offset in zip(layout.params, layout.offsets):
            view = self.flat_params[offset: offset + param.data.size].reshape(param.shape)
            view[...] = param.data
            param.data = view
        self._slots: list[Any] = []  # stage 2's buffers for buckets, in turn
        if self.stage == 1:
            self.grads = comm.zeros(layout.size, dtype)
        else:
            # zeros: the padding at the end of the last bucket must stay zero
            self._slots = [comm.zeros(layout.buckets[0][1], dtype)
                           for _ in layout.buckets[:2]]
        self._holder: list[int | None] = [None] * len(self._slots)  # the bucket in each
        self.grad_shard = xp.zeros(layout.size // size, dtype)
        self._added: Any = None  # where a backward's block lands to be added to a shard's
        self.shards: list[Tensor] = []
        self._shard_grads: list[Any] = []  # each shard's part of grad_shard
        self.blocks: list[tuple[int, int]] = []  # [lo, hi) of this rank's block of each bucket
        at = 0
        for lo, hi in layout.buckets:
            block = (hi - lo) // size
            self.blocks.append((lo + rank * block, lo + (rank + 1) * block))
            self.shards.append(Tensor(self.flat_params[slice(*self.blocks[-1])],
                                      requires_grad=True))  # (grad None until a backward)
            self._shard_grads.append(self.grad_shard[at: at + block])
            at += block
        self._half_shard = xp.empty(layout.buckets[0][1] // size, numpy.float16) \
            if self.half else None

    def _bucket(self, k: int) -> Any:
        if self.stage == 1:
            return super()._bucket(k)
        slot = k % len(self._slots)
        if self._holder[slot] != k:  # the slot's last bucket must be on its way and done
            if self._launched <= k - len(self._slots):
                raise RuntimeError("ZeRO stage 2 needs gradients in backward order: a bucket "
                                   "was still filling when a later one needed its buffer")
            self._wait(k - len(self._slots) + 1)
            self._holder[slot] = k
            lo, hi = self.layout.buckets[k]
            self._slots[slot][min(hi, self.layout.real) - lo:] = 0  # padding, or unused
        lo, hi = self.layout.buckets[k]
        return self._slots[slot][:hi - lo]

    def _reduce(self, k: int, async_op: bool = False) -> Work | None:
        """Reduce-scatter bucket `k`: this rank's block of the average lands in its shard, or
        is added to it where the shard's gradient was not cleared since the last backward."""
        shard = self.shards[k]
        adds = shard.grad is not None
        shard.grad = self._shard_grads[k]
        if async_op and (self.half or adds):  # several steps: queued as one
            return self.comm.submit(self._reduce_into, k, adds)
        return self._reduce_into(k, adds, async_op)

    def _reduce_into(self, k: int, adds: bool, async_op: bool = False) -> Work | None:
        comm, grads, shard = self.comm, self._bucket(k), self._shard_grads[k]
        if adds and self._added is None:  # (made at the first backward that adds)
            self._added = module_for_device(comm.device).empty(
                self.layout.buckets[0][1] // comm.size, shard.dtype)
        into = self._added[:shard.size] if adds else shard
        if not self.half:
            work = comm.reduce_scatter(grads.reshape(comm.size, -1), into, op="avg",
                                       async_op=async_op)
            if async_op:
                return work
        else:
            half, half_shard = self._half[:grads.size], self._half_shard[:shard.size]
            scale = to_float16(comm, grads, half)
            comm.reduce_scatter(half.reshape(comm.size, -1), half_shard, op="sum")
            from_float16(half_shard, scale * comm.size, into)
        if adds:
            shard += into
        return None

    def _hand_out(self) -> None:
        """Nothing to hand out: the shard is in place. The buffers are free for next time."""
        self._holder = [None] * len(self._slots)

    def gather_parameters(self) -> None:
        """All-gather every bucket of parameters from the shards the ranks updated."""
        start = time.perf_counter()
        for (lo, hi), shard in zip(self.layout.buckets, self.shards):
            self.comm.all_gather(shard.data, self.flat_params[lo:hi].reshape(self.comm.size, -1))
        self.comm_seconds += time.perf_counter() - start

    def memory_bytes(self) -> dict[str, int]:
        kept = [self.grad_shard, self.grads, *self._slots, self._half, self._half_shard,
                self._added]
        return {"parameters": self.flat_params.nbytes,
                "gradients": sum(b.nbytes for b in kept if b is not None)}

    def shard_layers(self) -> list[list[tuple[int, int, int]]]:
        """For LAMB: the (lo, hi, layer) pieces of each shard, the layer being the parameter's
        index in `module.parameters()`."""
        count = len(self.layout.params)
        layers = []
        for block_lo, block_hi in self.blocks:
            pieces = []
            for i, (param, offset) in enumerate(zip(self.layout.params, self.layout.offsets)):
                lo, hi = max(block_lo, offset), min(block_hi, offset + param.data.size)
                if lo < hi:
                    pieces.append((lo - block_lo, hi - block_lo, count - 1 - i))
            layers.append(pieces)
        return layers

    def gather_flat(self, shards: list[Any]) -> numpy.ndarray:
        """Every rank's `shards` (one array per bucket, like `self.shards`) put together into
        the flat vector, on every rank, as NumPy."""
        flat = numpy.zeros(self.layout.size, numpy.dtype(str(shards[0].dtype)))
        for (lo, hi), shard in zip(self.layout.buckets, shards):
            flat[lo:hi] = to_numpy(self.comm.all_gather(shard)).reshape(-1)
        return flat

    def unflatten(self, flat: Any) -> list[Any]:
        """The parameters' parts of a flat vector, in `module.parameters()` order, shaped."""
        parts = [flat[offset: offset + param.data.size].reshape(param.shape)
                 for param, offset in zip(self.layout.params, self.layout.offsets)]
        return parts[::-1]

    def flatten(self, arrays: list[Any]) -> numpy.ndarray:
        """The inverse of `unflatten`, padded with zeros."""
        flat = numpy.zeros(self.layout.size, numpy.dtype(str(self.layout.params[0].dtype)))
        for array, offset in zip(arrays[::-1], self.layout.offsets):
            flat[offset: offset + array.size] = to_numpy(array).reshape(-1)
        return flat


class ShardedOptimizer:
    """`optimizer`, built on `zero.shards`, steps this rank's shard of the parameters; then the
    ranks all-gather them. Its state dict is the whole state, by parameter, as an unsharded
    optimizer's: a checkpoint written by N ranks loads on M ranks, with or without ZeRO."""

    def __init__(self, zero: ZeroDataParallel, optimizer: Optimizer) -> None:
        if [id(p) for p in optimizer.params] != [id(s) for s in zero.shards]:
            raise ValueError("build the optimizer on zero.shards")
        self.zero, self.optimizer = zero, optimizer
        optimizer.layers = zero.shard_layers()
        optimizer.layer_count = len(zero.layout.params)
        xp = module_for_device(zero.comm.device)
        optimizer.sum_over_ranks = lambda sums: to_numpy(zero.comm.all_reduce(xp.asarray(sums)))

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer.lr = value

    def step(self) -> None:
        self.optimizer.step()
        self.zero.gather_parameters()

    def zero_grad(self) -> None:
        """Forget the gradients: the model's local ones, and the shards' (a step with none
        skips them, and the next backward writes them afresh)."""
        self.optimizer.zero_grad()
        self.zero.module.zero_grad()

    def state_bytes(self) -> int:
        return self.optimizer.state_bytes()

    def state_dict(self) -> dict[str, Any]:
        """The whole state, gathered from every rank. Collective."""
        state: dict[str, Any] = {"step": numpy.array(self.optimizer.steps)}
        for name in self.optimizer.state_names:
            flat = self.zero.gather_flat([arrays[name] for arrays in self.optimizer.state])
            state.update({f"{name}.{i}": part.copy()
                          for i, part in enumerate(self.zero.unflatten(flat))})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take this rank's shard of a whole state (as `state_dict` returns)."""
        count = len(self.zero.layout.params)
        flats = {}
        shapes = [param.shape for param in self.zero.layout.params][::-1]
        for name in self.optimizer.state_names:
            keys = [f"{name}.{i}" for i in range(count)]
            missing = [key for key in keys if key not in state]
            if missing:
                raise KeyError(f"optimizer state does not match: missing {missing}")
            flats[name] = self.zero.flatten([state_array(state, key, shape)
                                             for key, shape in zip(keys, shapes)])
        unexpected = set(state) - {"step"} - {f"{name}.{i}" for name in flats
                                              for i in range(count)}
        if unexpected:
            raise KeyError(f"optimizer state does not match: unexpected {sorted(unexpected)}")
        self.optimizer.steps = int(state["step"])
        xp = self.zero.layout.params[0].xp
        for arrays, (lo, hi) in zip(self.optimizer.state, self.zero.blocks):
            for name, array in arrays.items():
                array[...] = xp.asarray(flats[name][lo:hi])
