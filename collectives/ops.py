"""Reduction operators by name, and which dtypes each one accepts."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from transports.errors import InvalidArgumentError, InvalidTypeError

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
