"""The int8 network's conversions: ``quantize``, ``dequantize`` and ``requantize``.

The int8 pipeline (`quantize`) inserts them: the network quantizes its float32 inputs at entry,
dequantizes its outputs at exit, and requantizes a tensor to a coarser scale where a concat
or an add needs its operands on one grid.
"""

from __future__ import annotations

from ...ops import host
from ..kernels import quantized_elementwise, unary
from ..numeric import dequantize_array, int8_clipped, quantize_array, rounding_shift
from .base import Int8, OpDef, per_item, register


def _same_shape(graph, node, shapes):
    return tuple(shapes[0])


def _quantize(node, args):
    return quantize_array(args[0], node.attrs["exponent"])


def _dequantize(node, args):
    return dequantize_array(args[0], node.attrs["exponent"])


def _requantize(node, args):
    return int8_clipped(rounding_shift(args[0].astype("int64"), node.attrs["shift"]))


def _quantize_host(graph, node, target):
    shape = tuple(graph.values[node.inputs[0]].shape)
    return unary(node, host.compile_quantize(target, shape, node.attrs["exponent"]))


def _requantize_host(graph, node, target):
    shape = tuple(graph.values[node.inputs[0]].shape)
    return unary(node, quantized_elementwise(target, "requantize", shape, None, (0, 0), node.attrs["shift"], False))


register(
    OpDef("quantize", "float32 → int8 at the output's exponent (round half to even; NaN → 0)", (1, 1), _same_shape,
          _quantize, attrs=("exponent",), out_dtype="int8", int8=Int8.NONE, batch=per_item, host=_quantize_host,
          gpu=False),
    OpDef("dequantize", "int8 → float32", (1, 1), _same_shape, _dequantize, attrs=("exponent",),
          out_dtype="float32", int8=Int8.NONE, batch=per_item, move=_dequantize),
    OpDef("requantize", "int8 → int8 at another exponent (rounded shift)", (1, 1), _same_shape, _requantize,
          attrs=("shift",), out_dtype="int8", int8=Int8.NONE, batch=per_item, host=_requantize_host),
)
