"""Products accumulated over a reduction: ``conv2d`` and ``dense`` (the accelerator's layers)."""

from __future__ import annotations

import numpy as np

from ...ops import host
from ...ops.common import reference_epilogue, window_count
from ...ops.reference import conv2d_reference
from ..kernels import HostKernel, contiguous, with_weights
from .base import Blocked, BlockedForm, Int8, OpDef, fail, nonnegative, padding, per_item, register, same_padding

#: The largest float32: the kernels take finite bounds, and ±FLT_MAX clips nothing a float32 holds.
_FLOAT_MAX = float(np.finfo(np.float32).max)


# --- conv2d ------------------------------------------------------------------------------

def _conv2d_shape(graph, node, shapes):
    x, w = shapes[0], shapes[1]
    a = node.attrs
    if len(x) != 4:
        raise fail(node, f"the input must be NCHW (4-D), not {list(x)}")
    groups = a["groups"]
    if groups < 1 or x[1] != w[1] * groups or w[0] % groups:
        raise fail(node, f"input channels {x[1]}, weight {list(w)} and group {groups} do not agree")
    residual = a.get("residual", False)
    if residual and (len(shapes) != 4 or graph.values[node.inputs[0]].dtype != "float32" or groups != 1):
        raise fail(node, "a fused residual add (residual) takes a float32 convolution of one group with a bias and "
                         "the residual as its fourth input")
    if len(shapes) > 3 and not residual:
        raise fail(node, "a fourth input is the residual of a fused add; the node has no residual attribute")
    if len(shapes) > 2 and shapes[2] != (w[0],):
        raise fail(node, f"the bias must have shape [{w[0]}], not {list(shapes[2])}")
    stride = a["stride"]
    if "auto_pad" in a:
        a["padding"] = same_padding(node, x[2:], w[2:], (stride, stride))
    pads = padding(node)
    # One value where every side is alike; else `pad_convolutions` splits it off.
    a["padding"] = pads[0] if len(set(pads)) == 1 else pads
    oh, ow = window_count(x[2], w[2], stride, pads[0], pads[2]), window_count(x[3], w[3], stride, pads[1], pads[3])
    if oh < 1 or ow < 1:
        raise fail(node, f"a {w[2]}x{w[3]} kernel does not fit a {x[2]}x{x[3]} input with padding {list(pads)}")
    if residual and shapes[3] != (x[0], w[0], oh, ow):
        raise fail(node, f"the residual must have the output's shape {[x[0], w[0], oh, ow]}, not {list(shapes[3])}")
    dtype = graph.values[node.inputs[0]].dtype
    if dtype == "int8" and "hi" in a and "lo" not in a:
        if isinstance(a["hi"], bool) or not isinstance(a["hi"], int) or not (0 if a["relu"] else -128) <= a["hi"] <= 127:
            raise fail(node, f"a fused int8 clip's upper bound hi is an integer from {0 if a['relu'] else -128} to 127, "
                             f"not {a['hi']!r}")
    elif ("lo" in a or "hi" in a) and not (dtype == "float32" and "lo" in a and "hi" in a and a["lo"] <= a["hi"]):
        raise fail(node, f"a fused clip takes bounds lo ≤ hi, both, on a float32 convolution (an int8 one hi alone), "
                         f"not lo={a.get('lo')}, hi={a.get('hi')} on {dtype}")
    return (x[0], w[0], oh, ow)


def _conv2d_evaluate(node, args):
    a, x = node.attrs, args[0]
    bias = args[2] if len(args) > 2 else None
    if x.dtype.kind == "f":
        if a.get("residual"):           # added before the ReLU, as the kernel's epilogue does
            out = conv2d_reference(x, args[1], bias, a["stride"], a["padding"], groups=a["groups"]) + args[3]
            out = np.maximum(out, 0).astype(out.dtype) if a["relu"] else out
        else:
            out = conv2d_reference(x, args[1], bias, a["stride"], a["padding"], relu=a["relu"], groups=a["groups"])
        return np.clip(out, a["lo"], a["hi"]).astype(out.dtype) if "lo" in a else out
    out = conv2d_reference(x, args[1], bias, a["stride"], a["padding"], shift=a["shift"], relu=a["relu"],
                           groups=a["groups"])
    return np.minimum(out, a["hi"]).astype(out.dtype) if "hi" in a else out


