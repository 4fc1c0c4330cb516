"""Element-wise operators and max pooling on the tensor ALU.

Their operands live in the accumulator (the only buffer the ALU reads), so
inputs are accumulator-width (int32) NCHW tensors, packed as accumulator
entries ``(N/B, C/BO, H, W, B, BO)`` (`layout.pack_nchw_acc`):

- `compile_add`: ``out = epilogue(x + y)`` — the residual add, with the
  shift/clip/ReLU epilogue of `Epilogue` (int8 with ``shift``, else int32);
- `compile_relu`: ``max(x, 0)``; `compile_clip`: ``min(max(x, lo), hi)``;
- `compile_max_pool2d`: ``max`` over each window, as one ALU MAX with a
  register operand per window element. Borders are padded with zeros (the
  DMA's padding), which is exact for non-negative inputs (after ReLU, where
  pooling sits in ResNet); with negative inputs use ``padding=0``.

Element-wise schedules view the tensor as a flat run of entries, cut into
tiles that fit the accumulator (double-buffered with latency hiding); the
host pads the run to a whole number of tiles.
"""

from __future__ import annotations

import numpy as np

from gemforge.hw.config import AccelConfig

from ...ir import Const, Max, Min
from ...backends.accel.layout import ceil_div, pack_nchw_acc, unpack_nchw
from ...pipeline import build
from ...schedule import create_schedule
from ...te import compute, pad, placeholder
from ..common import CompiledOp, OpError, out_size
from .common import accel_epilogue, divisors, plan_with_fallback

__all__ = ["compile_add", "compile_relu", "compile_clip", "compile_max_pool2d"]



def _check_shape(shape) -> tuple[int, int, int, int]:
    if len(shape) != 4 or any(isinstance(v, bool) or int(v) < 1 for v in shape):
        raise OpError(f"element-wise operators take a positive NCHW shape, not {shape!r}")
    return tuple(int(v) for v in shape)


def _elementwise(config: AccelConfig, shape, n_inputs: int, body, out_dtype: str, name: str,
                 latency_hiding: bool) -> CompiledOp:
    c = config
    n, ch, h, w = _check_shape(shape)
    entries = ceil_div(n, c.batch) * ceil_div(ch, c.block_out) * h * w

    def plan(threads: int) -> tuple[int, int]:
        tile = min(entries, c.max_loop_iterations, c.acc_depth // (threads * n_inputs))
        if tile < 1:
            raise OpError(f"{name} needs {threads * n_inputs} accumulator entries per tile; "
                          f"config {c.name!r} has {c.acc_depth}")
        return threads, tile
    threads, tile = plan_with_fallback(plan, latency_hiding)
    total = ceil_div(entries, tile) * tile
    acc = f"int{c.acc_width}"
    names = ["x", "y"][:n_inputs]
    inputs = [placeholder((total, c.batch, c.block_out), acc, nm, tile_dims=2) for nm in names]
    out = compute((total, c.batch, c.block_out), lambda e, b, o: body(*(t[e, b, o] for t in inputs)),
                  name="out", dtype=out_dtype, tile_dims=2)
    s = create_schedule(out)
    out_acc = s.cache_write(out, "acc")
    cached = [s.cache_read(t, "acc", [out_acc]) for t in inputs]
    so = s[out]
    e, _, _ = so.leaf
    eo, ei = so.split(e, tile)
    if threads > 1:
        _, eo = so.split(eo, factor=threads)
        so.vthread(eo)
    so.pragma(ei, "dma_copy")
    for t in [*cached, out_acc]:
        s[t].compute_at(so, eo)
    for t in cached:
        s[t].pragma(s[t].leaf[0], "dma_copy")
    s[out_acc].pragma(s[out_acc].leaf[0], "alu")
    program = build(s, c, inputs + [out])

    def flat(x: np.ndarray) -> np.ndarray:
        if tuple(x.shape) != (n, ch, h, w):
            raise OpError(f"{name} was compiled for shape {[n, ch, h, w]}, not {list(x.shape)}")
        packed = pack_nchw_acc(c, x).reshape(entries, c.batch, c.block_out)
        full = np.zeros((total, c.batch, c.block_out), packed.dtype)
        full[:entries] = packed
        return full

    def pack(**arrays):
        return {nm: flat(arrays[nm]) for nm in names}

    def unpack(tiles: np.ndarray) -> np.ndarray:
        packed = tiles[:entries].reshape(ceil_div(n, c.batch), ceil_div(ch, c.block_out), h, w,
                                         c.batch, c.block_out)
        return unpack_nchw(packed, n, ch)

    return CompiledOp(name, program, names, "out", pack, unpack, plan={"tile": tile, "threads": threads})


def compile_add(config: AccelConfig, shape, *, shift: int | None = None, relu: bool = False,
                latency_hiding: bool = True) -> CompiledOp:
    """``out = x + y`` (int32 NCHW inputs ``x``, ``y``) with the fused epilogue."""
    epi = accel_epilogue(config, "add", False, shift, relu)
    return _elementwise(config, shape, 2, lambda x, y: epi.apply(x + y, None),
                        epi.out_dtype(f"int{config.acc_width}"), "add",
                        latency_hiding)


def compile_relu(config: AccelConfig, shape, *, latency_hiding: bool = True) -> CompiledOp:
    """``out = max(x, 0)`` on an int32 NCHW tensor ``x``."""
    return _elementwise(config, shape, 1, lambda x: Max(x, Const(0)), f"int{config.acc_width}", "relu",
                        latency_hiding)


def compile_clip(config: AccelConfig, shape, lo: int, hi: int, *, latency_hiding: bool = True) -> CompiledOp:
    """``out = min(max(x, lo), hi)`` on an int32 NCHW tensor ``x`` (bounds are 16-bit immediates)."""
    imm_lo, imm_hi = config.alu_imm_range
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, int) or not imm_lo <= v <= imm_hi:
            raise OpError(f"clip bounds must be integers in the ALU immediate's range {imm_lo}..{imm_hi}, "
                          f"not {v!r}")
    if lo > hi:
        raise OpError(f"clip lower bound {lo} exceeds the upper bound {hi}")
    return _elementwise(config, shape, 1, lambda x: Min(Max(x, Const(lo)), Const(hi)),
                        f"int{config.acc_width}", "clip", latency_hiding)


