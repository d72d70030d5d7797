"""Adam and LAMB against their formulas written out in NumPy (float64), Adam against PyTorch's
AdamW where PyTorch is installed, the state dicts, and the learning-rate schedule."""

from __future__ import annotations

import numpy
import pytest

from trainer.__main__ import base_lr, parse_args
from trainer.nn import Linear, ReLU, Sequential
from trainer.optim import LAMB, SGD, Adam, learning_rate
from trainer.tensor import Tensor, cross_entropy

LR, BETAS, EPS, DECAY = 0.01, (0.8, 0.95), 1e-6, 0.1


def problem(seed: int = 0) -> tuple[list[numpy.ndarray], numpy.ndarray]:
    """Two parameters (a matrix and a vector) and six steps of gradients for each."""
    rng = numpy.random.default_rng(seed)
    start = [rng.standard_normal((4, 3)), rng.standard_normal(5)]
    grads = [[rng.standard_normal(p.shape) for p in start] for _ in range(6)]
    return start, grads


def reference(start: list[numpy.ndarray], grads: list[list[numpy.ndarray]],
              lamb: bool) -> list[list[numpy.ndarray]]:
    """The parameters after each step, by the formulas of trainer/optim.py."""
    (b1, b2) = BETAS
    params = [p.copy() for p in start]
    m = [numpy.zeros_like(p) for p in params]
    v = [numpy.zeros_like(p) for p in params]
    after = []
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            direction = m[i] / (1 - b1 ** t) / (numpy.sqrt(v[i] / (1 - b2 ** t)) + EPS)
            if lamb:
                u = direction + DECAY * params[i]
                w_norm, u_norm = numpy.linalg.norm(params[i]), numpy.linalg.norm(u)
                trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
                params[i] = params[i] - LR * trust * u
            else:
                params[i] = params[i] * (1 - LR * DECAY) - LR * direction
        after.append([p.copy() for p in params])
    return after


@pytest.mark.parametrize("kind", [Adam, LAMB])
def test_adam_and_lamb_follow_their_formulas_and_resume(kind):
    start, grads = problem()
    expected = reference(start, grads, lamb=kind is LAMB)
    params = [Tensor(p.copy(), requires_grad=True) for p in start]
    optimizer = kind(params, LR, BETAS, EPS, DECAY)
    for t in range(3):
        for p, g in zip(params, grads[t]):
            p.grad = g
        optimizer.step()
        for p, want in zip(params, expected[t]):
            numpy.testing.assert_allclose(p.data, want, rtol=1e-12, atol=1e-14)
    resumed = [Tensor(p.data.copy(), requires_grad=True) for p in params]
    again = kind(resumed, LR, BETAS, EPS, DECAY)
    state = optimizer.state_dict()
    assert sorted(state) == ["exp_avg.0", "exp_avg.1", "exp_avg_sq.0", "exp_avg_sq.1", "step"]
    again.load_state_dict(state)
    for t in range(3, 6):
        for p, g in zip(resumed, grads[t]):
            p.grad = g
        again.step()
    for p, want in zip(resumed, expected[-1]):
        numpy.testing.assert_allclose(p.data, want, rtol=1e-12, atol=1e-14)
    assert optimizer.state_bytes() == 2 * sum(p.nbytes for p in start)


def test_lamb_trust_ratio_is_one_where_a_norm_is_zero():
    zero, ones = Tensor(numpy.zeros(3), requires_grad=True), Tensor(numpy.ones(3), True)
    optimizer = LAMB([zero, ones], lr=0.5, weight_decay=0.0)
    zero.grad, ones.grad = numpy.ones(3), numpy.zeros(3)  # |p| = 0, and |u| = 0
    optimizer.step()
    # Adam's first direction is g / (|g| + eps): about 1 for the first, 0 for the second
    numpy.testing.assert_allclose(zero.data, -0.5 * numpy.ones(3), rtol=1e-6)
    numpy.testing.assert_array_equal(ones.data, numpy.ones(3))


