"""The int8 network's accelerator side: which nodes run on the accelerator, and their layers' layouts.

The device memory the packed tensors take is planned in `memory_plan`.

**Partitioning rule.** A node runs on the accelerator when the accelerator computes
it exactly in int8 and its operator compiles for the config: convolutions with one
group or depthwise (a group per channel: diagonal weights on the GEMM core, `block_out`
useful products a cycle) and dense layers, with constant weights, each with its bias,
ReLU, requantizing shift and upper bound fused into the epilogue
(``clip((acc + bias) >> s, lo, hi)``, bit for bit the CPU back end's); the adds and
subtractions of two int8 tensors of one NCHW shape (residual adds); and max and average
pools (global ones included) whose windows all lie inside the padded input, a padded max
pool only of a non-negative tensor (a ReLU's: the DMA pads with zeros), a padded average
pool only with ``count_include_pad`` (one divisor). The adds' operands and the pools'
windows are widened into the accumulator by the GEMM core (`ops.accel.widened`).
Everything else runs on the CPU back end (concatenations, reshapes, the float path). A
node the accelerator could take but cannot tile (buffers too small, padding above the
DMA's pad field, an operand shift beyond the scaled identity's int8 weight, an average
whose divisor has no exact multiply within the ALU's immediate, core blocks that are not
square for the widened operators) stays on the CPU with the reason recorded. `partition`
prints the split.

**Layouts.** An accelerator node reads its data input packed into the config's
blocks (NCHW{B}n{BI}c for convolutions, (M/B, K/BI, B, BI) tiles for dense
layers, channels zero-padded to a whole block; an add's two operands both so) and
writes its output packed the same way with BO-wide blocks. When a consumer's packed
input is the producer's packed output — same shape and type, so BI = BO — the tensor is handed over in
device DRAM as it is; any other edge goes through the host (unpacked, then packed
for the consumer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.hw.program import Program

from ..backends.accel.layout import pack_matrix_a, pack_nchw, unpack_matrix, unpack_nchw
from ..ops import accel as accel_ops
from ..errors import CompileError
from ..ops.accel.widened import compile_int8_depthwise_conv2d, compile_int8_pool2d, compile_scaled_add
from ..ops.common import OpError
from .ir import Graph, Node
from .operators.base import nonnegative, padding

__all__ = ["AccelLayer", "DATA_INPUTS", "ACCEL_OPS", "partition", "compile_pool", "nonnegative", "is_depthwise",
           "host_reads", "accel_runs", "host_round_trips", "round_trips"]

#: The program tensors an accelerator layer binds its node's data inputs to, in the node's
#: input order (a convolution's and a dense layer's weights and bias travel in the program).
DATA_INPUTS = {"conv2d": ("x",), "dense": ("a",), "add": ("x", "y"), "sub": ("x", "y"), "max_pool": ("x",),
               "avg_pool": ("x",)}
#: The graph operators a node may run on the accelerator as.
ACCEL_OPS = tuple(DATA_INPUTS)


@dataclass
class AccelLayer:
    """One accelerator node: its program (weights and bias as constants) and its data's layouts."""

    kind: str                        # the node's operator (`ACCEL_OPS`)
    program: Program
    data: str                        # the program's first data-input tensor ("x" or "a")
    data_shape: tuple[int, ...]      # host layout of the data (NCHW, or (M, K)), each operand's of an add
    out_shape: tuple[int, ...]       # host layout of the output (NCHW, or (M, N))
    plan: dict

    @property
    def inputs(self) -> tuple[str, ...]:
        """The program tensors the node's data inputs bind to, in the node's input order."""
        return DATA_INPUTS[self.kind]

    def bound_inputs(self, node: Node) -> list[tuple[str, str]]:
        """(graph tensor, program tensor) of each data input of ``node``, this layer's node."""
        return list(zip(node.inputs, self.inputs))

    def packed(self, name: str) -> tuple[tuple[int, ...], str]:
        """The packed layout (shape, dtype) of the program's tensor ``name``."""
        region = self.program.tensors[name]
        return region.shape, region.dtype

    @property
    def packed_out(self) -> tuple[tuple[int, ...], str]:
        region = self.program.tensors["out"]
        return region.shape, region.dtype

    def pack(self, array: np.ndarray) -> np.ndarray:
        """The host array of the data input → its packed device layout."""
        config = self.program.config
        if self.kind != "dense":
            return pack_nchw(config, array)
        return pack_matrix_a(config, array.reshape(self.data_shape))

    def unpack(self, tiles: np.ndarray) -> np.ndarray:
        """The packed output → the host layout."""
        if self.kind != "dense":
            return unpack_nchw(tiles, self.out_shape[0], self.out_shape[1])
        return unpack_matrix(tiles, self.out_shape[0], self.out_shape[1])


def _config_reason(config: AccelConfig) -> str | None:
    widths = (config.inp_width, config.wgt_width, config.acc_width, config.out_width)
    if widths != (8, 8, 32, 8):
        return (f"config {config.name!r} computes int{config.inp_width} × int{config.wgt_width} → "
                f"int{config.acc_width} with int{config.out_width} outputs; the int8 network needs "
                "int8 × int8 → int32 → int8")
    return None


