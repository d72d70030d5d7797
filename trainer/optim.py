"""Stochastic gradient descent with momentum and weight decay (PyTorch's `torch.optim.SGD`).

For each parameter p with gradient g, with weight decay wd, momentum m and learning rate lr:

    g = g + wd * p
    v = g                  on the first step
    v = m * v + g          afterwards
    p = p - lr * v
"""

from __future__ import annotations

from typing import Any

from .tensor import Tensor


class SGD:
    """Updates `params` in place from their `.grad`; parameters without one are skipped."""

    def __init__(self, params: list[Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0, momentum >= 0, weight_decay >= 0; got lr={lr}, "
                             f"momentum={momentum}, weight_decay={weight_decay}")
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.velocity: list[Any | None] = [None] * len(self.params)

    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            grad = p.grad + self.weight_decay * p.data if self.weight_decay else p.grad
            if self.momentum:
                if self.velocity[i] is None:
                    self.velocity[i] = p.xp.array(grad, copy=True)
                else:
                    self.velocity[i] *= self.momentum
                    self.velocity[i] += grad
                grad = self.velocity[i]
            p.data -= self.lr * grad

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """The momentum buffers, by parameter index ("velocity.<i>"), as copies."""
        return {f"velocity.{i}": v.copy() for i, v in enumerate(self.velocity) if v is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unexpected = set(state) - {f"velocity.{i}" for i in range(len(self.params))}
        if unexpected:
            raise KeyError(f"unexpected optimizer state {sorted(unexpected)}")
        for i, p in enumerate(self.params):
            value = state.get(f"velocity.{i}")
            self.velocity[i] = None if value is None else p.xp.array(value, dtype=p.dtype)
