"""Train an MLP classifier with synchronous data-parallel SGD over the collectives.

    mpiexec -n 4 python -m trainer                         # digits, the defaults
    python -m trainer --dataset mnist --data-dir ~/mnist --hidden 256,128 --epochs 5
    mpiexec -n 2 python -m trainer --checkpoint ckpt --resume --out results

`--batch-size` is the global batch: each step, rank r trains on slice r of it, so 1 or N
ranks see the same batches and end with the same parameters. Each rank's loss is the sum
over its samples scaled by size / global batch; averaging the gradients over ranks then
gives exactly the gradient of the global batch's mean loss, even when the batch does not
divide evenly.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy

import collectives
from collectives import Communicator, array_module_of, chunk_bounds, module_for_device, to_numpy

from .checkpoint import CHECKPOINT, Position, load_checkpoint, save_checkpoint
from .data import DATASETS, Dataset, DistributedSampler, load
from .ddp import DistributedDataParallel
from .nn import MLP, Module
from .optim import SGD
from .progress import EpochProgress
from .tensor import Tensor, cross_entropy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer", description="Data-parallel SGD for an MLP classifier.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", choices=DATASETS, default="digits",
                        help="digits (in scikit-learn), mnist (IDX files), synthetic")
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (for --dataset mnist)")
    parser.add_argument("--hidden", type=widths, default=[128, 128],
                        help="hidden layer widths, comma separated ('' for none)")
    parser.add_argument("--epochs", type=int, default=20, help="passes over the data")
    parser.add_argument("--steps", type=int, help="stop after this many steps in all")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="the global batch, split across ranks")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--weight-decay", type=float, default=1e-4, help="L2 penalty")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    parser.add_argument("--transport", choices=collectives.TRANSPORTS, default="auto",
                        help="how ranks talk (auto: shared memory on one node, else MPI)")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="gradients travel in all-reduce buckets of about this size")
    parser.add_argument("--no-overlap", action="store_true",
                        help="all-reduce after backward instead of during it")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="NumPy arrays, or CuPy arrays on one GPU per rank")
    parser.add_argument("--out", type=Path, help="write params.npz and metrics.json here")
    parser.add_argument("--checkpoint", type=Path,
                        help="write a checkpoint here after every epoch and when stopping")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoint in --checkpoint, if there is one")
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint DIR")
    if args.dataset == "mnist" and args.data_dir is None:
        parser.error("--dataset mnist needs --data-dir, the directory of its IDX files")
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.steps is not None and args.steps < 0:
        parser.error("--steps must not be negative")
    return args


def widths(text: str) -> list[int]:
    """'128,64' -> [128, 64]; '' -> []."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated widths, got {text!r}")
    if any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"widths must be positive, got {text!r}")
    return sizes


def evaluate(model: Module, x: Any, y: Any, comm: Communicator) -> float:
    """Accuracy on (x, y): each rank scores a slice, the counts are summed."""
    lo, hi = chunk_bounds(len(y), comm.size)[comm.rank]
    xp = array_module_of(y)  # the arrays the communicator moves
    correct = xp.zeros(1, xp.int64)
    if hi > lo:
        logits = model(Tensor(x[lo:hi])).data
        correct[0] = int((logits.argmax(axis=1) == y[lo:hi]).sum())
    return int(comm.all_reduce(correct)[0]) / len(y)


