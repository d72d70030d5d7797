"""What is particular to the shared-memory transport: its regions' lifetime and mode, its
errors, and its two all-reduce paths forced one way or the other. (The property tests of every
collective run on it too, through the rank pool.)

Each test starts a real job that runs one scenario of this file on every rank:

    mpiexec -n 3 python tests/test_shm.py collectives SEGMENT_BYTES ONE_SHOT_BYTES

A rank prints the path of every region it creates, so the test can check that exactly those
are gone from /dev/shm afterwards.
"""

from __future__ import annotations

import gc
import inspect
import math
import os
import re
import signal
import subprocess
import time
import sys
from collections.abc import Callable

import numpy
import pytest

import cases
import collectives
from launch import mpiexec

COUNTS = (0, 1, 2, 7, 97, 1009)  # empty, below the rank count, primes
# Each rank's chunk of the ring just over 4 MiB of float64: reduced straight out of the
# sender's buffer where single copy is on.
DIRECT = 3 * (1 << 19) + 5
ALL_REDUCE = (("int32", "sum"), ("int32", "prod"), ("uint8", "min"), ("bool", "max"),
              ("float16", "sum"), ("float64", "avg"), ("complex64", "prod"))


# ---- the scenarios, run on every rank -------------------------------------------------------

def record_regions() -> None:
    """Print the path of every shared-memory region this rank creates."""
    from transports import shared_memory

    create = shared_memory.create_region

    def recording(nbytes: int) -> tuple[str, numpy.ndarray]:
        path, memory = create(nbytes)
        print(f"region {path}", flush=True)
        return path, memory

    shared_memory.create_region = recording


def counted_reads(transport) -> list[int]:
    """The bytes of each direct read `transport` makes from now on, as a list that grows."""
    reads: list[int] = []
    read = transport.memory.read
    transport.memory.read = lambda pid, address, into: (reads.append(into.nbytes),
                                                        read(pid, address, into))
    return reads


def counted_moves() -> tuple[list[tuple[str, int]], Callable, Callable]:
    """Each move by address between ranks from now on ("read" or "write", its bytes: slots'
    read_peer_bytes, write_peer_bytes), as a list that grows; and the two moves it wraps, to
    put back."""
    from transports import slots

    moved: list[tuple[str, int]] = []
    read, write = slots.read_peer_bytes, slots.write_peer_bytes
    slots.read_peer_bytes = lambda pid, there, here, n: (moved.append(("read", n)),
                                                         read(pid, there, here, n))
    slots.write_peer_bytes = lambda pid, there, here, n: (moved.append(("write", n)),
                                                          write(pid, there, here, n))
    return moved, read, write


def check_everywhere(comm, world, case: str, check, **example) -> None:
    """Run `cases.<case>` on every rank; rank 0 checks all the results with `check`."""
    results = world.gather(getattr(cases, case)(comm, **example))
    if world.rank == 0:
        wanted = inspect.signature(check).parameters
        check(results, **{k: v for k, v in example.items() if k in wanted})


def collectives_scenario(segment_bytes: str, one_shot_bytes: str, single_copy: str) -> None:
    """Every collective against NumPy, with the segment size and crossover given, and large
    messages read from the sender's buffer (single_copy "1") or passed through the slots."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    os.environ["RINGCC_SINGLE_COPY"] = single_copy
    comm = collectives.init("auto", segment_bytes=int(segment_bytes),
                            one_shot_bytes=int(one_shot_bytes), timeout=30)
    assert comm.transport == "shm", comm.transport
    # White box: large messages in reduction steps are read straight out of the sender's
    # buffer where the kernel allows it (it does for one user's processes here), else slots.
    assert comm._transport.single_copy == (single_copy == "1")
    for op in ("sum", "max"):
        check_everywhere(comm, world, "all_reduce_case", cases.check_all_reduce, count=DIRECT,
                         dtype="float64", op=op, layout="flat", in_place=op == "max")
    # Every region was unlinked once mapped: in use, yet not in /dev/shm.
    maps = open("/proc/self/maps").read()
    mapped = re.findall(r"/dev/shm/(ringcc-\w+) \(deleted\)", maps)
    assert len(set(mapped)) == comm.size, maps
    assert not set(mapped) & set(os.listdir("/dev/shm"))
    for count in COUNTS:
        for dtype, op in ALL_REDUCE:
            check_everywhere(comm, world, "all_reduce_case", cases.check_all_reduce,
                             count=count, dtype=dtype, op=op, layout="flat", in_place=False)
        check_everywhere(comm, world, "all_reduce_case", cases.check_all_reduce, count=count,
                         dtype="float32", op="max", layout="strided", in_place=True)
        check_everywhere(comm, world, "all_gather_case", cases.check_all_gather, count=count,
                         dtype="complex128", layout="matrix", given=False)
        check_everywhere(comm, world, "reduce_scatter_case", cases.check_reduce_scatter,
                         count=count, dtype="int64", op="sum")
        for root in range(comm.size):
            check_everywhere(comm, world, "broadcast_case", cases.check_broadcast,
                             count=count, dtype="uint16", layout="flat", root=root)
            check_everywhere(comm, world, "scatter_case", cases.check_scatter, count=count,
                             dtype="float64", root=root, given=root % 2 == 0)
    if comm.rank < 2:  # a small sendrecv: through the pair areas
        comm.sendrecv(numpy.arange(4.0), 1 - comm.rank)
    if int(one_shot_bytes):
        unread_inputs_stay_out_of_the_areas(comm)
        scatters_carry_their_blocks_in_their_descriptions(comm)
    comm.barrier()
    comm.close()
    gc.collect()
    # Closed, the communicator keeps no view of any region: each mapping has gone.
    assert not re.findall(r"/dev/shm/ringcc-", open("/proc/self/maps").read())
    print("collectives ok", flush=True)


def unread_inputs_stay_out_of_the_areas(comm) -> None:
    """White box: a one-shot gather's or reduce's root, a broadcast's other ranks, and a
    scan's last rank publish an input that no peer takes, which stays out of their one-shot
    areas (`Transport.unread`); the others' go in. By the lanes and by the general path; right
    results all the same."""
    from transports.slots import SLOTS

    transport, rank, size = comm._transport, comm.rank, comm.size

    def in_our_areas(values: numpy.ndarray) -> bool:
        raw, data = values.view(numpy.uint8), transport._data[rank]
        return any(numpy.array_equal(data[lo:lo + raw.size], raw)
                   for lo in (SLOTS * transport.slot_bytes + parity * transport._area_bytes
                              for parity in range(2)))

    for root in range(size):
        for kind, collective in enumerate(("gather", "reduce", "broadcast", "scan")):
            for general in (False, True):
                made = 1000.0 * (1 + 100 * root + 10 * kind + 5 * general)  # (none is 0)
                mine = numpy.full(64, made + rank)
                sent = mine.copy()
                call = getattr(comm, f"_{collective}" if general else collective)
                if collective == "scan":  # (in place: the last rank reads its own where it lies)
                    got = call(mine, mine)
                else:
                    got = call(mine, root=root)
                taken = rank == root if collective == "broadcast" else \
                    rank != size - 1 if collective == "scan" else rank != root
                assert in_our_areas(sent) == taken, (collective, root, general)
                everyone = numpy.stack([numpy.full(64, made + r) for r in range(size)])
                if collective == "broadcast":
                    numpy.testing.assert_array_equal(got, everyone[root])
                elif collective == "scan":
                    numpy.testing.assert_array_equal(got, everyone[:rank + 1].sum(axis=0))
                elif rank == root:
                    numpy.testing.assert_array_equal(
                        got, everyone if collective == "gather" else everyone.sum(axis=0))


def scatters_carry_their_blocks_in_their_descriptions(comm) -> None:
    """White box: a scatter whose blocks fit its description's room (on shm, up to
    scatter.INLINE_BYTES within the area) is its one exchange: no rank reads another's memory
    or sends a message. The root's area takes its description and its peers' blocks (from its
    right neighbour's on: `scatter.carried`) and nothing past them (`Transport.unread` of what
    follows), the other ranks' only their offer of nothing (`scatter.offer_target`). By the
    lane and by the general path, from every root."""
    from collectives.scatter import TARGET, description_bytes, inline_bytes, published_bytes
    from transports.slots import SLOTS

    transport, rank, size = comm._transport, comm.rank, comm.size
    assert transport.moves_what_is_read
    block = min(inline_bytes(transport), 32 << 10) // size // 8  # float64s
    assert size * block * 8 > 4096  # (more than a description holds where all of it moves)
    areas = [transport._data[rank][lo:lo + published_bytes(transport)]
             for lo in (SLOTS * transport.slot_bytes + parity * transport._area_bytes
                        for parity in range(2))]
    reads: list[int] = []
    read = transport.memory.read
    transport.memory.read = lambda pid, address, into: (reads.append(into.nbytes),
                                                        read(pid, address, into))
    try:
        for root in range(size):
            for general in (False, True):
                blocks = numpy.arange(size * block, dtype=float).reshape(size, block) \
                    + 1000 * root + 100 * general
                comm.barrier()  # (no peer reads our areas now)
                for area in areas:
                    area[...] = 0xA5
                sent = list(transport._sent)
                got = (comm._scatter if general else comm.scatter)(
                    blocks if rank == root else None, numpy.empty(block), root=root)
                numpy.testing.assert_array_equal(got, blocks[rank])
                assert reads == [] and transport._sent == sent, (reads, root, general)
                # The root's: its peers' blocks, from its right neighbour's on, not its own.
                carried = numpy.concatenate([blocks[root + 1:], blocks[:root]])
                held = description_bytes(size) + carried.nbytes if rank == root \
                    else TARGET.size
                assert all((area[held:] == 0xA5).all() for area in areas), (root, general)
                assert (rank != root) or any(
                    numpy.array_equal(area[description_bytes(size):held],
                                      carried.view(numpy.uint8).reshape(-1)) for area in areas)
    finally:
        transport.memory.read = read


def registered_send_waits_for_a_slot(comm) -> None:
    """Rank 0 sends its registered buffer to rank 1 while taking rank 2's, but every slot of
    rank 0 still holds a message rank 1 has not taken: it takes rank 2's message first, then,
    once rank 1 has emptied a slot, announces its own, still as registered memory. (Rank 1
    waits, by MPI, until rank 2 has been read.)"""
    from mpi4py import MPI

    from transports.slots import SLOTS

    world, transport, count = MPI.COMM_WORLD, comm._transport, 1000
    mine = comm.empty(count)
    mine[...] = comm.rank
    if comm.rank == 0:
        sent = [transport.isend(numpy.full(10, float(k)), 1) for k in range(SLOTS)]
        got = numpy.empty(count)
        transport.sendrecv(mine, 1, got, 2)
        for wait in sent:
            wait()
        assert (got == 2).all(), got
    elif comm.rank == 1:
        world.recv(source=2)
        for k in range(SLOTS):
            small = numpy.empty(10)
            transport.recv(small, 0)
            assert (small == k).all(), small
        got = numpy.empty(count)
        transport.recv(got, 0)
        assert (got == 0).all(), got
    elif comm.rank == 2:
        transport.send(mine, 0)  # returns once rank 0 has read it
        world.send(None, dest=1)
    world.barrier()


def registered_inputs_are_copied_where_they_lie(comm) -> None:
    """One-shot inputs in registered memory are copied out of their owner's mapping, never read
    by a system call: by the exchange that reads inputs in place (an all-to-all's blocks, an
    all-gather's inputs, from `reads_inputs_from`, here forced to 1 byte where direct reads
    work), and from `references_from` by the areas' exchange, which names what each rank takes
    (a broadcast's root too, a reduction's every input). Ordinary inputs beside them are
    read directly in the first, and through their areas in the second. An all-to-all in place
    writes over a registered input that its peers take blocks of: it goes through its area, or
    is copied first."""
    from transports import slots

    transport, rank, size = comm._transport, comm.rank, comm.size
    count = slots.REFERENCE_BYTES // 8 // size + 1  # elements a block: an input of more
    held = comm.empty((3, size, count))  # (each rank's inputs at an offset in its region)
    wide = comm.empty((2, size, slots.REFERENCE_BYTES // 8 + 1))  # (blocks of references_from)
    wide[0] = numpy.arange(wide[0].size).reshape(wide[0].shape) + 1000 * rank
    direct: list[int] = []
    read_peer_bytes, reads_inputs_from = slots.read_peer_bytes, transport.reads_inputs_from
    reads_inputs_above = transport.reads_inputs_above
    slots.read_peer_bytes = lambda *args: (direct.append(args[3]), read_peer_bytes(*args))
    references_from = transport.references_from  # (None where ranks outnumber cores: as if not)
    transport.references_from = slots.REFERENCE_BYTES
    mapped: list[int] = []  # peers whose registered input was copied out of our mapping
    transport._mapped = lambda src, word: (mapped.append(src), slots.SlotTransport._mapped(
        transport, src, word))[1]
    try:
        for by_address in (False, True) if transport.single_copy else (False,):
            transport.reads_inputs_from = 1 if by_address else None
            transport.reads_inputs_above = 0
            comm._small_calls.clear()  # (the lanes' exchanges, prepared under the other)
            for registered in (range(size), (0,)):
                mine = held[1] if rank in registered else numpy.empty((size, count))
                mine[...] = numpy.arange(mine.size).reshape(mine.shape) + 1000 * rank
                direct.clear()
                mapped.clear()
                got = comm.all_to_all(mine)
                expected = numpy.stack([numpy.arange(mine.size).reshape(mine.shape)[rank]
                                        + 1000 * r for r in range(size)])
                numpy.testing.assert_array_equal(got, expected)
                gathered = comm.all_gather(mine[0])
                numpy.testing.assert_array_equal(gathered, numpy.stack(
                    [numpy.arange(count) + 1000 * r for r in range(size)]))
                ordinary_peers = size - len(registered) - (rank not in registered)
                assert bool(direct) == (by_address and ordinary_peers > 0), \
                    (by_address, registered, direct)
                registered_peers = [r for r in registered if r != rank]
                assert sorted(set(mapped)) == registered_peers, (by_address, registered, mapped)
                for general in (False, True):  # (by the lane, and by the general path)
                    in_place = held[2]
                    in_place[...] = mine
                    (comm._all_to_all if general else comm.all_to_all)(in_place, in_place)
                    numpy.testing.assert_array_equal(in_place, expected)
                # An all-reduce reduces its own input where it lies, in place too (on the
                # third rank, after the first two are reduced into it: a copy first).
                total = sum(numpy.arange(mine.size, dtype=float).reshape(mine.shape) + 1000 * r
                            for r in range(size))
                for general in (False, True):
                    reduced = held[2]
                    reduced[...] = mine
                    all_reduce = comm._all_reduce if general else comm.all_reduce
                    all_reduce(mine, reduced)
                    all_reduce(reduced, reduced)
                    numpy.testing.assert_array_equal(reduced, total * size)
                    for root in range(size):  # (a reduce's root reduces its own where it lies)
                        reduced[...] = mine
                        (comm._reduce if general else comm.reduce)(reduced, reduced, root=root)
                        numpy.testing.assert_array_equal(reduced, total if rank == root else mine)
                        # A gather's root places its peers' blocks in its result: its own in
                        # place, or taken from another block of the result, or from apart;
                        # blocks from registered memory and of references_from or more.
                        expected = numpy.stack([wide[0, r] + 1000 * (r - rank)
                                                for r in range(size)])
                        for into in (wide[1], numpy.empty_like(wide[1]), None):
                            block = wide[0, rank] if into is None else into[rank]
                            for sent in ((block, into[(rank + 1) % size]) if into is not None
                                         else (block,)):
                                if into is not None:
                                    into[...] = -1
                                sent[...] = wide[0, rank]
                                got = (comm._gather if general else comm.gather)(
                                    sent, into, root=root)
                                if rank == root:
                                    numpy.testing.assert_array_equal(got, expected)
                        # An all-gather of such inputs, into a registered result or not.
                        for into in (wide[1], None):
                            got = (comm._all_gather if general else comm.all_gather)(
                                wide[0, rank], into)
                            numpy.testing.assert_array_equal(got, expected)
                root = size - 1
                shared = held[0] if rank in registered else numpy.empty((size, count))
                shared[...] = 7 if rank == root else 0
                comm.broadcast(shared, root=root)
                assert (shared == 7).all()
    finally:
        slots.read_peer_bytes, transport.reads_inputs_from = read_peer_bytes, reads_inputs_from
        transport.reads_inputs_above = reads_inputs_above
        transport.references_from = references_from
        del transport._mapped


def registered_scenario() -> None:
    """Every collective from and into registered memory (comm.empty), whose messages peers
    read in place; and the errors of registering."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    comm = collectives.init("shm", segment_bytes=4096, timeout=30)
    rank, size = comm.rank, comm.size
    descriptors = len(os.listdir("/proc/self/fd"))
    for count in (1, 97, DIRECT):
        expected = cases.reduce_reference("sum", [cases.values(r, count, "float64")
                                                  for r in range(size)])
        mine = comm.empty(count)
        assert mine.shape == (count,) and mine.dtype == numpy.float64
        mine[...] = cases.values(rank, count, "float64")
        result = comm.zeros(count)
        assert comm.all_reduce(mine, result) is result
        cases.assert_matches(result, expected, "float64")
        assert comm.all_reduce(mine, mine) is mine  # in place: every step reads registered memory
        cases.assert_matches(mine, expected, "float64")
        gathered = comm.empty((size, count), "int32")
        comm.all_gather(numpy.full(count, rank, "int32"), gathered)
        assert (gathered == numpy.arange(size)[:, None]).all()
        blocks = comm.empty((size, count), "float32")
        blocks[...] = rank + 1
        block = comm.reduce_scatter(blocks, comm.empty(count, "float32"))
        assert (block == size * (size + 1) / 2).all()
        shared = comm.zeros((2, count), "uint8")
        if rank == size - 1:
            shared[...] = 7
        comm.broadcast(shared, root=size - 1)
        assert (shared == 7).all()
    # A pair's message from registered memory is copied out of the peer's mapping, where it
    # lies, whether or not every other pair's message is read in place (slots.py, "Pair
    # messages read in place"), and whether or not the peer's is registered too: no direct
    # read of it. An ordinary buffer's is read directly where pairs' messages are read in
    # place (here from 1 byte up), else both go the general way.
    transport = comm._transport
    pairs_read_from = transport.pairs_read_from
    read = transport.memory.read
    held = comm.empty(4097)
    for reads_in_place in (True, False):
        transport.pairs_read_from = 1 if reads_in_place and transport.single_copy else None
        for both in (True, False):
            reads: list[int] = []
            transport.memory.read = lambda *args: (reads.append(args[2].nbytes), read(*args))
            if rank < 2:
                mine = held if both or rank == 0 else numpy.empty(4097)
                mine[...] = cases.values(rank, 4097, "float64")
                got = comm.sendrecv(mine, 1 - rank)
                numpy.testing.assert_array_equal(got, cases.values(1 - rank, 4097, "float64"))
            direct = rank == 0 and not both and transport.pairs_read_from is not None
            assert reads == ([4097 * 8] if direct else []), (reads_in_place, both, reads)
    transport.pairs_read_from, transport.memory.read = pairs_read_from, read
    registered_inputs_are_copied_where_they_lie(comm)
    # Each buffer is a mapping of every rank's region, and a mapping holds no descriptor.
    assert len(os.listdir("/proc/self/fd")) == descriptors, "registered memory holds descriptors"
    registered_send_waits_for_a_slot(comm)
    # Every rank must ask for the same: else every rank says so, and the communicator works on.
    try:
        comm.empty(10 + rank)
    except collectives.InvalidArgumentError as error:
        assert "every rank must ask for registered memory of the same size" in str(error), error
    else:
        raise AssertionError("ranks registered different sizes unnoticed")
    assert comm.all_reduce(numpy.ones(3)).tolist() == [size] * 3
    world.barrier()
    comm.close()
    print("registered ok", flush=True)


