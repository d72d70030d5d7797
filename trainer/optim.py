"""Optimizers: SGD with momentum, Adam (decoupled weight decay, PyTorch's `AdamW`) and LAMB, and
the learning-rate schedule.

For each parameter p with gradient g, learning rate lr and weight decay wd, at step t (from 1):

    SGD     g = g + wd * p;  v = m * v + g (v starts at zero);  p = p - lr * v
    Adam    m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
            p = p * (1 - lr * wd) - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)
    LAMB    u = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * p, with m and v as Adam's
            p = p - lr * (|p| / |u|) * u, the norms taken over each layer (each parameter
            tensor); the trust ratio |p| / |u| is 1 where either norm is 0 (You et al. 2019)

An optimizer updates its `params` in place from their `.grad`, skipping parameters without one.
Its state is one array per parameter and name ("exp_avg.<i>" in `state_dict`), plus the step.

The update is elementwise except for LAMB's norms, so an optimizer can run on shards of
parameters (ZeRO, zero.py): `layers` then says which of the model's `layer_count` layers each
part of a shard belongs to, and `sum_over_ranks` adds the per-layer sums of squares of every
rank's shards.

Each step of SGD or Adam is a handful of NumPy operations over every element, each a pass over
memory. On the host they run block by block (`BLOCK` elements, a few hundred kilobytes): a
block goes through every operation while it is in the processor's cache, and memory is read
and written about once per array instead of once per operation.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy

from .tensor import Tensor

OPTIMIZERS = ("sgd", "adam", "lamb")
DEFAULT_LR = {"sgd": 0.05, "adam": 0.001, "lamb": 0.005}
BLOCK = 1 << 15  # elements: 128 kB of float32 per array, a few arrays at a time in L2

# (index, data, grad, state) of a parameter with a gradient, its arrays flat
Live = list[tuple[int, Any, Any, dict[str, Any]]]


def blocks(array: Any) -> list[slice]:
    """The blocks a flat array is updated in: one for CuPy, where each operation is a kernel
    that sweeps the whole array anyway."""
    step = BLOCK if isinstance(array, numpy.ndarray) else max(array.size, 1)
    return [slice(lo, lo + step) for lo in range(0, array.size, step)]


class Optimizer:
    """The common part: parameters, learning rate, weight decay, state, step count."""

    state_names: tuple[str, ...] = ()

    def __init__(self, params: list[Tensor], lr: float, weight_decay: float = 0.0) -> None:
        if lr <= 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0 and weight_decay >= 0; got lr={lr}, "
                             f"weight_decay={weight_decay}")
        self.params = list(params)
        for p in self.params:  # stepped through flat views: a strided one would be a copy
            if not p.data.flags.c_contiguous:
                p.data = p.xp.ascontiguousarray(p.data)
        self.lr, self.weight_decay = lr, weight_decay
        self.steps = 0
        self.state = [{name: p.xp.zeros_like(p.data) for name in self.state_names}
                      for p in self.params]
        # (lo, hi, layer) pieces of each parameter's flattened data: one layer per parameter
        self.layers = [[(0, p.data.size, i)] for i, p in enumerate(self.params)]
        self.layer_count = len(self.params)
        self.sum_over_ranks: Callable[[Any], Any] = lambda sums: sums

    def step(self) -> None:
        self.steps += 1
        self.update([(i, p.data.reshape(-1), p.grad.reshape(-1),
                      {name: array.reshape(-1) for name, array in state.items()})
                     for i, (p, state) in enumerate(zip(self.params, self.state))
                     if p.grad is not None])

    def update(self, live: Live) -> None:
        """One step of every parameter in `live`: by default `update_block` on each block."""
        for _, data, grad, state in live:
            for s in blocks(data):
                self.update_block(data[s], grad[s], {k: v[s] for k, v in state.items()})

    def update_block(self, data: Any, grad: Any, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        return sum(array.nbytes for state in self.state for array in state.values())

    def state_dict(self) -> dict[str, Any]:
        """The state arrays by "<name>.<parameter index>", as copies, and "step"."""
        arrays = {f"{name}.{i}": array.copy() for i, state in enumerate(self.state)
                  for name, array in state.items()}
        return {"step": numpy.array(self.steps), **arrays}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {"step"} | {f"{name}.{i}" for i in range(len(self.params))
                               for name in self.state_names}
        if set(state) != expected:
            raise KeyError(f"optimizer state does not match: missing "
                           f"{sorted(expected - set(state))}, unexpected "
                           f"{sorted(set(state) - expected)}")
        self.steps = int(state["step"])
        for i, (p, arrays) in enumerate(zip(self.params, self.state)):
            for name, array in arrays.items():
                array[...] = p.xp.asarray(state_array(state, f"{name}.{i}", array.shape))


def state_array(state: dict[str, Any], key: str, shape: tuple[int, ...]) -> Any:
    """`state[key]`, refused unless it has its parameter's `shape` (a state of another model,
    or of a transposed weight, would load misplaced)."""
    array = state[key]
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"optimizer state {key} has shape {tuple(array.shape)}, but its "
                         f"parameter has shape {tuple(shape)}")
    return array


class SGD(Optimizer):
    """Stochastic gradient descent with momentum and L2 weight decay (`torch.optim.SGD`)."""

    def __init__(self, params: list[Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        if momentum < 0:
            raise ValueError(f"need momentum >= 0, got {momentum}")
        self.momentum = momentum
        self.state_names = ("velocity",) if momentum else ()
        super().__init__(params, lr, weight_decay)

    def update_block(self, data: Any, grad: Any, state: dict[str, Any]) -> None:
        if self.weight_decay:
            grad = grad + self.weight_decay * data
        if self.momentum:
            velocity = state["velocity"]
            velocity *= self.momentum
            velocity += grad
            grad = velocity
        data -= self.lr * grad


class Adam(Optimizer):
    """Adam with bias correction and decoupled weight decay (`torch.optim.AdamW`)."""

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params: list[Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or eps <= 0:
            raise ValueError(f"need betas in [0, 1) and eps > 0; got betas={betas}, eps={eps}")
        self.betas, self.eps = tuple(betas), eps
        super().__init__(params, lr, weight_decay)

    def direction(self, grad: Any, state: dict[str, Any]) -> Any:
        """Move the moments by `grad`; return m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps),
        a new array."""
        (b1, b2), t = self.betas, self.steps
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * (grad * grad)
        out = v ** 0.5
        out /= (1 - b2 ** t) ** 0.5
        out += self.eps
        out *= 1 - b1 ** t
        return m / out

    def update_block(self, data: Any, grad: Any, state: dict[str, Any]) -> None:
        if self.weight_decay:
            data *= 1 - self.lr * self.weight_decay
        step = self.direction(grad, state)
        step *= self.lr
        data -= step


class LAMB(Adam):
    """Adam's direction plus weight decay, scaled per layer by the trust ratio |p| / |u|."""

    def update(self, live: Live) -> None:
        updates = []  # u of each parameter, whole: the norms come before any of it is applied
        for _, data, grad, state in live:
            u = data * self.weight_decay
            for s in blocks(data):
                u[s] += self.direction(grad[s], {k: v[s] for k, v in state.items()})
            updates.append(u)
        # |p|^2 and |u|^2 of each layer: the parts of it here, then those of every rank
        sums = numpy.zeros((2, self.layer_count))
        for (i, data, _, _), u in zip(live, updates):
            for lo, hi, layer in self.layers[i]:
                sums[0, layer] += float(data[lo:hi] @ data[lo:hi])
                sums[1, layer] += float(u[lo:hi] @ u[lo:hi])
        weight, update = numpy.sqrt(self.sum_over_ranks(sums))
        trust = numpy.ones_like(weight)
        both = (weight > 0) & (update > 0)
        trust[both] = weight[both] / update[both]
        for (i, data, _, _), u in zip(live, updates):
            for lo, hi, layer in self.layers[i]:
                u[lo:hi] *= self.lr * float(trust[layer])
            data -= u  # elements in no layer (ZeRO's padding) are zeros, and so is their u


def learning_rate(step: int, lr: float, warmup_steps: int = 0) -> float:
    """`lr` after `warmup_steps` steps; before, lr * (step + 1) / warmup_steps: the gradual
    warmup of Goyal et al. 2017, from near zero (`step` counts from 0)."""
    return lr if step >= warmup_steps else lr * (step + 1) / warmup_steps
