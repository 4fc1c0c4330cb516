"""Operator definitions on the host targets' layouts (CPU, GPU): tensor expressions only.

Layouts are numpy's (row-major): matrices (M, K) and (K, N), images NCHW,
weights OIHW. Two layout choices belong to the definitions because they
change what is computed where, and the schedules pass them in:

- ``panel``: dense and conv2d reduce into outputs whose innermost axis (the
  vectorized one: output columns, output pixels) is padded to a multiple of
  ``panel``, so every register tile is whole; the host drops the padding.
  Dense repacks its weight matrix into panels ``(N/panel, K, panel)``, read
  contiguously by the inner loop;
- conv2d lowers to a matrix product per group: weights ``(O, C/G·KH·KW)``
  times the input's windows (`conv2d_method`: read in place from the padded
  image flattened row by row for stride 1, copied into an im2col matrix
  otherwise, the input itself for an unpadded 1×1), or, for one group, its
  transpose with the output pixels for rows (`conv2d_rows_te`: the channels
  vectorized, for small images and strided windows).

Integers accumulate in int32 and end with the `Epilogue` (bias, shift,
clip/ReLU); floats accumulate in float32 (bias, ReLU). `dense_vnni_te` and
`conv2d_vnni_te` compute the int8 products on 4-byte dot products
(`dot4_u8s8`), with the packings that needs. Other operators: element-wise
(with broadcasting), transposes, constant padding, max/average pooling (global included),
means and softmax.
"""

from __future__ import annotations

import math
import operator

from dataclasses import dataclass

from ..ir import (
    And, BufferLoad, Call, Cast, Cmp, Const, Div, Expr, FloorDiv, FloorMod, Max, Min, Select, is_float,
    is_int, reduction_identity,
)
from ..te import Tensor, clip, compute, pad, placeholder, reduce_axis, reduce_fmax, reduce_max, sum_
from .common import Epilogue, OpError, four_pads, out_size, window_count
from .functions import FLOAT_FUNCTIONS

__all__ = [
    "accumulator_dtype", "dense_te", "conv2d_te", "conv2d_rows_te", "conv2d_vnni_rows_te", "conv2d_method",
    "channel_blocks", "conv2d_layout", "ConvLayout", "dense_vnni_te", "conv2d_vnni_te", "pack_conv_rows", "pack_conv_weights_vnni",
    "pack_dense_weights_vnni", "pack_dense_panels", "elementwise_te", "scale_shift_te", "quantize_te", "unfold_te",
    "transpose_te", "slice_te", "pad_te", "pool2d_te", "mean_te", "softmax_te", "round_up",
    "ELEMENTWISE_OPS", "FLOAT_ELEMENTWISE_OPS", "ALPHA_FUNCTIONS", "window_pixel", "CHANNEL_BLOCK",
    "depthwise_blocked_te",
]

#: Channels per block of the CPU's blocked image layout, NCHW16c: an (N, C, H, W) float32 image
#: held as (N, C/16, H, W, 16), the 16 channels of a pixel one AVX-512 vector (two AVX2 ones), as
#: oneDNN's and TVM's x86 convolutions keep it between layers (`graph.blocked` plans where).
CHANNEL_BLOCK = 16


def channel_blocks(channels: int) -> int:
    """The blocks a blocked image of ``channels`` channels holds: a partial last one padded with zeros."""
    return -(-channels // CHANNEL_BLOCK)


#: The element-wise operators of two tensors (``y`` broadcast to ``x``).
_BINARY = ("add", "sub", "mul", "div", "max", "min")
#: Element-wise operators and their arity: the binary ones, ReLU, clip and the float functions.
ELEMENTWISE_OPS = {**{op: 2 for op in _BINARY}, "relu": 1, "clip": 1, **{f: 1 for f in FLOAT_FUNCTIONS}}
#: Those of them that take floats only.
FLOAT_ELEMENTWISE_OPS = ("div", "max", "min", *FLOAT_FUNCTIONS)
#: The float functions that take a parameter ``alpha`` (leaky_relu's slope below 0, elu's scale).
ALPHA_FUNCTIONS = tuple(name for name, f in FLOAT_FUNCTIONS.items() if f.alpha)
_ARITHMETIC = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv, "max": Max,
               "min": Min}


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def accumulator_dtype(dtype: str) -> str:
    """int32 for integer operands, float32 for floats."""
    if is_float(dtype):
        return "float32"
    if is_int(dtype):
        return "int32"
    raise OpError(f"operators take int8 or float32 data, not {dtype}")


