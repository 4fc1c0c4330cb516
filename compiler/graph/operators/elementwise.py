"""Element-wise operators: of two tensors (numpy broadcasting), ``relu``, ``clip`` and the float functions.

The float functions (sigmoid, tanh, erf…) are defined once in `ops.functions`, which gives
each its numpy meaning and its kernel expression; each becomes a graph operator here.
"""

from __future__ import annotations

import math

import numpy as np

from ...ops import host
from ...ops.functions import FLOAT_FUNCTIONS
from ...ops.nn import ELEMENTWISE_OPS
from ..kernels import HostKernel, contiguous, in_blocks, quantized_elementwise, unary
from ..numeric import int8_clipped, rounding_shift
from .base import Blocked, BlockedForm, Int8, OpDef, broadcast, fail, per_item, register

_FLOAT_MAX = float(np.finfo(np.float32).max)


def _same_shape(graph, node, shapes):
    return tuple(shapes[0])


# --- two tensors -------------------------------------------------------------------------

_ARITHMETIC = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
               "min": np.minimum}


def _binary_shape(graph, node, shapes):
    return broadcast(node, shapes[0], shapes[1])


def _binary_evaluate(node, args):
    a, op = node.attrs, node.op
    x, y = args[0], args[1]
    if x.dtype.kind == "f":
        # In float64, each rounds to float32 as the float32 operation would (division by
        # zero included: ±inf, or NaN for 0/0).
        with np.errstate(divide="ignore", invalid="ignore"):
            value = _ARITHMETIC[op](x.astype(np.float64), y.astype(np.float64))
        return (np.maximum(value, 0) if a["relu"] else value).astype(np.float32)
    lx, ly = a["lshift"]
    value = _ARITHMETIC[op](x.astype(np.int64) << lx, y.astype(np.int64) << ly)
    return int8_clipped(rounding_shift(value, a["shift"]), 0 if a["relu"] else -128)


def _binary_batch(graph, node, shape, out, carried):
    for i, name in enumerate(node.inputs):
        rank = len(shape[name])
        if i in carried and rank != len(out):
            return "broadcasting moves the batch axis"
        if i not in carried and rank == len(out) and shape[name][0] != 1:
            return f"its operand {name!r} has {shape[name][0]} rows, which do not broadcast over the batch"
    return None


def _binary_host(graph, node, target):
    """add/sub/mul/div/max/min: the kernel broadcasts its second operand, so the full-shape
    operand of an add, a multiply, a max or a min goes first; the first operand is broadcast in
    numpy where it does not have the output's shape and comes first (either of sub and div; both
    when neither has it)."""
    a = node.attrs
    shapes = [tuple(graph.values[i].shape) for i in node.inputs]
    out_shape = tuple(graph.values[node.output].shape)
    dtype = graph.values[node.inputs[0]].dtype
    order = [0, 1]
    if node.op in ("add", "mul", "max", "min") and shapes[0] != out_shape and shapes[1] == out_shape:
        order = [1, 0]
    x_shape, y_shape = out_shape, shapes[order[1]]
    scalar = out_shape == ()      # rank 0 (both operands too) runs as one element
    if scalar:
        x_shape = y_shape = (1,)
    if dtype == "int8":
        lshift = tuple(a["lshift"][i] for i in order)
        op = quantized_elementwise(target, node.op, x_shape, y_shape, lshift, a["shift"], a["relu"])
    else:
        op = host.compile_elementwise(target, node.op, x_shape, dtype=dtype, y_shape=y_shape, relu=a["relu"])
    fixed = {param: contiguous(graph.constants[node.inputs[i]])
             for i, param in zip(order, ("x", "y")) if node.inputs[i] in graph.constants}
    if "x" in fixed:
        fixed["x"] = contiguous(np.broadcast_to(fixed["x"], x_shape))
    if scalar and "y" in fixed:
        fixed["y"] = fixed["y"].reshape(y_shape)

    def prepare(args):
        arrays = dict(fixed)
        if "x" not in arrays:
            arrays["x"] = contiguous(np.broadcast_to(args[order[0]], x_shape))
        if "y" not in arrays:
            arrays["y"] = contiguous(np.reshape(args[order[1]], y_shape))
        return arrays
    if scalar:
        return HostKernel(node, op, prepare, lambda out: out.reshape(()))
    return HostKernel(node, op, prepare)


def _binary_blocked(graph, node):
    """Both operands of the output's shape (no broadcasting): they and the output share a layout
    (a partial block's zeros kept, but by a division)."""
    out = graph.values[node.output].shape
    if not all(graph.values[name].shape == out for name in node.inputs):
        return None
    return BlockedForm((0, 1), partial=node.op != "div")


def _same_layout(graph, node):
    """An element-wise operator of one input: its output in its input's layout (a partial block's
    zeros kept by a ReLU, and by a clip whose range holds 0)."""
    keeps_zero = node.op == "relu" or (node.op == "clip" and node.attrs["lo"] <= 0 <= node.attrs["hi"])
    return BlockedForm((0,), partial=keeps_zero)


def _binary(name: str, int8: str, doc: str) -> OpDef:
    return OpDef(name, doc, (2, 2), _binary_shape, _binary_evaluate, attrs=("relu",),
                 int8_attrs=("lshift", "shift") if int8 == Int8.SHIFTED else (), same_dtype=2, int8=int8,
                 float_propagating=int8 == Int8.SHIFTED, batch=_binary_batch, host=_binary_host,
                 blocked=Blocked(_binary_blocked, in_blocks(_binary_host)))


