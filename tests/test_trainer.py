"""Modules, SGD, data, and `python -m trainer` on real MPI ranks: equivalence of 1..4 ranks,
checkpoint and resume, and the outputs."""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

import collectives
from launch import ROOT, mpiexec, rank_env
from trainer.__main__ import parse_args
from trainer.checkpoint import CHECKPOINT, Position, load_checkpoint, save_checkpoint
from trainer.data import DistributedSampler, mnist, read_idx, synthetic
from trainer.nn import MLP, Linear
from trainer.optim import SGD
from trainer.tensor import Tensor
from gpu import needs_gpu

# ---- modules and SGD ----------------------------------------------------------------------


def test_mlp_parameters_names_and_state_dict_round_trip():
    model = MLP([4, 3, 2], seed=1)
    assert [n for n, _ in model.named_parameters()] == [
        "layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"]
    assert [p.shape for p in model.parameters()] == [(4, 3), (3,), (3, 2), (2,)]
    state = model.state_dict()
    other = MLP([4, 3, 2], seed=2)
    assert not numpy.array_equal(other.state_dict()["layers.0.weight"], state["layers.0.weight"])
    other.load_state_dict(state)
    for name, value in other.state_dict().items():
        numpy.testing.assert_array_equal(value, state[name])
    state["layers.0.weight"][...] = 0  # state_dict holds copies
    assert model.parameters()[0].data.any()
    with pytest.raises(KeyError, match="missing"):
        other.load_state_dict({k: v for k, v in state.items() if k != "layers.2.bias"})
    with pytest.raises(ValueError, match="expected shape"):
        other.load_state_dict({**state, "layers.2.bias": numpy.zeros(3, numpy.float32)})


def test_linear_initialisation_and_zero_grad():
    layer = Linear(200, 300, numpy.random.default_rng(0))
    w = layer.weight.data
    bound = numpy.sqrt(6 / 200)
    assert w.dtype == numpy.float32 and abs(w).max() <= bound
    assert w.std() == pytest.approx(bound / numpy.sqrt(3), rel=0.02)  # uniform's std
    assert not layer.bias.data.any()
    layer(Tensor(numpy.ones((2, 200), numpy.float32))).sum().backward()
    assert layer.weight.grad is not None
    layer.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None


def test_sgd_follows_the_momentum_and_weight_decay_formulas_and_resumes():
    rng = numpy.random.default_rng(0)
    start = rng.standard_normal(5)
    grads = rng.standard_normal((6, 5))
    lr, momentum, decay = 0.1, 0.9, 0.01
    p, v = start.copy(), None
    expected = []
    for g in grads:
        g = g + decay * p
        v = g.copy() if v is None else momentum * v + g
        p = p - lr * v
        expected.append(p.copy())

    param = Tensor(start.copy(), requires_grad=True)
    optimizer = SGD([param], lr, momentum, decay)
    for step, g in enumerate(grads[:3]):
        param.grad = g
        optimizer.step()
        numpy.testing.assert_allclose(param.data, expected[step], rtol=1e-14)
    resumed = Tensor(param.data.copy(), requires_grad=True)
    again = SGD([resumed], lr, momentum, decay)
    again.load_state_dict(optimizer.state_dict())
    for step, g in enumerate(grads[3:], start=3):
        resumed.grad = g
        again.step()
        numpy.testing.assert_allclose(resumed.data, expected[step], rtol=1e-14)
    with pytest.raises(ValueError):
        SGD([param], lr=0.0)
    with pytest.raises(KeyError):
        again.load_state_dict({"velocity.7": numpy.zeros(5)})


# ---- data ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,batch", [(23, 10), (20, 5), (7, 9)])
def test_sampler_shards_are_disjoint_padded_and_independent_of_the_rank_count(n, batch):
    single = DistributedSampler(n, batch, 0, 1, seed=3).batches(epoch=2)
    steps = -(-n // batch)
    assert single.shape == (steps, batch)
    order = single.reshape(-1)
    assert sorted(order[:n].tolist()) == list(range(n))  # a permutation...
    numpy.testing.assert_array_equal(order, order[numpy.arange(order.size) % n])  # ...repeated
    position = numpy.arange(steps * batch).reshape(steps, batch)
    for size in range(2, min(batch, 4) + 1):
        shards = [DistributedSampler(n, batch, r, size, seed=3).batches(2) for r in range(size)]
        assert all(len(s) == steps for s in shards)  # every rank runs the same steps
        numpy.testing.assert_array_equal(numpy.concatenate(shards, axis=1), single)
        owned = [shard[position[:, lo:hi] < n].tolist()  # the samples before the padding
                 for shard, (lo, hi) in zip(shards, collectives.chunk_bounds(batch, size))]
        assert sorted(sum(owned, [])) == list(range(n))  # disjoint, and all of them
    assert not numpy.array_equal(DistributedSampler(n, batch, 0, 1, seed=3).batches(3), single)
    assert not numpy.array_equal(DistributedSampler(n, batch, 0, 1, seed=4).batches(2), single)
    numpy.testing.assert_array_equal(DistributedSampler(n, batch, 0, 1, seed=3).batches(2), single)
    with pytest.raises(ValueError, match="at least one sample"):
        DistributedSampler(n, 2, 0, 3)


def write_idx(path: Path, array: numpy.ndarray, code: int) -> None:
    """The IDX layout, written by hand: magic 0 0 type ndim, big-endian sizes, big-endian data."""
    raw = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I",
                                                                     *array.shape)
    raw += array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)


