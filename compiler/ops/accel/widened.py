"""int8 operators on the GEMM core beyond one-group convolutions: an int8 network's residual adds
(and subtractions), max and average pools, and depthwise convolutions.

The tensor ALU works on accumulator (int32) entries, and an int8 tensor in DRAM has no way
into the accumulator but through the GEMM core. So the add widens its operands there: with
the weight tile ``2^l · I`` (a scaled identity, ``l`` ≤ 6 so that it is an int8), one
micro-op ``acc[e] += inp[e] · (2^l · I)ᵀ`` adds an entry of int8 values, shifted left by
``l``, to the accumulator exactly. Two such steps per output entry (one per operand) give
``(x << lx) + (y << ly)`` (a subtraction weighs ``y`` by ``−2^ly · I``), and the requantizing
STORE's bias, shift and clamp finish the add bit for bit as the int8 graph defines it
(`graph.operators.elementwise`)::

    c[n, cb, y, x, b, o] = Σ_{r, k} xy[r, n, cb, y, x, b, k] · w[r, o, k]      (w[r] = 2^l_r · I)
    out                  = clip((c + 2^(s−1)) >> s, 0 if relu else −128, 127)   (no bias when s = 0)

Why not a new instruction (a LOAD that widens int8 entries into the accumulator): the data
comes over the DMA either way, at half an input entry a cycle on `default`'s 8-byte bus,
and the GEMM core widens an entry a cycle, so the layer runs at its DMA's rate; the weight
tile costs one entry of the weight buffer, and the gateware, its timing and its resources
stay as they are. The price is that the add occupies the GEMM core (two micro-ops an output
entry) where a widening LOAD would leave it to the next layer.

Pools widen their windows the same way with ``I`` (``2^lshift · I`` for an average whose
output is finer than its input):

- **average pool**: the window sum is a reduction over the taps on the GEMM core (as a
  convolution's, with the identity for weights); the division by the window's ``d`` taps,
  rounded as the graph defines it (``floor((sum + d // 2) / d)``), is one ALU multiply by
  ``M = ceil(2^t / d)`` and the STORE's ``(· + bias) >> t``, where ``t`` is the smallest
  for which that equals the division for every sum ``d`` int8 values can have (checked
  exhaustively when the operator compiles: `division_by_multiply`). Windows that hold
  padding or reach past it count other divisors: only pools whose every window counts ``d``
  (no padding, or ``count_include_pad``) compile.
- **max pool**: each window element is widened into its own accumulator entry, and one ALU
  MAX a tap keeps the largest; the STORE writes it back as an int8. The DMA frames the
  input with zeros, which is exact for non-negative inputs (a ReLU's output, where pools sit)
  and wrong for others: a padded max pool compiles only when told its input is non-negative.

A **depthwise convolution** multiplies each channel block by the diagonal matrix of its
weights, a micro-op per tap (`compile_int8_depthwise_conv2d`): ``block_out`` useful products
a micro-op, not ``block_in · block_out`` — a dense core has no more to give a layer that
reduces over no channels; a depthwise mode of the core (each lane its own weight, the taps
as the reduction) would need new gateware.

The add's operands are one stacked placeholder ``xy`` (the reduction runs over its first
axis, one operand per reduction chunk, so no transfer spans both); the built program then
names its two halves ``x`` and ``y``, which a network binds to wherever their producers wrote
them.
"""

from __future__ import annotations

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.hw.program import TensorRegion

from ...backends.accel.intrin import gemm_intrin
from ...backends.accel.layout import ceil_div, int_dtype, pack_bias, pack_nchw, unpack_nchw
from ...pipeline import build
from ...schedule import create_schedule
from ...ir import Cast, Const, Max, Shr
from ...te import clip, compute, pad, placeholder, reduce_axis, sum_
from ..common import CompiledOp, Epilogue, OpError
from .common import (
    TilingCost, check_footprint, divisors, epilogue_alu_ops, plan_with_fallback, schedule_image_tiles,
)

__all__ = ["compile_scaled_add", "compile_int8_pool2d", "compile_int8_depthwise_conv2d", "pack_depthwise",
           "division_by_multiply", "MAX_OPERAND_SHIFT",
           "scaled_add_weights", "scaled_add_bias", "pool_weights", "pool_bias"]

