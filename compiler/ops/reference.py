"""numpy references of every operator, on every target: the independent check.

Integer operators compute exactly (int64, then the accumulator's int32
wrap-around and the `Epilogue`'s requantization); float operators compute in
float64 and round to float32 once. Layouts are numpy's: matrices (M, K) and
(K, N), images NCHW, weights OIHW.
"""

from __future__ import annotations

import numpy as np

from .common import four_pads, reference_epilogue, window_count

__all__ = [
    "dense_reference", "conv2d_reference", "conv2d_sums", "max_pool2d_reference", "avg_pool2d_reference",
    "softmax_reference", "elementwise_reference",
]


def _float_epilogue(acc: np.ndarray, bias, relu: bool, channel_axis: int) -> np.ndarray:
    value = acc
    if bias is not None:
        shape = [1] * value.ndim
        shape[channel_axis] = -1
        value = value + bias.astype(np.float64).reshape(shape)
    if relu:
        value = np.maximum(value, 0)
    return value.astype(np.float32)


def dense_reference(a: np.ndarray, b: np.ndarray, bias=None, shift=None, relu=False) -> np.ndarray:
    """``a @ b`` (+ bias, requantization or ReLU), exact for integers."""
    if a.dtype.kind == "f":
        return _float_epilogue(a.astype(np.float64) @ b.astype(np.float64), bias, relu, 1)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    return reference_epilogue(acc, bias, shift, relu, channel_axis=1)


def conv2d_reference(x: np.ndarray, w: np.ndarray, bias=None, stride: int = 1, padding=0,
                     shift=None, relu=False, groups: int = 1) -> np.ndarray:
    """2-D convolution, NCHW × OIHW (I = C / groups), zero padding (an int, or (top, left,
    bottom, right)), and the epilogue (for integers the accelerator's: int32 wrap-around,
    shift, clamp)."""
    acc = conv2d_sums(x, w, stride, padding, groups)
    if x.dtype.kind == "f":
        return _float_epilogue(acc, bias, relu, 1)
    return reference_epilogue(acc, bias, shift, relu, channel_axis=1)


