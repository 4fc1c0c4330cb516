"""Virtual-thread interleaving: the latency-hiding transformation.

A loop of kind ``vthread`` with V iterations runs V independent copies of its
body (V tiles). This pass gives each copy its own half (third, ...) of every
on-chip buffer allocated inside the body (double buffering for V = 2) and
interleaves the copies: loops that hold work for several engines and have
the same extent in every copy are fused and their bodies interleaved
recursively, while a run of statements for one engine stays together per
copy (an engine is in-order, so splitting one thread's work by another's
would delay the release of its buffers). A reduction chunk then reads
``load(t0) load(t1) gemm(t0) gemm(t1)``. Because the copies touch disjoint
on-chip regions, the dependency tokens the back end derives let the load
engine fetch tile t+1 and the store engine drain tile t−1 while compute works
on tile t. Copies past a partial loop's extent are guarded. The pass runs
after `fold_uop_loops`, so interleaving never splits an instruction's loops.

Two refinements of the order:

- staggered heads: the work before a chunk loop (the accumulator reset) of
  copy t is issued after copy t−1's first chunk, not next to copy t−1's reset.
  The reset waits for the copy's previous store; issued in lockstep it would
  hold the in-order compute engine while other copies' work could run.
- ``sequential`` (the ``vthread_sequential`` pragma, `Stage.vthread` with
  ``order="sequential"``): the copies are issued one after the other. For
  store-bound tiles the store of one copy then runs under the next copy's
  whole tile, where interleaving would finish all copies together and leave
  the store engine idle in between.
"""

from __future__ import annotations

from ....ir import (
    Allocate, AttrStmt, Buffer, BufferStore, Const, Expr, For, ForKind, IfThenElse, Node, Seq, Stmt, StmtMutator,
    const_upper_bound, same_expr, seq, simplify, substitute_stmt, walk,
)
from ..nodes import BufferRef, DmaCopy, HwLoopTask

__all__ = ["inject_virtual_threads"]


def inject_virtual_threads(stmt: Stmt) -> Stmt:
    """Expand every ``vthread`` loop into interleaved, double-buffered copies."""
    class Mutator(StmtMutator):
        def visit_For(self, s: For) -> Stmt:
            if s.kind is not ForKind.VTHREAD:
                return self.generic_visit(s)
            return _expand(s, self.visit(s.body), sequential=False)

        def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
            if s.key == "vthread_sequential" and isinstance(s.body, For) and s.body.kind is ForKind.VTHREAD:
                return _expand(s.body, self.visit(s.body.body), sequential=True)
            return self.generic_visit(s)
    return Mutator().visit(stmt)


def _expand(loop: For, body: Stmt, sequential: bool) -> Stmt:
    threads = const_upper_bound(loop.extent)
    allocs: list[Buffer] = []
    walk(body, lambda s: allocs.append(s.buffer) if isinstance(s, Allocate) else None)
    body = _strip_allocations(body)
    widened = {b: Buffer(b.name, (threads * b.tiles,) + tuple(b.shape[len(b.shape) - b.tile_dims:]),
                         b.dtype, b.scope, b.tile_dims) for b in allocs}
    copies = []
    for t in range(threads):
        copy = substitute_stmt(body, {loop.var: Const(t)})
        copy = _rebase(copy, {b: (widened[b], t * b.tiles) for b in allocs})
        guard = simplify(Const(t) < loop.extent)
        if isinstance(guard, Const) and not guard.value:
            continue
        copies.append((guard, copy))
    out = seq(_guarded(g, s) for g, s in copies) if sequential else _interleave(copies)
    for b in reversed(allocs):
        out = Allocate(widened[b], out)
    return out


def _strip_allocations(stmt: Stmt) -> Stmt:
    class Strip(StmtMutator):
        def visit_Allocate(self, s: Allocate) -> Stmt:
            return self.visit(s.body)
    return Strip().visit(stmt)


def _rebase(stmt: Stmt, moves: dict[Buffer, tuple[Buffer, int]]) -> Stmt:
    """Point every entry reference of a moved buffer at its thread's part of the widened one."""
    class Rebase(StmtMutator):
        def visit_node(self, n: Node) -> Node:
            if isinstance(n, BufferRef) and n.buffer in moves:
                buf, shift = moves[n.buffer]
                return BufferRef(buf, (), simplify(n.offset + shift))
            return n

        def visit_BufferStore(self, s: BufferStore):
            if s.buffer in moves:
                raise AssertionError("virtual threads run after storage flattening and intrinsic injection")
            return s
    return Rebase().visit(stmt)


