"""Checkpoints: where training stands, so that a stopped run can go on as if it never stopped.

A checkpoint is one .npz file: the model's arrays under model/, the optimizer's under
optimizer/, and `meta`, a JSON text holding the `Position` and the options of the run that wrote
it. Every rank holds the same parameters, so rank 0 alone writes it; every rank reads it back
on resume. It may be read on any number of ranks: the global batch, not the rank count, fixes
which samples each step sees.

The optimizer's state is always whole, by parameter ("exp_avg.3"): under ZeRO the ranks first
gather their shards (zero.ShardedOptimizer.state_dict), and on resume each rank takes its own
shard of the whole, for however many ranks it now has. So a checkpoint written by N ranks with
or without ZeRO resumes on M ranks with or without it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy

from collectives import to_numpy

from .nn import Module

CHECKPOINT = "checkpoint.npz"
# Options a resumed run must share with the run that wrote the checkpoint: they fix which
# samples each step sees, the shape of the model and that of the optimizer's state.
RESUME_MUST_MATCH = ("dataset", "hidden", "batch_size", "seed", "optimizer")


class Stateful(Protocol):
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Position:
    """Where training stands: everything a checkpoint restores besides the arrays."""

    epoch: int = 0  # the epoch in progress, from 0
    step: int = 0  # steps done in that epoch
    global_step: int = 0
    loss_sum: float = 0.0  # sum of this epoch's global-batch losses so far
    seconds: float = 0.0  # training time of this epoch so far (rank 0's clock)
    comm_s: float = 0.0  # of which inside collectives
    bytes_sent: float = 0.0  # by each rank this epoch so far, on average
    history: list[dict] = field(default_factory=list)  # metrics of the finished epochs


def save_checkpoint(directory: Path, model: Module, optimizer_state: dict[str, Any],
                    position: Position, config: dict) -> None:
    """Write the checkpoint to a temporary file, then rename it over the old one: a reader
    (or a crash) never sees half a checkpoint. `optimizer_state` is the optimizer's
    `state_dict()`."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{k}": to_numpy(v) for k, v in model.state_dict().items()}
    arrays.update({f"optimizer/{k}": to_numpy(v) for k, v in optimizer_state.items()})
    meta = json.dumps({"position": asdict(position), "config": config})
    partial = directory / f".{CHECKPOINT}.{os.getpid()}.tmp"
    try:
        with open(partial, "wb") as f:
            numpy.savez(f, meta=numpy.array(meta), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, directory / CHECKPOINT)
    finally:
        partial.unlink(missing_ok=True)


def load_checkpoint(path: Path, model: Module, optimizer: Stateful, config: dict) -> Position:
    """Restore `model` and `optimizer` from `path` and return where training stood; SystemExit
    when the checkpoint was written with other RESUME_MUST_MATCH options than `config`."""
    with numpy.load(path) as f:
        meta = json.loads(str(f["meta"]))
        for key in RESUME_MUST_MATCH:
            if meta["config"].get(key) != config[key]:
                raise SystemExit(f"{path} was written with --{key.replace('_', '-')} "
                                 f"{meta['config'].get(key)}, not {config[key]}: resume with "
                                 f"the same {', '.join(RESUME_MUST_MATCH)}")
        model.load_state_dict({k[6:]: f[k] for k in f.files if k.startswith("model/")})
        optimizer.load_state_dict({k[10:]: f[k] for k in f.files if k.startswith("optimizer/")})
    return Position(**meta["position"])
