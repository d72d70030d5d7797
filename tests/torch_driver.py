"""PyTorch on ringcc, on real ranks, for test_torch.py:

    mpiexec -n N python tests/torch_driver.py SCENARIO PORT

The default group is ringcc's backend; a Gloo group over the same ranks (through the same
TCP store on PORT) computes every reference in the same job. Each rank prints "<scenario> ok"
when every check has passed, and raises otherwise.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta

import numpy
import torch
import torch.distributed as dist
from torch import nn

import collectives
import collectives.torch as ringcc_torch


def values(rank: int, count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Data that depends on the rank and the index (multiples of 1/8: sums are exact)."""
    i = torch.arange(count, dtype=torch.float64)
    return (((i * 31 + rank * 17 + 5) % 23 - 11) / 8).to(dtype)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.equal(got, want), f"{what}: {got.tolist()} != {want.tolist()}"


def calls_scenario(gloo: dist.ProcessGroup) -> None:
    """Every call the backend serves, against Gloo's answer to the same call."""
    rank, size = dist.get_rank(), dist.get_world_size()
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        for dtype in (torch.float32, torch.float64, torch.int32):
            ours, theirs = values(rank, 37, dtype), values(rank, 37, dtype)
            dist.all_reduce(ours, op=op)
            dist.all_reduce(theirs, op=op, group=gloo)
            same(ours, theirs, f"all_reduce {op} {dtype}")
    ours = values(rank, 10).reshape(2, 5)[:, ::2]  # not contiguous: written back in place
    theirs = ours.clone()
    dist.all_reduce(ours, op=dist.ReduceOp.AVG)
    dist.all_reduce(theirs, group=gloo)
    same(ours, theirs / size, "all_reduce avg, strided")
    ours = values(rank, 1000)
    work = dist.all_reduce(ours, async_op=True)  # returns at once; done once waited for
    work.wait()
    same(ours, sum(values(r, 1000) for r in range(size)), "all_reduce, async_op=True")
    assert [t.data_ptr() for t in work.result()] == [ours.data_ptr()], "result(): its tensors"
    refused = []

    def waits_for_a_later_call(_: torch.futures.Future) -> None:  # on the progress thread
        try:
            dist.all_reduce(torch.ones(2), async_op=True).wait()
        except collectives.InvalidArgumentError as error:
            refused.append(str(error))
    gate = threading.Event()  # holds the progress thread until the callback is attached
    ringcc_torch.run(dist.group.WORLD.comm, gate.wait)
    future = dist.all_reduce(torch.ones(2), async_op=True).get_future()
    future = future.then(waits_for_a_later_call)
    gate.set()
    future.wait()
    assert refused and "queued behind the one running there" in refused[0], refused
    if size > 1:  # a wait with a timeout: rank 1 joins only once rank 0's wait has given up
        token = torch.zeros(1)
        if rank == 1:
            dist.recv(token, 0, group=gloo)
        work = dist.all_reduce(torch.ones(2), async_op=True)
        if rank == 0:
            try:
                work.wait(timeout=timedelta(milliseconds=50))
            except collectives.CollectiveTimeoutError as error:
                assert "did not complete within 0.05 s" in str(error), error
            else:
                raise AssertionError("wait(timeout) returned before the call could complete")
            dist.send(token, 1, group=gloo)
        work.wait()
        same(work.result()[0], torch.full((2,), float(size)), "all_reduce after a timed wait")

    ours = [torch.empty(7) for _ in range(size)]
    theirs = [torch.empty(7) for _ in range(size)]
    dist.all_gather(ours, values(rank, 7))
    dist.all_gather(theirs, values(rank, 7), group=gloo)
    for r in range(size):
        same(ours[r], theirs[r], "all_gather")
    single = torch.empty(size * 6)
    dist.all_gather_into_tensor(single, values(rank, 6))  # the group's all_gather_single
    same(single, torch.cat([values(r, 6) for r in range(size)]), "all_gather_into_tensor")

    blocks = [values(rank + j, 4) for j in range(size)]
    ours, theirs = torch.empty(4), torch.empty(4)
    dist.reduce_scatter(ours, blocks)
    dist.reduce_scatter(theirs, blocks, group=gloo)
    same(ours, theirs, "reduce_scatter")
    single = torch.empty(3)
    dist.reduce_scatter_tensor(single, values(rank, 3 * size), op=dist.ReduceOp.MAX)
    want = torch.stack([values(r, 3 * size) for r in range(size)]).amax(0)[3 * rank:3 * rank + 3]
    same(single, want, "reduce_scatter_tensor max")

    for root in range(size):
        ours = values(rank, 9, torch.float64)
        dist.broadcast(ours, src=root)
        same(ours, values(root, 9, torch.float64), f"broadcast from {root}")
        block = torch.empty(5, dtype=torch.int64)
        dist.scatter(block, [values(j, 5).to(torch.int64) * (root + 1) for j in range(size)]
                     if rank == root else None, src=root)
        same(block, values(rank, 5).to(torch.int64) * (root + 1), f"scatter from {root}")
    dist.barrier()

    for root in range(size):
        gathered = [torch.empty(4) for _ in range(size)] if rank == root else None
        dist.gather(values(rank, 4), gathered, dst=root)
        if rank == root:
            for r in range(size):
                same(gathered[r], values(r, 4), f"gather to {root}")
        ours = values(rank, 6)
        dist.reduce(ours, dst=root, op=dist.ReduceOp.MAX)
        if rank == root:
            same(ours, torch.stack([values(r, 6) for r in range(size)]).amax(0), "reduce max")
    ours, theirs = torch.empty(2 * size), torch.empty(2 * size)
    dist.all_to_all_single(ours, values(rank, 2 * size))
    dist.all_to_all_single(theirs, values(rank, 2 * size), group=gloo)
    same(ours, theirs, "all_to_all_single")
    splits = [(rank + j) % 3 for j in range(size)]  # rows rank sends to j
    incoming = [(r + rank) % 3 for r in range(size)]  # rows rank gets from r
    ours = torch.empty(sum(incoming), 2)
    theirs = torch.empty(sum(incoming), 2)
    data = values(rank, 2 * sum(splits)).reshape(-1, 2)
    dist.all_to_all_single(ours, data, incoming, splits)
    dist.all_to_all_single(theirs, data, incoming, splits, group=gloo)
    same(ours, theirs, "all_to_all_single, uneven")
    # Splits on some ranks only, even ones, then uneven on one rank: every rank chooses the
    # same call, from what all of them send.
    for odd in (False, True):
        sends = [2] * size if rank or not odd else [3] + [2] * (size - 1)
        splits = [] if rank == 0 and not odd else sends
        gets = [3 if r == 0 and odd and rank == 0 else 2 for r in range(size)]
        ours, theirs = torch.empty(sum(gets)), torch.empty(sum(gets))
        data = values(rank, sum(sends))
        dist.all_to_all_single(ours, data, gets if splits else [], splits)
        dist.all_to_all_single(theirs, data, gets, sends, group=gloo)
        same(ours, theirs, f"all_to_all_single, splits on some ranks{', uneven' if odd else ''}")
    try:
        dist.all_to_all_single(torch.empty(2 * size + 2), values(rank, 2 * size + 2),
                               [2] * size, [2] * size)
    except collectives.InvalidArgumentError as error:
        assert "must hold" in str(error), error
    else:
        raise AssertionError("split sizes that leave rows out went through")
    try:
        dist.all_to_all_single(torch.zeros(2, 2 * size).t(), values(rank, 4 * size))
    except collectives.InvalidArgumentError as error:
        assert "must be contiguous" in str(error), error
    else:
        raise AssertionError("a result went into a copy of a strided output")
    outs = [torch.empty(3) for _ in range(size)]
    dist.all_to_all(outs, [values(rank * size + j, 3) for j in range(size)])
    for r in range(size):
        same(outs[r], values(r * size + rank, 3), "all_to_all")
    if size > 1:  # a ring shift, sends and receives paired so that none waits on another
        box = torch.empty(5)
        if rank % 2 == 0:
            dist.send(values(rank, 5), (rank + 1) % size)
            dist.recv(box, (rank - 1) % size)
        else:
            dist.recv(box, (rank - 1) % size)
            dist.send(values(rank, 5), (rank + 1) % size)
        if size % 2 == 0 or rank != 0:
            same(box, values((rank - 1) % size, 5), "send/recv")

    try:
        dist.all_reduce_coalesced([torch.ones(2)])
    except NotImplementedError as error:
        assert "ringcc backend does not implement all_reduce_coalesced" in str(error), error
    else:
        raise AssertionError("an unsupported call went through")
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.bfloat16))
    except collectives.InvalidTypeError as error:
        assert "cannot move torch.bfloat16" in str(error), error
    else:
        raise AssertionError("a bfloat16 tensor went through")
    if size > 1:
        try:
            dist.send(torch.ones(2), (rank + 1) % size, tag=3)
        except NotImplementedError as error:
            assert "send with a tag (3)" in str(error), error
        else:
            raise AssertionError("a tagged send went through, its tag ignored")
    # What a call raises in the background reaches the caller, as Gloo's errors do.
    try:
        dist.all_reduce(torch.arange(4, dtype=torch.int32), op=dist.ReduceOp.AVG)
    except collectives.InvalidTypeError as error:
        assert "needs a floating dtype" in str(error), error
    else:
        raise AssertionError("a call refused in the background returned as if it worked")
    if size > 1:  # counts that differ: a mismatch, on every rank, and the group goes on
        try:
            dist.all_reduce(torch.ones(rank + 1))
        except collectives.MismatchError:
            pass
        else:
            raise AssertionError("a mismatched call returned as if it worked")
        work = dist.all_reduce(torch.ones(rank + 1), async_op=True)
        try:
            work.wait()
        except collectives.MismatchError:
            assert work.is_completed() and not work.is_success()
            assert isinstance(work.exception(), collectives.MismatchError)
        else:
            raise AssertionError("a failed async call's wait returned")
        ones = torch.ones(2)
        dist.all_reduce(ones)
        same(ones, torch.full((2,), float(size)), "all_reduce after a mismatch")
    reversed_group_calls(gloo)
    subgroup_calls(gloo)