def _conv2d_host(graph, node, target):
    a = node.attrs
    shapes = [tuple(graph.values[i].shape) for i in node.inputs]
    dtype = graph.values[node.inputs[0]].dtype
    residual = bool(a.get("residual"))
    if _is_dense(graph, node, shapes) and not residual and "lo" not in a:
        return _conv2d_as_dense(graph, node, target, shapes, dtype)
    op = host.compile_conv2d(target, shapes[0], shapes[1], stride=a["stride"], padding=a["padding"],
                             groups=a["groups"], dtype=dtype, bias=len(shapes) > 2,
                             shift=a.get("shift") if dtype == "int8" else None, relu=a["relu"],
                             clip=(max(a["lo"], -_FLOAT_MAX), min(a["hi"], _FLOAT_MAX)) if "lo" in a else None,
                             hi=a.get("hi") if dtype == "int8" else None, residual=residual,
                             nonnegative=dtype == "int8" and nonnegative(graph, node.inputs[0]))
    if not residual:
        return with_weights(node, op, "x", "w", shapes[0], [graph.constants.get(i) for i in node.inputs],
                            lambda out: out)
    # Weights and bias packed once (`fuse_residual_adds` fuses into constant ones); the input and
    # the residual are passed as they come.
    packed = op.pack_inputs(x=np.zeros(shapes[0], np.float32), w=graph.constants[node.inputs[1]],
                            bias=graph.constants[node.inputs[2]], residual=np.zeros(shapes[3], np.float32))
    x_layout, rows = packed.pop("x").shape, packed.pop("residual").shape

    def prepare(args):
        return dict(packed, x=contiguous(args[0]).reshape(x_layout), residual=contiguous(args[3]).reshape(rows))
    return HostKernel(node, op, prepare)


def _conv2d_blocked(graph, node):
    """A float32 convolution with constant weights: of one group, it reads either layout and
    writes either (its residual in its output's); depthwise (a channel to a channel), its input's.
    Either reads a partial block's padding times zero weights and writes zeros there."""
    a = node.attrs
    shapes = [tuple(graph.values[i].shape) for i in node.inputs]
    if graph.values[node.inputs[0]].dtype != "float32" or not all(graph.is_constant(i) for i in node.inputs[1:3]) \
            or _is_dense(graph, node, shapes) or not isinstance(a["padding"], int):
        return None
    x, w = shapes[0], shapes[1]
    if a["groups"] == 1:
        return BlockedForm((3,) if a.get("residual") else (), (0,), partial=True)
    if a["groups"] == x[1] == w[0] and w[1] == 1 and w[2] * w[3] > 1:
        return BlockedForm((0,), partial=True)
    return None


def _conv2d_blocked_host(graph, node, target, inputs, out):
    a = node.attrs
    shapes = [tuple(graph.values[i].shape) for i in node.inputs]
    residual = bool(a.get("residual"))
    op = host.compile_conv2d(target, shapes[0], shapes[1], stride=a["stride"], padding=a["padding"],
                             groups=a["groups"], dtype="float32", bias=len(shapes) > 2, relu=a["relu"],
                             clip=(max(a["lo"], -_FLOAT_MAX), min(a["hi"], _FLOAT_MAX)) if "lo" in a else None,
                             residual=residual, blocked_in=inputs[0], blocked_out=out)
    out_shape = host.blocked_shape(shapes[3]) if residual and out else shapes[3] if residual else None
    packed = op.pack_inputs(x=np.zeros(host.blocked_shape(shapes[0]) if inputs[0] else shapes[0], np.float32),
                            w=graph.constants[node.inputs[1]],
                            bias=graph.constants[node.inputs[2]] if len(shapes) > 2 else None,
                            **({"residual": np.zeros(out_shape, np.float32)} if residual else {}))
    x_layout = packed.pop("x").shape
    rows = packed.pop("residual").shape if residual else None

    def prepare(args):
        added = {"residual": contiguous(args[3]).reshape(rows)} if residual else {}
        return dict(packed, x=contiguous(args[0]).reshape(x_layout), **added)
    return HostKernel(node, op, prepare)


