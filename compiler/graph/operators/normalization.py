"""Reductions and normalizations: ``reduce_mean``, ``softmax`` and ``batch_norm`` (float32 only),
and ``argmax``."""

from __future__ import annotations

import math

import numpy as np

from ...ops import host
from ..kernels import HostKernel, contiguous
from .base import Int8, OpDef, fail, per_item, register, resolve_axes


def _resolved_axis(node, x) -> int:
    a = node.attrs
    axis = a["axis"] + (len(x) if a["axis"] < 0 else 0)
    if not 0 <= axis < len(x):
        raise fail(node, f"axis {a['axis']} is out of range for rank {len(x)}")
    a["axis"] = axis
    return axis


# --- argmax ------------------------------------------------------------------------------

def _argmax_shape(graph, node, shapes):
    x = shapes[0]
    if not x:
        raise fail(node, "it takes the index of the largest element along an axis of a tensor of at least one")
    axis = _resolved_axis(node, x)
    if x[axis] == 0:
        raise fail(node, f"axis {axis} is empty: there is no largest element to index")
    return tuple(1 if i == axis else d for i, d in enumerate(x) if node.attrs["keepdims"] or i != axis)


def _argmax_evaluate(node, args):
    a = node.attrs
    x = args[0]
    if a["last"]:         # the last of equal largest elements: the first one of the reversed axis
        index = x.shape[a["axis"]] - 1 - np.argmax(np.flip(x, axis=a["axis"]), axis=a["axis"])
    else:
        index = np.argmax(x, axis=a["axis"])
    index = index.astype(np.int64)
    return np.expand_dims(index, a["axis"]) if a["keepdims"] else index


# --- reduce_mean -------------------------------------------------------------------------

def _mean_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    axes = list(range(len(x))) if a["axes"] is None else resolve_axes(node, a["axes"], len(x))
    a["axes"] = tuple(sorted(axes))
    return tuple(1 if i in axes else d for i, d in enumerate(x) if a["keepdims"] or i not in axes)


def _mean_evaluate(node, args):
    a = node.attrs
    return np.mean(args[0].astype(np.float64), axis=a["axes"], keepdims=a["keepdims"]).astype(np.float32)


def _mean_host(graph, node, target):
    # The kernel averages rows: the reduced axes are moved last and flattened.
    a = node.attrs
    x = graph.values[node.inputs[0]]
    shape, out_shape = tuple(x.shape), tuple(graph.values[node.output].shape)
    kept = [i for i in range(len(shape)) if i not in a["axes"]]
    order = kept + list(a["axes"])
    rows, length = math.prod(shape[i] for i in kept), math.prod(shape[i] for i in a["axes"])
    op = host.compile_mean(target, rows, length, dtype=x.dtype)

    def prepare(args):
        return op.pack_inputs(x=contiguous(args[0].transpose(order)).reshape(rows, length))
    return HostKernel(node, op, prepare, lambda out: out.reshape(out_shape))


# --- softmax -----------------------------------------------------------------------------

def _softmax_shape(graph, node, shapes):
    _resolved_axis(node, shapes[0])
    return tuple(shapes[0])


def _softmax_evaluate(node, args):
    axis = node.attrs["axis"]
    v = args[0].astype(np.float64)
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def _softmax_host(graph, node, target):
    # The kernel normalizes the last axis: another axis is moved there and back.
    axis = node.attrs["axis"]
    x = graph.values[node.inputs[0]]
    shape = tuple(x.shape)
    moved = shape[:axis] + shape[axis + 1:] + (shape[axis],)
    op = host.compile_softmax(target, moved, dtype=x.dtype)
    return HostKernel(node, op, lambda args: op.pack_inputs(x=contiguous(np.moveaxis(args[0], axis, -1))),
                      lambda out: np.moveaxis(out.reshape(moved), -1, axis))


# --- batch_norm --------------------------------------------------------------------------

def _batch_norm_shape(graph, node, shapes):
    x = shapes[0]
    if len(x) < 2 or any(s != (x[1],) for s in shapes[1:5]):
        raise fail(node, f"parameters must have shape [{x[1] if len(x) > 1 else '?'}]")
    return tuple(x)


def _batch_norm_evaluate(node, args):
    x = args[0]
    scale, shift, mean, var = (p.astype(np.float64) for p in args[1:5])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    factor = scale / np.sqrt(var + node.attrs["epsilon"])
    return ((x - mean.reshape(shape)) * factor.reshape(shape) + shift.reshape(shape)).astype(np.float32)


register(
    OpDef("softmax", "axis (float32 only)", (1, 1), _softmax_shape, _softmax_evaluate, attrs=("axis",),
          batch=lambda graph, node, shape, out, carried:
          "it normalizes over the batch axis" if node.attrs["axis"] % len(out) == 0 else None,
          host=_softmax_host, gpu=False),
    # int64 indices, from the float32 input (an int8 network dequantizes it: its order is the same,
    # but elements one int8 step apart may tie there, and the first of them is taken).
    OpDef("argmax", "axis (resolved), keepdims, last (the last of equal largest elements, else the first): "
                    "numpy's argmax, int64", (1, 1), _argmax_shape, _argmax_evaluate,
          attrs=("axis", "keepdims", "last"), out_dtype="int64",
          batch=lambda graph, node, shape, out, carried:
          "it compares the items of the batch" if node.attrs["axis"] == 0 else None,
          move=_argmax_evaluate),
    OpDef("reduce_mean", "axes (None: all; resolved), keepdims (float32 only)", (1, 1), _mean_shape, _mean_evaluate,
          attrs=("axes", "keepdims"),
          batch=lambda graph, node, shape, out, carried:
          "it averages over the batch axis" if 0 in node.attrs["axes"] else None,
          host=_mean_host, gpu=False),
    # Folded into the convolution before it, or into a multiply and an add (`fold_batch_norm`),
    # before anything compiles or quantizes it.
    OpDef("batch_norm", "inputs x, scale, bias, mean, var; epsilon", (5, 5), _batch_norm_shape, _batch_norm_evaluate,
          attrs=("epsilon",), int8=Int8.NONE, batch=per_item),
)