def failure_scenario(how: str) -> None:
    """Rank 1 raises, or kills itself, in the middle of a long all-reduce."""
    comm = collectives.init("shm", segment_bytes=4096, timeout=3)
    work = numpy.arange(1 << 20, dtype=numpy.float64) * (comm.rank + 1)
    comm.all_reduce(work)
    if comm.rank == 1:
        transfers = 0

        def fail_at_the_second(record: dict) -> None:
            """Rank 1's second transfer of the call: the first step's messages have moved."""
            nonlocal transfers
            transfers += 1
            if transfers == 2:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("rank 1 fails on purpose")

        comm.on_transfer(fail_at_the_second)
    comm.all_reduce(work)


def shared_failure_scenario() -> None:
    """Rank 1 dies in the middle of a shared message (slots.py, "Shared copies"): it has told
    rank 0 where the message lands, and rank 0 writes its half into a process that is gone."""
    comm = collectives.init("shm", timeout=10)
    assert comm._transport.shares_from is not None, "needs a core per rank"
    message = numpy.arange(1 << 23, dtype=numpy.float64)  # 64 MiB: shared
    if comm.rank == 1:
        comm._transport.memory.read = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        comm.recv(numpy.empty_like(message), 0)
    else:
        comm.send(message, 1)


def late_share_scenario() -> None:
    """Rank 0's half of a shared message comes after rank 1 has given up waiting for it: rank
    1 times out, naming what it waited for, and keeps the buffer it lent (slots._LENT), so the
    late write lands in memory nobody reuses; rank 0 times out in its turn."""
    import time

    from mpi4py import MPI

    from transports import slots

    comm = collectives.init("shm", timeout=1)
    assert comm._transport.shares_from is not None, "needs a core per rank"
    message = numpy.arange(1 << 20, dtype=numpy.float64)  # 8 MiB: shared
    memory = comm._transport.memory
    if comm.rank == 0:
        write = memory.write
        memory.write = lambda *args: (time.sleep(2), write(*args))
    received = numpy.zeros_like(message)
    try:
        if comm.rank == 0:
            comm.send(message, 1)
        else:
            comm.recv(received, 0)
    except collectives.CollectiveTimeoutError as error:
        said = str(error)
    MPI.COMM_WORLD.Barrier()  # rank 0's late write has landed
    if comm.rank == 1:
        assert "its part of a message" in said, said
        assert any(lent.base is received or lent.base is received.base
                   or numpy.shares_memory(lent, received) for lent in slots._LENT), slots._LENT
        half = len(message) // 2
        numpy.testing.assert_array_equal(received[:half], message[:half])  # the late half
    else:
        assert "its message to be read" in said, said
    print("late share ok", flush=True)


