"""Whether GPU tests can run here, and the marker that skips them, saying why, when not."""

from __future__ import annotations

import pytest


def gpu_missing() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'ringcc[cuda12]')"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        return f"CuPy finds no CUDA device ({error})"
    return None if count else "CuPy finds no CUDA device"


MISSING = gpu_missing()
needs_gpu = pytest.mark.skipif(MISSING is not None, reason=f"needs a GPU: {MISSING}")
