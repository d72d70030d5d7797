"""The hierarchical all-reduce and transport, on virtual nodes (`node_size`) of one host.

Property tests run at (nodes x ranks per node) = 2x2, 2x3 and 3x2, on thread ranks
(`collectives.spawn(..., node_size=k)`) and on the rank pool's hierarchical communicators:
every op, several dtypes, results bitwise equal on every rank, bytes between nodes within
2(M-1)/M S/k; and the other collectives, which take the flat transport, still right. Two
real jobs of 6 ranks check what "auto" picks for each cut into nodes, that uneven nodes are
refused, the bytes between nodes against a flat ring, and that nothing is left in /dev/shm:

    mpiexec -n 6 python tests/test_hierarchical.py layouts|bytes
"""

from __future__ import annotations

import functools
import inspect
import os
import sys

import numpy
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import cases
import collectives
from launch import mpiexec
from pool import HIERARCHICAL, NODE_SHAPES
from test_shm import assert_gone, record_regions, regions_of

examples = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
shapes = st.sampled_from(NODE_SHAPES)
counts = st.one_of(st.integers(0, 13), st.sampled_from([24, 97, 1009, 4800]),
                   st.integers(0, 20_000))
DTYPES = ("bool", "uint8", "int32", "int64", "float16", "float32", "float64", "complex64")


@st.composite
def dtype_and_op(draw: st.DrawFn) -> tuple[str, str]:
    dtype = draw(st.sampled_from(DTYPES))
    return dtype, draw(st.sampled_from(cases.ops_for(dtype)))


@pytest.fixture(params=["threads", "pool"])
def on_nodes(request: pytest.FixtureRequest):
    """`on_nodes(case, (nodes, per_node), **example)`: the body from cases.py on that many
    virtual nodes, over the hierarchical transport."""
    if request.param == "threads":
        def on_threads(case: str, shape: tuple[int, int], **example) -> list[dict]:
            body = functools.partial(getattr(cases, case), **example)
            return collectives.spawn(body, shape[0] * shape[1], node_size=shape[1],
                                     **HIERARCHICAL)
        return on_threads
    pool = request.getfixturevalue("rank_pool")

    def on_pool(case: str, shape: tuple[int, int], **example) -> list[dict]:
        nodes, per_node = shape
        return pool.run(case, nodes * per_node, "hierarchical", f"{nodes}x{per_node}",
                        **example)
    return on_pool


