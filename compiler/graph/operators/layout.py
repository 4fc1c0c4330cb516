"""Operators that move data without arithmetic: reshape, transpose, slice, pad, identity, concat."""

from __future__ import annotations

import math

import numpy as np

from ...ops import host
from ..kernels import unary
from .base import Int8, OpDef, check_rank, fail, per_item, register, resolve_axes


def _unary_host(compile_op):
    """A host lowering by ``compile_op(target, shape, attrs, dtype)``, a kernel of one input."""
    def lower(graph, node, target):
        x = graph.values[node.inputs[0]]
        return unary(node, compile_op(target, tuple(x.shape), node.attrs, x.dtype))
    return lower


# --- reshape -----------------------------------------------------------------------------

def _reshape_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    if "flatten_axis" in a:
        axis = a["flatten_axis"] + (len(x) if a["flatten_axis"] < 0 else 0)
        if not 0 <= axis <= len(x):
            raise fail(node, f"axis {a['flatten_axis']} is out of range for rank {len(x)}")
        shape = (math.prod(x[:axis]), math.prod(x[axis:]))
    elif "squeeze" in a:
        if a["squeeze"] is None:
            axes = [i for i, d in enumerate(x) if d == 1]
        else:
            # Repeated axes squeeze once, as in ONNX Runtime.
            axes = sorted(set(resolve_axes(node, a["squeeze"], len(x), repeats=True)))
            wide = [f"{i} ({x[i]})" for i in axes if x[i] != 1]
            if wide:
                raise fail(node, f"it squeezes axes of size 1 only, not axis {', '.join(wide)} of {list(x)}")
        a["squeeze"] = tuple(axes)
        shape = tuple(d for i, d in enumerate(x) if i not in axes)
    elif "unsqueeze" in a:
        rank = len(x) + len(a["unsqueeze"])
        check_rank(node, rank)
        axes = resolve_axes(node, a["unsqueeze"], rank, of="output")
        a["unsqueeze"] = tuple(sorted(axes))
        rest = iter(x)
        shape = tuple(1 if i in axes else next(rest) for i in range(rank))
    else:
        target = list(a["target"])
        check_rank(node, len(target))
        for i, d in enumerate(target):
            if d == 0 and not a.get("allowzero"):
                if i >= len(x):
                    raise fail(node, f"target {list(a['target'])} copies dimension {i} of a rank-{len(x)} input")
                target[i] = x[i]
        if target.count(-1) > 1 or any(d < -1 for d in target):
            raise fail(node, f"target shape {list(a['target'])} is invalid")
        if -1 in target:
            known = math.prod(d for d in target if d != -1)
            if known == 0 or math.prod(x) % known:
                raise fail(node, f"cannot reshape {list(x)} to {list(a['target'])}")
            target[target.index(-1)] = math.prod(x) // known
        shape = tuple(target)
    if math.prod(shape) != math.prod(x):
        raise fail(node, f"cannot reshape {list(x)} ({math.prod(x)} elements) to {list(shape)}")
    a["shape"] = tuple(int(d) for d in shape)
    return a["shape"]


def _reshape_batch(graph, node, shape, out, carried):
    # By what it asks for, not by the compiled shapes (with batch 1, Flatten(axis=0) gives
    # [1, k] too): the batch axis stays where Flatten keeps axis 0, Squeeze and Unsqueeze
    # leave it alone or Reshape copies it (0) or infers it (-1) with the rest of each
    # item's shape given.
    a, rank = node.attrs, len(shape[node.inputs[0]])
    if "flatten_axis" in a:
        keeps = (a["flatten_axis"] + (rank if a["flatten_axis"] < 0 else 0)) >= 1
    elif "squeeze" in a or "unsqueeze" in a:
        keeps = 0 not in a.get("squeeze", a.get("unsqueeze"))
    else:
        first = a["target"][0] if len(a["target"]) else None
        keeps = (first == 0 and not a.get("allowzero")) or (first == -1 and out[0] == shape[node.inputs[0]][0])
    return None if keeps else "it reshapes across the batch axis"


