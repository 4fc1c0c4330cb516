"""One generic traversal of the IR, driven by the nodes' dataclass fields.

Every node is a dataclass; a field holding a statement, an expression, a
buffer, a helper `Node`, or a list/tuple of those is a child. So passes
written with `StmtMutator` or `map_expr` work on any node kind, including
the ones a back end defines, without a per-node rewriter.

- `walk` visits statements, `walk_expr` expressions (both pre-order);
- `StmtMutator` rebuilds a statement tree: override ``visit_<Class>`` for the
  kinds a pass changes, `visit_expr` / `visit_buffer` to map every
  expression or buffer reference;
- `map_expr` rewrites an expression bottom-up; `substitute`, `free_vars` and
  `replace_buffers` are built on them (`arith.substitute_stmt`, which also
  re-simplifies, too).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .expr import BufferLoad, Expr, Var
from .stmt import Allocate, Buffer, Node, Seq, Stmt, seq

__all__ = [
    "walk", "walk_expr", "StmtMutator", "map_expr", "substitute", "free_vars",
    "replace_buffers", "node_fields",
]

_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def node_fields(node: Any) -> tuple[tuple[str, bool], ...]:
    """``(name, optional)`` of a node's constructor fields (cached per class); a field
    is optional when its default is None."""
    kind = type(node)
    found = _FIELDS.get(kind)
    if found is None:
        found = tuple((f.name, f.default is None) for f in dataclasses.fields(kind) if f.init)
        _FIELDS[kind] = found
    return found


# ---------------------------------------------------------------------------- visiting

def walk(node: Stmt | Node | None, visit: Callable[[Stmt], None]) -> None:
    """Pre-order visit of every statement under ``node``."""
    if node is None:
        return
    if isinstance(node, Stmt):
        visit(node)
    for name, _ in node_fields(node):
        _walk_value(getattr(node, name), visit)


def _walk_value(value: Any, visit) -> None:
    if isinstance(value, (Stmt, Node)):
        walk(value, visit)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _walk_value(v, visit)


def walk_expr(node: Any, visit: Callable[[Expr], None]) -> None:
    """Pre-order visit of every expression in ``node`` (an expression, statement or
    helper node), including expressions nested in expressions."""
    if isinstance(node, Expr):
        visit(node)
        if isinstance(node, Var) or not dataclasses.is_dataclass(node):
            return
    elif not isinstance(node, (Stmt, Node)):
        if isinstance(node, (list, tuple)):
            for v in node:
                walk_expr(v, visit)
        return
    for name, _ in node_fields(node):
        value = getattr(node, name)
        if isinstance(value, (Expr, Stmt, Node, list, tuple)):
            walk_expr(value, visit)


# ---------------------------------------------------------------------------- expressions

def map_expr(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: each node is rebuilt from its rewritten children, then
    ``fn`` returns a replacement for it, or None to keep it."""
    node = expr
    if not isinstance(expr, Var) and dataclasses.is_dataclass(expr):
        changes = {}
        for name, _ in node_fields(expr):
            value = getattr(expr, name)
            if isinstance(value, Expr):
                new = map_expr(value, fn)
                if new is not value:
                    changes[name] = new
            elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
                new_t = tuple(map_expr(v, fn) for v in value)
                if any(a is not b for a, b in zip(new_t, value)):
                    changes[name] = new_t
        if changes:
            node = dataclasses.replace(expr, **changes)
    new = fn(node)
    return node if new is None else new


def substitute(expr: Expr, mapping: dict[Var, Expr]) -> Expr:
    """Replace variables by expressions."""
    if not mapping:
        return expr
    return map_expr(expr, lambda e: mapping.get(e) if isinstance(e, Var) else None)


def free_vars(node: Any) -> set[Var]:
    """The variables an expression (or statement) mentions."""
    found: set[Var] = set()
    walk_expr(node, lambda e: found.add(e) if isinstance(e, Var) else None)
    return found


# ---------------------------------------------------------------------------- statements

class StmtMutator:
    """Rebuilds a statement tree; override ``visit_<Class>`` to rewrite a kind of
    statement, `visit_expr` to map every expression (loop extents, indices,
    values, the expressions inside helper nodes) and `visit_buffer` every buffer.

    Other statements have their fields visited and are rebuilt only when a
    field changed. Returning None from a visit drops the statement: from a
    sequence it disappears; a statement whose required body is dropped is
    dropped too (an optional one, like ``else``, just becomes None)."""

    def visit(self, stmt: Stmt | None) -> Stmt | None:
        if stmt is None:
            return None
        method = getattr(self, f"visit_{type(stmt).__name__}", None)
        if method is not None:
            return method(stmt)
        return self.generic_visit(stmt)

    def visit_expr(self, expr: Expr) -> Expr:
        return expr

    def visit_buffer(self, buffer: Buffer) -> Buffer:
        return buffer

    def visit_node(self, node: Node) -> Node:
        changes = self._field_changes(node)
        return dataclasses.replace(node, **changes) if changes else node

    def generic_visit(self, stmt: Stmt) -> Stmt | None:
        changes = self._field_changes(stmt)
        if changes is None:
            return None
        if not changes:
            return stmt
        if isinstance(stmt, Seq):
            return seq(changes["stmts"]) if changes["stmts"] else None
        return dataclasses.replace(stmt, **changes)

    def _field_changes(self, node) -> dict[str, Any] | None:
        """Rebuilt fields that differ; None when a required statement field was dropped."""
        changes: dict[str, Any] = {}
        for name, optional in node_fields(node):
            value = getattr(node, name)
            if name == "var" and isinstance(value, Var):
                continue  # a loop's or binding's own variable is a binder, not a use
            new = self._value(value)
            if new is _DROP:
                if not optional:
                    return None
                new = None
            if new is not value:
                changes[name] = new
        return changes

    def _value(self, value: Any) -> Any:
        if isinstance(value, Stmt):
            new = self.visit(value)
            return _DROP if new is None else new
        if isinstance(value, Expr):
            return self.visit_expr(value)
        if isinstance(value, Buffer):
            return self.visit_buffer(value)
        if isinstance(value, Node):
            return self.visit_node(value)
        if isinstance(value, (list, tuple)):
            items = [self._value(v) for v in value]
            kept = [v for v in items if v is not _DROP]
            if len(kept) == len(value) and all(a is b for a, b in zip(kept, value)):
                return value
            return type(value)(kept) if isinstance(value, list) else tuple(kept)
        return value


_DROP = object()


def replace_buffers(stmt: Stmt, mapping: dict[Buffer, Buffer], drop_allocations: bool = False) -> Stmt:
    """Rename buffers everywhere (loads, stores, back-end references); optionally
    drop the allocations of the renamed buffers (they became aliases)."""
    if not mapping:
        return stmt

    def target(b: Buffer) -> Buffer:
        while b in mapping:
            b = mapping[b]
        return b

    def rename_load(e: Expr):
        if isinstance(e, BufferLoad) and e.buffer in mapping:
            return BufferLoad(target(e.buffer), e.indices, e.zero_outside)
        return None

    class Rename(StmtMutator):
        def visit_expr(self, e: Expr) -> Expr:
            return map_expr(e, rename_load)

        def visit_buffer(self, b: Buffer) -> Buffer:
            return target(b)

        def visit_Allocate(self, s: Allocate) -> Stmt | None:
            body = self.visit(s.body)
            if s.buffer in mapping and drop_allocations:
                return body
            return Allocate(target(s.buffer), body) if body is not None else None
    return Rename().visit(stmt)
