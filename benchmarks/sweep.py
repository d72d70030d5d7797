"""`make bench`: a short sweep of every collective on 2 and 4 ranks, beside the peers.

    python -m benchmarks.sweep [--mpiexec PATH] [--ranks 2,4] [--out bench-results]

Each collective runs as its own MPI job per rank count, measuring ringcc on every transport that
moves NumPy arrays under mpiexec, the preferred first (shm, then mpi), with --compare
mpi,gloo,memory, and writes <out>/<collective>-<ranks>.json and .csv; then
<out>/<collective>.png plots both rank counts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from transports import registry

from .plot import plot

ROOT = Path(__file__).resolve().parent.parent
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "scatter", "reduce_scatter", "gather",
               "reduce", "all_to_all", "scan", "sendrecv", "send")
OPTIONS = ["-b", "8", "-e", "16M", "-f", "8", "-n", "10", "-w", "2",
           "--compare", "mpi,gloo,memory"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--mpiexec", default=str(Path(sys.executable).with_name("mpiexec")),
                        help="the mpiexec to start jobs with (default: beside this python)")
    parser.add_argument("--ranks", default="2,4", help="rank counts, a comma list (2,4)")
    parser.add_argument("--out", default="bench-results", help="folder for the results")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The preferred, the main one, first; not the hierarchical one, which on one host is shm.
    transports = ",".join(name for name in registry.names(device="cpu")
                          if not registry.info(name).hierarchical)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    failed = []
    for name in COLLECTIVES:
        results = []
        for ranks in args.ranks.split(","):
            stem = out / f"{name}-{ranks}"
            stem.with_suffix(".json").unlink(missing_ok=True)  # plot only what this run wrote
            command = [args.mpiexec, "-n", ranks, sys.executable, "-m", f"benchmarks.{name}",
                       *OPTIONS, "--transport", transports,
                       "--json", f"{stem}.json", "--csv", f"{stem}.csv"]
            print(f"$ {shlex.join(command)}", flush=True)
            if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
                failed.append(f"{name} on {ranks} ranks")
            if stem.with_suffix(".json").exists():
                results.append(str(stem.with_suffix(".json")))
        if results:
            plot(results, str(out / f"{name}.png"))
            print(f"wrote {out / name}.png\n", flush=True)
    if failed:
        print(f"sweep: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
