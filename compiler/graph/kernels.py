"""A graph node as a host kernel: the compiled operator, its constants packed once, numpy in and out.

`HostKernel` is what every operator's host lowering (``OpDef.host`` in `operators`) returns
and what the runtime runs: ``run(device, args)`` takes and returns numpy arrays in the graph's
layouts. The helpers here are the lowerings' shared parts: a kernel of one input, a product
with its weights packed at compile time, and the int8 element-wise kernel with operand shifts
and rounding (an expression built here, bit-exact with the accelerator's epilogue).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ..ir import Cast, Const, Shr
from ..ops import cpu as cpu_schedules
from ..ops.common import CompiledOp
from ..ops.host import blocked_shape
from ..pipeline import build
from ..schedule import create_schedule
from ..target import Target
from ..te import clip, compute, placeholder
from .ir import Node

__all__ = ["HostKernel", "contiguous", "unary", "with_weights", "quantized_elementwise", "in_blocks"]


def contiguous(array) -> np.ndarray:
    """C-contiguous; unlike ``np.ascontiguousarray``, ``np.require`` keeps a 0-d array 0-d."""
    return np.require(array, requirements="C")


@dataclass
class HostKernel:
    """One node on a host target: ``op`` (None for data movement, then ``move`` computes it),
    ``prepare`` turning the node's input arrays into the kernel's arguments (constants packed
    once, at compile time) and ``finish`` turning its output back into the graph's layout."""

    node: Node
    op: CompiledOp | None = None
    prepare: Callable[[list[np.ndarray]], dict[str, np.ndarray]] | None = None
    finish: Callable[[np.ndarray], np.ndarray] = lambda out: out
    move: Callable[[Node, list[np.ndarray]], np.ndarray] | None = None

    def run(self, device, args: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        """The node's output for ``args``, and the device's `RunResult` (None for data movement)."""
        if self.op is None:
            return self.move(self.node, args), None
        outputs, result = device.run_program(self.op.program, self.prepare(args), [self.op.output])
        return contiguous(self.finish(self.op.unpack_output(outputs[self.op.output]))), result


def in_blocks(ordinary: Callable) -> Callable:
    """The blocked-layout kernel (`OpDef.blocked`) of an element-wise operator whose operands and
    output are all blocked (`graph.blocked` ties them): its ``ordinary`` kernel, which computes
    each element on its own, compiled for the images' blocks (a partial last block's padding
    included) and run on them as they are."""
    def lower(graph, node: Node, target: Target, inputs, out) -> HostKernel:
        physical = blocked_shape(tuple(graph.values[node.output].shape))
        n, blocks, h, w, lanes = physical
        values = dict(graph.values)
        for name in (*node.inputs, node.output):
            values[name] = replace(values[name], shape=(n, blocks * lanes, h, w))
        kernel = ordinary(replace(graph, values=values), node, target)

        def prepare(args):
            return kernel.prepare([np.reshape(a, (n, blocks * lanes, h, w)) for a in args])
        return HostKernel(node, kernel.op, prepare, lambda result: kernel.finish(result).reshape(physical))
    return lower


def unary(node: Node, op: CompiledOp) -> HostKernel:
    """A kernel of the node's one input, passed as it is."""
    return HostKernel(node, op, lambda args: op.pack_inputs(x=contiguous(args[0])))


def with_weights(node: Node, op: CompiledOp, data: str, weight: str, data_shape, const, finish) -> HostKernel:
    """A conv/dense kernel with its weights and bias packed once at compile time (a
    variable second operand, a product of two activations, is packed per run)."""
    w, bias = const[1], const[2] if len(const) > 2 else None
    if w is None:
        def prepare_variable(args):
            return op.pack_inputs(**{data: contiguous(args[0]).reshape(data_shape), weight: args[1],
                                     "bias": bias})
        return HostKernel(node, op, prepare_variable, finish)
    packed = op.pack_inputs(**{data: np.zeros(data_shape, w.dtype), weight: w, "bias": bias})
    data_layout = packed.pop(data).shape

    def prepare(args):
        return dict(packed, **{data: contiguous(args[0]).reshape(data_layout)})
    return HostKernel(node, op, prepare, finish)


def quantized_elementwise(target: Target, op: str, shape, y_shape, lshift, shift: int, relu: bool) -> CompiledOp:
    """int8 ``clip(((x << lx) ∘ (y << ly) + round) >> shift, lo, 127)`` with ``y``
    broadcast to ``x`` (``∘`` is ``+``, ``−`` or ``×``; ``op == "requantize"`` has no ``y``)."""
    x = placeholder(tuple(shape), "int8", "x")
    params = [x]
    y = None
    if op != "requantize":
        y = placeholder(tuple(y_shape), "int8", "y")
        params.append(y)
        offset = len(shape) - len(y_shape)

    def body(*idx):
        value = x[idx].astype("int32")
        if lshift[0]:
            value = value * Const(1 << lshift[0])
        if y is not None:
            other = y[tuple(Const(0) if d == 1 else i for i, d in zip(idx[offset:], y_shape))].astype("int32")
            if lshift[1]:
                other = other * Const(1 << lshift[1])
            value = value + other if op == "add" else value - other if op == "sub" else value * other
        if shift:
            value = Shr(value + Const(1 << (shift - 1)), Const(shift))
        return Cast("int8", clip(value, 0 if relu else -128, 127))
    out = compute(tuple(shape), body, name="out", dtype="int8")
    s = create_schedule(out)
    cpu_schedules.schedule_elementwise(s, out)
    kernel = build(s, target, params + [out], name=f"q{op}")
    names = ["x", "y"][:len(params)]
    return CompiledOp(f"q{op}", kernel, names, "out", lambda **a: a, lambda o: o)