#: The largest left shift of an operand: its weight 2^l must be an int8.
MAX_OPERAND_SHIFT = 6
#: The most taps, other than a power of two (a shift alone), whose divisor
#: `division_by_multiply` searches for: its exhaustive check grows with the count (and every
#: count up to 92 divides exactly; above, only some do within the ALU's 16-bit immediate).
MAX_DIVISOR = 1024


def scaled_add_weights(config: AccelConfig, lshift: tuple[int, int], negate_y: bool = False) -> np.ndarray:
    """The weight tiles ``(2, BO, BI)``: each operand's identity scaled by ``2^l`` (``y``'s
    negated for a subtraction)."""
    eye = np.eye(config.block_out, config.block_in, dtype=np.int64)
    signs = (1, -1 if negate_y else 1)
    return np.stack([sign * (eye << shift) for sign, shift in zip(signs, lshift)]).astype(int_dtype(config.wgt_width))


def scaled_add_bias(config: AccelConfig, channels: int, shift: int) -> np.ndarray:
    """The packed bias that rounds the requantizing shift half up: ``2^(s−1)`` in every channel."""
    return pack_bias(config, np.full(channels, 1 << (shift - 1), np.int32))


def _check(config: AccelConfig, shape, lshift, shift: int, relu: bool) -> tuple[int, int, int, int]:
    if len(shape) != 4 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in shape):
        raise OpError(f"the int8 add takes a positive NCHW shape, not {shape!r}")
    if config.block_in != config.block_out:
        raise OpError(f"the int8 add widens its operands through the GEMM core, which needs block_in = block_out; "
                      f"config {config.name!r} has {config.block_in} and {config.block_out}")
    if (config.inp_width, config.wgt_width, config.out_width) != (8, 8, 8):
        raise OpError(f"the int8 add needs int8 inputs, weights and outputs; config {config.name!r} has "
                      f"int{config.inp_width}, int{config.wgt_width} and int{config.out_width}")
    if len(lshift) != 2 or not all(isinstance(v, int) and 0 <= v <= MAX_OPERAND_SHIFT for v in lshift):
        raise OpError(f"the int8 add shifts its operands left by 0 to {MAX_OPERAND_SHIFT} bits (a weight 2^l that "
                      f"is an int8), not {tuple(lshift)!r}")
    Epilogue(shift > 0, shift, relu)      # checks the shift
    return tuple(int(v) for v in shape)


