"""Train an MLP classifier with synchronous data parallelism over the collectives.

    mpiexec -n 4 python -m trainer                         # digits, the defaults
    python -m trainer --dataset mnist --data-dir ~/mnist --hidden 256,128 --epochs 5
    mpiexec -n 2 python -m trainer --checkpoint ckpt --resume --out results
    mpiexec -n 3 python -m trainer --optimizer adam --zero 1 --grad-dtype float16
    mpiexec -n 2 python -m trainer --timeline timeline   # open timeline/timeline.json in Perfetto

`--batch-size` is the global batch: each step, rank r trains on slice r of it, so 1 or N
ranks see the same batches and end with the same parameters. Each rank's loss is the sum
over its samples scaled by size / global batch; averaging the gradients over ranks then
gives exactly the gradient of the global batch's mean loss, even when the batch does not
divide evenly. With `--accumulate K` each rank cuts its slice into K micro-batches and the
gradients add up over them before the one averaging: the same sum, so the same step.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

import numpy

import collectives
from collectives import Communicator, array_module_of, chunk_bounds, module_for_device, to_numpy

from .checkpoint import CHECKPOINT, Position, load_checkpoint, save_checkpoint
from .compress import GRAD_DTYPES
from .data import DATASETS, Dataset, DistributedSampler, load
from .ddp import DistributedDataParallel
from .nn import MLP, Module
from .optim import DEFAULT_LR, LAMB, OPTIMIZERS, SGD, Adam, Optimizer, learning_rate
from .progress import EpochProgress
from .tensor import Tensor, cross_entropy
from .zero import ShardedOptimizer, ZeroDataParallel

TIMELINE_STEPS = 5  # steps that --timeline traces


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer", description="Data-parallel training of an MLP classifier.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", choices=DATASETS, default="digits",
                        help="digits (in scikit-learn), mnist (IDX files), synthetic")
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (for --dataset mnist)")
    parser.add_argument("--hidden", type=widths, default=[128, 128],
                        help="hidden layer widths, comma separated ('' for none)")
    parser.add_argument("--epochs", type=int, default=20, help="passes over the data")
    parser.add_argument("--steps", type=int, help="stop after this many steps in all")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="the global batch of one optimizer step, split across ranks")
    parser.add_argument("--accumulate", type=int, default=1, metavar="K",
                        help="micro-batches per rank and step, averaged over ranks only "
                             "after the last")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                        help="SGD with momentum, Adam (decoupled weight decay) or LAMB")
    parser.add_argument("--lr", type=float,
                        help="learning rate; None: " + ", ".join(
                            f"{v:g} for {k}" for k, v in DEFAULT_LR.items()))
    parser.add_argument("--lr-scaling", choices=("none", "linear"), default="none",
                        help="linear: lr * batch-size / base-batch-size (Goyal et al. 2017)")
    parser.add_argument("--base-batch-size", type=int, default=256,
                        help="the batch --lr is meant for, under --lr-scaling linear")
    parser.add_argument("--warmup-steps", type=int, default=0, metavar="W",
                        help="grow the learning rate linearly over the first W steps")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--betas", type=betas, default=(0.9, 0.999),
                        help="Adam and LAMB moment decays, b1,b2")
    parser.add_argument("--eps", type=float, default=1e-8, help="Adam and LAMB epsilon")
    parser.add_argument("--weight-decay", type=float, default=1e-4,
                        help="L2 penalty (SGD), decoupled weight decay (Adam, LAMB)")
    parser.add_argument("--zero", type=int, choices=(0, 1, 2), default=0,
                        help="ZeRO stage: 0 DDP, 1 sharded optimizer state, 2 and gradients")
    parser.add_argument("--grad-dtype", choices=GRAD_DTYPES, default="float32",
                        help="the dtype gradients travel in (float16: scaled, half the bytes)")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    parser.add_argument("--transport", choices=collectives.TRANSPORTS, default="auto",
                        help="how ranks talk (auto: shared memory on one node, else MPI)")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="gradients travel in buckets of this size")
    parser.add_argument("--no-overlap", action="store_true",
                        help="reduce each bucket on the main thread instead of beside backward")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="NumPy arrays, or CuPy arrays on one GPU per rank")
    parser.add_argument("--out", type=Path, help="write params.npz and metrics.json here")
    parser.add_argument("--checkpoint", type=Path,
                        help="write a checkpoint here after every epoch and when stopping")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoint in --checkpoint, if there is one")
    parser.add_argument("--timeline", type=Path, metavar="DIR",
                        help=f"trace the first {TIMELINE_STEPS} steps and write "
                             f"DIR/timeline.json (Chrome trace events: open in Perfetto)")
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint DIR")
    if args.dataset == "mnist" and args.data_dir is None:
        parser.error("--dataset mnist needs --data-dir, the directory of its IDX files")
    for name in ("epochs", "batch_size", "accumulate", "base_batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("steps", "warmup_steps"):
        if (getattr(args, name) or 0) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
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


def betas(text: str) -> tuple[float, float]:
    """'0.9,0.999' -> (0.9, 0.999)."""
    try:
        b1, b2 = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers b1,b2, got {text!r}")
    return b1, b2


def base_lr(args: argparse.Namespace) -> float:
    """The learning rate after warmup: --lr, scaled by the global batch under linear scaling."""
    lr = DEFAULT_LR[args.optimizer] if args.lr is None else args.lr
    return lr * args.batch_size / args.base_batch_size if args.lr_scaling == "linear" else lr


def build(args: argparse.Namespace, model: Module, comm: Communicator) -> tuple[Any, Any]:
    """The data-parallel wrapper and the optimizer that `args` ask for."""
    options = dict(bucket_mb=args.bucket_mb, overlap=not args.no_overlap,
                   grad_dtype=args.grad_dtype)

    def optimizer(params: list[Tensor]) -> Optimizer:
        lr = base_lr(args)
        if args.optimizer == "sgd":
            return SGD(params, lr, args.momentum, args.weight_decay)
        kind = Adam if args.optimizer == "adam" else LAMB
        return kind(params, lr, args.betas, args.eps, args.weight_decay)

    if args.zero == 0:
        ddp = DistributedDataParallel(model, comm, **options)
        return ddp, optimizer(model.parameters())
    zero = ZeroDataParallel(model, comm, args.zero, **options)
    return zero, ShardedOptimizer(zero, optimizer(zero.shards))


def evaluate(model: Module, x: Any, y: Any, comm: Communicator) -> float:
    """Accuracy on (x, y): each rank scores a slice, the counts are summed."""
    lo, hi = chunk_bounds(len(y), comm.size)[comm.rank]
    xp = array_module_of(y)  # the arrays the communicator moves
    correct = xp.zeros(1, xp.int64)
    if hi > lo:
        logits = model(Tensor(x[lo:hi])).data
        correct[0] = int((logits.argmax(axis=1) == y[lo:hi]).sum())
    return int(comm.all_reduce(correct)[0]) / len(y)


def per_rank(comm: Communicator, values: list[float]) -> list[list[float]]:
    """Every rank's `values`, in rank order."""
    xp = module_for_device(comm.device)
    return to_numpy(comm.all_gather(xp.asarray(values, dtype=xp.float64))).tolist()


