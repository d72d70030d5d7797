"""One rank of the test pool (see pool.py). Started by the pool, never by hand:

    mpiexec -n 6 python tests/pool_worker.py PORT TRANSPORTS TIMEOUT
"""

from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Client

from mpi4py import MPI

import cases
import collectives
from pool import AUTHKEY_VARIABLE, HIERARCHICAL, NODE_SHAPES, VARIANTS


def main() -> None:
    port, transports = int(sys.argv[1]), sys.argv[2].split(",")
    timeout = float(sys.argv[3])
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    connection = Client(("127.0.0.1", port),
                        authkey=bytes.fromhex(os.environ[AUTHKEY_VARIABLE]))
    connection.send(rank)

    # One communicator per (transport, variant, number of ranks), built once.
    comms = {}
    for transport in transports:
        for variant, options in VARIANTS.items():
            for size in range(1, world.Get_size() + 1):
                part = world.Split(0 if rank < size else MPI.UNDEFINED, rank)
                if part != MPI.COMM_NULL:
                    comms[(transport, variant, size)] = collectives.init(
                        transport, comm=part, timeout=timeout, **options)
                    part.Free()
    for nodes, per_node in NODE_SHAPES:
        size = nodes * per_node
        part = world.Split(0 if rank < size else MPI.UNDEFINED, rank)
        if part != MPI.COMM_NULL:
            comms[("hierarchical", f"{nodes}x{per_node}", size)] = collectives.init(
                "hierarchical", comm=part, timeout=timeout, node_size=per_node, **HIERARCHICAL)
            part.Free()
    connection.send("ready")

    while True:
        try:
            message = connection.recv()  # idle ranks wait here, in a socket read, not in MPI
        except EOFError:  # the test process has gone
            break
        if message == "quit":
            break
        case, key, example = message
        comm = comms[key]
        comm.stats.reset()
        try:
            reply = ("ok", getattr(cases, case)(comm, **example))
        except Exception as error:  # noqa: BLE001 - reported to the test process
            reply = ("raised", type(error).__name__, str(error), traceback.format_exc())
        connection.send(reply)
    for comm in comms.values():
        comm.close()


if __name__ == "__main__":
    main()
