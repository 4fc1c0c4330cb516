"""Storage flattening: multi-dimensional entry references become flat entry offsets.

Every buffer is a row-major array of entries (DRAM tensors in their packed
layout, on-chip buffers in their allocated region shape), so the entry
``[i0, i1, ...]`` is at offset ``((i0·s1 + i1)·s2 + ...)``. After this pass
every `BufferRef` has an ``offset`` and no indices.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import BufferRef, Const, Expr, Stmt, StmtMutator, simplify

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
    """Give every intrinsic reference a flat entry offset."""
    def flat(r: BufferRef | None) -> BufferRef | None:
        if r is None or r.offset is not None:
            return r
        return BufferRef(r.buffer, (), flat_offset(r))

    class Mutator(StmtMutator):
        def visit_DmaCopy(self, s):
            return replace(s, dram=flat(s.dram), sram=flat(s.sram))

        def visit_GemmIntrin(self, s):
            return replace(s, dst=flat(s.dst), src=flat(s.src), wgt=flat(s.wgt))

        def visit_AluIntrin(self, s):
            return replace(s, dst=flat(s.dst), src=flat(s.src))
    return Mutator().visit(stmt)
