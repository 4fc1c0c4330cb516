"""Operators: tensor expressions with default schedules for every target, and numpy references.

The ``compile_*`` functions take a target first — an `AccelConfig` or preset
name (the accelerator), ``"cpu"``, ``"gpu"`` or a `Target` — and return a
`CompiledOp` that runs on any device of that target (``op.run(device, ...)``).
``accel`` holds the accelerator's operators (packed layouts, tilings from its
pipeline cost model), `host` the CPU and GPU ones (numpy layouts; `nn` their
expressions, `cpu` and `gpu` their schedules), `reference` the numpy
references everything is checked against.
"""

from __future__ import annotations

import numpy as np

from ..target import target_of
from . import accel, host
from .common import CompiledOp, Epilogue, OpError
from .reference import (
    avg_pool2d_reference, conv2d_reference, conv2d_sums, dense_reference, elementwise_reference, max_pool2d_reference,
    softmax_reference,
)

__all__ = ["CompiledOp", "Epilogue", "OpError", "accumulator_overflow",
           "compile_dense", "run_dense", "dense_reference", "compile_conv2d", "run_conv2d", "conv2d_reference",
           "compile_add", "compile_relu", "compile_clip", "compile_max_pool2d", "compile_elementwise",
           "compile_pool2d", "compile_softmax", "compile_transpose", "compile_pad", "compile_mean",
           "max_pool2d_reference", "avg_pool2d_reference",
           "softmax_reference", "elementwise_reference"]


def _accel_dtype(target, dtype: str | None) -> None:
    expected = f"int{target.config.inp_width}"
    if dtype is not None and dtype != expected:
        raise OpError(f"the accelerator of config {target.config.name!r} computes {expected} operands, not {dtype}; "
                      "compile for cpu or gpu for other types")


def compile_dense(target, m: int, k: int, n: int, *, dtype: str | None = None, bias: bool = False,
                  shift: int | None = None, relu: bool = False, latency_hiding: bool = True) -> CompiledOp:
    """``(M×K) @ (K×N)`` with the fused epilogue for ``target`` (``dtype``: int8 or float32
    on cpu/gpu; the config's input type on the accelerator). Inputs ``a``, ``b``,
    optionally ``bias``; output (M, N)."""
    t = target_of(target)
    if t.kind == "accel":
        _accel_dtype(t, dtype)
        return accel.compile_dense(t.config, m, k, n, bias=bias, shift=shift, relu=relu,
                                   latency_hiding=latency_hiding)
    return host.compile_dense(t, m, k, n, dtype=dtype or "int8", bias=bias, shift=shift, relu=relu)


def compile_conv2d(target, input_shape, weight_shape, *, stride: int = 1, padding: int = 0, groups: int = 1,
                   dtype: str | None = None, bias: bool = False, shift: int | None = None, relu: bool = False,
                   latency_hiding: bool = True) -> CompiledOp:
    """2-D convolution (NCHW × OIHW) with the fused epilogue for ``target``; ``groups``
    (grouped and depthwise) on cpu and gpu."""
    t = target_of(target)
    if t.kind == "accel":
        _accel_dtype(t, dtype)
        if groups != 1:
            raise OpError(f"the accelerator runs convolutions with one group, not {groups}; run grouped and "
                          "depthwise convolutions on the cpu or gpu")
        return accel.compile_conv2d(t.config, input_shape, weight_shape, stride=stride, padding=padding, bias=bias,
                                    shift=shift, relu=relu, latency_hiding=latency_hiding)
    return host.compile_conv2d(t, input_shape, weight_shape, stride=stride, padding=padding, groups=groups,
                               dtype=dtype or "int8", bias=bias, shift=shift, relu=relu)


def compile_add(target, shape, *, shift: int | None = None, relu: bool = False, dtype: str = "int32",
                latency_hiding: bool = True) -> CompiledOp:
    """``x + y`` with the epilogue (the residual add): int32 accumulator values on the
    accelerator; int8, int32 or float32 on cpu/gpu."""
    t = target_of(target)
    if t.kind == "accel":
        return accel.compile_add(t.config, shape, shift=shift, relu=relu, latency_hiding=latency_hiding)
    return host.compile_elementwise(t, "add", shape, dtype=dtype, shift=shift, relu=relu)


