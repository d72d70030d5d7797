"""`python -m trainer`'s data-parallel options on real MPI ranks: ZeRO stages, optimizers,
float16 gradients, gradient accumulation, learning-rate scaling and warmup, and a sharded
checkpoint written by 4 ranks resumed on 3, also after a rank of the job was killed.

Most run test_trainer.py's small MNIST-like set: 240 samples, 5 steps an epoch of global
batches of 50 (slices of 17/17/16 on 3 ranks), a model of 2130 parameters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy
import pytest

from launch import ROOT, mpiexec_path, rank_env
from test_trainer import small_run, train, write_mnist
from trainer.checkpoint import CHECKPOINT

PARAMS = 2130  # 64*24 + 24 + 24*16 + 16 + 16*10 + 10


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("mnist")
    write_mnist(directory)
    return directory


def relative_difference(params: dict, reference: dict) -> float:
    """The largest |difference| of any parameter, relative to that parameter's largest value."""
    return max(float(abs(params[k] - v).max() / abs(v).max()) for k, v in reference.items())


@pytest.mark.parametrize("optimizer", ["adam", "lamb"])
def test_zero_stages_on_three_ranks_end_as_ddp_with_a_third_of_the_state(mnist_dir, tmp_path,
                                                                          optimizer):
    # buckets of 2 kB (522 elements): five reduce-scatters, cutting through parameters
    options = [*small_run(mnist_dir), "--epochs", "4", "--optimizer", optimizer, "--lr", "0.01",
               "--bucket-mb", "0.002"]
    runs = {zero: train(3, tmp_path / str(zero), *options, "--zero", str(zero))
            for zero in (0, 1, 2)}
    ddp = runs[0]
    assert ddp["metrics"]["memory_bytes"] == [{"parameters": PARAMS * 4, "gradients": PARAMS * 4,
                                               "optimizer_state": 2 * PARAMS * 4}] * 3
    for zero in (1, 2):
        run = runs[zero]
        assert relative_difference(run["params"], ddp["params"]) <= 1e-5
        # a third of the two moments on each rank
        assert [m["optimizer_state"] for m in run["metrics"]["memory_bytes"]] == \
            [2 * PARAMS // 3 * 4] * 3
        assert f"ZeRO-{zero}" in run["stdout"] and "optimizer 0.01 MB" in run["stdout"]
    one, two = (runs[zero]["metrics"]["memory_bytes"][0]["gradients"] for zero in (1, 2))
    assert one == (PARAMS + PARAMS // 3) * 4  # the whole flat vector, and the shard
    assert two == (2 * 522 + PARAMS // 3) * 4  # two buckets, and the shard
    # a reduce-scatter and an all-gather of the ring send (N-1)/N of the vector each; LAMB
    # adds its all-reduce of the layers' norms (2 x 6 float64, to each of 2 peers)
    norms = 2 * 96 if optimizer == "lamb" else 0
    assert runs[1]["metrics"]["bytes_sent_per_step"] == [2 * 2 / 3 * PARAMS * 4 + norms] * 3


def test_float16_gradients_on_four_ranks_halve_the_bytes_and_still_learn_digits(tmp_path):
    full = train(4, tmp_path / "32", "--steps", "5")
    half = train(4, tmp_path / "16", "--grad-dtype", "float16")  # the default 20 epochs
    sent = half["metrics"]["bytes_sent_per_step"]
    assert all(h <= 0.52 * f for h, f in zip(sent, full["metrics"]["bytes_sent_per_step"]))
    assert half["metrics"]["test_accuracy"] >= 0.97
    assert "float16 gradients" in half["stdout"]
    assert half["metrics"]["epochs"][-1]["bytes_sent_per_step"] == pytest.approx(sent[0])
    assert f"sent {sent[0] / 1e6:.2f} MB/step" in half["stdout"]


def test_accumulating_three_micro_batches_ends_where_one_batch_does(mnist_dir, tmp_path):
    options = [*small_run(mnist_dir), "--epochs", "4"]  # 25/25 a rank: micro-batches 9/8/8
    for zero, optimizer in (("0", "sgd"), ("2", "adam")):
        runs = [train(2, tmp_path / f"{zero}-{k}", *options, "--zero", zero, "--optimizer",
                      optimizer, "--accumulate", k) for k in ("1", "3")]
        assert relative_difference(runs[1]["params"], runs[0]["params"]) <= 1e-5
        assert "3 micro-batches a step" in runs[1]["stdout"]
        # the first two micro-batches under no_sync: one averaging per step all the same
        sent = [run["metrics"]["bytes_sent_per_step"] for run in runs]
        assert sent[0] == sent[1]


def test_linear_scaling_and_warmup_set_the_learning_rate(mnist_dir, tmp_path):
    run = train(2, tmp_path, *small_run(mnist_dir), "--epochs", "3", "--lr", "0.4",
                "--lr-scaling", "linear", "--base-batch-size", "200", "--warmup-steps", "8")
    # 0.4 * 50 / 200 = 0.1 after warmup; the 5th step is warmup's 5th of 8
    assert [e["lr"] for e in run["metrics"]["epochs"]] == pytest.approx([0.1 * 5 / 8, 0.1, 0.1])
    assert "sgd lr 0.1 after 8 warmup steps" in run["stdout"]


def test_a_zero_checkpoint_of_four_ranks_resumes_on_three(mnist_dir, tmp_path):
    options = [*small_run(mnist_dir), "--epochs", "4", "--optimizer", "adam"]  # 20 steps
    whole = train(4, tmp_path / "whole", *options, "--zero", "1")
    first = train(4, tmp_path / "first", *options, "--zero", "1", "--steps", "7",
                  "--checkpoint", str(tmp_path / "c4"))
    assert "stopped after step 2" in first["stdout"]
    saved = tmp_path / "c4" / "checkpoint.npz"
    with numpy.load(saved) as f:  # the whole state, by parameter, though 4 ranks held shards
        assert f["optimizer/exp_avg.0"].shape == whole["params"]["layers.0.weight"].shape
    for ranks, zero in ((3, "1"), (3, "2"), (2, "0")):
        directory = tmp_path / f"c{ranks}-{zero}"
        directory.mkdir()
        (directory / "checkpoint.npz").write_bytes(saved.read_bytes())
        rest = train(ranks, tmp_path / f"rest{ranks}-{zero}", *options, "--zero", zero,
                     "--resume", "--checkpoint", str(directory))
        assert "resumed at epoch 2 step 2" in rest["stdout"]
        assert relative_difference(rest["params"], whole["params"]) <= 1e-4


def test_a_job_that_lost_a_rank_restarts_on_the_ranks_that_are_left(mnist_dir, tmp_path):
    """The README's recipe: kill one of 4 ranks once a checkpoint exists; the job stops; the
    same command on 3 ranks with --resume ends as an uninterrupted run."""
    options = [*small_run(mnist_dir), "--optimizer", "adam", "--zero", "1",
               "--checkpoint", str(tmp_path / "ckpt")]
    command = [mpiexec_path(), "-n", "4", sys.executable, "-m", "trainer", *options,
               "--epochs", "100000"]
    job = subprocess.Popen(command, cwd=ROOT, env=rank_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ckpt" / CHECKPOINT).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/cmdline")
                 if str(tmp_path / "ckpt") in p.read_bytes().decode(errors="replace")
                 and int(p.parent.name) != job.pid]
        os.kill(max(ranks), signal.SIGKILL)  # one rank, whichever; the others must stop
        assert job.wait(timeout=60) != 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    with numpy.load(tmp_path / "ckpt" / CHECKPOINT) as f:
        epochs = json.loads(str(f["meta"]))["position"]["epoch"] + 2  # two more to go
    whole = train(4, tmp_path / "whole", *options[:-2], "--epochs", str(epochs))
    rest = train(3, tmp_path / "rest", *options, "--resume", "--epochs", str(epochs))
    assert f"resumed at epoch {epochs - 1} step 0" in rest["stdout"]
    assert relative_difference(rest["params"], whole["params"]) <= 1e-4
