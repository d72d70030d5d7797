"""The autograd: every op's gradient against central finite differences, in float64.

Shapes come from hypothesis (broadcasting pairs included), values from a seeded generator.
Each check differentiates sum(op(...) * w) for a random w, so every output element counts
with its own weight and a gradient sent to the wrong element cannot cancel out.
"""

from __future__ import annotations

from typing import Callable

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

from trainer.tensor import Tensor, cross_entropy
from gpu import needs_gpu

EPS = 1e-6
checked = settings(max_examples=40, deadline=None)  # each example differentiates numerically


def numerical_gradient(f: Callable[[list[numpy.ndarray]], float], arrays: list[numpy.ndarray],
                       which: int) -> numpy.ndarray:
    """d f / d arrays[which] by central differences."""
    grad = numpy.zeros_like(arrays[which])
    flat = arrays[which].reshape(-1)
    for i in range(flat.size):
        saved = flat[i]
        flat[i] = saved + EPS
        up = f(arrays)
        flat[i] = saved - EPS
        down = f(arrays)
        flat[i] = saved
        grad.reshape(-1)[i] = (up - down) / (2 * EPS)
    return grad


def check_gradients(op: Callable[..., Tensor], *arrays: numpy.ndarray, seed: int = 0) -> None:
    """Backward of sum(op(*tensors) * w) must match finite differences for every input."""
    arrays_ = [numpy.array(a, dtype=numpy.float64) for a in arrays]
    out_shape = op(*(Tensor(a) for a in arrays_)).shape
    weights = numpy.random.default_rng(seed + 1).standard_normal(out_shape)

    def scalar(values: list[numpy.ndarray]) -> float:
        return float((op(*(Tensor(v) for v in values)).data * weights).sum())

    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays_]
    (op(*tensors) * weights).sum().backward()
    for k, tensor in enumerate(tensors):
        expected = numerical_gradient(scalar, arrays_, k)
        assert tensor.grad.shape == arrays_[k].shape
        numpy.testing.assert_allclose(tensor.grad, expected, rtol=1e-5, atol=1e-6)


def data(seed: int, *shapes: tuple[int, ...]) -> list[numpy.ndarray]:
    rng = numpy.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in shapes]


seeds = st.integers(0, 2**16)
pairs = mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)


@checked
@given(pairs, seeds, st.sampled_from(["+", "-", "*", "/"]))
def test_binary_ops_broadcast(shapes, seed, op):
    a, b = data(seed, *shapes.input_shapes)
    if op == "/":
        b = numpy.sign(b) * (numpy.abs(b) + 0.5)  # away from zero
    fn = {"+": lambda x, y: x + y, "-": lambda x, y: x - y,
          "*": lambda x, y: x * y, "/": lambda x, y: x / y}[op]
    check_gradients(fn, a, b, seed=seed)


@checked
@given(seeds, st.sampled_from(["radd", "rsub", "rmul", "rdiv", "neg"]))
def test_scalar_operands(seed, op):
    (a,) = data(seed, (2, 3))
    a = numpy.abs(a) + 0.5
    fn = {"radd": lambda x: 2.0 + x, "rsub": lambda x: 2.0 - x, "rmul": lambda x: 3.0 * x,
          "rdiv": lambda x: 1.5 / x, "neg": lambda x: -x}[op]
    check_gradients(fn, a, seed=seed)


@checked
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.sampled_from([
    ((), ()), ((2,), (2,)), ((2,), (1,)), ((1,), (3,)), ((2, 1), (3,))]), seeds)
def test_matmul_with_batch_axes(n, k, m, batch, seed):
    a, b = data(seed, (*batch[0], n, k), (*batch[1], k, m))
    check_gradients(lambda x, y: x @ y, a, b, seed=seed)


@checked
@given(array_shapes(min_dims=1, max_dims=3, max_side=3), seeds, st.booleans(), st.data())
def test_sum_and_mean_over_axes(shape, seed, keepdims, draw):
    axis = draw.draw(st.one_of(
        st.none(), st.integers(-len(shape), len(shape) - 1),
        st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True).map(tuple)))
    (a,) = data(seed, shape)
    check_gradients(lambda x: x.sum(axis=axis, keepdims=keepdims), a, seed=seed)
    check_gradients(lambda x: x.mean(axis=axis, keepdims=keepdims), a, seed=seed)
    numpy.testing.assert_allclose(Tensor(a).mean(axis=axis, keepdims=keepdims).data,
                                  a.mean(axis=axis, keepdims=keepdims))


