"""The graph passes, in the order the pipeline runs them (`float_pipeline`, `int8_pipeline`).

Each pass is a plain function ``Graph → Graph`` (it may update the graph in
place and return it); `run_passes` runs a list of them and, with ``trace``,
prints the graph after each one.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ops.common import four_pads
from .evaluate import evaluate_node
from .ir import MAX_DIM, MAX_ELEMENTS, Graph, GraphError, Node, Value
from .operators import fail, op_def

__all__ = ["infer_shapes", "output_shape", "pad_convolutions", "fold_constants", "fold_batch_norm", "fuse", "fuse_clips",
           "fuse_scale_shift",
           "run_passes", "GraphPass"]

GraphPass = Callable[[Graph], Graph]


def output_shape(graph: Graph, node: Node) -> tuple[int, ...]:
    """The output shape of ``node`` by its operator's shape rule, which checks its inputs and
    resolves its shape-dependent attributes."""
    definition = op_def(node)
    definition.check_arity(node)
    shapes = [graph.values[i].shape for i in node.inputs]
    same = node.inputs if definition.same_dtype is None else node.inputs[:definition.same_dtype]
    dtypes = {graph.values[i].dtype for i in same}
    if len(dtypes) > 1:
        raise fail(node, f"its inputs have different types ({', '.join(sorted(dtypes))}); ONNX needs one")
    return definition.shape(graph, node, shapes)


def infer_shapes(graph: Graph) -> Graph:
    """Every tensor's shape and type, checked node by node; shape-dependent attributes
    (reshape targets, global pooling windows, negative axes) resolved."""
    indices: set[str] = set()        # int64 results of an index operator (argmax) and copies of them
    for node in graph.nodes:
        for i in node.inputs:
            if graph.values[i].shape is None:
                raise fail(node, f"input {i!r} has no known shape")
        if op_def(node).out_dtype == "int64" or (node.op == "identity" and node.inputs[0] in indices):
            indices.add(node.output)
        elif indices.intersection(node.inputs):
            raise fail(node, "it reads int64 indices (an ArgMax's or ArgMin's), which gemforge computes for the "
                             "model's outputs only")
        value = graph.values[node.output]
        value.shape = output_shape(graph, node)
        if value.shape and (max(value.shape) > MAX_DIM or math.prod(value.shape) > MAX_ELEMENTS):
            raise fail(node, f"its output would have shape {list(value.shape)}, beyond what gemforge compiles "
                              f"(dimensions up to {MAX_DIM:,} and {MAX_ELEMENTS:,} elements in all)")
        if 0 in value.shape:
            # A zero-size constant operand (a weight of shape [0, K]) gives an empty result,
            # which no kernel computes: refused here rather than when the model runs.
            raise fail(node, f"its output would have shape {list(value.shape)}, with no elements; gemforge "
                              "compiles tensors of one element or more")
        value.dtype = op_def(node).out_dtype or graph.values[node.inputs[0]].dtype
    return graph


def pad_convolutions(graph: Graph) -> Graph:
    """A convolution padded unevenly (ONNX's pads [0, 0, 1, 1], which SAME gives at stride 2)
    keeps the part common to every side and takes the rest from a zero ``pad`` node before it:
    the convolution kernels, and the accelerator's DMA, pad every side alike."""
    kept = []
    for node in graph.nodes:
        if node.op == "conv2d" and not isinstance(node.attrs["padding"], int):
            pads = four_pads(node.attrs["padding"])
            common = min(pads)
            rest = [p - common for p in pads]
            x = graph.values[node.inputs[0]]
            padded = graph.fresh_name(f"{node.inputs[0]}/pad")
            n, c, h, w = x.shape
            graph.values[padded] = Value(padded, (n, c, h + rest[0] + rest[2], w + rest[1] + rest[3]), x.dtype)
            kept.append(Node("pad", f"{node.name}/pad", [node.inputs[0]], padded,
                             {"pads": (0, 0, rest[0], rest[1], 0, 0, rest[2], rest[3]), "axes": None, "value": 0.0}))
            node.inputs = [padded, *node.inputs[1:]]
            node.attrs["padding"] = common
        kept.append(node)
    graph.nodes = kept
    return graph


def fold_constants(graph: Graph) -> Graph:
    """Nodes whose inputs are all constants are evaluated now (numpy) and become constants."""
    kept = []
    for node in graph.nodes:
        if all(graph.is_constant(i) for i in node.inputs):
            graph.constants[node.output] = evaluate_node(node, [graph.constants[i] for i in node.inputs])
        else:
            kept.append(node)
    graph.nodes = kept
    for o in graph.outputs:
        if graph.is_constant(o):
            raise GraphError(f"model output {o!r} does not depend on the inputs")
    graph.prune()
    return graph


def _take_output(graph: Graph, node: Node, output: str, producer: dict[str, Node]) -> None:
    """``node`` writes ``output`` (the name of the node folded into it) instead of its own
    output, which nothing else reads: model outputs keep their ONNX names."""
    shape = graph.values[output].shape
    del graph.values[node.output], producer[node.output]
    node.output = output
    graph.values[output].shape = shape
    producer[output] = node


def fold_batch_norm(graph: Graph) -> Graph:
    """``BatchNormalization`` after a convolution (whose output nothing else reads) is folded
    into the convolution's weights and bias; any other becomes ``x · a + b`` with constant
    per-channel ``a`` and ``b`` (a ``mul`` and an ``add``)."""
    producer, consumers = graph.producer(), graph.consumers()
    kept = []
    for node in graph.nodes:
        if node.op != "batch_norm":
            kept.append(node)
            continue
        scale, shift, mean, var = (graph.constants[i].astype(np.float64) for i in node.inputs[1:5])
        factor = scale / np.sqrt(var + node.attrs["epsilon"])
        offset = shift - mean * factor
        conv = producer.get(node.inputs[0])
        if conv is not None and conv.op == "conv2d" and len(consumers[conv.output]) == 1 \
                and conv.output not in graph.outputs and graph.is_constant(conv.inputs[1]):
            w = graph.constants[conv.inputs[1]].astype(np.float64)
            bias = graph.constants[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 else 0.0
            conv.inputs = [conv.inputs[0],
                           graph.add_constant(f"{conv.name}/w_bn", (w * factor.reshape(-1, 1, 1, 1)).astype(np.float32)),
                           graph.add_constant(f"{conv.name}/b_bn", (bias * factor + offset).astype(np.float32))]
            _take_output(graph, conv, node.output, producer)
            continue
        rank = len(graph.values[node.inputs[0]].shape)
        shape = (-1,) + (1,) * (rank - 2)
        a = graph.add_constant(f"{node.name}/a", factor.reshape(shape).astype(np.float32))
        b = graph.add_constant(f"{node.name}/b", offset.reshape(shape).astype(np.float32))
        scaled = graph.fresh_name(f"{node.output}/scaled")
        graph.values[scaled] = type(graph.values[node.output])(scaled, graph.values[node.output].shape)
        kept.append(Node("mul", node.name + "/scale", [node.inputs[0], a], scaled, {"relu": False}))
        kept.append(Node("add", node.name + "/shift", [scaled, b], node.output, {"relu": False}))
    graph.nodes = kept
    graph.prune()
    return graph


def fuse(graph: Graph) -> Graph:
    """A ``Relu`` (or a ``Clip`` from 0 to ∞) after a convolution, a dense layer or an add
    whose output nothing else reads joins it as the operator's fused ReLU: conv + bias +
    ReLU, dense + bias + ReLU and the residual add + ReLU each run as one pass (on the
    accelerator, with the requantization the int8 pipeline adds)."""
    def relu(node: Node, prev: Node) -> bool:
        is_relu = node.op == "relu" or (node.op == "clip" and node.attrs["lo"] == 0 and node.attrs["hi"] == np.inf)
        if is_relu and prev.op in ("conv2d", "dense", "add") and not prev.attrs["relu"]:
            prev.attrs["relu"] = True
            return True
        return False
    return _fold_into_producer(graph, relu)


def fuse_clips(graph: Graph) -> Graph:
    """A ``Clip`` (ReLU6 among them) after a convolution whose output nothing else reads joins
    the convolution's epilogue: one pass over the output instead of two, the same values. In a
    float32 network as ``lo``, ``hi``; in an int8 one (after quantization: the clip's integer
    bounds at the convolution's output scale) as ``relu`` for a lower bound of 0 and ``hi``
    (`Epilogue`, whose ``min`` the accelerator runs on its ALU before the requantizing
    STORE's shift), for a lower bound of 0 or the int8 minimum only."""
    def clip(node: Node, prev: Node) -> bool:
        if node.op != "clip" or prev.op != "conv2d" or "lo" in prev.attrs or "hi" in prev.attrs:
            return False
        dtype = graph.values[prev.output].dtype
        if dtype == "float32":
            prev.attrs.update(lo=node.attrs["lo"], hi=node.attrs["hi"])
            return True
        lo, hi = node.attrs["lo"], node.attrs["hi"]
        if dtype != "int8" or lo not in (-128, 0) or not lo <= hi or \
                graph.values[node.output].exponent != graph.values[prev.output].exponent:
            return False
        prev.attrs["relu"] = prev.attrs["relu"] or lo == 0
        if hi < 127:
            prev.attrs["hi"] = int(hi)
        return True
    return _fold_into_producer(graph, clip)


def fuse_residual_adds(graph: Graph) -> Graph:
    """In a float32 network, an ``add`` of two tensors of one shape, one of them the output of a
    convolution that nothing else reads (one group, a bias, no ReLU or clip of its own), joins
    that convolution's epilogue: ``relu(conv + bias + other)`` in one pass over the output
    instead of two (the residual add of MobileNetV2's and ResNet's blocks).
    The convolution takes the other tensor as its fourth input and moves to the add's place,
    where that tensor exists."""
    producer, consumers = graph.producer(), graph.consumers()
    moved: dict[int, Node] = {}            # the add's index → the convolution that replaces it
    gone: set[int] = set()
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    for k, node in enumerate(graph.nodes):
        if node.op != "add" or len(node.inputs) != 2 or graph.values[node.output].dtype != "float32":
            continue
        shape = graph.values[node.output].shape
        if any(graph.values[i].shape != shape for i in node.inputs):
            continue
        for side in (0, 1):
            conv = producer.get(node.inputs[side])
            if conv is None or id(conv) in {id(m) for m in moved.values()} or not _takes_residual(graph, conv) \
                    or len(consumers[conv.output]) != 1 or conv.output in graph.outputs:
                continue
            conv.inputs = [*conv.inputs, node.inputs[1 - side]]
            conv.attrs.update(residual=True, relu=node.attrs["relu"])
            _take_output(graph, conv, node.output, producer)
            moved[k] = conv
            gone.add(index[id(conv)])
            break
    graph.nodes = [moved.get(k, n) for k, n in enumerate(graph.nodes) if k not in gone]
    graph.prune()
    return graph


def fuse_scale_shift(graph: Graph) -> Graph:
    """In a float32 network, a ``mul`` by a constant per-channel scale whose output only an
    ``add`` of a constant per-channel shift reads (`fold_batch_norm`'s form of a batch norm that
    no convolution precedes: DenseNet's before each layer, a pre-activation ResNet's) becomes
    one ``scale_shift``: one pass over the tensor instead of two."""
    producer, consumers = graph.producer(), graph.consumers()
    gone: set[str] = set()
    for node in graph.nodes:
        if node.op != "add" or graph.values[node.output].dtype != "float32":
            continue
        for side in (0, 1):
            mul = producer.get(node.inputs[side])
            if mul is None or mul.op != "mul" or mul.attrs["relu"] or len(consumers[mul.output]) != 1 \
                    or mul.output in graph.outputs:
                continue
            x, scale = _per_channel_operands(graph, mul.inputs)
            shift = _channel_vector(graph, node.inputs[1 - side], graph.values[node.output].shape)
            if x is None or shift is None or graph.values[x].shape != graph.values[node.output].shape:
                continue
            node.op, node.inputs = "scale_shift", [
                x, graph.add_constant(f"{node.name}/scale", scale), graph.add_constant(f"{node.name}/shift", shift)]
            gone.add(mul.output)
            break
    graph.nodes = [n for n in graph.nodes if n.output not in gone]
    graph.prune()
    return graph


def _per_channel_operands(graph: Graph, inputs: list[str]) -> tuple[str | None, np.ndarray | None]:
    """(the variable operand, the constant one as a per-channel vector) of a multiply, if it is one."""
    for side in (0, 1):
        x = inputs[1 - side]
        vector = _channel_vector(graph, inputs[side], graph.values[x].shape)
        if vector is not None and not graph.is_constant(x):
            return x, vector
    return None, None


def _channel_vector(graph: Graph, name: str, shape) -> np.ndarray | None:
    """Constant ``name`` as one float32 value per channel (axis 1) of a tensor of ``shape``, where
    it broadcasts to that tensor varying along axis 1 at most; else None."""
    if not graph.is_constant(name) or len(shape) < 2:
        return None
    value = np.asarray(graph.constants[name])
    if value.dtype != np.float32 or value.ndim > len(shape):
        return None
    full = (1,) * (len(shape) - value.ndim) + value.shape
    if any(d != 1 for k, d in enumerate(full) if k != 1) or full[1] not in (1, shape[1]):
        return None
    return np.ascontiguousarray(np.broadcast_to(value.reshape(-1), (shape[1],)), np.float32)


def _takes_residual(graph: Graph, conv: Node) -> bool:
    """Whether a convolution's epilogue can add a residual (`fuse_residual_adds`)."""
    a = conv.attrs
    return conv.op == "conv2d" and len(conv.inputs) == 3 and a["groups"] == 1 and not a["relu"] \
        and "lo" not in a and not a.get("residual") and isinstance(a["padding"], int) \
        and all(graph.is_constant(name) for name in conv.inputs[1:])


def _fold_into_producer(graph: Graph, folds: Callable[[Node, Node], bool]) -> Graph:
    """Each node that ``folds(node, producer of its first input)`` takes into that producer
    (updating its attributes), where nothing else reads the producer's output and the model
    does not return it, is removed: the producer writes the node's output instead."""
    producer, consumers = graph.producer(), graph.consumers()
    kept = []
    for node in graph.nodes:
        prev = producer.get(node.inputs[0])
        if prev is not None and len(consumers[prev.output]) == 1 and prev.output not in graph.outputs \
                and folds(node, prev):
            _take_output(graph, prev, node.output, producer)
            continue
        kept.append(node)
    graph.nodes = kept
    graph.prune()
    return graph


def run_passes(graph: Graph, passes: list[GraphPass], trace: Callable[[str], None] | None = None) -> Graph:
    """Run ``passes`` in order; ``trace`` receives the graph after each one."""
    if trace:
        trace(f"== import\n{graph.dump()}")
    for graph_pass in passes:
        graph = graph_pass(graph).unique_node_names()
        if trace:
            trace(f"== {graph_pass.__name__}\n{graph.dump()}")
    return graph
