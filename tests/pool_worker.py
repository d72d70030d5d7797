"""One rank of the test pool (see pool.py). Started by the pool, never by hand:

    mpiexec -n 6 python tests/pool_worker.py PORT TRANSPORTS TIMEOUT
"""

from __future__ import annotations

import socket
import sys
import traceback

from mpi4py import MPI

import cases
import collectives
from pool import VARIANTS, recv_message, send_message


def main() -> None:
    port, transports = int(sys.argv[1]), sys.argv[2].split(",")
    timeout = float(sys.argv[3])
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    sock = socket.create_connection(("127.0.0.1", port))
    send_message(sock, rank)

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
    send_message(sock, "ready")

    while True:
        message = recv_message(sock)  # idle ranks wait here, not in MPI
        if message is None or message == "quit":
            break
        case, key, example = message
        comm = comms[key]
        comm.stats.reset()
        try:
            reply = ("ok", getattr(cases, case)(comm, **example))
        except Exception as error:  # noqa: BLE001 - reported to the test process
            reply = ("raised", type(error).__name__, str(error), traceback.format_exc())
        send_message(sock, reply)
    for comm in comms.values():
        comm.close()


if __name__ == "__main__":
    main()
