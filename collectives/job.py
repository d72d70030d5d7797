"""What `init` does once per process of an MPI job so that a failure ends the whole job, leaving
nothing behind.

- An uncaught exception aborts the job (MPI_Abort) once it is printed, as launching with
  `mpiexec -n N python -m mpi4py script.py` does. Otherwise the failing rank exits and the
  others wait for it until their timeout. The hook chains to the one installed before it, and
  is not installed in an interactive session, where an exception at the prompt must not end
  the job. Exceptions in other threads, and `sys.exit`, do not go through it.
- MPICH keeps a named shared-memory segment (/dev/shm/mpich_shm_*) for the whole job and
  removes it only in MPI_Finalize, so a job that aborts, or loses a rank to `kill -9`, leaves
  it behind. MPICH's initialisation waits until every process on the node has mapped it, so
  once MPI is initialised here the name is no longer needed: it is unlinked, as the shm
  transport unlinks its own segments, and the kernel frees the memory with the last process.
"""

from __future__ import annotations

import os
import re
import sys
import time
from types import TracebackType

MPICH_SEGMENT = re.compile(r"\s(/dev/shm/mpich_shm_[0-9a-f]+_\d+)$")
ABORT_GRACE_S = 0.2
_hook_installed = False


def guard_job() -> None:
    """Both of the above, in a job of more than one process; safe to call again."""
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return
    unlink_mpich_segments()
    abort_on_uncaught_exception()


def unlink_mpich_segments() -> None:
    """Remove the names of the MPICH segments this process has mapped (see the module doc)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {m.group(1) for line in maps if (m := MPICH_SEGMENT.search(line.rstrip()))}
    except OSError:  # no /proc: not Linux, and no such segments to look for
        return
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:  # another rank of the node was first
            pass


def abort_on_uncaught_exception() -> None:
    """Make an uncaught exception in the main thread abort the whole MPI job, once printed."""
    global _hook_installed
    if _hook_installed or hasattr(sys, "ps1") or sys.flags.interactive:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException,
             traceback: TracebackType | None) -> None:
        previous(kind, value, traceback)
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            # (MPICH's own line as it aborts does not always get through mpiexec: ours does.)
            print(f"rank {MPI.COMM_WORLD.Get_rank()}: the uncaught {kind.__name__} above ends "
                  f"the job (MPI_Abort)", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            # mpiexec forwards each rank's output through a pipe and stops reading it when the
            # job aborts: give it a moment to pass on the traceback just printed.
            time.sleep(ABORT_GRACE_S)
            MPI.COMM_WORLD.Abort(130 if issubclass(kind, KeyboardInterrupt) else 1)

    sys.excepthook = hook
