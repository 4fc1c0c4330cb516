"""Whether a network compiled for batch B may run N·B items as N runs of B.

A model whose ONNX batch dimension is symbolic is compiled for one batch size and runs any
multiple of it in chunks (`gemforge.driver.model.Model.run`), the outputs concatenated along
axis 0. That equals running the whole batch only where every item is computed on its own:
axis 0 of every tensor derived from a batched input must stay the batch axis, and no node
may combine items (a Softmax or Concat over axis 0, a Reshape or Flatten that moves the
batch into other axes, a broadcast that shifts it). `batch_mixing` follows axis 0 through the
graph and names the first node that breaks this; the runtime then refuses to chunk.
"""

from __future__ import annotations

from .ir import BINARY_OPS, FLOAT_FUNCTIONS, Graph, Node

__all__ = ["batch_mixing", "batched_values"]

#: Operators that compute each item of their first input on its own (the other inputs are
#: weights, biases or statistics).
_PER_ITEM = {"conv2d", "max_pool", "avg_pool", "relu", *FLOAT_FUNCTIONS, "clip", "identity", "batch_norm", "quantize",
             "dequantize", "requantize"}


def _mixing(graph: Graph, node: Node, batched: set[str]) -> str | None:
    """Why ``node`` does not keep items apart (None when it does); ``batched`` holds the values
    whose axis 0 is the batch axis."""
    shape = {name: graph.values[name].shape for name in node.inputs}
    out = graph.values[node.output].shape
    carried = [i for i, name in enumerate(node.inputs) if name in batched]
    if node.op in _PER_ITEM:
        return None if carried == [0] else "its weights depend on the batch"
    if node.op == "dense":
        if carried != [0]:
            return "its right-hand operand depends on the batch"
        return None if len(shape[node.inputs[0]]) >= 2 else "it reduces over the batch axis"
    if node.op in BINARY_OPS:
        for i, name in enumerate(node.inputs):
            rank = len(shape[name])
            if i in carried and rank != len(out):
                return "broadcasting moves the batch axis"
            if i not in carried and rank == len(out) and shape[name][0] != 1:
                return f"its operand {name!r} has {shape[name][0]} rows, which do not broadcast over the batch"
        return None
    if node.op == "reshape":
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
    if node.op == "transpose":
        return None if node.attrs["perm"][0] == 0 else "it moves the batch axis"
    if node.op == "slice":
        a = node.attrs
        whole = a["starts"][0] == 0 and a["steps"][0] == 1 and a["shape"][0] == shape[node.inputs[0]][0]
        return None if whole else "it slices the batch axis"
    if node.op == "pad":
        return "it pads the batch axis" if node.attrs["pads"][0] or node.attrs["pads"][len(out)] else None
    if node.op == "concat":
        axis = node.attrs["axis"] % len(out)
        if axis == 0:
            return "it concatenates along the batch axis"
        return None if len(carried) == len(node.inputs) else "it joins batched and unbatched tensors"
    if node.op == "softmax":
        return "it normalizes over the batch axis" if node.attrs["axis"] % len(out) == 0 else None
    if node.op == "reduce_mean":
        return "it averages over the batch axis" if 0 in node.attrs["axes"] else None
    return f"gemforge does not know how {node.op} treats the batch axis"


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