def _compile_elementwise(graph: Graph, node: Node, config: AccelConfig) -> AccelLayer:
    """Compile an int8 add/sub of two tensors of one NCHW shape (raises `OpError` if it cannot)."""
    a = node.attrs
    shapes = [tuple(graph.values[name].shape) for name in (*node.inputs, node.output)]
    if len(shapes[0]) != 4 or len(set(shapes)) != 1:
        raise OpError("the accelerator adds two tensors of one NCHW shape, without broadcasting")
    op = compile_scaled_add(config, shapes[0], lshift=tuple(a["lshift"]), shift=a["shift"], relu=a["relu"],
                            negate_y=node.op == "sub")
    packed = op.pack_inputs(x=np.zeros(shapes[0], np.int8), y=np.zeros(shapes[0], np.int8))
    return _layer(node, op, packed, "x", shapes[0], shapes[0])


def is_depthwise(graph: Graph, node: Node) -> bool:
    """Whether the conv2d ``node`` is depthwise: a group per input channel, one output channel each."""
    channels = graph.values[node.inputs[0]].shape[1]
    return node.attrs["groups"] == channels > 1 and graph.values[node.inputs[1]].shape[:2] == (channels, 1)


def compile_pool(graph: Graph, node: Node, config: AccelConfig):
    """The accelerator operator of an int8 max or average pool node (raises `OpError` if it cannot)."""
    a = node.attrs
    x_shape, y_shape = (tuple(graph.values[name].shape) for name in (node.inputs[0], node.output))
    op = compile_int8_pool2d(config, x_shape, node.op.split("_")[0], tuple(a["kernel"]), stride=tuple(a["stride"]),
                             padding=tuple(a["padding"]), dilation=tuple(a.get("dilation", (1, 1))),
                             count_include_pad=bool(a.get("count_include_pad")), lshift=a.get("lshift", 0),
                             nonnegative=nonnegative(graph, node.inputs[0]))
    if (op.plan["oh"], op.plan["ow"]) != y_shape[2:]:
        raise OpError(f"its ceil_mode keeps partial windows ({list(y_shape[2:])} outputs where whole windows give "
                      f"{[op.plan['oh'], op.plan['ow']]}); the accelerator pools whole windows")
    return op


def _compile_pool_layer(graph: Graph, node: Node, config: AccelConfig) -> AccelLayer:
    op = compile_pool(graph, node, config)
    x_shape = tuple(graph.values[node.inputs[0]].shape)
    packed = op.pack_inputs(x=np.zeros(x_shape, np.int8))
    return _layer(node, op, packed, "x", x_shape, tuple(graph.values[node.output].shape))


def _compile_layer(graph: Graph, node: Node, config: AccelConfig) -> AccelLayer:
    """Compile an int8 node for the accelerator (raises `OpError` if it cannot)."""
    a = node.attrs
    if node.op in ("add", "sub"):
        return _compile_elementwise(graph, node, config)
    if node.op in ("max_pool", "avg_pool"):
        return _compile_pool_layer(graph, node, config)
    x_shape = tuple(graph.values[node.inputs[0]].shape)
    w, bias = graph.constants[node.inputs[1]], graph.constants[node.inputs[2]]
    if node.op == "conv2d":
        if a["groups"] != 1 and not is_depthwise(graph, node):
            raise OpError(f"the accelerator runs convolutions with one group or depthwise ones (a group per channel, "
                          f"one output each), not {a['groups']} groups of {x_shape[1]} channels into {w.shape[0]}")
        if a["groups"] != 1:
            op = compile_int8_depthwise_conv2d(config, x_shape, tuple(w.shape[2:]), stride=(a["stride"],) * 2,
                                               padding=padding(node), shift=a["shift"], relu=a["relu"],
                                               hi=a.get("hi"))
        else:
            # Untuned: a network's twenty-odd layers compile in seconds (tuning costs ~2 s a shape).
            op = accel_ops.compile_conv2d(config, x_shape, w.shape, stride=a["stride"], padding=a["padding"],
                                          bias=True, shift=a["shift"], relu=a["relu"], hi=a.get("hi"), tune=False)
        packed = op.pack_inputs(x=np.zeros(x_shape, np.int8), w=w, bias=bias)
        data, data_shape = "x", x_shape
        out_shape = tuple(graph.values[node.output].shape)
    else:
        m, k = int(np.prod(x_shape[:-1])), x_shape[-1]
        op = accel_ops.compile_dense(config, m, k, w.shape[1], bias=True, shift=a["shift"], relu=a["relu"])
        packed = op.pack_inputs(a=np.zeros((m, k), np.int8), b=w, bias=bias)
        data, data_shape, out_shape = "a", (m, k), (m, w.shape[1])
    return _layer(node, op, packed, data, data_shape, out_shape)


