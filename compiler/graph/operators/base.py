"""`OpDef`, the one definition of a graph operator, and the helpers its rules share.

An operator's definition holds every fact the stack needs about it, where the passes and the
runtime used to keep one table or one ``if op ==`` branch each:

- its arity and the attributes a run reads (the `.gfm` loader checks them);
- its shape rule (`passes.infer_shapes`), which checks the inputs and resolves
  shape-dependent attributes;
- its numpy semantics (`evaluate`: constant folding, calibration, the tests' reference);
- its int8 policy (`quantize`): an int8 form and how scales flow through it, or a float island;
- its batch policy (`batch.batch_mixing`): whether it keeps the items of a batch apart;
- its host lowering (`cpu_kernels.host_kernel`): an LLVM kernel for the CPU and GPU, or a
  numpy data movement.

TVM registers each operator once with its attributes and legalization; this is the same idea
at the graph level. The definitions live by family in this package's modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from ...ops.common import OpError, four_pads, pool_windows
from ..ir import MAX_RANK, Graph, GraphError, Node

__all__ = ["OpDef", "Blocked", "BlockedForm", "OPERATORS", "Int8", "register", "op_def", "fail", "per_item", "ATTRIBUTE_TYPES", "integers",
           "same_padding", "padding", "nonnegative", "window_out", "resolve_axes", "broadcast", "check_rank"]


class Int8:
    """How the int8 pipeline (`quantize`) treats an operator."""

    #: No exact int8 form: computed in float32 from its dequantized inputs (a float island).
    FLOAT = "float"
    #: A product accumulated in int32 from int8 data and weights, requantized by a shift (conv, dense).
    PRODUCT = "product"
    #: Operands aligned by left shifts, combined in int32, requantized with rounding (add, sub, mul).
    SHIFTED = "shifted"
    #: Every input requantized to the coarsest of their scales (concat).
    COARSEST = "coarsest"
    #: The output keeps the input's scale (ReLU, pooling, moves).
    SAME_SCALE = "same_scale"
    #: Not a layer of the float graph: the int8 pipeline inserts it (quantize, dequantize,
    #: requantize) or an earlier pass removes it (batch_norm).
    NONE = "none"


#: ``(graph, node, input shapes) → output shape``: checks the inputs (raising `fail`) and
#: resolves shape-dependent attributes in ``node.attrs``.
ShapeRule = Callable[[Graph, Node, list[tuple[int, ...]]], tuple[int, ...]]
#: ``(node, input arrays) → output array``.
Semantics = Callable[[Node, list[np.ndarray]], np.ndarray]
#: ``(graph, node, input shapes, output shape, indices of the batched inputs) → why the node
#: mixes the items of a batch, or None``.
BatchRule = Callable[[Graph, Node, dict[str, tuple[int, ...]], tuple[int, ...], list[int]], str | None]


class BlockedForm(NamedTuple):
    """How a node takes the blocked layout: the input positions whose layout must be its output's
    (an element-wise operand, a pooled image), those that may be blocked whatever its output is (a
    convolution's input), and whether it takes and gives images whose last block is partly
    channels: it reads the rest of that block as zeros and writes zeros there."""

    tied: tuple[int, ...]
    free: tuple[int, ...] = ()
    partial: bool = False


@dataclass(frozen=True)
class Blocked:
    """How an operator runs on the CPU with float32 images in the blocked layout (N, C/16, H, W, 16)
    (`graph.blocked` plans which values are)."""

    #: ``(graph, node) → BlockedForm``, or None where the node runs in NCHW only.
    form: Callable[[Graph, Node], BlockedForm | None]
    #: ``(graph, node, target, blocked inputs (a bool each), blocked output) → HostKernel``.
    host: Callable


@dataclass(frozen=True)
class OpDef:
    """Everything about one graph operator (``Node.op``)."""

    name: str
    #: Its inputs and attributes, a line of the operator table (the IR's documentation).
    doc: str
    #: The fewest and the most inputs (None: any number).
    arity: tuple[int, int | None]
    shape: ShapeRule
    evaluate: Semantics
    #: The attributes a run reads (a loaded model must have them), and those its int8 form adds.
    attrs: tuple[str, ...] = ()
    int8_attrs: tuple[str, ...] = ()
    #: How many of the first inputs must share one type (None: all of them).
    same_dtype: int | None = 0
    #: The output's type where it is not the first input's (the quantization operators).
    out_dtype: str | None = None
    int8: str = Int8.FLOAT
    #: int8: whether an int8 network keeps it in float32 where a variable operand is a float
    #: island's result (quantizing such a result only to add, scale or move it gains nothing).
    float_propagating: bool = False
    #: int8: keeps its input's scale and commutes with saturation (monotone, no arithmetic
    #: between elements), so a tensor read through it only into clips may be narrowed.
    saturation_safe: bool = False
    #: int8 (`Int8.SAME_SCALE`): computed in float32 where its output's calibrated range is
    #: finer than its input's scale (a global average pool, a clip to a narrower range).
    float_when_narrower: bool = False
    #: int8 (`Int8.SAME_SCALE`): ``(attributes, exponent) → attributes`` on the input's grid
    #: (a clip's bounds, a pad's value); None where nothing changes.
    on_grid: Callable[[dict, int], dict] | None = None
    #: None: unknown, and a run of the network in chunks is refused (an operator that reduces
    #: over the batch would otherwise give wrong results without a word).
    batch: BatchRule | None = None
    #: ``(graph, node, target) → HostKernel``: an LLVM kernel for a host target.
    host: Callable | None = None
    #: ``(node, input arrays) → output array``: the numpy data movement of an operator with no
    #: arithmetic kernel (reshape, concat, quantize…); used where ``host`` is None.
    move: Semantics | None = None
    #: Whether the GPU back end compiles its kernel (else it runs on the CPU beside the GPU).
    gpu: bool = True
    #: Its CPU kernel in the blocked image layout, where it has one (`graph.blocked`).
    blocked: Blocked | None = None

    def check_arity(self, node: Node) -> None:
        low, high = self.arity
        if len(node.inputs) < low or (high is not None and len(node.inputs) > high):
            allowed = f"{low}" if low == high else f"{low} or more" if high is None else f"{low} to {high}"
            count = len(node.inputs)
            raise fail(node, f"it has {count} input{'s' * (count != 1)}; {self.name} takes {allowed}")


#: Every graph operator's definition, by name, in the order of the operator table.
OPERATORS: dict[str, OpDef] = {}


def register(*definitions: OpDef) -> None:
    for definition in definitions:
        if definition.name in OPERATORS:
            raise AssertionError(f"graph operator {definition.name!r} is defined twice")
        OPERATORS[definition.name] = definition


def op_def(node: Node) -> OpDef:
    """The definition of ``node``'s operator (a `GraphError` naming it when there is none)."""
    definition = OPERATORS.get(node.op)
    if definition is None:
        raise GraphError(f"node {node.name}: unknown graph operator {node.op!r}; known: {', '.join(OPERATORS)}")
    return definition


def fail(node: Node, what: str) -> GraphError:
    return GraphError(f"node {node.name} ({node.op}): {what}")


def per_item(graph: Graph, node: Node, shapes, out, carried: list[int]) -> str | None:
    """The batch rule of an operator that computes each item of its first input on its own
    (the other inputs are weights, biases or statistics)."""
    return None if carried == [0] else "its weights depend on the batch"


# --- attribute types ---------------------------------------------------------------------

def integers(value, minimum: int | None = None, maximum: int | None = None) -> bool:
    """An integer (or a tuple of them, or None: not set), each in ``minimum..maximum``."""
    values = value if isinstance(value, tuple) else () if value is None else (value,)
    return all(isinstance(v, int) and not isinstance(v, bool) and (minimum is None or v >= minimum)
               and (maximum is None or v <= maximum) for v in values)


#: The types of the operators' attributes a run relies on (a loaded model's are checked), by name.
ATTRIBUTE_TYPES: dict[str, Callable[[Any], bool]] = {
    **{k: lambda v: integers(v, 1) for k in ("stride", "kernel", "groups", "dilation")},
    **{k: lambda v: integers(v, 0) for k in ("padding", "perm", "squeeze", "unsqueeze", "axes", "pads", "starts")},
    "steps": lambda v: isinstance(v, tuple) and integers(v) and 0 not in v,
    "indices": lambda v: isinstance(v, tuple) and len(v) > 0 and integers(v, 0),
    **{k: integers for k in ("axis", "flatten_axis", "shape")},
    # Shifts of int64 arithmetic, and scales 2^-e a float32 can hold.
    **{k: lambda v: integers(v, 0, 62) for k in ("shift", "lshift")},
    "exponent": lambda v: integers(v, -126, 127),
    **{k: lambda v: isinstance(v, bool) for k in ("relu", "ceil_mode", "count_include_pad", "keepdims", "last",
                                                  "residual")},
    **{k: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
       for k in ("lo", "hi", "epsilon", "alpha", "value")},
}


# --- shape rules' helpers ----------------------------------------------------------------

def nonnegative(graph: Graph, tensor: str) -> bool:
    """Whether ``tensor`` is known to hold no negative value: a ReLU's output (a layer's fused
    one included), a clip's from 0 or above, or a pool of such a tensor."""
    producer = next((n for n in graph.nodes if n.output == tensor), None)
    if producer is None:
        return False
    if producer.op == "relu" or bool(producer.attrs.get("relu")) or \
            (producer.op == "clip" and producer.attrs["lo"] >= 0):
        return True
    return producer.op in ("max_pool", "avg_pool") and nonnegative(graph, producer.inputs[0])


def same_padding(node: Node, size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
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
            raise fail(node, f"auto_pad={mode} with a window ({k}) shorter than the stride ({s}) is not supported: "
                             "ONNX Runtime crops there, not as the ONNX specification says; give explicit pads")
        total = max(total, 0)
        first = total - total // 2 if mode == "SAME_LOWER" else total // 2
        before.append(first)
        after.append(total - first)
    return before[0], before[1], after[0], after[1]


def padding(node: Node) -> tuple[int, int, int, int]:
    """The node's ``padding`` attribute as (top, left, bottom, right), checked."""
    try:
        pads = four_pads(node.attrs["padding"])
    except (OpError, TypeError, ValueError):
        raise fail(node, f"padding {node.attrs['padding']!r} must be an int, a (height, width) pair or "
                         "(top, left, bottom, right)") from None
    if min(pads) < 0:
        raise fail(node, f"padding {list(pads)} must be ≥ 0")
    return pads


def window_out(node: Node, size: tuple[int, int]) -> tuple[int, int]:
    """Output size of a pooling window (ONNX Runtime's rules and checks, `pool_windows`)."""
    a = node.attrs
    kernel, stride, dilation = tuple(a["kernel"]), tuple(a["stride"]), tuple(a.get("dilation", (1, 1)))
    if len(kernel) != 2 or len(stride) != 2 or len(dilation) != 2 or min(kernel + stride + dilation) < 1:
        raise fail(node, f"window {list(kernel)}, strides {list(stride)} and dilations {list(dilation)} must be "
                         "pairs of positive integers")
    if "auto_pad" in a:
        a["padding"] = same_padding(node, size, kernel, stride, pooling=True)
    a["padding"] = padding(node)
    try:
        return pool_windows(size, kernel, stride, a["padding"], dilation, bool(a.get("ceil_mode")))
    except OpError as e:
        raise fail(node, str(e)) from None


def resolve_axes(node: Node, axes, rank: int, of: str = "input", repeats: bool = False) -> list[int]:
    """``axes`` of the node's rank-``rank`` input (or output), negative ones counted from the
    end; each named once unless ``repeats``."""
    if any(not -rank <= i < rank for i in axes):
        raise fail(node, f"axes {list(axes)} are out of range for rank {rank} (from {-rank} to {rank - 1})")
    resolved = [i % rank for i in axes]
    if not repeats and len(set(resolved)) != len(resolved):
        raise fail(node, f"axes {list(axes)} name an axis of the rank-{rank} {of} twice")
    return resolved


def broadcast(node: Node, x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``x`` and ``y`` broadcast together (numpy's and ONNX's rules), by hand:
    np.broadcast_shapes takes at most 32 axes and fails on more with a RuntimeError."""
    rank = max(len(x), len(y))
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in (x, y)]
    if any(d != e and 1 not in (d, e) for d, e in zip(*padded)):
        raise fail(node, f"shapes {list(x)} and {list(y)} do not broadcast")
    return tuple(e if d == 1 else d for d, e in zip(*padded))


def check_rank(node: Node, rank: int) -> None:
    """Refuse an output of more than `MAX_RANK` axes, before it is built: numpy, which folds
    and runs the graph, fails on such an array."""
    if rank > MAX_RANK:
        raise fail(node, f"its output would have {rank} axes, more than the {MAX_RANK} gemforge compiles "
                         "(numpy's limit)")
