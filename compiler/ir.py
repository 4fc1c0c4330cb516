"""The one loop IR every gemforge back end consumes.

Expressions are immutable dataclasses (integer arithmetic, loads, casts,
selects); statements are loops, sequences, allocations, stores, attributes
and the accelerator intrinsics that passes introduce. The same IR is meant
for the LLVM CPU/GPU back ends: `For.kind` carries the loop annotations
(serial, unrolled, vectorized, parallel, GPU thread binding, virtual thread)
that those back ends interpret and the accelerator back end refuses or
executes serially.

Buffers are arrays of *entries* followed by *entry dimensions*: for an
on-chip buffer the last two dimensions are one entry of its scope (for
example ``(batch, block_in)`` for ``inp``), so storage flattening turns the
leading dimensions into an entry index and tensor intrinsics move whole
entries.

Also here: `simplify` (canonical affine form, so bounds like
``(t*4 + 3) - t*4 + 1`` fold to ``4``), `interval` (the bounds of an
expression over loop ranges, the engine of bounds inference), `evaluate`
(concrete values, used by the accelerator back end to unroll host loops)
and a small rewriting framework (`StmtMutator`, `substitute`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

__all__ = [
    # expressions
    "Expr", "Var", "Const", "BinOp", "Add", "Sub", "Mul", "FloorDiv", "FloorMod", "Min", "Max",
    "Shr", "Cmp", "And", "Select", "Cast", "BufferLoad", "Reduce", "const", "as_expr",
    # statements
    "Stmt", "Buffer", "ForKind", "For", "Seq", "Allocate", "BufferStore", "IfThenElse", "AttrStmt",
    "BufferRef", "DmaCopy", "GemmIntrin", "AluIntrin", "HwLoopTask", "Evaluate",
    # utilities
    "simplify", "interval", "evaluate", "substitute", "substitute_stmt", "map_expr", "free_vars",
    "const_upper_bound", "extremes", "compile_expr", "replace_buffers", "same_expr", "simplify_in",
    "linear_coefficient", "StmtMutator", "walk", "seq", "SCOPES", "ON_CHIP_SCOPES", "format_ir",
]

#: Storage scopes: DRAM (``global``) and the accelerator's on-chip buffers.
SCOPES = ("global", "inp", "wgt", "acc", "out")
ON_CHIP_SCOPES = ("inp", "wgt", "acc")


# ============================================================================ expressions

class Expr:
    """Base of all expressions; Python operators build IR nodes."""

    dtype: str = "int32"

    def __add__(self, o): return Add(self, as_expr(o))
    def __radd__(self, o): return Add(as_expr(o), self)
    def __sub__(self, o): return Sub(self, as_expr(o))
    def __rsub__(self, o): return Sub(as_expr(o), self)
    def __mul__(self, o): return Mul(self, as_expr(o))
    def __rmul__(self, o): return Mul(as_expr(o), self)
    def __floordiv__(self, o): return FloorDiv(self, as_expr(o))
    def __mod__(self, o): return FloorMod(self, as_expr(o))
    def __rshift__(self, o): return Shr(self, as_expr(o))
    def __lt__(self, o): return Cmp("<", self, as_expr(o))
    def __le__(self, o): return Cmp("<=", self, as_expr(o))
    def __gt__(self, o): return Cmp("<", as_expr(o), self)
    def __ge__(self, o): return Cmp("<=", as_expr(o), self)

    def astype(self, dtype: str) -> Expr:
        return Cast(dtype, self)

    # Nodes compare structurally (dataclass eq); keep them hashable for dict keys.
    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A loop or symbolic variable; identity is the object, the name is for printing."""

    name: str
    dtype: str = "int32"

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const(Expr):
    value: int
    dtype: str = "int32"

    __hash__ = Expr.__hash__

    def __repr__(self) -> str:
        return str(self.value)


def const(value: int, dtype: str = "int32") -> Const:
    return Const(int(value), dtype)


def as_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, (int,)) or hasattr(value, "__index__"):
        return Const(int(value))
    if isinstance(getattr(value, "var", None), Var):  # a te.IterVar stands for its variable
        return value.var
    raise TypeError(f"cannot use {value!r} as an IR expression")


