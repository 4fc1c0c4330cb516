"""numpy references of every operator, on every target: the independent check.

Integer operators compute exactly (int64, then the accumulator's int32
wrap-around and the `Epilogue`'s requantization); float operators compute in
float64 and round to float32 once. Layouts are numpy's: matrices (M, K) and
(K, N), images NCHW, weights OIHW.
"""

from __future__ import annotations

import numpy as np

from .common import out_size, reference_epilogue

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


def conv2d_reference(x: np.ndarray, w: np.ndarray, bias=None, stride: int = 1, padding: int = 0,
                     shift=None, relu=False, groups: int = 1) -> np.ndarray:
    """2-D convolution, NCHW × OIHW (I = C / groups), zero padding, and the epilogue (for
    integers the accelerator's: int32 wrap-around, shift, clamp)."""
    acc = conv2d_sums(x, w, stride, padding, groups)
    if x.dtype.kind == "f":
        return _float_epilogue(acc, bias, relu, 1)
    return reference_epilogue(acc, bias, shift, relu, channel_axis=1)


def conv2d_sums(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, groups: int = 1) -> np.ndarray:
    """The convolution's product sums, exact (int64 for integers, float64 for floats)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    floating = x.dtype.kind == "f"
    work = np.float64 if floating else np.int64
    xp = np.zeros((n, c, h + 2 * padding, wd + 2 * padding), work)
    xp[:, :, padding:padding + h, padding:padding + wd] = x
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    acc = np.zeros((n, o, oh, ow), work)
    wl = w.astype(work)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = wl[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + (oh - 1) * stride + 1:stride, j:j + (ow - 1) * stride + 1:stride]
                acc[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return acc


def _pair(value) -> tuple[int, int]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _windows(x: np.ndarray, kernel, stride, padding, fill):
    """Every tap of the (kh, kw) window over ``x`` padded with ``fill``: one strided view each
    (``kernel``, ``stride`` and ``padding`` are ints or (height, width) pairs)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(padding)
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), fill, x.dtype)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    oh, ow = out_size(h, kh, sh, ph), out_size(w, kw, sw, pw)
    for i in range(kh):
        for j in range(kw):
            yield xp[:, :, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw]


def max_pool2d_reference(x: np.ndarray, kernel, stride=None, padding=0, *,
                         zero_padding: bool = False) -> np.ndarray:
    """Max over ``kernel`` windows (an int or a (height, width) pair, as ``stride`` and
    ``padding``). Padding never wins (ONNX's MaxPool), unless ``zero_padding`` (the
    accelerator's `compile_max_pool2d`: padding reads 0). Floats ignore NaN (``np.fmax``):
    a window is NaN only when all its values are."""
    stride = kernel if stride is None else stride
    if zero_padding:
        fill = 0
    else:
        fill = np.nan if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    out = None
    for win in _windows(x, kernel, stride, padding, fill):
        out = win.copy() if out is None else np.fmax(out, win)
    return out


def avg_pool2d_reference(x: np.ndarray, kernel, stride=None, padding=0, *,
                         count_include_pad: bool = False) -> np.ndarray:
    """Mean over ``kernel`` windows (ints or pairs, as for max pooling; padding counted
    only with ``count_include_pad``).

    Integers round to nearest with halves up: ``floor((sum + count/2) / count)``."""
    stride = kernel if stride is None else stride
    n, c, h, w = x.shape
    ones = np.ones((1, 1, h, w), np.int64)
    total = sum(win.astype(np.float64 if x.dtype.kind == "f" else np.int64)
                for win in _windows(x, kernel, stride, padding, 0))
    if count_include_pad:
        taps = _pair(kernel)[0] * _pair(kernel)[1]
        count = np.full_like(total, taps) if x.dtype.kind == "f" else taps
    else:
        count = sum(win for win in _windows(ones, kernel, stride, padding, 0))
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
