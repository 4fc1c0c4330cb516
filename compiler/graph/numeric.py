"""The int8 network's arithmetic on numpy arrays: quantizing, dequantizing, rounding shifts.

One definition each, read by the operators' semantics (`operators`), the quantization pass and
the host runtime's entry and exit conversions.
"""

from __future__ import annotations

import numpy as np

__all__ = ["quantize_array", "dequantize_array", "rounding_shift", "int8_clipped"]


def quantize_array(x: np.ndarray, exponent: int) -> np.ndarray:
    """float → int8 at scale 2**-exponent, rounding half to even, saturating (NaN → 0).

    A float32 array is scaled in float32: a product with a power of two is exact there, or
    overflows to ±inf (which saturates as the exact value would) or falls below 2^-126 (which
    rounds to 0 as the exact value would), so the result is float64's, at a fraction of the
    memory traffic (a VGG's 400 MB of dense weights)."""
    x = np.asarray(x)
    kind = np.float32 if x.dtype == np.float32 else np.float64
    scaled = np.array(x, dtype=kind)          # a copy, worked on in place (an array even of a scalar)
    with np.errstate(over="ignore"):          # ±inf saturates below, as the exact value would
        scaled *= kind(2.0 ** exponent)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -128, 127, out=scaled)
    scaled[np.isnan(scaled)] = 0             # defined (numpy's cast of NaN is not), as the kernel's
    return scaled.astype(np.int8)


def dequantize_array(q: np.ndarray, exponent: int) -> np.ndarray:
    return (q.astype(np.float64) * 2.0 ** -exponent).astype(np.float32)


def rounding_shift(value: np.ndarray, shift: int) -> np.ndarray:
    """``value >> shift`` rounded to nearest, halves up (int64 in, int64 out)."""
    return (value + (1 << (shift - 1))) >> shift if shift else value


def int8_clipped(value: np.ndarray, lo: int = -128) -> np.ndarray:
    """int64 → int8, saturating at ``lo`` and 127."""
    return np.clip(value, lo, 127).astype(np.int8)