def compile_max_pool2d(config: AccelConfig, shape, kernel: int, *, stride: int | None = None,
                       padding: int = 0, latency_hiding: bool = True) -> CompiledOp:
    """Max pooling of an int32 NCHW tensor ``x`` over ``kernel × kernel`` windows."""
    c = config
    n, ch, h, w = _check_shape(shape)
    stride = kernel if stride is None else stride
    for label, v, lo in (("kernel", kernel, 1), ("stride", stride, 1), ("padding", padding, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise OpError(f"max_pool2d {label} must be an integer ≥ {lo}, not {v!r}")
    if padding >= kernel or padding > c.max_dma_pad:
        raise OpError(f"max_pool2d padding must be below the kernel size and at most {c.max_dma_pad}, "
                      f"not {padding}")
    oh, ow = out_size(h, kernel, stride, padding), out_size(w, kernel, stride, padding)
    if oh < 1 or ow < 1:
        raise OpError(f"a {kernel}x{kernel} window does not fit a {h}x{w} input with padding {padding}")
    nb, cb = ceil_div(n, c.batch), ceil_div(ch, c.block_out)

    def plan(threads: int) -> tuple[int, int, int, int]:
        best = None
        for tw in divisors(ow):
            win_w = (tw - 1) * stride + kernel
            for th in divisors(oh):
                win_h = (th - 1) * stride + kernel
                for tc in divisors(cb):
                    need = threads * (tc * win_h * win_w + tc * th * tw)
                    if need > c.acc_depth or max(th, tw, tc) > c.max_loop_iterations:
                        break
                    if best is None or tc * th * tw > best[1] * best[2] * best[3]:
                        best = (threads, tc, th, tw)
        if best is None:
            raise OpError(f"max_pool2d with a {kernel}x{kernel} window does not fit the {c.acc_depth}-entry "
                          f"accumulator of config {c.name!r}")
        return best
    threads, tc, th, tw = plan_with_fallback(plan, latency_hiding)
    acc = f"int{c.acc_width}"
    x = placeholder((nb, cb, h, w, c.batch, c.block_out), acc, "x", tile_dims=2)
    xp = pad(x, (0, 0, padding, padding, 0, 0), (0, 0, padding, padding, 0, 0), "xp") if padding else x

    def window_max(n_, c_, y, xx, b, o):
        value = xp[n_, c_, y * stride, xx * stride, b, o]
        for i in range(kernel):
            for j in range(kernel):
                if i or j:
                    value = Max(value, xp[n_, c_, y * stride + i, xx * stride + j, b, o])
        return value
    out = compute((nb, cb, oh, ow, c.batch, c.block_out), window_max, name="out", dtype=acc, tile_dims=2)
    s = create_schedule(out)
    out_acc = s.cache_write(out, "acc")
    x_acc = s.cache_read(xp, "acc", [out_acc])
    if xp is not x:
        s[xp].compute_inline()
    so = s[out]
    sn, sc, sy, sx, _, _ = so.leaf
    co, ci = so.split(sc, tc)
    yo, yi = so.split(sy, th)
    xo, xi = so.split(sx, tw)
    so.reorder(sn, co, yo, xo, ci, yi, xi)
    tile = so.fuse(so.fuse(so.fuse(sn, co), yo), xo)
    if threads > 1:
        _, tile = so.split(tile, factor=threads)
        so.vthread(tile)
    so.pragma(ci, "dma_copy")
    for t in (x_acc, out_acc):
        s[t].compute_at(so, tile)
    s[x_acc].pragma(s[x_acc].leaf[0], "dma_copy")
    s[out_acc].pragma(s[out_acc].leaf[0], "alu")
    program = build(s, c, [x, out])

    def pack(x: np.ndarray) -> dict[str, np.ndarray]:
        if tuple(x.shape) != (n, ch, h, w):
            raise OpError(f"max_pool2d was compiled for shape {[n, ch, h, w]}, not {list(x.shape)}")
        return {"x": pack_nchw_acc(c, x)}

    return CompiledOp("max_pool2d", program, ["x"], "out", pack, lambda t: unpack_nchw(t, n, ch),
                      plan={"tc": tc, "th": th, "tw": tw, "threads": threads})