def conv2d_sums(x: np.ndarray, w: np.ndarray, stride: int = 1, padding=0, groups: int = 1) -> np.ndarray:
    """The convolution's product sums, exact (int64 for integers, float64 for floats)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = four_pads(padding)
    floating = x.dtype.kind == "f"
    work = np.float64 if floating else np.int64
    xp = np.zeros((n, c, top + h + bottom, left + wd + right), work)
    xp[:, :, top:top + h, left:left + wd] = x
    oh, ow = window_count(h, kh, stride, top, bottom), window_count(wd, kw, stride, left, right)
    acc = np.zeros((n, o, oh, ow), work)
    wl = w.astype(work)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = wl[g * og:(g + 1) * og]
        if floating:
            _float_sums(xs, ws, stride, oh, ow, acc[:, g * og:(g + 1) * og])
            continue
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + (oh - 1) * stride + 1:stride, j:j + (ow - 1) * stride + 1:stride]
                acc[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return acc


#: Elements of the float im2col block `_float_sums` builds at a time (64 MiB of float64).
_IM2COL_ELEMENTS = 1 << 23


def _float_sums(xs: np.ndarray, ws: np.ndarray, stride: int, oh: int, ow: int, acc: np.ndarray) -> None:
    """``acc`` (n, o, oh, ow) = the float64 convolution of the padded ``xs`` by ``ws``: an im2col
    block of output rows at a time times the flattened kernel, one BLAS product each (numpy's
    einsum, tap by tap, took most of a VGG's calibration)."""
    n, c = xs.shape[:2]
    o, _, kh, kw = ws.shape
    flat = ws.reshape(o, c * kh * kw)
    rows_per_block = max(1, _IM2COL_ELEMENTS // max(1, c * kh * kw * ow))
    for b in range(n):
        for r0 in range(0, oh, rows_per_block):
            rows = min(rows_per_block, oh - r0)
            cols = np.empty((c, kh, kw, rows, ow))
            for i in range(kh):
                top = r0 * stride + i
                for j in range(kw):
                    cols[:, i, j] = xs[b, :, top:top + (rows - 1) * stride + 1:stride,
                                       j:j + (ow - 1) * stride + 1:stride]
            acc[b, :, r0:r0 + rows] += (flat @ cols.reshape(c * kh * kw, rows * ow)).reshape(o, rows, ow)


def _pair(value) -> tuple[int, int]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def pool_output(shape, kernel, stride, padding, dilation=1, ceil_mode=False) -> tuple[int, int]:
    """The (height, width) of pooling's output (`window_count` along each axis)."""
    (kh, kw), (sh, sw), (dh, dw) = _pair(kernel), _pair(stride), _pair(dilation)
    top, left, bottom, right = four_pads(padding)
    return (window_count(shape[2], kh, sh, top, bottom, dh, ceil_mode),
            window_count(shape[3], kw, sw, left, right, dw, ceil_mode))


def _windows(x: np.ndarray, kernel, stride, padding, fill, dilation=1, out=None):
    """Every tap of the (kh, kw) window, taps ``dilation`` apart, over ``x`` framed by
    ``padding`` (an int, a pair or (top, left, bottom, right)) of ``fill``, at ``out``
    (height, width) window positions: one strided view each. A partial last window (ceil
    mode) reads ``fill`` past the end padding."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw) = _pair(kernel), _pair(stride), _pair(dilation)
    top, left, bottom, right = four_pads(padding)
    oh, ow = out if out is not None else pool_output(x.shape, kernel, stride, padding, dilation)
    rows = max(top + h, (oh - 1) * sh + (kh - 1) * dh + 1)
    cols = max(left + w, (ow - 1) * sw + (kw - 1) * dw + 1)
    xp = np.full((n, c, rows, cols), fill, x.dtype)
    xp[:, :, top:top + h, left:left + w] = x
    for i in range(kh):
        for j in range(kw):
            yield xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]


def max_pool2d_reference(x: np.ndarray, kernel, stride=None, padding=0, *, dilation=1, ceil_mode: bool = False,
                         zero_padding: bool = False) -> np.ndarray:
    """Max over ``kernel`` windows (an int or a (height, width) pair, as ``stride`` and
    ``dilation``; ``padding`` also (top, left, bottom, right)), ``ceil_mode`` as ONNX
    Runtime's (`window_count`). Padding never wins (ONNX's MaxPool), unless
    ``zero_padding`` (the accelerator's `compile_max_pool2d`: padding reads 0). Floats
    ignore NaN (``np.fmax``): a window is NaN only when all its values are."""
    stride = kernel if stride is None else stride
    if zero_padding:
        fill = 0
    else:
        fill = np.nan if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    out_hw = pool_output(x.shape, kernel, stride, padding, dilation, ceil_mode)
    out = None
    for win in _windows(x, kernel, stride, padding, fill, dilation, out_hw):
        out = win.copy() if out is None else np.fmax(out, win)
    return out


def avg_pool2d_reference(x: np.ndarray, kernel, stride=None, padding=0, *, dilation=1, ceil_mode: bool = False,
                         count_include_pad: bool = False) -> np.ndarray:
    """Mean over ``kernel`` windows (arguments as for max pooling). The divisor counts the
    window's taps inside the input, or with ``count_include_pad`` inside the input and its
    padding (never those of a partial window past the padding: ONNX Runtime's rule).

    Integers round to nearest with halves up: ``floor((sum + count/2) / count)``."""
    stride = kernel if stride is None else stride
    n, c, h, w = x.shape
    top, left, bottom, right = four_pads(padding)
    out_hw = pool_output(x.shape, kernel, stride, padding, dilation, ceil_mode)
    total = sum(win.astype(np.float64 if x.dtype.kind == "f" else np.int64)
                for win in _windows(x, kernel, stride, padding, 0, dilation, out_hw))
    if count_include_pad:
        # The padded frame counted as input, the window's origin at its corner.
        counted = np.ones((1, 1, top + h + bottom, left + w + right), np.int64)
        count = sum(_windows(counted, kernel, stride, 0, 0, dilation, out_hw))
    else:
        count = sum(_windows(np.ones((1, 1, h, w), np.int64), kernel, stride, padding, 0, dilation, out_hw))
    if x.dtype.kind == "f":
        return (total / count).astype(x.dtype)
    return ((total + count // 2) // count).astype(x.dtype)


def softmax_reference(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``."""
    v = x.astype(np.float64)
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def elementwise_reference(op: str, x: np.ndarray, y: np.ndarray | None = None, *, shift=None, relu=False,
                          lo=None, hi=None) -> np.ndarray:
    """``add``/``mul`` (+ requantization or ReLU), ``relu``, ``clip`` on arrays of equal shape.

    Integer inputs compute in int32 (wrapping) and end with the `Epilogue`."""
    floating = x.dtype.kind == "f"
    work = np.float64 if floating else np.int64
    a = x.astype(work)
    if op == "add":
        value = a + y.astype(work)
    elif op == "mul":
        value = a * y.astype(work)
    elif op == "relu":
        return np.maximum(x, 0).astype(x.dtype)
    elif op == "clip":
        value = np.minimum(np.maximum(a, lo), hi)
    else:
        raise ValueError(f"unknown element-wise operator {op!r}")
    if floating:
        return (np.maximum(value, 0) if relu else value).astype(np.float32)
    if op == "clip":
        return value.astype(x.dtype)
    return reference_epilogue(value, None, shift, relu, channel_axis=0)  # int8 with a shift, else int32