@pytest.mark.parametrize("dtype,code", [("uint8", 0x08), ("int8", 0x09), ("int16", 0x0B),
                                        ("int32", 0x0C), ("float32", 0x0D), ("float64", 0x0E)])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx(tmp_path, dtype, code, suffix):
    array = (numpy.arange(2 * 3 * 4).reshape(2, 3, 4) * 7 - 40).astype(dtype) \
        if dtype != "uint8" else (numpy.arange(24).reshape(2, 3, 4) * 10).astype(dtype)
    write_idx(tmp_path / f"a{suffix}", array, code)
    got = read_idx(tmp_path / f"a{suffix}")
    assert got.dtype == numpy.dtype(dtype) and got.dtype.isnative
    numpy.testing.assert_array_equal(got, array)


def test_read_idx_refuses_other_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x02ab")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 5) + b"abc")
    with pytest.raises(ValueError, match="5"):
        read_idx(tmp_path / "short")


def write_mnist(directory: Path, train: int = 240, test: int = 60, side: int = 8) -> None:
    """A small learnable set in MNIST's files: class prototypes plus noise, as uint8 pixels."""
    rng = numpy.random.default_rng(0)
    prototypes = rng.integers(0, 256, (10, side, side))
    for prefix, n, gz in (("train", train, ".gz"), ("t10k", test, "")):
        labels = rng.integers(0, 10, n).astype(numpy.uint8)
        noise = rng.normal(0, 60, (n, side, side))
        images = numpy.clip(prototypes[labels] + noise, 0, 255).astype(numpy.uint8)
        write_idx(directory / f"{prefix}-images-idx3-ubyte{gz}", images, 0x08)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte{gz}", labels, 0x08)


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("mnist")
    write_mnist(directory)
    return directory


