"""Graph nodes as CPU (and GPU) kernels: each node compiled by the LLVM back end.

`host_kernel` turns one node into a `HostKernel` — a compiled operator plus
its constant operands packed once (weights in the kernel's layout) — whose
``run(device, args)`` takes and returns numpy arrays in the graph's layouts.
Convolutions, dense layers, element-wise operators, transposes, pads, pooling,
means and softmax are compiled by the operator library (`ops.host`); the int8 network's
element-wise operators with their operand shifts and rounding are expressions
built here. Reshapes, concats and the network's entry quantization and exit
dequantization move or convert data and run in numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..ir import Cast, Const, Shr
from ..ops import host
from ..ops.common import CompiledOp
from ..ops import cpu as cpu_schedules
from ..pipeline import build
from ..schedule import create_schedule
from ..target import Target
from ..te import clip, compute, placeholder
from .evaluate import dequantize_array, quantize_array
from .ir import BINARY_OPS, FLOAT_FUNCTIONS, Graph, GraphError, Node

__all__ = ["HostKernel", "host_kernel", "DATA_MOVEMENT"]

#: Nodes that only move or convert data (numpy, no arithmetic kernel).
DATA_MOVEMENT = ("reshape", "identity", "concat", "quantize", "dequantize")

_FLOAT_MAX = float(np.finfo(np.float32).max)


def _contiguous(array) -> np.ndarray:
    """C-contiguous; unlike ``np.ascontiguousarray``, ``np.require`` keeps a 0-d array 0-d."""
    return np.require(array, requirements="C")


def quantized_elementwise(target: Target, op: str, shape, y_shape, lshift, shift: int, relu: bool) -> CompiledOp:
    """int8 ``clip(((x << lx) ∘ (y << ly) + round) >> shift, lo, 127)`` with ``y``
    broadcast to ``x`` (``∘`` is ``+``, ``−`` or ``×``; ``op == "requantize"`` has no ``y``)."""
    x = placeholder(tuple(shape), "int8", "x")
    params = [x]
    y = None
    if op != "requantize":
        y = placeholder(tuple(y_shape), "int8", "y")
        params.append(y)
        offset = len(shape) - len(y_shape)

    def body(*idx):
        value = x[idx].astype("int32")
        if lshift[0]:
            value = value * Const(1 << lshift[0])
        if y is not None:
            other = y[tuple(Const(0) if d == 1 else i for i, d in zip(idx[offset:], y_shape))].astype("int32")
            if lshift[1]:
                other = other * Const(1 << lshift[1])
            value = value + other if op == "add" else value - other if op == "sub" else value * other
        if shift:
            value = Shr(value + Const(1 << (shift - 1)), Const(shift))
        return Cast("int8", clip(value, 0 if relu else -128, 127))
    out = compute(tuple(shape), body, name="out", dtype="int8")
    s = create_schedule(out)
    cpu_schedules.schedule_elementwise(s, out)
    kernel = build(s, target, params + [out], name=f"q{op}")
    names = ["x", "y"][:len(params)]
    return CompiledOp(f"q{op}", kernel, names, "out", lambda **a: a, lambda o: o)


@dataclass
class HostKernel:
    """One node on a host target: ``op`` (None for data movement), ``prepare`` turning the
    node's input arrays into the kernel's arguments (constants packed once, at compile
    time) and ``finish`` turning its output back into the graph's layout."""

    node: Node
    op: CompiledOp | None = None
    prepare: Callable[[list[np.ndarray]], dict[str, np.ndarray]] | None = None
    finish: Callable[[np.ndarray], np.ndarray] = lambda out: out

    def run(self, device, args: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        """The node's output for ``args``, and the device's `RunResult` (None for data movement)."""
        if self.op is None:
            return _move(self.node, args), None
        outputs, result = device.run_program(self.op.program, self.prepare(args), [self.op.output])
        return _contiguous(self.finish(self.op.unpack_output(outputs[self.op.output]))), result


def _move(node: Node, args: list[np.ndarray]) -> np.ndarray:
    a = node.attrs
    if node.op == "reshape":
        return args[0].reshape(a["shape"])
    if node.op == "identity":
        return args[0].copy()
    if node.op == "concat":
        return np.concatenate(args, axis=a["axis"])
    if node.op == "quantize":
        return quantize_array(args[0], a["exponent"])
    if node.op == "dequantize":
        return dequantize_array(args[0], a["exponent"])
    raise GraphError(f"no data-movement rule for {node.op}")


def _unary(node: Node, op: CompiledOp) -> HostKernel:
    return HostKernel(node, op, lambda args: op.pack_inputs(x=_contiguous(args[0])))


def host_kernel(graph: Graph, node: Node, target: Target) -> HostKernel:
    """Compile ``node`` of ``graph`` for a host ``target`` (cpu or gpu)."""
    if node.op in DATA_MOVEMENT:
        return HostKernel(node)
    a = node.attrs
    shapes = [tuple(graph.values[i].shape) for i in node.inputs]
    out_shape = tuple(graph.values[node.output].shape)
    dtype = graph.values[node.inputs[0]].dtype
    const = [graph.constants.get(i) for i in node.inputs]
    int8 = dtype == "int8"
    shift = a.get("shift") if int8 else None
    if node.op == "conv2d":
        op = host.compile_conv2d(target, shapes[0], shapes[1], stride=a["stride"], padding=a["padding"],
                                 groups=a["groups"], dtype=dtype, bias=len(shapes) > 2, shift=shift, relu=a["relu"])
        return _with_weights(node, op, "x", "w", shapes[0], const, lambda out: out)
    if node.op == "dense":
        m = int(np.prod(shapes[0][:-1]))
        k, n = shapes[1]
        op = host.compile_dense(target, m, k, n, dtype=dtype, bias=len(shapes) > 2, shift=shift, relu=a["relu"])
        return _with_weights(node, op, "a", "b", (m, k), const, lambda out: out.reshape(out_shape))
    if node.op in BINARY_OPS:
        return _binary(graph, node, target, shapes, out_shape, dtype)
    if node.op == "requantize":
        return _unary(node, quantized_elementwise(target, "requantize", shapes[0], None, (0, 0), a["shift"], False))
    if node.op == "relu" or node.op in FLOAT_FUNCTIONS:
        return _unary(node, host.compile_elementwise(target, node.op, shapes[0], dtype=dtype, alpha=a.get("alpha")))
    if node.op == "clip":
        lo, hi = a["lo"], a["hi"]
        if not int8:   # the kernel takes finite bounds; ±FLT_MAX clips nothing a float32 holds
            lo, hi = max(lo, -_FLOAT_MAX), min(hi, _FLOAT_MAX)
        return _unary(node, host.compile_elementwise(target, "clip", shapes[0], dtype=dtype, lo=lo, hi=hi))
    if node.op == "transpose":
        return _unary(node, host.compile_transpose(target, shapes[0], a["perm"], dtype=dtype))
    if node.op == "slice":
        return _unary(node, host.compile_slice(target, shapes[0], a["starts"], a["steps"], a["shape"], dtype=dtype))
    if node.op == "pad":
        return _unary(node, host.compile_pad(target, shapes[0], a["pads"], a["value"], dtype=dtype))
    if node.op in ("max_pool", "avg_pool"):
        return _unary(node, host.compile_pool2d(target, node.op.split("_")[0], shapes[0], a["kernel"],
                                                stride=a["stride"], padding=a["padding"],
                                                dilation=a.get("dilation", 1), ceil_mode=bool(a.get("ceil_mode")),
                                                dtype=dtype, count_include_pad=a.get("count_include_pad", False)))
    if node.op == "reduce_mean":
        # The kernel averages rows: the reduced axes are moved last and flattened.
        kept = [i for i in range(len(shapes[0])) if i not in a["axes"]]
        order = kept + list(a["axes"])
        rows, length = math.prod(shapes[0][i] for i in kept), math.prod(shapes[0][i] for i in a["axes"])
        op = host.compile_mean(target, rows, length, dtype=dtype)

        def prepare(args):
            return op.pack_inputs(x=_contiguous(args[0].transpose(order)).reshape(rows, length))
        return HostKernel(node, op, prepare, lambda out: out.reshape(out_shape))
    if node.op == "softmax":
        # The kernel normalizes the last axis: another axis is moved there and back.
        axis = a["axis"]
        moved = shapes[0][:axis] + shapes[0][axis + 1:] + (shapes[0][axis],)
        op = host.compile_softmax(target, moved, dtype=dtype)
        return HostKernel(node, op, lambda args: op.pack_inputs(x=_contiguous(np.moveaxis(args[0], axis, -1))),
                          lambda out: np.moveaxis(out.reshape(moved), -1, axis))
    raise GraphError(f"node {node.name}: no CPU kernel for {node.op}")


def _binary(graph: Graph, node: Node, target: Target, shapes, out_shape, dtype: str) -> HostKernel:
    """add/sub/mul/div/max/min: the kernel broadcasts its second operand, so the full-shape
    operand of an add, a multiply, a max or a min goes first; the first operand is broadcast in numpy where it does not
    have the output's shape and comes first (either of sub and div; both when neither has it)."""
    a = node.attrs
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
    fixed = {param: _contiguous(graph.constants[node.inputs[i]])
             for i, param in zip(order, ("x", "y")) if node.inputs[i] in graph.constants}
    if "x" in fixed:
        fixed["x"] = _contiguous(np.broadcast_to(fixed["x"], x_shape))
    if scalar and "y" in fixed:
        fixed["y"] = fixed["y"].reshape(y_shape)

    def prepare(args):
        arrays = dict(fixed)
        if "x" not in arrays:
            arrays["x"] = _contiguous(np.broadcast_to(args[order[0]], x_shape))
        if "y" not in arrays:
            arrays["y"] = _contiguous(np.reshape(args[order[1]], y_shape))
        return arrays
    if scalar:
        return HostKernel(node, op, prepare, lambda out: out.reshape(()))
    return HostKernel(node, op, prepare)


def _with_weights(node: Node, op: CompiledOp, data: str, weight: str, data_shape, const, finish) -> HostKernel:
    """A conv/dense kernel with its weights and bias packed once at compile time (a
    variable second operand, a product of two activations, is packed per run)."""
    w, bias = const[1], const[2] if len(const) > 2 else None
    if w is None:
        def prepare_variable(args):
            return op.pack_inputs(**{data: _contiguous(args[0]).reshape(data_shape), weight: args[1],
                                     "bias": bias})
        return HostKernel(node, op, prepare_variable, finish)
    packed = op.pack_inputs(**{data: np.zeros(data_shape, w.dtype), weight: w, "bias": bias})
    data_layout = packed.pop(data).shape

    def prepare(args):
        return dict(packed, **{data: _contiguous(args[0]).reshape(data_layout)})
    return HostKernel(node, op, prepare, finish)