@checked
@given(seeds)
def test_reshape(seed):
    (a,) = data(seed, (2, 3, 2))
    check_gradients(lambda x: x.reshape(3, 4) @ Tensor(numpy.arange(8.0).reshape(4, 2)), a)
    check_gradients(lambda x: x.reshape(-1), a)


@checked
@given(array_shapes(min_dims=1, max_dims=3, max_side=4), seeds,
       st.sampled_from(["relu", "tanh", "exp", "log"]))
def test_elementwise_functions(shape, seed, name):
    (a,) = data(seed, shape)
    if name == "relu":  # keep away from the kink, where the derivative jumps
        a = numpy.sign(a) * (numpy.abs(a) + 0.1)
    if name == "log":
        a = numpy.abs(a) + 0.5
    check_gradients(lambda x: getattr(x, name)(), a, seed=seed)
    reference = {"relu": lambda v: numpy.maximum(v, 0), "tanh": numpy.tanh, "exp": numpy.exp,
                 "log": numpy.log}[name]
    numpy.testing.assert_allclose(getattr(Tensor(a), name)().data, reference(a))


@checked
@given(array_shapes(min_dims=1, max_dims=3, max_side=4), seeds, st.data())
def test_log_softmax(shape, seed, draw):
    axis = draw.draw(st.integers(-len(shape), len(shape) - 1))
    (a,) = data(seed, shape)
    check_gradients(lambda x: x.log_softmax(axis=axis), a, seed=seed)
    reference = a - numpy.log(numpy.exp(a).sum(axis=axis, keepdims=True))
    numpy.testing.assert_allclose(Tensor(a).log_softmax(axis=axis).data, reference, atol=1e-12)


@checked
@given(st.integers(1, 5), st.integers(2, 5), seeds, st.sampled_from(["mean", "sum"]))
def test_cross_entropy(n, classes, seed, reduction):
    (logits,) = data(seed, (n, classes))
    targets = numpy.random.default_rng(seed).integers(0, classes, n)
    check_gradients(lambda x: cross_entropy(x, targets, reduction), logits, seed=seed)
    picked = (logits - numpy.log(numpy.exp(logits).sum(1, keepdims=True)))[numpy.arange(n),
                                                                           targets]
    expected = -picked.mean() if reduction == "mean" else -picked.sum()
    numpy.testing.assert_allclose(cross_entropy(Tensor(logits), targets, reduction).data,
                                  expected)


def test_a_small_network_end_to_end():
    x, w1, b1, w2 = data(3, (5, 4), (4, 6), (6,), (6, 3))
    targets = numpy.array([0, 2, 1, 1, 0])
    check_gradients(lambda x_, a, b, c: cross_entropy(((x_ @ a + b).tanh() @ c), targets),
                    x, w1, b1, w2)


def test_log_softmax_and_cross_entropy_are_stable_for_large_logits():
    logits = Tensor(numpy.array([[1000.0, 0.0, -1000.0]]), requires_grad=True)
    loss = cross_entropy(logits, numpy.array([1]))
    loss.backward()
    assert numpy.isfinite(loss.data) and loss.data == pytest.approx(1000.0)
    numpy.testing.assert_allclose(logits.grad, [[1.0, -1.0, 0.0]], atol=1e-12)
    assert numpy.isfinite(logits.log_softmax().data).all()


def test_float32_stays_float32():
    x = Tensor(numpy.ones((2, 3), numpy.float32), requires_grad=True)
    y = ((x * 2.0 + 1.0) / 3.0 - 0.5).relu().tanh().exp().log().sum()
    y.backward()
    assert y.dtype == numpy.float32 and x.grad.dtype == numpy.float32


def test_constants_get_no_gradient_and_backward_needs_one():
    a = Tensor(numpy.ones(3), requires_grad=True)
    c = Tensor(numpy.arange(3.0))
    (a * c).sum().backward()
    assert c.grad is None
    numpy.testing.assert_array_equal(a.grad, [0.0, 1.0, 2.0])
    with pytest.raises(RuntimeError, match="does not require grad"):
        (c * 2.0).sum().backward()
    with pytest.raises(ValueError, match="2 or more axes"):
        Tensor(numpy.ones(3)) @ Tensor(numpy.ones((3, 2)))


