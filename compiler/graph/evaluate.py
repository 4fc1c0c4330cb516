"""numpy semantics of every graph operator, float32 and int8: the graph's own reference.

The graph passes use it to fold constants and to calibrate quantization (the
float network on sample inputs); the tests use it as an independent check of
the compiled network on every device (float: to tolerance; int8: exactly).
Floats compute in float64 and round to float32 once; int8 operators compute in
int64 with the accelerator's requantization: ``clip((acc + bias) >> shift, lo, 127)``
(the rounding term is part of the bias), element-wise ``(x << lx) ∘ (y << ly)``
shifted with rounding (halves up).
"""

from __future__ import annotations

import math

import numpy as np

from ..ops.common import reference_epilogue
from ..ops.reference import avg_pool2d_reference, conv2d_reference, max_pool2d_reference
from .ir import BINARY_OPS, FLOAT_FUNCTIONS, Graph, GraphError, Node

__all__ = ["evaluate", "evaluate_node", "quantize_array", "dequantize_array", "rounding_shift"]


def quantize_array(x: np.ndarray, exponent: int) -> np.ndarray:
    """float → int8 at scale 2**-exponent, rounding half to even, saturating."""
    return np.clip(np.rint(x.astype(np.float64) * 2.0 ** exponent), -128, 127).astype(np.int8)


def dequantize_array(q: np.ndarray, exponent: int) -> np.ndarray:
    return (q.astype(np.float64) * 2.0 ** -exponent).astype(np.float32)


def rounding_shift(value: np.ndarray, shift: int) -> np.ndarray:
    """``value >> shift`` rounded to nearest, halves up (int64 in, int64 out)."""
    return (value + (1 << (shift - 1))) >> shift if shift else value


def _pool(node: Node, x: np.ndarray) -> np.ndarray:
    a = node.attrs
    if node.op == "max_pool":
        return max_pool2d_reference(x, a["kernel"], a["stride"], a["padding"], dilation=a.get("dilation", 1),
                                    ceil_mode=bool(a.get("ceil_mode")))
    return avg_pool2d_reference(x, a["kernel"], a["stride"], a["padding"], dilation=a.get("dilation", 1),
                                ceil_mode=bool(a.get("ceil_mode")), count_include_pad=a["count_include_pad"])


_ARITHMETIC = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
               "min": np.minimum}
_FUNCTIONS = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
              "abs": np.abs, "softplus": lambda v: np.logaddexp(0, v),
              # numpy has no erf: Python's, element by element (float64, correctly rounded to float32 after).
              "erf": np.vectorize(math.erf, otypes=[np.float64])}


def _int8(value: np.ndarray, lo: int = -128) -> np.ndarray:
    return np.clip(value, lo, 127).astype(np.int8)


def evaluate_node(node: Node, args: list[np.ndarray]) -> np.ndarray:
    """The output of ``node`` for input arrays ``args`` (numpy layouts)."""
    a, op = node.attrs, node.op
    x = args[0]
    floating = x.dtype.kind == "f"
    if op == "conv2d":
        bias = args[2] if len(args) > 2 else None
        if floating:
            return conv2d_reference(x, args[1], bias, a["stride"], a["padding"], relu=a["relu"], groups=a["groups"])
        return conv2d_reference(x, args[1], bias, a["stride"], a["padding"], shift=a["shift"], relu=a["relu"],
                                groups=a["groups"])
    if op == "dense":
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        if floating:
            value = flat.astype(np.float64) @ args[1].astype(np.float64)
            if len(args) > 2:
                value = value + args[2].astype(np.float64)
            out = (np.maximum(value, 0) if a["relu"] else value).astype(np.float32)
        else:
            acc = flat.astype(np.int64) @ args[1].astype(np.int64)
            out = reference_epilogue(acc, args[2] if len(args) > 2 else None, a["shift"], a["relu"], 1)
        return out.reshape(lead + (out.shape[-1],))
    if op in BINARY_OPS:
        y = args[1]
        if floating:
            # In float64, each rounds to float32 as the float32 operation would (division by
            # zero included: ±inf, or NaN for 0/0).
            with np.errstate(divide="ignore", invalid="ignore"):
                value = _ARITHMETIC[op](x.astype(np.float64), y.astype(np.float64))
            return (np.maximum(value, 0) if a["relu"] else value).astype(np.float32)
        lx, ly = a["lshift"]
        value = _ARITHMETIC[op](x.astype(np.int64) << lx, y.astype(np.int64) << ly)
        return _int8(rounding_shift(value, a["shift"]), 0 if a["relu"] else -128)
    if op == "relu":
        return np.maximum(x, 0).astype(x.dtype)
    if op in FLOAT_FUNCTIONS:
        v = x.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # exp to inf, log(0) to −inf, NaNs
            if op == "leaky_relu":
                return np.where(v < 0, v * a["alpha"], v).astype(np.float32)
            if op == "elu":
                return np.where(v < 0, a["alpha"] * np.expm1(np.minimum(v, 0)), v).astype(np.float32)
            return _FUNCTIONS[op](v).astype(np.float32)
    if op == "clip":
        return np.clip(x, a["lo"], a["hi"]).astype(x.dtype)
    if op in ("max_pool", "avg_pool"):
        return _pool(node, x)
    if op == "reshape":
        return x.reshape(a["shape"])
    if op == "transpose":
        return np.ascontiguousarray(x.transpose(a["perm"]))
    if op == "slice":
        index = np.ix_(*(start + step * np.arange(n) for start, step, n in zip(a["starts"], a["steps"], a["shape"])))
        return np.ascontiguousarray(x[index])
    if op == "pad":
        if x.ndim == 0:
            # A scalar has no axes to pad (its pads are empty), and np.pad refuses an empty list.
            return x.copy()
        return np.pad(x, list(zip(a["pads"][:x.ndim], a["pads"][x.ndim:])), constant_values=a["value"])
    if op == "identity":
        return x.copy()
    if op == "concat":
        return np.concatenate(args, axis=a["axis"])
    if op == "reduce_mean":
        return np.mean(x.astype(np.float64), axis=a["axes"], keepdims=a["keepdims"]).astype(np.float32)
    if op == "softmax":
        v = x.astype(np.float64)
        e = np.exp(v - v.max(axis=a["axis"], keepdims=True))
        return (e / e.sum(axis=a["axis"], keepdims=True)).astype(np.float32)
    if op == "batch_norm":
        scale, shift, mean, var = (p.astype(np.float64) for p in args[1:5])
        shape = (1, -1) + (1,) * (x.ndim - 2)
        factor = scale / np.sqrt(var + a["epsilon"])
        return ((x - mean.reshape(shape)) * factor.reshape(shape) + shift.reshape(shape)).astype(np.float32)
    if op == "quantize":
        return quantize_array(x, a["exponent"])
    if op == "dequantize":
        return dequantize_array(x, a["exponent"])
    if op == "requantize":
        return _int8(rounding_shift(x.astype(np.int64), a["shift"]))
    raise GraphError(f"no semantics for graph operator {op!r}")


def evaluate(graph: Graph, inputs: dict[str, np.ndarray], *, keep: bool = False) -> dict[str, np.ndarray]:
    """Run ``graph`` in numpy; returns its outputs (every tensor with ``keep``)."""
    env = dict(graph.constants)
    for name in graph.inputs:
        if name not in inputs:
            raise GraphError(f"missing input {name!r}")
        env[name] = inputs[name]
    for node in graph.nodes:
        env[node.output] = evaluate_node(node, [env[i] for i in node.inputs])
    return env if keep else {name: env[name] for name in graph.outputs}
