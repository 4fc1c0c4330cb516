"""The graph passes, in the order the pipeline runs them (`float_pipeline`, `int8_pipeline`).

Each pass is a plain function ``Graph → Graph`` (it may update the graph in
place and return it); `run_passes` runs a list of them and, with ``trace``,
prints the graph after each one.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ops.common import OpError, four_pads, pool_windows, window_count
from .evaluate import evaluate_node
from .ir import BINARY_OPS, FLOAT_FUNCTIONS, MAX_DIM, MAX_ELEMENTS, MAX_RANK, Graph, GraphError, Node, Value

__all__ = ["infer_shapes", "pad_convolutions", "fold_constants", "fold_batch_norm", "fuse", "run_passes", "GraphPass"]

GraphPass = Callable[[Graph], Graph]


def _fail(node: Node, what: str) -> GraphError:
    return GraphError(f"node {node.name} ({node.op}): {what}")


def _same_padding(node: Node, size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
                  pooling: bool = False) -> tuple[int, int, int, int]:
    """The (top, left, bottom, right) padding of ``auto_pad`` SAME_UPPER or SAME_LOWER (the
    attribute consumed): what ⌈size / stride⌉ windows need, split in two, the odd pixel at
    the end (UPPER) or the start (LOWER). ``kernel`` is the window's span; a pooling window's
    is its tap count, dilated or not, as ONNX Runtime computes it (the ONNX specification
    spans the dilated window, as for a convolution)."""
    mode = node.attrs.pop("auto_pad")
    before, after = [], []
    for axis in range(2):
        k, s, n = kernel[axis], stride[axis], size[axis]
        total = (-(-n // s) - 1) * s + k - n
        if pooling and total < 0:
            raise _fail(node, f"auto_pad={mode} with a window ({k}) shorter than the stride ({s}) is not supported: "
                              "ONNX Runtime crops there, not as the ONNX specification says; give explicit pads")
        total = max(total, 0)
        first = total - total // 2 if mode == "SAME_LOWER" else total // 2
        before.append(first)
        after.append(total - first)
    return before[0], before[1], after[0], after[1]


def _padding(node: Node) -> tuple[int, int, int, int]:
    try:
        pads = four_pads(node.attrs["padding"])
    except (OpError, TypeError, ValueError):
        raise _fail(node, f"padding {node.attrs['padding']!r} must be an int, a (height, width) pair or "
                          "(top, left, bottom, right)") from None
    if min(pads) < 0:
        raise _fail(node, f"padding {list(pads)} must be ≥ 0")
    return pads


def _window_out(node: Node, size: tuple[int, int]) -> tuple[int, int]:
    """Output size of a pooling window (ONNX Runtime's rules and checks, `pool_windows`)."""
    a = node.attrs
    kernel, stride, dilation = tuple(a["kernel"]), tuple(a["stride"]), tuple(a.get("dilation", (1, 1)))
    if len(kernel) != 2 or len(stride) != 2 or len(dilation) != 2 or min(kernel + stride + dilation) < 1:
        raise _fail(node, f"window {list(kernel)}, strides {list(stride)} and dilations {list(dilation)} must be "
                          "pairs of positive integers")
    if "auto_pad" in a:
        a["padding"] = _same_padding(node, size, kernel, stride, pooling=True)
    a["padding"] = _padding(node)
    try:
        return pool_windows(size, kernel, stride, a["padding"], dilation, bool(a.get("ceil_mode")))
    except OpError as e:
        raise _fail(node, str(e)) from None


def _axes(node: Node, axes, rank: int, of: str = "input", repeats: bool = False) -> list[int]:
    """``axes`` of the node's rank-``rank`` input (or output), negative ones counted from the
    end; each named once unless ``repeats``."""
    if any(not -rank <= i < rank for i in axes):
        raise _fail(node, f"axes {list(axes)} are out of range for rank {rank} (from {-rank} to {rank - 1})")
    resolved = [i % rank for i in axes]
    if not repeats and len(set(resolved)) != len(resolved):
        raise _fail(node, f"axes {list(axes)} name an axis of the rank-{rank} {of} twice")
    return resolved


def _broadcast(node: Node, x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``x`` and ``y`` broadcast together (numpy's and ONNX's rules), by hand:
    np.broadcast_shapes takes at most 32 axes and fails on more with a RuntimeError."""
    rank = max(len(x), len(y))
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in (x, y)]
    if any(d != e and 1 not in (d, e) for d, e in zip(*padded)):
        raise _fail(node, f"shapes {list(x)} and {list(y)} do not broadcast")
    return tuple(e if d == 1 else d for d, e in zip(*padded))


def _check_rank(node: Node, rank: int) -> None:
    """Refuse an output of more than `MAX_RANK` axes, before it is built: numpy, which folds
    and runs the graph, fails on such an array."""
    if rank > MAX_RANK:
        raise _fail(node, f"its output would have {rank} axes, more than the {MAX_RANK} gemforge compiles "
                          "(numpy's limit)")


def _shape_of(graph: Graph, node: Node) -> tuple[int, ...]:
    """The output shape of ``node``, checking its inputs; resolves shape-dependent attributes."""
    shapes = [graph.values[i].shape for i in node.inputs]
    dtypes = {graph.values[i].dtype for i in node.inputs[:2]} if node.op in (*BINARY_OPS, "dense") else \
        {graph.values[i].dtype for i in node.inputs} if node.op == "concat" else set()
    if len(dtypes) > 1:
        raise _fail(node, f"its inputs have different types ({', '.join(sorted(dtypes))}); ONNX needs one")
    x = shapes[0]
    a = node.attrs
    op = node.op
    if op == "conv2d":
        w = shapes[1]
        if len(x) != 4:
            raise _fail(node, f"the input must be NCHW (4-D), not {list(x)}")
        groups = a["groups"]
        if groups < 1 or x[1] != w[1] * groups or w[0] % groups:
            raise _fail(node, f"input channels {x[1]}, weight {list(w)} and group {groups} do not agree")
        if len(shapes) > 2 and shapes[2] != (w[0],):
            raise _fail(node, f"the bias must have shape [{w[0]}], not {list(shapes[2])}")
        stride = a["stride"]
        if "auto_pad" in a:
            a["padding"] = _same_padding(node, x[2:], w[2:], (stride, stride))
        pads = _padding(node)
        # One value where every side is alike; else `pad_convolutions` splits it off.
        a["padding"] = pads[0] if len(set(pads)) == 1 else pads
        oh, ow = window_count(x[2], w[2], stride, pads[0], pads[2]), window_count(x[3], w[3], stride, pads[1], pads[3])
        if oh < 1 or ow < 1:
            raise _fail(node, f"a {w[2]}x{w[3]} kernel does not fit a {x[2]}x{x[3]} input with padding {list(pads)}")
        return (x[0], w[0], oh, ow)
    if op == "dense":
        w = shapes[1]
        if len(w) != 2 or (not a.get("matmul") and len(x) != 2) or len(x) < 1 or x[-1] != w[0]:
            raise _fail(node, f"cannot multiply {list(x)} by {list(w)}; supported: (…, K) @ (K, N)")
        if len(x) != 2 and not graph.is_constant(node.inputs[1]):
            raise _fail(node, f"a product by a right-hand operand that is not a constant needs a 2-D left-hand "
                              f"operand (M, K), not {list(x)} @ {list(w)}")
        if len(shapes) > 2 and shapes[2] != (w[1],):
            raise _fail(node, f"the bias must have shape [{w[1]}], not {list(shapes[2])}")
        return tuple(x[:-1]) + (w[1],)
    if op in BINARY_OPS:
        return _broadcast(node, x, shapes[1])
    if op in ("relu", *FLOAT_FUNCTIONS, "clip", "identity", "quantize", "dequantize", "requantize"):
        return tuple(x)
    if op == "batch_norm":
        if len(x) < 2 or any(s != (x[1],) for s in shapes[1:5]):
            raise _fail(node, f"parameters must have shape [{x[1] if len(x) > 1 else '?'}]")
        return tuple(x)
    if op in ("max_pool", "avg_pool"):
        if len(x) != 4:
            raise _fail(node, f"the input must be NCHW (4-D), not {list(x)}")
        if a.get("global_pool"):
            a["kernel"] = (x[2], x[3])
        oh, ow = _window_out(node, x[2:])
        return (x[0], x[1], oh, ow)
    if op == "reshape":
        if "flatten_axis" in a:
            axis = a["flatten_axis"] + (len(x) if a["flatten_axis"] < 0 else 0)
            if not 0 <= axis <= len(x):
                raise _fail(node, f"axis {a['flatten_axis']} is out of range for rank {len(x)}")
            shape = (math.prod(x[:axis]), math.prod(x[axis:]))
        elif "squeeze" in a:
            if a["squeeze"] is None:
                axes = [i for i, d in enumerate(x) if d == 1]
            else:
                # Repeated axes squeeze once, as in ONNX Runtime.
                axes = sorted(set(_axes(node, a["squeeze"], len(x), repeats=True)))
                wide = [f"{i} ({x[i]})" for i in axes if x[i] != 1]
                if wide:
                    raise _fail(node, f"it squeezes axes of size 1 only, not axis {', '.join(wide)} of {list(x)}")
            a["squeeze"] = tuple(axes)
            shape = tuple(d for i, d in enumerate(x) if i not in axes)
        elif "unsqueeze" in a:
            rank = len(x) + len(a["unsqueeze"])
            _check_rank(node, rank)
            axes = _axes(node, a["unsqueeze"], rank, of="output")
            a["unsqueeze"] = tuple(sorted(axes))
            rest = iter(x)
            shape = tuple(1 if i in axes else next(rest) for i in range(rank))
        else:
            target = list(a["target"])
            _check_rank(node, len(target))
            for i, d in enumerate(target):
                if d == 0 and not a.get("allowzero"):
                    if i >= len(x):
                        raise _fail(node, f"target {list(a['target'])} copies dimension {i} of a rank-{len(x)} input")
                    target[i] = x[i]
            if target.count(-1) > 1 or any(d < -1 for d in target):
                raise _fail(node, f"target shape {list(a['target'])} is invalid")
            if -1 in target:
                known = math.prod(d for d in target if d != -1)
                if known == 0 or math.prod(x) % known:
                    raise _fail(node, f"cannot reshape {list(x)} to {list(a['target'])}")
                target[target.index(-1)] = math.prod(x) // known
            shape = tuple(target)
        if math.prod(shape) != math.prod(x):
            raise _fail(node, f"cannot reshape {list(x)} ({math.prod(x)} elements) to {list(shape)}")
        a["shape"] = tuple(int(d) for d in shape)
        return a["shape"]
    if op == "transpose":
        perm = tuple(range(len(x)))[::-1] if a["perm"] is None else tuple(a["perm"])
        if sorted(perm) != list(range(len(x))):
            raise _fail(node, f"perm {list(perm)} must be a permutation of the input's axes, {list(range(len(x)))} "
                              f"(the input is {list(x)})")
        a["perm"] = perm
        return tuple(x[p] for p in perm)
    if op == "slice":
        starts, steps, out = (tuple(a[k]) for k in ("starts", "steps", "shape"))
        if not len(starts) == len(steps) == len(out) == len(x):
            raise _fail(node, f"starts, steps and shape must give one value per axis of the input {list(x)}")
        for axis, (d, start, step, n) in enumerate(zip(x, starts, steps, out)):
            last = start + (n - 1) * step
            if step == 0 or n < 1 or not (0 <= start < d and 0 <= last < d):
                raise _fail(node, f"axis {axis}: {n} elements from {start} by steps of {step} do not lie in its {d}")
        return out
    if op == "pad":
        axes = list(range(len(x))) if a.get("axes") is None else _axes(node, a["axes"], len(x))
        if len(a["pads"]) != 2 * len(axes):
            raise _fail(node, f"pads {list(a['pads'])} must give a start and an end for each of the {len(axes)} "
                              "padded axes")
        before, after = [0] * len(x), [0] * len(x)
        for k, axis in enumerate(axes):
            before[axis], after[axis] = a["pads"][k], a["pads"][k + len(axes)]
        a["pads"], a["axes"] = tuple(before + after), None
        return tuple(d + b + e for d, b, e in zip(x, before, after))
    if op == "concat":
        axis = a["axis"] + (len(x) if a["axis"] < 0 else 0)
        if not 0 <= axis < len(x):
            raise _fail(node, f"axis {a['axis']} is out of range for rank {len(x)}")
        a["axis"] = axis
        for s in shapes[1:]:
            if len(s) != len(x) or any(d != e for i, (d, e) in enumerate(zip(s, x)) if i != axis):
                raise _fail(node, f"inputs {[list(s) for s in shapes]} differ outside axis {axis}")
        return tuple(x[:axis]) + (sum(s[axis] for s in shapes),) + tuple(x[axis + 1:])
    if op == "reduce_mean":
        axes = list(range(len(x))) if a["axes"] is None else _axes(node, a["axes"], len(x))
        a["axes"] = tuple(sorted(axes))
        return tuple(1 if i in axes else d for i, d in enumerate(x) if a["keepdims"] or i not in axes)
    if op == "softmax":
        axis = a["axis"] + (len(x) if a["axis"] < 0 else 0)
        if not 0 <= axis < len(x):
            raise _fail(node, f"axis {a['axis']} is out of range for rank {len(x)}")
        a["axis"] = axis
        return tuple(x)
    raise _fail(node, "no shape rule")


def infer_shapes(graph: Graph) -> Graph:
    """Every tensor's shape and type, checked node by node; shape-dependent attributes
    (reshape targets, global pooling windows, negative axes) resolved."""
    for node in graph.nodes:
        for i in node.inputs:
            if graph.values[i].shape is None:
                raise _fail(node, f"input {i!r} has no known shape")
        value = graph.values[node.output]
        value.shape = _shape_of(graph, node)
        if value.shape and (max(value.shape) > MAX_DIM or math.prod(value.shape) > MAX_ELEMENTS):
            raise _fail(node, f"its output would have shape {list(value.shape)}, beyond what gemforge compiles "
                              f"(dimensions up to {MAX_DIM:,} and {MAX_ELEMENTS:,} elements in all)")
        if 0 in value.shape:
            # A zero-size constant operand (a weight of shape [0, K]) gives an empty result,
            # which no kernel computes: refused here rather than when the model runs.
            raise _fail(node, f"its output would have shape {list(value.shape)}, with no elements; gemforge "
                              "compiles tensors of one element or more")
        if node.op in ("quantize", "requantize"):
            value.dtype = "int8"
        elif node.op == "dequantize":
            value.dtype = "float32"
        else:
            value.dtype = graph.values[node.inputs[0]].dtype
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
    producer, consumers = graph.producer(), graph.consumers()
    kept = []
    for node in graph.nodes:
        is_relu = node.op == "relu" or (node.op == "clip" and node.attrs["lo"] == 0 and node.attrs["hi"] == np.inf)
        prev = producer.get(node.inputs[0])
        if is_relu and prev is not None and prev.op in ("conv2d", "dense", "add") and not prev.attrs["relu"] \
                and len(consumers[prev.output]) == 1 and prev.output not in graph.outputs:
            prev.attrs["relu"] = True
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
