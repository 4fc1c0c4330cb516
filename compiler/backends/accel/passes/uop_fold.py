"""Micro-op loop folding: loop nests of micro-ops become GEMM/ALU instructions.

A GEMM or ALU instruction runs two hardware loops (``iter_out``, ``iter_in``)
over a range of micro-ops, each index advancing by a constant factor per
iteration. For every perfect loop nest ending in one `GemmIntrin` or
`AluIntrin`, this pass picks as hardware loops the two largest loops in
which every reference is affine with a non-negative constant step; of the
remaining loops, the innermost ones are unrolled into the micro-op kernel
while it stays within ``uop_budget`` micro-ops, and the rest stay loops
around the instruction (one instruction per iteration). Reordering the loops
is legal because GEMM accumulation is a commutative sum modulo 2^acc_width
and each ALU instruction updates every destination entry once.
"""

from __future__ import annotations

from gemforge.hw.config import AccelConfig

from ....ir import Const, For, Stmt, StmtMutator, Var, const_upper_bound, free_vars, linear_coefficient
from ..nodes import AluIntrin, BufferRef, GemmIntrin, HwLoopTask

__all__ = ["fold_uop_loops", "DEFAULT_UOP_BUDGET", "default_uop_budget"]

#: Micro-ops one instruction's kernel may unroll (a share of the micro-op buffer).
DEFAULT_UOP_BUDGET = 64


def default_uop_budget(config: AccelConfig) -> int:
    """`DEFAULT_UOP_BUDGET`, or a quarter of a smaller micro-op buffer."""
    return max(1, min(DEFAULT_UOP_BUDGET, config.uop_depth // 4))


def _refs(body: GemmIntrin | AluIntrin) -> list[BufferRef]:
    refs = [body.dst]
    if isinstance(body, GemmIntrin) and not body.reset:
        refs += [body.src, body.wgt]
    if isinstance(body, AluIntrin) and body.src is not None:
        refs.append(body.src)
    return refs


def fold_uop_loops(stmt: Stmt, config: AccelConfig, uop_budget: int | None = None) -> Stmt:
    """Turn micro-op loop nests into `HwLoopTask` instructions; kernels unroll at most
    ``uop_budget`` micro-ops (default: `default_uop_budget`)."""
    budget = default_uop_budget(config) if uop_budget is None else uop_budget
    max_iter = config.max_loop_iterations

    class Mutator(StmtMutator):
        def visit_For(self, s: For) -> Stmt:
            loops: list[For] = []
            body: Stmt = s
            while isinstance(body, For):
                loops.append(body)
                body = body.body
            if isinstance(body, (GemmIntrin, AluIntrin)):
                return _fold(loops, body, budget, max_iter)
            return self.generic_visit(s)

        def visit_GemmIntrin(self, s: GemmIntrin) -> Stmt:
            return _fold([], s, budget, max_iter)

        def visit_AluIntrin(self, s: AluIntrin) -> Stmt:
            return _fold([], s, budget, max_iter)
    return Mutator().visit(stmt)


def _fold(loops: list[For], body: GemmIntrin | AluIntrin, budget: int, max_iter: int) -> Stmt:
    nest_vars = {l.var for l in loops}
    refs = _refs(body)

    def eligible(loop: For) -> bool:
        if free_vars(loop.extent) & nest_vars or const_upper_bound(loop.extent) > max_iter:
            return False
        for r in refs:
            c = linear_coefficient(r.offset, loop.var)
            if c is None or c < 0:
                return False
        return True

    candidates = sorted((l for l in loops if eligible(l)), key=lambda l: -const_upper_bound(l.extent))[:2]
    hw = [l for l in loops if l in candidates]  # keep nest order: outer first
    rest = [l for l in loops if l not in hw]
    uop_loops: list[For] = []
    size = 1
    for loop in reversed(rest):
        ub = const_upper_bound(loop.extent)
        if free_vars(loop.extent) & nest_vars or size * ub > budget:
            break
        uop_loops.insert(0, loop)
        size *= ub
    host = [l for l in rest if l not in uop_loops]
    while len(hw) < 2:
        hw.insert(0, For(Var("unit"), Const(1), body))
    task: Stmt = HwLoopTask("gemm" if isinstance(body, GemmIntrin) else "alu",
                            [(l.var, l.extent) for l in hw], [(l.var, l.extent) for l in uop_loops], body)
    for loop in reversed(host):
        task = For(loop.var, loop.extent, task, loop.kind, loop.thread)
    return task
