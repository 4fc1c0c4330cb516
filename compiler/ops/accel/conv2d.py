"""``conv2d`` on packed layouts with a fused epilogue.

Data NCHW{B}n{BI}c ``(N/B, C/BI, H, W, B, BI)``, weights OIHW{BO}o{BI}i
``(O/BO, C/BI, KH, KW, BO, BI)``, output ``(N/B, O/BO, OH, OW, B, BO)``::

    xp          = pad(x, rows and columns by `padding`)
    c[n, oc, y, x, b, o] = Σ_ic,kh,kw,ki xp[n, ic, y·s + kh, x·s + kw, b, ki] · w[oc, ic, kh, kw, o, ki]
    out         = epilogue(c, bias[oc, b, o])

Default schedule: output tiles of ``toc`` channel blocks × ``toh`` rows ×
``tow`` columns, the tile loops fused and split into ``V`` virtual threads
(2 with latency hiding, 1 if double buffering does not fit the buffers);
the reduction over input-channel blocks in chunks of ``tic``, kernel rows
in chunks of ``tkh`` and, when not even one kernel row fits the buffers,
kernel columns in chunks of ``tkw``, with the input window
(``(toh−1)·s + tkh`` rows × ``(tow−1)·s + tkw`` columns, zero padding added
by the DMA at the borders) and the weight chunk loaded per chunk; the
pad stage is inlined into the input copy so that no padded tensor ever
exists in DRAM. `plan_conv2d` picks the tiles for any config and shape.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from gemforge.hw.config import AccelConfig

from ...backends.accel.intrin import gemm_intrin
from ...backends.accel.layout import ceil_div, pack_nchw, pack_oihw, unpack_nchw
from ... import tuning
from ...pipeline import build
from ...schedule import VTHREAD_ORDERS, Schedule, create_schedule
from ...te import Tensor, compute, pad, placeholder, reduce_axis, sum_
from ..common import CompiledOp, Epilogue, OpError, out_size
from .common import (
    CANDIDATE_PLANS, CANDIDATE_SLACK, TilingCost, accel_epilogue, best_by_cycle_model, bias_input, check_footprint, divisors,
    epilogue_alu_ops, plan_with_fallback, schedule_image_tiles, store_entry_bytes,
)

__all__ = ["conv2d_te", "conv2d_schedule", "plan_conv2d", "rank_conv2d", "compile_conv2d"]



def conv2d_te(config: AccelConfig, data: tuple[int, int, int, int], kernel: tuple[int, int, int, int],
              stride: int, padding: int, epilogue: Epilogue) -> dict[str, Tensor]:
    """The conv2d tensor expression on packed shapes: ``data = (nb, cb, H, W)`` and
    ``kernel = (ob, cb, KH, KW)`` in blocks."""
    c = config
    nb, cb, h, w = data
    ob, _, kh, kw = kernel
    oh, ow = out_size(h, kh, stride, padding), out_size(w, kw, stride, padding)
    acc = f"int{c.acc_width}"
    x = placeholder((nb, cb, h, w, c.batch, c.block_in), f"int{c.inp_width}", "x", tile_dims=2)
    wt = placeholder((ob, cb, kh, kw, c.block_out, c.block_in), f"int{c.wgt_width}", "w", tile_dims=2)
    xp = pad(x, (0, 0, padding, padding, 0, 0), (0, 0, padding, padding, 0, 0), "xp") if padding else x
    ric, rkh, rkw, rki = (reduce_axis(cb, "ic"), reduce_axis(kh, "kh"), reduce_axis(kw, "kw"),
                          reduce_axis(c.block_in, "ki"))
    conv = compute(
        (nb, ob, oh, ow, c.batch, c.block_out),
        lambda n, oc, y, xx, b, o: sum_(
            xp[n, ric, y * stride + rkh, xx * stride + rkw, b, rki].astype(acc)
            * wt[oc, ric, rkh, rkw, o, rki].astype(acc), [ric, rkh, rkw, rki]),
        name="c", dtype=acc, tile_dims=2)
    tensors = {"x": x, "w": wt, "xp": xp, "c": conv}
    bias = None
    if epilogue.bias:
        bias = placeholder((ob, c.batch, c.block_out), acc, "bias", tile_dims=2)
        tensors["bias"] = bias
    tensors["out"] = compute(
        (nb, ob, oh, ow, c.batch, c.block_out),
        lambda n, oc, y, xx, b, o: epilogue.apply(conv[n, oc, y, xx, b, o], bias[oc, b, o] if bias else None),
        name="out", dtype=epilogue.out_dtype(acc), tile_dims=2)
    return tensors


def plan_conv2d(config: AccelConfig, data, kernel, stride: int, padding: int, *, threads: int,
                epilogue: Epilogue) -> dict[str, int]:
    """The best plan `rank_conv2d` finds."""
    return rank_conv2d(config, data, kernel, stride, padding, threads=threads, epilogue=epilogue)[0]


def rank_conv2d(config: AccelConfig, data, kernel, stride: int, padding: int, *, threads: int,
                epilogue: Epilogue, count: int | None = 1, with_cost: bool = False) -> list:
    """Tiles ``toc, toh, tow, tic, tkh, tkw`` (blocks / rows / columns / kernel rows / kernel
    columns) for the default schedule, minimizing the run time `TilingCost.cycles`
    estimates (the ``count`` best within `CANDIDATE_SLACK` of the best, best first; with
    ``count=None`` every tiling that fits, in each thread order: what tuning searches). Kernel
    columns are split only when whole kernel rows do not fit, on one thread. ``with_cost``
    gives (plan, estimated cycles) pairs.

    Without padding, a stride above the kernel's extent along an axis (a 1×1
    kernel, or one kernel row per chunk) makes the input window strided: the
    DMA copies only the pixels read (`lower.Region`), one LOAD per window row
    when the columns are strided."""
    kw = kernel[3]
    # Split kernel columns only as the last resort: after whole rows with double buffering
    # and with one thread (`plan_with_fallback` asks for two threads first) have failed.
    for tkw in reversed(divisors(kw)) if threads == 1 else [kw]:
        plans = _plan_conv2d(config, data, kernel, stride, padding, threads, epilogue, tkw, count)
        if plans:
            return plans if with_cost else [plan for plan, _ in plans]
    c = config
    raise OpError(f"conv2d with a {kernel[2]}x{kw} kernel cannot be tiled for config {c.name!r}: even one "
                  f"kernel tap of one channel block needs more input, weight or accumulator buffer than it has")


def _plan_conv2d(config: AccelConfig, data, kernel, stride: int, padding: int, threads: int,
                 epilogue: Epilogue, tkw: int, count: int | None) -> list[tuple[dict, float]]:
    """The ``count`` best (plan, estimated cycles) with kernel-column chunks of ``tkw`` (none when
    none fits; all of them in every order with ``count=None``)."""
    c = config
    nb, cb, h, w = data
    ob, _, kh, kw = kernel
    oh, ow = out_size(h, kh, stride, padding), out_size(w, kw, stride, padding)
    cols_strided = stride > 1 and padding == 0 and tkw == 1
    store_bytes = store_entry_bytes(epilogue, c)
    # The bias is loaded once for every output block, before the first tile (`conv2d_schedule`),
    # where the ALU adds it (below an upper bound: `int8_clamp_steps`) or the layer is large
    # enough to have many tiles, and the accumulator has room for a quarter of it; a small
    # layer, whose first tile is most of its time, loads it per tile (its start, where the compute engine's first accumulator LOAD meets the load
    # engine's, is what the cycle model has not learnt: it erred by 11% on a 4×4 output).
    bias_once = epilogue.bias and (epilogue.shift is not None and epilogue.hi is not None
                                   or oh * ow >= BIAS_ONCE_PIXELS) and ob <= c.acc_depth // 4
    ranked = []
    for tkh in reversed(divisors(kh)):
        rows_strided = stride > 1 and padding == 0 and tkh == 1
        for tow in reversed(divisors(ow)):
            win_w = tow if cols_strided else (tow - 1) * stride + tkw
            for toh in divisors(oh):
                win_h = toh if rows_strided else (toh - 1) * stride + tkh
                if threads * win_h * win_w > c.inp_depth:
                    break
                for tic in divisors(cb):
                    if threads * tic * win_h * win_w > c.inp_depth or threads * tic * tkh * tkw > c.wgt_depth:
                        break
                    for toc in divisors(ob):
                        pixels = toh * tow
                        acc = threads * toc * pixels + (ob if bias_once else threads * toc if epilogue.bias else 0)
                        if threads * toc * tic * tkh * tkw > c.wgt_depth or acc > c.acc_depth:
                            break
                        if max(toc, toh, tow) > c.max_loop_iterations:
                            continue
                        work = TilingCost(
                            tiles=nb * (ob // toc) * (oh // toh) * (ow // tow),
                            chunks=(cb // tic) * (kh // tkh) * (kw // tkw),
                            chunk_read_bytes=tic * win_h * win_w * c.inp_entry_bytes
                            + toc * tic * tkh * tkw * c.wgt_entry_bytes,
                            # Input: a LOAD per channel block (per window row when the
                            # columns are strided); weights: one, or one per output
                            # block when the kernel rows are chunked, per channel
                            # block too when the columns are.
                            chunk_loads=tic * (win_h if cols_strided else 1)
                            + (1 if tkh == kh and tkw == kw else toc * (1 if tkw == kw else tic)),
                            chunk_uops=toc * pixels * tic * tkh * tkw,
                            tile_uops=toc * pixels * epilogue_alu_ops(epilogue),
                            tile_read_bytes=toc * c.acc_entry_bytes if epilogue.bias and not bias_once else 0,
                            tile_store_bytes=toc * pixels * store_bytes,
                            tile_stores=1 if tow == ow else toc)
                        if count is None:
                            ranked.extend((work.cycles(c, threads, order), toc, toh, tow, tic, tkh, order)
                                          for order in VTHREAD_ORDERS)
                        else:
                            cost, order = work.best_order(c, threads)
                            ranked.append((cost, toc, toh, tow, tic, tkh, order))
    plans = []
    ranked.sort()
    for cost, toc, toh, tow, tic, tkh, order in ranked[:count]:
        if count is not None and cost > ranked[0][0] * (1 + CANDIDATE_SLACK):
            break
        plan = {"toc": toc, "toh": toh, "tow": tow, "tic": tic, "tkh": tkh, "threads": threads, "order": order}
        if bias_once:
            plan["bias_once"] = True
        if tkw != kw:
            plan["tkw"] = tkw
        plans.append((plan, cost))
    return plans


def tiling_candidates(config: AccelConfig, data, kernel, stride: int, padding: int, epilogue: Epilogue,
                      latency_hiding: bool) -> list[tuple[dict, float]]:
    """Every tiling of the convolution that fits, in each thread order, with the closed-form cycle
    estimate (best first; two virtual threads where latency hiding is asked for and they fit, as
    the compile does): what `gemforge tune` searches (`tuning.choice`)."""
    return plan_with_fallback(
        lambda threads: rank_conv2d(config, data, kernel, stride, padding, threads=threads, epilogue=epilogue,
                                    count=None, with_cost=True),
        latency_hiding)


#: Output pixels from which a convolution loads its bias once, not per tile (`_plan_conv2d`).
BIAS_ONCE_PIXELS = 49


def conv2d_schedule(config: AccelConfig, tensors: dict[str, Tensor], plan: dict[str, int]) -> Schedule:
    """The default accelerator schedule of `conv2d_te` for a tiling ``plan``."""
    x, w, xp, c, out = (tensors[k] for k in ("x", "w", "xp", "c", "out"))
    s = create_schedule(out)
    s[c].set_scope("acc")
    out_acc = s.cache_write(out, "acc")
    x_inp = s.cache_read(xp, "inp", [c])
    if xp is not x:
        s[xp].compute_inline()  # padding becomes the DMA's zero frame
    w_wgt = s.cache_read(w, "wgt", [c])
    readers = []
    if "bias" in tensors:
        bias_acc = s.cache_read(tensors["bias"], "acc", [out_acc])
        if plan.get("bias_once"):
            # Every output block's bias loaded once, before the first tile: loaded per tile (an
            # accumulator LOAD, on the compute engine), it held the compute engine until the
            # read channel, busy with the next tile's inputs, got to it — by the cycle model
            # MobileNetV2's clipped convolutions took 1.32× their rooflines, now 1.07×, and
            # ResNet-18's convolutions 7.60 M cycles, now 7.32 M.
            s[bias_acc].pragma(s[bias_acc].leaf[0], "dma_copy")
        else:
            readers.append(bias_acc)

    schedule_image_tiles(s, out, plan, [c, out_acc], readers)

    sc = s[c]
    cn, coc, cy, cx, cb, co, ic, kh, kw, ki = sc.leaf
    ico, ici = sc.split(ic, plan["tic"])
    kho, khi = sc.split(kh, plan.get("tkh", tensors["w"].shape[2]))
    if "tkw" in plan:            # kernel columns chunked too: buffers smaller than a kernel row
        kwo, kwi = sc.split(kw, plan["tkw"])
        sc.reorder(ico, kho, kwo, cn, coc, cy, cx, ici, khi, kwi, cb, co, ki)
        chunk = kwo
    else:
        sc.reorder(ico, kho, cn, coc, cy, cx, ici, khi, kw, cb, co, ki)
        chunk = kho
    sc.tensorize(cb, gemm_intrin(config))
    for t in (x_inp, w_wgt):
        s[t].compute_at(sc, chunk)
        s[t].pragma(s[t].leaf[0], "dma_copy")
    return s


#: Tuned plans per (config, shapes, epilogue, latency hiding), remembered per process, as a
#: network repeats its layer shapes.
_TUNED_PLANS: dict[tuple, tuple] = {}


def _tuned_build(config: AccelConfig, data, kernel, stride: int, padding: int, epilogue: Epilogue,
                 latency_hiding: bool, build_plan) -> tuple[dict, object]:
    """(plan, program) of the candidates `rank_conv2d` ranks best that the cycle model runs
    fastest (``build_plan`` builds one); a remembered plan is built once, without timing."""
    key = (config, data, kernel, stride, padding, epilogue, latency_hiding)
    if key in _TUNED_PLANS:
        plan = dict(_TUNED_PLANS[key])
        return plan, build_plan(plan)
    plans = plan_with_fallback(
        lambda threads: rank_conv2d(config, data, kernel, stride, padding, threads=threads, epilogue=epilogue,
                                    count=CANDIDATE_PLANS),
        latency_hiding)
    plan, program = best_by_cycle_model(plans, build_plan)
    _TUNED_PLANS[key] = tuple(plan.items())
    return plan, program


def compile_conv2d(config: AccelConfig, input_shape: tuple[int, int, int, int],
                   weight_shape: tuple[int, int, int, int], *, stride: int = 1, padding: int = 0,
                   bias: bool = False, shift: int | None = None, relu: bool = False, hi: int | None = None,
                   latency_hiding: bool = True, tune: bool = True) -> CompiledOp:
    """Compile a 2-D convolution of NCHW ``input_shape`` with OIHW ``weight_shape``.

    With ``tune`` the planner's best few tilings are built and timed with the cycle model
    (about a second or two per shape, remembered per process); without, the planner's
    closed-form choice is built directly (what whole networks use, to compile in seconds).

    Inputs of the result: ``x`` (NCHW int8), ``w`` (OIHW int8), with ``bias`` a
    (O,) int32 ``bias``. The output is NCHW, int8 with ``shift`` (at most ``hi``), else int32."""
    if len(input_shape) != 4 or len(weight_shape) != 4:
        raise OpError(f"conv2d needs an NCHW input and an OIHW weight shape, not {input_shape} and {weight_shape}")
    n, ch, h, w = (int(v) for v in input_shape)
    o, ci, kh, kw = (int(v) for v in weight_shape)
    if ci != ch:
        raise OpError(f"conv2d input has {ch} channels but the weights expect {ci}")
    if min(n, ch, h, w, o, kh, kw) < 1:
        raise OpError(f"conv2d shapes must be positive: input {input_shape}, weight {weight_shape}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise OpError(f"stride must be a positive integer, not {stride!r}")
    max_pad = config.max_dma_pad
    if isinstance(padding, bool) or not isinstance(padding, int) or not 0 <= padding <= max_pad:
        raise OpError(f"padding must be an integer between 0 and {max_pad} (the DMA's pad field), "
                      f"not {padding!r}")
    if padding >= kh or padding >= kw:
        raise OpError(f"padding {padding} must be smaller than the kernel ({kh}x{kw}): a larger pad "
                      "gives output pixels that see only zeros")
    oh, ow = out_size(h, kh, stride, padding), out_size(w, kw, stride, padding)
    if oh < 1 or ow < 1:
        raise OpError(f"a {kh}x{kw} kernel with padding {padding} does not fit a {h}x{w} input")
    c = config
    data = (ceil_div(n, c.batch), ceil_div(ch, c.block_in), h, w)
    kernel = (ceil_div(o, c.block_out), data[1], kh, kw)
    epi = accel_epilogue(config, "conv2d", bias, shift, relu, hi)
    check_footprint(c, "conv2d", {"inp": data[0] * data[1] * h * w, "wgt": kernel[0] * kernel[1] * kh * kw,
                                  "out": data[0] * kernel[0] * oh * ow}, epi)
    tensors = conv2d_te(c, data, kernel, stride, padding, epi)
    inputs = ["x", "w"] + (["bias"] if bias else [])

    def build_plan(plan):
        return build(conv2d_schedule(c, tensors, plan), c, [tensors[k] for k in inputs] + [tensors["out"]])

    if tune:
        plan, program = _tuned_build(c, data, kernel, stride, padding, epi, latency_hiding, build_plan)
    else:
        plan = plan_with_fallback(
            lambda threads: plan_conv2d(c, data, kernel, stride, padding, threads=threads, epilogue=epi),
            latency_hiding)
        if tuning.active():
            # A tuning log's tiling for this convolution (`gemforge tune --device fsim`). The tilings
            # that fit depend on whether the epilogue requantizes and clamps, not on the shift's or
            # the bound's value (which calibration sets): a log applies across calibrations.
            plan = tuning.choice(
                "accel.conv2d", tuning.target_identity(c),
                {"input": (n, ch, h, w), "weight": (o, ci, kh, kw), "stride": stride, "padding": padding,
                 "bias": bias, "requantized": shift is not None, "relu": relu, "clamped": hi is not None,
                 "latency_hiding": latency_hiding},
                default=plan,
                candidates=partial(tiling_candidates, c, data, kernel, stride, padding, epi, latency_hiding),
                build=partial(compile_conv2d, config, (n, ch, h, w), (o, ci, kh, kw), stride=stride,
                              padding=padding, bias=bias, shift=shift, relu=relu, hi=hi,
                              latency_hiding=latency_hiding, tune=False))
        program = build_plan(plan)

    width = w

    def pack(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if tuple(x.shape) != (n, ch, h, width) or tuple(w.shape) != (o, ci, kh, kw):
            raise OpError(f"conv2d was compiled for input {[n, ch, h, width]} and weight {[o, ci, kh, kw]}, "
                          f"not {list(x.shape)} and {list(w.shape)}")
        return {"x": pack_nchw(c, x), "w": pack_oihw(c, w), **bias_input("conv2d", epi, c, bias, o)}

    return CompiledOp("conv2d", program, inputs, "out", pack, lambda t: unpack_nchw(t, n, o),
                      plan=dict(plan, oh=oh, ow=ow))