def inter_node_bound(count: int, itemsize: int, nodes: int, per_node: int) -> int:
    """2(M-1)/M S/k in whole elements: 2(M-1) chunks of the largest shard cut in M."""
    shard = -(-count // per_node)
    return 2 * (nodes - 1) * -(-shard // nodes) * itemsize


@examples
@given(shape=shapes, count=counts, dtype_op=dtype_and_op(),
       layout=st.sampled_from(cases.LAYOUTS), in_place=st.booleans())
@example(shape=(2, 3), count=4800, dtype_op=("float64", "avg"), layout="flat", in_place=True)
@example(shape=(3, 2), count=5, dtype_op=("int32", "prod"), layout="strided", in_place=False)
@example(shape=(2, 2), count=0, dtype_op=("bool", "max"), layout="flat", in_place=False)
def test_all_reduce(on_nodes, shape, count, dtype_op, layout, in_place):
    dtype, op = dtype_op
    results = on_nodes("all_reduce_case", shape, count=count, dtype=dtype, op=op,
                       layout=layout, in_place=in_place)
    cases.check_all_reduce(results, count, dtype, op, layout)
    nodes, per_node = shape
    bound = inter_node_bound(count, numpy.dtype(dtype).itemsize, *shape)
    for rank, result in enumerate(results):
        stats = result["stats"]
        assert stats["inter_node_bytes_sent"] <= bound, (rank, stats, bound)
        assert stats["inter_node_bytes_received"] <= bound, (rank, stats, bound)
        if count % (nodes * per_node) == 0:  # every chunk alike: the bound exactly
            assert stats["inter_node_bytes_sent"] == bound, (rank, stats, bound)


# The other collectives run over the world transport: each body with the arguments it takes.
OTHERS = {"all_gather": ("all_gather_case", cases.check_all_gather),
          "broadcast": ("broadcast_case", cases.check_broadcast),
          "reduce_scatter": ("reduce_scatter_case", cases.check_reduce_scatter),
          "reduce": ("reduce_case", cases.check_reduce),
          "gather": ("gather_case", cases.check_gather),
          "all_to_all": ("all_to_all_case", cases.check_all_to_all),
          "scan": ("scan_case", cases.check_scan),
          "sendrecv": ("sendrecv_case", cases.check_sendrecv)}


def wanted(function, arguments: dict) -> dict:
    names = inspect.signature(function).parameters
    return {k: v for k, v in arguments.items() if k in names}


@settings(examples, max_examples=30)
@given(shape=shapes, collective=st.sampled_from(sorted(OTHERS)),
       count=st.one_of(st.integers(0, 7), st.integers(0, 3000)), dtype_op=dtype_and_op(),
       layout=st.sampled_from(cases.LAYOUTS), root=st.integers(0, 5), flag=st.booleans())
def test_the_other_collectives(on_nodes, shape, collective, count, dtype_op, layout, root,
                               flag):
    dtype, op = dtype_op
    arguments = {"count": count, "dtype": dtype, "op": op, "layout": layout,
                 "root": root % (shape[0] * shape[1]), "in_place": flag, "exclusive": flag,
                 "given": flag, "recv": "given" if flag else "none", "shift": 1 + root}
    case, check = OTHERS[collective]
    results = on_nodes(case, shape, **wanted(getattr(cases, case), arguments))
    check(results, **wanted(check, arguments))


def test_small_all_reduces_of_one_kind_take_the_lane_on_nodes():
    """Once a kind of small all-reduce is known, the small-call lane takes it
    (collectives/small.py): on this transport through the base class's prepared exchange,
    which begins each call as the general path does. Every form it takes gives the result.
    (The property tests' communicators, and threads by default, turn one-shot off, and with
    it the lane.)"""
    body = functools.partial(cases.small_call_case, dtype="float64", op="avg")
    mine = [cases.values(r, 6, "float64").reshape(2, 3) for r in range(4)]
    want = cases.reduce_reference("avg", mine)
    for outcome in collectives.spawn(body, 4, node_size=2, one_shot_bytes=1 << 20):
        # The general path took only the first call of the kind, and the explicit algorithm.
        assert outcome["general_path"] == ["one_shot", "auto"], outcome["general_path"]
        cases.assert_matches(outcome["lane"][0], want, "float64")
        for form in ("into", "in_place", "into_view", "into_strided", "overlapping"):
            cases.assert_matches(outcome[form], want, "float64")


def test_sends_run_ahead_as_the_worlds_do():
    """The flat calls go over the world part, and so do their sends that run ahead: a
    scatter's root starts every block at once, an all-to-all keeps its blocks under way (was
    0 ahead: one block at a time, a 16 MiB scatter on 6 ranks in 3 nodes about 2x slower)."""
    def body(comm):
        transport = comm._transport
        blocks = comm.scatter(numpy.arange(8.0).reshape(4, 2) if comm.rank == 0 else None,
                              numpy.empty(2), root=0)
        return transport.sends_ahead(1 << 20), transport.world.sends_ahead(1 << 20), \
            blocks.tolist()

    for rank, (ahead, world_ahead, block) in enumerate(collectives.spawn(body, 4, node_size=2)):
        assert ahead == world_ahead > 0 and block == [2.0 * rank, 2.0 * rank + 1]


def test_a_part_names_world_ranks_in_its_errors():
    """Rank 3 never comes to the hierarchical all-reduce: rank 2 waits for it inside their
    node, rank 1 across nodes, and each times out naming both by their world ranks (the parts'
    own ranks were named: "rank 0 waited ... from rank 1")."""
    def body(comm):
        if comm.rank == 3:
            return None
        try:
            comm.all_reduce(numpy.ones(1000), algorithm="hierarchical")
        except collectives.CollectiveTimeoutError as error:
            return str(error)

    said = collectives.spawn(body, 4, node_size=2, timeout=1, check=False)  # (checked, all
    assert said[2].startswith("rank 2 waited 1 s for a message from rank 3 "), said  # wait on
    assert "inside the node of ranks 2, 3 (reduce-scatter step 0)" in said[2], said
    assert said[1].startswith("rank 1 waited 1 s for a message from rank 3 "), said  # the world)
    assert "across nodes among ranks 1, 3 (reduce-scatter step 0)" in said[1], said


def test_thread_nodes_must_divide_the_ranks_and_the_algorithm_needs_the_nodes():
    with pytest.raises(collectives.InvalidArgumentError, match="must divide"):
        collectives.spawn(lambda comm: None, 5, node_size=2)
    with pytest.raises(collectives.InvalidArgumentError, match="needs the hierarchical"):
        collectives.spawn(lambda comm: comm.all_reduce(numpy.ones(4), algorithm="hierarchical"),
                          2)


# ---- jobs of their own ------------------------------------------------------------------------

def layouts_scenario() -> None:
    """What "auto" picks for each cut of 6 ranks into nodes; uneven nodes refused."""
    for node_size, picked in ((1, "mpi"), (2, "hierarchical"), (3, "hierarchical"),
                              (6, "shm"), (4, "mpi")):
        with collectives.init(node_size=node_size) as comm:
            assert comm.transport == picked, (node_size, comm.transport)
            got = comm.all_reduce(numpy.arange(7.0) * (comm.rank + 1))
            assert got.tolist() == (numpy.arange(7.0) * 21).tolist(), got
    os.environ["RINGCC_NODE_SIZE"] = "3"
    with collectives.init() as comm:
        assert comm.transport == "hierarchical"
        assert comm._transport.node.size == 3
    del os.environ["RINGCC_NODE_SIZE"]
    try:
        collectives.init("hierarchical", node_size=4)
    except collectives.InvalidArgumentError as error:
        assert "2 nodes hold 4, 2 ranks (node_size=4)" in str(error), error
    else:
        raise AssertionError("uneven nodes went unnoticed")
    try:
        collectives.init("shm", node_size=3)
    except collectives.CollectiveError as error:
        assert "span nodes" in str(error), error
    else:
        raise AssertionError("shm across virtual nodes went unnoticed")
    print("layouts ok", flush=True)


def bytes_scenario() -> None:
    """Bytes between nodes of one all-reduce of S bytes, at 2x3 and 3x2: within 2(M-1)/M S/k
    on every rank over the hierarchical transport (from registered memory too), and
    2(N-1)/N S on the busiest rank of a flat ring."""
    from mpi4py import MPI

    count = 6 * 5000  # float64: every shard and chunk alike, so the bounds are exact
    nbytes = 8 * count
    want = numpy.arange(count, dtype=numpy.float64) * 21
    for per_node in (3, 2):
        nodes = 6 // per_node
        for transport, algorithm in (("hierarchical", "auto"), ("mpi", "ring")):
            with collectives.init(transport, node_size=per_node) as comm:
                for registered in (False, True):
                    mine = comm.empty(count) if registered else numpy.empty(count)
                    mine[...] = numpy.arange(count) * (comm.rank + 1)
                    comm.stats.reset()
                    got = comm.all_reduce(mine, algorithm=algorithm)
                    assert got.tobytes() == want.tobytes()
                    sent = MPI.COMM_WORLD.allgather(comm.stats.inter_node_bytes_sent)
                    if transport == "hierarchical":
                        assert sent == [2 * (nodes - 1) * nbytes // nodes // per_node] * 6, sent
                    else:
                        assert max(sent) == 2 * 5 * nbytes // 6, sent
                if comm.rank == 0:
                    print(f"{nodes}x{per_node} {transport}: inter-node bytes sent by rank "
                          f"{sent}, S = {nbytes}", flush=True)
    print("bytes ok", flush=True)


def test_what_auto_picks_and_uneven_nodes_refused():
    job = mpiexec(6, __file__, "layouts", timeout=120)
    assert job.stdout.count("layouts ok") == 6, job.stdout
    assert_gone(regions_of(job.stdout))


def test_bytes_between_nodes_against_a_flat_ring():
    job = mpiexec(6, __file__, "bytes", timeout=120)
    assert job.stdout.count("bytes ok") == 6, job.stdout
    assert "2x3 hierarchical: inter-node bytes sent by rank [80000, 80000" in job.stdout
    assert_gone(regions_of(job.stdout))


SCENARIOS = {"layouts": layouts_scenario, "bytes": bytes_scenario}

if __name__ == "__main__":
    record_regions()
    SCENARIOS[sys.argv[1]]()
