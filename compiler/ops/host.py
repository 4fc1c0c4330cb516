"""Operators on the host targets — the CPU and GPU back ends — with numpy layouts in and out.

Each ``compile_*`` builds the operator's tensor expression (`nn`), applies the
target's default schedule (`cpu` or `gpu`), builds the kernel and returns a
`CompiledOp` whose ``pack``/``unpack`` reshape and pad (NCHW stays NCHW) and, for
int8 products on AVX-512 VNNI, repack the weights four input channels to an int32.
The data type of the operands picks the arithmetic: int8 operands accumulate
in int32 and end with the accelerator's requantizing `Epilogue`, bit for bit;
float32 operands compute in float32 (bias, ReLU).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from .. import tuning
from ..pipeline import build
from ..schedule import create_schedule
from ..target import Target
from . import cpu as cpu_schedules
from .common import CompiledOp, Epilogue, OpError, four_pads, out_size, pool_windows
from .functions import FLOAT_FUNCTIONS
from .nn import (
    ALPHA_FUNCTIONS, CHANNEL_BLOCK, ELEMENTWISE_OPS, FLOAT_ELEMENTWISE_OPS, accumulator_dtype, channel_blocks, conv2d_layout,
    conv2d_rows_te, conv2d_te, conv2d_vnni_rows_te, conv2d_vnni_te, dense_te, dense_vnni_te, depthwise_blocked_te,
    depthwise_conv2d_te, elementwise_te,
    mean_te, pack_conv_rows, pack_conv_weights_vnni, pack_dense_panels, pack_dense_weights_vnni, pad_te, pool2d_te,
    quantize_te, scale_shift_te, slice_te, softmax_te, transpose_te, unfold_te,
)

__all__ = ["compile_dense", "compile_conv2d", "compile_elementwise", "compile_scale_shift", "compile_quantize",
           "compile_unfold", "compile_transpose", "compile_slice", "compile_pad", "compile_pool2d", "compile_mean",
           "compile_softmax", "blocked_shape", "HOST_DTYPES"]

#: Operand types of the host operators.
HOST_DTYPES = ("int8", "float32")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise OpError(f"{name} must be a positive integer, not {value!r}")
    return int(value)


def _check_dtype(op: str, dtype: str, allowed=HOST_DTYPES) -> str:
    if dtype not in allowed:
        raise OpError(f"{op} takes {' or '.join(allowed)} data, not {dtype!r}")
    return dtype


def _epilogue(dtype: str, bias: bool, shift: int | None, relu: bool, clip: tuple[float, float] | None = None,
              hi: int | None = None) -> Epilogue:
    if shift is not None and dtype != "int8":
        raise OpError("--shift (requantization) applies to int8 operands; float32 results are not shifted")
    if clip is not None and dtype != "float32":
        raise OpError("a fused clip applies to float32 results")
    if hi is not None and shift is None:
        raise OpError("an upper bound alone applies to requantized (int8) results")
    return Epilogue(bias, shift, relu, *(clip or (None, hi)))


def _array(value: Any, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise OpError(f"{name} must be a numpy array, not {type(value).__name__}")
    if value.dtype != np.dtype(dtype):
        raise OpError(f"{name} must be {dtype}, not {value.dtype}")
    if tuple(value.shape) != tuple(shape):
        raise OpError(f"{name} must have shape {list(shape)}, not {list(value.shape)}")
    return np.require(value, requirements="C")   # keeps a 0-d array 0-d (ascontiguousarray would not)


def _bias(bias, epilogue: Epilogue, dtype: str, count: int, padded: int, op: str) -> dict[str, np.ndarray]:
    if not epilogue.bias:
        if bias is not None:
            raise OpError(f"{op} was compiled without bias")
        return {}
    if bias is None:
        raise OpError(f"{op} was compiled with a bias; give one")
    acc = accumulator_dtype(dtype)
    b = _array(bias, "bias", acc, (count,))
    if padded != count:
        b = np.concatenate([b, np.zeros(padded - count, b.dtype)])
    return {"bias": b}


def _lanes(target: Target) -> int:
    from ..backends.cpu import vector_bits
    return cpu_schedules.vector_lanes(vector_bits(target), 32)


def _registers(target: Target, dtype: str) -> int:
    """The register file `plan_tile` fits a product's tile to. int8 products on AVX2 keep the
    tiles planned for 32 registers: their speed is bound by the multiplies, not by spills.
    Measured on znver3: widened to int32 (vpmulld), ResNet-18's conv4_3x3 ran at 75-81 GOP/s with
    8 × 2 and 4 × 4 tiles, 46 with 6 × 2; on AVX2's dot products (`_vnni`), the int8 ResNet-18 took
    38.7 ms with these tiles, 42.8 ms with tiles for its 16 registers."""
    from ..backends.cpu import vector_registers
    return 32 if dtype == "int8" else vector_registers(target)


def _vnni(target: Target, dtype: str) -> bool:
    """int8 products on 4-byte dot products (the ``vnni-*`` methods): AVX-512 VNNI's ``vpdpbusd``,
    or on an AVX2 CPU without it the same sums from byte and word multiply-adds
    (`CpuCodegen._dot4_avx2`, exact)."""
    from ..backends.cpu import has_feature
    return target.kind == "cpu" and dtype == "int8" and (has_feature(target, "avx512vnni")
                                                         or has_feature(target, "avx2"))


def _product_tile(kind: str, target: Target, workload: dict, rows: int, cols: int, lanes: int, registers: int,
                  rebuild, padding_cost: float = 0.0,
                  transposed: tuple[str, int, int] | None = None, column_multiple: int = 1,
                  efficiencies: dict = cpu_schedules.TILE_EFFICIENCY,
                  order: str = "columns") -> tuple[int, int, str, str | None]:
    """(mb, nb, order, method) of a CPU product's register tile: `cpu.plan_tile`'s, or a tuning
    log's (`tuning.choice`; ``rebuild`` compiles the operator again, for `gemforge tune`).
    ``transposed`` = (method, rows, cols): another way to compute the product (a convolution's
    other orientation, `_pixel_rows`), whose tiles the search may choose too; the method is then
    the one the chosen configuration names (None: the default one). ``column_multiple``: the
    tile's columns must be a multiple of it (whole channel blocks); ``efficiencies``: the kernel's
    table of tile speeds; ``order``: the tile order untuned."""
    mb, nb = cpu_schedules.plan_tile(rows, cols, lanes, registers, padding_cost, column_multiple, efficiencies)
    if not tuning.active():
        return mb, nb, order, None
    from ..tuning.space import cpu_product_candidates

    def candidates():
        out = [(config, estimate) for config, estimate in cpu_product_candidates(rows, cols, lanes, registers)
               if config["vectors"] * lanes % column_multiple == 0]
        if transposed is not None:
            method, other_rows, other_cols = transposed
            out += [(dict(config, method=method), estimate)
                    for config, estimate in cpu_product_candidates(other_rows, other_cols, lanes, registers)]
        return out
    config = tuning.choice(kind, tuning.target_identity(target), workload,
                           default={"mb": mb, "vectors": nb // lanes, "order": order},
                           candidates=candidates, build=rebuild)
    return config["mb"], config["vectors"] * lanes, config["order"], config.get("method")


def _host(target: Target) -> None:
    if target.kind not in ("cpu", "gpu"):
        raise OpError(f"host operators compile for cpu or gpu, not {target.kind}")


def compile_dense(target: Target, m: int, k: int, n: int, *, dtype: str = "int8", bias: bool = False,
                  shift: int | None = None, relu: bool = False, hi: int | None = None,
                  constant_b: bool = False) -> CompiledOp:
    """``(M×K) @ (K×N)`` (+ bias, >> shift and clip to int8 — below ``hi`` where given —, or ReLU).

    Inputs: ``a`` (M, K) and ``b`` (K, N) of ``dtype``, with ``bias`` an (N,) int32 or
    float32 ``bias``. Output: (M, N), int8 with ``shift``, else int32 or float32.
    ``constant_b`` (a layer's weights, packed once by the caller): the CPU kernel takes
    ``b`` as packed by `pack` (numpy) instead of packing it itself at every call, which
    only pays for a ``b`` that changes between calls."""
    _host(target)
    m, k, n = _positive("dense M", m), _positive("dense K", k), _positive("dense N", n)
    dtype = _check_dtype("dense", dtype)
    epi = _epilogue(dtype, bias, shift, relu, None, hi)
    if target.kind == "gpu":
        from . import gpu as gpu_schedules
        t, s, plan = gpu_schedules.dense(m, k, n, dtype, epi)
    else:
        lanes = _lanes(target)
        mb, nb, order, _ = _product_tile(
            "cpu.dense", target, {"m": m, "k": k, "n": n, "dtype": dtype, "bias": bias, "shift": shift, "relu": relu,
                                  **({"hi": hi} if hi is not None else {})},
            m, n, lanes, _registers(target, dtype),
            partial(compile_dense, target, m, k, n, dtype=dtype, bias=bias, shift=shift, relu=relu, hi=hi,
                    constant_b=constant_b))
        if _vnni(target, dtype):
            t = dense_vnni_te(m, k, n, epi, panel=nb)
            s = create_schedule(t["out"])
            cpu_schedules.schedule_matmul(s, t["out"], t["c"], mb=mb, nb=nb, lanes=lanes, order=order)
            cpu_schedules.schedule_rows(s, t["a4"])
            plan = {"mb": mb, "nb": nb, "lanes": lanes, "order": order, "method": "vnni"}
        else:
            t = dense_te(m, k, n, dtype, epi, panel=nb, packed=constant_b)
            s = create_schedule(t["out"])
            inline = [t["w.pad"]] if "w" in t and t["w.pad"] is not t["w"] else []
            cpu_schedules.schedule_matmul(s, t["out"], t["c"], mb=mb, nb=nb, lanes=lanes, inline=inline, order=order)
            if "w" in t:
                cpu_schedules.schedule_panels(s, t["wp"])
            plan = {"mb": mb, "nb": nb, "lanes": lanes, "order": order}
    m_pad, n_pad = t["out"].shape
    bias_len = t["bias"].shape[0] if bias else n
    vnni = "w4" in t
    prepacked = "wp" in t and "w" not in t
    names = ["a"] + (["w4", "corr"] if vnni else ["wp"] if prepacked else ["w"]) + (["bias"] if bias else [])
    kernel = build(s, target, [t[x] for x in names] + [t["out"]], name="dense")

    def pack(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.shape != (m, k) or b.shape != (k, n):
            raise OpError(f"dense was compiled for A{[m, k]} @ B{[k, n]}, not A{list(np.shape(a))} @ "
                          f"B{list(np.shape(b))}")
        weights = _array(b, "B", dtype, (k, n))
        if vnni:
            w4, corr = pack_dense_weights_vnni(weights, t["w4"].shape[2])
            weights = {"w4": w4, "corr": corr}
        elif prepacked:
            weights = {"wp": pack_dense_panels(weights, t["wp"].shape[2])}
        else:
            weights = {"w": weights}
        return {"a": _array(a, "A", dtype, (m, k)), **weights, **_bias(bias, epi, dtype, n, bias_len, "dense")}

    def unpack(out: np.ndarray) -> np.ndarray:
        return out if (m_pad, n_pad) == (m, n) else np.ascontiguousarray(out[:m, :n])

    return CompiledOp("dense", kernel, names, "out", pack, unpack, plan=dict(plan, dtype=dtype))


def _conv_args(shape, weight, stride, padding, groups):
    if len(shape) != 4 or len(weight) != 4:
        raise OpError(f"conv2d needs an NCHW input and an OIHW weight shape, not {shape} and {weight}")
    n, c, h, w = (_positive("conv2d input dimension", v) for v in shape)
    o, cg, kh, kw = (_positive("conv2d weight dimension", v) for v in weight)
    stride = _positive("stride", stride)
    groups = _positive("groups", groups)
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise OpError(f"padding must be a non-negative integer, not {padding!r}")
    if c % groups or o % groups:
        raise OpError(f"groups ({groups}) must divide the input channels ({c}) and the output channels ({o})")
    if cg != c // groups:
        raise OpError(f"with {groups} group(s) the weight takes {c // groups} input channels per group, not {cg}")
    oh, ow = out_size(h, kh, stride, padding), out_size(w, kw, stride, padding)
    if oh < 1 or ow < 1:
        raise OpError(f"a {kh}x{kw} kernel with padding {padding} does not fit a {h}x{w} input")
    return (n, c, h, w), (o, cg, kh, kw), stride, int(padding), groups, oh, ow


def compile_conv2d(target: Target, input_shape, weight_shape, *, stride: int = 1, padding: int = 0, groups: int = 1,
                   dtype: str = "int8", bias: bool = False, shift: int | None = None,
                   relu: bool = False, clip: tuple[float, float] | None = None, hi: int | None = None,
                   residual: bool = False, blocked_in: bool = False, blocked_out: bool = False,
                   nonnegative: bool = False) -> CompiledOp:
    """2-D convolution of NCHW ``x`` with OIHW ``w`` (``groups``: grouped or depthwise),
    zero padding, with the fused epilogue (float32: ``residual``, an NCHW input ``residual``
    of the output's shape added before the ReLU, for one group, then ``clip``, finite (lo, hi)
    bounds, after the ReLU; int8:
    ``hi``, an upper bound below 127). Output NCHW. On the CPU, a float32 convolution of one group
    may read its input (``blocked_in``) or write its output and residual (``blocked_out``) in the
    blocked layout (N, C/16, H, W, 16) instead (`nn.CHANNEL_BLOCK`; a depthwise one: both or
    neither). ``nonnegative``: an int8 input the caller knows holds no negative value (a ReLU's
    output); its 4-byte dot products then take its bytes as they are (`nn.conv2d_vnni_te`), one
    multiply-add fewer each on AVX2 — a negative value would give a wrong result."""
    _host(target)
    shape, weight, stride, padding, groups, oh, ow = _conv_args(input_shape, weight_shape, stride, padding, groups)
    dtype = _check_dtype("conv2d", dtype)
    epi = _epilogue(dtype, bias, shift, relu, clip, hi)
    if residual:
        if dtype != "float32" or groups != 1:
            raise OpError("a fused residual add applies to float32 convolutions with one group")
        epi = Epilogue(epi.bias, epi.shift, epi.relu, epi.lo, epi.hi, residual=True)
    n, c, h, w = shape
    o, cg, kh, kw = weight
    pixels = oh * ow
    depthwise = groups == c and cg == 1 and kh * kw > 1 and not residual
    if blocked_in or blocked_out:
        if target.kind != "cpu" or dtype != "float32" or (groups != 1 and not depthwise) \
                or (groups != 1 and not blocked_in == blocked_out == (o == c)):
            raise OpError("the blocked layout is the CPU's, for float32 convolutions of one group and depthwise ones "
                          "(one output channel per input channel, blocked in and out)")
        if groups == 1:
            return _compile_conv2d_blocked(target, shape, weight, stride, padding, epi, bias, oh, ow, blocked_in,
                                           blocked_out)
    if target.kind == "cpu" and depthwise:
        return _compile_depthwise(target, shape, weight, stride, padding, dtype, epi, bias, oh, ow,
                                  blocked=blocked_in)
    unsigned = False
    if target.kind == "gpu":
        from . import gpu as gpu_schedules
        t, s, plan = gpu_schedules.conv2d(shape, weight, stride, padding, groups, dtype, epi)
    else:
        lanes = _lanes(target)
        vnni = _vnni(target, dtype)
        # Known non-negative int8 input: its bytes unsigned as they are (the 4-byte dot products').
        unsigned = vnni and nonnegative
        registers = _registers(target, dtype)
        pitch = conv2d_layout(w, (kh, kw), stride, padding, vnni=vnni).pitch
        rows_allowed = groups == 1 and (dtype == "float32" or vnni)
        rows = rows_allowed and _pixel_rows(o, c, (kh, kw), stride, padding, groups, w, (oh, ow), lanes, registers)
        products = {True: (pixels, o), False: (o // groups, oh * pitch)}
        mb, nb, order, method = _product_tile(
            "cpu.conv2d", target,
            {"input": shape, "weight": weight, "stride": stride, "padding": padding, "groups": groups,
             "dtype": dtype, "bias": bias, "shift": shift, "relu": relu, "clip": clip, "hi": hi,
             **({"residual": True} if residual else {}), **({"nonnegative": True} if unsigned else {})},
            *products[rows], lanes, registers,
            partial(compile_conv2d, target, shape, weight, stride=stride, padding=padding, groups=groups,
                    dtype=dtype, bias=bias, shift=shift, relu=relu, clip=clip, hi=hi, residual=residual,
                    nonnegative=nonnegative),
            # A direct 1×1 product whose pixels its tile's columns do not divide copies its input
            # and its output.
            padding_cost=COPY_COST / o if not rows and (kh, kw, stride, padding) == (1, 1, 1, 0) else 0.0,
            # The search may take the other orientation (a configuration naming its method).
            transposed=("columns" if rows else "rows", *products[not rows]) if rows_allowed else None)
        if method is not None:
            rows = method == "rows"
        if rows:
            t = conv2d_vnni_rows_te(shape, weight, stride, padding, epi, panel=nb, nonnegative=unsigned) if vnni else \
                conv2d_rows_te(shape, weight, stride, padding, dtype, epi, panel=nb)
            s = create_schedule(t["out"])
            cpu_schedules.schedule_matmul(s, t["out"], t["c"], mb=mb, nb=nb, lanes=lanes, order=order,
                                          taps=(kh, kw) if kh * kw > 1 else None, transposed=True)
            for stage in ("flat", "x4"):
                if stage in t:
                    cpu_schedules.schedule_flat_image(s, t[stage], w + 2 * padding)
            plan = {"mb": mb, "nb": nb, "lanes": lanes, "order": order, "method": t["layout"].method}
        elif vnni:
            t = conv2d_vnni_te(shape, weight, stride, padding, groups, epi, panel=nb, nonnegative=unsigned)
            s = create_schedule(t["out"])
            shifted = t["layout"].method == "vnni-shifted"
            cpu_schedules.schedule_matmul(s, t["out"], t["c"], mb=mb, nb=nb, lanes=lanes,
                                          taps=(kh, kw) if shifted else None, order=order)
            if shifted:
                cpu_schedules.schedule_flat_image(s, t["x4"], t["layout"].pitch)
            else:
                cpu_schedules.schedule_im2col(s, t["x4"], (kh, kw), ow)
            plan = {"mb": mb, "nb": nb, "lanes": lanes, "order": order, "method": t["layout"].method}
        else:
            t = conv2d_te(shape, weight, stride, padding, groups, dtype, epi, panel=nb)
            s = create_schedule(t["out"])
            taps = (kh, kw) if t["layout"].method == "shifted" else None
            cpu_schedules.schedule_matmul(s, t["out"], t["c"], mb=mb, nb=nb, lanes=lanes, taps=taps, order=order)
            if "col" in t:
                cpu_schedules.schedule_im2col(s, t["col"], (kh, kw), ow)
            if "flat" in t:
                cpu_schedules.schedule_flat_image(s, t["flat"], t["layout"].pitch)
            plan = {"mb": mb, "nb": nb, "lanes": lanes, "order": order, "method": t["layout"].method}
    if unsigned:
        plan["nonnegative"] = True
    o_pad, p_pad = t["out"].shape[1:]
    pitch = t["layout"].pitch
    bias_len = t["bias"].shape[0] if bias else o
    x_shape = t["x"].shape
    vnni = "w4" in t or "w4p" in t
    weight_names = ["w4", "corr"] if "w4" in t else ["w4p", "corr"] if "w4p" in t else ["wp"] if "wp" in t else ["w"]
    names = ["x"] + weight_names + (["bias"] if bias else []) + (["residual"] if residual else [])
    kernel = build(s, target, [t[k] for k in names] + [t["out"]], name="conv2d")

    def pack(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
             residual: np.ndarray | None = None) -> dict[str, np.ndarray]:
        _check_conv_operands(x, w, shape, weight)
        weights = _array(w, "weight", dtype, weight)
        if "w4p" in t:
            w4, corr = pack_conv_weights_vnni(weights, groups, offset=not unsigned)
            panel = t["w4p"].shape[2]
            weights = {"w4p": pack_dense_panels(w4.T, panel),
                       "corr": np.pad(corr, (0, t["corr"].shape[0] - o))}
        elif vnni:
            w4, corr = pack_conv_weights_vnni(weights, groups, offset=not unsigned)
            weights = {"w4": w4, "corr": corr}
        elif "wp" in t:
            weights = {"wp": pack_conv_rows(weights, t["wp"].shape[2])}
        else:
            weights = {"w": weights.reshape(o, cg * kh * kw)}
        if (residual is not None) != epi.residual:
            raise OpError(f"conv2d was compiled {'with' if epi.residual else 'without'} a residual input")
        added = {"residual": _array(residual, "residual", dtype, (n, o, oh, ow)).reshape(n, o, pixels)} \
            if epi.residual else {}
        return {"x": _array(x, "input", dtype, shape).reshape(x_shape), **weights,
                **_bias(bias, epi, dtype, o, bias_len, "conv2d"), **added}

    def unpack(out: np.ndarray) -> np.ndarray:
        if (o_pad, p_pad) == (o, pixels):
            return out.reshape(n, o, oh, ow)
        rows = out[:, :o, :oh * pitch].reshape(n, o, oh, pitch)
        return np.ascontiguousarray(rows[..., :ow])

    return CompiledOp("conv2d", kernel, names, "out", pack, unpack,
                      plan=dict(plan, dtype=dtype, groups=groups, oh=oh, ow=ow))


def _compile_conv2d_blocked(target: Target, shape, weight, stride: int, padding: int, epi: Epilogue, bias: bool,
                           oh: int, ow: int, blocked_in: bool, blocked_out: bool) -> CompiledOp:
    """`compile_conv2d` of a float32 convolution of one group reading or writing the blocked layout:
    the rows product (`nn.conv2d_rows_te`: output pixels for rows, channels vectorized), its
    register tile's columns whole channel blocks."""
    n, c, h, w = shape
    o, _, kh, kw = weight
    pixels = oh * ow
    lanes, registers = _lanes(target), _registers(target, "float32")
    workload = {"input": shape, "weight": weight, "stride": stride, "padding": padding, "groups": 1,
                "dtype": "float32", "bias": bias, "relu": epi.relu, "clip": (epi.lo, epi.hi) if epi.lo is not None
                else None, **({"residual": True} if epi.residual else {}),
                "layout": f"{'blocked' if blocked_in else 'plain'}-{'blocked' if blocked_out else 'plain'}"}
    mb, nb, order, _ = _product_tile(
        "cpu.conv2d", target, workload, pixels, o, lanes, registers,
        partial(_compile_conv2d_blocked, target, shape, weight, stride, padding, epi, bias, oh, ow, blocked_in,
                blocked_out), column_multiple=CHANNEL_BLOCK if blocked_out else 1,
        efficiencies=cpu_schedules.BLOCKED_TILE_EFFICIENCY,
        order="rows" if kh * kw == 1 and c * o * 4 <= cpu_schedules.ROWS_FIRST_WEIGHT_BYTES else "columns")
    t = conv2d_rows_te(shape, weight, stride, padding, "float32", epi, panel=nb, blocked_in=blocked_in,
                       blocked_out=blocked_out)
    s = create_schedule(t["out"])
    cpu_schedules.schedule_matmul(s, t["out"], t["c"], mb=mb, nb=nb, lanes=lanes, order=order,
                                  taps=(kh, kw) if kh * kw > 1 else None, transposed=not blocked_out,
                                  block=CHANNEL_BLOCK if blocked_out else None,
                                  block_in=CHANNEL_BLOCK if blocked_in else None)
    if "flat" in t:
        cpu_schedules.schedule_flat_image(s, t["flat"], w + 2 * padding)
    if "padded" in t:
        cpu_schedules.schedule_blocked_image(s, t["padded"])
    names = ["x", "wp"] + (["bias"] if bias else []) + (["residual"] if epi.residual else [])
    kernel = build(s, target, [t[k] for k in names] + [t["out"]], name="conv2d")
    x_shape, o_pad = t["x"].shape, t["wp"].shape[0] * nb
    out_shape = blocked_shape((n, o, oh, ow)) if blocked_out else (n, o, oh, ow)
    residual_layout = t["residual"].shape if epi.residual else None

    def pack(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
             residual: np.ndarray | None = None) -> dict[str, np.ndarray]:
        weights = _array(w, "weight", "float32", weight)
        if not isinstance(x, np.ndarray) or x.size != int(np.prod(x_shape)):
            raise OpError(f"conv2d was compiled for an input of {int(np.prod(x_shape))} elements "
                          f"({'blocked ' if blocked_in else ''}{list(shape)}), not {list(np.shape(x))}")
        if (residual is not None) != epi.residual:
            raise OpError(f"conv2d was compiled {'with' if epi.residual else 'without'} a residual input")
        added = {"residual": _array(residual, "residual", "float32", out_shape).reshape(residual_layout)} \
            if epi.residual else {}
        return {"x": _array(x, "input", "float32", tuple(x.shape)).reshape(x_shape),
                "wp": pack_conv_rows(weights, nb, blocked_in), **_bias(bias, epi, "float32", o, o_pad, "conv2d"),
                **added}

    def unpack(out: np.ndarray) -> np.ndarray:
        if blocked_out:
            return out[:, :out_shape[1]].reshape(out_shape)
        return out[:, :o].reshape(out_shape)

    return CompiledOp("conv2d", kernel, names, "out", pack, unpack,
                      plan={"mb": mb, "nb": nb, "lanes": lanes, "order": order, "method": "blocked",
                            "blocked_in": blocked_in, "blocked_out": blocked_out, "dtype": "float32", "groups": 1,
                            "oh": oh, "ow": ow})


def blocked_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The blocked layout's shape of an NCHW image shape: (N, C/16, H, W, 16), C/16 rounded up
    (a partial last block's padding is zeros)."""
    n, c, h, w = shape
    return (n, channel_blocks(c), h, w, CHANNEL_BLOCK)


def _pixel_rows(o: int, c: int, kernel: tuple[int, int], stride: int, padding: int, groups: int, width: int,
                out_hw: tuple[int, int], lanes: int, registers: int) -> bool:
    """Whether a one-group convolution runs as `nn.conv2d_rows_te`'s product (pixels for rows,
    channels vectorized; int8 on VNNI: `nn.conv2d_vnni_rows_te`) rather than `nn.conv2d_te`'s
    (channels for rows, pixels vectorized), by `cpu.tile_cost`'s estimate of each (the pixel columns' padding and a shifted
    layout's row pitch counted) and what each does besides: `conv2d_te` copies its windows
    into an im2col matrix when strided, or when a 1×1 layer's pixels are no multiple of its
    tile's columns (`COPY_COST`); the rows product stores its outputs one by one
    (`ROWS_STORE_COST`) and loses some speed on large images (`ROWS_LARGE_IMAGE`)."""
    if groups != 1:
        return False
    oh, ow = out_hw
    pixels, red = oh * ow, c * kernel[0] * kernel[1]
    layout = conv2d_layout(width, kernel, stride, padding)
    def columns_cost(tile: tuple[int, int]) -> float:
        copies = layout.method == "im2col" or (layout.method == "direct" and pixels % (tile[1] * lanes) != 0)
        return cpu_schedules.tile_cost(o, oh * layout.pitch, lanes, registers, *tile) * \
            (1 + ((COPY_COST if copies else 0) + COLUMN_REREAD_COST) / o)
    columns = min(columns_cost(t) for t in cpu_schedules.tile_shapes(o, registers))
    rows = min(cpu_schedules.tile_cost(pixels, o, lanes, registers, *t)
               for t in cpu_schedules.tile_shapes(pixels, registers))
    estimate = columns / (rows * (1 + ROWS_STORE_COST / red))
    if pixels > ROWS_LARGE_IMAGE[0]:
        estimate *= ROWS_LARGE_IMAGE[1]
    return estimate >= ROWS_MARGIN


#: `_pixel_rows`'s costs beyond the tiles, in multiply-adds of a product's reduction: storing an
#: output element on its own; copying a window element into an im2col matrix, and reading a
#: column panel again for each row tile (both over the output channels that share it); the
#: speed the rows product keeps above this many pixels, and the estimated gain it must show.
#: Fitted to 29 layers of MobileNetV2, ResNet-18, DenseNet-121 and others (1×1 to 7×7,
#: strides 1 and 2, 7×7 to 224×224 images, 3 to 960 channels; AVX-512, 2 cores): one wrong
#: call, 2% from even.
ROWS_STORE_COST = 25
COPY_COST = 30
COLUMN_REREAD_COST = 16
ROWS_LARGE_IMAGE = (256, 0.8)
ROWS_MARGIN = 1.1


def _check_conv_operands(x, w, shape: tuple[int, ...], weight: tuple[int, ...]) -> None:
    """Refuse a conv2d's input or weight of another shape than compiled for (or no array)."""
    if not isinstance(x, np.ndarray) or not isinstance(w, np.ndarray) or tuple(x.shape) != shape \
            or tuple(w.shape) != weight:
        raise OpError(f"conv2d was compiled for input {list(shape)} and weight {list(weight)}, not "
                      f"{list(np.shape(x))} and {list(np.shape(w))}")


def _compile_depthwise(target: Target, shape, weight, stride: int, padding: int, dtype: str, epi: Epilogue,
                       bias: bool, oh: int, ow: int, blocked: bool = False) -> CompiledOp:
    """`compile_conv2d` of a depthwise convolution on the CPU: window sums per channel
    (`nn.depthwise_conv2d_te`, `cpu.schedule_depthwise`) instead of a 1 × KH·KW product per group;
    ``blocked``: in the blocked layout (`nn.depthwise_blocked_te`, `cpu.schedule_blocked_window`)."""
    n, c, h, w = shape
    o, _, kh, kw = weight
    if blocked:
        t = depthwise_blocked_te(shape, weight, stride, padding, epi)
        s = create_schedule(t["out"])
        cpu_schedules.schedule_blocked_window(s, t, stride)
        names = ["x", "w"] + (["bias"] if bias else [])
        kernel = build(s, target, [t[k] for k in names] + [t["out"]], name="depthwise_conv2d")
        x_shape = t["x"].shape

        def pack_blocked(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
            blocks = x_shape[1]
            weights = np.zeros((blocks * CHANNEL_BLOCK, kh * kw), np.float32)
            weights[:c] = _array(w, "weight", dtype, weight).reshape(c, kh * kw)
            weights = weights.reshape(blocks, CHANNEL_BLOCK, kh * kw).transpose(0, 2, 1)
            return {"x": _array(x, "input", dtype, x_shape), "w": np.ascontiguousarray(weights),
                    **_bias(bias, epi, dtype, o, blocks * CHANNEL_BLOCK, "conv2d")}
        return CompiledOp("conv2d", kernel, names, "out", pack_blocked, lambda out: out,
                          plan={"method": "depthwise-blocked", "dtype": dtype, "groups": c, "oh": oh, "ow": ow})
    t = depthwise_conv2d_te(shape, weight, stride, padding, dtype, epi)
    s = create_schedule(t["out"])
    cpu_schedules.schedule_depthwise(s, t)
    names = ["x", "w"] + (["bias"] if bias else [])
    kernel = build(s, target, [t[k] for k in names] + [t["out"]], name="depthwise_conv2d")

    def pack(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        _check_conv_operands(x, w, shape, weight)
        weights = _array(w, "weight", dtype, weight).reshape(o, kh * kw).astype(t["w"].dtype, copy=False)
        return {"x": _array(x, "input", dtype, shape), "w": weights, **_bias(bias, epi, dtype, o, o, "conv2d")}

    return CompiledOp("conv2d", kernel, names, "out", pack, lambda out: out,
                      plan={"method": "depthwise", "dtype": dtype, "groups": c, "oh": oh, "ow": ow})


#: Element-wise operators that need ``exp``, ``log`` or ``tanh``, which the GPU back end lacks
#: (no libdevice).
_NOT_ON_GPU = tuple(name for name, f in FLOAT_FUNCTIONS.items() if not f.gpu)


def compile_scale_shift(target: Target, shape, *, dtype: str = "float32", relu: bool = False) -> CompiledOp:
    """``x · a + b`` (then ReLU) with ``a`` and ``b`` per channel (axis 1 of ``x``, rank 2 or
    more; `nn.scale_shift_te`), float32. Inputs ``x``, ``a`` and ``b`` (C,)."""
    _host(target)
    shape = tuple(_positive("scale_shift dimension", v) for v in shape)
    if len(shape) < 2:
        raise OpError(f"scale_shift scales the channels of an (N, C, …) tensor, not one of shape {list(shape)}")
    dtype = _check_dtype("scale_shift", dtype, ("float32",))
    kernel = _elementwise_kernel(target, scale_shift_te(shape, dtype, relu), ["x", "a", "b"], "scale_shift")

    def pack(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
        return {"x": _array(x, "x", dtype, shape), "a": _array(a, "a", dtype, (shape[1],)),
                "b": _array(b, "b", dtype, (shape[1],))}
    return CompiledOp("scale_shift", kernel, ["x", "a", "b"], "out", pack, lambda out: out, plan={"dtype": dtype})


def _elementwise_kernel(target: Target, t: dict, names: list[str], name: str):
    """``t["out"]`` with the target's element-wise schedule, built with parameters ``names``."""
    s = create_schedule(t["out"])
    if target.kind == "gpu":
        from . import gpu as gpu_schedules
        gpu_schedules.schedule_elementwise(s, t["out"])
    else:
        cpu_schedules.schedule_elementwise(s, t["out"])
    return build(s, target, [t[k] for k in names] + [t["out"]], name=name)


def compile_quantize(target: Target, shape, exponent: int) -> CompiledOp:
    """float32 → int8 at scale 2^−``exponent`` (`nn.quantize_te`): an int8 network's entry."""
    _host(target)
    shape = tuple(_positive("quantize dimension", v) for v in shape)
    # A rank-0 tensor runs as a tensor of one element.
    return _moving(target, "quantize", quantize_te(shape or (1,), int(exponent)), shape, shape, "float32",
                   exponent=int(exponent))


def compile_unfold(target: Target, shape, kernel, stride: int, padding, *, dtype: str = "int8") -> CompiledOp:
    """A convolution's patches as channels (`nn.unfold_te`), ``padding`` (top, left, bottom, right)."""
    _host(target)
    shape = tuple(_positive("unfold dimension", v) for v in shape)
    if len(shape) != 4:
        raise OpError(f"unfold takes an NCHW tensor, not one of shape {list(shape)}")
    dtype = _check_dtype("unfold", dtype)
    t = unfold_te(shape, tuple(kernel), int(stride), tuple(padding), dtype)
    return _moving(target, "unfold", t, shape, t["out"].shape, dtype)


def compile_elementwise(target: Target, op: str, shape, *, dtype: str = "int8", y_shape=None,
                        shift: int | None = None, relu: bool = False, lo=None, hi=None, alpha=None) -> CompiledOp:
    """An operator of `ELEMENTWISE_OPS` on a tensor of any rank: ``add``/``sub``/``mul``/``div``
    (``y`` broadcast to ``x``), ``relu``, ``clip`` (``lo``, ``hi``) and the float functions of
    `functions.FLOAT_FUNCTIONS` (those that take a parameter: ``alpha``).

    Integer operands (int8, or int32 accumulators as the accelerator's element-wise
    operators take) compute in int32 and end with the epilogue (``shift``: int8); the
    operators of `FLOAT_ELEMENTWISE_OPS` take float32 only."""
    _host(target)
    if op not in ELEMENTWISE_OPS:
        raise OpError(f"unknown element-wise operator {op!r}; known: {', '.join(ELEMENTWISE_OPS)}")
    shape = tuple(_positive("element-wise dimension", v) for v in shape)
    # A rank-0 tensor (an ONNX scalar) runs as a tensor of one element, reshaped on the way in
    # and out; its y can only be rank 0 as well.
    scalar = not shape
    if scalar:
        if y_shape is not None and tuple(y_shape):
            raise OpError(f"y of shape {list(y_shape)} does not broadcast to x's shape []")
        shape, y_shape = (1,), (None if y_shape is None else (1,))
    dtype = _check_dtype(op, dtype, ("float32",) if op in FLOAT_ELEMENTWISE_OPS else ("int8", "int32", "float32"))
    if target.kind == "gpu" and op in _NOT_ON_GPU:
        raise OpError(f"{op} has no GPU kernel (the GPU back end has no exp, log or tanh: no libdevice); run it on the cpu")
    if (op in ALPHA_FUNCTIONS) != (alpha is not None):
        raise OpError(f"alpha is the parameter of {', '.join(ALPHA_FUNCTIONS[:-1])} and {ALPHA_FUNCTIONS[-1]}; {op} takes "
                      f"{'one' if op in ALPHA_FUNCTIONS else 'none'}")
    binary = ELEMENTWISE_OPS[op] == 2
    if binary:
        y_shape = shape if y_shape is None else tuple(_positive("y dimension", v) for v in y_shape)
        if len(y_shape) > len(shape) or any(d not in (1, s) for d, s in zip(y_shape, shape[len(shape) - len(y_shape):])):
            raise OpError(f"y of shape {list(y_shape)} does not broadcast to x's shape {list(shape)}")
    elif shift is not None or y_shape is not None:
        raise OpError(f"{op} takes one input and no shift")
    if op == "clip":
        if lo is None or hi is None or lo > hi:
            raise OpError(f"clip needs bounds lo ≤ hi, not {lo!r} and {hi!r}")
        if dtype != "float32":
            lo_t, hi_t = np.iinfo(dtype).min, np.iinfo(dtype).max
            if not (float(lo).is_integer() and float(hi).is_integer() and lo_t <= lo <= hi_t and lo_t <= hi <= hi_t):
                raise OpError(f"clip bounds of an {dtype} tensor must be integers in {lo_t}..{hi_t}")
            lo, hi = int(lo), int(hi)
    if shift is not None and dtype == "float32":
        raise OpError("a shift applies to integer operands, not float32")
    t = elementwise_te(op, shape, dtype, y_shape if binary else None, shift=shift, relu=relu, lo=lo, hi=hi,
                       alpha=alpha)
    names = ["x"] + (["y"] if "y" in t else [])
    kernel = _elementwise_kernel(target, t, names, op)

    def pack(x: np.ndarray, y: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if scalar:
            x = _array(x, "x", dtype, ()).reshape(shape)
            y = y if y is None or "y" not in t else _array(y, "y", dtype, ()).reshape(shape)
        arrays = {"x": _array(x, "x", dtype, shape)}
        if "y" in t:
            arrays["y"] = _array(y, "y", dtype, t["y"].shape)
        elif y is not None:
            raise OpError(f"{op} takes one input")
        return arrays

    return CompiledOp(op, kernel, names, "out", pack, (lambda out: out.reshape(())) if scalar else (lambda out: out),
                      plan={"dtype": dtype})


def compile_transpose(target: Target, shape, perm, *, dtype: str = "float32") -> CompiledOp:
    """A tensor of any rank with its axes reordered: output axis ``k`` is input axis
    ``perm[k]`` (numpy's ``transpose``). The output is written in order, the input read
    where each element lies."""
    _host(target)
    shape = tuple(_positive("transpose dimension", v) for v in shape)
    perm = tuple(perm)
    if sorted(perm) != list(range(len(shape))):
        raise OpError(f"perm {list(perm)} is not a permutation of the axes of a rank-{len(shape)} tensor")
    dtype = _check_dtype("transpose", dtype, ("int8", "int32", "float32"))
    out_shape = tuple(shape[p] for p in perm)
    # A rank-0 tensor runs as a tensor of one element.
    t = transpose_te(shape or (1,), perm or (0,), dtype)
    return _moving(target, "transpose", t, shape, out_shape, dtype, perm=perm)


def _moving(target: Target, name: str, t: dict, shape, out_shape, dtype: str, **plan) -> CompiledOp:
    """The kernel of an operator that only moves elements (``t``: its tensors x and out), with
    the element-wise schedule of the target."""
    kernel = _elementwise_kernel(target, t, ["x"], name)
    return CompiledOp(name, kernel, ["x"], "out", lambda x: {"x": _array(x, "x", dtype, shape).reshape(t["x"].shape)},
                      lambda out: out.reshape(out_shape), plan={"dtype": dtype, **plan})


def compile_slice(target: Target, shape, starts, steps, out_shape, *, dtype: str = "float32") -> CompiledOp:
    """Every ``steps[k]``-th element of axis ``k`` from ``starts[k]``, ``out_shape[k]`` of them
    (a negative step reads backwards): numpy's ``x[start::step]`` cut to ``out_shape``."""
    _host(target)
    shape = tuple(_positive("slice dimension", v) for v in shape)
    starts, steps, out_shape = tuple(starts), tuple(steps), tuple(out_shape)
    if not len(starts) == len(steps) == len(out_shape) == len(shape):
        raise OpError(f"starts, steps and the output shape need one value per axis of a rank-{len(shape)} tensor")
    for axis, (d, start, step, n) in enumerate(zip(shape, starts, steps, out_shape)):
        if step == 0 or n < 1 or not (0 <= start < d and 0 <= start + (n - 1) * step < d):
            raise OpError(f"axis {axis}: {n} elements from {start} by steps of {step} do not lie in its {d}")
    dtype = _check_dtype("slice", dtype, ("int8", "int32", "float32"))
    # A rank-0 tensor runs as a tensor of one element.
    t = slice_te(shape or (1,), starts or (0,), steps or (1,), out_shape or (1,), dtype)
    return _moving(target, "slice", t, shape, out_shape, dtype, starts=starts, steps=steps)


def compile_pad(target: Target, shape, pads, value=0, *, dtype: str = "float32") -> CompiledOp:
    """A tensor of any rank framed by ``value``: ``pads`` gives the elements before each axis,
    then those after each (ONNX's Pad in constant mode)."""
    _host(target)
    shape = tuple(_positive("pad dimension", v) for v in shape)
    pads = tuple(pads)
    if len(pads) != 2 * len(shape) or any(isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 0
                                          for p in pads):
        raise OpError(f"pads must be {2 * len(shape)} non-negative integers for a rank-{len(shape)} tensor, not "
                      f"{list(pads)}")
    dtype = _check_dtype("pad", dtype, ("int8", "int32", "float32"))
    if dtype != "float32":
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
        if not (float(value).is_integer() and lo <= value <= hi):
            raise OpError(f"the pad value of an {dtype} tensor must be an integer in {lo}..{hi}, not {value!r}")
    out_shape = tuple(n + b + a for n, b, a in zip(shape, pads[:len(shape)], pads[len(shape):]))
    # A rank-0 tensor runs as a tensor of one element (it has no axes to pad).
    t = pad_te(shape or (1,), pads[:len(shape)] or (0,), pads[len(shape):] or (0,), dtype, value)
    return _moving(target, "pad", t, shape, out_shape, dtype, pads=pads)


def _pair(value, name: str, minimum: int) -> tuple[int, int]:
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum
                             for v in pair):
        raise OpError(f"{name} must be an integer ≥ {minimum} or a pair of them, not {value!r}")
    return int(pair[0]), int(pair[1])


def compile_pool2d(target: Target, kind: str, shape, kernel, *, stride=None, padding=0, dilation=1,
                   ceil_mode: bool = False, dtype: str = "int8", count_include_pad: bool = False,
                   lshift: int = 0, blocked: bool = False) -> CompiledOp:
    """Max or average pooling of an NCHW tensor over ``kernel`` windows (an int or (kh, kw),
    as ``stride`` and ``dilation``; ``padding`` also (top, left, bottom, right)); a kernel
    of the whole image is global pooling. ``ceil_mode`` keeps a partial last window, as
    ONNX Runtime does (`window_count`). An int8 average with ``lshift`` averages its input
    shifted left that far, saturating (an output at a finer scale than its input's). ``blocked``
    (CPU, float32): input and output in the blocked layout (N, C/16, H, W, 16)."""
    _host(target)
    if kind not in ("max", "avg"):
        raise OpError(f"pooling is max or avg, not {kind!r}")
    if len(tuple(shape)) != 4:
        raise OpError(f"pooling takes an NCHW shape, not {shape!r}")
    shape = tuple(_positive("pooling input dimension", v) for v in shape)
    kernel = _pair(kernel, "kernel", 1)
    stride = kernel if stride is None else _pair(stride, "stride", 1)
    dilation = _pair(dilation, "dilation", 1)
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in padding):
            raise OpError(f"padding must be integers ≥ 0, not {padding!r}")
        padding = tuple(int(v) for v in padding)
    else:
        padding = four_pads(_pair(padding, "padding", 0))
    dtype = _check_dtype(f"{kind} pooling", dtype, ("int8", "int32", "float32"))
    pool_windows(shape[2:], kernel, stride, padding, dilation, bool(ceil_mode))
    if blocked and target.kind != "cpu":
        raise OpError("the blocked layout is the CPU's")
    t = pool2d_te(kind, shape, kernel, stride, padding, dtype, dilation=dilation, ceil_mode=bool(ceil_mode),
                  count_include_pad=count_include_pad, lshift=lshift, blocked=blocked)
    s = create_schedule(t["out"])
    if target.kind == "gpu":
        from . import gpu as gpu_schedules
        gpu_schedules.schedule_pool(s, t, kind)
    else:
        cpu_schedules.schedule_pool(s, t, kind)
    kernel_fn = build(s, target, [t["x"], t["out"]], name=f"{kind}_pool2d")
    x_shape = t["x"].shape
    return CompiledOp(f"{kind}_pool2d", kernel_fn, ["x"], "out",
                      lambda x: {"x": _array(x, "x", dtype, x_shape)}, lambda out: out,
                      plan={"dtype": dtype, "kernel": kernel, "stride": stride, "padding": padding,
                            "dilation": dilation, "ceil_mode": bool(ceil_mode), "lshift": lshift})


def compile_mean(target: Target, rows: int, length: int, *, dtype: str = "float32") -> CompiledOp:
    """The mean of each row of a float32 matrix (rows, length): a reduction over axes moved
    last and flattened."""
    _host(target)
    rows, length = _positive("mean rows", rows), _positive("mean length", length)
    dtype = _check_dtype("mean", dtype, ("float32",))
    if target.kind == "gpu":
        raise OpError("reduce_mean has no GPU schedule; run it on the cpu")
    t = mean_te(rows, length, dtype)
    s = create_schedule(t["out"])
    cpu_schedules.schedule_mean(s, t)
    kernel = build(s, target, [t["x"], t["out"]], name="mean")
    return CompiledOp("mean", kernel, ["x"], "out", lambda x: {"x": _array(x, "x", dtype, (rows, length))},
                      lambda out: out, plan={"dtype": dtype})


def compile_softmax(target: Target, shape, *, dtype: str = "float32") -> CompiledOp:
    """Softmax over the last axis of a float32 tensor of any rank."""
    _host(target)
    shape = tuple(_positive("softmax dimension", v) for v in shape)
    if not shape:
        raise OpError("softmax needs a tensor of rank 1 or more")
    dtype = _check_dtype("softmax", dtype, ("float32",))
    t = softmax_te(shape, dtype)
    s = create_schedule(t["out"])
    if target.kind == "gpu":
        raise OpError("softmax has no GPU schedule; run it on the cpu")
    cpu_schedules.schedule_softmax(s, t)
    kernel = build(s, target, [t["x"], t["out"]], name="softmax")
    rows = t["x"].shape

    return CompiledOp("softmax", kernel, ["x"], "out",
                      lambda x: {"x": _array(x, "x", dtype, shape).reshape(rows)},
                      lambda out: out.reshape(shape), plan={"dtype": dtype})
