"""ringcc under PyTorch: a torch.distributed backend, process groups and DDP communication hooks.

    import collectives.torch                          # registers the backend "ringcc"
    collectives.torch.init_process_group()            # under mpiexec: the default group
    model = DistributedDataParallel(model)            # gradients averaged by ringcc

(CPU tensors, or CUDA ones: the default group makes a communicator on the GPU at its first
CUDA call.)

or keep the process group you have and let ringcc average DDP's gradient buckets:

    comm = collectives.init()
    ddp.register_comm_hook(comm, collectives.torch.allreduce_hook)

How it fits. PyTorch takes a process group written in Python: a subclass of
`torch.distributed.ProcessGroup` whose methods (`allreduce`, `allgather`, ...) receive tensors
and options and return a `Work`. torch.distributed's functions, and DDP's C++ reducer, call
those methods. Here each one views its tensors as NumPy arrays that share their memory
(`Tensor.numpy()`: no copy for a contiguous tensor), runs the ringcc collective on the
communicator's progress thread (`Communicator.submit`: calls run in the order they were
made), and returns a `Work` whose future completes when the collective has. So
`async_op=True` returns at once, and DDP's buckets are averaged while backward goes on. A
blocking call (`async_op=False`, which torch says in the call's options) on a CPU
communicator runs on the caller's thread instead, in its turn: handing it over and back cost
more than the call itself on small tensors. DDP
on the default group also needs `allgather` and `broadcast`: before training it checks,
through them, that every rank holds the same parameters (C++
`verify_params_across_processes`), and a group without them fails
with "No backend type associated with device type cpu".

A call made on the communicator itself, from the thread that makes the torch calls, queues
behind them (work.py). Since the calls run one after another, a send, which waits for its
receiver (checked point-to-point calls do), holds every call queued behind it: pair sends and
receives so that each send's receiver comes.
The progress threads end at exit, before the interpreter finalizes (`_stop_progress`).
PyTorch stays optional: nothing else in ringcc imports it.
"""

import atexit
import os
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable

import numpy
import torch
import torch.distributed as dist

import collectives

from transports.errors import (CollectiveError, CollectiveTimeoutError, InvalidArgumentError,
                               InvalidTypeError)

from .arrays import module_for_device, tensor_memory
from .communicator import Communicator

BACKEND = "ringcc"
OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
       dist.ReduceOp.MAX: "max", dist.ReduceOp.AVG: "avg"}


_served: "weakref.WeakSet[Communicator]" = weakref.WeakSet()  # communicators torch has used


@atexit.register
def _stop_progress() -> None:
    # A thread still alive when the interpreter finalizes is torn down inside torch's C++ and
    # aborts the process ("terminate called without an active exception"): end them first.
    for comm in list(_served):
        if comm._broken is not None:  # its calls may never be joined: their waits stop
            comm._transport.abandon("the process is ending")
        comm.wait_all()


def run(comm: Communicator, call: Callable[[], Any]) -> torch.futures.Future:
    """Run `call` on `comm`'s progress thread (`Communicator.submit`), after every call made
    before it; a torch Future of its result."""
    future: torch.futures.Future = torch.futures.Future()

    def settle() -> None:
        try:
            future.set_result(call())
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(error)

    _served.add(comm)
    comm.submit(settle)
    return future