def shared_inputs_scenario() -> None:
    """On 2 ranks with a core each, one-shot inputs of SHARED_BYTES or more that one rank takes of
    the other and copies whole are shared (slots.py, "Shared inputs") while `Sharing` says so
    (here, always): a broadcast's root and a gather's other rank write half of their input into
    a reader that places it, which reads the rest; a gather's root that copies its own block
    meanwhile (`alongside`) asks for ALONGSIDE_EIGHTHS of it instead; a reader that does not
    place it (the lane's gather in place) reads it all. An all-reduce's inputs of more than
    LEFT_BYTES are left where they lie, and read whole (with no road to choose the areas:
    `input_roads_scenario` has it); a reduce's, and smaller ones, go
    through the areas, and so do all that `Sharing` chooses for when it says not to share. By
    the lane and the general path, from either root, against NumPy, with the reads and writes
    counted. Then a reader whose owner has not come gives up: it withdraws its ask, so that the
    owner, come late, writes nothing, and it keeps the buffer it lent."""
    from mpi4py import MPI

    from transports import slots

    world = MPI.COMM_WORLD
    moved, read, write = counted_moves()
    with collectives.init("shm", timeout=30) as comm:
        rank = comm.rank
        assert comm._transport.shares_inputs_from == slots.SHARED_BYTES, "needs a core per rank"
        sharing = comm._transport.sharing
        for nbytes in (slots.SHARED_BYTES - 8, slots.SHARED_BYTES + 8, 1 << 20):
            shared, half = nbytes >= slots.SHARED_BYTES, nbytes // 2 // 64 * 64
            most = nbytes * slots.ALONGSIDE_EIGHTHS // 8 // 64 * 64
            everyone = [numpy.arange(nbytes // 8) * 2.0 + r + 0.5 for r in range(2)]
            mine = everyone[rank].copy()
            for root in range(2):
                owner = rank != root  # (of a gather's, or a reduce's, input taken)
                split, alongside = ([] if not shared else [("read", nbytes - part)]
                                    if not owner else [("write", part)]
                                    for part in (half, most))
                whole = [] if not shared or owner else [("read", nbytes)]
                for general in (False, True):
                    sharing.shares = lambda: True
                    def run(name, *args, **kwargs):
                        moved.clear()
                        return getattr(comm, f"_{name}" if general else name)(
                            *args, root=root, **kwargs)

                    why = (nbytes, root, general)
                    buf = mine.copy()
                    run("broadcast", buf)
                    numpy.testing.assert_array_equal(buf, everyone[root])
                    assert moved == ([] if not shared else [("write", half)] if rank == root
                                     else [("read", nbytes - half)]), (why, moved)
                    result = numpy.full((2, nbytes // 8), -1.0)
                    run("gather", mine, result)
                    assert moved == alongside, (why, moved)
                    result[...] = -1.0
                    result[root] = mine if rank == root else -1.0
                    run("gather", result[root] if rank == root else mine, result)  # in place
                    assert moved == (whole if not general else split), (why, moved)
                    if rank == root:
                        numpy.testing.assert_array_equal(result, numpy.stack(everyone))
                    got = run("reduce", mine)  # through the area: reduced, taking nothing
                    assert moved == [], (why, moved)
                    if rank == root:
                        numpy.testing.assert_array_equal(got, everyone[0] + everyone[1])
                    sharing.shares = lambda: False
                    buf = mine.copy()
                    run("broadcast", buf)
                    numpy.testing.assert_array_equal(buf, everyone[root])
                    assert moved == [], (why, moved)
                    result[...] = -1.0
                    run("gather", mine, result)
                    assert moved == [], (why, moved)
                    if rank == root:
                        numpy.testing.assert_array_equal(result, numpy.stack(everyone))
                comm._transport.input_roads = False
                for says in (False, True):  # (left where it lies, whatever `Sharing` says)
                    sharing.shares = lambda: says
                    moved.clear()
                    got = comm.all_reduce(mine)
                    numpy.testing.assert_array_equal(got, everyone[0] + everyone[1])
                    assert moved == ([("read", nbytes)] if nbytes > slots.LEFT_BYTES else []), \
                        moved
        # A mismatch (the dtypes differ): rank 1 asked, and withdraws its ask without lending
        # its buffer, since rank 0 raises too, having written nothing; the next call is right.
        sharing.shares = lambda: True
        buf = numpy.zeros(slots.SHARED_BYTES // 8, dtype=numpy.float64 if rank else numpy.int64)
        try:
            comm.broadcast(buf, root=0)
        except collectives.MismatchError:
            pass
        else:
            raise AssertionError("a broadcast of two dtypes went through")
        share = (comm._transport._share_line + 1 - rank) * slots.WORDS
        assert comm._transport._own[share + 4] == 0 and not buf.any()
        assert not any(lent is buf for lent in slots._LENT), slots._LENT
        buf = numpy.full(slots.SHARED_BYTES // 8, float(rank))
        comm.broadcast(buf, root=0)
        assert not buf.any() and comm._transport._own[share + 4] == 0
    slots.read_peer_bytes, slots.write_peer_bytes = read, write
    # The root comes only once its reader has given up (by MPI: no race to lose).
    comm = collectives.init("shm", timeout=1)
    comm._transport.sharing.shares = lambda: True
    buf = numpy.zeros(slots.SHARED_BYTES // 8)
    said = ""
    try:
        if rank == 0:
            world.recv(source=1)
            comm.broadcast(buf + 7, root=0)
        else:
            try:
                comm.broadcast(buf, root=0)
            finally:
                world.send(None, dest=0)
    except collectives.CollectiveTimeoutError as error:
        said = str(error)
    world.barrier()
    if rank == 1:
        assert "one-shot inputs" in said, said
        assert not buf.any(), buf[:3]  # nothing written: the ask was withdrawn
        assert any(lent is buf for lent in slots._LENT), slots._LENT
    else:
        assert "its input to be read" in said, said
    print("shared inputs ok", flush=True)


def errors_scenario() -> None:
    """The errors of `init`, and the region's mode: none of them allocates a region."""
    from transports import bootstrap, shared_memory

    # A new region is 0600 whatever the umask, under a name nobody can guess.
    old = os.umask(0)
    try:
        path, memory = shared_memory.create_region(4096)
    finally:
        os.umask(old)
    mode = os.stat(path).st_mode & 0o777
    os.unlink(path)
    del memory
    assert mode == 0o600, oct(mode)
    assert re.fullmatch(r"/dev/shm/ringcc-[0-9a-f]{32}", path), path

    def must_not_allocate(nbytes):
        raise AssertionError("a region was created")

    create, shared_memory.create_region = shared_memory.create_region, must_not_allocate
    statvfs = os.statvfs

    class Tiny:
        f_bavail, f_frsize = 16, 4096  # 64 KiB free

    os.statvfs = lambda path: Tiny() if path == shared_memory.SHM_DIR else statvfs(path)
    try:
        collectives.init("shm")
    except collectives.CollectiveError as error:
        assert "/dev/shm has 0.1 MiB free" in str(error) and "segment_bytes" in str(error), error
    else:
        raise AssertionError("a /dev/shm too small went unnoticed")
    os.statvfs = statvfs

    # As if every rank were on a node of its own: where `init` and the transport look.
    nodes = bootstrap.nodes
    bootstrap.nodes = lambda comm, node_size=None: list(range(comm.Get_size()))
    try:
        collectives.init("shm")
    except collectives.CollectiveError as error:
        assert "span nodes" in str(error), error
    else:
        raise AssertionError("shm across nodes went unnoticed")
    with collectives.init("auto") as comm:
        assert comm.transport == "mpi"
        assert comm.all_reduce(numpy.arange(5) + comm.rank).tolist() == [1, 3, 5, 7, 9]
    bootstrap.nodes = nodes
    shared_memory.create_region = create

    # A rank that waits on a dead peer stops at once, not at the timeout.
    with collectives.init("shm", timeout=60) as comm:
        if comm.rank == 0:
            gone = subprocess.Popen(["true"])
            gone.wait()
            comm._transport._pids[1] = gone.pid  # as if rank 1 had died
            try:
                comm._transport.recv(numpy.empty(1), 1)
            except collectives.PeerFailedError as error:
                assert "rank 1" in str(error) and "has died" in str(error), error
            else:
                raise AssertionError("a dead peer went unnoticed")
    print("errors ok", flush=True)


def mismatch_scenario(single_copy: str) -> None:
    """A mismatch found in a call's first exchange (slots.py, "Folded checks"), after a rank
    published what fitted, slot segments or a direct message: every rank raises, nothing
    lands, and the next calls move the right data."""
    os.environ["RINGCC_SINGLE_COPY"] = single_copy
    with collectives.init("shm", segment_bytes=1 << 16, timeout=30) as comm:
        rank, size = comm.rank, comm.size
        block = (1 << 19) + 3  # float64: over 4 MiB, a direct message where single copy is on
        mine = numpy.arange(size * block, dtype=float).reshape(size, block) + rank
        want = numpy.stack([numpy.arange(size * block, dtype=float).reshape(size, block)[rank]
                            + r for r in range(size)])
        for wrong in ("all_to_all", "gather", "scatter", "sendrecv"):
            out = numpy.zeros_like(mine)
            stats = vars(comm.stats).copy()
            try:
                if wrong == "all_to_all":  # rank 0 sends float32
                    comm.all_to_all(mine.astype("f4") if rank == 0 else mine)
                elif wrong == "gather":  # rank 0 names another root
                    comm.gather(mine[0], out, root=1 if rank == 0 else 0)
                elif wrong == "scatter":  # ranks 0 and 1 each name themselves the root
                    comm.scatter(mine, out[0], root=0 if rank == 0 else 1)
                elif rank < 2:  # between ranks 0 and 1, rank 1 expecting an element less
                    comm.sendrecv(mine[0], 1 - rank, out[0][:block - rank])
            except collectives.MismatchError:
                pass
            else:
                if rank < 2:
                    raise AssertionError(f"a mismatched {wrong} went unnoticed")
            assert not out.any(), f"data landed in a mismatched {wrong}"
            if wrong == "sendrecv":
                assert vars(comm.stats) == stats, "a mismatched message was counted"
            numpy.testing.assert_array_equal(comm.all_to_all(mine), want)
            got = comm.gather(mine[0], root=size - 1)
            if rank == size - 1:
                numpy.testing.assert_array_equal(got, [mine[0] - rank + r for r in range(size)])
            got = comm.scatter(mine, root=size - 1)
            numpy.testing.assert_array_equal(got, mine[rank] - rank + size - 1)
            got = comm.sendrecv(mine[1], (rank + 1) % size, src=(rank - 1) % size)
            numpy.testing.assert_array_equal(got, mine[1] - rank + (rank - 1) % size)
    print("mismatch ok", flush=True)


def direct_scenario() -> None:
    """Which messages go by direct read: from DIRECT_BYTES up (copies from
    CROWDED_DIRECT_BYTES where ranks outnumber the cores), sent while receiving (a ring step,
    a sendrecv), or between a segment and DIRECT_BYTES while its roads measure them cheaper,
    the copies' roads and apart the reduced messages' (a reduce's ring step), where every rank
    has a core; or left for the receiver while the sender works (a
    scatter's root: from more than a segment where ranks share cores); and which are shared,
    the sender writing its part into the receiver (slots.py, "Shared copies"): from
    SHARED_BYTES up, sent one way, where every rank has a core. Messages on either side of the
    threshold, one way and both ways, checked against NumPy, with the reads and writes
    counted."""
    from mpi4py import MPI

    from collectives.scatter import shared_part
    from transports.slots import (CROWDED_DIRECT_BYTES, DIRECT_BYTES, READ_PIECE_BYTES,
                                  SHARED_BYTES)

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        cores = set().union(*MPI.COMM_WORLD.allgather(os.sched_getaffinity(0)))
        assert transport.oversubscribed == (size > len(cores))
        assert transport.shares_from == (None if transport.oversubscribed else SHARED_BYTES)
        direct_from = transport.copies_direct_from
        assert direct_from == (CROWDED_DIRECT_BYTES if transport.oversubscribed else DIRECT_BYTES)
        # (On 2 ranks a sendrecv has one peer, and is read in place from 512 KiB by its pair's
        # lines, `test_point_to_point.py`; here, the general path's roads.)
        pairs_read_from, transport.pairs_read_from = transport.pairs_read_from, None
        moved: list[tuple[str, int]] = []
        memory = transport.memory
        read, write = memory.read, memory.write
        past: list[int] = []  # how far past its offset in the peer's page each reduced piece lands

        def counted_read(pid: int, address: int, into: numpy.ndarray) -> None:
            moved.append(("read", into.nbytes))
            if numpy.shares_memory(into, transport._scratch):
                past.append((into.ctypes.data - address) % 4096)
            read(pid, address, into)

        memory.read = counted_read
        memory.write = lambda pid, address, data: (moved.append(("write", data.nbytes)),
                                                   write(pid, address, data))
        right, left = (rank + 1) % size, (rank - 1) % size

        def one_way(mine: numpy.ndarray, says: bool = True) -> None:
            """Shared where every rank has a core, from DIRECT_BYTES, or from SHARED_BYTES
            where `Sharing` `says` so; else through the slots, the copies into them timed."""
            moved.clear()
            transport.sharing.shares = lambda: says
            timed = transport.sharing.times
            if rank == 0:
                comm.send(mine, 1)
            elif rank == 1:
                numpy.testing.assert_array_equal(comm.recv(numpy.empty_like(mine), 0), mine - 1)
            del transport.sharing.shares
            nbytes = mine.nbytes
            shared = transport.shares_from is not None and nbytes >= transport.shares_from \
                and (says or nbytes >= DIRECT_BYTES)
            half = nbytes // 2 // 64 * 64
            assert moved == ([] if rank > 1 or not shared else
                             [("write", half)] if rank == 0 else [("read", nbytes - half)]), moved
            gauged = rank == 0 and not says and transport.shares_from is not None \
                and SHARED_BYTES <= nbytes < DIRECT_BYTES
            assert transport.sharing.times == timed + gauged, (timed, transport.sharing.times)

        for nbytes in (SHARED_BYTES - 64, SHARED_BYTES):
            for says in (True, False):
                one_way(numpy.arange(nbytes // 8, dtype=float) * size + rank, says)
        for nbytes in (direct_from - 64, direct_from):
            mine = numpy.arange(nbytes // 8, dtype=float) * size + rank
            moved.clear()
            # Both ways: a direct read, if any. (The transport's own sendrecv: the
            # communicator's moves each half alone where one peer comes first, `two_peers`.)
            got = numpy.empty_like(mine)
            transport.sendrecv(mine, right, got, left)
            numpy.testing.assert_array_equal(got, mine - rank + left)
            # (A middle-sized message's first road is the slots: nothing is timed yet.)
            assert moved == ([("read", nbytes)] if nbytes >= direct_from else []), moved
            if nbytes < direct_from and transport.roads is not None:
                # Then the road measured cheaper (`Roads`): each way in turn, timed.
                roads = transport.roads
                cost, times = dict(roads.cost), dict(roads.times)
                roads.times.update({"in": roads.WARM, "out": roads.WARM, "read": roads.WARM})
                for reading in (1e-12, 1.0):  # (seconds a byte)
                    roads.cost.update({"in": 1e-9, "out": 1e-9, "read": reading})
                    roads.explored = math.inf  # (no exploring)
                    roads.calls = roads.SAMPLE - 1  # (this call times the slots' copies)
                    moved.clear()
                    transport.sendrecv(mine, right, got, left)
                    numpy.testing.assert_array_equal(got, mine - rank + left)
                    assert moved == ([("read", nbytes)] if reading < 1e-9 else []), moved
                    timed = ("read", reading) if reading < 1e-9 else ("out", 1e-9)
                    assert roads.cost[timed[0]] != timed[1], roads.cost  # and timed
                roads.cost.update(cost)
                roads.times.update(times)
            one_way(mine)
            got = comm.broadcast(mine.copy(), root=size - 1)
            numpy.testing.assert_array_equal(got, mine - rank + size - 1)
            moved.clear()  # a scatter's root copies its own block while each peer reads its
            blocks = numpy.stack([mine + r * 0.5 for r in range(size)])  # own, whole
            got = comm.scatter(blocks, root=0)
            numpy.testing.assert_array_equal(got, mine - rank + rank * 0.5)
            assert moved == ([("read", nbytes)] if rank and (
                transport.one_sided or nbytes >= transport.isends_read_from) else []), moved
            # Reduced: each rank's incoming chunk read directly, a piece at a time, while the
            # reads cost less than the slots' copies by its reduced roads (`reduced_roads`),
            # else through the slots; then its chunks gathered: shared half and half (the
            # root has no block of its own).
            roads = transport.reduced_roads
            kept_roads = None if roads is None else (dict(roads.cost), dict(roads.times))
            if transport.forward_roads is not None:  # (its two steps: `forwarded_reduce`)
                transport.forward_roads[False].forwards = lambda: False
            for reading in (1e-12, 1.0):  # (seconds a byte)
                if roads is not None:
                    roads.times.update({"in": roads.WARM, "out": roads.WARM, "read": roads.WARM})
                    roads.cost.update({"in": 1e-9, "out": 1e-9, "read": reading})
                    roads.explored = math.inf  # (no exploring)
                moved.clear()
                past.clear()
                transport.sharing.shares = lambda: True
                got = comm.reduce(mine, root=0)
                assert set(past) <= {2048}, past  # (half a page, as `_shifted` places it)
                del transport.sharing.shares
                if rank == 0:
                    numpy.testing.assert_array_equal(
                        got, sum(mine - rank + r for r in range(size)))
                if size == 2 and transport.shares_from is not None:
                    chunk = nbytes // 2
                    pieces = [("read", min(READ_PIECE_BYTES, chunk - lo))
                              for lo in range(0, chunk, READ_PIECE_BYTES)]
                    assert chunk >= DIRECT_BYTES or roads is not None
                    assert moved == (pieces if chunk >= DIRECT_BYTES or reading < 1e-9 else []) \
                        + ([("write", chunk // 2 // 64 * 64)] if rank == 1
                           else [("read", chunk - chunk // 2 // 64 * 64)]), (reading, moved)
            if roads is not None:
                roads.cost.update(kept_roads[0])
                roads.times.update(kept_roads[1])
            if transport.forward_roads is not None:
                del transport.forward_roads[False].forwards
            gathered_while_written(comm, mine, moved)
        # A scatter's blocks of a segment and of more than a segment: each got one-sided (a
        # direct read) where direct reads work, but for the part the root writes into a
        # recvbuf given on two ranks (`scatter.shared_part`); else through the slots, the
        # receiver taking the first by its short way (`_take`), and read in place; by the lane
        # (a recvbuf given) and by the general path.
        for block in (numpy.arange(transport.slot_bytes // 8, dtype=float) * size,
                      numpy.arange(transport.slot_bytes // 8 + 8, dtype=float) * size):
            for recvbuf in (numpy.empty_like(block), None):
                moved.clear()
                got = comm.scatter(numpy.stack([block + r for r in range(size)]) if rank == 0
                                   else None, recvbuf if rank else None, root=0)
                numpy.testing.assert_array_equal(got, block + rank)
                part = shared_part(transport, block.nbytes) if recvbuf is not None else 0
                assert moved == ([("read", block.nbytes - part)] if rank and (
                    transport.one_sided or block.nbytes >= transport.isends_read_from)
                    else [("write", part)] if part else []), moved
        transport.pairs_read_from = pairs_read_from
        if size == 2 and pairs_read_from is not None:  # past a pair area: read in place
            mine = numpy.arange(pairs_read_from // 8 + 1, dtype=float) + rank
            moved.clear()
            numpy.testing.assert_array_equal(comm.sendrecv(mine, 1 - rank), mine - rank + left)
            assert moved == [("read", mine.nbytes)], moved
        if size == 2:  # (first: the all-reduce's ends with a dead neighbour's call)
            forwarded_reduce(comm, moved)
        forwarded_all_reduce(comm, moved)
        if transport.oversubscribed:  # the forwarded step on more ranks, as if each had a core
            transport.oversubscribed = False
            forwarded_all_reduce(comm, moved)
            transport.oversubscribed = True
    print("direct ok", flush=True)


def gathered_while_written(comm, mine: numpy.ndarray, moved: list[tuple[str, int]]) -> None:
    """A gather (by the general path: `mine` is larger than an area) whose root copies its
    own block while its first peer, sharing its message, writes all of it into the root's
    result (`recv_while`), and one whose peer does not share it (`Sharing` says no, below
    DIRECT_BYTES); after each, a shared message from that peer is written half, as asked: the
    root's ask ahead is never read for a later message. On two ranks, the moves counted."""
    from transports.slots import DIRECT_BYTES

    rank, size, transport = comm.rank, comm.size, comm._transport
    nbytes, half = mine.nbytes, mine.nbytes // 2 // 64 * 64
    for says in (True, False):
        moved.clear()
        transport.sharing.shares = lambda: says
        got = comm.gather(mine, root=0)
        if rank == 0:
            numpy.testing.assert_array_equal(got, [mine - rank + r for r in range(size)])
        shared = transport.shares_from is not None and (says or nbytes >= DIRECT_BYTES)
        if size == 2:
            assert moved == ([("write", nbytes)] if shared and rank == 1 else []), moved
        moved.clear()
        transport.sharing.shares = lambda: True
        if rank == 1:
            comm.send(mine, 0)
        elif rank == 0:
            numpy.testing.assert_array_equal(comm.recv(numpy.empty_like(mine), 1), mine + 1)
        del transport.sharing.shares
        if size == 2:
            assert moved == ([] if transport.shares_from is None else [("write", half)]
                             if rank == 1 else [("read", nbytes - half)]), moved


def forwarded_all_reduce(comm, moved: list[tuple[str, int]]) -> None:
    """The ring's last reduce-scatter step fused with its first all-gather step (slots.py,
    "Forwarded results"): where every rank has a core and every chunk is of DIRECT_BYTES or
    more, each rank writes its reduced chunk into its right neighbour, a slot's worth at a
    time; on two ranks with a core each, with chunks from REDUCED_DIRECT_BYTES, where both
    ranks vote for it (`ForwardRoad`, each way, each vote timed on the road taken); else
    nothing is written. Either way NumPy's result, bitwise the same on every rank, counted and
    traced as the ring's two steps."""
    from mpi4py import MPI

    from collectives.chunking import chunk_bounds
    from collectives.ring import ring_chunks
    from transports.slots import DIRECT_BYTES, REDUCED_DIRECT_BYTES

    rank, size, transport = comm.rank, comm.size, comm._transport
    road = None if transport.forward_roads is None else transport.forward_roads[True]
    assert (road is not None) == (size == 2 and not transport.oversubscribed)
    votes = [(True, True), (True, False), (False, True), (False, False)] if road else [None]
    for smallest, op, in_place, registered, vote in [
            (DIRECT_BYTES - 4, "sum", False, False, None),
            *[(REDUCED_DIRECT_BYTES, "sum", False, False, both) for both in votes],
            (DIRECT_BYTES, "sum", True, False, None),
            (DIRECT_BYTES, "avg", False, False, None),
            (DIRECT_BYTES, "sum", False, True, None)]:
        count = size * smallest // 4 + size - 1  # float32: uneven chunks, the smallest as said
        bounds = chunk_bounds(count, size)
        assert min(hi - lo for lo, hi in bounds) * 4 == smallest
        mine = cases.values(rank, count, "float32")
        if registered:  # rank 0's input in registered memory, its peers' in their own
            held = comm.empty(count, "float32")
            if rank == 0:
                held[...], mine = mine, held
        want = cases.reduce_reference(op, [cases.values(r, count, "float32")
                                           for r in range(size)]).astype("float32")
        times = pinned(road, vote, rank)
        moved.clear()
        comm.stats.reset()
        with comm.trace() as records:
            got = comm.all_reduce(mine, mine if in_place else None, op=op, algorithm="ring")
        cases.assert_matches(got, want, "float32")
        every = MPI.COMM_WORLD.allgather(got.tobytes())
        assert every == [every[0]] * size, (smallest, op)
        owned = (rank + 1) % size
        fused = not transport.oversubscribed and smallest >= DIRECT_BYTES or vote == (True, True)
        timed_as_taken(road, vote, times, fused)
        written = sum(nbytes for kind, nbytes in moved if kind == "write")
        assert written == ((bounds[owned][1] - bounds[owned][0]) * 4 if fused else 0), moved
        if registered and fused and size == 2 and rank == 1:  # rank 0's chunk read where it
            assert not [kind for kind, _ in moved if kind == "read"], moved  # lies, mapped
        # Counted and traced as the ring's schedule (all_reduce.py), step by step.
        steps = [("reduce", "reduce-scatter", s) for s in range(size - 1)] \
            + [("copy", "all-gather", s) for s in range(size - 1)]
        assert [(r["kind"], r["phase"], r["step"]) for r in records] == steps, records
        sent = sum(bounds[ring_chunks(rank, size, s, first)[0]][1]
                   - bounds[ring_chunks(rank, size, s, first)[0]][0]
                   for first in (0, 1) for s in range(size - 1)) * 4
        assert (comm.stats.bytes_sent, comm.stats.messages) == (sent, 2 * (size - 1))
    if transport.oversubscribed:
        return
    # A left neighbour that dies before it sends: its right neighbour stops at once.
    left = (rank - 1) % size
    if rank == 1:
        gone = subprocess.Popen(["true"])
        gone.wait()
        pids, transport._pids = transport._pids, list(transport._pids)
        transport._pids[left] = gone.pid  # as if the left neighbour had died
        chunk = numpy.ones(DIRECT_BYTES // 4, numpy.float32)
        try:
            transport.reduce_forward(chunk.copy(), (rank + 1) % size, chunk.copy(), left,
                                     numpy.add, chunk, chunk.copy(), 1, DIRECT_BYTES)
        except collectives.PeerFailedError as error:
            assert f"rank {left}" in str(error) and "has died" in str(error), error
        else:
            raise AssertionError("a dead left neighbour went unnoticed")
        transport._pids = pids


def pinned(road, vote: tuple[bool, bool] | None, rank: int) -> dict[str, int] | None:
    """This rank's vote on `road` (a `ForwardRoad`) pinned to vote[rank] for the next call
    (None: left to the road); the road's times so far."""
    if vote is None:
        return None
    road.forwards = lambda: vote[rank]
    return dict(road.times)


def timed_as_taken(road, vote: tuple[bool, bool] | None, times: dict[str, int] | None,
                   fused: bool) -> None:
    """After a call with a pinned vote (`pinned`): the vote unpinned, and the call timed on the
    road it took."""
    if vote is not None:
        del road.forwards
        times["forward" if fused else "steps"] += 1
        assert road.times == times, (vote, road.times)


def forwarded_reduce(comm, moved: list[tuple[str, int]]) -> None:
    """A reduce on two ranks: its one reduce-scatter step and its gather's one message in one
    call (reduce.py, `reduce_pair`), fused where every rank has a core, with chunks from
    REDUCED_DIRECT_BYTES to DIRECT_BYTES, where both ranks vote for it (`ForwardRoad`, the
    roads of a result that goes one way): then the root's peer writes its reduced chunk into
    the root's result and the root writes nothing; each vote timed on the road taken. Larger
    chunks take the two steps. Either way NumPy's result at either root, in place or not,
    counted and traced as the two steps."""
    from collectives.chunking import chunk_bounds
    from transports.slots import DIRECT_BYTES, REDUCED_DIRECT_BYTES

    rank, transport = comm.rank, comm._transport
    road = None if transport.forward_roads is None else transport.forward_roads[False]
    votes = [(True, True), (True, False), (False, True), (False, False)] if road else [None]
    for root in (0, 1):
        for smallest, op, in_place, vote in [
                *[(REDUCED_DIRECT_BYTES, "sum", False, both) for both in votes],
                (REDUCED_DIRECT_BYTES, "avg", True, votes[0]),
                (DIRECT_BYTES, "avg", True, None)]:
            count = 2 * smallest // 4 + 1  # float32: the root's peer's chunk the smaller
            bounds = chunk_bounds(count, 2)
            mine = cases.values(rank, count, "float32")
            want = cases.reduce_reference(op, [cases.values(r, count, "float32")
                                               for r in range(2)]).astype("float32")
            times = pinned(road, vote, rank)
            moved.clear()
            comm.stats.reset()
            with comm.trace() as records:
                got = comm.reduce(mine, mine if in_place and rank == root else None, op=op,
                                  root=root)
            if rank == root:
                cases.assert_matches(got, want, "float32")
            fused = vote == (True, True)  # (of larger chunks too: as two steps)
            timed_as_taken(road, vote, times, fused)
            written = sum(nbytes for kind, nbytes in moved if kind == "write")
            chunk = bounds[rank][1] - bounds[rank][0]
            if fused:
                assert written == (0 if rank == root else chunk * 4), moved
            assert [(r["kind"], r["phase"], r["step"]) for r in records] == [
                ("reduce", "reduce-scatter", 0), ("copy", "gather", 0)], records
            peers = bounds[1 - rank][1] - bounds[1 - rank][0]
            assert (comm.stats.bytes_sent, comm.stats.messages) == \
                ((peers * 4, 1) if rank == root else ((peers + chunk) * 4, 2)), vars(comm.stats)


def two_shot_scenario() -> None:
    """The two-shot all-reduce (two_shot.py) on every size of chunk it takes, empty ones too,
    in place and not, several ops and dtypes: NumPy's result, bitwise the same on every rank,
    the same bytes and messages as the ring over all ranks; its schedule as two_shot.py draws
    it; and `auto` takes it exactly where ranks outnumber cores, from AUTO_CHUNK_BYTES, and
    its first pass for a reduce-scatter there. Its second pass both ways: written into each
    peer where the transport reaches their memory (`one_sided`), else by messages."""
    from mpi4py import MPI

    from collectives.chunking import chunk_bounds

    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        written: list[int] = []
        put = transport.put
        transport.put = lambda peer, address, data: (written.append(peer),
                                                     put(peer, address, data))
        one_sided = transport.one_sided
        for count, dtype, op, in_place, reached in [
                (0, "float64", "sum", False, one_sided), (2, "int32", "sum", True, one_sided),
                (1009, "float64", "avg", False, one_sided),
                (1009, "float64", "avg", False, False),
                (70001, "float32", "max", True, one_sided),
                (70001, "float32", "max", True, False),
                (size * 32768, "int64", "prod", False, one_sided)]:
            mine = cases.values(rank, count, dtype)
            want = cases.reduce_reference(op, [cases.values(r, count, dtype)
                                               for r in range(size)]).astype(dtype)
            counted = []
            for algorithm in ("ring", "two_shot"):
                comm.stats.reset()
                source = mine.copy()
                written.clear()
                transport.one_sided = reached
                got = comm.all_reduce(source, source if in_place else None, op=op,
                                      algorithm=algorithm)
                transport.one_sided = one_sided
                counted.append(MPI.COMM_WORLD.allreduce(  # (uneven chunks: per rank, the
                    numpy.array([comm.stats.bytes_sent, comm.stats.bytes_received,  # two
                                 comm.stats.messages])).tolist())  # split them otherwise)
            cases.assert_matches(got, want, dtype)
            every = MPI.COMM_WORLD.allgather(got.tobytes())
            assert every == [every[0]] * size, (count, dtype, op)
            assert counted[0] == counted[1], counted
            chunk = chunk_bounds(count, size)[rank]
            assert written == ([(rank + step) % size for step in range(1, size)]
                               if reached and chunk[1] > chunk[0] else []), written
        del transport.put
        # The schedule above two_shot.py's code: every send started, then every receive, in
        # the order r+1, r+2, ..., in each pass.
        with comm.trace() as records:
            comm.all_reduce(numpy.ones(size * 1000), algorithm="two_shot")
        peers = [(rank + step) % size for step in range(1, size)]
        assert [(r["kind"], r["dst"], r["src"], r["phase"]) for r in records] == [
            *(("copy", p, None, "reduce-scatter") for p in peers),
            *(("reduce", None, p, "reduce-scatter") for p in peers),
            *(("copy", p, None, "all-gather") for p in peers),
            *(("copy", None, p, "all-gather") for p in peers)], records
        smallest = collectives.two_shot.AUTO_CHUNK_BYTES // 4  # float32
        for chunk, two_shot in ((smallest, transport.oversubscribed), (smallest - 1, False)):
            picked = collectives.all_reduce.auto_algorithm(transport, size * chunk, 4)
            assert picked == ("two_shot" if two_shot else "ring"), (chunk, picked)
        # Its first pass is the reduce-scatter where ranks outnumber cores, from blocks of
        # AUTO_CHUNK_BYTES: every block sent at once, then this rank's reduced from each peer.
        # Smaller blocks there, read in place, take one exchange (`read_in_one_exchange`).
        block = collectives.two_shot.AUTO_CHUNK_BYTES // 8  # float64
        peers = [(rank + step) % size for step in range(1, size)]
        for count, op, in_place in ((block, "sum", False), (block + 3, "avg", True),
                                    (block - 1, "max", False)):
            inputs = [numpy.stack([cases.values(r * size + b, count, "float64")
                                   for b in range(size)]) for r in range(size)]
            mine, want = inputs[rank], cases.reduce_reference(op, inputs)[rank]
            moved: list[tuple] = []
            comm.on_transfer(lambda record: moved.append((record["kind"], record["dst"],
                                                          record["src"])))
            got = comm.reduce_scatter(mine, mine[rank] if in_place else None, op=op)
            comm.on_transfer(None)
            cases.assert_matches(got, want, "float64")
            if transport.oversubscribed and count * 8 >= collectives.two_shot.AUTO_CHUNK_BYTES:
                assert moved == [*(("copy", p, None) for p in peers),
                                 *(("reduce", None, p) for p in peers)], moved
            elif collectives.reduce_scatter.read_in_one_exchange(transport, mine.nbytes):
                assert transport.oversubscribed
                assert moved == [("copy", p, (rank - step) % size)
                                 for step, p in enumerate(peers, 1)], moved
            else:
                right, left = (rank + 1) % size, (rank - 1) % size
                assert moved == [("reduce", right, left)] * (size - 1), moved
    print("two_shot ok", flush=True)


def exchanged_passes_scenario() -> None:
    """`auto` takes the reduce-scatter and all-gather exchanges (all_reduce.py) exactly where
    `exchanged_passes_pay` says: on 4 ranks or more that outnumber the cores, for equal
    chunks read in place of up to EXCHANGED_CHUNK_BYTES (the ring for one element more, or
    for chunks that differ, and on 3 ranks); such a call is NumPy's result, bitwise the same
    on every rank, made of the two exchanges alone (its trace: a block to and from each peer
    in each, no ring step); and a rank whose call differs makes every rank raise."""
    from mpi4py import MPI

    from collectives import all_reduce
    from transports.slots import CROWDED_INPUT_BYTES

    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        most = all_reduce.EXCHANGED_CHUNK_BYTES // 4  # float32
        taken = transport.oversubscribed and size > 3
        for count, picked in ((size * most, taken), (size * CROWDED_INPUT_BYTES // 4, taken),
                              (size * most + size, False), (size * most - 1, False)):
            assert all_reduce.auto_algorithm(transport, count, 4) == \
                ("reduce_scatter_all_gather" if picked else "ring"), (count, picked)
        if not taken:
            print("exchanged passes: not on 3 ranks, nor where ranks have their cores",
                  flush=True)
            return
        count = size * most
        inputs = [cases.values(r, count, "float32") for r in range(size)]
        with comm.trace() as records:
            got = comm.all_reduce(inputs[rank])
        cases.assert_matches(got, cases.reduce_reference("sum", inputs), "float32")
        every = MPI.COMM_WORLD.allgather(got.tobytes())
        assert every == [every[0]] * size
        peers = {(rank + step) % size for step in range(1, size)}
        assert {r["phase"] for r in records} == {"one-shot"}, records
        assert sorted(r["dst"] for r in records if r["dst"] is not None) == sorted([*peers] * 2)
        assert sorted(r["src"] for r in records if r["src"] is not None) == sorted([*peers] * 2)
        mine = numpy.ones(count if rank else count + size, numpy.float32)
        try:
            comm.all_reduce(mine)
            said = None
        except collectives.MismatchError as error:
            said = str(error)
        assert said is not None and "count" in said, said
        numpy.testing.assert_array_equal(comm.all_reduce(numpy.ones(count, numpy.float32)),
                                         numpy.full(count, size, numpy.float32))
    print("exchanged passes ok", flush=True)


# ---- the tests -----------------------------------------------------------------------------

def regions_of(output: str) -> list[str]:
    paths = re.findall(r"region (/dev/shm/ringcc-[0-9a-f]{32})", output)
    assert paths, output
    return paths


def assert_gone(paths: list[str]) -> None:
    assert not [p for p in paths if os.path.exists(p)], "left in /dev/shm"


@pytest.mark.parametrize("single_copy", ["1", "0"], ids=["single copy", "slots only"])
def test_many_segments_through_the_slots_and_always_the_ring(single_copy):
    job = mpiexec(3, __file__, "collectives", "64", "0", single_copy, timeout=60)
    assert job.stdout.count("collectives ok") == 3
    assert_gone(regions_of(job.stdout))


def test_always_one_shot():
    job = mpiexec(3, __file__, "collectives", "4096", str(1 << 20), "1", timeout=60)
    assert job.stdout.count("collectives ok") == 3
    assert_gone(regions_of(job.stdout))


@pytest.mark.parametrize("ranks", [3, 4])
def test_two_shot_all_reduce_is_numpys_result_bitwise_on_every_rank(ranks):
    job = mpiexec(ranks, __file__, "two_shot", timeout=90)
    assert job.stdout.count("two_shot ok") == ranks


@pytest.mark.parametrize("ranks", [3, 4, 5])
def test_auto_takes_the_reduce_scatter_and_all_gather_exchanges_where_ranks_share_cores(ranks):
    job = mpiexec(ranks, __file__, "exchanged_passes", timeout=90)
    assert job.stdout.count("exchanged passes ok" if 3 < ranks > len(os.sched_getaffinity(0))
                            else "exchanged passes: not") == ranks


def test_two_shot_is_refused_where_sends_cannot_run_ahead():
    """On threads a reducing receiver takes segments, not whole messages: N-1 sends under
    way could never be taken, so the call is refused, naming what to use instead."""
    def body(comm):
        try:
            comm.all_reduce(numpy.ones(100), algorithm="two_shot")
        except collectives.InvalidArgumentError as error:
            return str(error)

    for said in collectives.spawn(body, 3):
        assert said is not None and "two-shot" in said and "algorithm='ring'" in said, said


def test_a_middle_sized_message_takes_the_road_measured_cheaper():
    """`Roads`: the slots, then direct reads, for WARM calls each, each cost starting at the
    least of its warm-up, then whichever costs less per byte (a direct read by a margin), and
    the other road once every EXPLORE_SECONDS. Time stands still here: the last exploration
    is set by hand."""
    from transports.slots import Roads

    roads, warm = Roads(), Roads.WARM
    for first in range(warm):
        assert not roads.direct() and roads.sample()  # the slots, every call timed
        roads.took("in", 8.0 if first < 2 else 1.0, 1000)  # the first calls cold
        roads.took("out", 1.0, 1000)  # the slots: 2 ms a MB
    for first in range(warm):
        assert roads.direct()  # direct reads, to time them
        roads.took("read", 9.0 if first == 0 else 3.0, 1000)  # the first cold, then dearer
    assert roads.cost == pytest.approx({"in": 1e-3, "out": 1e-3, "read": 3e-3})  # the least
    roads.explored = math.inf  # (no exploring)
    assert [roads.direct() for _ in range(5)] == [False] * 5
    roads.explored = -math.inf  # time to explore: once, then the cheaper road again
    assert [roads.direct() for _ in range(3)] == [True, False, False]
    for _ in range(30):  # reads turn a little cheaper: not by the margin, so still the slots
        roads.took("read", 1.9, 1000)
    roads.explored = math.inf
    assert not roads.direct()
    for _ in range(30):  # then cheap: the running mean follows
        roads.took("read", 0.5, 1000)
    assert roads.cost["read"] < 0.6e-3 and roads.direct()
    roads.explored = -math.inf
    assert [roads.direct() for _ in range(3)] == [False, True, True]
    # While the direct reads are preferred, the slots' copies are timed at every call;
    # otherwise in one call of SAMPLE.
    assert all(roads.sample() for _ in range(Roads.SAMPLE))
    roads.took("read", 300.0, 1000)  # one read the scheduler interrupted: counted as 4x,
    roads.explored = math.inf  # and the road stays
    assert roads.cost["read"] < 1e-3 and roads.direct()
    for _ in range(30):  # reads dear again: the slots, their copies timed in one call of SAMPLE
        roads.took("read", 3.0, 1000)
    assert not roads.direct()
    assert [roads.sample() for _ in range(2 * Roads.SAMPLE)].count(True) == 2
    # A call's copies through the slots, timed a segment at a time, make one time.
    slots = Roads()
    copy_in = slots.timed("in", lambda piece: time.sleep(1e-3))
    for _ in range(3):
        copy_in(numpy.empty(1000, numpy.uint8))
    assert slots.cost["in"] is None
    slots.settle()
    assert slots.times["in"] == 1 and slots.cost["in"] >= 3e-3 / 3000
    slots.settle()  # (nothing more was timed)
    assert slots.times["in"] == 1
    copy_in(numpy.empty(1000, numpy.uint8))  # a call that raised before it settled:
    assert slots.sample()  # the next sampled call starts afresh
    slots.settle()
    assert slots.times["in"] == 1


def test_a_kind_of_sendrecv_prefers_reads_only_while_they_cost_under_the_margin():
    """`PairRoad`'s costs: the least of WARM calls on each road, then a running mean in which
    one time counts for at most OUTLIER times the mean; reads are preferred while they cost
    under MARGIN times the copies, and said so in the words (PREFERS_READ)."""
    from transports.base import MESSAGES
    from transports.slots import IN_PLACE, INLINE, PREFERS_READ, PairRoad

    road = PairRoad()
    for time_taken in (9.0, 2.0, 3.0, 2.5):  # the first cold
        road.took(INLINE, time_taken)
    assert road.cost[INLINE] == 2.0 and not road.prefers_read and road.say() == 0
    for time_taken in (1.6, 1.55, 1.7, 1.8):
        road.took(IN_PLACE, time_taken)
    assert road.cost[IN_PLACE] == 1.55 and not road.prefers_read  # not under 0.75 * 2.0
    road.took(IN_PLACE, 0.55)  # the mean moves a quarter of the way: 1.55 -> 1.3
    assert road.cost[IN_PLACE] == pytest.approx(1.3) and road.prefers_read
    assert road.say() == PREFERS_READ
    road.took(INLINE, 1000.0)  # one copy the scheduler interrupted: counted as 4x the mean
    assert road.cost[INLINE] == pytest.approx(2.0 + 0.25 * (8.0 - 2.0))
    road.heard(0)  # the next call not timed reads in place, as this rank said
    road._calls = 2 * PairRoad.WARM  # (past the warm-up)
    assert road.next() == (IN_PLACE, MESSAGES | IN_PLACE, False)


def test_a_crowded_send_is_left_in_place_while_its_copies_cost_over_slow():
    """`SendRoad`: WARM timed calls through the area, the cost the least of them; then
    through the area, one call in SAMPLE timed, while copies cost at most SLOW a byte; else
    in place, but for a run of RUN calls through the area once in EXPLORE calls, the last of
    them timed."""
    from transports.slots import SendRoad

    road = SendRoad()
    assert [road.next() for _ in range(SendRoad.WARM)] == [(False, True)] * SendRoad.WARM
    for nbytes_time in [9e-9] + [0.05e-9] * (SendRoad.WARM - 1):  # the first cold
        road.took(nbytes_time * 1000, 1000)
    assert road.cost == pytest.approx(0.05e-12 * 1000)
    calls = [road.next() for _ in range(2 * SendRoad.SAMPLE)]
    assert [left for left, _ in calls] == [False] * len(calls)
    assert sum(timed for _, timed in calls) == 2  # one in SAMPLE
    road.took(1.0, 1000)  # a copy the scheduler could not have slowed so: 4x the mean
    assert road.cost == pytest.approx(50e-12 + SendRoad.WEIGHT * (4 * 50e-12 - 50e-12))
    road.cost = 4 * SendRoad.SLOW
    road.calls = 0
    calls = [road.next() for _ in range(2 * SendRoad.EXPLORE)]
    through = [call for call, (left, _) in enumerate(calls, 1) if not left]
    explore, run = SendRoad.EXPLORE, SendRoad.RUN
    assert through == [c for k in (1, 2) for c in range(k * explore - run + 1, k * explore + 1)]
    assert [call for call, (_, timed) in enumerate(calls, 1) if timed] == [explore, 2 * explore]


def test_an_input_road_votes_by_the_reads_against_the_copies_and_goes_where_all_agree():
    """`InputRoad`, past its warm-up: a rank votes for the area while its reads cost MARGIN
    times its copy in (a byte of what its readers take) and its copies out, or more; where it
    makes no copy out (a reduce-scatter's work straight out of the area), against the copy in
    alone. The next call goes through the areas only where every rank's vote in this one said
    so, whatever this rank's own costs say."""
    from transports.slots import InputRoad

    road = InputRoad(copied=512, taken=512)
    road.cost = {"in": 1.0, "out": None, "read": 1.0}  # no copy out: 1.0 against 0.75 * 1
    assert road.prefers_area()
    road.cost["out"] = 1.0  # 1.0 against 0.75 * 2
    assert not road.prefers_area()
    road.cost = {"in": 1.0, "out": None, "read": 0.7}  # under 0.75 * 1
    assert not road.prefers_area()
    road.cost["in"] = None  # (no copy timed yet)
    assert not road.prefers_area()
    road.calls = 2 * InputRoad.WARM  # (past the warm-up, and the next calls not explored)
    for votes, area in (([True, True], True), ([True, False], False), ([False, True], False),
                        ([1, 1, 1], True), ([0, 1, 1], False)):
        road.heard(iter(votes))
        assert road.takes_first() == area, votes


def test_a_forward_road_votes_for_the_cheaper_and_explores_the_other_with_its_peer():
    """`ForwardRoad`: the ring's two steps in the first WARM calls, the forwarded step in the
    next WARM, then the road that costs less, but for a run of RUN calls from each power of
    two from 4 * WARM to EXPLORE, then once in EXPLORE, which take the other: chosen by the
    call's number alone, so both ranks explore at once."""
    from transports.slots import ForwardRoad

    road = ForwardRoad()
    warm, explore, run = ForwardRoad.WARM, ForwardRoad.EXPLORE, ForwardRoad.RUN
    assert [road.forwards() for _ in range(2 * warm)] == [False] * warm + [True] * warm
    starts = [1 << k for k in range((4 * warm).bit_length() - 1, explore.bit_length())]
    explored = [start + k for start in starts + [2 * explore] for k in range(run)]
    assert starts[0] == 4 * warm and starts[-1] == explore
    for forward, steps in ((1.0, 2.0), (2.0, 1.0)):
        road.calls = 2 * warm
        road.cost = {"steps": steps, "forward": forward}
        votes = {call: road.forwards() for call in range(2 * warm + 1, 2 * explore + run)}
        assert [call for call, vote in votes.items() if vote != (forward < steps)] == explored


def test_place_lands_rank_rs_bytes_in_block_r_or_one_read_in_a_block_of_its_own():
    """`place`: the bytes each read names, rank r's in block r of `into`; where one read only
    is not empty (a broadcast's) and `into` holds that one block, there; where `into` holds
    one block but several reads are not empty, no silent overwrite: NumPy refuses."""
    from transports.base import place

    inputs = [numpy.arange(8, dtype=numpy.uint8) + 10 * r for r in range(3)]
    into = numpy.zeros(12, numpy.uint8)
    place(inputs, ((0, 4), (4, 8), (2, 6)), into)
    assert into.tolist() == [0, 1, 2, 3, 14, 15, 16, 17, 22, 23, 24, 25]
    one = numpy.zeros(8, numpy.uint8)
    place(inputs, ((0, 0), (0, 8), (0, 0)), one)
    assert one.tolist() == list(range(10, 18))
    with pytest.raises(ValueError):
        place(inputs, None, numpy.zeros(8, numpy.uint8))


def test_direct_moves_whose_ends_nearly_alias_go_through_a_bounce_and_land_whole(monkeypatch):
    """A direct read or write whose destination lies 1 to 15 bytes past its source within a
    page, of SHIFTED_LEAST or more, or 16 to 31 bytes past, of NEAR_SHIFTED_LEAST or more
    (here lowered to a bounce's piece), goes through the bounce buffer (`_shifted`), every
    other straight; either way every byte lands where it belongs and none beside it. (This
    process reads and writes itself, as it may.)"""
    from transports import shared_memory

    from mpi4py import MPI

    if not shared_memory.can_read_peers(MPI.COMM_SELF, [os.getpid()]):
        pytest.skip("this machine refuses process_vm_readv")
    bounced = []
    shifted = shared_memory._shifted
    monkeypatch.setattr(shared_memory, "_shifted",
                        lambda *args: (bounced.append(args[4]), shifted(*args)))
    monkeypatch.setattr(shared_memory, "NEAR_SHIFTED_LEAST", shared_memory.BOUNCE_BYTES)
    longest = 2 * shared_memory.BOUNCE_BYTES + 7  # three pieces, the last one short
    source = numpy.random.default_rng(1).integers(0, 256, longest + 4 * 4096, numpy.uint8)
    into = numpy.zeros_like(source)
    page = source.ctypes.data + -source.ctypes.data % 4096  # each end from a page start
    landing = into.ctypes.data + -into.ctypes.data % 4096
    least = shared_memory.SHIFTED_LEAST
    for nbytes in (100, least - 1, least, shared_memory.BOUNCE_BYTES, longest):
        for start, end in ((0, 0), (0, 4), (0, 15), (0, 16), (0, 31), (0, 32), (4, 0),
                           (1000, 1008), (1000, 1024), (5, 4101)):
            for how in ("read", "write"):
                into[...] = 0
                before = len(bounced)
                if how == "read":
                    shared_memory.read_peer_bytes(os.getpid(), page + start, landing + end,
                                                  nbytes)
                else:
                    shared_memory.write_peer_bytes(os.getpid(), landing + end, page + start,
                                                   nbytes)
                lo = landing + end - into.ctypes.data
                assert numpy.array_equal(into[lo:lo + nbytes],
                                         source[page + start - source.ctypes.data:][:nbytes])
                assert not into[:lo].any() and not into[lo + nbytes:].any()
                past = (end - start) % 4096
                aliases = 0 < past < 16 or 16 <= past < 32 \
                    and nbytes >= shared_memory.BOUNCE_BYTES
                assert len(bounced) - before == (aliases and nbytes >= least), \
                    (nbytes, start, end, how)


def test_placing_lands_what_place_lands_one_whole_block_by_one_assignment(monkeypatch):
    """`placing(reads)`, made once for an exchange, lands the same bytes as `place`: one rank's
    whole input into a block of its shape and dtype (a broadcast's) by one assignment, which
    `place` is then not asked for; anything else (another shape or dtype, part of an input,
    several reads, none named) by `place` itself."""
    from transports import base

    inputs = [(numpy.arange(6, dtype=numpy.float32) + 10 * r).reshape(2, 3) for r in range(3)]
    cases = [(((0, 0), (0, 24), (0, 0)), numpy.zeros((2, 3), numpy.float32)),  # the assignment
             (((0, 0), (0, 24), (0, 0)), numpy.zeros(6, numpy.float32)),  # another shape
             (((0, 0), (0, 24), (0, 0)), numpy.zeros((2, 3), numpy.int32)),  # another dtype
             (((0, 0), (8, 24), (0, 0)), numpy.zeros(4, numpy.float32)),  # part of one input
             (((0, 8), (8, 16), (16, 24)), numpy.zeros(6, numpy.float32)),  # several reads
             (None, numpy.zeros((3, 2, 3), numpy.float32))]  # every input whole
    for reads, into in cases:
        want = numpy.zeros_like(into)
        base.place(inputs, reads, want)
        base.placing(reads)(inputs, into)
        assert into.tobytes() == want.tobytes(), reads
    placed = base.placing(cases[0][0])

    def refused(*args: object) -> None:
        raise AssertionError("place was asked for a block one assignment lands")
    monkeypatch.setattr(base, "place", refused)
    into = numpy.zeros((2, 3), numpy.float32)
    placed(inputs, into)
    assert into.tobytes() == inputs[1].tobytes()


def test_an_input_is_shared_while_copies_into_the_area_cost_more_than_slow():
    """`Sharing`: through the area for WARM calls, the cost starting at the least of them, then
    shared while copies into the area cost more than SLOW a byte, through the area once every
    EXPLORE_SECONDS (whose copy is timed), and through the area while they cost less. Time
    stands still here: the last exploration is set by hand."""
    from transports.slots import Sharing

    sharing, slow = Sharing(), Sharing.SLOW * 1000  # (seconds for 1000 bytes)
    for first in range(Sharing.WARM):
        assert not sharing.shares()
        sharing.took(8 * slow if first == 0 else 3 * slow, 1000)  # the first cold
    assert sharing.cost == pytest.approx(3 * Sharing.SLOW)  # the least
    sharing.explored = math.inf  # (no exploring)
    assert [sharing.shares() for _ in range(5)] == [True] * 5
    sharing.explored = -math.inf  # time to explore: once through the area, then shared again
    assert [sharing.shares() for _ in range(3)] == [False, True, True]
    sharing.took(100 * slow, 1000)  # a copy the scheduler interrupted: counted as 4x
    assert sharing.cost == pytest.approx(7.5 * Sharing.SLOW)
    for _ in range(10):  # copies turn cheap (the cores share their caches): the area
        sharing.took(0.5 * slow, 1000)
    sharing.explored = math.inf
    assert sharing.cost < Sharing.SLOW and not any(sharing.shares() for _ in range(5))
    for _ in range(10):  # and dear again: shared
        sharing.took(2 * slow, 1000)
    assert sharing.shares()
    bounded = Sharing(4 * Sharing.SLOW)  # (another bound: a reduced message's, REDUCED_SLOW)
    for _ in range(Sharing.WARM):
        bounded.took(2 * slow, 1000)
    bounded.explored = math.inf
    assert not bounded.shares()
    for _ in range(10):
        bounded.took(8 * slow, 1000)
    assert bounded.shares()


@pytest.mark.parametrize("ranks", [2, 4])
def test_direct_reads_both_ways_and_shared_copies_one_way_where_each_rank_has_a_core(ranks):
    job = mpiexec(ranks, __file__, "direct", timeout=60)
    assert job.stdout.count("direct ok") == ranks


@pytest.mark.parametrize("single_copy", ["1", "0"], ids=["single copy", "slots only"])
def test_the_ring_on_four_ranks_sharing_two_cores(single_copy):
    job = mpiexec(4, __file__, "collectives", "1024", "0", single_copy, timeout=60)
    assert job.stdout.count("collectives ok") == 4
    assert_gone(regions_of(job.stdout))


def test_nothing_left_after_an_exception():
    job = mpiexec(3, __file__, "failure", "raise", timeout=60, check=False)
    assert job.returncode != 0
    assert "rank 1 fails on purpose" in job.stderr
    assert_gone(regions_of(job.stdout))


def test_nothing_left_after_kill_9_and_the_job_ends():
    job = mpiexec(3, __file__, "failure", "kill", timeout=60, check=False)
    assert job.returncode != 0
    assert_gone(regions_of(job.stdout))


def test_a_rank_killed_within_a_shared_message_ends_the_job():
    job = mpiexec(2, __file__, "shared_failure", timeout=60, check=False)
    assert job.returncode != 0
    assert_gone(regions_of(job.stdout))


def scenario_ends_well(name: str, ranks: int, said: str) -> None:
    """Run scenario `name` on `ranks` ranks: every rank says `said`, and no region is left.
    Skipped, saying why, where a scenario that needs direct reads finds none."""
    job = mpiexec(ranks, __file__, name, timeout=60)
    if "no direct reads here" in job.stdout:
        pytest.skip("this machine refuses direct reads (process_vm_readv) between ranks")
    assert job.stdout.count(said) == ranks
    assert_gone(regions_of(job.stdout))


def test_a_peers_region_is_read_only_for_good():
    """A peer's region is mapped read-only: no view of it can be made writeable (a write
    would end the process with SIGSEGV), and the owner's writes show through."""
    from transports import shared_memory

    path, mine = shared_memory.create_region(4096)
    try:
        theirs = shared_memory.attach_region(path, 4096)
    finally:
        os.unlink(path)
    mine[:3] = 7
    assert theirs[:3].tolist() == [7, 7, 7] and not theirs.flags.writeable
    with pytest.raises(ValueError):
        theirs[1:].flags.writeable = True


def test_a_peer_that_died_and_is_not_yet_reaped_counts_as_dead_in_a_long_wait():
    """A process that died, and whose parent has not reaped it (a zombie: a launcher that
    does not clean up), still takes signals: the wait for it ran to its timeout instead of
    saying the peer died. Now and then a long wait reads the peer's state."""
    from transports.slots import _alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        state = ""
        while state != "Z":  # until it has died; Popen reaps it only when asked
            time.sleep(0.01)
            with open(f"/proc/{child.pid}/stat") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        assert _alive(child.pid) and not _alive(child.pid, thorough=True)
    finally:
        child.wait()


def test_a_receiver_that_gives_up_on_a_shared_message_keeps_the_buffer_it_lent():
    scenario_ends_well("late_share", 2, "late share ok")


def test_inputs_taken_one_way_are_shared_on_two_ranks():
    scenario_ends_well("shared_inputs", 2, "shared inputs ok")


def test_errors_come_before_any_region_and_regions_are_0600():
    scenario_ends_well("errors", 2, "errors ok")


def test_registered_memory_is_read_in_place_and_freed():
    job = mpiexec(3, __file__, "registered", timeout=60)
    assert job.stdout.count("registered ok") == 3
    assert len(regions_of(job.stdout)) > 3 * 3  # the transport's own, then one per empty()
    assert_gone(regions_of(job.stdout))


@pytest.mark.parametrize("ranks, single_copy", [(3, "1"), (3, "0"), (2, "1")],
                         ids=["single copy", "slots only", "shared, 2 ranks"])
def test_a_mismatch_found_in_the_first_exchange_withdraws_what_was_published(ranks,
                                                                              single_copy):
    """On 2 ranks of 2 cores a gather's 4 MiB block is a shared message (slots.py)."""
    job = mpiexec(ranks, __file__, "mismatch", single_copy, timeout=120)
    assert job.stdout.count("mismatch ok") == ranks
    assert_gone(regions_of(job.stdout))


def one_sided_scatter_scenario() -> None:
    """A scatter's blocks moved one-sided (collectives/scatter.py): each rank but the root
    reads its own block straight out of the root's buffer, once, and sends or announces no
    message; by the lane (a recvbuf given) and by the general path, from every root, uneven
    blocks too, empty ones among them, and from registered memory (copied out of the root's
    mapping: no read). A rank whose recvbuf does not fit raises, having met its peers at the
    barrier, and the communicator goes on. `stats` counts each block once, sent and received."""
    from transports import slots

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        assert transport.one_sided == transport.single_copy
        if not transport.one_sided:
            print("one-sided: no direct reads here", flush=True)
            return
        moved: list[tuple[str, int]] = []
        read = transport.memory.read
        transport.memory.read = lambda pid, address, into: (moved.append(("read", into.nbytes)),
                                                            read(pid, address, into))
        block = 20_000  # float64s: more than a description holds (scatter.INLINE_BYTES)
        for root in range(size):
            blocks = numpy.arange(size * block, dtype=float).reshape(size, block) + root
            for given in (True, False):
                moved.clear()
                comm.stats.reset()
                sent_before = list(transport._sent)
                got = comm.scatter(blocks if rank == root else None,
                                   numpy.empty(block) if given else None, root=root)
                numpy.testing.assert_array_equal(got, blocks[rank])
                assert moved == ([] if rank == root else [("read", block * 8)]), moved
                assert transport._sent == sent_before  # no message, no slot
                stats = comm.stats
                assert (stats.bytes_sent, stats.bytes_received, stats.messages) == (
                    ((size - 1) * block * 8, 0, size - 1) if rank == root
                    else (0, block * 8, 0)), stats
        counts = [0 if r == 1 else 40_000 * (r + 1) for r in range(size)]
        flat = numpy.arange(sum(counts), dtype=numpy.int32)
        moved.clear()
        got = comm.scatter(flat if rank == 0 else None, root=0, counts=counts)
        numpy.testing.assert_array_equal(got, flat[sum(counts[:rank]):sum(counts[:rank + 1])])
        assert moved == ([("read", counts[rank] * 4)] if rank and counts[rank] else []), moved
        wrong = (block + 1,) if rank == size - 1 else (block,)
        try:  # the last rank's recvbuf does not fit the root's blocks
            comm.scatter(blocks if rank == 0 else None, numpy.empty(wrong), root=0)
            said = None
        except collectives.InvalidArgumentError as error:
            said = str(error)
        assert (said is None) == (rank != size - 1), said
        registered = comm.empty((size, block))
        registered[...] = blocks
        moved.clear()
        got = comm.scatter(registered if rank == 0 else None, numpy.empty(block), root=0)
        numpy.testing.assert_array_equal(got, blocks[rank])
        assert moved == [], moved  # (out of the root's mapping)
        del registered
        assert not slots._LENT
    print("one-sided ok", flush=True)


def shared_scatter_scenario() -> None:
    """On two ranks with a core each, a one-sided scatter's root writes the first part of its
    peer's block into the peer's buffer (`scatter.shared_part`) while the peer reads the rest:
    the lane's peer offers its recvbuf, and the root writes there whichever path it takes,
    into registered memory too (by the kernel: mappings of peers' regions are read-only). A
    peer on the general path offers nothing, and reads its block whole, even where its last
    call by the lane offered a buffer (that buffer is left as it was). Never on three
    ranks."""
    from collectives import scatter

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        if not transport.one_sided:
            print("shared scatter: no direct reads here", flush=True)
            return
        moved: list[tuple[str, int]] = []
        read, write = transport.memory.read, transport.memory.write
        transport.memory.read = lambda pid, address, into: (moved.append(("read", into.nbytes)),
                                                            read(pid, address, into))
        transport.memory.write = lambda pid, address, data: (
            moved.append(("write", data.nbytes)), write(pid, address, data))
        block = 64 << 10  # float64s: 512 KiB a block
        part = scatter.shared_part(transport, block * 8)
        assert bool(part) == (size == 2 and not transport.oversubscribed), part
        kept = numpy.full(block, -1.0)  # the buffer the last lane call offered
        landing = comm.empty(block)  # registered (collective: made by every rank)
        for root in range(size):
            blocks = numpy.arange(size * block, dtype=float).reshape(size, block) + root
            for peer_way in ("lane", "general", "none", "registered"):
                for root_way in ("lane", "general"):
                    moved.clear()
                    if rank == root:
                        call = comm.scatter if root_way == "lane" else comm._scatter
                        got = call(blocks, numpy.empty(block), root=root)
                        offered = peer_way in ("lane", "registered")
                        assert moved == ([("write", part)] if part and offered
                                         else []), (peer_way, root_way, moved)
                    else:
                        if peer_way == "lane":
                            kept = numpy.empty(block)
                            got = comm.scatter(None, kept, root=root).copy()
                            kept[...] = -1.0  # (nothing writes it from here on)
                        elif peer_way == "general":
                            got = comm._scatter(None, numpy.empty(block), root=root)
                        elif peer_way == "none":
                            got = comm.scatter(None, None, root=root)
                        else:
                            got = comm.scatter(None, landing, root=root)
                        offered = peer_way in ("lane", "registered")
                        assert moved == [("read", block * 8 - (part if offered else 0))], \
                            (peer_way, root_way, moved)
                        assert (kept == -1.0).all()  # (an earlier offer is not written into)
                    numpy.testing.assert_array_equal(got, blocks[rank])
        del landing
    print("shared scatter ok", flush=True)


def one_sided_broadcast_scenario() -> None:
    """A broadcast larger than an exchange holds, on more than two ranks that outnumber the
    cores (collectives/broadcast.py, `reads_from_root`), goes one-sided: each rank but the root
    reads the root's buffer once, whole, straight out of its memory (none out of registered
    memory: a copy out of the root's mapping), and no slot line is announced; from every root,
    strided and registered buffers too. `stats` counts the root's buffer to each rank. Ranks
    whose sizes differ raise MismatchError, every one, having taken nothing. The plain calls
    take the lane (collectives/small.py), and a rank on the general path (a strided buffer)
    meets the others' lanes. (On a machine with a core per rank, the ranks are told they share
    cores, as they all agree.)"""
    from collectives.broadcast import reads_from_root

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        if not transport.one_sided:
            print("one-sided: no direct reads here", flush=True)
            return
        transport.oversubscribed = True
        count = transport.one_shot_bytes // 8 + 1000  # float64s: more than an exchange holds
        assert reads_from_root(transport, count * 8)
        moved: list[tuple[str, int]] = []
        read = transport.memory.read
        transport.memory.read = lambda pid, address, into: (moved.append(("read", into.nbytes)),
                                                            read(pid, address, into))
        general: list[int] = []  # the calls that took the general path
        general_path = comm._broadcast
        comm._broadcast = lambda *args, **kwargs: (general.append(1),
                                                   general_path(*args, **kwargs))[1]
        for root in range(size):
            moved.clear()
            comm.stats.reset()
            sent_before = list(transport._sent)
            mine = numpy.arange(count, dtype=float) + root if rank == root else numpy.zeros(count)
            got = comm.broadcast(mine, root=root)
            numpy.testing.assert_array_equal(got, numpy.arange(count, dtype=float) + root)
            assert moved == ([] if rank == root else [("read", count * 8)]), moved
            assert transport._sent == sent_before  # no message, no slot
            stats = comm.stats
            assert (stats.bytes_sent, stats.bytes_received, stats.messages) == (
                ((size - 1) * count * 8, 0, size - 1) if rank == root else (0, count * 8, 0)), stats
        assert general == [], general
        # rank 0 alone strided, on the general path: it meets the others' lanes
        buf = numpy.zeros((count, 2))[:, 0] if rank == 0 else numpy.zeros(count)
        if rank == 1:
            buf[:] = numpy.arange(count)
        comm.broadcast(buf, root=1)
        numpy.testing.assert_array_equal(buf, numpy.arange(count))
        assert len(general) == (rank == 0), general
        registered = comm.empty(count)
        registered[...] = numpy.arange(count) if rank == 0 else -1
        moved.clear()
        comm.broadcast(registered, root=0)
        numpy.testing.assert_array_equal(registered, numpy.arange(count))
        assert moved == [], moved  # (out of the root's mapping)
        del registered
        mine = numpy.full(count + (rank == size - 1), float(rank))
        moved.clear()
        try:  # the last rank's count differs: every rank raises, none takes anything
            comm.broadcast(mine, root=0)
            said = None
        except collectives.MismatchError as error:
            said = str(error)
        assert said is not None and moved == [] and (mine == rank).all(), (said, moved)
        got = comm.broadcast(numpy.full(count, float(rank)), root=size - 1)
        assert (got == size - 1).all()
        assert len(general) == (rank == 0), general
        del comm._broadcast
    print("one-sided broadcast ok", flush=True)


def pair_roads_scenario() -> None:
    """On two ranks with a core each, a kind of sendrecv below a pair area (here 64 KiB) takes
    the road agreed by `PairRoad`: the pair areas, then reads in place, for WARM calls each;
    then reads in place on both ranks while either says its reads cost less (only rank 0 says
    so here, its costs set by hand), through the areas again once neither does; RUN calls on the
    other road once in EXPLORE timed calls. Every message lands whole, whichever road."""
    from transports.slots import IN_PLACE, INLINE, PairRoad

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, transport, peer = comm.rank, comm._transport, 1 - comm.rank
        if transport.roads is None:
            print("pair roads: no direct reads here", flush=True)
            return
        reads = counted_reads(transport)
        count, prefers = 8192, [rank == 0]  # float64s: 64 KiB each way (PAIR_ROADS_FROM)
        roads: list[str] = []
        for call in range(1, 2 * PairRoad.SAMPLE * PairRoad.EXPLORE + 1):
            if call == 1 + PairRoad.SAMPLE * PairRoad.EXPLORE:
                prefers[0] = False
            before = len(reads)
            got = comm.sendrecv(cases.values(rank + call, count, "float64"), peer)
            numpy.testing.assert_array_equal(got, cases.values(peer + call, count, "float64"))
            if call == 1:  # the kind's road: its costs as this test says, whatever the times
                road = transport.pair_roads[(peer, count * 8, count * 8)]
                road.took = lambda *times: setattr(road, "prefers_read", prefers[0])
            mark = cases._last_mark(transport, peer) & (INLINE | IN_PLACE)
            roads.append("areas" if mark == INLINE else "read")
            assert (len(reads) > before) == (mark == IN_PLACE), call  # we read the peer's
        warm, sample, explore = PairRoad.WARM, PairRoad.SAMPLE, PairRoad.EXPLORE
        run = PairRoad.RUN  # (calls that explore: the last one timed)
        expected = ["areas"] * warm + ["read"] * warm
        expected += ["read"] * (sample * explore - run - len(expected)) + ["areas"] * run
        # Rank 0's costs change after call sample * explore: its next timed call still says
        # what it said before (a rank says what its costs said before the call's own time).
        expected += ["read"] * 2 * sample
        expected += ["areas"] * (sample * explore - 2 * sample - run) + ["read"] * run
        assert roads == expected, [(i + 1, r) for i, (r, e) in enumerate(zip(roads, expected))
                                   if r != e][:5]
        print("pair roads ok", flush=True)


def assert_send_roads(roads: list[str]) -> None:
    """`roads`, a `SendRoad`'s calls over 2 * EXPLORE with the copies made dear from call
    EXPLORE / 2 on, are: the area until then, in place after, but for a run of RUN through
    the area once in EXPLORE calls."""
    from transports.slots import SendRoad

    explore, run = SendRoad.EXPLORE, SendRoad.RUN
    expected = ["area"] * (explore // 2 - 1) + ["place"] * (explore // 2 - run + 1)
    expected += ["area"] * run + ["place"] * (explore - run) + ["area"] * run
    assert roads == expected, [(i + 1, r) for i, (r, e) in enumerate(zip(roads, expected))
                               if r != e][:5]


def crowded_ring_scenario() -> None:
    """Ring shifts of 64 KiB (PAIR_ROADS_FROM) on ranks that share cores: each rank's send
    goes through its pair area while its `SendRoad` says copies cost at most SLOW a byte,
    and is left in place, its receiver reading it, while they cost more, but for the runs
    through the area that keep the cost known (the costs set by hand, every rank alike). Every
    message lands whole, whichever road; a rank reads exactly when its sender left it."""
    from transports.slots import IN_PLACE, INLINE, PAIR_ROADS_FROM, SendRoad

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        if not transport.single_copy:
            print("crowded ring: no direct reads here", flush=True)
            return
        dst, src, count = (rank + 1) % size, (rank - 1) % size, PAIR_ROADS_FROM // 8
        road = transport.send_roads[(dst, count * 8)] = SendRoad()
        road.times, road.cost, road.took = SendRoad.WARM, 0.0, lambda *args: None
        reads = counted_reads(transport)
        roads = []
        calls = 2 * SendRoad.EXPLORE
        for call in range(1, calls + 1):
            if call == SendRoad.EXPLORE // 2:
                road.cost = 2 * road.slow  # copies dear from here on
            before = len(reads)
            got = comm.sendrecv(cases.values(rank + call, count, "float64"), dst, src=src)
            numpy.testing.assert_array_equal(got, cases.values(src + call, count, "float64"))
            mark = cases._last_mark(transport, dst) & (INLINE | IN_PLACE)
            roads.append("area" if mark == INLINE else "place")
            assert (len(reads) > before) == (mark == IN_PLACE), call  # src did as we did
        assert_send_roads(roads)
        print("crowded ring ok", flush=True)


def sends_alone_scenario() -> None:
    """A send with no recv beside it, of 64 KiB (PAIR_ROADS_FROM), on two ranks with a core
    each: it goes through its pair area while its `SendRoad` says copies cost at most SEND_SLOW
    a byte, and is left in place, its receiver reading it, while they cost more, but for the
    runs through the area that keep the cost known (the costs set by hand, on both ranks alike,
    in a ping-pong). Every message lands whole, whichever road; a rank reads exactly when its
    sender left it. (Where the two ranks share a core, a send alone has no road.)"""
    from transports.slots import IN_PLACE, INLINE, PAIR_ROADS_FROM, SEND_SLOW, SendRoad

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, transport = comm.rank, comm._transport
        if transport.send_roads is None:
            print("sends alone: no direct reads here", flush=True)
            return
        peer, count = 1 - rank, PAIR_ROADS_FROM // 8
        if transport.oversubscribed:
            got = numpy.empty(count)
            for _ in range(2):
                if rank == 0:
                    comm.send(numpy.ones(count), peer)
                comm.recv(got, peer)
                if rank == 1:
                    comm.send(numpy.ones(count), peer)
            assert not transport.send_roads, transport.send_roads
            print("sends alone ok (ranks share a core: no road)", flush=True)
            return
        road = transport.send_roads[(peer, count * 8)] = SendRoad(SEND_SLOW)
        road.times, road.cost, road.took = SendRoad.WARM, 0.0, lambda *args: None
        reads = counted_reads(transport)
        roads = []
        for call in range(1, 2 * SendRoad.EXPLORE + 1):
            if call == SendRoad.EXPLORE // 2:
                road.cost = 2 * SEND_SLOW  # copies dear from here on
            mine, got = cases.values(rank + call, count, "float64"), numpy.empty(count)
            if rank == 0:
                comm.send(mine, peer)
                mark = cases._last_mark(transport, peer)
            before = len(reads)
            comm.recv(got, peer)
            read = len(reads) > before
            if rank == 1:
                comm.send(mine, peer)
                mark = cases._last_mark(transport, peer)
            numpy.testing.assert_array_equal(got, cases.values(peer + call, count, "float64"))
            roads.append("area" if mark == INLINE else "place" if mark == IN_PLACE else mark)
            assert read == (mark == IN_PLACE), call  # (the peer's send took our road)
        assert_send_roads(roads)
        print("sends alone ok", flush=True)


def reduced_sends_scenario() -> None:
    """A message sent one way that its receiver reduces (a scan's on two ranks, 4 MiB), where
    every rank has a core, goes through the slots while its sender's copies into them cost at
    most REDUCED_SLOW a byte, and is read directly by its receiver, a piece at a time, while
    they cost more (the costs set by hand). The results are NumPy's either way."""
    from transports.slots import REDUCED_SLOW

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, transport = comm.rank, comm._transport
        if transport.roads is None:
            print("reduced sends: no direct reads here", flush=True)  # (or no core each)
            return
        reads = counted_reads(transport)
        sending = transport.reduced_sends
        sending.times, sending.explored = sending.WARM, math.inf  # (no exploring)
        sending.took = lambda *args: None
        count = 1 << 19  # float64: 4 MiB, more than a one-shot scan takes
        mine = cases.values(rank, count, "float64")
        wanted = cases.values(0, count, "float64") + cases.values(1, count, "float64")
        for cost, direct in ((REDUCED_SLOW / 2, False), (2 * REDUCED_SLOW, True),
                             (REDUCED_SLOW / 2, False)):
            sending.cost = cost
            before = len(reads)
            got = comm.scan(mine)
            numpy.testing.assert_array_equal(got, mine if rank == 0 else wanted)
            assert (len(reads) > before) == (direct and rank == 1), (cost, reads[before:])
        print("reduced sends ok", flush=True)


def kept_own_scenario() -> None:
    """A reduce-scatter whose inputs are read in place reduces its own block where it lies in
    its input (`Transport.keeps_own`): the exchange copies nothing of it, by the lane and by
    the general path (`_reduce_scatter`); where the result overlaps the input, the exchange
    copies it first. The results are NumPy's, in rank order, every time."""
    import ctypes
    import types

    from transports import slots

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        if not transport.single_copy:
            print("kept own: no direct reads here", flush=True)
            return
        transport.reads_inputs_from, transport.reads_inputs_above = 1, 0  # (every size)
        transport.input_roads = False  # (read in place, never through the areas: `InputRoad`)
        block = transport.one_shot_bytes // 8 // size
        copies: list[int] = []
        memmove = ctypes.memmove
        counted = types.ModuleType("ctypes")  # (slots.py's ctypes, its memmoves counted)
        counted.__dict__.update(vars(ctypes))
        counted.memmove = lambda dst, src, n: (copies.append(n), memmove(dst, src, n))[1]
        slots.ctypes = counted
        inputs = [numpy.arange(size * block, dtype=numpy.float32).reshape(size, block) * (r + 1)
                  for r in range(size)]
        want = inputs[0][rank].copy()
        for r in range(1, size):
            want += inputs[r][rank]
        comm.reduce_scatter(inputs[rank].copy())  # (the general path resolves the op first)
        for how in ("lane", "general", "in place"):
            copies.clear()
            mine = inputs[rank].copy()
            if how == "lane":
                got = comm.reduce_scatter(mine)
            elif how == "general":
                got = comm._reduce_scatter(mine)
            else:
                got = comm.reduce_scatter(mine, mine[rank])
            numpy.testing.assert_array_equal(got, want)
            own_copies = copies.count(block * 4)
            assert own_copies == (1 if how == "in place" else 0), (how, copies)
        slots.ctypes = ctypes
    print("kept own ok", flush=True)


def input_roads_scenario() -> None:
    """Inputs read in place that an area holds go by their roads (`InputRoad`): the first WARM
    calls of a kind through the areas, the next WARM in place, every rank alike, and once in
    EXPLORE calls (16 here) a run on the other road; the others through the areas only where
    every rank voted so in the call before. Where rank 0 takes its area and rank 1 leaves its
    input in place all the same, each reader takes each input from where it lies. All-to-alls
    (in place too), all-gathers, reduce-scatters and all-reduces (whose inputs above
    LEFT_BYTES are left where they lie, or go through the areas), by the lane and by the
    general path, each right every call; a reader that places nothing works straight out of
    its owner's area."""
    from collectives.blocks import equal, own_blocks
    from transports import slots

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        if transport.roads is None:
            print("input roads: no direct reads here", flush=True)  # (or no core each)
            return
        reads_inputs = transport.reads_inputs_from, transport.reads_inputs_above
        transport.reads_inputs_from, transport.reads_inputs_above = 1, 0  # (every size)
        block = transport.one_shot_bytes // 8 // size
        reads: list[int] = []
        read_peer_bytes, explore = slots.read_peer_bytes, slots.InputRoad.EXPLORE
        leaves = slots.LeftRoad.leaves
        slots.read_peer_bytes = lambda *args: (reads.append(args[3]), read_peer_bytes(*args))
        slots.InputRoad.EXPLORE = 16  # (a run on the other road within a few calls)
        def inputs(count: int) -> list[numpy.ndarray]:
            return [numpy.arange(size * count, dtype=float).reshape(size, count) * (r + 2) + r
                    for r in range(size)]
        # (Each collective of its own shape: each kind of exchange keeps its own road.)
        wide, narrow, narrower = inputs(block), inputs(block - 8), inputs(block - 16)
        cases = [
            ("all_to_all", "_all_to_all", lambda: (wide[rank],),
             numpy.stack([wide[r][rank] for r in range(size)])),
            ("all_to_all", "_all_to_all", lambda: (narrow[rank].copy(),) * 2,
             numpy.stack([narrow[r][rank] for r in range(size)])),
            ("all_gather", "_all_gather", lambda: (wide[rank][0],),
             numpy.stack([wide[r][0] for r in range(size)])),
            ("reduce_scatter", "_reduce_scatter", lambda: (narrower[rank].copy(),),
             sum(narrower[r][rank] for r in range(size))),
            ("all_reduce", "_all_reduce", lambda: (wide[rank],), sum(wide))]

        def calls(general: bool) -> list[bool]:
            """Each case once, right: whether anything was read in place for it."""
            made = []
            for name, general_name, arguments, want in cases:
                reads.clear()
                got = getattr(comm, general_name if general else name)(*arguments())
                numpy.testing.assert_array_equal(got, want, err_msg=name)
                made.append(bool(reads))
            return made
        try:
            # (Every rank's votes for the areas, whatever the timings: the explored runs, in
            # place, are then the only calls past the warm-up that read.)
            prefers_area = slots.InputRoad.prefers_area
            slots.InputRoad.prefers_area = lambda road: True
            for general in (False, True):
                comm._small_calls.clear()
                transport._exchanges.clear()  # (each kind's road from its first call)
                warm = slots.InputRoad.WARM
                seen = [calls(general) for _ in range(2 * warm + slots.InputRoad.EXPLORE + 2)]
                # (A lane's first call of a kind may take the general path, which may make
                # an exchange of its own: that case's road then starts a call later.)
                for case in range(len(cases)):
                    made = [call[case] for call in seen]
                    assert any(made[start:start + 2 * warm] == [False] * warm + [True] * warm
                               for start in (0, 1)), (case, made)
                    # Once in EXPLORE calls, a run on the other road: both are seen after.
                    assert set(made[2 * warm + 1:]) == {False, True}, (case, made)
            # Agreed: each rank votes by its own costs, and the next call takes the areas
            # only where every rank voted for them: votes apart, both read in place.
            slots.InputRoad._first = lambda road, cheaper: cheaper()  # (no exploring)
            for votes, area in (((True, False), False), ((True, True), True),
                                ((False, True), False)):
                slots.InputRoad.prefers_area = lambda road: votes[rank]
                calls(True)  # (the votes heard)
                assert calls(True) == [not area] * 5, (votes, rank)
            slots.InputRoad.prefers_area = prefers_area
            del slots.InputRoad._first  # (NumberedRoad's again)
            # Mixed: rank 0 through its area, rank 1 in place.
            slots.InputRoad.takes_first = lambda road: rank == 0
            for general in (False, True):
                for _ in range(3):
                    made = calls(general)
                    assert made == [rank == 0] * 5, made  # (rank 0 reads rank 1's)
            # A reader that places nothing (a reduce-scatter's) works straight out of an
            # owner's area: rank 0's input, to rank 1, is rank 0's area itself, not a copy.
            mine, peer = narrower[rank].copy(), 1 - rank
            taken = transport.all_inputs(mine, counted=False, reads=own_blocks(
                equal(mine.size // size, size), rank, mine.itemsize))
            numpy.testing.assert_array_equal(taken[peer][rank], narrower[peer][rank])
            assert numpy.may_share_memory(taken[peer], transport._data[peer]) == (peer == 0)
            # A reader with no road of its own follows an owner that takes its area.
            transport.input_roads = rank == 0
            for general in (False, True):
                comm._small_calls.clear()
                transport._exchanges.clear()
                for _ in range(2):
                    made = calls(general)
                    assert made == [rank == 0] * 5, made
            # On two ranks a reduce's other rank, which takes nothing of the input that its
            # root reduces, puts it in its area, or leaves it where it lies for the root to
            # read, as its `LeftRoad` says; its root takes it from where it lies, and each
            # call is timed on the road taken.
            transport.reads_inputs_from, transport.reads_inputs_above = reads_inputs
            if size == 2 and transport.shares_inputs_from is not None:
                mine = numpy.arange(transport.shares_inputs_from // 8, dtype=float) * (rank + 2)
                timed: list[str] = []
                slots.LeftRoad.took = lambda road, kind, *_: timed.append(kind)
                for left in (False, True, False):
                    slots.LeftRoad.leaves = lambda road: left
                    for root in (0, 1):
                        reads.clear()
                        got = comm.reduce(mine, root=root)
                        if rank == root:
                            numpy.testing.assert_array_equal(got, mine / (rank + 2) * 5)
                        assert reads == ([mine.nbytes] if left and rank == root else []), reads
                assert timed == ["area", "place", "area"], timed  # (as the other rank)
        finally:
            slots.read_peer_bytes, slots.InputRoad.EXPLORE = read_peer_bytes, explore
            slots.LeftRoad.leaves = leaves
            if "took" in vars(slots.LeftRoad):  # (NumberedRoad's again)
                del slots.LeftRoad.took
    print("input roads ok", flush=True)


def pushed_inputs_scenario() -> None:
    """On 2 ranks with a core each, an all-gather's inputs of PUSHED_BYTES or more are written
    by their owners into their peers' results where `PushRoad` says so (slots.py, "Pushed
    inputs"), straight from the block each placed: all but the last bytes of a line, which the
    reader reads; else each reader reads its peer's whole. The first WARM calls write, the next
    WARM read, each timed on its road; then only where both ranks vote for writes. Smaller
    ones are read as before, and so is an input in registered memory, which its owner does
    not write. By the lane and the general path, against NumPy. Then a reader whose owner
    writes too late gives up, naming what it waited for, and keeps the result it lent."""
    from mpi4py import MPI

    from transports import slots

    os.environ["RINGCC_SINGLE_COPY"] = "1"
    moved, read, write = counted_moves()
    took, prefers = slots.PushRoad.took, slots.PushRoad.prefers_writes
    timed: list[str] = []
    slots.PushRoad.took = lambda road, kind, seconds, nbytes: (
        timed.append(kind), took(road, kind, seconds, nbytes))
    with collectives.init("shm", timeout=30) as comm:
        rank, transport = comm.rank, comm._transport
        if transport.shares_inputs_from is None:
            print("pushed inputs: no direct reads here", flush=True)  # (or no core each)
            return
        warm = slots.PushRoad.WARM
        for count in (slots.PUSHED_BYTES // 8 - 1, slots.PUSHED_BYTES // 8 + 3):
            nbytes = count * 8
            everyone = [numpy.arange(count) * 3.0 + r + 0.25 for r in range(2)]
            pushed = nbytes >= slots.PUSHED_BYTES
            written = nbytes // 64 * 64
            by_writes = [("write", written)] + ([("read", nbytes - written)]
                                                if nbytes > written else [])
            for general in (False, True):
                transport._exchanges.clear()  # (the road from its first call)
                comm._small_calls.clear()
                timed.clear()
                slots.PushRoad.prefers_writes = lambda road: True
                seen = []
                for _ in range(2 * warm + 2):
                    moved.clear()
                    result = numpy.full((2, count), -1.0)
                    (comm._all_gather if general else comm.all_gather)(everyone[rank], result)
                    numpy.testing.assert_array_equal(result, numpy.stack(everyone))
                    seen.append(list(moved))
                # (A lane's first call of a kind may take the general path, which may make
                # an exchange of its own: the road then starts a call later.)
                roads = [by_writes] * warm + [[("read", nbytes)]] * warm + [by_writes]
                if pushed:
                    assert any(seen[start:start + 2 * warm + 1] == roads for start in (0, 1)), \
                        (general, seen)
                    assert timed == ["write" if made == by_writes else "read"
                                     for made in seen], (timed, seen)
                else:
                    assert all(made == [("read", nbytes)] for made in seen), seen
                    assert timed == [], timed
                if not pushed:
                    continue
                # Votes apart: the next calls read (the road's own numbering explores none).
                slots.PushRoad.prefers_writes = lambda road: rank == 0
                for _ in range(2):
                    moved.clear()
                    comm.all_gather(everyone[rank], result)
                assert moved == [("read", nbytes)], moved
                numpy.testing.assert_array_equal(result, numpy.stack(everyone))
            # An input in registered memory is read where it lies, through its mapping.
            slots.PushRoad.prefers_writes = lambda road: True
            registered = comm.empty(count)  # (collective)
            mine = registered if rank == 0 else everyone[rank].copy()
            mine[...] = everyone[rank]
            for _ in range(3):
                moved.clear()
                result = numpy.full((2, count), -1.0)
                comm.all_gather(mine, result)
                numpy.testing.assert_array_equal(result, numpy.stack(everyone))
            if pushed:  # (rank 1 writes its own; rank 0 reads what rank 1 did not write)
                assert moved == (by_writes[:1] if rank == 1 else by_writes[1:]), moved
            del mine, registered
    slots.read_peer_bytes, slots.write_peer_bytes = read, write
    slots.PushRoad.took, slots.PushRoad.prefers_writes = took, prefers
    # Rank 0 writes its input 2 s late: rank 1, timed out, keeps its result (slots._LENT).
    world = MPI.COMM_WORLD
    comm = collectives.init("shm", timeout=1)
    slots.PushRoad.takes_first = lambda road: True
    mine = numpy.full(slots.PUSHED_BYTES // 8, rank + 1.0)
    result = numpy.zeros((2, mine.size))
    if rank == 0:
        slots.write_peer_bytes = lambda *args: (time.sleep(2), write(*args))
    said = ""
    try:
        comm.all_gather(mine, result)
    except collectives.CollectiveTimeoutError as error:
        said = str(error)
    world.barrier()  # (rank 0's late write has landed)
    if rank == 1:
        assert "its part of an input" in said, said
        assert any(lent is result or numpy.shares_memory(lent, result)
                   for lent in slots._LENT), slots._LENT
        assert (result[0] == 1.0).all()  # the late write, into memory nobody reused
    else:
        assert "its input to be read" in said, said
    print("pushed inputs ok", flush=True)


def uneven_passes_scenario() -> None:
    """An all-reduce by reduce_scatter_all_gather whose chunks differ in size by an element,
    either side of the size from which inputs are read in place: the ranks would disagree on
    reading in place (each judges by its own chunk), so it takes the ring; the results are
    NumPy's on every rank."""
    os.environ["RINGCC_SINGLE_COPY"] = "1"
    with collectives.init("shm", timeout=30) as comm:
        rank, size, transport = comm.rank, comm.size, comm._transport
        if not transport.single_copy:
            print("uneven passes: no direct reads here", flush=True)
            return
        count = size * 1000 - 1  # chunks of 1000 and 999 float64s
        transport.reads_inputs_from, transport.reads_inputs_above = 1000 * 8, 0
        data = [numpy.arange(count, dtype=float) * (r + 1) + r for r in range(size)]
        got = comm.all_reduce(data[rank], algorithm="reduce_scatter_all_gather")
        numpy.testing.assert_array_equal(got, sum(data))
    print("uneven passes ok", flush=True)


def slot_holder_scenario() -> None:
    """A wait for a free slot names the rank that has yet to take what the slot holds: rank 0
    fills its slots with messages to rank 1, which takes none, then sends to rank 2."""
    from mpi4py import MPI

    from transports.slots import SLOTS

    comm = collectives.init("shm", timeout=1, check=False)
    transport = comm._transport
    if comm.rank == 0:
        for _ in range(SLOTS):
            transport.send(numpy.ones(4), 1)
        try:
            transport.send(numpy.ones(4), 2)
        except collectives.CollectiveTimeoutError as error:
            assert "waited 1 s for a free slot from rank 1 " in str(error), error
        else:
            raise AssertionError("a send went out with every slot full")
    MPI.COMM_WORLD.barrier()
    comm.close()
    print("slot holder ok", flush=True)


def late_reader_scenario() -> None:
    """A message read in place is announced only once its check has passed: rank 0's send
    from registered memory times out in the check (rank 1 has not come), and rank 0 takes
    its buffer back; rank 1, coming later (once rank 0 says so, by MPI), finds nothing to
    read and times out, rather than read the buffer rank 0 has reused."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    comm = collectives.init("shm", timeout=1)
    held = comm.empty(1000)
    held[...] = 1
    if comm.rank == 0:
        try:
            comm.send(held, 1)
        except collectives.CollectiveTimeoutError:
            held[...] = 7
        else:
            raise AssertionError("a send went out with its receiver away")
        world.send(None, dest=1)
    else:
        world.recv(source=0)
        got = numpy.zeros(1000)
        try:
            comm.recv(got, 0)
        except collectives.CollectiveTimeoutError:
            assert not got.any(), got[:3]
        else:
            raise AssertionError(f"a message its sender took back was read: {got[:3]}")
    world.barrier()
    print("late reader ok", flush=True)


def test_a_late_receiver_does_not_read_a_message_taken_back():
    scenario_ends_well("late_reader", 2, "late reader ok")


def test_a_wait_for_a_free_slot_names_the_rank_that_holds_it():
    scenario_ends_well("slot_holder", 3, "slot holder ok")


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_reduce_scatter_reduces_its_own_block_where_it_lies(ranks):
    scenario_ends_well("kept_own", ranks, "kept own ok")


@pytest.mark.parametrize("ranks", [3, 4])
def test_a_broadcast_on_ranks_sharing_cores_moves_one_sided(ranks):
    scenario_ends_well("one_sided_broadcast", ranks, "one-sided broadcast ok")


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_scatters_blocks_move_one_sided_with_no_message(ranks):
    scenario_ends_well("one_sided_scatter", ranks, "one-sided ok")


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_scatters_root_writes_part_of_its_peers_block_on_two_ranks(ranks):
    scenario_ends_well("shared_scatter", ranks, "shared scatter ok")


def test_a_pair_of_ranks_agrees_on_the_road_of_a_kind_of_sendrecv():
    scenario_ends_well("pair_roads", 2, "pair roads ok")


def test_inputs_read_in_place_go_through_the_areas_where_every_rank_votes_so():
    scenario_ends_well("input_roads", 2, "input roads ok")


def test_an_all_gathers_inputs_are_written_by_their_owners_where_both_ranks_vote_so():
    scenario_ends_well("pushed_inputs", 2, "pushed inputs ok")


def test_a_push_road_votes_for_writes_while_they_cost_no_more_than_reads():
    """`PushRoad`: a rank votes for writes while its writes cost no more than its reads a byte
    (or only writes are timed); the next call writes only where every rank voted so."""
    from transports.slots import PushRoad

    road = PushRoad()
    assert not road.prefers_writes()  # (nothing timed yet)
    for write, read, vote in ((1.0, None, True), (1.0, 1.0, True), (1.0, 0.9, False),
                              (0.5, 0.9, True)):
        road.cost = {"write": write, "read": read}
        assert road.prefers_writes() == vote, (write, read)
    road.calls = 2 * PushRoad.WARM  # (past the warm-up, and the next calls not explored)
    for votes, writes in (([1, 1], True), ([1, 0], False), ([0, 1], False)):
        road.heard(iter(votes))
        assert road.takes_first() == writes, votes


def test_a_reduced_message_is_read_directly_while_copies_into_the_slots_are_slow():
    scenario_ends_well("reduced_sends", 2, "reduced sends ok")


def test_a_crowded_ring_shift_goes_through_the_areas_or_in_place_as_its_copies_cost():
    scenario_ends_well("crowded_ring", 3, "crowded ring ok")


def test_a_send_alone_goes_through_the_area_or_in_place_as_its_copies_cost():
    scenario_ends_well("sends_alone", 2, "sends alone ok")


@pytest.mark.parametrize("ranks", [2, 3])
def test_exchanged_passes_of_uneven_chunks_agree_on_every_rank(ranks):
    scenario_ends_well("uneven_passes", ranks, "uneven passes ok")


SCENARIOS = {"collectives": collectives_scenario, "failure": failure_scenario,
             "slot_holder": slot_holder_scenario, "late_reader": late_reader_scenario,
             "two_shot": two_shot_scenario, "exchanged_passes": exchanged_passes_scenario,
             "errors": errors_scenario, "registered": registered_scenario,
             "mismatch": mismatch_scenario, "direct": direct_scenario,
             "shared_failure": shared_failure_scenario, "late_share": late_share_scenario,
             "shared_inputs": shared_inputs_scenario,
             "one_sided_scatter": one_sided_scatter_scenario,
             "shared_scatter": shared_scatter_scenario,
             "one_sided_broadcast": one_sided_broadcast_scenario,
             "kept_own": kept_own_scenario, "pair_roads": pair_roads_scenario,
             "input_roads": input_roads_scenario, "uneven_passes": uneven_passes_scenario,
             "crowded_ring": crowded_ring_scenario, "reduced_sends": reduced_sends_scenario,
             "sends_alone": sends_alone_scenario, "pushed_inputs": pushed_inputs_scenario}

if __name__ == "__main__":
    record_regions()
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
