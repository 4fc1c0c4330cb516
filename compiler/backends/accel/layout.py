"""Host-side packing between numpy layouts and the accelerator's tiled layouts.

Tiled layouts end in one on-chip entry (see `gemforge.hw.config`):

=========  ===========================  ====================================
tensor     host layout                  device layout
=========  ===========================  ====================================
matrix A   ``(M, K)``                   ``(M/B, K/BI, B, BI)``
matrix B   ``(K, N)``                   ``(N/BO, K/BI, BO, BI)`` (Bᵀ tiles)
result     ``(M, N)``                   ``(M/B, N/BO, B, BO)``
data       ``NCHW``                     ``NCHW{B}n{BI}c``: ``(N/B, C/BI, H, W, B, BI)``
acc data   ``NCHW`` (int32)             ``(N/B, C/BO, H, W, B, BO)`` (element-wise ops, pooling)
weights    ``OIHW``                     ``OIHW{BO}o{BI}i``: ``(O/BO, C/BI, KH, KW, BO, BI)``
output     ``NCHW``                     ``(N/B, O/BO, H, W, B, BO)``
bias       ``(O,)``                     ``(O/BO, B, BO)``, repeated over the batch lanes
=========  ===========================  ====================================

Dimensions that are not multiples of the block are zero-padded (zeros add
nothing to a product); unpacking drops the padding.
"""

from __future__ import annotations

import numpy as np

from gemforge.hw.config import AccelConfig

__all__ = [
    "ceil_div", "int_dtype", "pack_matrix_a", "pack_matrix_b", "unpack_matrix", "pack_bias",
    "pack_nchw", "pack_oihw", "unpack_nchw", "pack_nchw_acc",
]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def int_dtype(bits: int) -> np.dtype:
    return np.dtype(f"<i{bits // 8}")


def _check_fits(array: np.ndarray, target: np.dtype) -> None:
    """Refuse data the accelerator's ``target`` integers cannot hold as given: a cast would
    truncate floats and keep only the low bits of wider or unsigned integers, silently."""
    if array.dtype.kind not in "iu":
        raise ValueError(f"a tensor of {array.dtype.name} where this config's buffer holds {target.name} "
                         "integers; pass integers (quantize float data first)")
    if array.size and not np.can_cast(array.dtype, target):
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise ValueError(f"a tensor of {array.dtype.name} holds values beyond {target.name} "
                             f"({info.min}..{info.max}), the type this config's buffer holds")


def _padded(array: np.ndarray, shape: tuple[int, ...], dtype) -> np.ndarray:
    target = np.dtype(dtype)
    if target.kind == "i":
        _check_fits(array, target)
    out = np.zeros(shape, dtype)
    out[tuple(slice(0, s) for s in array.shape)] = array
    return out


def pack_matrix_a(config: AccelConfig, a: np.ndarray, rows: int | None = None) -> np.ndarray:
    """(M, K) → (Mt, Kt, B, BI); ``rows`` tiles of M (default: just enough)."""
    b, bi = config.batch, config.block_in
    mt = rows or ceil_div(a.shape[0], b)
    kt = ceil_div(a.shape[1], bi)
    full = _padded(a, (mt * b, kt * bi), int_dtype(config.inp_width))
    return np.ascontiguousarray(full.reshape(mt, b, kt, bi).transpose(0, 2, 1, 3))


def pack_matrix_b(config: AccelConfig, bmat: np.ndarray) -> np.ndarray:
    """(K, N) → (Nt, Kt, BO, BI): tiles of Bᵀ."""
    bo, bi = config.block_out, config.block_in
    kt, nt = ceil_div(bmat.shape[0], bi), ceil_div(bmat.shape[1], bo)
    full = _padded(bmat.T, (nt * bo, kt * bi), int_dtype(config.wgt_width))
    return np.ascontiguousarray(full.reshape(nt, bo, kt, bi).transpose(0, 2, 1, 3))


def unpack_matrix(tiles: np.ndarray, m: int, n: int) -> np.ndarray:
    """(Mt, Nt, B, BO) → (M, N)."""
    mt, nt, b, bo = tiles.shape
    return np.ascontiguousarray(tiles.transpose(0, 2, 1, 3).reshape(mt * b, nt * bo)[:m, :n])


def pack_bias(config: AccelConfig, bias: np.ndarray, tiles: int | None = None) -> np.ndarray:
    """(O,) int32 → (O/BO, B, BO) accumulator entries (the same bias for every batch lane)."""
    bo = config.block_out
    ot = tiles or ceil_div(bias.shape[0], bo)
    _check_fits(bias, int_dtype(config.acc_width))
    flat = _padded(bias, (ot * bo,), np.int64)
    lanes = np.broadcast_to(flat.reshape(ot, 1, bo), (ot, config.batch, bo))
    return np.ascontiguousarray(lanes.astype(int_dtype(config.acc_width)))


def _pack_nchw_blocks(config: AccelConfig, x: np.ndarray, block_c: int, bits: int) -> np.ndarray:
    """NCHW → (N/B, C/block_c, H, W, B, block_c), zero-padded, as ``bits``-bit integers."""
    n, c, h, w = x.shape
    b = config.batch
    nb, cb = ceil_div(n, b), ceil_div(c, block_c)
    full = _padded(x, (nb * b, cb * block_c, h, w), int_dtype(bits))
    return np.ascontiguousarray(full.reshape(nb, b, cb, block_c, h, w).transpose(0, 2, 4, 5, 1, 3))


def pack_nchw(config: AccelConfig, x: np.ndarray) -> np.ndarray:
    """NCHW → (N/B, C/BI, H, W, B, BI): input entries."""
    return _pack_nchw_blocks(config, x, config.block_in, config.inp_width)


def pack_nchw_acc(config: AccelConfig, x: np.ndarray) -> np.ndarray:
    """NCHW (accumulator-width values) → (N/B, C/BO, H, W, B, BO): accumulator entries."""
    return _pack_nchw_blocks(config, x, config.block_out, config.acc_width)


def pack_oihw(config: AccelConfig, w: np.ndarray) -> np.ndarray:
    """OIHW → (O/BO, C/BI, KH, KW, BO, BI)."""
    o, c, kh, kw = w.shape
    bo, bi = config.block_out, config.block_in
    ob, cb = ceil_div(o, bo), ceil_div(c, bi)
    full = _padded(w, (ob * bo, cb * bi, kh, kw), int_dtype(config.wgt_width))
    return np.ascontiguousarray(full.reshape(ob, bo, cb, bi, kh, kw).transpose(0, 2, 4, 5, 1, 3))


def unpack_nchw(tiles: np.ndarray, n: int, c: int) -> np.ndarray:
    """(N/B, C/BO, H, W, B, BO) → NCHW with the padding dropped."""
    nb, cb, h, w, b, bo = tiles.shape
    full = tiles.transpose(0, 4, 1, 5, 2, 3).reshape(nb * b, cb * bo, h, w)
    return np.ascontiguousarray(full[:n, :c])