def _guarded(guard: Expr, stmt: Stmt) -> Stmt:
    if isinstance(guard, Const) and guard.value:
        return stmt
    return IfThenElse(guard, stmt)


def _engine_kind(stmt: Stmt) -> str:
    """Which engine runs every instruction of ``stmt``: load, compute, store or mixed."""
    kinds: set[str] = set()

    def visit(s: Stmt) -> None:
        if isinstance(s, DmaCopy):
            if s.direction == "store":
                kinds.add("store")
            else:
                kinds.add("load" if s.sram.buffer.scope in ("inp", "wgt") else "compute")
        elif isinstance(s, HwLoopTask):
            kinds.add("compute")
    walk(stmt, visit)
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _interleave(copies: list[tuple[Expr, Stmt]]) -> Stmt:
    """Merge structurally identical statements of the copies, interleaving their contents."""
    if len(copies) == 1:
        return _guarded(*copies[0])
    stmts = [s for _, s in copies]
    first = stmts[0]
    if _engine_kind(first) != "mixed":
        # One engine runs all of it: thread-major order, so each thread's part
        # finishes (and releases its buffers) as early as possible.
        return seq(_guarded(g, s) for g, s in copies)
    if all(isinstance(s, For) for s in stmts) and \
            all(s.var is first.var and s.kind == first.kind and
                same_expr(s.extent, first.extent) for s in stmts):
        return For(first.var, first.extent, _interleave([(g, s.body) for g, s in copies]), first.kind,
                   first.thread)
    if all(isinstance(s, Seq) and len(s.stmts) == len(first.stmts) for s in stmts):
        # Consecutive statements of one engine stay together per thread, so an
        # in-order engine never queues thread 1's work between two parts of
        # thread 0's (e.g. ``load a0, load w0, load a1, load w1``).
        out: list[Stmt] = []
        i = 0
        while i < len(first.stmts):
            kind = _engine_kind(first.stmts[i])
            if kind == "compute" and _staggers(first.stmts, i):
                out.extend(_staggered([(g, s.stmts[i]) for g, s in copies],
                                      [(g, s.stmts[i + 1]) for g, s in copies]))
                i += 2
                continue
            j = i + 1
            while kind != "mixed" and j < len(first.stmts) and _engine_kind(first.stmts[j]) == kind:
                j += 1
            if j - i > 1:
                out.extend(_guarded(g, seq(s.stmts[i:j])) for g, s in copies)
            else:
                out.append(_interleave([(g, s.stmts[i]) for g, s in copies]))
            i = j
        return seq(out)
    if all(isinstance(s, AttrStmt) and s.key == first.key for s in stmts):
        return AttrStmt(first.key, first.value, _interleave([(g, s.body) for g, s in copies]))
    return seq(_guarded(g, s) for g, s in copies)


def _staggers(stmts: tuple[Stmt, ...], i: int) -> bool:
    """Compute work (an accumulator reset) followed by work for several engines
    (the reduction chunks, a loop or a single chunk)."""
    return i + 1 < len(stmts) and _engine_kind(stmts[i + 1]) == "mixed"


def _staggered(heads: list[tuple[Expr, Stmt]], loops: list[tuple[Expr, Stmt]]) -> list[Stmt]:
    """``head; for v: body`` of every copy, with each copy's head after the previous
    copy's first iteration: ``head0, body0[0], head1, body1[0], …`` then the other
    iterations interleaved (without a loop of two or more iterations: ``head0,
    body0, head1, body1``). The head of a copy waits for that copy's previous
    tile to leave its buffers (the store of the accumulator tile); in lockstep
    order (``head0, head1, body0[0], …``) the in-order compute engine would wait
    there for the last copy's store with nothing to do, here the first copies'
    work runs meanwhile."""
    first = loops[0][1]
    same_loops = isinstance(first, For) and all(
        isinstance(l, For) and l.var is first.var and l.kind == first.kind and same_expr(l.extent, first.extent)
        for _, l in loops)
    if not (same_loops and isinstance(simplify(first.extent), Const) and simplify(first.extent).value >= 2):
        return [_guarded(g, seq([head, body])) for (g, head), (_, body) in zip(heads, loops)]
    out: list[Stmt] = []
    for (g, head), (_, loop) in zip(heads, loops):
        out.append(_guarded(g, seq([head, substitute_stmt(loop.body, {loop.var: Const(0)})])))
    rest = simplify(first.extent - 1)
    bodies = [(g, substitute_stmt(l.body, {l.var: l.var + 1})) for g, l in loops]
    out.append(For(first.var, rest, _interleave(bodies), first.kind, first.thread))
    return out