#: The element-wise operators of two tensors (numpy broadcasting): the operator library's.
BINARY_OPS = tuple(op for op, arity in ELEMENTWISE_OPS.items() if arity == 2)
_SHIFTED_DOC = "inputs x, y (numpy broadcasting); relu; int8: pre-shifts of x and y (``lshift``), shift (requantization)"
_FLOAT_DOC = "inputs x, y (numpy broadcasting); relu (float32 only{})"
register(
    _binary("add", Int8.SHIFTED, _SHIFTED_DOC),
    _binary("sub", Int8.SHIFTED, _SHIFTED_DOC),
    _binary("mul", Int8.SHIFTED, _SHIFTED_DOC),
    _binary("div", Int8.FLOAT, _FLOAT_DOC.format("")),
    _binary("max", Int8.FLOAT,
            _FLOAT_DOC.format("; max and min propagate NaN, as numpy's and ONNX Runtime's do")),
    _binary("min", Int8.FLOAT,
            _FLOAT_DOC.format("; max and min propagate NaN, as numpy's and ONNX Runtime's do")),
)


# --- scale_shift -------------------------------------------------------------------------

def _scale_shift_shape(graph, node, shapes):
    x = shapes[0]
    if len(x) < 2 or shapes[1] != (x[1],) or shapes[2] != (x[1],):
        raise fail(node, f"scale and shift must have shape [{x[1] if len(x) > 1 else '?'}] (one per channel)")
    return tuple(x)


def _scale_shift_evaluate(node, args):
    x, a, b = args
    shape = (1, -1) + (1,) * (x.ndim - 2)
    value = x.astype(np.float64) * a.reshape(shape) + b.reshape(shape)
    return (np.maximum(value, 0) if node.attrs["relu"] else value).astype(np.float32)


def _scale_shift_host(graph, node, target):
    shape = tuple(graph.values[node.inputs[0]].shape)
    op = host.compile_scale_shift(target, shape, relu=node.attrs["relu"])
    fixed = {param: contiguous(graph.constants[name]) for param, name in zip(("a", "b"), node.inputs[1:])
             if name in graph.constants}

    def prepare(args):
        return {"x": contiguous(args[0]), "a": fixed.get("a", args[1]), "b": fixed.get("b", args[2])}
    return HostKernel(node, op, prepare)


# A float32 network's batch norm that no convolution precedes, after `passes.fuse_scale_shift`
# (an int8 network keeps the multiply and the add, which it requantizes).
register(OpDef("scale_shift", "inputs x, scale, shift (one per channel, axis 1); relu (float32 only)", (3, 3),
               _scale_shift_shape, _scale_shift_evaluate, attrs=("relu",), same_dtype=None, int8=Int8.NONE,
               batch=per_item, host=_scale_shift_host))


# --- one tensor --------------------------------------------------------------------------

def _function_host(graph, node, target):
    """ReLU and the float functions: the element-wise kernel of one input (``alpha`` where one is taken)."""
    shape, dtype = tuple(graph.values[node.inputs[0]].shape), graph.values[node.inputs[0]].dtype
    return unary(node, host.compile_elementwise(target, node.op, shape, dtype=dtype, alpha=node.attrs.get("alpha")))


register(OpDef("relu", "—", (1, 1), _same_shape, lambda node, args: np.maximum(args[0], 0).astype(args[0].dtype),
               int8=Int8.SAME_SCALE, float_propagating=True, saturation_safe=True, batch=per_item, host=_function_host,
               blocked=Blocked(_same_layout, in_blocks(_function_host))))


def _function_evaluate(node, args):
    function = FLOAT_FUNCTIONS[node.op]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # exp to inf, log(0) to −inf, NaNs
        return function.numpy(args[0].astype(np.float64), node.attrs.get("alpha")).astype(np.float32)


register(*(OpDef(name, f"— (float32 only: {f.doc})" if not f.alpha else f"alpha (float32 only): {f.doc}",
                 (1, 1), _same_shape, _function_evaluate, attrs=("alpha",) if f.alpha else (), int8=Int8.FLOAT,
                 batch=per_item, host=_function_host, gpu=f.gpu, blocked=Blocked(_same_layout, in_blocks(_function_host)))
           for name, f in FLOAT_FUNCTIONS.items()))


def _clip_on_grid(attrs: dict, e: int) -> dict:
    """Bounds on the int8 grid, rounded inwards; an infinite bound clips nothing."""
    lo, hi = attrs["lo"] * 2.0 ** e, attrs["hi"] * 2.0 ** e
    attrs["lo"] = -128 if lo <= -128 else min(127, math.ceil(lo))
    attrs["hi"] = 127 if hi >= 127 else max(-128, math.floor(hi))
    attrs["hi"] = max(attrs["hi"], attrs["lo"])
    return attrs


def _clip_host(graph, node, target):
    shape, dtype = tuple(graph.values[node.inputs[0]].shape), graph.values[node.inputs[0]].dtype
    lo, hi = node.attrs["lo"], node.attrs["hi"]
    if dtype != "int8":   # the kernel takes finite bounds; ±FLT_MAX clips nothing a float32 holds
        lo, hi = max(lo, -_FLOAT_MAX), min(hi, _FLOAT_MAX)
    return unary(node, host.compile_elementwise(target, "clip", shape, dtype=dtype, lo=lo, hi=hi))


register(OpDef("clip", "lo, hi (float bounds; int8: quantized integer bounds)", (1, 1), _same_shape,
               lambda node, args: np.clip(args[0], node.attrs["lo"], node.attrs["hi"]).astype(args[0].dtype),
               attrs=("lo", "hi"), int8=Int8.SAME_SCALE, saturation_safe=True, float_when_narrower=True,
               on_grid=_clip_on_grid, batch=per_item, host=_clip_host, blocked=Blocked(_same_layout, in_blocks(_clip_host))))