def _is_dense(graph, node, shapes) -> bool:
    """Whether a convolution is a dense layer: a 1×1 kernel of one group over a 1×1 image (a
    classifier after a global pool, as the int8 pipeline writes it: `image_dense`)."""
    a = node.attrs
    return len(shapes[0]) == 4 and tuple(shapes[0][2:]) == (1, 1) and tuple(shapes[1][2:]) == (1, 1) \
        and a["groups"] == 1 and a["stride"] == 1 and a["padding"] == 0 and graph.is_constant(node.inputs[1])


def _conv2d_as_dense(graph, node, target, shapes, dtype):
    """A dense layer written as a convolution (`_is_dense`) as the dense kernel: a convolution's
    product vectorizes the pixels, of which there is one."""
    a = node.attrs
    (n, c), o = shapes[0][:2], shapes[1][0]
    op = host.compile_dense(target, n, c, o, dtype=dtype, bias=len(shapes) > 2,
                            shift=a.get("shift") if dtype == "int8" else None, relu=a["relu"],
                            hi=a.get("hi") if dtype == "int8" else None, constant_b=True)
    const = [None, graph.constants[node.inputs[1]].reshape(o, c).T,
             graph.constants.get(node.inputs[2]) if len(node.inputs) > 2 else None]
    return with_weights(node, op, "a", "b", (n, c), const[:len(node.inputs)], lambda out: out.reshape(n, o, 1, 1))


# --- dense -------------------------------------------------------------------------------

def _dense_shape(graph, node, shapes):
    x, w = shapes[0], shapes[1]
    if len(w) != 2 or (not node.attrs.get("matmul") and len(x) != 2) or len(x) < 1 or x[-1] != w[0]:
        raise fail(node, f"cannot multiply {list(x)} by {list(w)}; supported: (…, K) @ (K, N)")
    if len(x) != 2 and not graph.is_constant(node.inputs[1]):
        raise fail(node, f"a product by a right-hand operand that is not a constant needs a 2-D left-hand "
                         f"operand (M, K), not {list(x)} @ {list(w)}")
    if len(shapes) > 2 and shapes[2] != (w[1],):
        raise fail(node, f"the bias must have shape [{w[1]}], not {list(shapes[2])}")
    return tuple(x[:-1]) + (w[1],)


def _dense_evaluate(node, args):
    a, x = node.attrs, args[0]
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    if x.dtype.kind == "f":
        value = flat.astype(np.float64) @ args[1].astype(np.float64)
        if len(args) > 2:
            value = value + args[2].astype(np.float64)
        out = (np.maximum(value, 0) if a["relu"] else value).astype(np.float32)
    else:
        acc = flat.astype(np.int64) @ args[1].astype(np.int64)
        out = reference_epilogue(acc, args[2] if len(args) > 2 else None, a["shift"], a["relu"], 1)
    return out.reshape(lead + (out.shape[-1],))


def _dense_batch(graph, node, shape, out, carried):
    if carried != [0]:
        return "its right-hand operand depends on the batch"
    return None if len(shape[node.inputs[0]]) >= 2 else "it reduces over the batch axis"


