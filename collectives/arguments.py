"""Argument checks shared by every collective.

Each check raises a `CollectiveError` kind that is also a `ValueError` or `TypeError`, naming
what is wrong, before this rank sends anything.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy

from transports.errors import InvalidArgumentError, InvalidTypeError

from .arrays import array_module_of

NUMERIC = "biufc"  # NumPy's kinds of bool, signed and unsigned integer, float and complex


def check_buffers(xp: ModuleType, transport: str, buf: Any, *optional: Any) -> None:
    """`buf`, and those of `optional` that are not None, are arrays of `xp` (the transport's
    array module) with numeric dtypes."""
    if type(buf) is xp.ndarray and buf.dtype.kind in NUMERIC:
        for b in optional:
            if b is not None and (type(b) is not xp.ndarray or b.dtype.kind not in NUMERIC):
                break
        else:
            return  # the common case, quickly: small calls feel every microsecond
    given = [buf, *(b for b in optional if b is not None)]
    modules = {array_module_of(b) for b in given}
    if len(modules) > 1:
        raise InvalidTypeError("buffers mix NumPy and CuPy arrays; pass arrays of one kind")
    if modules and modules != {xp}:
        (other,) = modules
        raise InvalidTypeError(f"the {transport} transport moves {xp.__name__} arrays, got a "
                               f"{other.__name__} array")
    for b in given:
        if b.dtype.kind not in NUMERIC:
            raise InvalidTypeError(f"dtype {b.dtype} is not numeric; collectives move numbers "
                                   f"and bools")


def check_writeable(buf: Any, name: str) -> None:
    """`buf` is an array that may be written into."""
    if type(buf) is not numpy.ndarray:  # NumPy's, quickly; else one of CuPy's, or an error
        array_module_of(buf)
    if not getattr(buf.flags, "writeable", True):
        raise InvalidArgumentError(f"{name} is read-only")


def output(buf: Any | None, shape: tuple[int, ...], dtype: Any, xp: ModuleType) -> Any:
    """The result array: a new one when `buf` is None, else `buf` once it is known to fit."""
    if buf is None:
        return xp.empty(shape, dtype)
    if buf.shape != tuple(shape) or buf.dtype != dtype:
        raise InvalidArgumentError(f"recvbuf must have shape {tuple(shape)} and dtype "
                                   f"{xp.dtype(dtype)}; got shape {tuple(buf.shape)} and "
                                   f"dtype {buf.dtype}")
    check_writeable(buf, "recvbuf")
    return buf


def check_root(root: Any, size: int, name: str = "root") -> None:
    """`root` (or the `dst` or `src` that `name` says) is a rank of a communicator of `size`
    ranks."""
    if (isinstance(root, bool) or not isinstance(root, (int, numpy.integer))
            or not 0 <= root < size):
        raise InvalidArgumentError(f"{name} {root!r} is not a rank in [0, {size})")


def check_blocks(collective: str, buf: Any, size: int) -> None:
    """`buf` holds one block per rank: shape (size, ...)."""
    if buf.ndim < 1 or buf.shape[0] != size:
        raise InvalidArgumentError(f"{collective}: sendbuf must have shape ({size}, ...), one "
                                   f"block per rank; got {buf.shape}")
