"""The arrays ringcc moves: NumPy on the host, CuPy on a GPU, and the helpers that tell them
apart. CuPy is imported only where a CuPy array or device is already in play."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy

from transports.base import buffer_address
from transports.errors import InvalidArgumentError, InvalidTypeError


def array_module_of(buf: Any) -> ModuleType:
    """numpy or cupy, whichever `buf` belongs to; InvalidTypeError for anything else."""
    if isinstance(buf, numpy.ndarray):
        return numpy
    if type(buf).__module__.startswith("cupy"):
        import cupy  # only reached with a CuPy array in hand, so CuPy is there

        return cupy
    raise InvalidTypeError(f"expected a NumPy or CuPy array, got {type(buf).__name__}")


def is_tensor(obj: Any) -> bool:
    """Whether `obj` is a torch tensor (told without importing torch, which stays optional)."""
    return type(obj).__module__.startswith("torch") and hasattr(obj, "numpy")


def tensor_memory(tensor: Any) -> Any:
    """A torch tensor's memory, no copy: a NumPy array for a CPU tensor, a CuPy array (through
    DLPack) for a CUDA one; so every collective takes tensors, and writes its results into
    them in place. InvalidTypeError where that cannot be."""
    if getattr(tensor, "requires_grad", False):
        raise InvalidTypeError("a tensor that requires grad cannot be a collective's buffer: "
                               "pass tensor.detach(), as torch.distributed does")
    if tensor.device.type == "cuda":
        try:
            import cupy
        except ImportError:
            raise InvalidTypeError(f"a tensor on {tensor.device} needs CuPy, which is not "
                                   f"installed here") from None
        # DLPack: CuPy's stream waits for torch's current one, then both see the same memory.
        return cupy.from_dlpack(tensor)
    if tensor.device.type != "cpu":
        raise InvalidTypeError(f"collectives take CPU and CUDA tensors; got one on "
                               f"{tensor.device}")
    try:
        return tensor.numpy()
    except TypeError as error:  # a dtype NumPy lacks, such as bfloat16
        raise InvalidTypeError(f"cannot move {tensor.dtype} tensors ({error})") from None


def module_for_device(device: str) -> ModuleType:
    """numpy for "cpu", cupy for "cuda"."""
    if device == "cpu":
        return numpy
    if device == "cuda":
        import cupy  # optional: only a caller that asked for the GPU needs it

        return cupy
    raise InvalidArgumentError(f"unknown device {device!r}; expected 'cpu' or 'cuda'")


def to_numpy(array: Any) -> numpy.ndarray:
    """The values of a NumPy or CuPy array as a NumPy array (the array itself if on the host)."""
    return array if isinstance(array, numpy.ndarray) else array.get()


def flat_work(buf: Any, xp: ModuleType) -> tuple[Any, bool]:
    """A flat contiguous array sharing memory with `buf` if possible, else a copy.

    Returns (work, copied): when copied, the result must be written back into `buf`.
    """
    if type(buf) is not xp.ndarray:  # a subclass (numpy.matrix stays 2-D when reshaped)
        buf = buf.view(xp.ndarray)
    if buf.flags.c_contiguous:
        return (buf if buf.ndim == 1 else buf.reshape(-1)), False
    return xp.ascontiguousarray(buf).reshape(-1), True


def overlap(a: Any, b: Any, xp: ModuleType) -> bool:
    """Whether arrays `a` and `b` may share memory. Two arrays that each own their memory
    (base None) cannot: the common case, answered without `may_share_memory`, which costs a
    small call half a microsecond."""
    return a is b or ((a.base is not None or b.base is not None)
                      and bool(xp.may_share_memory(a, b)))


def same_memory(a: Any, b: Any, xp: ModuleType) -> bool:
    """Whether the flat contiguous arrays `a` and `b` are the same bytes (views alike)."""
    return bool(xp.may_share_memory(a, b)) and a.nbytes == b.nbytes \
        and buffer_address(a) == buffer_address(b)  # the quick test first: most do not
