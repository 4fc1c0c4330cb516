"""Statements of the loop IR, buffers and functions.

Statements are loops (whose `ForKind` the schedule sets and each back end
interprets), sequences, allocations, stores, conditionals, attributes (marks
that passes act on), bindings and evaluated calls. A `PrimFunc` is what
lowering produces: a name, buffer parameters, a body and attributes.

Back ends may define further statement kinds (subclasses of `Stmt`) and
helper nodes (subclasses of `Node`) as dataclasses; the generic traversal
(`traversal`) and the printer handle them through their fields.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from math import prod
from typing import Any, Iterable

from .expr import Expr, Var

__all__ = [
    "Buffer", "Stmt", "Node", "ForKind", "For", "Seq", "Allocate", "BufferStore", "IfThenElse", "AttrStmt",
    "Evaluate", "LetStmt", "PrimFunc", "seq",
]


@dataclass(eq=False)
class Buffer:
    """A named array in a storage scope (``global`` is main memory; each target names
    its others, validated by the target).

    ``tile_dims`` trailing dimensions form one tile of a blocked layout (for
    NCHW{B}n{BI}c the last two): back ends that move tiles whole (the
    accelerator's entries) read it; the others ignore it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"
    tile_dims: int = 0

    def __repr__(self) -> str:
        return f"{self.name}<{self.scope}>"

    @property
    def size(self) -> int:
        """Number of elements."""
        return prod(int(d) for d in self.shape)

    @property
    def outer_shape(self) -> tuple[int, ...]:
        """The shape without the tile dimensions (the grid of tiles)."""
        return tuple(self.shape[:len(self.shape) - self.tile_dims])

    @property
    def tiles(self) -> int:
        """Number of tiles (elements when ``tile_dims`` is 0)."""
        return prod(int(d) for d in self.outer_shape)


class Stmt:
    __hash__ = object.__hash__


class Node:
    """A part of a statement that is neither an expression nor a statement (a back
    end's reference to a buffer region); traversals rebuild it through its fields."""


class ForKind(enum.Enum):
    SERIAL = "serial"
    UNROLLED = "unroll"
    VECTORIZED = "vectorize"
    PARALLEL = "parallel"
    THREAD_BINDING = "thread_binding"  # GPU block/thread index; `For.thread` names it
    VTHREAD = "vthread"                # virtual thread (latency hiding on the accelerator)


@dataclass(eq=False)
class For(Stmt):
    """``for var in range(extent)`` (loops are normalized to start at 0)."""

    var: Var
    extent: Expr
    body: Stmt
    kind: ForKind = ForKind.SERIAL
    thread: str | None = None


@dataclass(eq=False)
class Seq(Stmt):
    stmts: list[Stmt]


def seq(stmts: Iterable[Stmt | None]) -> Stmt:
    """A sequence with nested sequences flattened; one statement stays itself."""
    out: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        out.extend(s.stmts if isinstance(s, Seq) else [s])
    return out[0] if len(out) == 1 else Seq(out)


@dataclass(eq=False)
class Allocate(Stmt):
    """Storage for ``buffer`` (in its scope) while ``body`` runs."""

    buffer: Buffer
    body: Stmt


@dataclass(eq=False)
class BufferStore(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(eq=False)
class IfThenElse(Stmt):
    cond: Expr
    then: Stmt
    other: Stmt | None = None


@dataclass(eq=False)
class AttrStmt(Stmt):
    """An annotation over ``body`` that passes act on: pragmas (``dma_copy``,
    ``alu``), ``tensorize`` (value: the intrinsic), ``tensorize_init``."""

    key: str
    value: Any
    body: Stmt


@dataclass(eq=False)
class LetStmt(Stmt):
    """``var = value`` while ``body`` runs."""

    var: Var
    value: Expr
    body: Stmt


@dataclass(eq=False)
class Evaluate(Stmt):
    """An expression evaluated for its effect (a call such as a barrier)."""

    value: Expr


@dataclass(eq=False)
class PrimFunc:
    """A lowered function: buffer parameters (inputs and outputs, in DRAM / main
    memory), a body, and attributes (``target``, ``schedule`` notes, ...)."""

    name: str
    params: list[Buffer]
    body: Stmt
    attrs: dict[str, Any] = field(default_factory=dict)

    def with_body(self, body: Stmt) -> PrimFunc:
        return PrimFunc(self.name, list(self.params), body, dict(self.attrs))