def compile_relu(target, shape, *, dtype: str = "int32", latency_hiding: bool = True) -> CompiledOp:
    t = target_of(target)
    if t.kind == "accel":
        return accel.compile_relu(t.config, shape, latency_hiding=latency_hiding)
    return host.compile_elementwise(t, "relu", shape, dtype=dtype)


def compile_clip(target, shape, lo, hi, *, dtype: str = "int32", latency_hiding: bool = True) -> CompiledOp:
    t = target_of(target)
    if t.kind == "accel":
        return accel.compile_clip(t.config, shape, lo, hi, latency_hiding=latency_hiding)
    return host.compile_elementwise(t, "clip", shape, dtype=dtype, lo=lo, hi=hi)


def compile_max_pool2d(target, shape, kernel: int, *, stride: int | None = None, padding: int = 0,
                       dtype: str = "int32", latency_hiding: bool = True) -> CompiledOp:
    """Max pooling. The accelerator pads with zeros (exact for non-negative inputs); on cpu
    and gpu padding never wins (ONNX's MaxPool) and float windows ignore NaN values."""
    t = target_of(target)
    if t.kind == "accel":
        return accel.compile_max_pool2d(t.config, shape, kernel, stride=stride, padding=padding,
                                        latency_hiding=latency_hiding)
    return host.compile_pool2d(t, "max", shape, kernel, stride=stride, padding=padding, dtype=dtype)


def _host_only(target, what: str):
    t = target_of(target)
    if t.kind == "accel":
        raise OpError(f"{what} runs on the cpu or gpu, not on the accelerator")
    return t


def compile_elementwise(target, op: str, shape, **options) -> CompiledOp:
    """An element-wise operator of `nn.ELEMENTWISE_OPS` on cpu/gpu (see `host.compile_elementwise`)."""
    return host.compile_elementwise(_host_only(target, op), op, shape, **options)


def compile_pool2d(target, kind: str, shape, kernel, **options) -> CompiledOp:
    """Max or average pooling on cpu/gpu (see `host.compile_pool2d`)."""
    return host.compile_pool2d(_host_only(target, f"{kind} pooling"), kind, shape, kernel, **options)


def compile_softmax(target, shape, **options) -> CompiledOp:
    """Softmax over the last axis on the cpu."""
    return host.compile_softmax(_host_only(target, "softmax"), shape, **options)


def compile_transpose(target, shape, perm, **options) -> CompiledOp:
    """A tensor's axes reordered on cpu/gpu (see `host.compile_transpose`)."""
    return host.compile_transpose(_host_only(target, "transpose"), shape, perm, **options)


def compile_pad(target, shape, pads, value=0, **options) -> CompiledOp:
    """A tensor framed by a constant on cpu/gpu (see `host.compile_pad`)."""
    return host.compile_pad(_host_only(target, "pad"), shape, pads, value, **options)


def compile_mean(target, rows: int, length: int, **options) -> CompiledOp:
    """The mean of each row of a float32 matrix on the cpu (see `host.compile_mean`)."""
    return host.compile_mean(_host_only(target, "mean"), rows, length, **options)


def _target_for_operands(device, op: str, x: np.ndarray, y: np.ndarray):
    """The device's target, once the two operands' types suit it (the accelerator takes
    its configured input and weight types; every other target needs one type for both)."""
    target = target_of(getattr(device, "target", None) or device.config)
    if target.kind == "accel":
        inp, wgt = f"int{target.config.inp_width}", f"int{target.config.wgt_width}"
        if x.dtype != np.dtype(inp) or y.dtype != np.dtype(wgt):
            raise OpError(f"{op} operands must be {inp} (data) and {wgt} (weights) on config "
                          f"{target.config.name!r}, not {x.dtype} and {y.dtype}")
        return target
    if x.dtype != y.dtype:
        raise OpError(f"{op} operands must have one type, not {x.dtype} and {y.dtype}")
    return target


def _peak(array: np.ndarray | None) -> int:
    return int(np.abs(array.astype(np.int64)).max()) if array is not None and array.size else 0


