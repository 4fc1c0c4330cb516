"""ALU intrinsic injection: element-wise accumulator stages become ALU micro-ops.

A nest marked ``alu`` computes ``E[i] = f(P[i], ...)`` over whole entries,
where ``P`` is an accumulator-scope stage read at the same index and ``f`` is
a chain of ``+ - * >> min max`` with immediates or other accumulator-scope
operands (bias, residual, pooling windows), and optionally a final cast (the
output buffer's mirror of the low bits is that cast). It becomes one ALU
statement per operation, in place on ``P`` (the hardware ALU updates
``acc[dst]``); ``E`` is then an alias of ``P``: its allocation disappears
and its readers read ``P``. A stage with no operation is a pure alias (no
instructions). A chain that starts from an entry at another index (max
pooling: ``max(x[2i], x[2i+1])``) keeps its own buffer and starts by copying
that entry in (``E = (E << 32) + x[2i]``, a clearing shift: the ALU has no move).
"""

from __future__ import annotations

from gemforge.hw.config import SUPPORTED_ACC_WIDTHS, AccelConfig

from ....errors import CompileError
from ....ir import (
    Add, AttrStmt, BinOp, Buffer, BufferLoad, BufferStore, Cast, Const, Expr, For, Max, Min, Mul, Shr, Stmt,
    StmtMutator, Sub, Var, map_expr, replace_buffers, same_expr, seq, simplify,
)
from ..nodes import AluIntrin, BufferRef

__all__ = ["inject_alu", "AluInjectionError"]

_OPS = {Add: "add", Mul: "mul", Max: "max", Min: "min", Shr: "shr"}
_COMMUTATIVE = (Add, Mul, Max, Min)


class AluInjectionError(CompileError):
    """A stage marked ``alu`` is not expressible with the tensor ALU."""


def inject_alu(stmt: Stmt, config: AccelConfig) -> Stmt:
    """Replace ``alu`` nests by `AluIntrin` statements and alias their buffers in place."""
    aliases: dict[Buffer, Buffer] = {}

    class Mutator(StmtMutator):
        def visit_AttrStmt(self, s: AttrStmt) -> Stmt | None:
            if s.key == "alu":
                return _lower(s.body, aliases, config.alu_imm_range)
            return self.generic_visit(s)
    stmt = Mutator().visit(stmt)
    return replace_buffers(stmt, aliases, drop_allocations=True)


def _lower(nest: Stmt, aliases: dict[Buffer, Buffer], imm_range: tuple[int, int]) -> Stmt | None:
    loops: list[For] = []
    body = nest
    while isinstance(body, For):
        loops.append(body)
        body = body.body
    if not isinstance(body, BufferStore) or len(loops) < 2:
        raise AluInjectionError(f"an alu stage must be a loop nest over one store, got {type(body).__name__}")
    store = body
    entry = (loops[-2].var, loops[-1].var)
    if tuple(store.indices[-2:]) != entry:
        raise AluInjectionError(f"alu stage {store.buffer.name}: the innermost loops must walk the entry")
    found = _chain(store.value, store.indices, entry, True)
    if found is not None and found[0] is not _OWN and not _in_place_ok(found[0], store):
        found = _chain(store.value, store.indices, entry, False)
    if found is None:
        raise AluInjectionError(f"alu stage {store.buffer.name}: {store.value!r} is not a chain of ALU "
                                "operations on accumulator values")
    base, ops = found
    if base is _OWN:
        # The chain starts from another entry: the stage keeps its buffer and
        # first copies that entry in ((x << 32) + y, since the ALU has no move).
        base = store.buffer
    else:
        aliases[store.buffer] = base
    dst = BufferRef(base, tuple(store.indices[:-2]))
    stmts: list[Stmt] = []
    for op, operand in ops:
        if isinstance(operand, int):
            if not imm_range[0] <= operand <= imm_range[1]:
                raise AluInjectionError(f"alu immediate {operand} does not fit the immediate field "
                                        f"({imm_range[0]}..{imm_range[1]})")
            intrin: Stmt = AluIntrin(op, dst, imm=operand)
        else:
            intrin = AluIntrin(op, dst, src=operand)
        for loop in reversed(loops[:-2]):
            intrin = For(loop.var, loop.extent, intrin, loop.kind, loop.thread)
        stmts.append(intrin)
    if not stmts:
        return None
    return seq(stmts)


_OWN = object()  # marker: the chain starts by copying an entry into the stage's own buffer
#: A left shift (SHR by a negative amount) of acc_width bits or more clears an entry; it
#: runs at one micro-op per cycle, where a MUL by zero would take two.
_CLEARING_SHIFT = max(SUPPORTED_ACC_WIDTHS)


def _in_place_ok(base: Buffer, store: BufferStore) -> bool:
    """Updating ``base`` in place is only right if it has the stage's shape and the
    stage reads it nowhere but at the destination entry (pooling reads neighbours)."""
    if tuple(base.shape) != tuple(store.buffer.shape):
        return False
    reads: list[BufferLoad] = []
    map_expr(store.value, lambda e: reads.append(e) if isinstance(e, BufferLoad) and e.buffer is base else None)
    return all(_same(r.indices, store.indices) for r in reads)


def _chain(e: Expr, index: tuple, entry: tuple[Var, Var], in_place: bool):
    """``(base, [(op, imm or BufferRef)])`` for an update chain, or None.

    ``base`` is the accumulator-scope buffer updated in place (read at the
    destination index), or `_OWN` when the chain starts from a different entry."""
    if isinstance(e, Cast):
        return _chain(e.value, index, entry, in_place)
    if isinstance(e, BufferLoad):
        if in_place and e.buffer.scope == "acc" and _same(e.indices, index):
            return e.buffer, []
        ref = _operand(e, entry)
        if isinstance(ref, BufferRef):
            return _OWN, [("shr", -_CLEARING_SHIFT), ("add", ref)]
        return None
    if isinstance(e, BinOp) and type(e) in (*_OPS, Sub):
        orders = [(e.a, e.b)] + ([(e.b, e.a)] if isinstance(e, _COMMUTATIVE) else [])
        for inner, operand in orders:
            found = _chain(inner, index, entry, in_place)
            if found is None:
                continue
            arg = _operand(operand, entry)
            if arg is None:
                continue
            base, ops = found
            if isinstance(e, Sub):
                if not isinstance(arg, int):
                    raise AluInjectionError("alu subtraction of a tensor operand is not supported; add its negation")
                return base, ops + [("add", -arg)]
            return base, ops + [(_OPS[type(e)], arg)]
    return None


def _same(a, b) -> bool:
    return len(a) == len(b) and all(same_expr(x, y) for x, y in zip(a, b))


def _operand(e: Expr, entry: tuple[Var, Var]):
    e = simplify(e) if not isinstance(e, BufferLoad) else e
    if isinstance(e, Cast):
        e = e.value
    if isinstance(e, Const):
        return e.value
    if isinstance(e, BufferLoad) and e.buffer.scope == "acc" and tuple(e.indices[-2:]) == entry:
        return BufferRef(e.buffer, tuple(e.indices[:-2]))
    return None