class FutureWork(dist.Work):
    """A call under way on the progress thread, as torch.distributed sees it: `wait` raises
    what the call raised (a mismatch, a timeout), as Gloo's work does. (torch's own work made
    from a future returns from `wait` whatever the future holds, so a failed call would look
    done.)"""

    def __init__(self, future: torch.futures.Future, comm: Communicator) -> None:
        super().__init__()
        self._future = future
        self._comm = comm

    def _refuse_on_progress_thread(self) -> None:
        """A callback (`then`) runs on the progress thread: waiting there for a call queued
        behind it would wait for ever (as `Work.wait` refuses)."""
        if not self._future.done() and self._comm._progress.on_thread():
            raise InvalidArgumentError("a call waited for on the progress thread (from a "
                                       "callback) that is queued behind the one running there: "
                                       "wait for it after that call has returned")

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the call, and raise what it raised. With a `timeout` (not 0, torch's "no
        timeout"), a CollectiveTimeoutError once it has passed, as Gloo's work raises; the
        call goes on."""
        self._refuse_on_progress_thread()
        if timeout and not self._future.done():
            finished = threading.Event()
            self._future.add_done_callback(lambda _: finished.set())
            if not finished.wait(timeout.total_seconds()):
                raise CollectiveTimeoutError(f"the call did not complete within "
                                             f"{timeout.total_seconds():g} s")
        self._future.wait()  # raises the call's error
        return True

    def result(self) -> list[torch.Tensor]:
        """The call's output tensors, once it has run (as Gloo's work gives them)."""
        self._refuse_on_progress_thread()
        return _tensors_in(self._future.wait())

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        if not self._future.done():
            return None
        try:
            self._future.wait()
        except BaseException as error:  # noqa: BLE001 - what the call raised
            return error
        return None

    def get_future(self) -> torch.futures.Future:
        return self._future


class DoneWork(dist.Work):
    """A call that has already run, on the caller's thread (`ProcessGroup._work`), as
    torch.distributed sees it: `wait` raises what the call raised, as `FutureWork`'s does. Its
    future is made only if asked for (making and setting one cost the call a few
    microseconds)."""

    def __init__(self, result: Any, error: BaseException | None) -> None:
        super().__init__()
        self._result = result
        self._error = error

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._error is not None:
            raise self._error
        return True

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return _tensors_in(self._result)

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        if self._error is not None:
            future.set_exception(self._error)
        else:
            future.set_result(self._result)
        return future


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a call's result (a tensor, or lists of them), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value or () for t in _tensors_in(item)]


def _counts_matrix(comm: Communicator, sends: list[int]) -> list[list[int]]:
    """What every rank sends every rank, in elements (row r: rank r's `sends`), by an
    all-gather: the same on every rank. Collective."""
    xp = module_for_device(comm.device)
    return comm.all_gather(xp.asarray(sends, xp.int64)).tolist()


def as_array(tensor: torch.Tensor, call: str) -> Any:
    """The NumPy array that shares a CPU `tensor`'s memory (a CuPy one, through DLPack, for a
    CUDA tensor, which a communicator with device "cuda" moves); InvalidTypeError naming
    `call` if there is none (another device, or a dtype NumPy lacks)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidTypeError(f"{call}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cpu:
        if tensor.is_cuda:
            return tensor_memory(tensor.detach() if tensor.requires_grad else tensor)
        raise InvalidTypeError(f"{call}: the ringcc backend moves CPU and CUDA tensors; got "
                               f"one on {tensor.device}")
    try:  # (detach only when needed: it costs a new tensor on every call)
        return (tensor.detach() if tensor.requires_grad else tensor).numpy()
    except TypeError as error:  # bfloat16 and the like
        raise InvalidTypeError(f"{call}: ringcc cannot move {tensor.dtype} tensors "
                               f"({error})") from None


def reduce_op(op: Any, call: str) -> str:
    """ringcc's name for a torch ReduceOp; InvalidArgumentError naming `call` if it has none."""
    for torch_op, name in OPS.items():
        if op == torch_op:
            return name
    raise InvalidArgumentError(f"{call}: the ringcc backend reduces with SUM, PRODUCT, MIN, "
                               f"MAX and AVG, not {op}")


class ProcessGroup(dist.ProcessGroup):
    """The ranks of a ringcc Communicator as a torch.distributed process group.

    A communicator moves one device's arrays. The group moves `comm`'s device's tensors, and,
    when it was given `make`, the other device's too, through a communicator over the same
    ranks that `make(device)` returns the first time such a tensor comes (every rank makes the
    same calls in the same order, so every rank makes it at the same call)."""

    def __init__(self, comm: Communicator, make: Callable[[str], Communicator] | None = None,
                 release: Callable[[], None] | None = None) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self._comms = {comm.device: comm}
        self._make = make
        self._release = release  # a group torch made: closes what it made (`shutdown`)
        self._group_name = ""

    def getBackendName(self) -> str:  # noqa: N802 - PyTorch's name
        return BACKEND

    @property
    def group_name(self) -> str:
        """The name it has in torch.distributed's tables (`process_group`); torch's own
        groups keep theirs in their backends, which a group written in Python has none of."""
        return self._group_name

    def shutdown(self) -> None:
        """What `dist.destroy_process_group` calls. A group torch made on the ringcc backend
        closes the communicators it made, which nothing else holds (each keeps its shared or
        device memory until closed); one from `process_group(comm)` leaves `comm` to its
        maker."""
        if self._release is not None:
            release, self._release = self._release, None
            try:
                for comm in self._comms.values():
                    comm.close()
            finally:
                release()

    def _comm_for(self, tensor: torch.Tensor, call: str) -> Communicator:
        """The communicator that moves `tensor`'s device's arrays; InvalidTypeError naming
        `call` if this group has none."""
        device = "cuda" if isinstance(tensor, torch.Tensor) and tensor.is_cuda else "cpu"
        comm = self._comms.get(device)
        if comm is None:
            if self._make is None:
                raise InvalidTypeError(
                    f"{call}: this group's communicator moves {self.comm.device} tensors, not "
                    f"{device} ones; make the group over collectives.init(device={device!r})")
            comm = self._comms[device] = self._make(device)
        return comm

    def _work(self, comm: Communicator, call: Callable[[], Any], result: Any,
              opts: Any = None) -> dist.Work:
        """`call` as a torch `Work` that gives `result`: run on the progress thread, or, where
        torch waits for it at once (`opts.asyncOp` false: `async_op=False`), here in its turn
        (`Progress.call_in_turn`: behind the calls still queued, and ahead of any made
        meanwhile), with nothing to hand over: an 8 B `dist.all_reduce` took 116-121 us
        through the thread, against 8 us for the call itself (docs/performance.md, "Blocking
        torch calls run where they are made"). A GPU communicator's calls stay on its thread,
        whose device and stream are set for them."""
        def done() -> Any:
            call()
            return result
        if opts is None or getattr(opts, "asyncOp", True):
            return FutureWork(run(comm, done), comm)
        _served.add(comm)  # (its thread, should it start for a call queued meanwhile)
        try:
            comm._progress.call_in_turn("a blocking torch call", call)
        except BaseException as error:  # noqa: BLE001 - raised by `wait`, as on the thread
            return DoneWork(None, error)
        return DoneWork(result, None)

    # ---- the collectives: each checks its arguments here, and moves data in the background

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        comm = self._comm_for(tensors[0], "all_reduce")
        op = reduce_op(opts.reduceOp, "all_reduce")
        arrays = [as_array(t, "all_reduce") for t in tensors]
        return self._work(comm, lambda: [comm.all_reduce(a, a, op=op) for a in arrays], tensors,
                          opts)

    def allgather(self, output_tensors: list[list[torch.Tensor]],
                  input_tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        comm = self._comm_for(input_tensors[0], "all_gather")
        inputs = [as_array(t, "all_gather") for t in input_tensors]
        outputs = [[as_array(t, "all_gather") for t in outs] for outs in output_tensors]

        def gather() -> None:
            for mine, outs in zip(inputs, outputs):
                for out, block in zip(outs, comm.all_gather(mine)):
                    out[...] = block
        return self._work(comm, gather, output_tensors, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any) -> dist.Work:
        comm = self._comm_for(input, "all_gather_into_tensor")
        mine, out = as_array(input, "all_gather_into_tensor"), \
            as_array(output, "all_gather_into_tensor")
        if out.size != mine.size * comm.size or not out.flags.c_contiguous:
            raise InvalidArgumentError(f"all_gather_into_tensor: the output must be contiguous "
                                       f"and hold {comm.size} x {mine.size} elements, got "
                                       f"{out.size}" + ("" if out.flags.c_contiguous
                                                        else ", not contiguous"))
        blocks = out.reshape(comm.size, *mine.shape)  # a view: gathered in place
        return self._work(comm, lambda: comm.all_gather(mine, blocks), output, opts)

    _allgather_base = all_gather_single  # the name before PyTorch 2.13

    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        comm = self._comm_for(output_tensors[0], "reduce_scatter")
        op = reduce_op(opts.reduceOp, "reduce_scatter")
        outputs = [as_array(t, "reduce_scatter") for t in output_tensors]
        inputs = [[as_array(t, "reduce_scatter") for t in ins] for ins in input_tensors]

        xp = module_for_device(comm.device)

        def scatter() -> None:
            for out, ins in zip(outputs, inputs):
                comm.reduce_scatter(xp.stack(ins), out, op=op)
        return self._work(comm, scatter, output_tensors, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any) -> dist.Work:
        comm = self._comm_for(input, "reduce_scatter_tensor")
        op = reduce_op(opts.reduceOp, "reduce_scatter_tensor")
        out, whole = as_array(output, "reduce_scatter_tensor"), \
            as_array(input, "reduce_scatter_tensor")
        if whole.size != out.size * comm.size:
            raise InvalidArgumentError(f"reduce_scatter_tensor: the input must hold "
                                       f"{comm.size} x {out.size} elements, got "
                                       f"{whole.size}")
        blocks = whole.reshape(comm.size, *out.shape)
        return self._work(comm, lambda: comm.reduce_scatter(blocks, out, op=op), output, opts)

    _reduce_scatter_base = reduce_scatter_single  # the name before PyTorch 2.13

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        comm = self._comm_for(tensors[0], "broadcast")
        arrays = [as_array(t, "broadcast") for t in tensors]
        root = opts.rootRank
        return self._work(comm, lambda: [comm.broadcast(a, root=root) for a in arrays], tensors,
                          opts)

    def scatter(self, output_tensors: list[torch.Tensor],
                input_tensors: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        comm = self._comm_for(output_tensors[0], "scatter")
        root = opts.rootRank
        out = as_array(output_tensors[0], "scatter")
        xp = module_for_device(comm.device)
        blocks = xp.stack([as_array(t, "scatter") for t in input_tensors[0]]) \
            if comm.rank == root else None
        return self._work(comm, lambda: comm.scatter(blocks, out, root=root), output_tensors,
                          opts)

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._work(self.comm, self.comm.barrier, None, opts)

    def gather(self, output_tensors: list[list[torch.Tensor]],
               input_tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        comm = self._comm_for(input_tensors[0], "gather")
        root = opts.rootRank
        mine = as_array(input_tensors[0], "gather")
        outs = [as_array(t, "gather") for t in output_tensors[0]] \
            if comm.rank == root else []

        def gather() -> None:
            blocks = comm.gather(mine, root=root)
            for out, block in zip(outs, blocks if blocks is not None else []):
                out[...] = block
        return self._work(comm, gather, output_tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        comm = self._comm_for(tensors[0], "reduce")
        op, root = reduce_op(opts.reduceOp, "reduce"), opts.rootRank
        arrays = [as_array(t, "reduce") for t in tensors]

        def reduce() -> None:
            for array in arrays:
                result = comm.reduce(array, op=op, root=root)
                if result is not None:  # the root's tensor takes the result, as in PyTorch
                    array[...] = result
        return self._work(comm, reduce, tensors, opts)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts: Any) -> dist.Work:
        comm = self._comm_for(input, "all_to_all_single")
        size = comm.size
        out, mine = as_array(output, "all_to_all_single"), as_array(input, "all_to_all_single")
        if not out.flags.c_contiguous:  # (its results would land in a flat copy)
            raise InvalidArgumentError("all_to_all_single: the output tensor must be contiguous")
        if not input_split_sizes and not output_split_sizes \
                and (mine.size % size or out.size != mine.size):
            raise InvalidArgumentError(f"all_to_all_single: {mine.size} and {out.size} "
                                       f"elements do not cut into {size} equal blocks")
        row = int(numpy.prod(mine.shape[1:]))  # splits count rows of the first dimension
        for splits, tensor, name in ((input_split_sizes, mine, "input"),
                                     (output_split_sizes, out, "output")):
            if splits and (len(splits) != size or sum(splits) != tensor.shape[0]):
                raise InvalidArgumentError(
                    f"all_to_all_single: {name}_split_sizes {list(splits)} must hold {size} "
                    f"counts of rows that sum to the {name}'s {tensor.shape[0]} rows")
        sends = [count * row for count in input_split_sizes] if input_split_sizes \
            else [mine.size // size] * size

        def exchange() -> None:
            # Another rank may split where this one does not: every rank says what it sends,
            # and all choose from the whole matrix of counts (MPI's Alltoallv, as ringcc
            # checks it): equal blocks everywhere, or the uneven call.
            matrix = _counts_matrix(comm, sends)
            if len({count for counts in matrix for count in counts}) == 1:
                comm.all_to_all(mine.reshape(size, -1), out.reshape(size, -1))
            else:
                comm.all_to_all(mine.reshape(-1), out.reshape(-1), counts=matrix)
        return self._work(comm, exchange, output, opts)

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any) -> dist.Work:
        comm = self._comm_for(input_tensors[0], "all_to_all")
        outs = [as_array(t, "all_to_all") for t in output_tensors]
        ins = [as_array(t, "all_to_all") for t in input_tensors]
        xp = module_for_device(comm.device)

        def exchange() -> None:
            # Every rank learns what every rank sends, and all choose alike (as above).
            matrix = _counts_matrix(comm, [a.size for a in ins])
            if len({count for counts in matrix for count in counts}) == 1:
                received = comm.all_to_all(xp.stack(ins))
            else:
                flat = comm.all_to_all(xp.concatenate([a.reshape(-1) for a in ins]),
                                       counts=matrix)
                bounds = numpy.cumsum([0] + [a.size for a in outs])
                received = [flat[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
            for out, block in zip(outs, received):
                out[...] = block.reshape(out.shape)
        return self._work(comm, exchange, output_tensors, opts)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work:  # noqa: N803
        self._untagged(tag, "send")
        comm = self._comm_for(tensors[0], "send")
        arrays = [as_array(t, "send") for t in tensors]
        return self._work(comm, lambda: [comm.send(a, dstRank) for a in arrays], tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work:  # noqa: N803
        self._untagged(tag, "recv")
        comm = self._comm_for(tensors[0], "recv")
        arrays = [as_array(t, "recv") for t in tensors]
        return self._work(comm, lambda: [comm.recv(a, srcRank) for a in arrays], tensors)

    # ---- what ringcc does not offer: a clear error rather than PyTorch's own --------------

    def _unsupported(self, call: str) -> None:
        raise NotImplementedError(f"the ringcc backend does not implement {call}")

    def _untagged(self, tag: int, call: str) -> None:
        """Messages between two ranks arrive in the order they were sent, whatever their tag:
        a tag that would pick another one is refused, not ignored."""
        if tag != 0:
            self._unsupported(f"{call} with a tag ({tag}): messages between two ranks arrive "
                              f"in the order they are sent")

    def recv_anysource(self, *args: Any) -> dist.Work:
        self._unsupported("recv from any source")

    def allreduce_coalesced(self, *args: Any) -> dist.Work:
        self._unsupported("all_reduce_coalesced")


def process_group(comm: Communicator) -> ProcessGroup:
    """A torch.distributed process group over `comm`'s ranks, for
    `DistributedDataParallel(model, process_group=...)` or any `group=` argument: every rank
    of `comm` makes it, as `dist.new_group` is made, and `dist.destroy_process_group(group)`
    forgets it (the communicator stays the caller's to close).

    torch.distributed names ranks by their global rank (the default group's), and turns them
    into the group's through its own tables (`src=`, `dst=`, `dist.get_rank(group)`): so the
    group is entered there, with each rank's global rank gathered over `comm`. Without a
    default group a rank's global rank is its rank in `comm` (`dist.get_rank(group)` still
    needs a default group: torch asks that one for this process's rank)."""
    group = ProcessGroup(comm)
    if dist.is_initialized():
        xp = module_for_device(comm.device)  # (a communicator moves its device's arrays)
        global_ranks = comm.all_gather(xp.array(dist.get_rank(), xp.int64)).tolist()
    else:
        global_ranks = list(range(comm.size))
    _enter_group(group, {global_rank: rank for rank, global_rank in enumerate(global_ranks)},
                 f"{comm.device}:{BACKEND}")
    return group


_groups_made = 0  # groups entered in torch's tables, for their names


def _enter_group(group: ProcessGroup, ranks: dict[int, int], config: str) -> None:
    """Enter `group` in torch.distributed's tables as `dist.new_group` does (its backend and
    store, name, tag, and the global rank -> group rank map `ranks`), so that torch's
    functions that take ranks, and `destroy_process_group`, accept it."""
    global _groups_made
    from torch.distributed import distributed_c10d as c10d

    _groups_made += 1
    name = f"{BACKEND}:{_groups_made}"
    group._group_name = name
    world = c10d._world
    world.pg_map[group] = (BACKEND, dist.HashStore())
    world.pg_names[group] = name
    world.pg_backend_config[group] = config
    world.pg_group_ranks[group] = ranks
    tag = f"ptd:{name}"
    world.tags_to_pg.setdefault(tag, []).append(group)
    world.tags_to_pg.setdefault("", []).append(group)
    world.pg_to_tag[group] = tag
    c10d._register_process_group(name, group)  # (found by name by functional collectives)


def _create(options: Any, backend_options: Any = None) -> ProcessGroup:
    """What torch.distributed calls for a group on the ringcc backend (with its extended
    arguments): for `dist.init_process_group("ringcc")` a group over every rank of the MPI job,
    which must be the ranks torch was told of; for `dist.new_group(ranks)` a group over those
    ranks of the job, made by them alone (torch calls this on the group's ranks only, so
    through `MPI_Comm_create_group`, collective over the group). Global ranks are then MPI's,
    as the default group, on ringcc, checked when it was made."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = options.group_rank, options.group_size
    ranks = list(options.global_ranks_in_group)  # [] for the default group
    seconds = options.timeout.total_seconds() if options.timeout else None
    if ranks and dist.get_backend() != BACKEND:  # (the same on every rank: all refuse)
        raise CollectiveError(f"a group on the ringcc backend over ranks {ranks} needs the "
                              f"default group on it too, whose ranks are the MPI job's; over "
                              f"the {dist.get_backend()} default group, make it with "
                              f"collectives.torch.process_group(collectives.init(comm=sub))")
    if ranks:
        everyone = world.Get_group()
        members = world.Create_group(everyone.Incl(ranks))
        everyone.Free()
    else:
        members = world
    comm = collectives.init(comm=members, timeout=seconds)
    if (comm.rank, comm.size) != (rank, size):
        found = (comm.rank, comm.size)
        comm.close()
        raise CollectiveError(f"torch.distributed says rank {rank} of {size}, but MPI says rank "
                              f"{found[0]} of {found[1]}: the ringcc backend's default group "
                              f"spans the ranks of the MPI job, in their order")
    # CUDA tensors, when they come, over a communicator on the GPU (cuda_ipc on one node).
    return ProcessGroup(comm, make=lambda device: collectives.init(comm=members, device=device,
                                                                   timeout=seconds),
                        release=lambda: members.Free() if ranks and not MPI.Is_finalized()
                        else None)


def init_process_group(**options: Any) -> None:
    """`dist.init_process_group("ringcc")` with rank and size from MPI, under mpiexec. ringcc
    needs no rendezvous of torch's, so without MASTER_ADDR an in-process store stands in."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    options.setdefault("rank", world.Get_rank())
    options.setdefault("world_size", world.Get_size())
    if "init_method" not in options and "MASTER_ADDR" not in os.environ:
        options.setdefault("store", dist.HashStore())
    dist.init_process_group(BACKEND, **options)


# ---- DDP communication hooks ----------------------------------------------------------------
# (Their annotations are checked by DDP, so this module evaluates annotations, as PyTorch's own
# hooks do.)

def allreduce_hook(comm: Communicator,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients over `comm`'s ranks in the background: DDP goes on with
    backward meanwhile, as it does with its own backends.
    `ddp.register_comm_hook(comm, allreduce_hook)`."""
    buffer = bucket.buffer()
    grads = as_array(buffer, "allreduce_hook")

    def average() -> torch.Tensor:
        comm.all_reduce(grads, grads, op="avg")
        return buffer
    return run(comm, average)


def fp16_compress_hook(comm: Communicator,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """`allreduce_hook` with float16 on the wire, half the bytes: the bucket is divided by the
    number of ranks and cast down, summed, and cast back, as PyTorch's own hook does."""
    buffer = bucket.buffer()
    compressed = buffer.div(comm.size).to(torch.float16)
    half = as_array(compressed, "fp16_compress_hook")

    def average() -> torch.Tensor:
        comm.all_reduce(half, half, op="sum")
        buffer.copy_(compressed)
        return buffer
    return run(comm, average)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
