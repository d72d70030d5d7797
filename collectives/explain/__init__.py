"""The explainer: watch a collective run, step by step (`python -m collectives.explain`).

The explainer runs the real collective on readable data (rank r holds r*10 + i), on thread ranks
or, under `mpiexec` with `--transport mpi`, on the real ranks, and records every transfer with
`comm.trace()`. From the records alone it rebuilds the schedule: which rank sent which chunk to
which rank in each step. It replays those moves with NumPy on the starting buffers to show every
rank's buffer after every step, checks that the replay ends exactly where the collective did,
and counts the bytes each rank sent against the bound for the collective. For all-reduce it
also runs the two naive algorithms of `naive.py`, so the ring's savings are there to see.

    python -m collectives.explain all_reduce --ranks 4 --count 8 --svg ring.svg
    mpiexec -n 4 python -m collectives.explain broadcast --root 2 --transport mpi
    python -m collectives.explain hierarchical --ranks 6 --node-size 3

Its modules, each importing only those listed before it:

    lessons.py    the readable data, and what each collective does to it
    schedule.py   from trace records to steps, and their replay with NumPy
    run.py        running the lessons on ranks, and digesting the records into a Run
    text.py       the step-by-step text
    picture.py    the same steps drawn as a ring (SVG, HTML)
    cli.py        the command line
"""

from .cli import main
from .lessons import ALL_REDUCES, LESSONS, Lesson, Setup, readable
from .run import Run, digest, run_rank
from .schedule import Divide, Move, replay, schedule
from .text import compare, explain, narrate

__all__ = ["main", "ALL_REDUCES", "LESSONS", "Lesson", "Setup", "readable", "Run", "digest",
           "run_rank", "Divide", "Move", "replay", "schedule", "compare", "explain", "narrate"]
