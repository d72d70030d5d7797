"""Training throughput and memory: this trainer's DDP, ZeRO-1 and ZeRO-2, and PyTorch DDP beside
them (on Gloo, on ringcc's torch.distributed backend, and on Gloo with ringcc's allreduce_hook).

    OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python -m benchmarks.trainer --compare torch
    OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python -m benchmarks.trainer --optimizer adam
    mpiexec -n 2 python -m benchmarks.trainer --device cuda --compare torch --zero 0

All train the same MLP (784-1024-1024-10, float32, the same initial weights) with the same
optimizer (SGD with momentum by default) on synthetic MNIST-shaped batches of `--batch` samples
per rank, in the same job, in alternating rounds so that all see the same machine. Per trainer
it prints:

samples/s   samples trained per second by all ranks together
step        time per step (forward, backward with gradient averaging, optimizer step),
            the slowest rank's, the median over rounds
compute     the same steps with the collectives switched off (`no_sync`, and under ZeRO
            no all-gather): the work that communication adds to
comm share  (step - compute) / step: the part of a step that communication costs, whatever
            overlap hides
params, grads, optimizer
            the megabytes rank 0 keeps for parameters, gradients and optimizer state

The PyTorch rows train the same model from the same start on the same batches, so they must
end with the same parameters: a check line gives each ringcc row's relative difference from
"torch DDP (gloo)" after all the steps (at most 1e-5, else the exit status is 1), and closing
lines give each row's steps per second over Gloo's.

For this trainer it also prints `in collectives`, the time per step spent inside all-reduce
(DDP) or reduce-scatter and all-gather (ZeRO) calls; with overlap the gradients' part runs on
the communication thread, beside backward. ZeRO-2 keeps two buckets of gradients and the
shard, so it runs with buckets of `--zero2-bucket-mb`, small beside the model. On more than one
rank, a last row times this trainer's DDP on rank 0 alone (a one-rank communicator) while the
other ranks wait: the one-rank baseline, measured in the same job as the N-rank numbers, so
the scaling ratio is not at the mercy of whatever else the machine ran in between.
`--profile` prints where rank 0's main thread spent the timed steps of this trainer's DDP.

With `--device cuda` every trainer runs on the GPU (rank r on GPU r mod count): this trainer
on CuPy arrays over a `device="cuda"` communicator (cuda_ipc on one node), the PyTorch rows on
CUDA tensors, Gloo copying them through host memory as it does, ringcc's rows moving them
where they lie. A timed round ends when the device has finished its work.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator

import numpy
from mpi4py import MPI

import collectives
from trainer.data import synthetic
from trainer.compress import GRAD_DTYPES
from trainer.ddp import DistributedDataParallel
from trainer.nn import MLP
from trainer.optim import OPTIMIZERS, SGD, Adam, LAMB, Optimizer
from trainer.tensor import Tensor, cross_entropy
from trainer.zero import ShardedOptimizer, ZeroDataParallel
from transports import registry

SIZES = [784, 1024, 1024, 10]
ALONE = "ringcc, rank 0 alone"
TORCH_GLOO = "torch DDP (gloo)"
PARAMS_RTOL = 1e-5  # torch DDP on ringcc must end where torch DDP on Gloo does, up to this


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=("torch",), action="append", default=[],
                        help="also measure PyTorch DDP on Gloo, on ringcc's torch.distributed "
                             "backend, and on Gloo with ringcc's allreduce_hook")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the median is shown)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--transport", default="auto", choices=["auto", *registry.names()],
                        help="the ringcc rows' transport (with --device cuda: cuda_ipc or mpi)")
    parser.add_argument("--device", choices=collectives.DEVICES, default="cpu",
                        help="where the models and the gradients live")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                        help="SGD with momentum (lr 0.01), Adam (lr 0.001; PyTorch's AdamW) or "
                             "LAMB (lr 0.005; PyTorch has none)")
    parser.add_argument("--zero", type=stages, default=[0, 1, 2],
                        help="the ZeRO stages of this trainer to time, comma separated "
                             "(0 is DDP)")
    parser.add_argument("--grad-dtype", choices=GRAD_DTYPES, default="float32",
                        help="the dtype this trainer's gradients travel in")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="for the trainers")
    parser.add_argument("--zero2-bucket-mb", type=float, default=1.0,
                        help="ZeRO-2's buckets: its gradient memory is two of them and a shard")
    parser.add_argument("--no-overlap", action="store_true", help="this trainer's overlap off")
    parser.add_argument("--profile", action="store_true",
                        help="profile rank 0's main thread during this trainer's steps")
    args = parser.parse_args(argv)
    if min(args.batch, args.steps, args.rounds) < 1 or args.warmup < 0:
        parser.error("--batch, --steps and --rounds must be at least 1, --warmup at least 0")
    if not (args.bucket_mb > 0 and args.zero2_bucket_mb > 0):  # (NaN too)
        parser.error("--bucket-mb and --zero2-bucket-mb must be more than 0")
    return args


def stages(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    found = [int(part) for part in text.split(",")]
    if not found or any(stage not in (0, 1, 2) for stage in found):
        raise argparse.ArgumentTypeError(f"expected ZeRO stages among 0,1,2; got {text!r}")
    return found


def make_optimizer(name: str, params: list[Tensor]) -> Optimizer:
    if name == "sgd":
        return SGD(params, lr=0.01, momentum=0.9)
    return Adam(params, lr=0.001) if name == "adam" else LAMB(params, lr=0.005)


class Ours:
    """This trainer: MLP + DistributedDataParallel (stage 0) or ZeRO + the optimizer."""

    def __init__(self, comm: collectives.Communicator, args: argparse.Namespace,
                 stage: int = 0) -> None:
        self.model = MLP(SIZES, seed=0, xp=collectives.module_for_device(comm.device))
        options = dict(overlap=not args.no_overlap, grad_dtype=args.grad_dtype)
        if stage == 0:
            self.ddp = DistributedDataParallel(self.model, comm, args.bucket_mb, **options)
            self.optimizer = self.local = make_optimizer(args.optimizer, self.model.parameters())
        else:
            bucket_mb = args.bucket_mb if stage == 1 else args.zero2_bucket_mb
            self.ddp = ZeroDataParallel(self.model, comm, stage, bucket_mb, **options)
            self.local = make_optimizer(args.optimizer, self.ddp.shards)
            self.optimizer = ShardedOptimizer(self.ddp, self.local)
        self.syncing = True
        self.name = f"ringcc:{comm.transport}" + (f" ZeRO-{stage}" if stage else "") + \
            (f" ({bucket_mb:g} MB)" if stage == 2 else "") + \
            (" (no overlap)" if args.no_overlap else "")

    def step(self, x: numpy.ndarray, y: numpy.ndarray) -> None:
        self.optimizer.zero_grad()
        cross_entropy(self.ddp(Tensor(x)), y).backward()
        (self.optimizer if self.syncing else self.local).step()  # ZeRO: no all-gather

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.syncing = False
        with self.ddp.no_sync():
            yield
        self.syncing = True

    def memory(self) -> list[float]:
        held = {**self.ddp.memory_bytes(), "optimizer_state": self.optimizer.state_bytes()}
        return [held["parameters"], held["gradients"], held["optimizer_state"]]

    def comm_seconds(self) -> float:
        return self.ddp.comm_seconds

    def parameters(self) -> list[numpy.ndarray]:
        return [collectives.to_numpy(p.data) for p in self.model.parameters()]

    def close(self) -> None:
        self.ddp.close()


class Torch:
    """PyTorch: nn.Sequential + DistributedDataParallel + optim.SGD (or AdamW), one thread a
    rank, on `args.device`. DDP runs over `group` (None: the default group, Gloo's), with
    `hook` registered on `hook_comm` when given."""

    def __init__(self, name: str, initial: dict[str, numpy.ndarray], args: argparse.Namespace,
                 group: Any = None, hook: Callable | None = None,
                 hook_comm: collectives.Communicator | None = None) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as TorchDDP

        self.name, self.torch = name, torch
        layers: list[Any] = []
        for i, (n_in, n_out) in enumerate(zip(SIZES, SIZES[1:])):
            linear = torch.nn.Linear(n_in, n_out)
            with torch.no_grad():  # the same start as ours (ours stores weights transposed)
                linear.weight.copy_(torch.from_numpy(initial[f"layers.{2 * i}.weight"].T))
                linear.bias.copy_(torch.from_numpy(initial[f"layers.{2 * i}.bias"]))
            layers += [linear, torch.nn.ReLU()]
        self.cuda = args.device == "cuda"
        model = torch.nn.Sequential(*layers[:-1]).to("cuda" if self.cuda else "cpu")
        self.model = TorchDDP(model, process_group=group, bucket_cap_mb=args.bucket_mb)
        if hook is not None:
            self.model.register_comm_hook(hook_comm, hook)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9) \
            if args.optimizer == "sgd" else torch.optim.AdamW(self.model.parameters(), lr=0.001,
                                                              weight_decay=0.0)

    def step(self, x: Any, y: Any) -> None:
        # The batches are NumPy arrays, or CuPy ones on the GPU: tensors over their memory.
        as_tensor = self.torch.from_dlpack if self.cuda else self.torch.from_numpy
        self.optimizer.zero_grad()
        loss = self.torch.nn.functional.cross_entropy(self.model(as_tensor(x)), as_tensor(y))
        loss.backward()
        self.optimizer.step()

    def no_sync(self) -> Any:
        return self.model.no_sync()

    def comm_seconds(self) -> float | None:
        return None

    def memory(self) -> None:
        return None

    def parameters(self) -> list[numpy.ndarray]:
        return [p.detach().cpu().numpy() for p in self.model.parameters()]

    def close(self) -> None:
        pass  # the process groups are the job's: closed once, after every trainer


def torch_trainers(initial: dict[str, numpy.ndarray], args: argparse.Namespace,
                   stack: ExitStack) -> list[Torch]:
    """PyTorch DDP on Gloo (the default group), on ringcc's torch.distributed backend, and on
    Gloo with ringcc's allreduce_hook averaging the buckets: the same model and start. The
    ringcc rows share a communicator of their own (its calls run on that communicator's progress
    thread, never beside this trainer's)."""
    import collectives.torch

    from .peers import GlooPeer

    # The default group; 1 torch thread a rank; on the GPU, torch's device is the one ringcc
    # chose for this rank.
    stack.callback(GlooPeer(MPI.COMM_WORLD, args.device).close)
    theirs = stack.enter_context(collectives.init(transport=args.transport, device=args.device))
    return [Torch(TORCH_GLOO, initial, args),
            Torch("torch DDP on ringcc", initial, args,
                  group=collectives.torch.process_group(theirs)),
            Torch("torch DDP + ringcc hook", initial, args,
                  hook=collectives.torch.allreduce_hook, hook_comm=theirs)]


def slowest(comm: collectives.Communicator, seconds: float) -> float:
    """The largest of every rank's `seconds` (also lines the ranks up for the next timing)."""
    return float(comm.all_reduce(numpy.array([seconds]), op="max")[0])


def timed(comm: collectives.Communicator, steps: int, step: Callable[[int], None] | None,
          profile: cProfile.Profile | None = None,
          finish: Callable[[], None] = lambda: None) -> float:
    """Seconds per step of `steps` calls of `step`, then `finish` (the device's work done),
    the slowest rank's. A rank whose `step` is None sits the round out, waiting (mostly
    asleep) for the others."""
    comm.barrier()
    if step is None:
        return slowest(comm, 0.0) / steps
    if profile is not None:
        profile.enable()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    finish()
    elapsed = time.perf_counter() - start
    if profile is not None:
        profile.disable()
    return slowest(comm, elapsed) / steps


def in_sync(comm: collectives.Communicator, params: list[numpy.ndarray]) -> bool:
    """Whether every rank holds bitwise the same parameters (the check before the numbers)."""
    mine = numpy.concatenate([p.reshape(-1) for p in params]).view(numpy.uint32)
    digest = numpy.array([mine.sum(dtype=numpy.uint64), (mine * numpy.uint32(2654435761))
                          .sum(dtype=numpy.uint64)])
    everyone = comm.all_gather(digest)
    return bool((everyone == everyone[0]).all())


def relative_difference(comm: collectives.Communicator, params: list[numpy.ndarray],
                        reference: list[numpy.ndarray]) -> float:
    """|params - reference| / |reference| (Euclidean norms over every parameter), the largest
    over ranks."""
    mine, theirs = (numpy.concatenate([p.reshape(-1) for p in ps]).astype(numpy.float64)
                    for ps in (params, reference))
    here = numpy.linalg.norm(mine - theirs) / numpy.linalg.norm(theirs)
    return float(comm.all_reduce(numpy.array([here]), op="max")[0])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    on_gpu = args.device == "cuda"
    # `comm` times and checks, on the host; `work` is what this trainer averages over.
    with collectives.init(transport="auto" if on_gpu else args.transport) as comm, \
            ExitStack() as stack:
        try:
            work = stack.enter_context(collectives.init(transport=args.transport,
                                                        device="cuda")) if on_gpu else comm
        except collectives.CollectiveError as error:  # no CuPy or no GPU, for one
            raise SystemExit(f"python -m benchmarks.trainer: {error}")
        xp = collectives.module_for_device(args.device)
        finish = xp.cuda.Device().synchronize if on_gpu else (lambda: None)
        say = print if comm.rank == 0 else (lambda *_, **__: None)
        data = synthetic(train=8 * args.batch, test=0, seed=comm.rank)
        batches = [(xp.asarray(data.x_train[i * args.batch:(i + 1) * args.batch]),
                    xp.asarray(data.y_train[i * args.batch:(i + 1) * args.batch]))
                   for i in range(8)]
        ours = [Ours(work, args, stage) for stage in args.zero]
        trainers: list[Any] = list(ours)
        notes = []
        if "torch" in args.compare:
            try:
                import torch.distributed  # noqa: F401 - only to know whether it is there
            except ImportError:
                notes.append("torch is not installed (pip install torch): comparison skipped")
            else:
                if args.optimizer == "lamb":
                    notes.append("PyTorch has no LAMB: comparison skipped")
                else:
                    initial = {name: collectives.to_numpy(value)
                               for name, value in ours[0].model.state_dict().items()}
                    trainers += torch_trainers(initial, args, stack)
        # The one-rank baseline, in the same job: rank 0 trains alone while the others wait.
        self_comm = collectives.init(transport=args.transport, comm=MPI.COMM_SELF,
                                     device=args.device) \
            if comm.size > 1 and comm.rank == 0 else None
        alone = None if self_comm is None else Ours(self_comm, args)
        say(f"# trainer benchmark: MLP {'-'.join(map(str, SIZES))} float32, {args.optimizer}, "
            f"{args.batch} samples per rank per step, {comm.size} rank(s), "
            f"bucket {args.bucket_mb:g} MB, {args.grad_dtype} gradients, device {args.device}"
            + (f" ({xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)['name'].decode()})"
               if on_gpu else ""))
        say(f"# {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up steps, "
            f"trainers taking turns; median over rounds; OPENBLAS_NUM_THREADS="
            f"{os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}")
        for note in notes:
            say(f"# {note}")

        def run(trainer: Any) -> Callable[[int], None] | None:
            return None if trainer is None else lambda i: trainer.step(*batches[i % len(batches)])

        for trainer in [*trainers, alone]:
            for i in range(args.warmup if trainer is not None else 0):
                run(trainer)(i)
        # Checked before the timed rounds: their compute-only steps let the ranks drift apart.
        synced = {t.name: in_sync(comm, t.parameters()) for t in trainers}
        profile = cProfile.Profile() if args.profile and comm.rank == 0 else None
        results: dict[str, dict[str, list[float]]] = {
            t.name: {"step": [], "compute": [], "collectives": []} for t in trainers}
        solo: list[float] = []
        for _ in range(args.rounds):
            for trainer in trainers:
                row = results[trainer.name]
                before = trainer.comm_seconds()
                row["step"].append(timed(comm, args.steps, run(trainer),
                                         profile if trainer is ours[0] else None, finish))
                if before is not None:
                    row["collectives"].append((trainer.comm_seconds() - before) / args.steps)
                with trainer.no_sync():
                    row["compute"].append(timed(comm, args.steps, run(trainer),
                                                finish=finish))
            if comm.size > 1:
                solo.append(timed(comm, args.steps, run(alone), finish=finish))
        memory = {t.name: t.memory() for t in trainers}
        # Every PyTorch row took the same steps on the same batches from the same start.
        torch_rows = trainers[len(ours):]
        apart = {t.name: relative_difference(comm, t.parameters(), torch_rows[0].parameters())
                 for t in torch_rows[1:]}
        for trainer in [*trainers, alone]:
            if trainer is not None:
                trainer.close()
        if self_comm is not None:
            self_comm.close()

        say("# check: parameters bitwise identical on every rank after the warm-up: " + ", ".join(
            f"{name} {'yes' if ok else 'NO'}" for name, ok in synced.items()))
        if apart:
            say(f"# check: parameters after all the steps, relative difference from {TORCH_GLOO}'s "
                f"(<= {PARAMS_RTOL:g}): " + ", ".join(
                    f"{name} {diff:.1e} {'yes' if diff <= PARAMS_RTOL else 'NO'}"
                    for name, diff in apart.items()))
        say(f"# {'trainer':<30} {'samples/s':>9} {'step ms':>8} {'compute ms':>10} "
            f"{'comm share':>10} {'in collectives ms':>17} {'params MB':>9} {'grads MB':>8} "
            f"{'optimizer MB':>12}")
        speed, steps = {}, {}
        for name, row in results.items():
            step, compute = statistics.median(row["step"]), statistics.median(row["compute"])
            speed[name], steps[name] = comm.size * args.batch / step, step
            inside = f"{statistics.median(row['collectives']) * 1e3:.2f}" \
                if row["collectives"] else "-"
            held = [f"{b / 1e6:.2f}" for b in memory[name]] if memory[name] else ["-"] * 3
            say(f"  {name:<30} {speed[name]:>9,.0f} {step * 1e3:>8.2f} {compute * 1e3:>10.2f} "
                f"{max(0.0, 1 - compute / step):>10.1%} {inside:>17} {held[0]:>9} "
                f"{held[1]:>8} {held[2]:>12}")
        first = ours[0].name
        if solo:
            step = statistics.median(solo)
            speed[ALONE] = args.batch / step
            say(f"  {ALONE:<30} {speed[ALONE]:>9,.0f} {step * 1e3:>8.2f} {step * 1e3:>10.2f} "
                f"{0.0:>10.1%} {'-':>17}")
            say(f"# {first} on {comm.size} ranks / rank 0 alone: "
                f"{speed[first] / speed[ALONE]:.2f}x samples/s")
        for other in ours[1:]:
            say(f"# {other.name} / {first}: {steps[other.name] / steps[first]:.2f}x step time")
        if torch_rows:
            for name in (first, *apart):
                say(f"# {name} / {TORCH_GLOO}: {speed[name] / speed[TORCH_GLOO]:.2f}x steps/s")
        if profile is not None:
            say(f"# profile of rank 0's main thread during {first}'s timed steps")
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    agree = all(diff <= PARAMS_RTOL for diff in apart.values())
    return 0 if all(synced.values()) and agree else 1


if __name__ == "__main__":
    sys.exit(main())
