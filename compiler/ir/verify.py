"""The verifier: checks that a lowered function is well formed before a back end
consumes it, so a malformed schedule fails with a clear message at its source
instead of as wrong code.

Checked: every variable is bound (by an enclosing loop or binding) before it
is used; every buffer read or written is a parameter or allocated around the
access; every scope is one the target has; stored values have the buffer's
type; loop extents and indices are integers (calls are checked when built).
"""

from __future__ import annotations

from typing import Iterable

from .dtypes import is_int
from .expr import BufferLoad, Expr, Var
from .stmt import Allocate, Buffer, BufferStore, For, LetStmt, PrimFunc, Stmt
from .traversal import node_fields, walk_expr

__all__ = ["verify", "VerifyError"]


class VerifyError(ValueError):
    """A lowered function is malformed (an unbound variable, an unknown buffer, a type mismatch)."""


def verify(func: PrimFunc, scopes: Iterable[str] | None = None) -> PrimFunc:
    """Check ``func``; returns it unchanged, or raises `VerifyError` naming the problem.
    ``scopes`` are the storage scopes the target allows (None: any)."""
    allowed = None if scopes is None else set(scopes)
    for b in func.params:
        if b.scope != "global":
            raise VerifyError(f"parameter {b.name} of {func.name} is in scope {b.scope!r}; parameters live in "
                              "global memory")
    _Checker(func, allowed).stmt(func.body, set(), set(func.params))
    return func


class _Checker:
    def __init__(self, func: PrimFunc, scopes: set[str] | None) -> None:
        self.func = func
        self.scopes = scopes

    def fail(self, message: str) -> None:
        raise VerifyError(f"{self.func.name}: {message}")

    def expr(self, e: Expr, bound: set[Var], buffers: set[Buffer]) -> None:
        def visit(x: Expr) -> None:
            if isinstance(x, Var) and x not in bound:
                self.fail(f"variable {x.name} is used outside the loops that define it")
            elif isinstance(x, BufferLoad):
                self.buffer(x.buffer, buffers)
                self.indices(x.buffer, x.indices)
        walk_expr(e, visit)

    def buffer(self, b: Buffer, buffers: set[Buffer]) -> None:
        if b not in buffers:
            self.fail(f"buffer {b.name} is accessed but is neither a parameter nor allocated around the access")

    def indices(self, b: Buffer, indices) -> None:
        if len(indices) != len(b.shape):
            self.fail(f"{b.name} has {len(b.shape)} dimensions but is indexed with {len(indices)}")
        for i in indices:
            if not is_int(i.dtype):
                self.fail(f"index {i!r} of {b.name} is {i.dtype}, not an integer")

    def stmt(self, s: Stmt, bound: set[Var], buffers: set[Buffer]) -> None:
        if isinstance(s, For):
            self.expr(s.extent, bound, buffers)
            if not is_int(s.extent.dtype):
                self.fail(f"loop {s.var.name} has a non-integer extent {s.extent!r}")
            self.stmt(s.body, bound | {s.var}, buffers)
            return
        if isinstance(s, LetStmt):
            self.expr(s.value, bound, buffers)
            self.stmt(s.body, bound | {s.var}, buffers)
            return
        if isinstance(s, Allocate):
            if self.scopes is not None and s.buffer.scope not in self.scopes:
                self.fail(f"buffer {s.buffer.name} is in scope {s.buffer.scope!r}; this target has "
                          f"{', '.join(sorted(self.scopes))}")
            self.stmt(s.body, bound, buffers | {s.buffer})
            return
        if isinstance(s, BufferStore):
            self.buffer(s.buffer, buffers)
            self.indices(s.buffer, s.indices)
            for i in s.indices:
                self.expr(i, bound, buffers)
            self.expr(s.value, bound, buffers)
            if s.value.dtype != s.buffer.dtype:
                self.fail(f"store of a {s.value.dtype} value into {s.buffer.name} ({s.buffer.dtype}): "
                          f"{s.value!r}")
            return
        for name, _ in node_fields(s):
            value = getattr(s, name)
            for child in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(child, Stmt):
                    self.stmt(child, bound, buffers)
                elif isinstance(child, Expr) and not (name == "var" and isinstance(child, Var)):
                    self.expr(child, bound, buffers)
