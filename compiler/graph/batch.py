"""Whether a network compiled for batch B may run N·B items as N runs of B.

A model whose ONNX batch dimension is symbolic is compiled for one batch size and runs any
multiple of it in chunks (`gemforge.driver.runtime.model.Model.run`), the outputs concatenated along
axis 0. That equals running the whole batch only where every item is computed on its own:
axis 0 of every tensor derived from a batched input must stay the batch axis, and no node
may combine items (a Softmax or Concat over axis 0, a Reshape or Flatten that moves the
batch into other axes, a broadcast that shifts it). `batch_mixing` follows axis 0 through the
graph and names the first node that breaks this; the runtime then refuses to chunk.
"""

from __future__ import annotations

from .ir import Graph, Node
from .operators import op_def

__all__ = ["batch_mixing", "batched_values"]


def _mixing(graph: Graph, node: Node, batched: set[str]) -> str | None:
    """Why ``node`` does not keep items apart (None when it does), by its operator's batch rule
    (``OpDef.batch``); ``batched`` holds the values whose axis 0 is the batch axis."""
    rule = op_def(node).batch
    if rule is None:
        return f"gemforge does not know how {node.op} treats the batch axis"
    shape = {name: graph.values[name].shape for name in node.inputs}
    out = graph.values[node.output].shape
    carried = [i for i, name in enumerate(node.inputs) if name in batched]
    return rule(graph, node, shape, out, carried)


def batch_mixing(graph: Graph, batched_inputs: list[str]) -> str | None:
    """The first node of ``graph`` that combines or moves items of the batch (axis 0 of
    ``batched_inputs``), as "node NAME (OP): why", or None where the items stay apart."""
    batched = set(batched_inputs)
    for node in graph.nodes:
        if not any(name in batched for name in node.inputs):
            continue
        shapes = [graph.values[name].shape for name in (*node.inputs, node.output)]
        if any(shape is None for shape in shapes):
            return f"node {node.name} ({node.op}): its shapes are unknown"
        if any(len(graph.values[name].shape) == 0 for name in (*node.inputs, node.output) if name in batched) \
                or len(shapes[-1]) == 0:
            return f"node {node.name} ({node.op}): its output has no batch axis"
        why = _mixing(graph, node, batched)
        if why is not None:
            return f"node {node.name} ({node.op}): {why}"
        batched.add(node.output)
    return None


def batched_values(graph: Graph, batched_inputs: list[str]) -> set[str]:
    """The tensors that carry the batch: ``batched_inputs`` and everything computed from them.
    A run in chunks concatenates these outputs; any other output is the same in every chunk."""
    batched = set(batched_inputs)
    for node in graph.nodes:
        if any(name in batched for name in node.inputs):
            batched.add(node.output)
    return batched