def _dense_host(graph, node, target):
    a = node.attrs
    shapes = [tuple(graph.values[i].shape) for i in node.inputs]
    out_shape = tuple(graph.values[node.output].shape)
    dtype = graph.values[node.inputs[0]].dtype
    m = int(np.prod(shapes[0][:-1]))
    k, n = shapes[1]
    op = host.compile_dense(target, m, k, n, dtype=dtype, bias=len(shapes) > 2,
                            shift=a.get("shift") if dtype == "int8" else None, relu=a["relu"],
                            constant_b=node.inputs[1] in graph.constants)
    return with_weights(node, op, "a", "b", (m, k), [graph.constants.get(i) for i in node.inputs],
                        lambda out: out.reshape(out_shape))


# --- unfold ------------------------------------------------------------------------------

def _unfold_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    if len(x) != 4:
        raise fail(node, f"the input must be NCHW (4-D), not {list(x)}")
    (kh, kw), stride, pads = tuple(a["kernel"]), a["stride"], padding(node)
    oh, ow = window_count(x[2], kh, stride, pads[0], pads[2]), window_count(x[3], kw, stride, pads[1], pads[3])
    if oh < 1 or ow < 1:
        raise fail(node, f"a {kh}x{kw} window does not fit a {x[2]}x{x[3]} input with padding {list(pads)}")
    return (x[0], x[1] * kh * kw, oh, ow)


def _unfold_evaluate(node, args):
    """Channel c·kh·kw + i·kw + j of output pixel (y, x) is input channel c at (y·stride + i − top,
    x·stride + j − left), zero outside: a convolution's patches, in its weights' (I, H, W) order."""
    a, x = node.attrs, args[0]
    (kh, kw), stride = tuple(a["kernel"]), a["stride"]
    top, left, bottom, right = padding(node)
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c = x.shape[:2]
    oh = (padded.shape[2] - kh) // stride + 1
    ow = (padded.shape[3] - kw) // stride + 1
    taps = [padded[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            for i in range(kh) for j in range(kw)]
    return np.stack(taps, axis=2).reshape(n, c * kh * kw, oh, ow)


def _unfold_host(graph, node, target):
    a = node.attrs
    shape = tuple(graph.values[node.inputs[0]].shape)
    return HostKernel(node, host.compile_unfold(target, shape, tuple(a["kernel"]), a["stride"], padding(node),
                                                dtype=graph.values[node.inputs[0]].dtype),
                      lambda args: {"x": contiguous(args[0])})


register(
    OpDef("conv2d",
          "inputs x, w (OIHW; a dilated kernel spread out with zeros), [bias]; stride, padding (every side; until "
          "`pad_convolutions` also (top, left, bottom, right) or auto_pad), groups, relu; float32: lo, hi (a "
          "fused Clip, `fuse_clips`), residual (a fused Add: a fourth input, of the output's shape, added before "
          "the ReLU, `fuse_residual_adds`); int8: shift (requantization into the output's scale), hi (a fused "
          "Clip's upper bound, `fuse_clips`)",
          (2, 4), _conv2d_shape, _conv2d_evaluate, attrs=("stride", "padding", "groups", "relu"),
          int8_attrs=("shift",), same_dtype=0, int8=Int8.PRODUCT, batch=per_item, host=_conv2d_host,
          blocked=Blocked(_conv2d_blocked, _conv2d_blocked_host)),
    # The patches of a convolution with few input channels, so that a 1×1 convolution over them
    # fills the accelerator's reduction (`unfold.unfold_small_channel_convs`).
    OpDef("unfold", "kernel (kh, kw), stride, padding (every side, or (top, left, bottom, right)): out channel "
                    "c·kh·kw + i·kw + j at (y, x) = x[c, y·stride + i − top, x·stride + j − left], 0 outside",
          (1, 1), _unfold_shape, _unfold_evaluate, attrs=("kernel", "stride", "padding"), int8=Int8.SAME_SCALE,
          batch=per_item, host=_unfold_host, gpu=False),
    OpDef("dense", "inputs a (M, K), w (K, N), [bias]; relu; int8: shift",
          (2, 3), _dense_shape, _dense_evaluate, attrs=("relu",), int8_attrs=("shift",), same_dtype=2,
          int8=Int8.PRODUCT, batch=_dense_batch, host=_dense_host),
)
