"""Array autograd in the manner of micrograd, on NumPy or CuPy arrays.

A `Tensor` holds `data` (an array), `grad` (an array of the same shape, or None), the tensors
it was computed from (`_parents`) and a `_backward` closure that pushes its gradient into
theirs. `backward()` walks the graph in reverse topological order, so every tensor has its
whole gradient before it is passed on.

Elementwise ops broadcast as NumPy does; their backward sums the gradient over the axes that
broadcasting stretched (`_unbroadcast`). Only tensors with `requires_grad` (parameters, and
whatever is computed from them) take part in backward: data and labels cost nothing.

A hook registered on a tensor with `register_hook(fn)` runs as `fn(tensor)` the moment its
gradient is complete during backward. Data parallelism uses it to start reducing a layer's
gradients while the layers below are still being differentiated.

`grad_out`, when set on a tensor, is an array of its shape, its own, that the gradient
terms of matrix products go straight into (the first written there, the next ones added in
place): data parallelism points it at the tensor's place in the buffer that gradients travel
in, which saves a copy of every weight gradient.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy

from collectives import array_module_of


def _unbroadcast(grad: Any, shape: tuple[int, ...]) -> Any:
    """Sum `grad` down to `shape`, undoing NumPy broadcasting."""
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    stretched = tuple(lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=tuple(range(lead)) + stretched, keepdims=True).reshape(shape)


class Tensor:
    """An array with a gradient. Build graphs with the operators and methods below."""

    def __init__(self, data: Any, requires_grad: bool = False,
                 _parents: tuple[Tensor, ...] = (), _op: str = "") -> None:
        # NumPy reductions return scalars, not arrays: keep everything an array.
        self.data = data if type(data).__module__.startswith("cupy") else numpy.asarray(data)
        self.grad: Any | None = None
        self.requires_grad = requires_grad
        self._parents = _parents
        self._backward: Callable[[], None] = lambda: None
        self._op = _op
        self._hooks: list[Callable[[Tensor], None]] = []
        self.grad_out: Any | None = None

    @property
    def xp(self) -> Any:
        """numpy or cupy: the module that owns `data`."""
        return array_module_of(self.data)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> Any:
        return self.data.dtype

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, op={self._op or 'leaf'!r})"

    def register_hook(self, fn: Callable[[Tensor], None]) -> None:
        """Call `fn(self)` during backward, as soon as `self.grad` is complete."""
        self._hooks.append(fn)

    # ---- building the graph ----------------------------------------------------------------

    def _lift(self, other: Any) -> Tensor:
        """Wrap a scalar or array as a constant of this tensor's dtype and array module."""
        if isinstance(other, Tensor):
            return other
        return Tensor(self.xp.asarray(other, dtype=self.dtype))

    def _child(self, data: Any, parents: tuple[Tensor, ...], op: str) -> Tensor:
        return Tensor(data, any(p.requires_grad for p in parents), parents, op)

    def _accumulate(self, grad: Any) -> None:
        # Never in place: a gradient array may be shared with another tensor (add passes its
        # output's gradient to both inputs), so each sum makes a new array.
        self.grad = grad if self.grad is None else self.grad + grad

    # ---- elementwise, broadcasting --------------------------------------------------------

    def __add__(self, other: Any) -> Tensor:
        other = self._lift(other)
        out = self._child(self.data + other.data, (self, other), "+")

        def _backward() -> None:
            for t in (self, other):
                if t.requires_grad:
                    t._accumulate(_unbroadcast(out.grad, t.shape))
        out._backward = _backward
        return out

    def __mul__(self, other: Any) -> Tensor:
        other = self._lift(other)
        out = self._child(self.data * other.data, (self, other), "*")

        def _backward() -> None:
            if self.requires_grad:
                self._accumulate(_unbroadcast(out.grad * other.data, self.shape))
            if other.requires_grad:
                other._accumulate(_unbroadcast(out.grad * self.data, other.shape))
        out._backward = _backward
        return out

    def __truediv__(self, other: Any) -> Tensor:
        other = self._lift(other)
        out = self._child(self.data / other.data, (self, other), "/")

        def _backward() -> None:
            if self.requires_grad:
                self._accumulate(_unbroadcast(out.grad / other.data, self.shape))
            if other.requires_grad:
                other._accumulate(_unbroadcast(-out.grad * out.data / other.data, other.shape))
        out._backward = _backward
        return out

    def __neg__(self) -> Tensor:
        return self * -1.0

    def __sub__(self, other: Any) -> Tensor:
        return self + (-self._lift(other))

    def __radd__(self, other: Any) -> Tensor:
        return self + other

    def __rsub__(self, other: Any) -> Tensor:
        return self._lift(other) - self

    def __rmul__(self, other: Any) -> Tensor:
        return self * other

    def __rtruediv__(self, other: Any) -> Tensor:
        return self._lift(other) / self

    def _unary(self, data: Any, local_grad: Callable[[], Any], op: str) -> Tensor:
        """An elementwise function whose derivative is `local_grad()` (computed lazily)."""
        out = self._child(data, (self,), op)

        def _backward() -> None:
            self._accumulate(out.grad * local_grad())
        out._backward = _backward
        return out

    def relu(self) -> Tensor:
        return self._unary(self.xp.maximum(self.data, 0), lambda: self.data > 0, "relu")

    def tanh(self) -> Tensor:
        data = self.xp.tanh(self.data)
        return self._unary(data, lambda: 1 - data * data, "tanh")

    def exp(self) -> Tensor:
        data = self.xp.exp(self.data)
        return self._unary(data, lambda: data, "exp")

    def log(self) -> Tensor:
        return self._unary(self.xp.log(self.data), lambda: 1 / self.data, "log")

    # ---- matrix product, reductions, shapes ------------------------------------------------

    def __matmul__(self, other: Any) -> Tensor:
        """Matrix product of operands with at least two axes; leading axes broadcast."""
        other = self._lift(other)
        if self.data.ndim < 2 or other.data.ndim < 2:
            raise ValueError(f"matmul needs operands of 2 or more axes, got shapes "
                             f"{self.shape} and {other.shape}")
        out = self._child(self.data @ other.data, (self, other), "@")

        def _backward() -> None:
            if self.requires_grad:
                self._accumulate_product(out.grad, other.data.swapaxes(-1, -2))
            if other.requires_grad:
                other._accumulate_product(self.data.swapaxes(-1, -2), out.grad)
        out._backward = _backward
        return out

    def _accumulate_product(self, a: Any, b: Any) -> None:
        """Add a @ b (summed down to this tensor's shape) to the gradient; into `grad_out`
        where it needs no summing: the first term lands there, the next ones add up there
        (the buffer is this tensor's own, so in place is safe)."""
        if self.grad_out is None or a.shape[:-1] + b.shape[-1:] != self.shape:
            self._accumulate(_unbroadcast(a @ b, self.shape))
        elif self.grad is None:
            self.grad = self.xp.matmul(a, b, out=self.grad_out)
        elif self.grad is self.grad_out:
            self.grad += a @ b
        else:
            self._accumulate(a @ b)

    def sum(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
        out = self._child(self.data.sum(axis=axis, keepdims=keepdims), (self,), "sum")

        def _backward() -> None:
            grad = out.grad
            if axis is not None and not keepdims:
                grad = self.xp.expand_dims(grad, axis)
            self._accumulate(self.xp.broadcast_to(grad, self.shape))
        out._backward = _backward
        return out

    def mean(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
        axes = range(self.data.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
        return self.sum(axis, keepdims) / math.prod(self.shape[a] for a in axes)

    def reshape(self, *shape: int) -> Tensor:
        out = self._child(self.data.reshape(*shape), (self,), "reshape")

        def _backward() -> None:
            self._accumulate(out.grad.reshape(self.shape))
        out._backward = _backward
        return out

    def log_softmax(self, axis: int = -1) -> Tensor:
        """log(softmax(x)) along `axis`, computed stably (shifted by the maximum)."""
        xp = self.xp
        out = self._child(_log_softmax(xp, self.data, axis), (self,), "log_softmax")

        def _backward() -> None:
            softmax = xp.exp(out.data)
            self._accumulate(out.grad - softmax * out.grad.sum(axis=axis, keepdims=True))
        out._backward = _backward
        return out

    # ---- backward --------------------------------------------------------------------------

    def backward(self, grad: Any | None = None) -> None:
        """Fill `.grad` of every tensor this one depends on that requires a gradient.

        `grad` defaults to ones, so a scalar loss needs none. Gradients add up over calls
        until they are cleared (`Module.zero_grad`).
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad")
        order = _topological_order(self)
        for node in order:  # a second backward through the same graph starts afresh
            if node._parents:
                node.grad = None
        self._accumulate(self.xp.ones_like(self.data) if grad is None else grad)
        for node in reversed(order):
            if node.grad is not None:
                node._backward()
            for hook in node._hooks:
                hook(node)


def _log_softmax(xp: Any, x: Any, axis: int) -> Any:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


def _topological_order(root: Tensor) -> list[Tensor]:
    """Every tensor that requires grad and that `root` depends on, inputs before outputs.

    A depth-first post-order, written without recursion so deep graphs cannot overflow the
    stack. Parents are visited first to last, so a weight is placed just before the product
    that uses it: in reverse, its gradient is complete as soon as that product's backward ran.
    """
    order: list[Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((p, False) for p in reversed(node._parents) if p.requires_grad)
    return order


def cross_entropy(logits: Tensor, targets: Any, reduction: str = "mean") -> Tensor:
    """Cross-entropy of `logits` (batch, classes) against integer class `targets` (batch,).

    reduction "mean" averages over the batch, "sum" adds up. One fused op: its gradient is
    softmax(logits) - onehot(targets), which is exact and cheap.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    xp = logits.xp
    n = logits.shape[0]
    rows = xp.arange(n)
    logp = _log_softmax(xp, logits.data, -1)
    total = -logp[rows, targets].sum()
    scale = 1.0 / n if reduction == "mean" and n else 1.0
    out = logits._child(xp.asarray(total * scale, dtype=logits.dtype), (logits,), "cross_entropy")

    def _backward() -> None:
        grad = xp.exp(logp)
        grad[rows, targets] -= 1
        logits._accumulate(grad * (out.grad * scale))
    out._backward = _backward
    return out
