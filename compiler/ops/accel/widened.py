"""int8 element-wise operators on the GEMM core: the residual add (and subtraction) of an int8 network.

The tensor ALU works on accumulator (int32) entries, and an int8 tensor in DRAM has no way
into the accumulator but through the GEMM core. So the add widens its operands there: with
the weight tile ``2^l · I`` (a scaled identity, ``l`` ≤ 6 so that it is an int8), one
micro-op ``acc[e] += inp[e] · (2^l · I)ᵀ`` adds an entry of int8 values, shifted left by
``l``, to the accumulator exactly. Two such steps per output entry (one per operand) give
``(x << lx) + (y << ly)`` (a subtraction weighs ``y`` by ``−2^ly · I``), and the requantizing STORE's bias, shift and clamp finish the add
bit for bit as the int8 graph defines it (`graph.operators.elementwise`)::

    c[n, cb, y, x, b, o] = Σ_{r, k} xy[r, n, cb, y, x, b, k] · w[r, o, k]      (w[r] = 2^l_r · I)
    out                  = clip((c + 2^(s−1)) >> s, 0 if relu else −128, 127)   (no bias when s = 0)

Why not a new instruction (a LOAD that widens int8 entries into the accumulator): the GEMM
core widens one entry a cycle, the rate such a LOAD would reach on this bus, and the weight
tile costs one entry of the weight buffer; the gateware, its timing and its resources stay as
they are. The price is that the add occupies the GEMM core (two micro-ops an output entry)
where a widening LOAD would leave it to the next layer.

The operands are one stacked placeholder ``xy`` (the reduction runs over its first axis, one
operand per reduction chunk, so no transfer spans both); the built program then names its two
halves ``x`` and ``y``, which a network binds to wherever their producers wrote them.
"""

from __future__ import annotations

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.hw.program import TensorRegion

from ...backends.accel.intrin import gemm_intrin
from ...backends.accel.layout import ceil_div, int_dtype, pack_bias, pack_nchw, unpack_nchw
from ...pipeline import build
from ...schedule import create_schedule
from ...te import compute, placeholder, reduce_axis, sum_
from ..common import CompiledOp, Epilogue, OpError
from .common import TilingCost, check_footprint, divisors, plan_with_fallback, schedule_output_tile

__all__ = ["compile_scaled_add", "MAX_OPERAND_SHIFT", "scaled_add_weights", "scaled_add_bias"]

#: The largest left shift of an operand: its weight 2^l must be an int8.
MAX_OPERAND_SHIFT = 6


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

    s = create_schedule(out)
    s[total].set_scope("acc")
    out_acc = s.cache_write(out, "acc")
    xy_inp = s.cache_read(xy, "inp", [total])
    w_wgt = s.cache_read(wt, "wgt", [total])
    readers = [s.cache_read(b_t, "acc", [out_acc])] if bias else []
    so = s[out]
    sn, soc, sy, sx, _, _ = so.leaf
    oco, oci = so.split(soc, plan["toc"])
    yo, yi = so.split(sy, plan["toh"])
    xo, xi = so.split(sx, plan["tow"])
    so.reorder(sn, oco, yo, xo, oci, yi, xi)
    tile = so.fuse(so.fuse(so.fuse(sn, oco), yo), xo)
    schedule_output_tile(s, out, tile, oci, plan["threads"], [total, out_acc], readers, plan["order"])
    st = s[total]
    tn, toc_, ty, tx, tb, to, tr, tk = st.leaf
    ro, ri = st.split(tr, 1)          # one operand per chunk: no transfer spans both
    st.reorder(ro, tn, toc_, ty, tx, ri, tb, to, tk)
    st.tensorize(tb, gemm_intrin(c))
    for t in (xy_inp, w_wgt):
        s[t].compute_at(st, ro)
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
