"""PyTorch users on ringcc: the torch.distributed backend and the DDP hooks, on real ranks
(the bodies are in torch_driver.py). Skipped, with the reason, where PyTorch is missing."""

from __future__ import annotations

import socket

import pytest

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


def test_ddp_on_ringcc_and_with_its_hooks_ends_as_ddp_on_gloo():
    job = mpiexec(2, "tests/torch_driver.py", "ddp", str(free_port()), timeout=120)
    assert job.stdout.count("ddp ok") == 2, job.stdout + job.stderr


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
