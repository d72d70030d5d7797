"""Rank 0's progress through an epoch, on stderr.

On a terminal, a tqdm bar redrawn as the steps go (at most ten times a second). In a log file
or a pipe, redrawing would pile carriage returns into one endless line: there the bar stays
off, and the line it would end on is written once, when the epoch ends. Under mpiexec a rank's
stderr is a pipe to mpiexec even when mpiexec writes to a terminal, so there it is always the
one line per epoch.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm

# "epoch 3/20 [=========     ] 7/23 [00:01<00:02, 6.51step/s, loss 0.4210]"
FORMAT = "{desc} [{bar:30}] {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
ASCII = " ="  # plain characters: the same bar in a terminal and in a log


class EpochProgress:
    """One epoch's progress: `step` after each step, `close` when the epoch ends or stops.

    `shown` is False on every rank but 0. `done` counts the steps already behind (a resumed
    epoch starts part way).
    """

    def __init__(self, shown: bool, label: str, done: int, total: int) -> None:
        self.label, self.total = label, total
        self.first = self.done = done
        self.loss: Any = None
        self.start = time.monotonic()
        self.live = shown and sys.stderr.isatty()
        self.once = shown and not self.live  # one line when the epoch ends
        self.bar = tqdm(desc=label, total=total, initial=done, unit="step", file=sys.stderr,
                        bar_format=FORMAT, ascii=ASCII, mininterval=0.1, disable=not self.live)

    def step(self, loss: Any) -> None:
        """One more step done; `loss` is rank 0's loss on it (a NumPy or CuPy scalar)."""
        self.done += 1
        self.loss = loss
        if self.live:
            # float() waits for the device, so only a bar that is drawn asks for it
            self.bar.set_postfix_str(f"loss {float(loss):.4f}", refresh=False)
            self.bar.update()

    def close(self) -> None:
        """End the bar's line; without a bar, write the one line of the epoch."""
        self.bar.close()
        if self.once and self.loss is not None:
            line = tqdm.format_meter(self.done, self.total, time.monotonic() - self.start,
                                     prefix=self.label, unit="step", bar_format=FORMAT,
                                     ascii=ASCII, initial=self.first,
                                     postfix=f"loss {float(self.loss):.4f}")
            print(line, file=sys.stderr, flush=True)
