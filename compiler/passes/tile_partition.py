"""Loop partitioning of partial tiles: full tiles get constant loop extents.

Splitting an axis of extent N by a factor f that does not divide it leaves
every tile's inner loops with extents like ``min(f, N − o·f)``: correct, but
a variable extent stops unrolling and vectorization in *every* tile. This pass
finds, for each loop ``o``, the loops inside it whose extent depends on ``o``
(and on no loop inside it) and is not a constant, and splits the body::

    for o:                          for o:
      for i in range(min(f, N-o·f))   if N-o·f >= f:   (every such extent at its bound)
        ...                   →         for i in range(f): ...
                                      else:
                                        for i in range(min(f, N-o·f)): ...

The first branch runs for all tiles but the last and has constant extents;
the second keeps the general code. TVM calls this loop partitioning.
"""

from __future__ import annotations

from ..ir import (
    And, Cmp, Const, Expr, For, IfThenElse, Stmt, StmtMutator, Var, const_upper_bound, free_vars, simplify, walk,
)

__all__ = ["partition_tiles"]


def partition_tiles(stmt: Stmt) -> Stmt:
    """Give full tiles constant loop extents (see the module docstring)."""
    return _Partition().visit(stmt)


class _Partition(StmtMutator):
    def visit_For(self, s: For) -> Stmt:
        tails = _tails(s)
        if not tails:
            return For(s.var, s.extent, self.visit(s.body), s.kind, s.thread)
        cond: Expr | None = None
        for _, extent, bound in tails:
            c = Cmp("<=", Const(bound), extent)
            cond = c if cond is None else And(cond, c)
        full = _FixExtents({id(loop): bound for loop, _, bound in tails}).visit(s.body)
        body = IfThenElse(cond, self.visit(full), self.visit(s.body))
        return For(s.var, s.extent, body, s.kind, s.thread)


def _tails(loop: For) -> list[tuple[For, Expr, int]]:
    """Loops inside ``loop`` whose extent varies with ``loop``'s variable only (and
    outer ones): (loop, extent, its constant upper bound)."""
    inner: set[Var] = set()
    walk(loop.body, lambda x: inner.add(x.var) if isinstance(x, For) else None)
    found: list[tuple[For, Expr, int]] = []

    def visit(x: Stmt) -> None:
        if not isinstance(x, For):
            return
        extent = simplify(x.extent)
        if isinstance(extent, Const):
            return
        used = free_vars(extent)
        if loop.var not in used or used & inner:
            return
        try:
            bound = const_upper_bound(extent)
        except ValueError:
            return
        found.append((x, extent, bound))
    walk(loop.body, visit)
    return found


class _FixExtents(StmtMutator):
    """The loops named by id get their constant extent."""

    def __init__(self, bounds: dict[int, int]) -> None:
        self.bounds = bounds

    def visit_For(self, s: For) -> Stmt:
        extent = Const(self.bounds[id(s)]) if id(s) in self.bounds else s.extent
        return For(s.var, extent, self.visit(s.body), s.kind, s.thread)