# --- transpose ---------------------------------------------------------------------------

def _transpose_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    perm = tuple(range(len(x)))[::-1] if a["perm"] is None else tuple(a["perm"])
    if sorted(perm) != list(range(len(x))):
        raise fail(node, f"perm {list(perm)} must be a permutation of the input's axes, {list(range(len(x)))} "
                         f"(the input is {list(x)})")
    a["perm"] = perm
    return tuple(x[p] for p in perm)


# --- slice -------------------------------------------------------------------------------

def _slice_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    starts, steps, out = (tuple(a[k]) for k in ("starts", "steps", "shape"))
    if not len(starts) == len(steps) == len(out) == len(x):
        raise fail(node, f"starts, steps and shape must give one value per axis of the input {list(x)}")
    for axis, (d, start, step, n) in enumerate(zip(x, starts, steps, out)):
        last = start + (n - 1) * step
        if step == 0 or n < 1 or not (0 <= start < d and 0 <= last < d):
            raise fail(node, f"axis {axis}: {n} elements from {start} by steps of {step} do not lie in its {d}")
    return out


def _slice_evaluate(node, args):
    a = node.attrs
    index = np.ix_(*(start + step * np.arange(n) for start, step, n in zip(a["starts"], a["steps"], a["shape"])))
    return np.ascontiguousarray(args[0][index])


def _slice_batch(graph, node, shape, out, carried):
    a = node.attrs
    whole = a["starts"][0] == 0 and a["steps"][0] == 1 and a["shape"][0] == shape[node.inputs[0]][0]
    return None if whole else "it slices the batch axis"


# --- pad ---------------------------------------------------------------------------------

def _pad_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    axes = list(range(len(x))) if a.get("axes") is None else resolve_axes(node, a["axes"], len(x))
    if len(a["pads"]) != 2 * len(axes):
        raise fail(node, f"pads {list(a['pads'])} must give a start and an end for each of the {len(axes)} "
                         "padded axes")
    before, after = [0] * len(x), [0] * len(x)
    for k, axis in enumerate(axes):
        before[axis], after[axis] = a["pads"][k], a["pads"][k + len(axes)]
    a["pads"], a["axes"] = tuple(before + after), None
    return tuple(d + b + e for d, b, e in zip(x, before, after))


def _pad_evaluate(node, args):
    x, a = args[0], node.attrs
    if x.ndim == 0:
        # A scalar has no axes to pad (its pads are empty), and np.pad refuses an empty list.
        return x.copy()
    return np.pad(x, list(zip(a["pads"][:x.ndim], a["pads"][x.ndim:])), constant_values=a["value"])


def _pad_batch(graph, node, shape, out, carried):
    return "it pads the batch axis" if node.attrs["pads"][0] or node.attrs["pads"][len(out)] else None


def _pad_on_grid(attrs: dict, e: int) -> dict:
    attrs["value"] = int(attrs["value"] * 2.0 ** e)
    return attrs


# --- concat ------------------------------------------------------------------------------

def _concat_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    axis = a["axis"] + (len(x) if a["axis"] < 0 else 0)
    if not 0 <= axis < len(x):
        raise fail(node, f"axis {a['axis']} is out of range for rank {len(x)}")
    a["axis"] = axis
    for s in shapes[1:]:
        if len(s) != len(x) or any(d != e for i, (d, e) in enumerate(zip(s, x)) if i != axis):
            raise fail(node, f"inputs {[list(s) for s in shapes]} differ outside axis {axis}")
    return tuple(x[:axis]) + (sum(s[axis] for s in shapes),) + tuple(x[axis + 1:])


def _concat_evaluate(node, args):
    return np.concatenate(args, axis=node.attrs["axis"])


def _concat_batch(graph, node, shape, out, carried):
    if node.attrs["axis"] % len(out) == 0:
        return "it concatenates along the batch axis"
    return None if len(carried) == len(node.inputs) else "it joins batched and unbatched tensors"


# --- take --------------------------------------------------------------------------------