@dataclass(frozen=True, eq=False)
class BinOp(Expr):
    a: Expr
    b: Expr
    symbol = "?"

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.a.dtype

    def __repr__(self) -> str:
        if self.symbol.isalpha():
            return f"{self.symbol}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {self.symbol} {self.b!r})"


class Add(BinOp): symbol = "+"
class Sub(BinOp): symbol = "-"
class Mul(BinOp): symbol = "*"
class FloorDiv(BinOp): symbol = "//"
class FloorMod(BinOp): symbol = "%"
class Min(BinOp): symbol = "min"
class Max(BinOp): symbol = "max"
class Shr(BinOp): symbol = ">>"  # arithmetic shift right
class And(BinOp): symbol = "and"


@dataclass(frozen=True, eq=False)
class Cmp(Expr):
    op: str  # "<" or "<="
    a: Expr
    b: Expr
    dtype: str = "bool"

    def __repr__(self) -> str:
        return f"({self.a!r} {self.op} {self.b!r})"


@dataclass(frozen=True, eq=False)
class Select(Expr):
    cond: Expr
    then: Expr
    other: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.then.dtype

    def __repr__(self) -> str:
        return f"select({self.cond!r}, {self.then!r}, {self.other!r})"


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    to: str
    value: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.to

    def __repr__(self) -> str:
        return f"{self.to}({self.value!r})"


@dataclass(frozen=True, eq=False)
class BufferLoad(Expr):
    """``buffer[indices]``. With ``zero_outside`` an index outside the buffer's
    shape reads 0 (zero padding; the DMA engine implements it in hardware)."""

    buffer: "Buffer"
    indices: tuple[Expr, ...]
    zero_outside: bool = False

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.buffer.dtype

    def __repr__(self) -> str:
        pad = "?" if self.zero_outside else ""
        return f"{self.buffer.name}{pad}[{', '.join(map(repr, self.indices))}]"


@dataclass(frozen=True, eq=False)
class Reduce(Expr):
    """A commutative reduction (only ``sum``) of ``value`` over ``axes`` (tensor expressions only)."""

    combiner: str
    value: Expr
    axes: tuple  # of te.IterVar

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.value.dtype

    def __repr__(self) -> str:
        return f"{self.combiner}({self.value!r}, axes=[{', '.join(a.var.name for a in self.axes)}])"


# ============================================================================ buffers and statements