def _plan(config: AccelConfig, data: tuple[int, int, int, int], threads: int, bias: bool) -> dict:
    """Output tiles of ``toc`` channel blocks × ``toh`` rows × ``tow`` columns, ranked by the
    pipeline cost model (`TilingCost`): each tile loads one operand per reduction chunk."""
    c = config
    nb, cb, h, w = data
    ranked = []
    for tow in reversed(divisors(w)):
        for toh in divisors(h):
            for toc in divisors(cb):
                pixels = toc * toh * tow
                if threads * pixels > c.inp_depth or threads * (pixels + (toc if bias else 0)) > c.acc_depth \
                        or threads > c.wgt_depth:
                    break
                if max(toc, toh, tow) > c.max_loop_iterations:
                    continue
                work = TilingCost(
                    tiles=nb * (cb // toc) * (h // toh) * (w // tow), chunks=2,
                    chunk_read_bytes=pixels * c.inp_entry_bytes + c.wgt_entry_bytes,
                    chunk_loads=toc * (1 if tow == w else toh) + 1,
                    chunk_uops=pixels, tile_uops=0,
                    tile_read_bytes=toc * c.acc_entry_bytes if bias else 0,
                    tile_store_bytes=pixels * c.out_entry_bytes, tile_stores=1 if tow == w else toc * toh)
                cost, order = work.best_order(c, threads)
                ranked.append((cost, -pixels, toc, toh, tow, order))
    if not ranked:
        raise OpError(f"the int8 add needs {threads} input and accumulator entries per tile and {threads} weight "
                      f"entries; config {c.name!r} has {c.inp_depth}, {c.acc_depth} and {c.wgt_depth}")
    _, _, toc, toh, tow, order = min(ranked)
    return {"toc": toc, "toh": toh, "tow": tow, "threads": threads, "order": order}


def _gemm_stages(out, reduction, data, weights):
    """The schedule of ``out`` whose accumulator stage ``reduction`` runs on the GEMM core:
    ``(schedule, out's accumulator stage, data's input-buffer copy, weights' weight-buffer
    copy)``; a padded ``data`` (`te.pad`) is inlined, its padding the DMA's zero frame."""
    s = create_schedule(out)
    s[reduction].set_scope("acc")
    out_acc = s.cache_write(out, "acc")
    data_inp = s.cache_read(data, "inp", [reduction])
    if getattr(data.op, "tag", "") == "pad":
        s[data].compute_inline()
    return s, out_acc, data_inp, s.cache_read(weights, "wgt", [reduction])


def compile_scaled_add(config: AccelConfig, shape, *, lshift: tuple[int, int] = (0, 0), shift: int = 0,
                       relu: bool = False, negate_y: bool = False, latency_hiding: bool = True) -> CompiledOp:
    """int8 ``clip(((x << lx) ± (y << ly) + round) >> shift, 0 if relu else −128, 127)`` of two
    NCHW int8 tensors of ``shape`` on the GEMM core (``−`` with ``negate_y``). Inputs ``x`` and
    ``y``; output NCHW int8.
    Packed, the operands are the convolutions' input layout and the result their output
    layout, so a network hands them over in DRAM."""
    c = config
    n, ch, h, w = _check(c, shape, tuple(lshift), shift, relu)
    lshift = tuple(int(v) for v in lshift)
    data = (ceil_div(n, c.batch), ceil_div(ch, c.block_in), h, w)
    nb, cb = data[:2]
    bias = shift > 0
    epi = Epilogue(bias, shift, relu)
    entries = nb * cb * h * w
    check_footprint(c, "add", {"inp": 2 * entries, "wgt": 2, "out": entries}, epi)
    acc = f"int{c.acc_width}"
    xy = placeholder((2, nb, cb, h, w, c.batch, c.block_in), f"int{c.inp_width}", "xy", tile_dims=2)
    wt = placeholder((2, c.block_out, c.block_in), f"int{c.wgt_width}", "w", tile_dims=2)
    r, k = reduce_axis(2, "r"), reduce_axis(c.block_in, "k")
    total = compute((nb, cb, h, w, c.batch, c.block_out),
                    lambda n_, oc, y, x, b, o: sum_(xy[r, n_, oc, y, x, b, k].astype(acc) * wt[r, o, k].astype(acc),
                                                    [r, k]),
                    name="c", dtype=acc, tile_dims=2)
    params = [xy, wt]
    b_t = None
    if bias:
        b_t = placeholder((cb, c.batch, c.block_out), acc, "bias", tile_dims=2)
        params.append(b_t)
    out = compute((nb, cb, h, w, c.batch, c.block_out),
                  lambda n_, oc, y, x, b, o: epi.apply(total[n_, oc, y, x, b, o], b_t[oc, b, o] if bias else None),
                  name="out", dtype="int8", tile_dims=2)
    plan = plan_with_fallback(lambda threads: _plan(c, data, threads, bias), latency_hiding)

    s, out_acc, xy_inp, w_wgt = _gemm_stages(out, total, xy, wt)
    readers = [s.cache_read(b_t, "acc", [out_acc])] if bias else []
    schedule_image_tiles(s, out, plan, [total, out_acc], readers)
    st = s[total]
    tn, toc_, ty, tx, tb, to, tr, tk = st.leaf
    ro, ri = st.split(tr, 1)          # one operand per chunk: no transfer spans both
    st.reorder(ro, tn, toc_, ty, tx, ri, tb, to, tk)
    st.tensorize(tb, gemm_intrin(c))
    s[xy_inp].compute_at(st, ro)
    for t in (xy_inp, w_wgt):       # the two weight entries loaded once, before the first tile
        s[t].pragma(s[t].leaf[0], "dma_copy")
    program = build(s, c, params + [out])

    # The stacked operands become two regions, each bound where its producer wrote it.
    stacked = program.tensors.pop("xy")
    half = stacked.nbytes // 2
    program.tensors = {"x": TensorRegion("x", stacked.offset, stacked.shape[1:], stacked.dtype),
                       "y": TensorRegion("y", stacked.offset + half, stacked.shape[1:], stacked.dtype),
                       **program.tensors}
    program.check()
    weights = scaled_add_weights(c, lshift, negate_y)
    bias_packed = scaled_add_bias(c, ch, shift) if bias else None

    def pack(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        for name, v in (("x", x), ("y", y)):
            if tuple(v.shape) != (n, ch, h, w):
                raise OpError(f"the int8 add was compiled for {[n, ch, h, w]}, not {name} of {list(v.shape)}")
        packed = {"x": pack_nchw(c, x), "y": pack_nchw(c, y), "w": weights}
        if bias:
            packed["bias"] = bias_packed
        return packed

    return CompiledOp("sub" if negate_y else "add", program, ["x", "y"], "out", pack, lambda t: unpack_nchw(t, n, ch),
                      plan=dict(plan, lshift=list(lshift)))


# ---------------------------------------------------------------------------- pools

def division_by_multiply(count: int, imm_max: int, lshift: int = 0) -> tuple[int, int] | None:
    """``(M, t)`` such that ``floor(n · M / 2^t) = floor(n / count)`` for every ``n`` in
    ``[0, 256 · count]``, with ``M`` an ALU immediate (≤ ``imm_max``) and ``n · M ± 128 · 2^t``
    inside int32 for every ``n`` a window sum gives; None when no ``t`` gives one.

    ``n = (sum << lshift) + count // 2 + 128 · count``: the rounded quotient plus 128, so ``n``
    in that range gives every int8 result exactly (checked exhaustively here), and ``n``
    outside it, since ``n · M >> t`` grows with ``n``, a result beyond the int8 range that the
    STORE saturates as the graph does."""
    if count & (count - 1) == 0:        # a power of two: a shift alone, exact for every n
        t = count.bit_length() - 1
        offset = count // 2 + 128 * count
        top = max(abs(offset - (128 * count << lshift)), offset + (127 * count << lshift))
        return (1, t) if top + (128 << t) < 1 << 31 else None
    if count > MAX_DIVISOR:
        return None
    n = np.arange(0, 256 * count + 1, dtype=np.int64)
    want = n // count
    offset = count // 2 + 128 * count
    extremes = (offset - (128 * count << lshift), offset + (127 * count << lshift))
    for t in range(0, 31):
        m = -(-(1 << t) // count)
        if m > imm_max or max(abs(v) * m for v in extremes) + (128 << t) >= 1 << 31:
            return None
        if np.array_equal((n * m) >> t, want):
            return m, t
    return None


def pool_weights(config: AccelConfig, lshift: int = 0) -> np.ndarray:
    """The weight tile ``(1, BO, BI)`` that widens a window's entries: the identity, scaled by
    ``2^lshift`` for an average at a finer scale than its input."""
    eye = np.eye(config.block_out, config.block_in, dtype=np.int64) << lshift
    return eye.astype(int_dtype(config.wgt_width))[None]


def pool_bias(config: AccelConfig, channels: int, count: int, multiplier: int, shift: int) -> np.ndarray:
    """The packed bias of an average pool over ``count`` taps: the rounding ``count // 2``,
    and the ``128 · count`` that makes the sum non-negative for the multiply, both scaled by
    the multiplier, less the ``128 · 2^shift`` that takes the offset back out after the shift."""
    value = (count // 2 + 128 * count) * multiplier - (128 << shift)
    return pack_bias(config, np.full(channels, value, np.int32))


def _window(config: AccelConfig, what: str, size: tuple[int, int], kernel, stride, dilation, padding) -> tuple:
    """A window operator's kernel, stride and dilation (pairs of integers ≥ 1) and padding (four
    integers ≥ 0 within the DMA's pad field, top, left, bottom, right), checked, and its output
    size (every window inside the padded input)."""
    pairs = {"kernel": kernel, "stride": stride, "dilation": dilation}
    for label, v in pairs.items():
        if len(tuple(v)) != 2 or any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 1 for i in v):
            raise OpError(f"the {what}'s {label} must be a pair of integers ≥ 1, not {v!r}")
    (kh, kw), (sh, sw), (dh, dw) = (tuple(int(i) for i in pairs[k]) for k in ("kernel", "stride", "dilation"))
    if len(tuple(padding)) != 4 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0
                                       for v in padding):
        raise OpError(f"the {what}'s padding must be four integers ≥ 0 (top, left, bottom, right), not {padding!r}")
    top, left, bottom, right = (int(v) for v in padding)
    if max(padding) > config.max_dma_pad:
        raise OpError(f"the {what}'s padding {list(padding)} exceeds the DMA's pad field ({config.max_dma_pad})")
    (h, w), span_h, span_w = size, (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if h + top + bottom < span_h or w + left + right < span_w:
        raise OpError(f"a {kh}x{kw} window does not fit the {h}x{w} input with padding {list(padding)}")
    out = ((h + top + bottom - span_h) // sh + 1, (w + left + right - span_w) // sw + 1)
    return (kh, kw), (sh, sw), (dh, dw), (top, left, bottom, right), out


def _windows_reach_input(out: int, size: int, kernel: int, stride: int, dilation: int, before: int) -> bool:
    """Whether every window along an axis holds at least one input element (not only padding)."""
    taps = np.arange(out)[:, None] * stride + np.arange(kernel)[None, :] * dilation - before
    return bool(((taps >= 0) & (taps < size)).any(axis=1).all())


def _pool_plan(config: AccelConfig, kind: str, data, out_hw, kernel, stride, dilation, threads: int,
               alu_ops: int) -> dict:
    """Output tiles of ``toc`` channel blocks × ``toh`` rows × ``tow`` columns, their input
    windows loaded once, ranked by the pipeline cost model. ``kind`` is ``max``, ``avg`` or
    ``depthwise`` (a weight entry per channel block and tap, and a bias); ``alu_ops`` the ALU
    micro-ops per output entry."""
    c = config
    nb, cb = data[:2]
    oh, ow = out_hw
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    taps = kh * kw
    bias_once = cb <= c.acc_depth // 4
    ranked = []
    for tow in reversed(divisors(ow)):
        win_w = (tow - 1) * sw + (kw - 1) * dw + 1
        for toh in divisors(oh):
            win_h = (toh - 1) * sh + (kh - 1) * dh + 1
            for toc in divisors(cb):
                window, pixels = toc * win_h * win_w, toc * toh * tow
                acc = threads * (pixels + (window if kind == "max" else toc if kind == "avg" else 0))
                if kind == "depthwise":
                    # Every block's bias loaded once, where the accumulator has room for it.
                    acc += cb if bias_once else threads * toc
                weights = toc * taps if kind == "depthwise" else 1
                if threads * window > c.inp_depth or acc > c.acc_depth or threads * weights > c.wgt_depth:
                    break
                if max(toc, toh, tow) > c.max_loop_iterations:
                    continue
                work = TilingCost(
                    tiles=nb * (cb // toc) * (oh // toh) * (ow // tow), chunks=1,
                    chunk_read_bytes=window * c.inp_entry_bytes + weights * c.wgt_entry_bytes,
                    chunk_loads=toc + 1,
                    chunk_uops=window if kind == "max" else pixels * taps,
                    tile_uops=pixels * alu_ops,
                    tile_read_bytes=toc * c.acc_entry_bytes if kind == "avg" or kind == "depthwise" and not bias_once
                    else 0,
                    tile_store_bytes=pixels * c.out_entry_bytes, tile_stores=1 if tow == ow else toc * toh)
                cost, order = work.best_order(c, threads)
                ranked.append((cost, -pixels, toc, toh, tow, order))
    once = {"bias_once": True} if kind == "depthwise" and bias_once else {}
    if not ranked:
        raise OpError(f"a {kh}x{kw} {kind} pool's window of one channel block does not fit the input and "
                      f"accumulator buffers of config {c.name!r} ({c.inp_depth} and {c.acc_depth} entries)")
    _, _, toc, toh, tow, order = min(ranked)
    return {"toc": toc, "toh": toh, "tow": tow, "threads": threads, "order": order, **once}


def compile_int8_pool2d(config: AccelConfig, shape, kind: str, kernel: tuple[int, int], *,
                        stride: tuple[int, int] | None = None, padding=(0, 0, 0, 0),
                        dilation: tuple[int, int] = (1, 1), count_include_pad: bool = False,
                        nonnegative: bool = False, lshift: int = 0, latency_hiding: bool = True) -> CompiledOp:
    """int8 max or average pooling (``kind``) of an NCHW tensor on the GEMM core, as the int8
    graph defines it (`ops.reference`: the average rounds half up), output at the input's
    scale (an average's ``lshift`` bits finer: the mean of ``x << lshift``, saturated). ``padding`` is (top, left, bottom, right); every window must lie inside the padded
    input (no partial windows). A padded max pool needs ``nonnegative`` inputs (zero padding),
    a padded average pool ``count_include_pad`` (one divisor for every window). Input ``x``,
    output NCHW int8, both in the convolutions' packed layouts."""
    c = config
    if kind not in ("max", "avg"):
        raise OpError(f"pooling is max or avg, not {kind!r}")
    n, ch, h, w = _check(c, shape, (lshift, 0), 0, False)
    if lshift and kind != "avg":
        raise OpError("only an average pool takes a left shift")
    (kh, kw), (sh, sw), (dh, dw), (top, left, bottom, right), (oh, ow) = _window(
        c, "pool", (h, w), kernel, kernel if stride is None else stride, dilation, padding)
    padded = any(padding)
    if padded and kind == "max" and not nonnegative:
        raise OpError("a padded max pool of inputs that may be negative: the DMA pads with zeros, which only a "
                      "non-negative input (after a ReLU) leaves without effect")
    if padded and kind == "avg" and not count_include_pad:
        raise OpError("a padded average pool without count_include_pad divides its border windows by fewer taps; "
                      "the accelerator divides every window by one count")
    if kind == "max" and not all(_windows_reach_input(*axis) for axis in ((oh, h, kh, sh, dh, top),
                                                                          (ow, w, kw, sw, dw, left))):
        # The graph's max of no input is −128; the zero frame would give 0.
        raise OpError("a window of the max pool lies wholly in the padding")
    count = kh * kw
    division = None
    if kind == "avg":
        division = division_by_multiply(count, c.alu_imm_range[1], lshift)
        if division is None:
            raise OpError(f"an average over {count} taps{f' shifted by {lshift}' if lshift else ''} has no exact "
                          f"multiply-and-shift within the ALU's {c.alu_imm_range[1]} immediate and int32")
    data = (ceil_div(n, c.batch), ceil_div(ch, c.block_in), h, w)
    nb, cb = data[:2]
    epi = Epilogue(kind == "avg", division[1] if division else 0, False)
    check_footprint(c, f"{kind} pool", {"inp": nb * cb * h * w, "wgt": 1, "out": nb * cb * oh * ow}, epi)
    acc = f"int{c.acc_width}"
    x = placeholder((nb, cb, h, w, c.batch, c.block_in), f"int{c.inp_width}", "x", tile_dims=2)
    # One weight entry, with an outer axis of 1 as every DMA'd tensor has.
    ident = placeholder((1, c.block_out, c.block_in), f"int{c.wgt_width}", "w", tile_dims=2)
    xp = pad(x, (0, 0, top, left, 0, 0), (0, 0, bottom, right, 0, 0), "xp") if padded else x
    k = reduce_axis(c.block_in, "k")
    out_shape = (nb, cb, oh, ow, c.batch, c.block_out)
    params = [x, ident]
    if kind == "avg":
        m, t = division
        ri, rj = reduce_axis(kh, "ri"), reduce_axis(kw, "rj")
        total = compute(out_shape, lambda n_, oc, y, xx, b, o: sum_(
            xp[n_, oc, y * sh + ri * dh, xx * sw + rj * dw, b, k].astype(acc) * ident[0, o, k].astype(acc), [ri, rj, k]),
            name="c", dtype=acc, tile_dims=2)
        bias = placeholder((cb, c.batch, c.block_out), acc, "bias", tile_dims=2)
        params.append(bias)

        def average(n_, oc, y, xx, b, o):
            value = total[n_, oc, y, xx, b, o]
            if m != 1:
                value = value * Const(m)
            return Cast("int8", clip(Shr(value + bias[oc, b, o], Const(t)) if t else value + bias[oc, b, o],
                                     -128, 127))
        out = compute(out_shape, average, name="out", dtype="int8", tile_dims=2)
        widened = total
    else:
        # A reduction over the one weight entry too, so that the first reduction loop lies
        # outside the GEMM intrinsic's three (the accumulator's initialization goes there).
        r = reduce_axis(1, "r")
        wide = compute((nb, cb, h + top + bottom, w + left + right, c.batch, c.block_out),
                       lambda n_, oc, y, xx, b, o: sum_(xp[n_, oc, y, xx, b, k].astype(acc) * ident[r, o, k].astype(acc),
                                                        [r, k]),
                       name="wide", dtype=acc, tile_dims=2)

        def window_max(n_, oc, y, xx, b, o):
            value = wide[n_, oc, y * sh, xx * sw, b, o]
            for i in range(kh):
                for j in range(kw):
                    if i or j:
                        value = Max(value, wide[n_, oc, y * sh + i * dh, xx * sw + j * dw, b, o])
            return Cast("int8", clip(value, -128, 127))
        out = compute(out_shape, window_max, name="out", dtype="int8", tile_dims=2)
        widened = wide
    plan = plan_with_fallback(lambda threads: _pool_plan(c, kind, data, (oh, ow), (kh, kw), (sh, sw), (dh, dw),
                                                         threads, count - 1 if kind == "max"
                                                         else int(division[0] != 1)),
                              latency_hiding)

    s, out_acc, x_inp, w_wgt = _gemm_stages(out, widened, xp, ident)
    readers = [s.cache_read(params[2], "acc", [out_acc])] if kind == "avg" else []
    schedule_image_tiles(s, out, plan, [widened, out_acc], readers)
    sw_ = s[widened]
    if kind == "avg":
        wn, woc, wy, wx, wb, wo, wri, wrj, wk = sw_.leaf
        chunk, wrii = sw_.split(wri, kh)      # one chunk: the whole window loaded once
        sw_.reorder(chunk, wn, woc, wy, wx, wrii, wrj, wb, wo, wk)
    else:
        wn, woc, wy, wx, wb, wo, chunk, wk = sw_.leaf
        sw_.reorder(chunk, wn, woc, wy, wx, wb, wo, wk)
    sw_.tensorize(wb, gemm_intrin(c))
    for t_ in (x_inp, w_wgt):
        s[t_].compute_at(sw_, chunk)
        s[t_].pragma(s[t_].leaf[0], "dma_copy")
    program = build(s, c, params + [out])
    weights = pool_weights(c, lshift)
    bias_packed = pool_bias(c, ch, count, *division) if kind == "avg" else None

    def pack(x: np.ndarray) -> dict[str, np.ndarray]:
        if tuple(x.shape) != (n, ch, h, w):
            raise OpError(f"the {kind} pool was compiled for {[n, ch, h, w]}, not {list(x.shape)}")
        packed = {"x": pack_nchw(c, x), "w": weights}
        if bias_packed is not None:
            packed["bias"] = bias_packed
        return packed

    return CompiledOp(f"{kind}_pool", program, ["x"], "out", pack, lambda t_: unpack_nchw(t_, n, ch),
                      plan=dict(plan, oh=oh, ow=ow, **({"multiplier": division[0], "shift": division[1]}
                                                       if division else {})))


# ---------------------------------------------------------------------------- depthwise convolutions

def pack_depthwise(config: AccelConfig, w: np.ndarray) -> np.ndarray:
    """Depthwise weights (C, 1, KH, KW) → ``(C/BO, KH, KW, BO, BI)``: per channel block and
    tap, the diagonal matrix of the block's weights (BI = BO)."""
    c, _, kh, kw = w.shape
    bo = config.block_out
    cb = ceil_div(c, bo)
    full = np.zeros((cb * bo, kh, kw), np.int64)
    full[:c] = w[:, 0]
    taps = full.reshape(cb, bo, kh, kw).transpose(0, 2, 3, 1)          # (cb, kh, kw, bo)
    diagonal = np.zeros((cb, kh, kw, bo, bo), np.int64)
    lanes = np.arange(bo)
    diagonal[..., lanes, lanes] = taps
    return diagonal.astype(int_dtype(config.wgt_width))


def compile_int8_depthwise_conv2d(config: AccelConfig, input_shape, kernel: tuple[int, int], *,
                                  stride: tuple[int, int] = (1, 1), padding=(0, 0, 0, 0),
                                  dilation: tuple[int, int] = (1, 1), shift: int = 0, relu: bool = False,
                                  hi: int | None = None, latency_hiding: bool = True) -> CompiledOp:
    """int8 depthwise convolution (one input channel per output channel, groups = channels) of an
    NCHW tensor with (C, 1, KH, KW) weights and an int32 bias, requantized by ``shift`` (and
    ReLU, and clamped to ``hi``) as the int8 graph's convolutions are, on the GEMM core.

    Each tap is one micro-op per output entry against the diagonal matrix of its channel block's
    weights (`pack_depthwise`): exact, and ``block_out`` useful products a micro-op where a
    one-group convolution has ``block_in · block_out`` — a depthwise layer's products are one
    per output and tap, so a dense core cannot fill its rows with them. Such a layer is about
    as quick as its DMA here (it reads each input once and computes 9 products of each at
    ``block_out`` a cycle), and the host round trip it replaces costs more. Inputs ``x``,
    ``w``, ``bias``; output NCHW int8 in the convolutions' packed layout."""
    c = config
    n, ch, h, w = _check(c, input_shape, (0, 0), shift, relu)
    (kh, kw), (sh, sw), (dh, dw), (top, left, bottom, right), (oh, ow) = _window(
        c, "depthwise convolution", (h, w), kernel, stride, dilation, padding)
    data = (ceil_div(n, c.batch), ceil_div(ch, c.block_in), h, w)
    nb, cb = data[:2]
    epi = Epilogue(True, shift, relu, None, hi)
    check_footprint(c, "depthwise conv2d", {"inp": nb * cb * h * w, "wgt": cb * kh * kw, "out": nb * cb * oh * ow},
                    epi)
    acc = f"int{c.acc_width}"
    x = placeholder((nb, cb, h, w, c.batch, c.block_in), f"int{c.inp_width}", "x", tile_dims=2)
    wt = placeholder((cb, kh, kw, c.block_out, c.block_in), f"int{c.wgt_width}", "w", tile_dims=2)
    bias = placeholder((cb, c.batch, c.block_out), acc, "bias", tile_dims=2)
    padded = any(padding)
    xp = pad(x, (0, 0, top, left, 0, 0), (0, 0, bottom, right, 0, 0), "xp") if padded else x
    ri, rj, k = reduce_axis(kh, "ri"), reduce_axis(kw, "rj"), reduce_axis(c.block_in, "k")
    out_shape = (nb, cb, oh, ow, c.batch, c.block_out)
    total = compute(out_shape, lambda n_, oc, y, xx, b, o: sum_(
        xp[n_, oc, y * sh + ri * dh, xx * sw + rj * dw, b, k].astype(acc) * wt[oc, ri, rj, o, k].astype(acc),
        [ri, rj, k]), name="c", dtype=acc, tile_dims=2)
    out = compute(out_shape, lambda n_, oc, y, xx, b, o: epi.apply(total[n_, oc, y, xx, b, o], bias[oc, b, o]),
                  name="out", dtype="int8", tile_dims=2)
    plan = plan_with_fallback(lambda threads: _pool_plan(c, "depthwise", data, (oh, ow), (kh, kw), (sh, sw),
                                                         (dh, dw), threads, epilogue_alu_ops(epi)),
                              latency_hiding)
    s, out_acc, x_inp, w_wgt = _gemm_stages(out, total, xp, wt)
    # Every channel block's bias loaded once, before the first tile, where the accumulator has
    # room: a bias the ALU adds (below an upper bound) loaded per tile held the compute engine
    # until the read channel, busy with the next tile's window, got to it (MobileNetV2's
    # 112×112 layer took twice its time).
    bias_acc = s.cache_read(bias, "acc", [out_acc])
    if plan.get("bias_once"):
        s[bias_acc].pragma(s[bias_acc].leaf[0], "dma_copy")
    schedule_image_tiles(s, out, plan, [total, out_acc], [] if plan.get("bias_once") else [bias_acc])
    st = s[total]
    tn, toc_, ty, tx, tb, to, tri, trj, tk = st.leaf
    chunk, trii = st.split(tri, kh)      # one chunk: the window and the block's taps loaded once
    st.reorder(chunk, tn, toc_, ty, tx, trii, trj, tb, to, tk)
    st.tensorize(tb, gemm_intrin(c))
    for t_ in (x_inp, w_wgt):
        s[t_].compute_at(st, chunk)
        s[t_].pragma(s[t_].leaf[0], "dma_copy")
    program = build(s, c, [x, wt, bias, out])

    def pack(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> dict[str, np.ndarray]:
        if tuple(x.shape) != (n, ch, h, w_) or tuple(w.shape) != (ch, 1, kh, kw):
            raise OpError(f"the depthwise convolution was compiled for input {[n, ch, h, w_]} and weight "
                          f"{[ch, 1, kh, kw]}, not {list(x.shape)} and {list(w.shape)}")
        return {"x": pack_nchw(c, x), "w": pack_depthwise(c, w), "bias": pack_bias(c, bias)}
    w_ = w
    return CompiledOp("depthwise_conv2d", program, ["x", "w", "bias"], "out", pack,
                      lambda t_: unpack_nchw(t_, n, ch), plan=dict(plan, oh=oh, ow=ow))
