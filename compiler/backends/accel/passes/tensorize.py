"""Tensorize: loop nests marked ``tensorize`` become GEMM micro-ops.

The nest under the mark must compute exactly the declared intrinsic
(`intrin.gemm_intrin`): three loops with the extents of the core shape over
``acc[.., b, o] += inp[.., b, k] · wgt[.., o, k]``, operands in the ``inp``,
``wgt`` and ``acc`` scopes. It is replaced by a `GemmIntrin` whose references
keep the leading (entry-selecting) indices. ``tensorize_init`` nests (the
reduction's zero initialization) become reset micro-ops.
"""

from __future__ import annotations

from ....errors import CompileError
from ....ir import (
    Add, AttrStmt, BufferLoad, BufferStore, Cast, Const, Expr, For, Mul, Stmt, StmtMutator, Var, free_vars,
    simplify,
)
from ..intrin import TensorIntrin
from ..nodes import BufferRef, GemmIntrin

__all__ = ["tensorize", "TensorizeError"]


class TensorizeError(CompileError):
    """A loop nest marked for tensorization does not compute the intrinsic."""


def tensorize(stmt: Stmt) -> Stmt:
    """Replace ``tensorize``/``tensorize_init`` nests by `GemmIntrin` statements."""
    class Mutator(StmtMutator):
        def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
            if s.key == "tensorize":
                return _match_update(s.value, s.body)
            if s.key == "tensorize_init":
                return _match_reset(s.value, s.body)
            return self.generic_visit(s)
    return Mutator().visit(stmt)


def _nest(stmt: Stmt) -> tuple[dict[Var, int], Stmt]:
    loops: dict[Var, int] = {}
    while isinstance(stmt, For):
        ext = simplify(stmt.extent)
        if not isinstance(ext, Const):
            raise TensorizeError(f"loop {stmt.var.name} under the intrinsic has a variable extent {ext!r}")
        loops[stmt.var] = ext.value
        stmt = stmt.body
    return loops, stmt


def _strip_cast(e: Expr) -> Expr:
    return e.value if isinstance(e, Cast) else e


def _split(load: BufferLoad, inner: tuple[Var, Var], what: str) -> BufferRef:
    idx = load.indices
    if len(idx) < 2 or tuple(idx[-2:]) != inner:
        raise TensorizeError(f"{what} {load!r} must be indexed by [..., {inner[0].name}, {inner[1].name}]")
    outer = idx[:-2]
    for e in outer:
        if free_vars(e) & set(inner):
            raise TensorizeError(f"{what} {load!r}: an entry index depends on the intrinsic's loops")
    return BufferRef(load.buffer, tuple(outer))


def _match_update(intrin: TensorIntrin, body: Stmt) -> Stmt:
    loops, store = _nest(body)
    if len(loops) != 3 or not isinstance(store, BufferStore):
        raise TensorizeError(f"{intrin.name}: expected three loops over one store, got {len(loops)} loops")
    value = store.value
    if not (isinstance(value, Add) and isinstance(value.a, BufferLoad) and value.a.buffer is store.buffer
            and isinstance(value.b, Mul)):
        raise TensorizeError(f"{intrin.name}: the body {value!r} is not acc += x * y")
    x, y = _strip_cast(value.b.a), _strip_cast(value.b.b)
    if not (isinstance(x, BufferLoad) and isinstance(y, BufferLoad)):
        raise TensorizeError(f"{intrin.name}: the product {value.b!r} is not of two loads")
    if x.buffer.scope == intrin.wgt_scope:
        x, y = y, x
    scopes = (store.buffer.scope, x.buffer.scope, y.buffer.scope)
    if scopes != (intrin.out_scope, intrin.inp_scope, intrin.wgt_scope):
        raise TensorizeError(f"{intrin.name}: operands are in scopes {scopes}, the intrinsic needs "
                             f"({intrin.out_scope}, {intrin.inp_scope}, {intrin.wgt_scope})")
    b, o = store.indices[-2], store.indices[-1]
    k = x.indices[-1]
    if not all(isinstance(v, Var) and v in loops for v in (b, o, k)):
        raise TensorizeError(f"{intrin.name}: entry indices must be the loop variables")
    batch, block_out, block_in = intrin.shape
    if (loops[b], loops[o], loops[k]) != (batch, block_out, block_in):
        raise TensorizeError(f"{intrin.name}: loop extents {(loops[b], loops[o], loops[k])} differ from the "
                             f"intrinsic's (batch, block_out, block_in) = {intrin.shape}")
    dst = _split(BufferLoad(store.buffer, store.indices), (b, o), "accumulator")
    if value.a.indices != store.indices and [simplify(i) for i in value.a.indices] != \
            [simplify(i) for i in store.indices]:
        raise TensorizeError(f"{intrin.name}: the accumulator read and write differ")
    return GemmIntrin(dst=dst, src=_split(x, (b, k), "input"), wgt=_split(y, (o, k), "weight"))


def _match_reset(intrin: TensorIntrin, body: Stmt) -> Stmt:
    loops, store = _nest(body)
    if len(loops) != 2 or not isinstance(store, BufferStore) or \
            not (isinstance(store.value, Const) and store.value.value == 0):
        raise TensorizeError(f"{intrin.name}: the initialization is not acc = 0 over the entry")
    b, o = store.indices[-2], store.indices[-1]
    return GemmIntrin(dst=_split(BufferLoad(store.buffer, store.indices), (b, o), "accumulator"), reset=True)
