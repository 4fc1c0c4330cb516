"""On-chip storage allocation with capacity checks.

Every on-chip allocation gets a fixed base entry in its buffer (``inp``,
``wgt`` or ``acc``; the output buffer mirrors the accumulator's indices).
Allocations are packed one after another per buffer; if they exceed the
config's depth, the schedule is refused with the buffer, the need and the
capacity. References become absolute entry indices, allocations disappear,
and the plan is kept in a ``storage_plan`` attribute at the top.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemforge.hw.config import AccelConfig

from ....errors import CompileError
from ....ir import Allocate, AttrStmt, Buffer, Node, Stmt, StmtMutator, simplify, walk
from ..nodes import ON_CHIP_SCOPES, BufferRef

__all__ = ["allocate_storage", "StoragePlan", "CapacityError"]

_NAMES = {"inp": "input", "wgt": "weight", "acc": "accumulator"}


class CapacityError(CompileError):
    """A schedule's on-chip buffers do not fit the config."""


@dataclass
class StoragePlan:
    """Base entry of every on-chip buffer and the entries used per scope."""

    bases: dict[Buffer, int]
    used: dict[str, int]


def allocate_storage(stmt: Stmt, config: AccelConfig) -> Stmt:
    """Place every on-chip allocation; refuse schedules that do not fit."""
    allocs: list[Buffer] = []
    walk(stmt, lambda s: allocs.append(s.buffer) if isinstance(s, Allocate) else None)
    bases: dict[Buffer, int] = {}
    used = dict.fromkeys(ON_CHIP_SCOPES, 0)
    for buf in allocs:
        if buf.scope not in ON_CHIP_SCOPES:
            raise CapacityError(f"buffer {buf.name} has scope {buf.scope!r}, which has no storage on chip")
        bases[buf] = used[buf.scope]
        used[buf.scope] += buf.tiles
    for scope, need in used.items():
        depth = config.depth(scope)
        if need > depth:
            parts = ", ".join(f"{b.name}: {b.tiles}" for b in allocs if b.scope == scope)
            raise CapacityError(
                f"the schedule needs {need} entries of the {_NAMES[scope]} buffer ({parts}) but config "
                f"{config.name!r} has {depth}; use smaller tiles or a larger {scope}_buffer_bytes")

    class Place(StmtMutator):
        def visit_Allocate(self, s: Allocate) -> Stmt | None:
            return self.visit(s.body)

        def visit_node(self, n: Node) -> Node:
            if isinstance(n, BufferRef) and n.buffer in bases:
                return BufferRef(n.buffer, (), simplify(n.offset + bases[n.buffer]))
            return n
    return AttrStmt("storage_plan", StoragePlan(bases, used), Place().visit(stmt))