def test_gradients_accumulate_on_leaves_but_not_inside_the_graph():
    a = Tensor(numpy.array([1.0, 2.0]), requires_grad=True)
    b = a * a  # a used twice by one op, and b used twice below
    loss = (b + b * 3.0).sum()
    loss.backward()
    numpy.testing.assert_allclose(a.grad, 8 * a.data)
    loss.backward()  # the same graph again: leaves accumulate, intermediates start afresh
    numpy.testing.assert_allclose(a.grad, 16 * a.data)


def test_hooks_fire_once_when_the_gradient_is_complete_last_layer_first():
    x, w1, w2 = data(5, (4, 3), (3, 5), (5, 2))
    p1, p2 = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
    shared = Tensor(numpy.ones(5), requires_grad=True)  # used by two ops
    fired = []
    for name, p in (("w1", p1), ("w2", p2), ("shared", shared)):
        p.register_hook(lambda t, name=name: fired.append((name, t.grad.copy())))
    loss = ((((Tensor(x) @ p1) * shared).relu() + shared) @ p2).sum()
    loss.backward()
    assert [name for name, _ in fired] == ["w2", "shared", "w1"]
    for (name, grad), p in zip(fired, (p2, shared, p1)):
        numpy.testing.assert_array_equal(grad, p.grad)  # complete when the hook ran


def test_a_product_gradient_is_computed_into_grad_out_when_it_is_the_first_term():
    x, w, v, z = data(6, (4, 3), (3, 2), (2, 3), (5, 2))
    expected = []
    for out in (False, True):
        once, twice = Tensor(w.copy(), requires_grad=True), Tensor(v.copy(), requires_grad=True)
        buffers = [numpy.full(w.shape, numpy.nan), numpy.full(v.shape, numpy.nan)]
        if out:
            once.grad_out, twice.grad_out = buffers
        hidden = (Tensor(x) @ once).tanh()
        ((hidden @ twice).sum() + (Tensor(z) @ twice).sum()).backward()  # `twice` used twice
        expected.append([once.grad, twice.grad])
    numpy.testing.assert_allclose(expected[1][0], expected[0][0], rtol=1e-12)
    numpy.testing.assert_allclose(expected[1][1], expected[0][1], rtol=1e-12)
    assert expected[1][0] is buffers[0]  # written in place, no copy
    assert expected[1][1] is buffers[1]  # and the second term added there


def test_a_broadcast_weight_takes_its_summed_gradient_not_grad_out():
    """A weight of (1, 3, 2) times inputs of (4, 5, 3): its gradient sums over the batch, so it
    cannot be computed into `grad_out` (as DDP asks), which broke backward."""
    x, w = data(7, (4, 5, 3), (1, 3, 2))
    grads = []
    for out in (False, True):
        weight = Tensor(w.copy(), requires_grad=True)
        if out:
            weight.grad_out = numpy.full(w.shape, numpy.nan)
        (Tensor(x) @ weight).sum().backward()
        grads.append(weight.grad)
    numpy.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)
    numpy.testing.assert_allclose(grads[0], x.sum(axis=(0, 1))[None, :, None].repeat(2, -1),
                                  rtol=1e-12)


def test_deep_graphs_do_not_recurse():
    a = Tensor(numpy.array([0.5]), requires_grad=True)
    y = a
    for _ in range(5000):
        y = y * 1.0 + 0.0
    y.sum().backward()
    numpy.testing.assert_allclose(a.grad, [1.0])


@needs_gpu
def test_cupy_matches_numpy():
    import cupy

    x, w, b = data(7, (6, 4), (4, 3), (3,))
    targets = numpy.array([0, 1, 2, 2, 1, 0])
    grads = []
    for xp in (numpy, cupy):
        wt = Tensor(xp.asarray(w), requires_grad=True)
        bt = Tensor(xp.asarray(b), requires_grad=True)
        loss = cross_entropy((Tensor(xp.asarray(x)) @ wt + bt).tanh(), xp.asarray(targets))
        loss.backward()
        grads.append([cupy.asnumpy(wt.grad), cupy.asnumpy(bt.grad), float(loss.data)])
    for mine, theirs in zip(*grads):
        numpy.testing.assert_allclose(mine, theirs, rtol=1e-10)
