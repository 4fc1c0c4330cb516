"""numpy semantics of every graph operator, float32 and int8: the graph's own reference.

The graph passes use it to fold constants and to calibrate quantization (the
float network on sample inputs); the tests use it as an independent check of
the compiled network on every device (float: to tolerance; int8: exactly).
Each operator's semantics is part of its definition (`operators`): floats compute
in float64 and round to float32 once; int8 operators compute in int64 with the
accelerator's requantization: ``clip((acc + bias) >> shift, lo, 127)`` (the rounding
term is part of the bias), element-wise ``(x << lx) ∘ (y << ly)`` shifted with
rounding (halves up).
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, GraphError, Node
from .numeric import dequantize_array, quantize_array, rounding_shift
from .operators import op_def

__all__ = ["evaluate", "evaluate_node", "quantize_array", "dequantize_array", "rounding_shift"]


def evaluate_node(node: Node, args: list[np.ndarray]) -> np.ndarray:
    """The output of ``node`` for input arrays ``args`` (numpy layouts)."""
    return op_def(node).evaluate(node, args)


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