def _take_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    if not x:
        raise fail(node, "it takes along an axis of a tensor of at least one")
    axis = a["axis"] + (len(x) if a["axis"] < 0 else 0)
    if not 0 <= axis < len(x):
        raise fail(node, f"axis {a['axis']} is out of range for rank {len(x)}")
    a["axis"] = axis
    indices = tuple(a["indices"])
    if not indices or min(indices) < 0 or max(indices) >= x[axis]:
        raise fail(node, f"indices must name at least one position of axis {axis}, each from 0 to {x[axis] - 1}")
    return tuple(x[:axis]) + (len(indices),) + tuple(x[axis + 1:])


def _take_evaluate(node, args):
    return np.take(args[0], np.asarray(node.attrs["indices"], np.int64), axis=node.attrs["axis"])


def _take_batch(graph, node, shape, out, carried):
    return "it gathers along the batch axis" if node.attrs["axis"] == 0 else None


def _reshape_move(node, args):
    return args[0].reshape(node.attrs["shape"])


def _copy(node, args):
    return args[0].copy()


register(
    OpDef("reshape", "shape (resolved from one of: target, a Reshape's shape; flatten_axis; squeeze, the axes "
                     "removed (None: every axis of size 1); unsqueeze, the axes inserted), the data unchanged",
          (1, 1), _reshape_shape, _reshape_move, attrs=("shape",), int8=Int8.SAME_SCALE, float_propagating=True,
          saturation_safe=True, batch=_reshape_batch, move=_reshape_move),
    OpDef("transpose", "perm (None: the axes reversed; resolved), numpy's transpose", (1, 1), _transpose_shape,
          lambda node, args: np.ascontiguousarray(args[0].transpose(node.attrs["perm"])), attrs=("perm",),
          int8=Int8.SAME_SCALE, float_propagating=True, saturation_safe=True,
          batch=lambda graph, node, shape, out, carried: None if node.attrs["perm"][0] == 0 else "it moves the batch axis",
          host=_unary_host(lambda target, shape, a, dtype: host.compile_transpose(target, shape, a["perm"], dtype=dtype))),
    OpDef("slice", "starts, steps, shape (one each per axis): out[i] = x[starts + i · steps], i < shape (numpy's "
                   "x[start::step] cut to shape; negative steps read backwards)",
          (1, 1), _slice_shape, _slice_evaluate, attrs=("starts", "steps", "shape"), int8=Int8.SAME_SCALE,
          float_propagating=True, saturation_safe=True, batch=_slice_batch,
          host=_unary_host(lambda target, shape, a, dtype: host.compile_slice(target, shape, a["starts"], a["steps"],
                                                                              a["shape"], dtype=dtype))),
    OpDef("pad", "pads (the starts of the padded axes, then their ends), axes (None: all; resolved to all), value "
                 "(int8: an integer, the constant on the input's grid)",
          (1, 1), _pad_shape, _pad_evaluate, attrs=("pads", "value"), int8=Int8.SAME_SCALE, on_grid=_pad_on_grid,
          batch=_pad_batch,
          host=_unary_host(lambda target, shape, a, dtype: host.compile_pad(target, shape, a["pads"], a["value"],
                                                                            dtype=dtype))),
    OpDef("identity", "— (a copy under a model output's ONNX name)", (1, 1),
          lambda graph, node, shapes: tuple(shapes[0]), _copy, int8=Int8.SAME_SCALE, saturation_safe=True,
          batch=per_item, move=_copy),
    OpDef("take", "axis, indices (positions along it, constant): numpy's take, out = x[..., indices, ...]",
          (1, 1), _take_shape, _take_evaluate, attrs=("axis", "indices"), int8=Int8.SAME_SCALE,
          float_propagating=True, saturation_safe=True, batch=_take_batch, move=_take_evaluate),
    OpDef("concat", "axis", (1, None), _concat_shape, _concat_evaluate, attrs=("axis",), same_dtype=None,
          int8=Int8.COARSEST, batch=_concat_batch, move=_concat_evaluate),
)