def options_line(args: argparse.Namespace) -> str:
    """The optimizer and the data-parallel options, as the first line shows them."""
    return (f"{args.optimizer} lr {base_lr(args):g}"
            + (f" after {args.warmup_steps} warmup steps" if args.warmup_steps else "")
            + (f", ZeRO-{args.zero}" if args.zero else "")
            + (f", {args.grad_dtype} gradients" if args.grad_dtype != "float32" else "")
            + (f", {args.accumulate} micro-batches a step" if args.accumulate > 1 else ""))


def megabytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def step(ddp: Any, optimizer: Any, comm: Communicator, x_train: Any, y_train: Any,
         index: Any, micro: list[tuple[int, int]], scale: float) -> Any:
    """One optimizer step on this rank's slice `index` of the global batch, in micro-batches
    (`micro`: bounds within the slice); returns the slice's summed loss, scaled."""
    optimizer.zero_grad()
    step_loss = 0.0
    for m, (lo, hi) in enumerate(micro):
        # every micro-batch but the last only adds to the local gradients
        with ddp.no_sync() if m < len(micro) - 1 else nullcontext():
            part = index[lo:hi]
            with comm.span("forward"):
                loss = cross_entropy(ddp(Tensor(x_train[part])), y_train[part], "sum") * scale
            with comm.span("backward"):
                loss.backward()
        step_loss = step_loss + loss.data
    with comm.span("optimizer"):
        optimizer.step()
    return step_loss