def _layer(node: Node, op, packed: dict[str, np.ndarray], data: str, data_shape, out_shape) -> AccelLayer:
    """``node``'s layer: ``op``'s program with its packed weights and bias (where it has them)
    joining the compiler's own constants (e.g. zero rows the DMA reads for padding)."""
    program = op.program
    program.constants = {**program.constants, **{k: packed[k] for k in ("w", "bias") if k in packed}}
    program.check()
    return AccelLayer(node.op, program, data, tuple(data_shape), tuple(out_shape), dict(op.plan))


def partition(graph: Graph, config: AccelConfig, report=None) -> dict[str, AccelLayer]:
    """Place every node (``node.device``) and compile the accelerator's; returns their layers.
    The split, with the reason for each CPU node the accelerator could have taken, goes to
    ``graph.notes.partition`` (and ``report``, a print function)."""
    layers: dict[str, AccelLayer] = {}
    rows = []
    blocked = _config_reason(config)
    for node in graph.nodes:
        node.device, reason = "cpu", ""
        candidate = node.op in ACCEL_OPS and graph.values[node.inputs[0]].dtype == "int8"
        if candidate and node.op in ("conv2d", "dense") and not graph.is_constant(node.inputs[1]):
            candidate, reason = False, "a product of two activations (the accelerator's weights are constants)"
        if candidate and node.op in ("add", "sub") and any(map(graph.is_constant, node.inputs)):
            # A constant operand is a bias the producing layer's epilogue could take; alone,
            # it would need its own packed copy in every program.
            candidate, reason = False, "an operand is a constant (the accelerator adds two computed tensors)"
        if candidate and blocked:
            candidate, reason = False, blocked
        if candidate:
            try:
                layers[node.name] = _compile_layer(graph, node, config)
                node.device = "accel"
            except (OpError, CompileError) as exc:
                # A schedule the back end cannot encode (a DMA frame past its pad field when a
                # window's rows merge into one transfer) runs on the CPU too, with the reason.
                reason = str(exc)
        rows.append({"node": node.name, "op": node.op, "device": node.device, "reason": reason})
    graph.notes.partition = rows
    if report:
        on_accel = sum(r["device"] == "accel" for r in rows)
        report(f"partition: {on_accel} of {len(rows)} nodes on the accelerator ({config.name}), "
               f"{len(rows) - on_accel} on the CPU; {host_round_trips(graph)} host round trips per inference")
        for r in rows:
            report(f"  {r['device']:5}  {r['op']:10} {r['node']}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return layers


def host_reads(graph: Graph, layers: dict[str, AccelLayer]) -> set[str]:
    """The tensors a run copies out of device memory: accelerator outputs a host node or the
    caller reads, and those a later accelerator node reads in another packed layout (through
    the host)."""
    readers = set(graph.outputs)
    produced = {n.output: layers[n.name].packed_out for n in graph.nodes if n.device == "accel"}
    for node in graph.nodes:
        if node.device != "accel":
            readers.update(node.inputs)
            continue
        layer = layers[node.name]
        for tensor, name in layer.bound_inputs(node):
            if tensor in produced and produced[tensor] != layer.packed(name):
                readers.add(tensor)
    return readers


def accel_runs(graph: Graph, layers: dict[str, AccelLayer]) -> list[tuple[int, int]]:
    """The accelerator runs of an inference: ``(first, last)`` steps (indices into
    ``graph.nodes``) of consecutive accelerator nodes that the device runs as one program,
    one START and one FINISH (`Device.load_chain`). A run ends at a host node, and after a
    node whose output a later accelerator node reads in another packed layout (the host
    re-packs it in between, `host_reads`)."""
    produced = {n.output: layers[n.name].packed_out for n in graph.nodes if n.device == "accel"}
    repacked = set()
    for node in graph.nodes:
        if node.device == "accel":
            layer = layers[node.name]
            repacked.update(t for t, name in layer.bound_inputs(node)
                            if t in produced and produced[t] != layer.packed(name))
    runs: list[tuple[int, int]] = []
    start = None
    for step, node in enumerate(graph.nodes):
        if node.device != "accel":
            if start is not None:
                runs.append((start, step - 1))
            start = None
            continue
        if start is None:
            start = step
        if node.output in repacked:
            runs.append((start, step))
            start = None
    if start is not None:
        runs.append((start, len(graph.nodes) - 1))
    return runs


def host_round_trips(graph: Graph) -> int:
    """How many times an inference leaves the accelerator for the host and comes back
    (`round_trips` of its nodes' placement)."""
    return round_trips([node.device == "accel" for node in graph.nodes])


def round_trips(on_accelerator: list[bool]) -> int:
    """The runs of host steps between the first and the last accelerator step, in execution
    order: where the inference leaves the accelerator and comes back (on a board, trips over the
    host link). Counted by placement, as a profile shows it: a host run on a branch that shares no
    tensor with the accelerator counts too, and a tensor re-packed through the host between two
    adjacent accelerator layers (`host_reads`) does not."""
    if True not in on_accelerator:
        return 0
    first, last = on_accelerator.index(True), len(on_accelerator) - 1 - on_accelerator[::-1].index(True)
    inner = on_accelerator[first:last + 1]
    return sum(1 for before, here in zip(inner, inner[1:]) if before and not here)