def subgroup_calls(gloo: dist.ProcessGroup) -> None:
    """`dist.new_group(ranks)` on the ringcc default: a group over the even ranks, made by
    them alone (the others get no group), taking global ranks."""
    rank, size = dist.get_rank(), dist.get_world_size()
    even = list(range(0, size, 2))
    group = dist.new_group(even)
    if rank not in even:
        assert group == dist.GroupMember.NON_GROUP_MEMBER, group
        return
    assert dist.get_rank(group) == rank // 2 and dist.get_process_group_ranks(group) == even
    total = values(rank, 5)
    dist.all_reduce(total, group=group)
    same(total, sum(values(r, 5) for r in even), "all_reduce over a new group of even ranks")
    box = values(rank, 4)
    dist.broadcast(box, src=even[-1], group=group)
    same(box, values(even[-1], 4), "broadcast from the last even rank")
    comm = group.comm  # made by the backend for this group: destroying the group closes it
    dist.destroy_process_group(group)
    try:
        comm.all_reduce(numpy.ones(2))
    except collectives.InvalidArgumentError as error:
        assert "this communicator is closed" in str(error), error
    else:
        raise AssertionError("a destroyed group's communicator was left open")


def reversed_group_calls(gloo: dist.ProcessGroup) -> None:
    """A group over a communicator whose ranks run the other way from the global ones, as any
    `group=` argument: torch's functions take global ranks (`src=`, `dst=`) and turn them into
    the group's through the tables `process_group` entered it in; results in group rank order."""
    from mpi4py import MPI

    rank, size = dist.get_rank(), dist.get_world_size()
    last = size - 1  # the global rank of group rank 0
    with collectives.init(comm=MPI.COMM_WORLD.Split(0, last - rank)) as comm:
        group = ringcc_torch.process_group(comm)
        assert dist.get_rank(group) == comm.rank == last - rank, (dist.get_rank(group), rank)
        assert dist.get_process_group_ranks(group) == list(range(last, -1, -1))
        box = values(rank, 6)
        dist.broadcast(box, src=0, group=group)
        same(box, values(0, 6), "broadcast from global rank 0 over the reversed group")
        ours, theirs = values(rank, 6), values(rank, 6)
        dist.reduce(ours, dst=0, group=group)
        dist.reduce(theirs, dst=0, group=gloo)
        if rank == 0:
            same(ours, theirs, "reduce to global rank 0 over the reversed group")
        blocks = [torch.empty(4) for _ in range(size)]
        dist.all_gather(blocks, values(rank, 4), group=group)
        for r in range(size):
            same(blocks[r], values(last - r, 4), "all_gather in group rank order")
        box = torch.empty(3)
        dist.scatter(box, [values(j, 3) for j in range(size)] if rank == 0 else None, src=0,
                     group=group)
        same(box, values(last - rank, 3), "scatter from global rank 0: block by group rank")
        # torch's blocking calls ran on this thread (`ProcessGroup._work`): none of them has
        # started the communicator's progress thread; an async call runs there.
        assert comm._progress._thread is None, "a blocking call went to the progress thread"
        total = torch.ones(2)
        work = dist.all_reduce(total, group=group, async_op=True)
        assert comm._progress._thread is not None, "an async call ran on the caller's thread"
        work.wait()
        same(total, torch.full((2,), float(size)), "all_reduce, async_op=True, over the group")
        if size > 1:  # rank 0 sends to the last rank, by their global ranks
            if rank == 0:
                dist.send(values(7, 5), dst=last, group=group)
            elif rank == last:
                dist.recv(box := torch.empty(5), src=0, group=group)
                same(box, values(7, 5), "recv from global rank 0 over the reversed group")
        dist.destroy_process_group(group)  # forgotten by torch; the communicator is ours
        try:
            dist.broadcast(values(rank, 2), src=0, group=group)
        except ValueError as error:
            assert "not" in str(error), error
        else:
            raise AssertionError("a destroyed group still took calls")
        comm.barrier()


