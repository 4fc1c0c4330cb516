"""The graph IR: a network as a list of operator nodes over named tensors.

A `Graph` is what the ONNX front end produces and what every graph pass
(`passes`) takes and returns. Nodes are in topological order; each node has
one output. Tensors are `Value`s (shape, type and, in an int8 network, the
power-of-two exponent of their scale: ``real = q · 2**-exponent``);
`constants` holds the ones known at compile time (weights, folded results).

The operators (``Node.op``), their attributes and every rule about them are defined once
each in `operators` (`OpDef`); `compiler/EXTENDING.md` holds their table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CompileError

__all__ = ["GraphError", "Value", "Node", "Graph", "MAX_DIM", "MAX_ELEMENTS", "MAX_RANK"]

#: The largest dimension and element count of any tensor gemforge compiles: the generated
#: code indexes with 64-bit integers, and nothing larger fits a machine's memory anyway.
MAX_DIM = (1 << 31) - 1
MAX_ELEMENTS = 1 << 40
#: The most axes of any tensor: numpy, which folds constants, evaluates the graph and holds
#: every run's arrays, makes arrays of up to 64 (its NPY_MAXDIMS) and fails on more.
MAX_RANK = 64


class GraphError(CompileError):
    """A model the graph compiler cannot take: malformed, or an unsupported operator or attribute."""


@dataclass
class Value:
    """A tensor of the graph: its shape, type and (int8) scale exponent."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str = "float32"
    exponent: int | None = None

    def describe(self) -> str:
        shape = "?" if self.shape is None else "x".join(str(d) for d in self.shape) or "scalar"
        scale = f" · 2^{-self.exponent}" if self.exponent is not None else ""
        return f"{self.dtype}[{shape}]{scale}"


@dataclass
class Node:
    """One operator: ``op`` over the named ``inputs``, writing ``output``."""

    op: str
    name: str
    inputs: list[str]
    output: str
    attrs: dict[str, Any] = field(default_factory=dict)
    #: Where it runs once partitioned: "accel" or "cpu".
    device: str = "cpu"

    def describe(self) -> str:
        attrs = ", ".join(f"{k}={v}" for k, v in sorted(self.attrs.items()) if v is not None and v is not False)
        return f"{self.output} = {self.op}({', '.join(self.inputs)}{'; ' + attrs if attrs else ''})"


@dataclass
class Graph:
    """Nodes in topological order over `values`, some of them `constants`."""

    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    values: dict[str, Value]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    #: Facts the passes record for the report (the partition, the memory plan).
    notes: dict[str, Any] = field(default_factory=dict)

    def producer(self) -> dict[str, Node]:
        return {n.output: n for n in self.nodes}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {name: [] for name in self.values}
        for node in self.nodes:
            for name in node.inputs:
                out.setdefault(name, []).append(node)
        return out

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def fresh_name(self, base: str) -> str:
        name, i = base, 1
        while name in self.values:
            name, i = f"{base}_{i}", i + 1
        return name

    def unique_node_names(self) -> Graph:
        """Give every node a name of its own: host kernels and accelerator layers are keyed by
        node name, and the passes derive names (``bn/scale``, ``x/requantize``) that the model
        or another pass may already use. A later node whose name is taken becomes ``name#k``."""
        taken = {node.name for node in self.nodes}
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                k = 1
                while f"{node.name}#{k}" in taken:
                    k += 1
                node.name = f"{node.name}#{k}"
                taken.add(node.name)
            seen.add(node.name)
        return self

    def check_writers(self) -> Graph:
        """Every tensor has one writer: a graph input, a constant or exactly one node. The
        runtime keys host kernels and results by output name, so a second writer (a pass
        emitting a tensor twice) would run one node's kernel for the other; it is refused
        here, naming the tensor, rather than failing or computing wrongly when run."""
        given = set(self.inputs) | set(self.constants)
        written: dict[str, str] = {}
        for node in self.nodes:
            out = node.output
            if out in given:
                kind = "graph input" if out in self.inputs else "constant"
                raise GraphError(f"internal error: node {node.name} ({node.op}) writes {kind} {out!r}")
            if out in written:
                raise GraphError(f"internal error: tensor {out!r} is written twice, by node {written[out]} and "
                                 f"by node {node.name} ({node.op})")
            written[out] = f"{node.name} ({node.op})"
        return self

    def add_constant(self, base: str, array: np.ndarray, exponent: int | None = None) -> str:
        name = self.fresh_name(base)
        self.constants[name] = array
        self.values[name] = Value(name, tuple(array.shape), array.dtype.name, exponent)
        return name

    def prune(self) -> None:
        """Drop nodes and values nothing reads."""
        live = set(self.outputs)
        kept = []
        for node in reversed(self.nodes):
            if node.output in live:
                kept.append(node)
                live.update(node.inputs)
        self.nodes = kept[::-1]
        live.update(self.inputs)
        self.values = {k: v for k, v in self.values.items() if k in live}
        self.constants = {k: v for k, v in self.constants.items() if k in live}

    def dump(self) -> str:
        """The graph as text: inputs, one line per node with its output's type, outputs."""
        lines = [f"inputs: {', '.join(f'{i}: {self.values[i].describe()}' for i in self.inputs)}"]
        for node in self.nodes:
            where = f"[{node.device}] " if self.notes.get("partitioned") else ""
            lines.append(f"  {where}{node.describe()}  -> {self.values[node.output].describe()}")
        lines.append(f"outputs: {', '.join(self.outputs)}")
        if "memory" in self.notes:
            m = self.notes["memory"]
            lines.append(f"device memory: {m['tensors']} packed tensors, peak {m['peak_bytes']:,} bytes "
                         f"(naive {m['naive_bytes']:,}), {m['handovers']} handed over in DRAM")
        return "\n".join(lines)