def test_mnist_loads_the_four_files(mnist_dir, tmp_path):
    data = mnist(mnist_dir)
    assert data.x_train.shape == (240, 64) and data.x_test.shape == (60, 64)
    assert data.x_train.dtype == numpy.float32 and data.y_train.dtype == numpy.int64
    assert 0 <= data.x_train.min() and data.x_train.max() <= 1 and data.classes == 10
    raw = read_idx(mnist_dir / "train-images-idx3-ubyte.gz")
    numpy.testing.assert_allclose(data.x_train[5], raw[5].reshape(-1) / 255.0, rtol=1e-6)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        (tmp_path / name).write_bytes((mnist_dir / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="no t10k-images-idx3-ubyte"):
        mnist(tmp_path)


def test_synthetic_is_mnist_shaped_and_reproducible():
    data = synthetic(train=100, test=30)
    assert data.x_train.shape == (100, 784) and data.y_test.shape == (30,)
    assert data.classes == 10 and set(data.y_train.tolist()) <= set(range(10))
    numpy.testing.assert_array_equal(synthetic(train=100, test=30).x_train, data.x_train)


# ---- the command line ---------------------------------------------------------------------


def test_the_options_users_rely_on():
    args = parse_args(["--dataset", "mnist", "--data-dir", "d", "--hidden", "32,16",
                       "--epochs", "2", "--steps", "5", "--batch-size", "10", "--lr", "0.2",
                       "--momentum", "0.5", "--weight-decay", "0.001", "--seed", "4",
                       "--transport", "mpi", "--bucket-mb", "0.5", "--no-overlap",
                       "--device", "cpu", "--out", "o", "--checkpoint", "c", "--resume",
                       "--optimizer", "lamb", "--betas", "0.8,0.99", "--eps", "1e-6",
                       "--zero", "2", "--grad-dtype", "float16", "--accumulate", "3",
                       "--lr-scaling", "linear", "--base-batch-size", "32",
                       "--warmup-steps", "7"])
    assert (args.dataset, args.data_dir, args.hidden, args.epochs, args.steps) == \
        ("mnist", "d", [32, 16], 2, 5, )
    assert (args.batch_size, args.lr, args.momentum, args.weight_decay, args.seed) == \
        (10, 0.2, 0.5, 0.001, 4)
    assert (args.transport, args.bucket_mb, args.no_overlap, args.device) == \
        ("mpi", 0.5, True, "cpu")
    assert (args.out, args.checkpoint, args.resume) == (Path("o"), Path("c"), True)
    assert (args.optimizer, args.betas, args.eps, args.zero, args.grad_dtype) == \
        ("lamb", (0.8, 0.99), 1e-6, 2, "float16")
    assert (args.accumulate, args.lr_scaling, args.base_batch_size, args.warmup_steps) == \
        (3, "linear", 32, 7)
    defaults = parse_args([])
    assert (defaults.optimizer, defaults.lr, defaults.zero, defaults.grad_dtype) == \
        ("sgd", None, 0, "float32")
    assert (defaults.accumulate, defaults.lr_scaling, defaults.warmup_steps) == (1, "none", 0)
    assert parse_args(["--hidden", ""]).hidden == []
    for bad in (["--resume"], ["--hidden", "3,x"], ["--batch-size", "0"], ["--device", "tpu"],
                ["--dataset", "mnist"], ["--zero", "3"], ["--accumulate", "0"],
                ["--optimizer", "rmsprop"], ["--betas", "0.9"], ["--warmup-steps", "-1"],
                ["--grad-dtype", "bfloat16"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_checkpoints_are_replaced_atomically(tmp_path, monkeypatch):
    model = MLP([3, 2], seed=0)
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    config = vars(parse_args([]))
    save_checkpoint(tmp_path, model, optimizer.state_dict(), Position(epoch=1), config)

    def broken_savez(file, **arrays):
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(numpy, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, MLP([3, 2], seed=1), optimizer.state_dict(),
                        Position(epoch=2), config)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT]  # no partial file left
    fresh = MLP([3, 2], seed=5)
    position = load_checkpoint(tmp_path / CHECKPOINT, fresh,
                               SGD(fresh.parameters(), 0.1, momentum=0.9), config)
    assert position.epoch == 1  # the old checkpoint, whole
    numpy.testing.assert_array_equal(fresh.state_dict()["layers.0.weight"],
                                     model.state_dict()["layers.0.weight"])
    for key, value in (("batch_size", 7), ("optimizer", "adam")):
        with pytest.raises(SystemExit, match=key.replace("_", "-")):
            load_checkpoint(tmp_path / CHECKPOINT, fresh, SGD(fresh.parameters(), 0.1),
                            {**config, key: value})


def train(ranks: int, out: Path, *options: str) -> dict:
    """`python -m trainer` on `ranks` MPI ranks; returns the run's outputs and its stdout."""
    result = mpiexec(ranks, "-m", "trainer", "--out", str(out), *options, timeout=120)
    with numpy.load(out / "params.npz") as f:
        params = dict(f)
    return {"params": params, "metrics": json.loads((out / "metrics.json").read_text()),
            "stdout": result.stdout, "stderr": result.stderr}


def small_run(mnist_dir: Path) -> list[str]:
    # 240 samples in global batches of 50: 5 steps an epoch, shards of 17/17/16 on 3 ranks
    return ["--dataset", "mnist", "--data-dir", str(mnist_dir), "--hidden", "24,16",
            "--batch-size", "50", "--lr", "0.1", "--weight-decay", "0.001", "--seed", "3"]


def test_one_to_four_ranks_train_the_same_parameters(mnist_dir, tmp_path):
    options = [*small_run(mnist_dir), "--epochs", "8"]  # 40 steps
    runs = {1: train(1, tmp_path / "1", *options),
            2: train(2, tmp_path / "2", *options, "--no-overlap", "--bucket-mb", "0.001"),
            3: train(3, tmp_path / "3", *options, "--bucket-mb", "0.002"),
            4: train(4, tmp_path / "4", *options)}
    one = runs[1]
    assert sorted(one["params"]) == ["layers.0.bias", "layers.0.weight", "layers.2.bias",
                                     "layers.2.weight", "layers.4.bias", "layers.4.weight"]
    for ranks, run in runs.items():
        for name, value in one["params"].items():
            numpy.testing.assert_allclose(run["params"][name], value, rtol=1e-5, atol=1e-6,
                                          err_msg=f"{name} on {ranks} ranks")
        epochs = run["metrics"]["epochs"]
        assert [e["epoch"] for e in epochs] == list(range(1, 9))
        assert set(epochs[0]) >= {"epoch", "train_loss", "test_accuracy", "samples_per_s",
                                  "comm_s"}
        assert epochs[-1]["train_loss"] == pytest.approx(one["metrics"]["epochs"][-1]
                                                         ["train_loss"], rel=1e-4)
        assert run["metrics"]["ranks"] == ranks
        assert f"with {ranks} rank" in run["stdout"]
        assert run["stdout"].rstrip().splitlines()[-1].startswith("test accuracy: ")
        assert "epoch 8/8 [" in run["stderr"]  # rank 0's progress bar
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"] / 2
    assert epochs[-1]["test_accuracy"] > 0.8


def test_resume_ends_with_the_parameters_of_an_uninterrupted_run(mnist_dir, tmp_path):
    options = [*small_run(mnist_dir), "--epochs", "4"]  # 20 steps
    whole = train(2, tmp_path / "whole", *options, "--checkpoint", str(tmp_path / "c0"))
    assert [p.name for p in (tmp_path / "c0").iterdir()] == [CHECKPOINT]
    first = train(2, tmp_path / "first", *options, "--steps", "7",
                  "--checkpoint", str(tmp_path / "c1"))
    assert "stopped after step 2" in first["stdout"]  # 7 = one epoch of 5, then 2 steps
    for ranks in (2, 3):
        resumed_dir = tmp_path / f"c{ranks}"
        resumed_dir.mkdir()
        (resumed_dir / CHECKPOINT).write_bytes((tmp_path / "c1" / CHECKPOINT).read_bytes())
        rest = train(ranks, tmp_path / f"rest{ranks}", *options, "--resume",
                     "--checkpoint", str(resumed_dir))
        assert "resumed at epoch 2 step 2" in rest["stdout"]
        assert [e["epoch"] for e in rest["metrics"]["epochs"]] == [1, 2, 3, 4]
        for name, value in whole["params"].items():
            if ranks == 2:  # the same ranks do the same arithmetic: bitwise equal
                numpy.testing.assert_array_equal(rest["params"][name], value, err_msg=name)
            else:
                numpy.testing.assert_allclose(rest["params"][name], value, rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(rest["metrics"]["epochs"], whole["metrics"]["epochs"]):
            assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)


def test_plain_python_trains_digits_by_default(tmp_path):
    """Without mpiexec: one rank (a singleton MPI process), the default dataset."""
    result = subprocess.run([sys.executable, "-m", "trainer", "--epochs", "3", "--out",
                             str(tmp_path)], cwd=ROOT, env=rank_env(), capture_output=True,
                            text=True, timeout=120, check=True)
    assert "on digits (1438 train / 359 test samples) with 1 rank" in result.stdout
    last = result.stdout.rstrip().splitlines()[-1]
    assert last.startswith("test accuracy: ") and "/359)" in last
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["ranks"] == 1 and len(metrics["epochs"]) == 3
    assert metrics["test_accuracy"] > 0.9


@needs_gpu
def test_cuda_device_trains_like_the_cpu(mnist_dir, tmp_path):
    options = [*small_run(mnist_dir), "--epochs", "2"]
    cpu = train(2, tmp_path / "cpu", *options)
    gpu = train(2, tmp_path / "gpu", *options, "--device", "cuda")
    for name, value in cpu["params"].items():
        numpy.testing.assert_allclose(gpu["params"][name], value, rtol=1e-4, atol=1e-5)


def test_the_benchmark_runs_and_checks_its_ranks_agree():
    result = mpiexec(2, "-m", "benchmarks.trainer", "--compare", "torch", "--rounds", "1",
                     "--steps", "2", "--warmup", "2", timeout=120)
    lines = result.stdout.splitlines()
    check = next(line for line in lines if line.startswith("# check:"))
    transport = "shm" if "ringcc:shm yes" in check else "mpi"
    for name in ("", " ZeRO-1", " ZeRO-2 (1 MB)"):
        assert f"ringcc:{transport}{name} yes" in check
    assert "NO" not in check
    assert any(line.strip().startswith("ringcc, rank 0 alone") for line in lines)
    assert any(line.startswith("# ringcc") and "rank 0 alone:" in line for line in lines)
    assert any(line.startswith(f"# ringcc:{transport} ZeRO-1 / ") for line in lines)
    assert ("torch DDP (gloo) yes" in check) or ("torch is not installed" in result.stdout)
    # the last three columns: parameters, gradients and optimizer state of rank 0, in MB
    memory = {line.split("  ")[1].strip(): [float(x) for x in line.split()[-3:]]
              for line in lines if line.startswith("  ringcc:")}
    ddp, one, two = (memory[f"ringcc:{transport}{name}"]
                     for name in ("", " ZeRO-1", " ZeRO-2 (1 MB)"))
    assert ddp == [7.45, 7.45, 7.45]  # 1.86 million float32 parameters, SGD's velocity
    assert one[0] == two[0] == 7.45 and one[2] == two[2] == 3.73  # half the state
    assert two[1] < ddp[1] < one[1]  # gradients: two 1 MB buckets and the shard