class Net(nn.Module):
    """Two layers and one that never gets a gradient (find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(13, 31)
        self.second = nn.Linear(31, 5)
        self.unused = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


def train(group: dist.ProcessGroup | None, hook: str | None, device: str = "cpu",
          comm: collectives.Communicator | None = None) -> list[torch.Tensor]:
    """Four optimizer steps of DDP over `group` (None: the default, ringcc), each of two
    micro-batches, the first under no_sync; several small buckets, the last one uneven. The
    model and batches on `device`; the hook, if any, on `comm` (a new one if None)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        Net().to(device), process_group=group, bucket_cap_mb=0.001, find_unused_parameters=True)
    if hook is not None:
        model.register_comm_hook(comm or collectives.init(), getattr(ringcc_torch, hook))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        optimizer.zero_grad()
        with model.no_sync():
            model(torch.randn(8, 13, generator=generator).to(device)).square().mean().backward()
        model(torch.randn(8, 13, generator=generator).to(device)).square().mean().backward()
        optimizer.step()
    return [p.detach().cpu().clone() for p in model.module.parameters()]


def ddp_scenario(gloo: dist.ProcessGroup) -> None:
    """DDP on the ringcc backend, and on Gloo with each ringcc hook, against DDP on Gloo."""
    reference = train(gloo, None)
    for group, hook, tolerance in ((None, None, 1e-6), (gloo, "allreduce_hook", 1e-6),
                                   (gloo, "fp16_compress_hook", 2e-3)):
        for got, want in zip(train(group, hook), reference):
            assert torch.allclose(got, want, rtol=tolerance, atol=tolerance), \
                f"{hook or 'the ringcc backend'}: {(got - want).abs().max()}"