@dataclass(eq=False)
class Buffer:
    """A named array in a storage scope. ``shape`` may hold expressions only for
    DRAM tensors; on-chip buffers get constant shapes from bounds inference."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"
    #: Trailing dimensions forming one on-chip entry (2 for tensors moved by the accelerator).
    entry_dims: int = 2

    def __repr__(self) -> str:
        return f"{self.name}<{self.scope}>"

    @property
    def outer_shape(self) -> tuple[int, ...]:
        return self.shape[:len(self.shape) - self.entry_dims]

    @property
    def entries(self) -> int:
        n = 1
        for d in self.outer_shape:
            n *= d
        return n


class Stmt:
    __hash__ = object.__hash__


class ForKind(enum.Enum):
    SERIAL = "serial"
    UNROLLED = "unroll"
    VECTORIZED = "vectorize"
    PARALLEL = "parallel"
    THREAD_BINDING = "thread_binding"  # GPU block/thread index; `For.thread` names it
    VTHREAD = "vthread"                # virtual thread: interleaved by inject_virtual_threads


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
    """An annotation over ``body``: pragmas (``dma_copy``, ``alu``), ``tensorize``
    (value: the intrinsic), ``tensorize_init``."""

    key: str
    value: Any
    body: Stmt


@dataclass(eq=False)
class Evaluate(Stmt):
    """A statement with no data effect visible to the IR (kept for printing and extension)."""

    value: Any


# ---------------------------------------------------------------------------- accelerator intrinsics

@dataclass(frozen=True, eq=False)
class BufferRef:
    """The entry of ``buffer`` at ``indices`` (one index per leading, non-entry
    dimension), or after storage flattening the flat entry ``offset``."""

    buffer: Buffer
    indices: tuple[Expr, ...] = ()
    offset: Expr | None = None

    def __repr__(self) -> str:
        if self.offset is not None:
            return f"{self.buffer.name}@{self.offset!r}"
        return f"{self.buffer.name}[{', '.join(map(repr, self.indices))}]"


@dataclass(eq=False)
class DmaCopy(Stmt):
    """A 2-D strided copy between DRAM and an on-chip buffer (LOAD or STORE).

    ``y_size`` rows of ``x_size`` entries; DRAM rows ``x_stride`` entries apart;
    on chip (loads) the tile is framed by zero padding. ``dram`` references the
    first DRAM entry copied, ``sram`` the top-left corner of the on-chip tile
    including its padding (the LOAD/STORE ``dram_base`` and ``sram_base``)."""

    direction: str      # "load" or "store"
    dram: BufferRef
    sram: BufferRef
    y_size: Expr
    x_size: Expr
    x_stride: int
    y_pad0: Expr = field(default_factory=lambda: Const(0))
    y_pad1: Expr = field(default_factory=lambda: Const(0))
    x_pad0: Expr = field(default_factory=lambda: Const(0))
    x_pad1: Expr = field(default_factory=lambda: Const(0))


@dataclass(eq=False)
class GemmIntrin(Stmt):
    """One GEMM micro-op: ``dst += src · wgtᵀ`` on whole entries (or ``dst = 0`` with reset)."""

    dst: BufferRef
    src: BufferRef | None = None
    wgt: BufferRef | None = None
    reset: bool = False


@dataclass(eq=False)
class AluIntrin(Stmt):
    """One ALU micro-op on accumulator entries: ``dst = op(dst, src or imm)``."""

    op: str             # "min", "max", "add", "shr", "mul"
    dst: BufferRef
    src: BufferRef | None = None
    imm: int | None = None


@dataclass(eq=False)
class HwLoopTask(Stmt):
    """A GEMM or ALU instruction: two hardware loops over a micro-op kernel.

    ``hw_loops`` are the ``(var, extent)`` of iter_out and iter_in; the
    micro-ops are ``body`` (one `GemmIntrin` or `AluIntrin`) for every point of
    ``uop_loops``, with the hardware variables at 0. Index steps per hardware
    iteration are the coefficients of the hardware variables in the references,
    which `fold_uop_loops` guaranteed to be constants."""

    kind: str  # "gemm" or "alu"
    hw_loops: list[tuple[Var, Expr]]
    uop_loops: list[tuple[Var, Expr]]
    body: GemmIntrin | AluIntrin


# ============================================================================ traversal and rewriting

_CHILD_STMTS = {
    For: ("body",), Seq: ("stmts",), Allocate: ("body",), IfThenElse: ("then", "other"),
    AttrStmt: ("body",),
}


def walk(stmt: Stmt, visit: Callable[[Stmt], None]) -> None:
    """Pre-order visit of every statement."""
    visit(stmt)
    for name in _CHILD_STMTS.get(type(stmt), ()):
        child = getattr(stmt, name)
        if isinstance(child, list):
            for c in child:
                walk(c, visit)
        elif child is not None:
            walk(child, visit)


class StmtMutator:
    """Rebuilds a statement tree; override ``visit_<Class>`` to rewrite a kind.

    Unhandled statements have their children visited and are rebuilt only when
    a child changed. Returning ``None`` from a visit drops the statement."""

    def visit(self, stmt: Stmt | None) -> Stmt | None:
        if stmt is None:
            return None
        method = getattr(self, f"visit_{type(stmt).__name__}", None)
        if method is not None:
            return method(stmt)
        return self.generic_visit(stmt)

    def generic_visit(self, stmt: Stmt) -> Stmt | None:
        names = _CHILD_STMTS.get(type(stmt), ())
        changes = {}
        for name in names:
            child = getattr(stmt, name)
            if isinstance(child, list):
                new = [self.visit(c) for c in child]
                new = [c for c in new if c is not None]
                if len(new) != len(child) or any(a is not b for a, b in zip(new, child)):
                    changes[name] = new
            elif child is not None:
                new = self.visit(child)
                if new is not child:
                    changes[name] = new
        if not changes:
            return stmt
        if isinstance(stmt, Seq):
            return seq(changes["stmts"]) if changes["stmts"] else None
        if any(v is None for k, v in changes.items() if k in ("body", "then")):
            return None
        return replace(stmt, **changes)


def map_expr(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: ``fn`` returns a replacement or None to keep the (rebuilt) node."""
    if isinstance(expr, (Var, Const)):
        new = fn(expr)
        return expr if new is None else new
    if isinstance(expr, BinOp):
        a, b = map_expr(expr.a, fn), map_expr(expr.b, fn)
        node = expr if a is expr.a and b is expr.b else type(expr)(a, b)
    elif isinstance(expr, Cmp):
        a, b = map_expr(expr.a, fn), map_expr(expr.b, fn)
        node = expr if a is expr.a and b is expr.b else Cmp(expr.op, a, b)
    elif isinstance(expr, Select):
        node = Select(map_expr(expr.cond, fn), map_expr(expr.then, fn), map_expr(expr.other, fn))
    elif isinstance(expr, Cast):
        node = Cast(expr.to, map_expr(expr.value, fn))
    elif isinstance(expr, BufferLoad):
        node = BufferLoad(expr.buffer, tuple(map_expr(i, fn) for i in expr.indices), expr.zero_outside)
    elif isinstance(expr, Reduce):
        node = Reduce(expr.combiner, map_expr(expr.value, fn), expr.axes)
    else:
        raise TypeError(f"unknown expression {expr!r}")
    new = fn(node)
    return node if new is None else new


