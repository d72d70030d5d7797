"""PyTorch users on ringcc: the torch.distributed backend and the DDP hooks, on real ranks
(the bodies are in torch_driver.py). Skipped, with the reason, where PyTorch is missing."""

from __future__ import annotations

import socket
import textwrap

import pytest

from gpu import needs_gpu
from launch import mpiexec

pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'ringcc[torch]'")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("ranks", [1, 3])
def test_every_call_matches_gloo(ranks):
    job = mpiexec(ranks, "tests/torch_driver.py", "calls", str(free_port()), timeout=120)
    assert job.stdout.count("calls ok") == ranks, job.stdout + job.stderr


def test_a_ringcc_group_over_another_default_group_is_refused_on_its_ranks(tmp_path):
    """Its global ranks are the default group's, which need not be MPI's: refused with the way
    that works, on every rank of the group, rather than made over the wrong ranks."""
    script = tmp_path / "subgroup.py"
    script.write_text(textwrap.dedent(f"""
        import os
        import sys

        import torch.distributed as dist
        from mpi4py import MPI

        import collectives
        import collectives.torch

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}")
        world = MPI.COMM_WORLD
        dist.init_process_group("gloo", rank=world.rank, world_size=world.size)
        try:
            dist.new_group([0, 1], backend="ringcc")
        except collectives.CollectiveError as error:
            sys.stdout.write(f"refused: {{error}}\\n")  # one write: the ranks' lines stay whole
        dist.destroy_process_group()
    """))
    job = mpiexec(2, str(script), timeout=120)
    assert job.stdout.count("refused: a group on the ringcc backend over ranks [0, 1] needs "
                            "the default group on it too") == 2, job.stdout + job.stderr


def test_ddp_on_ringcc_and_with_its_hooks_ends_as_ddp_on_gloo():
    job = mpiexec(2, "tests/torch_driver.py", "ddp", str(free_port()), timeout=120)
    assert job.stdout.count("ddp ok") == 2, job.stdout + job.stderr


@needs_gpu
def test_cuda_tensors_through_the_communicator_and_the_backend():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("this build of torch has no CUDA")
    job = mpiexec(2, "tests/torch_driver.py", "cuda", str(free_port()), timeout=600)
    assert job.stdout.count("cuda ok") == 2, job.stdout + job.stderr


def test_a_job_ends_cleanly_with_its_progress_threads_idle(tmp_path):
    """collectives.torch ends the progress threads of the communicators it used before the
    interpreter finalizes: one left waiting for calls was torn down inside torch and aborted
    the process ("terminate called without an active exception") after this script's last
    line. Half the communicators are left open, their threads idle, for the exit to end. (The
    abort itself comes only now and then: the script also runs the exit hook, and checks that
    no progress thread is left.)"""
    script = tmp_path / "idle_workers.py"
    script.write_text(textwrap.dedent("""
        import atexit
        import threading

        import torch
        import torch.distributed as dist

        import collectives
        import collectives.torch

        def progress_threads():
            return [t.name for t in threading.enumerate() if t.name.startswith("ringcc-progress")]

        for n in range(4):  # four idle threads: each was a chance to abort
            comm = collectives.init()
            group = collectives.torch.process_group(comm)
            # (async calls, which run on the thread; blocking ones run on the caller's)
            dist.all_reduce(torch.ones(4), group=group, async_op=True).wait()
            dist.broadcast(torch.ones(4), group=group, group_src=0, async_op=True).wait()
            dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * comm.size), group=group,
                                       async_op=True).wait()
            if n % 2:
                comm.close()
        assert len(progress_threads()) == 2, progress_threads()  # the open ones' idle threads
        atexit._run_exitfuncs()  # what the interpreter runs before it finalizes
        assert progress_threads() == [], progress_threads()
        print("done", flush=True)
    """))
    job = mpiexec(2, str(script), timeout=120, check=False)
    assert job.returncode == 0 and job.stdout.count("done") == 2, job.stdout + job.stderr


def test_a_job_left_by_an_error_with_a_call_queued_ends_without_waiting_for_it(tmp_path):
    """A `with` block left by an error while a call is queued that the peer never joins does
    not wait for it, and nor does the exit: the exit hook waited for the broken
    communicator's call for the whole timeout (60 s here, the job's limit 45 s). It stops
    that call's wait instead, so that no progress thread is left when the interpreter ends
    (the idle threads' test says why)."""
    script = tmp_path / "left_queued.py"
    script.write_text(textwrap.dedent("""
        import atexit
        import threading

        import numpy

        import collectives
        import collectives.torch

        def all_reduce(comm, started):
            started.set()
            comm.all_reduce(numpy.ones(4))

        try:
            with collectives.init(timeout=60) as comm:
                if comm.rank == 0:  # a call under way, which rank 1 never joins
                    started = threading.Event()
                    collectives.torch.run(comm, lambda: all_reduce(comm, started))
                    started.wait()
                raise KeyError("the caller's own error")
        except KeyError:
            print("left", flush=True)
        atexit._run_exitfuncs()  # what the interpreter runs before it finalizes
        alive = [t.name for t in threading.enumerate() if t.name.startswith("ringcc-progress")]
        assert alive == [], alive
    """))
    job = mpiexec(2, str(script), timeout=45, check=False)
    assert job.returncode == 0 and job.stdout.count("left") == 2, job.stdout + job.stderr


def test_only_collectives_torch_imports_torch():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for package in ("collectives", "transports", "trainer"):
        for path in (root / package).rglob("*.py"):
            if path.name == "torch.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                assert not any(n.split(".")[0] == "torch" for n in names), path


def test_every_collective_takes_cpu_tensors_and_writes_into_them():
    import torch

    import collectives

    def body(comm):
        rank, size = comm.rank, comm.size
        mine = torch.arange(6.0) * (rank + 1)
        assert comm.all_reduce(mine, mine, op="max") is mine  # in place, in the tensor's memory
        assert mine.tolist() == (torch.arange(6.0) * size).tolist()
        total = comm.all_reduce(torch.ones(3, dtype=torch.int64))
        assert isinstance(total, torch.Tensor) and total.tolist() == [size] * 3
        blocks = comm.all_gather(torch.full((2,), float(rank)))
        assert isinstance(blocks, torch.Tensor) and blocks[:, 0].tolist() == list(range(size))
        shared = torch.full((4,), float(rank))
        comm.broadcast(shared, root=size - 1)
        assert shared.tolist() == [size - 1] * 4
        part = torch.empty(2)
        comm.reduce_scatter(torch.ones(size, 2), part)
        assert part.tolist() == [size] * 2
        for bad, message in ((torch.ones(2, requires_grad=True), "requires grad"),
                             (torch.ones(2, dtype=torch.bfloat16), "bfloat16"),
                             (torch.ones(2, device="meta"), "CPU and CUDA tensors")):
            try:
                comm.all_reduce(bad)
            except collectives.InvalidTypeError as error:
                assert message in str(error), error
            else:
                raise AssertionError(f"{message}: went through")
        return True

    assert collectives.spawn(body, 3) == [True] * 3