def cuda_scenario(gloo: dist.ProcessGroup) -> None:
    """CUDA tensors through a communicator on the GPU (cuda_ipc), and through a ringcc process
    group over it, against Gloo's answers on the same values on the host."""
    rank = dist.get_rank()
    with collectives.init(device="cuda") as comm:
        mine = values(rank, 37).cuda()
        assert comm.all_reduce(mine, mine) is mine  # in place, in the tensor's memory
        want = values(rank, 37)
        dist.all_reduce(want, group=gloo)
        same(mine.cpu(), want, "comm.all_reduce of a CUDA tensor")
        blocks = comm.all_gather(values(rank, 5).cuda())
        assert blocks.is_cuda, blocks.device
        gathered = [torch.empty(5) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, values(rank, 5), group=gloo)
        same(blocks.cpu(), torch.stack(gathered), "comm.all_gather of CUDA tensors")
        ours = values(rank, 11).cuda()
        dist.all_reduce(ours, group=ringcc_torch.process_group(comm))
        theirs = values(rank, 11)
        dist.all_reduce(theirs, group=gloo)
        same(ours.cpu(), theirs, "dist.all_reduce of a CUDA tensor on the ringcc backend")
        # DDP on CUDA tensors: over a ringcc group on the GPU, and on Gloo with ringcc's hook
        # on the GPU, against DDP on Gloo (which copies through host memory).
        # The default group (ringcc's) makes a communicator on the GPU at its first CUDA call.
        reference = train(gloo, None, "cuda")
        for group, hook in ((ringcc_torch.process_group(comm), None), (gloo, "allreduce_hook"),
                            (None, None)):
            for got, want in zip(train(group, hook, "cuda", comm), reference):
                assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), \
                    f"CUDA DDP, {hook or group or 'the default group'}: {(got - want).abs().max()}"
    # A group over a CPU communicator names what it moves. (Called directly: dist.all_reduce,
    # on an error, asks for the backend of the group, which fails for a group made outside
    # dist, and raises that instead.)
    with collectives.init() as host:
        try:
            ringcc_torch.process_group(host).allreduce([values(rank, 3).cuda()],
                                                       dist.AllreduceOptions())
        except collectives.InvalidTypeError as error:
            assert "moves cpu tensors, not cuda ones" in str(error), error
        else:
            raise AssertionError("a CPU group took a CUDA tensor")


SCENARIOS = {"calls": calls_scenario, "ddp": ddp_scenario, "cuda": cuda_scenario}

if __name__ == "__main__":
    scenario, port = sys.argv[1], sys.argv[2]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    ringcc_torch.init_process_group()
    assert dist.get_backend() == "ringcc"
    SCENARIOS[scenario](dist.new_group(backend="gloo"))
    dist.destroy_process_group()
    print(f"{scenario} ok", flush=True)
