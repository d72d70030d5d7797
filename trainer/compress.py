"""Gradients in float16 on the wire: half the bytes of float32.

float16 holds magnitudes from about 6e-8 (below that, zero) up to 65504 (above, infinity), with
11 significant bits. Gradients are often far smaller than 1, and a sum over N ranks is up to N
times larger than its terms, so they are scaled before the cast, as mixed-precision training
scales its loss:

- The scale is a power of two, so scaling and unscaling are exact, and every rank uses the
  same one: 2^k with the largest |gradient| of the bucket on any rank (one all-reduce of a
  single number) times 2^k at most 2^15 / N. A sum over N ranks then stays below 2^15, far
  from overflow even after float16 rounding, and the largest gradients sit near the top of
  float16's range, so the small ones keep as many bits as the range allows.
- The ranks sum in float16; the sum is turned back into float32 and divided by scale * N
  there: the average, in float32.

Gradients of NaN or infinity are not scaled (scale 1) and stay what they are, as in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from collectives import Communicator, array_module_of

GRAD_DTYPES = ("float32", "float16")
HEADROOM = 2.0 ** 15  # the largest sum of scaled gradients over all ranks
LARGEST_EXPONENT = 100  # keeps the scale a finite float32 even for vanishing gradients


def to_float16(comm: Communicator, grads: Any, out: Any) -> float:
    """Write `grads` (this rank's, float32) times the common scale into `out` (float16) and
    return the scale. Collective: every rank calls it for the same bucket."""
    xp = array_module_of(grads)
    peak = xp.maximum(grads.max(), -grads.min()).reshape(1)
    peak = float(comm.all_reduce(peak, op="max")[0])
    scale = 1.0
    if 0 < peak < math.inf:
        scale = 2.0 ** min(math.floor(math.log2(HEADROOM / (comm.size * peak))),
                           LARGEST_EXPONENT)
    xp.multiply(grads, scale, out=out, casting="unsafe")
    return scale


def from_float16(summed: Any, divisor: float, out: Any) -> None:
    """`out` (float32) = `summed` (float16) / `divisor`, computed in float32."""
    array_module_of(summed).divide(summed, divisor, out=out, dtype=numpy.float32)