def test_adam_matches_pytorch_adamw():
    torch = pytest.importorskip("torch")
    start, grads = problem(seed=1)
    ours = [Tensor(p.astype(numpy.float32), requires_grad=True) for p in start]
    theirs = [torch.tensor(p, dtype=torch.float32, requires_grad=True) for p in start]
    optimizer = Adam(ours, LR, BETAS, EPS, DECAY)
    reference_optimizer = torch.optim.AdamW(theirs, LR, BETAS, EPS, DECAY)
    for step_grads in grads:
        for mine, other, g in zip(ours, theirs, step_grads):
            mine.grad = g.astype(numpy.float32)
            other.grad = torch.tensor(g, dtype=torch.float32)
        optimizer.step()
        reference_optimizer.step()
    for mine, other in zip(ours, theirs):
        numpy.testing.assert_allclose(mine.data, other.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_state_dicts_refuse_other_optimizers_and_bad_arguments():
    param = Tensor(numpy.zeros(2), requires_grad=True)
    with pytest.raises(KeyError, match="missing"):
        Adam([param], LR).load_state_dict(SGD([param], LR, momentum=0.9).state_dict())
    with pytest.raises(KeyError, match="unexpected"):
        SGD([param], LR).load_state_dict(Adam([param], LR).state_dict())
    # A state of the same size in another shape (a transposed weight) would load misplaced.
    wide, tall = (Tensor(numpy.zeros(shape), requires_grad=True) for shape in ((2, 3), (3, 2)))
    with pytest.raises(ValueError, match=r"exp_avg.0 has shape \(3, 2\), but its parameter "
                                         r"has shape \(2, 3\)"):
        Adam([wide], LR).load_state_dict(Adam([tall], LR).state_dict())
    for bad in (dict(lr=0.0), dict(lr=LR, betas=(1.0, 0.9)), dict(lr=LR, eps=0.0),
                dict(lr=LR, weight_decay=-1.0)):
        with pytest.raises(ValueError):
            Adam([param], **bad)


def test_warmup_and_linear_scaling():
    assert [learning_rate(step, 0.4, warmup_steps=4) for step in range(6)] == \
        [0.1, 0.2, 0.30000000000000004, 0.4, 0.4, 0.4]
    assert learning_rate(0, 0.4) == 0.4
    args = parse_args(["--optimizer", "adam", "--batch-size", "512", "--lr-scaling", "linear"])
    assert base_lr(args) == pytest.approx(0.001 * 512 / 256)
    assert base_lr(parse_args(["--lr", "0.3", "--batch-size", "32"])) == 0.3
    assert base_lr(parse_args(["--lr", "0.3", "--batch-size", "32", "--lr-scaling", "linear",
                               "--base-batch-size", "64"])) == 0.15


def test_a_parameter_in_another_memory_order_is_stepped_in_place():
    """A weight stored (out, in) and used as its transpose (Fortran order): stepped through a
    flat view, which for it was a copy, it never moved."""
    for make in (lambda p: SGD(p, 0.1, momentum=0.9), lambda p: Adam(p, 0.1)):
        param = Tensor(numpy.ones((2, 3)).T, requires_grad=True)
        optimizer = make([param])
        (Tensor(numpy.ones((4, 3))) @ param).sum().backward()
        before = param.data.copy()
        optimizer.step()
        assert numpy.abs(param.data - before).min() > 0.05, param.data - before
        assert optimizer.state[0] == {} or all(numpy.abs(a).max() > 0
                                               for a in optimizer.state[0].values())


def test_a_shared_parameter_is_listed_and_stepped_once():
    """Weight tying: one layer applied twice is one parameter, listed once (as in PyTorch),
    so one SGD step moves it by lr times its gradient, not twice that."""
    shared = Linear(4, 4, numpy.random.default_rng(0), dtype=numpy.float64)
    model = Sequential(shared, ReLU(), shared)
    assert [name for name, _ in model.named_parameters()] == ["layers.0.weight",
                                                              "layers.0.bias"]
    x = numpy.random.default_rng(1).standard_normal((8, 4))
    cross_entropy(model(Tensor(x)), numpy.arange(8) % 4).backward()
    expected = shared.weight.data - 0.1 * shared.weight.grad
    SGD(model.parameters(), 0.1).step()
    numpy.testing.assert_allclose(shared.weight.data, expected, rtol=1e-12)
