"""Every graph operator, defined once (`OpDef`): the IR's operator set.

A definition gives an operator's arity and attributes, its shape rule, its numpy semantics,
its int8 policy, its batch policy and its host lowering; the passes (`passes.infer_shapes`,
`quantize`, `batch`), the reference (`evaluate`), the host runtime (`cpu_kernels`) and the
`.gfm` loader read them here, and the tables below are derived from them. The definitions
live by family:

- `linear`: conv2d, dense;
- `elementwise`: add, sub, mul, div, max, min, relu, clip and the float functions
  (`ops.functions`);
- `pooling`: max_pool, avg_pool;
- `layout`: reshape, transpose, slice, pad, identity, concat;
- `normalization`: softmax, reduce_mean, batch_norm;
- `quantization`: quantize, dequantize, requantize.

`table()` renders the operator table, which `compiler/EXTENDING.md` holds (a test keeps it
current) beside how to add an operator.
"""

from __future__ import annotations

from . import linear, elementwise, pooling, layout, normalization, quantization  # noqa: F401  (they register)
from .base import ATTRIBUTE_TYPES, OPERATORS, Int8, OpDef, fail, op_def, per_item

__all__ = ["OPERATORS", "OpDef", "Int8", "op_def", "fail", "per_item", "ATTRIBUTE_TYPES", "OPS", "BINARY_OPS",
           "FLOAT_FUNCTIONS", "FLOAT_ONLY", "table"]

#: Every operator, in the order of the operator table.
OPS = tuple(OPERATORS)
#: The element-wise operators of two tensors (numpy broadcasting).
BINARY_OPS = elementwise.BINARY_OPS
#: Element-wise functions of one tensor that only float32 computes.
FLOAT_FUNCTIONS = tuple(elementwise.FLOAT_FUNCTIONS)
#: Operators with no exact int8 form: an int8 network computes them in float32 on the CPU,
#: from their inputs dequantized, and the nodes reading them quantize their results.
FLOAT_ONLY = tuple(name for name, d in OPERATORS.items() if d.int8 == Int8.FLOAT)


def table() -> str:
    """The operator table as Markdown: each operator, its arity, its inputs and attributes, its
    int8 form and whether the GPU back end compiles it (else a network on the GPU runs it on the
    CPU)."""
    int8 = {Int8.FLOAT: "float32 (a float island)", Int8.PRODUCT: "int32 accumulation, requantizing shift",
            Int8.SHIFTED: "aligned by shifts, requantizing shift", Int8.COARSEST: "at the coarsest input scale",
            Int8.SAME_SCALE: "at its input's scale", Int8.NONE: "—"}
    rows = ["| op | arity | inputs and attributes | int8 | GPU |", "| --- | --- | --- | --- | --- |"]
    for name, d in OPERATORS.items():
        low, high = d.arity
        arity = f"{low}" if low == high else f"{low}+" if high is None else f"{low}–{high}"
        gpu = "—" if d.host is None else "yes" if d.gpu else "no (the CPU)"
        rows.append(f"| `{name}` | {arity} | {d.doc} | {int8[d.int8]} | {gpu} |")
    return "\n".join(rows) + "\n"