def epoch_line(entry: dict, epochs: int, memory: dict[str, int]) -> str:
    """What rank 0 prints after an epoch."""
    return (f"epoch {entry['epoch']:>3}/{epochs}  train loss {entry['train_loss']:.4f}"
            f"  test accuracy {entry['test_accuracy']:.2%}  "
            f"{entry['samples_per_s']:,.0f} samples/s  comm {entry['comm_s']:.2f} s  "
            f"sent {megabytes(entry['bytes_sent_per_step'])}/step  memory: parameters "
            f"{megabytes(memory['parameters'])}, gradients {megabytes(memory['gradients'])}, "
            f"optimizer {megabytes(memory['optimizer_state'])}")


def write_results(folder: Path, model: Module, results: dict) -> None:
    """--out: the parameters (params.npz) and the metrics (metrics.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    numpy.savez(folder / "params.npz", **{k: to_numpy(v) for k, v in model.state_dict().items()})
    (folder / "metrics.json").write_text(json.dumps(results, indent=2) + "\n")


def train(args: argparse.Namespace, comm: Communicator) -> dict:
    """Run the whole training; returns the metrics (on every rank)."""
    if args.batch_size // comm.size < args.accumulate:  # the smallest slice, on every rank
        raise SystemExit(f"python -m trainer: a slice of {args.batch_size // comm.size} "
                         f"samples of the global batch cannot make {args.accumulate} "
                         f"micro-batches")
    xp = module_for_device(args.device)
    data: Dataset = load(args.dataset, args.data_dir)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    model = MLP([data.features, *args.hidden, data.classes], seed=args.seed, xp=xp)
    ddp, optimizer = build(args, model, comm)
    position = Position()
    resumed = args.resume and (args.checkpoint / CHECKPOINT).exists()
    if resumed:
        position = load_checkpoint(args.checkpoint / CHECKPOINT, model, optimizer, config)
    sampler = DistributedSampler(len(data.y_train), args.batch_size, comm.rank, comm.size,
                                 seed=args.seed)
    micro = chunk_bounds(sampler.hi - sampler.lo, args.accumulate)
    x_train, y_train = xp.asarray(data.x_train), xp.asarray(data.y_train)
    x_test, y_test = xp.asarray(data.x_test), xp.asarray(data.y_test)
    scale = comm.size / args.batch_size  # see the module docstring
    memory = {**ddp.memory_bytes(), "optimizer_state": optimizer.state_bytes()}
    lead = comm.rank == 0
    if lead:
        print(f"training MLP {'-'.join(map(str, model.sizes))} on {data.name} "
              f"({len(data.y_train)} train / {len(data.y_test)} test samples) with "
              f"{comm.size} rank{'s' if comm.size > 1 else ''} over {comm.transport}, global "
              f"batch {args.batch_size}, {len(sampler)} steps per epoch, device {args.device}; "
              + options_line(args)
              + (f"; resumed at epoch {position.epoch + 1} step {position.step}" if resumed
                 else f"; no checkpoint in {args.checkpoint} yet" if args.resume else ""),
              flush=True)

    def at_limit() -> bool:
        return args.steps is not None and position.global_step >= args.steps

    metrics = list(position.history)
    run_bytes, run_steps = 0, 0
    timeline = Timeline(comm, args.timeline)
    while position.epoch < args.epochs and not at_limit():
        batches = sampler.batches(position.epoch)
        progress = EpochProgress(lead, f"epoch {position.epoch + 1}/{args.epochs}",
                                 position.step, len(batches))
        local_loss = xp.zeros((), xp.float64)
        start, comm_start = time.perf_counter(), ddp.comm_seconds
        bytes_start, steps_start = comm.stats.bytes_sent, position.step
        for index in batches[position.step:]:
            if at_limit():
                break
            index = xp.asarray(index)
            optimizer.lr = learning_rate(position.global_step, base_lr(args), args.warmup_steps)
            step_loss = step(ddp, optimizer, comm, x_train, y_train, index, micro, scale)
            local_loss += step_loss
            position.step += 1
            position.global_step += 1
            timeline.stepped()
            # rank 0's own mean loss, from its slice of the batch
            progress.step(step_loss * args.batch_size / (comm.size * len(index)))
        progress.close()
        position.seconds += time.perf_counter() - start
        position.comm_s += ddp.comm_seconds - comm_start
        sent = comm.stats.bytes_sent - bytes_start
        run_bytes, run_steps = run_bytes + sent, run_steps + position.step - steps_start
        losses = comm.all_reduce(xp.asarray([float(local_loss), sent]))
        position.loss_sum += float(losses[0]) / comm.size
        position.bytes_sent += float(losses[1]) / comm.size
        finished = position.step == len(batches)
        entry = {"epoch": position.epoch + 1,
                 "train_loss": position.loss_sum / max(position.step, 1),
                 "test_accuracy": evaluate(model, x_test, y_test, comm),
                 "samples_per_s": position.step * args.batch_size / max(position.seconds, 1e-9),
                 "comm_s": position.comm_s, "steps": position.step, "lr": optimizer.lr,
                 "bytes_sent_per_step": position.bytes_sent / max(position.step, 1)}
        metrics.append(entry)
        if lead:
            print(epoch_line(entry, args.epochs, memory)
                  + ("" if finished else f"  (stopped after step {position.step})"), flush=True)
        if finished:
            position = Position(epoch=position.epoch + 1, global_step=position.global_step,
                                history=metrics[:])
        if args.checkpoint is not None:
            state = optimizer.state_dict()  # gathered from every rank's shard under ZeRO
            if lead:
                save_checkpoint(args.checkpoint, model, state, position, config)
    ddp.close()
    timeline.write()
    accuracy = metrics[-1]["test_accuracy"] if metrics else evaluate(model, x_test, y_test, comm)
    names = list(memory)
    memories = [dict(zip(names, map(int, row)))
                for row in per_rank(comm, [memory[n] for n in names])]
    sent_per_step = [row[0] for row in per_rank(comm, [run_bytes / max(run_steps, 1)])]
    if args.out is not None and lead:
        write_results(args.out, model, {
            "epochs": metrics, "test_accuracy": accuracy, "ranks": comm.size,
            "memory_bytes": memories, "bytes_sent_per_step": sent_per_step, "config": config})
    if lead:
        print(f"test accuracy: {accuracy:.2%} ({round(accuracy * len(data.y_test))}"
              f"/{len(data.y_test)})", flush=True)
    return {"epochs": metrics, "test_accuracy": accuracy}


class Timeline:
    """With --timeline DIR: the first `TIMELINE_STEPS` steps traced (comm.trace, with spans
    for forward, backward and the optimizer), then written to DIR/timeline.json."""

    def __init__(self, comm: Communicator, folder: Path | None) -> None:
        self.comm, self.folder, self.steps = comm, folder, 0
        self.tracing = ExitStack()
        self.records = None if folder is None else self.tracing.enter_context(comm.trace())

    def stepped(self) -> None:
        """One more step done: write once there are enough. Collective, like every step."""
        if self.records is not None:
            self.steps += 1
            if self.steps == TIMELINE_STEPS:
                self.write()

    def write(self) -> None:
        """Stop tracing and write what was traced (a run shorter than the timeline's steps
        writes at its end). Collective."""
        if self.records is None:
            return
        records, self.records = self.records, None
        self.tracing.close()
        if self.comm.rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
        self.comm.write_timeline(str(self.folder / "timeline.json"), records)


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
