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

from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np

from ..errors import CompileError

__all__ = ["GraphError", "Value", "Node", "Graph", "GraphNotes", "whole_number", "MAX_DIM", "MAX_ELEMENTS", "MAX_RANK"]

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


def whole_number(value) -> bool:
    """An int (not a bool) ≥ 0: the type of counts and sizes in saved models."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _list_of(kind) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(isinstance(item, kind) for item in v)


#: The memory figures' keys (`memory_plan.MemoryPlan.summary`).
MEMORY_FIGURES = ("peak_bytes", "naive_bytes", "tensors", "handovers")


@dataclass
class GraphNotes:
    """What import and the passes find out about a graph, for a run and for the reports: the
    compile→run contract's facts beside the graph and its memory plan. A `.gfm` keeps them as
    the graph's ``notes`` object (`to_dict`/`from_dict`)."""

    #: The ONNX file's SHA-256 (None for a graph built in code).
    model_sha256: str | None = None
    #: The ONNX model's own operator set (an older one is upgraded on import).
    opset: int | None = None
    #: The model's batch dimension was symbolic or −1, bound at import: a run may take a
    #: multiple of it in chunks of ``batched_inputs``' first dimension.
    symbolic_batch: bool = False
    batched_inputs: list[str] = field(default_factory=list)
    #: Inputs whose values were folded into the graph at import (a run refuses them).
    frozen_inputs: list[str] = field(default_factory=list)
    #: Why chunks of a larger batch would mix items (`batch.batch_mixing`), or None.
    batch_mixing: str | None = None
    #: "int8" once quantized.
    quantized: str | None = None
    #: Weights quantized coarser than their range so that a sum cannot overflow (report rows).
    coarser_weights: list[dict] = field(default_factory=list)
    #: The partition report's rows, once nodes are placed on devices.
    partition: list[dict] | None = None
    #: The memory plan's figures (`MEMORY_FIGURES`), once planned.
    memory: dict[str, int] | None = None

    @property
    def partitioned(self) -> bool:
        return self.partition is not None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, notes: dict[str, Any]) -> GraphNotes:
        """The notes of a saved graph, each checked for the type its readers expect. Keys of
        no field are ignored: ``partitioned`` and ``handovers`` of earlier files (now derived)
        and any a newer compiler adds."""
        known = {}
        for f in fields(cls):
            if f.name in notes:
                what = cls.problem(f.name, notes[f.name])
                if what:
                    raise GraphError(f"the graph's note {f.name} must be {what}, not {str(notes[f.name])[:40]}")
                known[f.name] = notes[f.name]
        return cls(**known)

    @staticmethod
    def problem(key: str, value: Any) -> str | None:
        """What note ``key`` must be, when ``value`` is not that; else None."""
        what, check = _NOTE_CHECKS[key]
        return None if check(value) else what


#: What each note must be, and a test of it.
_NOTE_CHECKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "model_sha256": ("64 hexadecimal digits or null", lambda v: v is None or (
        isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v))),
    "opset": ("a whole number or null", lambda v: v is None or whole_number(v)),
    "symbolic_batch": ("true or false", lambda v: isinstance(v, bool)),
    "batched_inputs": ("a list of input names", _list_of(str)),
    "frozen_inputs": ("a list of input names", _list_of(str)),
    "batch_mixing": ("a sentence or null", lambda v: v is None or isinstance(v, str)),
    "quantized": ("int8 or null", lambda v: v in (None, "int8")),
    "coarser_weights": ("a list of objects", _list_of(dict)),
    "partition": ("a list of objects or null", lambda v: v is None or _list_of(dict)(v)),
    "memory": (f"an object of whole numbers {', '.join(MEMORY_FIGURES)}, or null",
               lambda v: v is None or (isinstance(v, dict) and all(whole_number(v.get(k)) for k in MEMORY_FIGURES))),
}


@dataclass
class Graph:
    """Nodes in topological order over `values`, some of them `constants`."""

    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    values: dict[str, Value]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    #: What import and the passes found out (the partition, the memory plan's figures, the batch).
    notes: GraphNotes = field(default_factory=GraphNotes)

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
            where = f"[{node.device}] " if self.notes.partitioned else ""
            lines.append(f"  {where}{node.describe()}  -> {self.values[node.output].describe()}")
        lines.append(f"outputs: {', '.join(self.outputs)}")
        if self.notes.memory is not None:
            m = self.notes.memory
            lines.append(f"device memory: {m['tensors']} packed tensors, peak {m['peak_bytes']:,} bytes "
                         f"(naive {m['naive_bytes']:,}), {m['handovers']} handed over in DRAM")
        return "\n".join(lines)