def _zero_padded(t: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
    """``t`` read as if zero-padded at the end of each axis to ``shape`` (inlined by schedules)."""
    if tuple(shape) == tuple(t.shape):
        return t
    return pad(t, [0] * t.ndim, [s - d for s, d in zip(shape, t.shape)], name)


def dense_te(m: int, k: int, n: int, dtype: str, epilogue: Epilogue, panel: int,
             packed: bool = False) -> dict[str, Tensor]:
    """``out = epilogue(a @ w)`` with ``w`` packed into column panels of width ``panel``.

    Tensors: ``a`` (m, k), ``w`` (k, n), ``bias`` (n_pad,), ``wp`` (packed weights),
    ``c`` (the accumulation), ``out`` (m, n_pad) with n_pad = n rounded up to ``panel``.
    With ``packed`` the panels are the input (`pack_dense_panels`; no ``w``): constant
    weights packed once, where a matrix-vector product would otherwise spend more time
    packing them at every call than multiplying."""
    acc = accumulator_dtype(dtype)
    n_pad = round_up(n, panel)
    a = placeholder((m, k), dtype, "a")
    tensors: dict[str, Tensor] = {"a": a}
    if packed:
        wp = tensors["wp"] = placeholder((n_pad // panel, k, panel), dtype, "wp")
    else:
        w = tensors["w"] = placeholder((k, n), dtype, "w")
        w_padded = tensors["w.pad"] = _zero_padded(w, (k, n_pad), "w.pad")
        wp = tensors["wp"] = compute((n_pad // panel, k, panel), lambda o, r, i: w_padded[r, o * panel + i],
                                     name="wp")
    r = reduce_axis(k, "k")
    c = tensors["c"] = compute(
        (m, n_pad), lambda i, j: sum_(a[i, r].astype(acc) * wp[j // panel, r, j % panel].astype(acc), [r]), name="c")
    bias = None
    if epilogue.bias:
        bias = tensors["bias"] = placeholder((n_pad,), acc, "bias")
    tensors["out"] = compute((m, n_pad), lambda i, j: epilogue.apply(c[i, j], bias[j] if bias else None),
                             name="out", dtype=epilogue.out_dtype(acc))
    return tensors


@dataclass(frozen=True)
class ConvLayout:
    """Where conv2d's output pixels lie: row ``y`` starts at ``y · pitch``."""

    method: str
    pitch: int


def conv2d_method(kernel: tuple[int, int], stride: int, padding: int) -> str:
    """How conv2d builds the right operand of its matrix product:

    - ``direct``: a 1×1, stride-1, unpadded kernel reads the input as it is;
    - ``shifted``: stride 1 — the padded input is flattened row by row (pitch
      W + 2·padding) and kernel tap (kh, kw) reads it shifted by kh·pitch + kw,
      so pixels stay contiguous and no im2col matrix exists (the pixels past
      each row's end are computed and dropped);
    - ``im2col``: other strides copy the windows into an im2col matrix."""
    if stride == 1 and kernel == (1, 1) and padding == 0:
        return "direct"
    return "shifted" if stride == 1 else "im2col"


def conv2d_layout(width: int, kernel: tuple[int, int], stride: int, padding: int, vnni: bool = False) -> ConvLayout:
    """conv2d's method (`conv2d_method`; the VNNI path reads stride 1 shifted, all else
    through im2col) and the pitch of its output rows: the padded input's width where
    windows are read shifted in place, else the output's width."""
    if vnni:
        method = "vnni-shifted" if stride == 1 else "vnni-im2col"
    else:
        method = conv2d_method(kernel, stride, padding)
    shifted = method in ("shifted", "vnni-shifted")
    return ConvLayout(method, width + 2 * padding if shifted else out_size(width, kernel[1], stride, padding))


def conv2d_te(shape: tuple[int, int, int, int], weight: tuple[int, int, int, int], stride: int, padding: int,
              groups: int, dtype: str, epilogue: Epilogue, panel: int) -> dict[str, Tensor]:
    """``out = epilogue(conv2d(x, w))`` as one matrix product per group (`conv2d_method`).

    Tensors: ``x`` (N, C, H, W) — (N, C, H·W) for ``direct`` —, ``w``
    (O, C/G·KH·KW), ``bias`` (O,), the right operand's packing stage (``col``:
    the im2col matrix (N, G, C/G·KH·KW, pixels); ``flat``: the padded input
    flattened (N, C, length)), ``c``, and ``out`` (N, O, pixels) where the
    output rows lie ``pitch`` pixels apart (OW, or W + 2·padding for
    ``shifted``) and the pixel axis is padded to a multiple of ``panel``. The
    host keeps OW of each row's ``pitch``."""
    n, c, h, wd = shape
    o, cg, kh, kw = weight
    acc = accumulator_dtype(dtype)
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    layout = conv2d_layout(wd, (kh, kw), stride, padding)
    method, pitch = layout.method, layout.pitch
    p_pad = round_up(oh * pitch, panel)
    og = o // groups
    taps = kh * kw
    red = cg * taps
    w = placeholder((o, red), dtype, "w")
    tensors: dict[str, Tensor] = {"w": w}
    if method == "direct" and p_pad == oh * ow:
        x = tensors["x"] = placeholder((n, c, oh * ow), dtype, "x")

        def column(b, g, r, q):
            return x[b, g * cg + r, q]
    else:
        x = tensors["x"] = placeholder((n, c, h, wd), dtype, "x")
        if method == "shifted":
            length = p_pad + (kh - 1) * pitch + kw - 1
            flat = tensors["flat"] = compute((n, c, length),
                                             lambda b, ci, f: _read_padded(x, b, ci, f, pitch, padding), name="flat")

            def column(b, g, r, q):
                return flat[b, g * cg + r // taps, q + ((r // kw) % kh) * pitch + r % kw]
        else:
            # The window's padding read as zeros of a masked load (no padded copy, no select
            # per element): a strided window's lanes then load as one span (`llvm.codegen`).
            def window(b, g, r, q):
                y, xx = window_pixel(q, r, ow, kh, kw, stride)
                return BufferLoad(x.buffer, (b, g * cg + r // taps, y - padding, xx - padding), zero_outside=True)
            col = tensors["col"] = compute((n, groups, red, p_pad), window, name="col")

            def column(b, g, r, q):
                return col[b, g, r, q]
    rr = reduce_axis(red, "r")
    cc = tensors["c"] = compute(
        (n, o, p_pad), lambda b, oc, q: sum_(w[oc, rr].astype(acc) * column(b, oc // og, rr.var, q).astype(acc), [rr]),
        name="c")
    bias = None
    if epilogue.bias:
        bias = tensors["bias"] = placeholder((o,), acc, "bias")
    residual = None
    if epilogue.residual:
        residual = tensors["residual"] = placeholder((n, o, oh * ow), acc, "residual")

    def residual_at(b, oc, q):
        # Output pixel q lies at (q // pitch, q % pitch); the columns past ``ow`` of a pitched
        # row are dropped, so what they read does not matter (as long as it is inside).
        pixel = q if pitch == ow else (q // pitch) * ow + q % pitch
        return BufferLoad(residual.buffer, (b, oc, pixel), zero_outside=True)
    tensors["out"] = compute(
        (n, o, p_pad), lambda b, oc, q: epilogue.apply(
            cc[b, oc, q], bias[oc] if bias else None, residual_at(b, oc, q) if residual else None),
        name="out", dtype=epilogue.out_dtype(acc))
    tensors["layout"] = layout
    return tensors


def conv2d_rows_te(shape: tuple[int, int, int, int], weight: tuple[int, int, int, int], stride: int, padding: int,
                   dtype: str, epilogue: Epilogue, panel: int, *, blocked_in: bool = False,
                   blocked_out: bool = False) -> dict[str, Tensor]:
    """A one-group convolution as the product with the output pixels for rows and the output
    channels for columns, the transpose of `conv2d_te`'s: ``c[b, q, oc] = Σ_r window(b, q, r) ·
    wp[oc // panel, r, oc % panel]`` over r = (channel, kernel row, kernel column), written to
    NCHW ``out[b, oc, q]``. The vectorized axis is then the channels (a multiple of 16 in most
    networks) rather than the pixels, which a small image leaves ragged: a 7×7 image's 49
    pixels pad to 64 columns, and `conv2d_te`'s shifted windows compute a 3×3 layer's 7 rows
    9 pixels apart (63 columns for 49 pixels); a strided layer reads its windows in place
    instead of copying them into an im2col matrix. The window values are the product's
    broadcast operand, read one at a time, so a padded image is first copied into ``flat``
    (zero-padded, rows ``pitch`` apart) where each read is one load. The price: each output
    element is stored on its own (the vector lanes are channels, 4·pixels bytes apart).

    In the CPU's blocked image layout (`CHANNEL_BLOCK`, float32): ``blocked_in`` reads ``x`` as
    (N, C/16, H, W, 16), the reduction running over (channel block, kernel row, kernel column,
    channel in the block) so that consecutive steps read one cache line of 16 channels;
    ``blocked_out`` writes ``out`` (N, O_pad/16, OH·OW, 16), each tile's vectors stored whole
    (no scatter), ``residual`` alike.

    Tensors: ``x`` (N, C, H·W) for an unpadded 1×1 stride-1 layer, else (N, C, H, W); ``flat``
    when padded (``padded``, (N, C/16, H + 2·padding, W + 2·padding, 16), for a blocked input);
    ``wp`` the weights packed into column panels (`pack_conv_rows`), ``bias``
    (O_pad,), ``residual`` (N, O, OH·OW) with ``epilogue.residual``, ``c`` and ``out``
    (N, O_pad, OH·OW)."""
    n, c, h, wd = shape
    o, _, kh, kw = weight
    taps = kh * kw
    acc = accumulator_dtype(dtype)
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    pixels, o_pad = oh * ow, round_up(o, panel)
    block = CHANNEL_BLOCK
    if (blocked_in or blocked_out) and (dtype != "float32" or (blocked_out and panel % block)):
        raise OpError(f"a blocked convolution is float32 with its output's tile whole channel blocks of {block}, not "
                      f"{dtype} in tiles of {panel}")
    # A blocked input's last block may be partly channels: the reduction runs over whole blocks,
    # the weights of the channels past C zero.
    reduced = round_up(c, block) if blocked_in else c
    wp = placeholder((o_pad // panel, reduced * taps, panel), dtype, "wp")
    tensors: dict[str, Tensor] = {"wp": wp}
    if blocked_in:
        x = tensors["x"] = placeholder((n, reduced // block, h, wd, block), dtype, "x")
        image = x
        if padding:
            image = tensors["padded"] = compute(
                (n, reduced // block, h + 2 * padding, wd + 2 * padding, block),
                lambda b, k, y, xx, i: BufferLoad(x.buffer, (b, k, y - padding, xx - padding, i), zero_outside=True),
                name="padded")

        def window(b, r, q):
            tap = r // block
            row, col = window_pixel(q, tap, ow, kh, kw, stride)
            return image[b, tap // taps, row, col, r % block]
    elif (kh, kw, stride, padding) == (1, 1, 1, 0):
        x = tensors["x"] = placeholder((n, c, pixels), dtype, "x")

        def window(b, r, q):
            return x[b, r, q]
    elif padding:
        x = tensors["x"] = placeholder((n, c, h, wd), dtype, "x")
        pitch = wd + 2 * padding
        flat = tensors["flat"] = compute((n, c, (h + 2 * padding) * pitch),
                                         lambda b, ci, f: _read_padded(x, b, ci, f, pitch, padding), name="flat")

        def window(b, r, q):
            row, col = window_pixel(q, r, ow, kh, kw, stride)
            return flat[b, r // taps, row * pitch + col]
    else:
        x = tensors["x"] = placeholder((n, c, h, wd), dtype, "x")

        def window(b, r, q):
            return x[(b, r // taps, *window_pixel(q, r, ow, kh, kw, stride))]
    rr = reduce_axis(reduced * taps, "r")
    cc = tensors["c"] = compute((n, pixels, o_pad), lambda b, q, oc: sum_(
        window(b, rr.var, q).astype(acc) * wp[oc // panel, rr, oc % panel].astype(acc), [rr]), name="c")
    bias = tensors["bias"] = placeholder((o_pad,), acc, "bias") if epilogue.bias else None
    if blocked_out:
        residual = tensors["residual"] = placeholder((n, channel_blocks(o), pixels, block), acc, "residual") \
            if epilogue.residual else None
        tensors["out"] = compute(
            (n, o_pad // block, pixels, block), lambda b, k, q, i: zero_past(o, k * block + i, epilogue.apply(
                cc[b, q, k * block + i], bias[k * block + i] if bias else None,
                BufferLoad(residual.buffer, (b, k, q, i), zero_outside=True) if residual else None)),
            name="out", dtype=epilogue.out_dtype(acc))
    else:
        residual = tensors["residual"] = placeholder((n, o, pixels), acc, "residual") if epilogue.residual else None
        tensors["out"] = compute(
            (n, o_pad, pixels), lambda b, oc, q: epilogue.apply(
                cc[b, q, oc], bias[oc] if bias else None,
                BufferLoad(residual.buffer, (b, oc, q), zero_outside=True) if residual else None),
            name="out", dtype=epilogue.out_dtype(acc))
    if bias is None:
        del tensors["bias"]
    if residual is None:
        del tensors["residual"]
    tensors["layout"] = ConvLayout("blocked" if blocked_in or blocked_out else "rows", ow)
    return tensors


def pack_conv_rows(w, panel: int, blocked_in: bool = False):
    """(O, C, KH, KW) weights → the (O_pad/panel, C·KH·KW, panel) column panels `conv2d_rows_te` reads
    (``blocked_in``: its reduction in the order (C/16, KH, KW, 16), C rounded up to whole blocks
    with zero weights)."""
    import numpy as np
    o, c, kh, kw = w.shape
    if blocked_in:
        blocks = channel_blocks(c)
        w = np.pad(w, ((0, 0), (0, blocks * CHANNEL_BLOCK - c), (0, 0), (0, 0)))
        w = w.reshape(o, blocks, CHANNEL_BLOCK, kh, kw).transpose(0, 1, 3, 4, 2)
    return pack_dense_panels(w.reshape(o, -1).T, panel)


def zero_past(channels: int, channel: Expr, value: Expr) -> Expr:
    """``value``, or 0 in the lanes of a blocked image's last block past its ``channels``: a partial
    block's padding is zeros, which the layers reading it keep (`graph.blocked`)."""
    if channels % CHANNEL_BLOCK == 0:
        return value
    return Select(Cmp("<", channel, Const(channels)), value, Const(0.0, value.dtype))


def depthwise_conv2d_te(shape: tuple[int, int, int, int], weight: tuple[int, int, int, int], stride: int,
                        padding: int, dtype: str, epilogue: Epilogue) -> dict[str, Tensor]:
    """A depthwise convolution (one group per input channel, ``O/C`` output channels each) as its
    window sums: ``out[b, k, y, x] = epilogue(Σ_ij xp[b, k // m, y·s + i, x·s + j] · w[k, i·KW + j])``
    for ``m = O/C``. Unlike `conv2d_te`'s product per group, each output row is a few vector
    multiply-adds per tap, so the CPU keeps its lanes full (a group's product here is 1 × KH·KW).

    Tensors: ``x`` (N, C, H, W), ``w`` (O, KH·KW; float32 for int8 sums computed in float32),
    ``bias`` (O,), ``xp`` (the padded input, in the sums' type),
    ``sum`` and ``out`` (N, O, OH, OW). With a stride above 1, ``xs`` instead of ``xp``: the
    padded input with each row's columns split by their phase, (N, C, HP, stride, columns),
    ``xs[.., y, p, j] = xp[.., y, j·stride + p]``, so that a tap reads consecutive columns
    (MobileNetV2's 96-channel 112×112 stride-2 layer: 0.66 ms reading every second column,
    0.29 ms split first)."""
    n, c, h, wd = shape
    o, _, kh, kw = weight
    multiplier = o // c
    acc = accumulator_dtype(dtype)
    # int8 window sums in float32 where every sum is an integer float32 holds exactly (each
    # product at most 2^14): a float multiply-add a tap, where int32 takes a widening multiply
    # and an add (MobileNetV2's int8 depthwise layers ran 1.6–2.2× slower than float32).
    float_sums = dtype == "int8" and kh * kw * (1 << 14) < (1 << 24)
    sums = "float32" if float_sums else acc
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    x = placeholder(shape, dtype, "x")
    w = placeholder((o, kh * kw), sums if float_sums else dtype, "w")
    tensors: dict[str, Tensor] = {"x": x, "w": w}
    ri, rj = reduce_axis(kh, "kh"), reduce_axis(kw, "kw")
    if stride > 1:
        columns = ow + (kw - 1) // stride
        if float_sums:
            # int8 read through a padded float copy first (contiguous rows, each edge's masked load
            # on 32-bit lanes): the split's strided reads are then in bounds, where a masked strided
            # read of bytes went element by element on AVX2 (96 channels, 112×112: 1.5 → 0.84 ms).
            xp = tensors["xp"] = compute(
                (n, c, h + 2 * padding, max(wd + 2 * padding, columns * stride) + stride),
                lambda b, ch, y, xx: BufferLoad(x.buffer, (b, ch, y - padding, xx - padding),
                                                zero_outside=True).astype(sums), name="xp")
            xs = tensors["xs"] = compute((n, c, h + 2 * padding, stride, columns),
                                         lambda b, ch, y, phase, j: xp[b, ch, y, j * stride + phase], name="xs")
        else:
            xs = tensors["xs"] = compute(
                (n, c, h + 2 * padding, stride, columns), lambda b, ch, y, phase, j: BufferLoad(
                    x.buffer, (b, ch, y - padding, j * stride + phase - padding), zero_outside=True).astype(sums),
                name="xs")

        def tap(b, k, y, xx):
            return xs[b, k // multiplier, y * stride + ri, rj % stride, xx + rj // stride]
    else:
        # The padded copy (made channel by channel, `cpu.schedule_depthwise`) holds the values
        # the sums take: int8 converted once there rather than at each of the taps.
        xp = tensors["xp"] = compute(
            (n, c, h + 2 * padding, wd + 2 * padding), lambda b, ch, y, xx: BufferLoad(
                x.buffer, (b, ch, y - padding, xx - padding), zero_outside=True).astype(sums),
            name="xp") if padding or float_sums else x

        def tap(b, k, y, xx):
            return xp[b, k // multiplier, y + ri, xx + rj]
    total = tensors["sum"] = compute((n, o, oh, ow), lambda b, k, y, xx: sum_(
        tap(b, k, y, xx).astype(sums) * w[k, ri * kw + rj].astype(sums), [ri, rj]), name="sum")
    bias = None
    if epilogue.bias:
        bias = tensors["bias"] = placeholder((o,), acc, "bias")

    def summed(b, k, y, xx):
        return Cast(acc, total[b, k, y, xx]) if float_sums else total[b, k, y, xx]
    tensors["out"] = compute((n, o, oh, ow), lambda b, k, y, xx: epilogue.apply(summed(b, k, y, xx),
                                                                                 bias[k] if bias else None),
                             name="out", dtype=epilogue.out_dtype(acc))
    return tensors


def depthwise_blocked_te(shape: tuple[int, int, int, int], weight: tuple[int, int, int, int], stride: int,
                         padding: int, epilogue: Epilogue) -> dict[str, Tensor]:
    """A float32 depthwise convolution (one output channel per input channel) in the blocked layout
    (`CHANNEL_BLOCK`): ``out[b, k, y, x, i] = epilogue(Σ_ij xp[b, k, y·s + i', x·s + j] · w[k, i'·KW + j, i])``,
    each tap one vector multiply-add over a pixel's 16 channels, whatever the stride.

    Tensors: ``x`` (N, C/16, H, W, 16), ``padded`` with padding (N, C/16, H + 2p, W + 2p, 16),
    ``w`` (C/16, KH·KW, 16), ``bias`` (C rounded up to whole blocks,), ``sum`` and ``out``
    (N, C/16, OH, OW, 16); C/16 rounded up, a partial last block's padding zero in ``out``."""
    n, c, h, wd = shape
    o, _, kh, kw = weight
    block = CHANNEL_BLOCK
    if o != c:
        raise OpError(f"a blocked depthwise convolution has one output channel per input channel, not {c} → {o}")
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    blocks = channel_blocks(c)
    x = placeholder((n, blocks, h, wd, block), "float32", "x")
    w = placeholder((blocks, kh * kw, block), "float32", "w")
    tensors: dict[str, Tensor] = {"x": x, "w": w}
    image = x
    if padding:
        image = tensors["padded"] = compute(
            (n, blocks, h + 2 * padding, wd + 2 * padding, block),
            lambda b, k, y, xx, i: BufferLoad(x.buffer, (b, k, y - padding, xx - padding, i), zero_outside=True),
            name="padded")
    ri, rj = reduce_axis(kh, "kh"), reduce_axis(kw, "kw")
    total = tensors["sum"] = compute((n, blocks, oh, ow, block), lambda b, k, y, xx, i: sum_(
        image[b, k, y * stride + ri, xx * stride + rj, i] * w[k, ri * kw + rj, i], [ri, rj]), name="sum")
    bias = tensors["bias"] = placeholder((blocks * block,), "float32", "bias") if epilogue.bias else None
    tensors["out"] = compute((n, blocks, oh, ow, block), lambda b, k, y, xx, i: zero_past(c, k * block + i, epilogue.apply(
        total[b, k, y, xx, i], bias[k * block + i] if bias else None)), name="out", dtype="float32")
    if bias is None:
        del tensors["bias"]
    return tensors


def window_pixel(q, r, ow: int, kh: int, kw: int, stride: int) -> tuple[Expr, Expr]:
    """(row, column) of the padded image that im2col entry (``r``, ``q``) reads: reduction
    index ``r`` runs over (channel, kernel row, kernel column), output pixel ``q`` row-major
    over an output ``ow`` wide."""
    return (q // ow) * stride + (r // kw) % kh, (q % ow) * stride + r % kw


def _read_padded(x: Tensor, b, ci, f: Expr, pitch: int, padding: int) -> Expr:
    """Element ``f`` of image ``x`` zero-padded by ``padding`` and read row by row with
    ``pitch`` (zeros past its last row)."""
    return BufferLoad(x.buffer, (b, ci, FloorDiv(f, Const(pitch)) - padding, FloorMod(f, Const(pitch)) - padding),
                      zero_outside=True)


def _bytes_u8(load_byte, count: int = 4, offset: int = 128) -> Expr:
    """Four int8 values (``load_byte(j)``) offset by 128 to unsigned bytes and packed little-
    endian into one int32: the unsigned operand of `dot4_u8s8` (``offset`` 0: values known to be
    non-negative, already unsigned bytes below 128, `dot4_u7s8`'s)."""
    packed: Expr | None = None
    for j in range(count):
        term = (load_byte(j).astype("int32") + offset) * (1 << (8 * j))
        packed = term if packed is None else packed + term
    return packed


def conv2d_vnni_te(shape: tuple[int, int, int, int], weight: tuple[int, int, int, int], stride: int, padding: int,
                   groups: int, epilogue: Epilogue, panel: int, nonnegative: bool = False) -> dict[str, Tensor]:
    """int8 conv2d on 4-byte dot products (`dot4_u8s8`: AVX-512 VNNI's ``vpdpbusd``).

    Each group's input channels go in fours: the activations, offset by 128 to
    unsigned bytes, are packed four channels to an int32 (``x4``: the padded
    image flattened with the `conv2d_method` pitch for stride 1, an im2col
    matrix otherwise); the weights ``w4`` (O, C/G/4·KH·KW) int32 and the offset's
    correction ``corr`` = 128·Σ w (O,) come packed from the host. ``out`` is laid
    out as in `conv2d_te`. ``nonnegative``: the input holds no negative value (a ReLU's output),
    so its bytes go as they are (``corr`` then zero) into `dot4_u7s8`, cheaper where the CPU
    has no VNNI."""
    offset, dot4 = (0, "dot4_u7s8") if nonnegative else (128, "dot4_u8s8")
    n, c, h, wd = shape
    o, cg, kh, kw = weight
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    taps = kh * kw
    cg4 = -(-cg // 4)
    og = o // groups
    layout = conv2d_layout(wd, (kh, kw), stride, padding, vnni=True)
    shifted, pitch = layout.method == "vnni-shifted", layout.pitch
    p_pad = round_up(oh * pitch, panel)
    x = placeholder((n, c, h, wd), "int8", "x")
    w4 = placeholder((o, cg4 * taps), "int32", "w4")
    corr = placeholder((o,), "int32", "corr")
    tensors: dict[str, Tensor] = {"x": x, "w4": w4, "corr": corr}

    def channel(b, g, c4, j, row, col):
        # Channels past the group's count read a neighbour or zero: their weights are zero.
        return BufferLoad(x.buffer, (b, g * cg + c4 * 4 + j, row, col), zero_outside=True)
    if shifted:
        length = p_pad + (kh - 1) * pitch + kw - 1
        x4 = tensors["x4"] = compute(
            (n, groups, cg4, length),
            lambda b, g, c4, f: _bytes_u8(lambda j: channel(b, g, c4, j, FloorDiv(f, Const(pitch)) - padding,
                                                            FloorMod(f, Const(pitch)) - padding), offset=offset),
            name="x4")

        def operand(b, g, r4, q):
            return x4[b, g, r4 // taps, q + ((r4 // kw) % kh) * pitch + r4 % kw]
    else:
        x4 = tensors["x4"] = compute(
            (n, groups, cg4 * taps, p_pad),
            lambda b, g, r4, q: _bytes_u8(lambda j: channel(
                b, g, r4 // taps, j, *(v - padding for v in window_pixel(q, r4, ow, kh, kw, stride))), offset=offset),
            name="x4")

        def operand(b, g, r4, q):
            return x4[b, g, r4, q]
    r4 = reduce_axis(cg4 * taps, "r4")
    cc = tensors["c"] = compute(
        (n, o, p_pad), lambda b, oc, q: sum_(Call(dot4, (operand(b, oc // og, r4.var, q), w4[oc, r4])), [r4]),
        name="c")
    bias = None
    if epilogue.bias:
        bias = tensors["bias"] = placeholder((o,), "int32", "bias")
    tensors["out"] = compute(
        (n, o, p_pad), lambda b, oc, q: epilogue.apply(cc[b, oc, q] - corr[oc], bias[oc] if bias else None),
        name="out", dtype=epilogue.out_dtype("int32"))
    tensors["layout"] = layout
    return tensors


def conv2d_vnni_rows_te(shape: tuple[int, int, int, int], weight: tuple[int, int, int, int], stride: int,
                        padding: int, epilogue: Epilogue, panel: int, nonnegative: bool = False) -> dict[str, Tensor]:
    """`conv2d_vnni_te`'s int8 product (one group) transposed as `conv2d_rows_te`'s: the output
    pixels for rows, the output channels for columns, ``c[b, q, oc] = Σ_r4 dot4(x4[…], w4p[oc //
    panel, r4, oc % panel])``. ``x4`` is the padded image flattened (rows ``pitch`` apart) with
    four channels' bytes to an int32, read one at a time as the broadcast operand; ``w4p`` the
    VNNI weights packed into column panels, ``corr`` (O_pad,). ``out`` (N, O_pad, OH·OW).
    ``nonnegative`` as for `conv2d_vnni_te`."""
    offset, dot4 = (0, "dot4_u7s8") if nonnegative else (128, "dot4_u8s8")
    n, c, h, wd = shape
    o, _, kh, kw = weight
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    taps, c4 = kh * kw, -(-c // 4)
    pitch, o_pad = wd + 2 * padding, round_up(o, panel)
    x = placeholder((n, c, h, wd), "int8", "x")
    w4p = placeholder((o_pad // panel, c4 * taps, panel), "int32", "w4p")
    corr = placeholder((o_pad,), "int32", "corr")
    x4 = compute((n, c4, (h + 2 * padding) * pitch), lambda b, q4, f: _bytes_u8(
        lambda j: _read_padded(x, b, q4 * 4 + j, f, pitch, padding), offset=offset), name="x4")
    r4 = reduce_axis(c4 * taps, "r4")

    def window(b, r, q):
        row, col = window_pixel(q, r, ow, kh, kw, stride)
        return x4[b, r // taps, row * pitch + col]
    cc = compute((n, oh * ow, o_pad), lambda b, q, oc: sum_(
        Call(dot4, (window(b, r4.var, q), w4p[oc // panel, r4, oc % panel])), [r4]), name="c")
    tensors: dict[str, Tensor] = {"x": x, "w4p": w4p, "corr": corr, "x4": x4, "c": cc}
    bias = tensors["bias"] = placeholder((o_pad,), "int32", "bias") if epilogue.bias else None
    if bias is None:
        del tensors["bias"]
    tensors["out"] = compute(
        (n, o_pad, oh * ow), lambda b, oc, q: epilogue.apply(cc[b, q, oc] - corr[oc], bias[oc] if bias else None),
        name="out", dtype=epilogue.out_dtype("int32"))
    tensors["layout"] = ConvLayout("vnni-rows", ow)
    return tensors


def dense_vnni_te(m: int, k: int, n: int, epilogue: Epilogue, panel: int) -> dict[str, Tensor]:
    """int8 dense on 4-byte dot products: ``a`` offset by 128 and packed four columns to an
    int32 (``a4``, in the kernel); the weights ``w4`` (N/panel, K/4, panel) int32 and the
    correction ``corr`` = 128·Σ_k w (N_pad,) come packed from the host."""
    k4 = -(-k // 4)
    n_pad = round_up(n, panel)
    a = placeholder((m, k), "int8", "a")
    w4 = placeholder((n_pad // panel, k4, panel), "int32", "w4")
    corr = placeholder((n_pad,), "int32", "corr")
    a4 = compute((m, k4), lambda i, r: _bytes_u8(lambda j: BufferLoad(a.buffer, (i, r * 4 + j), zero_outside=True)),
                 name="a4")
    r = reduce_axis(k4, "k4")
    c = compute((m, n_pad), lambda i, j: sum_(Call("dot4_u8s8", (a4[i, r], w4[j // panel, r, j % panel])), [r]),
                name="c")
    tensors = {"a": a, "w4": w4, "corr": corr, "a4": a4, "c": c}
    bias = None
    if epilogue.bias:
        bias = tensors["bias"] = placeholder((n_pad,), "int32", "bias")
    tensors["out"] = compute((m, n_pad), lambda i, j: epilogue.apply(c[i, j] - corr[j], bias[j] if bias else None),
                             name="out", dtype=epilogue.out_dtype("int32"))
    return tensors


def pack_conv_weights_vnni(w, groups: int, offset: bool = True):
    """OIHW int8 weights → (w4, corr) for `conv2d_vnni_te` (numpy); ``offset`` False: an input taken
    as it is (``nonnegative``), whose correction is zero."""
    import numpy as np
    o, cg, kh, kw = w.shape
    cg4 = -(-cg // 4)
    padded = np.zeros((o, cg4 * 4, kh, kw), np.int8)
    padded[:, :cg] = w
    w4 = np.ascontiguousarray(padded.reshape(o, cg4, 4, kh, kw).transpose(0, 1, 3, 4, 2)).view(np.int32)
    corr = ((128 if offset else 0) * w.reshape(o, -1).astype(np.int64).sum(1)).astype(np.int32)
    return w4.reshape(o, cg4 * kh * kw), corr


def pack_dense_panels(w, panel: int):
    """(K, N) weights → the (N_pad/panel, K, panel) column panels `dense_te` reads (numpy)."""
    import numpy as np
    k, n = w.shape
    n_pad = round_up(n, panel)
    padded = np.zeros((k, n_pad), w.dtype)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, n_pad // panel, panel).transpose(1, 0, 2))


def pack_dense_weights_vnni(w, panel: int):
    """(K, N) int8 weights → (w4, corr) for `dense_vnni_te` (numpy)."""
    import numpy as np
    k, n = w.shape
    k4, n_pad = -(-k // 4), round_up(n, panel)
    padded = np.zeros((k4 * 4, n_pad), np.int8)
    padded[:k, :n] = w
    w4 = np.ascontiguousarray(padded.reshape(k4, 4, n_pad // panel, panel).transpose(2, 0, 3, 1)).view(np.int32)
    corr = np.zeros(n_pad, np.int32)
    corr[:n] = (128 * w.astype(np.int64).sum(0)).astype(np.int32)
    return w4.reshape(n_pad // panel, k4, panel), corr


def elementwise_te(op: str, shape: tuple[int, ...], dtype: str, y_shape: tuple[int, ...] | None = None, *,
                   shift: int | None = None, relu: bool = False, lo=None, hi=None, alpha=None) -> dict[str, Tensor]:
    """``add``/``sub``/``mul``/``div``/``max``/``min`` (``y`` broadcast to ``x``'s shape, numpy's
    rules), ``relu``, ``clip``, and the float functions of `functions.FLOAT_FUNCTIONS` (sigmoid,
    tanh, erf…; those with a parameter take ``alpha``).

    Integer inputs compute in int32 and end with the `Epilogue` (``shift``:
    requantize to int8; ``relu``); float inputs compute in float32 (``relu``);
    the operators of `FLOAT_ELEMENTWISE_OPS` take floats only. ``clip`` keeps the
    input type."""
    x = placeholder(shape, dtype, "x")
    tensors = {"x": x}
    acc = accumulator_dtype(dtype)
    if ELEMENTWISE_OPS.get(op) == 2:
        y_shape = tuple(shape) if y_shape is None else tuple(y_shape)
        y = tensors["y"] = placeholder(y_shape, dtype, "y")
        offset = len(shape) - len(y_shape)

        def ry(idx):
            return y[tuple(Const(0) if d == 1 else i for i, d in zip(idx[offset:], y_shape))]
        epi = Epilogue(False, shift, relu)

        def body(*idx):
            a, b = x[idx].astype(acc), ry(idx).astype(acc)
            return epi.apply(_ARITHMETIC[op](a, b), None)
        tensors["out"] = compute(shape, body, name="out", dtype=epi.out_dtype(acc))
    elif op == "relu":
        tensors["out"] = compute(shape, lambda *idx: Max(x[idx], Const(0, dtype)), name="out")
    elif op == "clip":
        tensors["out"] = compute(shape, lambda *idx: clip(x[idx], lo, hi), name="out")
    elif op in FLOAT_ELEMENTWISE_OPS:
        expression = FLOAT_FUNCTIONS[op].expression
        tensors["out"] = compute(shape, lambda *idx: expression(x[idx], alpha), name="out")
    else:
        raise OpError(f"unknown element-wise operator {op!r}; known: {', '.join(ELEMENTWISE_OPS)}")
    return tensors


def scale_shift_te(shape: tuple[int, ...], dtype: str, relu: bool = False) -> dict[str, Tensor]:
    """``out = x · a[c] + b[c]`` (then ReLU) along axis 1 of ``x`` (N, C, …): a batch norm that
    no convolution precedes, in one pass over ``x`` where a multiply and an add take two.
    Tensors ``x``, ``a`` and ``b`` (C,), ``out``."""
    x = placeholder(shape, dtype, "x")
    a = placeholder((shape[1],), dtype, "a")
    b = placeholder((shape[1],), dtype, "b")

    def body(*idx):
        value = x[idx] * a[idx[1]] + b[idx[1]]
        return Max(value, Const(0, dtype)) if relu else value
    return {"x": x, "a": a, "b": b, "out": compute(shape, body, name="out")}


def quantize_te(shape: tuple[int, ...], exponent: int) -> dict[str, Tensor]:
    """float32 ``x`` → int8 at scale 2^−``exponent``: ``x · 2^exponent`` (exact, a power of two)
    rounded half to even and saturated (NaN → 0), as `graph.numeric.quantize_array` defines it."""
    x = placeholder(shape, "float32", "x")

    def body(*idx):
        scaled = Call("roundeven", (x[idx] * Const(2.0 ** exponent, "float32"),))
        return Cast("int8", Min(Max(scaled, Const(-128.0, "float32")), Const(127.0, "float32")))
    return {"x": x, "out": compute(shape, body, name="out")}


def unfold_te(shape: tuple[int, int, int, int], kernel: tuple[int, int], stride: int,
              padding: tuple[int, int, int, int], dtype: str) -> dict[str, Tensor]:
    """A convolution's patches as channels (`graph.operators`' ``unfold``): output channel
    ``c·kh·kw + i·kw + j`` at (y, x) is ``x[c, y·stride + i − top, x·stride + j − left]``, 0
    outside. Tensors ``x`` (N, C, H, W), ``out`` (N, C·KH·KW, OH, OW)."""
    n, c, h, w = shape
    (kh, kw), (top, left, bottom, right) = kernel, padding
    oh, ow = (h + top + bottom - kh) // stride + 1, (w + left + right - kw) // stride + 1
    x = placeholder(shape, dtype, "x")
    taps = kh * kw

    def body(b, ch, y, xx):
        return BufferLoad(x.buffer, (b, ch // taps, y * stride + (ch // kw) % kh - top,
                                     xx * stride + ch % kw - left), zero_outside=True)
    return {"x": x, "out": compute((n, c * taps, oh, ow), body, name="out")}


def transpose_te(shape: tuple[int, ...], perm: tuple[int, ...], dtype: str) -> dict[str, Tensor]:
    """``x`` with its axes reordered (numpy's ``transpose``): output axis ``k`` is input axis
    ``perm[k]``, so ``out[i] = x[j]`` with ``j[perm[k]] = i[k]``."""
    x = placeholder(shape, dtype, "x")
    source = [perm.index(axis) for axis in range(len(shape))]     # the output axis each input axis becomes
    out = compute(tuple(shape[p] for p in perm), lambda *i: x[tuple(i[k] for k in source)], name="out")
    return {"x": x, "out": out}


def slice_te(shape: tuple[int, ...], starts: tuple[int, ...], steps: tuple[int, ...], out_shape: tuple[int, ...],
             dtype: str) -> dict[str, Tensor]:
    """``out[i] = x[starts + i · steps]`` along every axis (numpy's ``x[start::step]`` cut to
    ``out_shape``; a negative step reads backwards)."""
    x = placeholder(shape, dtype, "x")
    out = compute(tuple(out_shape), lambda *i: x[tuple(Const(s) + j * Const(t) if (s, t) != (0, 1) else j
                                                       for j, s, t in zip(i, starts, steps))], name="out")
    return {"x": x, "out": out}


def pad_te(shape: tuple[int, ...], before: tuple[int, ...], after: tuple[int, ...], dtype: str,
           value) -> dict[str, Tensor]:
    """``x`` framed by ``value``: ``before[d]`` and ``after[d]`` elements on each side of axis d."""
    x = placeholder(shape, dtype, "x")

    def body(*i):
        inner = BufferLoad(x.buffer, tuple(j - b for j, b in zip(i, before)), zero_outside=True)   # zero outside x
        if not value:
            return inner
        inside = None
        for j, b, a, n in zip(i, before, after, shape):
            if b or a:
                axis = And(Cmp("<=", Const(b), j), Cmp("<", j, Const(b + n)))
                inside = axis if inside is None else And(inside, axis)
        return inner if inside is None else Select(inside, inner, Const(value, dtype))
    out = compute(tuple(n + b + a for n, b, a in zip(shape, before, after)), body, name="out")
    return {"x": x, "out": out}


def pool2d_te(kind: str, shape: tuple[int, int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
              padding: tuple[int, ...], dtype: str, *, dilation: tuple[int, int] = (1, 1), ceil_mode: bool = False,
              count_include_pad: bool = False, lshift: int = 0, blocked: bool = False) -> dict[str, Tensor]:
    """Max or average pooling of NCHW ``x`` over ``kernel`` windows whose taps lie
    ``dilation`` apart, ``padding`` a (height, width) pair or (top, left, bottom, right),
    ``ceil_mode`` as ONNX Runtime's (`window_count`). ``blocked``: ``x`` and ``out`` in the
    blocked layout (N, C/16, H, W, 16) (`CHANNEL_BLOCK`, float32), a pixel's channels one vector.

    Max: padding never wins (it reads the type's lowest value; for floats NaN, which the
    maximum ignores, as it ignores NaN inputs: a window is NaN only when all of it is, as
    far as ONNX Runtime's MaxPool has a rule). Average: the mean over the window's taps
    inside the input (with ``count_include_pad``, inside the input and its padding, never
    a partial window's taps past it); integers sum exactly (int32 inputs in 64 bits) and
    round to nearest, halves up. An int8 average with ``lshift`` averages ``x << lshift`` (its
    output at a scale that much finer than its input's) and saturates to int8."""
    if lshift and (kind != "avg" or dtype != "int8"):
        raise OpError(f"a left shift applies to an int8 average, not a {dtype} {kind} pool")
    n, c, h, w = shape
    if blocked and dtype != "float32":
        raise OpError(f"blocked pooling takes float32 images, not {dtype}")
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    top, left, bottom, right = four_pads(padding)
    oh = window_count(h, kh, sh, top, bottom, dh, ceil_mode)
    ow = window_count(w, kw, sw, left, right, dw, ceil_mode)
    # The frame every window reads: the padding, and past it a partial window's taps.
    below = max((oh - 1) * sh + (kh - 1) * dh + 1 - top - h, 0)
    beside = max((ow - 1) * sw + (kw - 1) * dw + 1 - left - w, 0)
    framed = top or left or below or beside

    # An image's element (b, channel, y, x): ``channel`` is one index, or (block, lane) when blocked.
    def image(hh: int, ww: int) -> tuple[int, ...]:
        return (n, channel_blocks(c), hh, ww, CHANNEL_BLOCK) if blocked else (n, c, hh, ww)

    def at(b, ch, y, xx) -> tuple:
        return (b, ch[0], y, xx, ch[1]) if blocked else (b, ch, y, xx)

    def per_pixel(f):
        """``f(b, channel, y, x)`` as a compute body over `image`'s axes."""
        if blocked:
            return lambda b, k, y, xx, i: f(b, (k, i), y, xx)
        return f
    x = placeholder(image(h, w), dtype, "x")
    rh, rw = reduce_axis(kh, "kh"), reduce_axis(kw, "kw")
    tensors = {"x": x}
    if kind == "max":
        combiner = "fmax" if is_float(dtype) else "max"
        lowest = reduction_identity(combiner, dtype)
        reduce = reduce_fmax if is_float(dtype) else reduce_max

        def padded(b, ch, y, xx):
            inside = And(And(Cmp("<=", Const(top), y), Cmp("<", y, Const(h + top))),
                         And(Cmp("<=", Const(left), xx), Cmp("<", xx, Const(w + left))))
            return Select(inside, BufferLoad(x.buffer, at(b, ch, y - top, xx - left), zero_outside=True), lowest)
        if sw > 1 and not blocked:
            # The framed input with each row's columns split by phase (`depthwise_conv2d_te`'s
            # reason): ``xs[.., y, p, j]`` is column ``j·sw + p``, so a tap reads consecutive ones.
            columns = ow + ((kw - 1) * dw) // sw
            xs = tensors["xs"] = compute((n, c, top + h + below, sw, columns), lambda b, ch, y, phase, j: padded(
                b, ch, y, j * sw + phase), name="xs")
            tensors["out"] = compute((n, c, oh, ow), lambda b, ch, y, xx: reduce(
                xs[b, ch, y * sh + rh * dh, (rw * dw) % sw, xx + (rw * dw) // sw], [rh, rw]), name="out")
            return tensors
        xp = tensors["xp"] = compute(image(top + h + below, left + w + beside), per_pixel(padded), name="xp") \
            if framed else x
        tensors["out"] = compute(image(oh, ow), per_pixel(lambda b, ch, y, xx: reduce(
            xp[at(b, ch, y * sh + rh * dh, xx * sw + rw * dw)], [rh, rw])), name="out")
        return tensors
    if kind != "avg":
        raise OpError(f"pooling is max or avg, not {kind!r}")
    # Sums of int32 values need 64 bits; int8 sums fit int32 for any window.
    acc = "int64" if dtype == "int32" else accumulator_dtype(dtype)
    frame = (0, 0, top, left, 0) if blocked else (0, 0, top, left)
    beyond = (0, 0, below, beside, 0) if blocked else (0, 0, below, beside)
    xp = tensors["xp"] = pad(x, frame, beyond, "xp") if framed else x
    total = tensors["sum"] = compute(image(oh, ow), per_pixel(lambda b, ch, y, xx: sum_(
        xp[at(b, ch, y * sh + rh * dh, xx * sw + rw * dw)].astype(acc), [rh, rw])), name="sum")
    gain = Const(1 << lshift, acc)

    def taps(start: Expr, k: int, d: int, lo: int, hi: int) -> Expr:
        """How many of the taps ``start + i·d`` (0 ≤ i < k) lie in [lo, hi): from the first
        i ≥ ⌈(lo − start)/d⌉ to the last below ⌈(hi − start)/d⌉, floor division's rounding
        toward −∞ making both ceilings exact for negative numerators."""
        first = Max(FloorDiv(Const(lo + d - 1) - start, Const(d)), Const(0))
        end = Min(FloorDiv(Const(hi + d - 1) - start, Const(d)), Const(k))
        return Max(end - first, Const(0))

    def count(y, xx) -> Expr:
        if not framed or (count_include_pad and below <= bottom and beside <= right):
            return Const(kh * kw)      # every tap of every window counts
        lo_h, hi_h, lo_w, hi_w = (-top, h + bottom, -left, w + right) if count_include_pad else (0, h, 0, w)
        return taps(y * sh - top, kh, dh, lo_h, hi_h) * taps(xx * sw - left, kw, dw, lo_w, hi_w)

    def mean(b, ch, y, xx):
        s, k = total[at(b, ch, y, xx)], count(y, xx).astype(acc)
        if is_float(dtype):
            return Div(s, k)
        if lshift:
            return Cast(dtype, clip(FloorDiv(s * gain + FloorDiv(k, Const(2, acc)), k), -128, 127))
        return Cast(dtype, FloorDiv(s + FloorDiv(k, Const(2, acc)), k))
    tensors["out"] = compute(image(oh, ow), per_pixel(mean), name="out", dtype=dtype)
    return tensors


def mean_te(rows: int, length: int, dtype: str) -> dict[str, Tensor]:
    """The mean of each row of ``x`` (rows, length), summed in float64: a float32 sum of many
    values, each rounded, drifts from the mean numpy and ONNX Runtime compute."""
    if not is_float(dtype):
        raise OpError(f"mean takes float32 data, not {dtype}")
    x = placeholder((rows, length), dtype, "x")
    k = reduce_axis(length, "k")
    total = compute((rows,), lambda i: sum_(x[i, k].astype("float64"), [k]), name="sum")
    out = compute((rows,), lambda i: Cast(dtype, total[i] / Const(float(length), "float64")), name="out")
    return {"x": x, "sum": total, "out": out}


def softmax_te(shape: tuple[int, ...], dtype: str) -> dict[str, Tensor]:
    """``exp(x − max) / Σ exp(x − max)`` along the last axis of ``x`` viewed as (rows, length)."""
    if not is_float(dtype):
        raise OpError(f"softmax takes float32 data, not {dtype}")
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    length = shape[-1]
    x = placeholder((rows, length), dtype, "x")
    k1, k2 = reduce_axis(length, "k"), reduce_axis(length, "k2")
    mx = compute((rows,), lambda i: reduce_max(x[i, k1], [k1]), name="max")
    e = compute((rows, length), lambda i, j: Call("exp", (x[i, j] - mx[i],)), name="exp")
    total = compute((rows,), lambda i: sum_(e[i, k2], [k2]), name="sum")
    out = compute((rows, length), lambda i, j: e[i, j] / total[i], name="out")
    return {"x": x, "max": mx, "exp": e, "sum": total, "out": out}