def accumulator_overflow(config, op: str, first: np.ndarray, second: np.ndarray | None = None,
                         bias: np.ndarray | None = None, *, stride: int = 1, padding: int = 0, groups: int = 1,
                         where: str | None = None) -> str | None:
    """Why integer operands of ``op`` (``"dense"``, ``"conv2d"``, ``"add"`` or ``"mul"``) would leave the
    accumulator of ``config``, or None when every exact result (product sums + bias, or the
    sum) fits its ``acc_width``: the hardware wraps them (as fsim does), so such a run would
    differ from the arithmetic asked for without a word. ``where`` names the accumulator's
    owner in the message (default: the config); ``config`` needs only ``acc_width``."""
    lo, hi = -(1 << (config.acc_width - 1)), (1 << (config.acc_width - 1)) - 1
    hint = "use smaller operands" if where else "use a config with a wider acc_width, or smaller operands"
    where = where or f"config {config.name!r}"
    if bias is not None and bias.size and (bias.min() < lo or bias.max() > hi):
        return (f"the bias holds values up to {_peak(bias)}, beyond the int{config.acc_width} accumulator of "
                f"{where} ({lo}..{hi})")
    if op in ("dense", "conv2d"):
        terms = first.shape[1] if op == "dense" else int(np.prod(second.shape[1:]))
        if terms * _peak(first) * _peak(second) + _peak(bias) <= hi:
            return None         # no sum can reach the bounds: the exact results are not needed
        if op == "dense":
            exact = first.astype(np.int64) @ second.astype(np.int64)
        else:
            # The sums before the epilogue: `conv2d_reference` wraps them to int32 as the hardware does.
            exact = conv2d_sums(first.astype(np.int64), second.astype(np.int64), stride, padding, groups)
    elif op == "add":
        exact = first.astype(np.int64) + second.astype(np.int64)
    elif op == "mul":
        exact = first.astype(np.int64) * second.astype(np.int64)    # int32 operands: |product| < 2^62
    else:
        return None             # relu, clip and max-pool cannot leave their input's range
    if bias is not None:
        shape = [1] * exact.ndim
        shape[1] = -1
        exact = exact + bias.astype(np.int64).reshape(shape)
    if exact.size and (exact.min() < lo or exact.max() > hi):
        return (f"the exact {op} results reach {int(max(-exact.min(), exact.max()))}, beyond the "
                f"int{config.acc_width} accumulator of {where} ({lo}..{hi}), which would wrap them; "
                f"{hint}")
    return None


def _refuse_overflow(target, op: str, *args, **kwargs) -> None:
    if target.kind == "accel" and np.asarray(args[0]).dtype.kind == "i":
        problem = accumulator_overflow(target.config, op, *args, **kwargs)
        if problem:
            raise OpError(problem)


def run_dense(device, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None, shift: int | None = None,
              relu: bool = False, latency_hiding: bool = True):
    """``A @ B`` (+ epilogue) on ``device``; the arrays' type picks the arithmetic.
    Returns (output, RunResult)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise OpError(f"dense needs A (M, K) and B (K, N); got A{list(a.shape)} and B{list(b.shape)}")
    target = _target_for_operands(device, "dense", a, b)
    _refuse_overflow(target, "dense", a, b, bias)
    op = compile_dense(target, a.shape[0], a.shape[1], b.shape[1], dtype=a.dtype.name, bias=bias is not None,
                       shift=shift, relu=relu, latency_hiding=latency_hiding)
    return op.run(device, a=a, b=b, bias=bias)


def run_conv2d(device, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, *, stride: int = 1,
               padding: int = 0, groups: int = 1, shift: int | None = None, relu: bool = False,
               latency_hiding: bool = True):
    """2-D convolution (NCHW × OIHW, + epilogue) on ``device``; returns (output NCHW, RunResult)."""
    if x.ndim != 4 or w.ndim != 4:
        raise OpError(f"conv2d needs x in NCHW and w in OIHW; got {list(x.shape)} and {list(w.shape)}")
    target = _target_for_operands(device, "conv2d", x, w)
    if groups == 1:
        _refuse_overflow(target, "conv2d", x, w, bias, stride=stride, padding=padding)
    op = compile_conv2d(target, x.shape, w.shape, stride=stride, padding=padding, groups=groups,
                        dtype=x.dtype.name, bias=bias is not None, shift=shift, relu=relu,
                        latency_hiding=latency_hiding)
    return op.run(device, x=x, w=w, bias=bias)
