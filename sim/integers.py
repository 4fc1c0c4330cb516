"""Two's-complement integer arithmetic on numpy arrays, as the accelerator's datapath computes it:
values wrapped to a width, and the modulo-2^64 powers fsim's ALU batching takes."""

from __future__ import annotations

import numpy as np

__all__ = ["wrap", "wrap_u64", "pow_u64", "matrix_power", "int_dtype"]


def wrap(values: np.ndarray, bits: int) -> np.ndarray:
    """Reduce int64 values to signed ``bits``-bit two's complement."""
    half = np.int64(1 << (bits - 1))
    return ((values + half) & np.int64((1 << bits) - 1)) - half


def wrap_u64(values: np.ndarray, bits: int) -> np.ndarray:
    """Signed ``bits``-bit two's complement of uint64 values computed modulo 2^64 (sums and
    products of wrapped values: unsigned overflow is exact modulo 2^bits)."""
    half = np.uint64(1 << (bits - 1))
    return ((values + half) & np.uint64((1 << bits) - 1)).view(np.int64) - np.int64(1 << (bits - 1))


def pow_u64(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """``base ** exponent`` modulo 2^64 (uint64), element-wise, by repeated squaring."""
    shape = np.broadcast_shapes(np.shape(base), np.shape(exponent))
    base = np.broadcast_to(np.asarray(base, np.int64), shape).view(np.uint64)
    exponent = np.broadcast_to(np.asarray(exponent, np.int64), shape).copy()
    result = np.ones(shape, np.uint64)
    while exponent.any():
        odd = (exponent & 1).astype(bool)
        result = np.where(odd, result * base, result)
        base = base * base
        exponent >>= 1
    return result


def matrix_power(m: np.ndarray, times: int, cap: int | None = None) -> np.ndarray:
    """``m ** times`` (``times`` >= 1) by repeated squaring. A uint64 ``m`` gives the power
    modulo 2^64, exact modulo any 2^b with b <= 64: numpy's integer matmul wraps, and reducing
    modulo 2^b keeps sums and products. With ``cap``, ``m`` holds non-negative integers at most
    ``cap`` and the power is saturated at ``cap``: min(·, cap) keeps sums and products of
    non-negative integers too, and the int64 sums stay below k·cap²."""
    result = None
    while True:
        if times & 1:
            result = m if result is None else result @ m
            if cap is not None:
                result = np.minimum(result, cap)
        times >>= 1
        if not times:
            return result
        m = m @ m
        if cap is not None:
            m = np.minimum(m, cap)


def int_dtype(bits: int) -> np.dtype:
    return np.dtype(f"<i{bits // 8}")
