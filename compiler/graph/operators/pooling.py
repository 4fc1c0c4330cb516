"""Windows over an image: ``max_pool`` and ``avg_pool`` (global pools included)."""

from __future__ import annotations

import numpy as np

from ...ops import host
from ...ops.reference import avg_pool2d_reference, max_pool2d_reference
from ..kernels import HostKernel, contiguous, unary
from ..numeric import int8_clipped
from .base import Blocked, BlockedForm, Int8, OpDef, fail, per_item, register, window_out

#: The most bits an int8 average's output may be finer than its input (`quantize`): the
#: accelerator widens the window by 2^lshift in an int8 weight.
MAX_AVERAGE_LSHIFT = 6


def _pool_shape(graph, node, shapes):
    x, a = shapes[0], node.attrs
    if len(x) != 4:
        raise fail(node, f"the input must be NCHW (4-D), not {list(x)}")
    if a.get("global_pool"):
        a["kernel"] = (x[2], x[3])
    shift = a.get("lshift", 0)
    if node.op == "max_pool" and shift or not (isinstance(shift, int) and 0 <= shift <= MAX_AVERAGE_LSHIFT):
        raise fail(node, f"an average's lshift is a whole number from 0 to {MAX_AVERAGE_LSHIFT} (a max pool has "
                         f"none), not {shift!r}")
    oh, ow = window_out(node, x[2:])
    return (x[0], x[1], oh, ow)


def _pool_evaluate(node, args):
    a, x = node.attrs, args[0]
    if node.op == "max_pool":
        return max_pool2d_reference(x, a["kernel"], a["stride"], a["padding"], dilation=a.get("dilation", 1),
                                    ceil_mode=bool(a.get("ceil_mode")))
    if a.get("lshift"):
        # An output at a finer scale than the input: the mean of x << lshift, saturated.
        mean = avg_pool2d_reference(x.astype(np.int64) << a["lshift"], a["kernel"], a["stride"], a["padding"],
                                    dilation=a.get("dilation", 1), ceil_mode=bool(a.get("ceil_mode")),
                                    count_include_pad=a["count_include_pad"])
        return int8_clipped(mean)
    return avg_pool2d_reference(x, a["kernel"], a["stride"], a["padding"], dilation=a.get("dilation", 1),
                                ceil_mode=bool(a.get("ceil_mode")), count_include_pad=a["count_include_pad"])


def _pool_host(graph, node, target):
    a = node.attrs
    x = graph.values[node.inputs[0]]
    return unary(node, host.compile_pool2d(target, node.op.split("_")[0], tuple(x.shape), a["kernel"],
                                           stride=a["stride"], padding=a["padding"], dilation=a.get("dilation", 1),
                                           ceil_mode=bool(a.get("ceil_mode")), dtype=x.dtype,
                                           count_include_pad=a.get("count_include_pad", False),
                                           lshift=a.get("lshift", 0)))


def _pool_blocked(graph, node):
    """A float32 pool keeps its input's layout (and a partial block's zeros); one whose output is a
    pixel (a global pool) writes it in NCHW, the same bytes as blocked, whichever its input is."""
    out = graph.values[node.output].shape
    if graph.values[node.inputs[0]].dtype != "float32" or node.attrs.get("lshift"):
        return None
    return BlockedForm((), (0,), partial=True) if out[2] * out[3] == 1 else BlockedForm((0,), partial=True)


def _pool_blocked_host(graph, node, target, inputs, out):
    a = node.attrs
    x = graph.values[node.inputs[0]]
    op = host.compile_pool2d(target, node.op.split("_")[0], tuple(x.shape), a["kernel"], stride=a["stride"],
                             padding=a["padding"], dilation=a.get("dilation", 1), ceil_mode=bool(a.get("ceil_mode")),
                             dtype=x.dtype, count_include_pad=a.get("count_include_pad", False), blocked=True)
    shape = tuple(graph.values[node.output].shape)

    def one_pixel(result):
        # (N, C/16, 1, 1, 16) holds the pixel's channels in order, a partial block's padding last.
        return result.reshape(shape[0], -1)[:, :shape[1]].reshape(shape)
    return HostKernel(node, op, lambda args: op.pack_inputs(x=contiguous(args[0])),
                      (lambda result: result) if out else one_pixel)


_BLOCKED = Blocked(_pool_blocked, _pool_blocked_host)
_WINDOW_ATTRS = ("kernel", "stride", "padding")
register(
    OpDef("max_pool", "kernel, stride, dilation (pairs), padding (top, left, bottom, right; auto_pad until "
                      "`infer_shapes`), ceil_mode",
          (1, 1), _pool_shape, _pool_evaluate, attrs=_WINDOW_ATTRS, int8=Int8.SAME_SCALE, float_propagating=True,
          saturation_safe=True, batch=per_item, host=_pool_host, blocked=_BLOCKED),
    OpDef("avg_pool", "as max_pool, and count_include_pad, global; int8: lshift (its output that many bits finer "
                      "than its input)", (1, 1), _pool_shape, _pool_evaluate,
          attrs=_WINDOW_ATTRS, int8=Int8.SAME_SCALE, float_when_narrower=True, batch=per_item, host=_pool_host,
          blocked=_BLOCKED),
)
