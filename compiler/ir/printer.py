"""A readable text form of the IR (for `trace`, debugging and documentation).

Statements print one per line, nested bodies indented. A statement kind a
back end defines prints its own line through an ``ir_line()`` method; its
statement fields print nested below it.
"""

from __future__ import annotations

from .stmt import (
    Allocate, AttrStmt, BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, Seq, Stmt,
)
from .traversal import node_fields

__all__ = ["format_ir"]


def format_ir(node: Stmt | PrimFunc, indent: int = 0) -> str:
    """The text form of a statement tree or a function."""
    lines: list[str] = []

    def emit(s: Stmt, depth: int) -> None:
        p = "  " * depth
        if isinstance(s, For):
            kind = "" if s.kind is ForKind.SERIAL else f" [{s.kind.value}{': ' + s.thread if s.thread else ''}]"
            lines.append(f"{p}for {s.var.name} in range({s.extent!r}){kind}:")
            emit(s.body, depth + 1)
        elif isinstance(s, Seq):
            for c in s.stmts:
                emit(c, depth)
        elif isinstance(s, Allocate):
            b = s.buffer
            lines.append(f"{p}allocate {b.name}<{b.scope}>{list(b.shape)} {b.dtype}")
            emit(s.body, depth)
        elif isinstance(s, BufferStore):
            lines.append(f"{p}{s.buffer.name}[{', '.join(map(repr, s.indices))}] = {s.value!r}")
        elif isinstance(s, IfThenElse):
            lines.append(f"{p}if {s.cond!r}:")
            emit(s.then, depth + 1)
            if s.other is not None:
                lines.append(f"{p}else:")
                emit(s.other, depth + 1)
        elif isinstance(s, AttrStmt):
            lines.append(f"{p}// attr {s.key} = {getattr(s.value, 'name', s.value)!r}")
            emit(s.body, depth + 1)
        elif isinstance(s, LetStmt):
            lines.append(f"{p}let {s.var.name} = {s.value!r}")
            emit(s.body, depth)
        elif isinstance(s, Evaluate):
            lines.append(f"{p}{s.value!r}")
        elif hasattr(s, "ir_line"):
            lines.append(f"{p}{s.ir_line()}")
            for name, _ in node_fields(s):
                child = getattr(s, name)
                if isinstance(child, Stmt):
                    emit(child, depth + 1)
        else:
            lines.append(f"{p}{s!r}")

    if isinstance(node, PrimFunc):
        params = ", ".join(f"{b.name}: {b.dtype}{list(b.shape)}" for b in node.params)
        lines.append(f"{'  ' * indent}func {node.name}({params}):")
        emit(node.body, indent + 1)
    else:
        emit(node, indent)
    return "\n".join(lines)
