"""Modules: parameters in named attributes, as in PyTorch, on top of `Tensor`.

A `Module` finds its parameters by walking its attributes in the order they were set:
tensors that require grad, sub-modules, and lists of sub-modules. Names are dotted paths
("layers.0.weight"), the keys of `state_dict()`.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Iterator

import numpy

from .tensor import Tensor


class Module:
    """Base class: subclasses set parameters and sub-modules as attributes, define forward."""

    def forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def __call__(self, x: Tensor) -> Tensor:
        return self.forward(x)

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, parameter) pairs, in the order the attributes were set; a parameter
        used in two places (tied weights) once, under its first name, as in PyTorch: listed
        twice, it would be stepped twice, and its gradient sent twice."""
        seen: set[int] = set()
        for name, param in self._every_parameter():
            if id(param) not in seen:
                seen.add(id(param))
                yield name, param

    def _every_parameter(self) -> Iterator[tuple[str, Tensor]]:
        """Every (dotted name, parameter) pair, a shared parameter under each of its names."""
        for name, value in vars(self).items():
            if isinstance(value, Tensor) and value.requires_grad:
                yield name, value
            elif isinstance(value, Module):
                for sub, param in value._every_parameter():
                    yield f"{name}.{sub}", param
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        for sub, param in item._every_parameter():
                            yield f"{name}.{i}.{sub}", param

    def parameters(self) -> list[Tensor]:
        return [param for _, param in self.named_parameters()]

    def zero_grad(self) -> None:
        """Forget all gradients (set them to None: the next backward starts afresh)."""
        for param in self.parameters():
            param.grad = None

    def state_dict(self) -> dict[str, Any]:
        """Copies of the parameter arrays, by name."""
        return {name: param.data.copy() for name, param in self.named_parameters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy arrays (NumPy or CuPy, same names and shapes) into the parameters, in place."""
        params = dict(self.named_parameters())
        if set(state) != set(params):
            missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise KeyError(f"state_dict does not match the model: missing {missing}, "
                           f"unexpected {unexpected}")
        for name, param in params.items():
            if tuple(state[name].shape) != param.shape:
                raise ValueError(f"{name}: expected shape {param.shape}, got "
                                 f"{tuple(state[name].shape)}")
            param.data[...] = param.xp.asarray(state[name])


class Linear(Module):
    """y = x @ weight + bias, weight of shape (in, out).

    He (Kaiming) uniform initialisation, suited to ReLU networks: weights uniform in
    +-sqrt(6 / in_features) keep the activations' variance from layer to layer; biases zero.
    Weights are drawn with NumPy from `rng`, so CPU and GPU runs start from the same numbers.
    """

    def __init__(self, in_features: int, out_features: int, rng: numpy.random.Generator,
                 xp: ModuleType = numpy, dtype: Any = numpy.float32) -> None:
        bound = math.sqrt(6.0 / in_features)
        weight = rng.uniform(-bound, bound, (in_features, out_features)).astype(dtype)
        self.weight = Tensor(xp.asarray(weight), requires_grad=True)
        self.bias = Tensor(xp.zeros(out_features, dtype=dtype), requires_grad=True)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.relu()


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()


class Sequential(Module):
    """Modules applied one after the other; parameters named "layers.<index>.<name>"."""

    def __init__(self, *layers: Module) -> None:
        self.layers = list(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MLP(Sequential):
    """Linear layers of the given widths with ReLU between them (none after the last)."""

    def __init__(self, sizes: list[int], seed: int = 0, xp: ModuleType = numpy,
                 dtype: Any = numpy.float32) -> None:
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs at least input and output widths, got {sizes}")
        rng = numpy.random.default_rng(seed)
        layers: list[Module] = []
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            layers.append(Linear(n_in, n_out, rng, xp, dtype))
            if i < len(sizes) - 2:
                layers.append(ReLU())
        super().__init__(*layers)
        self.sizes = list(sizes)