def substitute(expr: Expr, mapping: dict[Var, Expr]) -> Expr:
    """Replace variables by expressions."""
    if not mapping:
        return expr
    return map_expr(expr, lambda e: mapping.get(e) if isinstance(e, Var) else None)


def free_vars(expr: Expr) -> set[Var]:
    found: set[Var] = set()

    def visit(e: Expr) -> None:
        if isinstance(e, Var):
            found.add(e)
    map_expr(expr, lambda e: visit(e))
    return found


def substitute_stmt(stmt: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    """Replace variables everywhere in a statement tree (expressions, refs, extents)."""

    def sub(e):
        return None if e is None else simplify(substitute(e, mapping))

    def ref(r: BufferRef | None) -> BufferRef | None:
        if r is None:
            return None
        return BufferRef(r.buffer, tuple(sub(i) for i in r.indices), sub(r.offset))

    class Sub(StmtMutator):
        def visit_For(self, s: For) -> Stmt:
            return replace(s, extent=sub(s.extent), body=self.visit(s.body))

        def visit_BufferStore(self, s: BufferStore) -> Stmt:
            # Values are substituted but not re-associated: passes pattern-match them.
            return BufferStore(s.buffer, tuple(sub(i) for i in s.indices), substitute(s.value, mapping))

        def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
            return IfThenElse(sub(s.cond), self.visit(s.then), self.visit(s.other))

        def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
            return replace(s, body=self.visit(s.body))

        def visit_DmaCopy(self, s: DmaCopy) -> Stmt:
            return replace(s, dram=ref(s.dram), sram=ref(s.sram), y_size=sub(s.y_size),
                           x_size=sub(s.x_size), y_pad0=sub(s.y_pad0), y_pad1=sub(s.y_pad1),
                           x_pad0=sub(s.x_pad0), x_pad1=sub(s.x_pad1))

        def visit_GemmIntrin(self, s: GemmIntrin) -> Stmt:
            return replace(s, dst=ref(s.dst), src=ref(s.src), wgt=ref(s.wgt))

        def visit_AluIntrin(self, s: AluIntrin) -> Stmt:
            return replace(s, dst=ref(s.dst), src=ref(s.src))

        def visit_HwLoopTask(self, s: HwLoopTask) -> Stmt:
            return replace(s, hw_loops=[(v, sub(e)) for v, e in s.hw_loops],
                           uop_loops=[(v, sub(e)) for v, e in s.uop_loops],
                           body=self.visit(s.body))

    return Sub().visit(stmt)


def replace_buffers(stmt: Stmt, mapping: dict[Buffer, Buffer], drop_allocations: bool = False) -> Stmt:
    """Rename buffers everywhere (loads, stores, intrinsic references); optionally
    drop the allocations of the renamed buffers (they became aliases)."""
    if not mapping:
        return stmt

    def target(b: Buffer) -> Buffer:
        while b in mapping:
            b = mapping[b]
        return b

    def fn(e: Expr):
        if isinstance(e, BufferLoad) and e.buffer in mapping:
            return BufferLoad(target(e.buffer), e.indices, e.zero_outside)
        return None

    def ref(r: BufferRef | None) -> BufferRef | None:
        if r is None or r.buffer not in mapping:
            return r
        return BufferRef(target(r.buffer), r.indices, r.offset)

    class Rename(StmtMutator):
        def visit_Allocate(self, s: Allocate) -> Stmt | None:
            body = self.visit(s.body)
            if s.buffer in mapping and drop_allocations:
                return body
            return Allocate(s.buffer, body) if body is not None else None

        def visit_BufferStore(self, s: BufferStore) -> Stmt:
            return BufferStore(target(s.buffer), s.indices, map_expr(s.value, fn))

        def visit_DmaCopy(self, s: DmaCopy) -> Stmt:
            return replace(s, dram=ref(s.dram), sram=ref(s.sram))

        def visit_GemmIntrin(self, s: GemmIntrin) -> Stmt:
            return replace(s, dst=ref(s.dst), src=ref(s.src), wgt=ref(s.wgt))

        def visit_AluIntrin(self, s: AluIntrin) -> Stmt:
            return replace(s, dst=ref(s.dst), src=ref(s.src))
    return Rename().visit(stmt)


# ============================================================================ simplification

def _linear(expr: Expr) -> dict[Any, int] | None:
    """Canonical affine form: {atom: coefficient}, constant under key 1."""
    if isinstance(expr, Const):
        return {1: expr.value}
    if isinstance(expr, Var):
        return {expr: 1}
    if isinstance(expr, Add) or isinstance(expr, Sub):
        a, b = _linear(expr.a), _linear(expr.b)
        sign = 1 if isinstance(expr, Add) else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return {k: v for k, v in out.items() if v != 0 or k == 1}
    if isinstance(expr, Mul):
        a, b = _linear(expr.a), _linear(expr.b)
        if set(b) == {1}:
            return {k: v * b[1] for k, v in a.items()}
        if set(a) == {1}:
            return {k: v * a[1] for k, v in b.items()}
    atom = _atom(expr)
    if isinstance(atom, Const):
        return {1: atom.value}
    return {_AtomKey(atom): 1}


class _AtomKey:
    """A non-affine subexpression used as a variable of the affine form (structural identity)."""

    def __init__(self, expr: Expr) -> None:
        self.expr = expr
        self.key = _key(expr)

    def __eq__(self, other) -> bool:
        return isinstance(other, _AtomKey) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def _key(expr: Expr) -> Any:
    if isinstance(expr, Var):
        return ("var", id(expr))
    if isinstance(expr, Const):
        return ("const", expr.value)
    if isinstance(expr, BinOp):
        return (type(expr).__name__, _key(expr.a), _key(expr.b))
    if isinstance(expr, Cmp):
        return ("cmp", expr.op, _key(expr.a), _key(expr.b))
    if isinstance(expr, Cast):
        return ("cast", expr.to, _key(expr.value))
    if isinstance(expr, Select):
        return ("select", _key(expr.cond), _key(expr.then), _key(expr.other))
    if isinstance(expr, BufferLoad):
        return ("load", id(expr.buffer), tuple(_key(i) for i in expr.indices), expr.zero_outside)
    return ("obj", id(expr))


def _atom(expr: Expr) -> Expr:
    """Simplify the children of a non-affine node and fold constants."""
    if isinstance(expr, BinOp):
        a, b = simplify(expr.a), simplify(expr.b)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(_fold(type(expr), a.value, b.value))
        if isinstance(expr, FloorDiv) and isinstance(b, Const) and b.value == 1:
            return a
        if isinstance(expr, FloorMod) and isinstance(b, Const) and b.value == 1:
            return Const(0)
        if isinstance(expr, (Min, Max)) and _key(a) == _key(b):
            return a
        if isinstance(expr, (Min, Max)):
            diff = simplify(Sub(a, b))
            if isinstance(diff, Const):  # a = b + c: the comparison is decided
                pick_a = (diff.value <= 0) == isinstance(expr, Min)
                return a if pick_a else b
        if isinstance(expr, FloorDiv) and isinstance(b, Const) and b.value > 0:
            lin = _linear(a)
            if all(v % b.value == 0 for v in lin.values()):
                return simplify(_rebuild({k: v // b.value for k, v in lin.items()}))
        return type(expr)(a, b)
    if isinstance(expr, Cmp):
        a, b = simplify(expr.a), simplify(expr.b)
        diff = simplify(Sub(b, a))
        if isinstance(diff, Const):
            return Const(int(diff.value > 0 if expr.op == "<" else diff.value >= 0), "bool")
        return Cmp(expr.op, a, b)
    if isinstance(expr, Select):
        c = simplify(expr.cond)
        if isinstance(c, Const):
            return simplify(expr.then if c.value else expr.other)
        return Select(c, simplify(expr.then), simplify(expr.other))
    if isinstance(expr, Cast):
        return Cast(expr.to, simplify(expr.value))
    if isinstance(expr, BufferLoad):
        return BufferLoad(expr.buffer, tuple(simplify(i) for i in expr.indices), expr.zero_outside)
    return expr


def _fold(kind: type, a: int, b: int) -> int:
    return {Add: a + b, Sub: a - b, Mul: a * b, FloorDiv: a // b if b else 0, FloorMod: a % b if b else 0,
            Min: min(a, b), Max: max(a, b), Shr: a >> b if b >= 0 else a << -b,
            And: int(bool(a) and bool(b))}[kind]


def _rebuild(lin: dict[Any, int]) -> Expr:
    terms: list[Expr] = []
    for k, v in lin.items():
        if k == 1 or v == 0:
            continue
        base = k.expr if isinstance(k, _AtomKey) else k
        terms.append(base if v == 1 else Mul(base, Const(v)))
    c = lin.get(1, 0)
    if not terms:
        return Const(c)
    out = terms[0]
    for t in terms[1:]:
        out = Add(out, t)
    if c > 0:
        out = Add(out, Const(c))
    elif c < 0:
        out = Sub(out, Const(-c))
    return out


def simplify(expr: Expr) -> Expr:
    """Canonicalize integer arithmetic: affine parts are collected and folded."""
    if isinstance(expr, (Add, Sub, Mul)):
        if expr.dtype != "int32" and not expr.dtype.startswith("int"):
            return _atom(expr)
        return _rebuild(_linear(expr))
    if isinstance(expr, (Var, Const)):
        return expr
    return _atom(expr)


def same_expr(a: Expr, b: Expr) -> bool:
    """Structural equality after simplification."""
    return _key(simplify(a)) == _key(simplify(b))


def simplify_in(expr: Expr, ranges: dict[Var, tuple[Expr, Expr]]) -> Expr:
    """`simplify`, then decide ``min``/``max`` whose operands' order is fixed over ``ranges``
    (inclusive constant bounds of loop variables), like TVM's arithmetic analyzer."""
    def fn(e: Expr):
        if isinstance(e, (Min, Max)):
            try:
                lo, hi = interval(simplify(Sub(e.a, e.b)), ranges)
            except ValueError:
                return None
            a_le_b = isinstance(hi, Const) and hi.value <= 0
            a_ge_b = isinstance(lo, Const) and lo.value >= 0
            if isinstance(e, Min):
                return e.a if a_le_b else e.b if a_ge_b else None
            return e.a if a_ge_b else e.b if a_le_b else None
        return None
    return simplify(map_expr(simplify(expr), fn))


def linear_coefficient(expr: Expr, var: Var) -> int | None:
    """The constant coefficient of ``var`` in ``expr``, or None if ``expr`` is not affine in it."""
    lin = _linear(simplify(expr))
    for k in lin:
        if isinstance(k, _AtomKey) and var in free_vars(k.expr):
            return None
    return lin.get(var, 0)


# ============================================================================ intervals and evaluation

def interval(expr: Expr, ranges: dict[Var, tuple[Expr, Expr]]) -> tuple[Expr, Expr]:
    """Inclusive bounds ``(lo, hi)`` of ``expr`` while each var in ``ranges`` takes
    every value in ``[lo, hi]``; other variables stay symbolic. Exact for affine
    expressions, conservative for the rest."""
    def go(e: Expr) -> tuple[Expr, Expr]:
        if isinstance(e, Var):
            return ranges.get(e, (e, e))
        if isinstance(e, Const):
            return e, e
        if isinstance(e, Add):
            (a0, a1), (b0, b1) = go(e.a), go(e.b)
            return a0 + b0, a1 + b1
        if isinstance(e, Sub):
            (a0, a1), (b0, b1) = go(e.a), go(e.b)
            return a0 - b1, a1 - b0
        if isinstance(e, Mul):
            for x, y in ((e.a, e.b), (e.b, e.a)):
                c = simplify(y)
                if isinstance(c, Const):
                    lo, hi = go(x)
                    return (lo * c, hi * c) if c.value >= 0 else (hi * c, lo * c)
        if isinstance(e, FloorDiv):
            c = simplify(e.b)
            if isinstance(c, Const) and c.value > 0:
                lo, hi = go(e.a)
                return FloorDiv(lo, c), FloorDiv(hi, c)
        if isinstance(e, FloorMod):
            c = simplify(e.b)
            if isinstance(c, Const) and c.value > 0:
                lo, hi = go(e.a)
                if _key(simplify(lo)) == _key(simplify(hi)):
                    return FloorMod(lo, c), FloorMod(hi, c)
                return Const(0), Const(c.value - 1)
        if isinstance(e, (Min, Max)):
            (a0, a1), (b0, b1) = go(e.a), go(e.b)
            k = type(e)
            return k(a0, b0), k(a1, b1)
        if not (free_vars(e) & set(ranges)):
            return e, e
        raise ValueError(f"cannot bound {e!r}")
    lo, hi = go(expr)
    return simplify(lo), simplify(hi)


def const_upper_bound(expr: Expr) -> int:
    """A constant ≥ every value of ``expr`` (for allocation sizes of variable-size tiles).

    ``min(a, b)`` is bounded by whichever operand has a constant bound, also
    inside sums (``min(x + 7, 39) - x + 1 ≤ 8``)."""
    e = simplify(expr)
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Max):
        return max(const_upper_bound(e.a), const_upper_bound(e.b))
    found: list[Min] = []
    map_expr(e, lambda x: found.append(x) if isinstance(x, Min) and not found else None)
    if found:
        target = found[0]
        bounds = []
        for part in (target.a, target.b):
            try:
                bounds.append(const_upper_bound(map_expr(e, lambda x, p=part: p if x is target else None)))
            except ValueError:
                pass
        if bounds:
            return min(bounds)
    raise ValueError(f"{e!r} has no constant upper bound")


def evaluate(expr: Expr, env: dict[Var, int]) -> int:
    """The integer value of ``expr`` with variables bound by ``env``."""
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Var):
        try:
            return env[expr]
        except KeyError:
            raise ValueError(f"variable {expr.name} is unbound") from None
    if isinstance(expr, BinOp):
        return _fold(type(expr), evaluate(expr.a, env), evaluate(expr.b, env))
    if isinstance(expr, Cmp):
        a, b = evaluate(expr.a, env), evaluate(expr.b, env)
        return int(a < b if expr.op == "<" else a <= b)
    if isinstance(expr, Select):
        return evaluate(expr.then if evaluate(expr.cond, env) else expr.other, env)
    raise ValueError(f"cannot evaluate {expr!r} to an integer")


_ENUMERATION_LIMIT = 1 << 14


def extremes(e: Expr, loops: list[tuple[Var, Expr]]) -> tuple[int, int] | None:
    """Exact (min, max) of ``e`` over the executed iterations of ``loops`` (outer first),
    or None when there are too many to enumerate."""
    count = 1
    for _, ext in loops:
        count *= const_upper_bound(ext)
    if count > _ENUMERATION_LIMIT:
        return None

    def fast(x: Expr):
        try:
            return compile_expr(x)
        except ValueError:
            return lambda env, x=x: evaluate(x, env)
    value_of = fast(e)
    extents = [(var, fast(ext)) for var, ext in loops]
    values: list[int] = []

    def go(level: int, env: dict) -> None:
        if level == len(extents):
            values.append(value_of(env))
            return
        var, ext = extents[level]
        for i in range(ext(env)):
            env[var] = i
            go(level + 1, env)
        env.pop(var, None)
    try:
        go(0, {})
    except (KeyError, ValueError):  # depends on a variable outside ``loops``
        return None
    return (min(values), max(values)) if values else None


_PY_OPS = {Add: "+", Sub: "-", Mul: "*", FloorDiv: "//", FloorMod: "%"}


def compile_expr(expr: Expr) -> Callable[[dict], int]:
    """``expr`` as a Python function of an environment ``{Var: int}``; same results
    as `evaluate`, much faster when one expression is evaluated many times."""
    names: dict[Var, str] = {}

    def src(e: Expr) -> str:
        if isinstance(e, Const):
            return repr(int(e.value))
        if isinstance(e, Var):
            if e not in names:
                names[e] = f"v{len(names)}"
            return names[e]
        if type(e) in _PY_OPS:
            return f"({src(e.a)} {_PY_OPS[type(e)]} {src(e.b)})"
        if isinstance(e, Min):
            return f"min({src(e.a)}, {src(e.b)})"
        if isinstance(e, Max):
            return f"max({src(e.a)}, {src(e.b)})"
        if isinstance(e, Cmp):
            return f"int({src(e.a)} {e.op} {src(e.b)})"
        if isinstance(e, And):
            return f"int(bool({src(e.a)}) and bool({src(e.b)}))"
        if isinstance(e, Select):
            return f"({src(e.then)} if {src(e.cond)} else {src(e.other)})"
        raise ValueError(f"cannot compile {e!r} to Python")
    body = src(expr)
    binds = "".join(f"    {n} = env[_vars[{i}]]\n" for i, n in enumerate(names.values()))
    code = f"def _f(env):\n{binds}    return {body}\n"
    scope: dict = {"_vars": list(names)}
    exec(code, scope)  # noqa: S102 - generated from IR nodes only
    return scope["_f"]


# ============================================================================ printing

def format_ir(stmt: Stmt, indent: int = 0) -> str:
    """A readable text form of a statement tree (for debugging and documentation)."""
    pad = "  " * indent
    lines: list[str] = []

    def emit(s: Stmt, depth: int) -> None:
        p = "  " * depth
        if isinstance(s, For):
            kind = "" if s.kind is ForKind.SERIAL else f" [{s.kind.value}]"
            lines.append(f"{p}for {s.var.name} in range({s.extent!r}){kind}:")
            emit(s.body, depth + 1)
        elif isinstance(s, Seq):
            for c in s.stmts:
                emit(c, depth)
        elif isinstance(s, Allocate):
            lines.append(f"{p}allocate {s.buffer.name}<{s.buffer.scope}>{list(s.buffer.shape)} {s.buffer.dtype}")
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
        elif isinstance(s, DmaCopy):
            pads = f" pad y({s.y_pad0!r},{s.y_pad1!r}) x({s.x_pad0!r},{s.x_pad1!r})"
            lines.append(f"{p}dma.{s.direction} dram={s.dram!r} sram={s.sram!r} "
                         f"y={s.y_size!r} x={s.x_size!r} stride={s.x_stride}{pads}")
        elif isinstance(s, GemmIntrin):
            what = "reset" if s.reset else f"+= {s.src!r} x {s.wgt!r}"
            lines.append(f"{p}gemm {s.dst!r} {what}")
        elif isinstance(s, AluIntrin):
            operand = s.imm if s.imm is not None else s.src
            lines.append(f"{p}alu.{s.op} {s.dst!r}, {operand!r}")
        elif isinstance(s, HwLoopTask):
            hw = ", ".join(f"{v.name}<{e!r}>" for v, e in s.hw_loops)
            uo = ", ".join(f"{v.name}<{e!r}>" for v, e in s.uop_loops)
            lines.append(f"{p}{s.kind} hw_loops[{hw}] uops[{uo}]:")
            emit(s.body, depth + 1)
        else:
            lines.append(f"{p}{s!r}")
    emit(stmt, indent)
    return "\n".join(lines)
