"""Reduction operators by name, which dtypes each one accepts, and the reduction of every
rank's input in rank order, the same bits on every rank."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from transports.base import ReduceOp
from transports.errors import InvalidArgumentError, InvalidTypeError

from .arrays import overlap

OPS = ("sum", "prod", "min", "max", "avg")
_UFUNC = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum", "avg": "add"}


def resolve_op(op: str, dtype: Any, xp: ModuleType) -> Any:
    """The ufunc of `xp` that folds one contribution into another for `op` on `dtype`.

    "avg" reduces with add; the caller divides by the number of ranks once, at the end.
    """
    if not isinstance(op, str) or op not in _UFUNC:
        raise InvalidArgumentError(f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    kind = xp.dtype(dtype).kind
    if kind not in "biufc":
        raise InvalidTypeError(f"dtype {dtype} is not numeric; collectives reduce numbers "
                               "and bools")
    if kind == "b" and op not in ("min", "max"):
        raise InvalidTypeError(f"op {op!r} is not defined on bool; use 'min' (all) or 'max' "
                               "(any)")
    if kind in "iu" and op == "avg":
        raise InvalidTypeError(f"op 'avg' needs a floating dtype, got {dtype}; "
                               "reduce with 'sum' and divide yourself")
    if kind == "c" and op in ("min", "max"):
        raise InvalidTypeError(f"op {op!r} is not defined on complex dtype {dtype}")
    return getattr(xp, _UFUNC[op])


def identity(op: str, dtype: Any, xp: ModuleType) -> Any:
    """The value that `op` leaves any other unchanged on `dtype` (0 for sum and avg, 1 for prod,
    the largest value for min, the smallest for max): what an empty reduction gives."""
    dtype = xp.dtype(dtype)
    if op in ("sum", "avg"):
        return dtype.type(0)
    if op == "prod":
        return dtype.type(1)
    if dtype.kind == "b":
        return op == "min"
    if dtype.kind == "f":
        return dtype.type(xp.inf if op == "min" else -xp.inf)
    info = xp.iinfo(dtype)
    return dtype.type(info.max if op == "min" else info.min)


def with_own(xp: Any, inputs: list[Any], mine: Any, rank: int, out: Any | None) -> list[Any]:
    """The exchange's `inputs` with this rank's own, `mine`, in its place (the exchange need
    not hold it: `peers_inputs`). A copy of it where `out` overlaps it and the reduction
    would write `out` before reading it (`reduce_in_rank_order` reads inputs 0 and 1 first)."""
    inputs = list(inputs)
    inputs[rank] = mine if rank < 2 or out is None or not overlap(out, mine, xp) \
        else mine.copy()
    return inputs


def reduce_in_rank_order(xp: Any, inputs: list[Any], op: ReduceOp, average: bool,
                         out: Any | None = None) -> Any:
    """(((x0 op x1) op x2) ...) of two or more `inputs` into `out` (a new array when None),
    divided by their number when `average`: the same order on every rank, so the same bits.
    With `out` None, the op makes the array (a scalar for 0-d inputs)."""
    out = op(inputs[0], inputs[1]) if out is None else op(inputs[0], inputs[1], out=out)
    if len(inputs) > 2:  # (two is the common case, and a slice costs a small call)
        for later in inputs[2:]:
            op(out, later, out=out)
    if average:
        xp.true_divide(out, len(inputs), out=out)
    return out
