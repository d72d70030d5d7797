"""Fixtures: where a test body runs (thread ranks or a pool of real MPI ranks)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import pytest

import cases
import collectives
from launch import mpich_segments, remove_orphaned_mpich_segments
from pool import VARIANTS, RankPool
from transports import registry

# The transports an MPI job can choose that move NumPy arrays: the pool's ranks run each. The
# hierarchical one is tested on virtual nodes instead (test_hierarchical.py).
POOL_TRANSPORTS = [name for name in registry.names(device="cpu")
                   if not registry.info(name).hierarchical]


@pytest.fixture(scope="session", autouse=True)
def no_leftover_mpich_segments() -> None:
    """Jobs that tests kill on purpose leave MPICH's files behind; remove them at the end."""
    before = mpich_segments()
    yield
    remove_orphaned_mpich_segments(before)


@pytest.fixture(scope="session")
def rank_pool() -> RankPool:
    pool = RankPool(POOL_TRANSPORTS)
    yield pool
    pool.close()


@pytest.fixture(params=["threads", *POOL_TRANSPORTS])
def run(request: pytest.FixtureRequest) -> Callable[..., list[dict]]:
    """`run(case, size, variant, **example)`: the body from cases.py on `size` ranks.

    Parametrised: each test using it runs on thread ranks and on every MPI transport.
    """
    if request.param == "threads":
        def on_threads(case: str, size: int, variant: str = "auto",
                       **example: Any) -> list[dict]:
            body = functools.partial(getattr(cases, case), **example)
            return collectives.spawn(body, size, **VARIANTS[variant])
        return on_threads
    pool = request.getfixturevalue("rank_pool")
    transport = request.param

    def on_pool(case: str, size: int, variant: str = "auto", **example: Any) -> list[dict]:
        return pool.run(case, size, transport, variant, **example)
    return on_pool
