"""Storage flattening: multi-dimensional entry references become flat entry offsets.

Every buffer is a row-major array of entries (DRAM tensors in their packed
layout, on-chip buffers in their allocated region shape), so the entry
``[i0, i1, ...]`` is at offset ``((i0·s1 + i1)·s2 + ...)``. After this pass
every `BufferRef` has an ``offset`` and no indices.
"""

from __future__ import annotations

from ....ir import Const, Expr, Node, Stmt, StmtMutator, simplify
from ..nodes import BufferRef

__all__ = ["flatten_storage", "flat_offset"]


def flat_offset(ref: BufferRef) -> Expr:
    """The flat entry offset of a multi-dimensional entry reference."""
    shape = ref.buffer.outer_shape
    if len(ref.indices) != len(shape):
        raise AssertionError(f"{ref!r} has {len(ref.indices)} indices for {len(shape)} entry dimensions")
    offset: Expr = Const(0)
    for index, size in zip(ref.indices, shape):
        offset = offset * size + index
    return simplify(offset)


def flatten_storage(stmt: Stmt) -> Stmt:
    """Give every entry reference a flat entry offset."""
    class Flatten(StmtMutator):
        def visit_node(self, n: Node) -> Node:
            if isinstance(n, BufferRef) and n.offset is None:
                return BufferRef(n.buffer, (), flat_offset(n))
            return n
    return Flatten().visit(stmt)