def train(args: argparse.Namespace, comm: Communicator) -> dict:
    """Run the whole training; returns the metrics (on every rank)."""
    xp = module_for_device(args.device)
    data: Dataset = load(args.dataset, args.data_dir)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    model = MLP([data.features, *args.hidden, data.classes], seed=args.seed, xp=xp)
    optimizer = SGD(model.parameters(), args.lr, args.momentum, args.weight_decay)
    position = Position()
    resumed = args.resume and (args.checkpoint / CHECKPOINT).exists()
    if resumed:
        position = load_checkpoint(args.checkpoint / CHECKPOINT, model, optimizer, config)
    ddp = DistributedDataParallel(model, comm, args.bucket_mb, overlap=not args.no_overlap)
    sampler = DistributedSampler(len(data.y_train), args.batch_size, comm.rank, comm.size,
                                 seed=args.seed)
    x_train, y_train = xp.asarray(data.x_train), xp.asarray(data.y_train)
    x_test, y_test = xp.asarray(data.x_test), xp.asarray(data.y_test)
    scale = comm.size / args.batch_size  # see the module docstring
    lead = comm.rank == 0
    if lead:
        print(f"training MLP {'-'.join(map(str, model.sizes))} on {data.name} "
              f"({len(data.y_train)} train / {len(data.y_test)} test samples) with "
              f"{comm.size} rank{'s' if comm.size > 1 else ''} over {comm.transport}, global "
              f"batch {args.batch_size}, {len(sampler)} steps per epoch, device {args.device}"
              + (f"; resumed at epoch {position.epoch + 1} step {position.step}" if resumed
                 else f"; no checkpoint in {args.checkpoint} yet" if args.resume else ""),
              flush=True)

    def at_limit() -> bool:
        return args.steps is not None and position.global_step >= args.steps

    metrics = list(position.history)
    while position.epoch < args.epochs and not at_limit():
        batches = sampler.batches(position.epoch)
        progress = EpochProgress(lead, f"epoch {position.epoch + 1}/{args.epochs}",
                                 position.step, len(batches))
        local_loss = xp.zeros((), xp.float64)
        start, comm_start = time.perf_counter(), ddp.comm_seconds
        for index in batches[position.step:]:
            if at_limit():
                break
            index = xp.asarray(index)
            optimizer.zero_grad()
            loss = cross_entropy(ddp(Tensor(x_train[index])), y_train[index], "sum") * scale
            loss.backward()
            optimizer.step()
            local_loss += loss.data
            position.step += 1
            position.global_step += 1
            # rank 0's own mean loss, from its slice of the batch
            progress.step(loss.data * args.batch_size / (comm.size * len(index)))
        progress.close()
        position.seconds += time.perf_counter() - start
        position.comm_s += ddp.comm_seconds - comm_start
        losses = comm.all_reduce(xp.asarray([float(local_loss)]))
        position.loss_sum += float(losses[0]) / comm.size
        finished = position.step == len(batches)
        entry = {"epoch": position.epoch + 1,
                 "train_loss": position.loss_sum / max(position.step, 1),
                 "test_accuracy": evaluate(model, x_test, y_test, comm),
                 "samples_per_s": position.step * args.batch_size / max(position.seconds, 1e-9),
                 "comm_s": position.comm_s, "steps": position.step}
        metrics.append(entry)
        if lead:
            print(f"epoch {entry['epoch']:>3}/{args.epochs}  train loss {entry['train_loss']:.4f}"
                  f"  test accuracy {entry['test_accuracy']:.2%}  "
                  f"{entry['samples_per_s']:,.0f} samples/s  comm {entry['comm_s']:.2f} s"
                  + ("" if finished else f"  (stopped after step {position.step})"), flush=True)
        if finished:
            position = Position(epoch=position.epoch + 1, global_step=position.global_step,
                                history=metrics[:])
        if args.checkpoint is not None and lead:
            save_checkpoint(args.checkpoint, model, optimizer, position, config)
    ddp.close()
    accuracy = metrics[-1]["test_accuracy"] if metrics else evaluate(model, x_test, y_test, comm)
    if args.out is not None and lead:
        args.out.mkdir(parents=True, exist_ok=True)
        params = {k: to_numpy(v) for k, v in model.state_dict().items()}
        numpy.savez(args.out / "params.npz", **params)
        (args.out / "metrics.json").write_text(json.dumps(
            {"epochs": metrics, "test_accuracy": accuracy, "ranks": comm.size,
             "config": config}, indent=2) + "\n")
    if lead:
        print(f"test accuracy: {accuracy:.2%} ({round(accuracy * len(data.y_test))}"
              f"/{len(data.y_test)})", flush=True)
    return {"epochs": metrics, "test_accuracy": accuracy}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        comm = collectives.init(transport=args.transport, device=args.device)
    except collectives.CollectiveError as error:  # no CuPy or no GPU, for one
        raise SystemExit(f"python -m trainer: {error}")
    with comm:  # on more than one rank, an exception that escapes aborts the job (job.py)
        train(args, comm)


if __name__ == "__main__":
    main()
