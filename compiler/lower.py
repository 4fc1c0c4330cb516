"""Schedule → loop IR: bounds inference and loop-nest generation.

`infer_bounds` decides, for every stage placed with ``compute_at``, which
region of its output the consumers need per iteration of the attach loop
(TVM's InferBound): each consumer read is bounded over the loops that run
inside the attach point, while the enclosing loops stay symbolic. The region
gives the stage's on-chip allocation (constant upper bounds) and its loop
extents (exact, possibly depending on enclosing loops).

`schedule_to_ir` then emits one loop nest per stage: stages attached to a
loop are emitted inside it before the consumer's inner loops, each on-chip
stage inside an `Allocate`; reductions get their initialization nest before
the outermost reduction loop; pragmas, tensorize marks and loop kinds
become `AttrStmt` and `For.kind`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd

from .ir import (
    Add, Allocate, AttrStmt, Buffer, BufferLoad, BufferStore, Const, Expr, FloorDiv, For, ForKind, Max, Min,
    Reduce, Stmt, Var, const_upper_bound, extremes, free_vars, interval, linear_coefficient, map_expr, same_expr,
    seq, simplify, substitute,
)
from .schedule import Schedule, ScheduleError, Split, Stage
from .te import IterVar

__all__ = ["Region", "infer_bounds", "schedule_to_ir", "inline_stages"]


@dataclass
class Region:
    """Per data axis of a stage: first index (expression of enclosing loops), extent,
    allocation size and stride: position ``k`` of the region is index ``lo + k·stride``.

    A stride above 1 arises when every consumer read steps over the axis in
    multiples of it (a 1×1 convolution with stride 2 reads every other pixel):
    the on-chip copy then holds only the positions read."""

    lo: list[Expr]
    extent: list[Expr]
    alloc: list[int]
    stride: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.stride:
            self.stride = [1] * len(self.lo)


def inline_stages(sch: Schedule) -> None:
    """Substitute every ``compute_inline`` stage's formula into its readers."""
    for stage in sch.stages:
        if not stage.inlined:
            continue
        op = stage.op

        def fn(e: Expr, op=op):
            if isinstance(e, BufferLoad) and e.buffer is op.output.buffer:
                return substitute(op.body, {a.var: i for a, i in zip(op.axes, e.indices)})
            return None
        for reader in sch.stages:
            if not reader.is_placeholder and reader is not stage:
                reader.op.body = map_expr(reader.op.body, fn)


def _lowered(sch: Schedule) -> list[Stage]:
    return [s for s in sch.stages if not s.is_placeholder and not s.inlined]


def _enclosing(stage: Stage) -> list[Var]:
    """Variables of the loops around a stage's nest."""
    if stage.attach is None:
        return []
    parent, iv = stage.attach
    return _enclosing(parent) + [l.var for l in parent.leaf[:parent.leaf.index(iv) + 1]]


def _leaf_extents(stage: Stage, regions: dict[Stage, Region]) -> dict[IterVar, Expr]:
    """Extent of every leaf loop; an attached stage's data axes span its region."""
    ext: dict[IterVar, Expr] = {}
    region = regions.get(stage)
    for d, iv in enumerate(stage.op.axes):
        ext[iv] = region.extent[d] if region is not None and stage.attach is not None else iv.extent
    for iv in stage.op.reduce_axes:
        ext[iv] = iv.extent
    for rel in stage.relations:
        if isinstance(rel, Split):
            if rel.parent.kind == "data" and stage.attach is not None:
                raise ScheduleError(f"stage {stage.name} is placed with compute_at; split its consumer "
                                    f"instead of its data axis {rel.parent.name}")
            ext[rel.outer], ext[rel.inner] = rel.outer.extent, rel.inner.extent
        else:
            ext[rel.fused] = rel.fused.extent
    # A partial split's extent names its outer loop, which a later fuse may have
    # replaced: express it in the loops that exist.
    values = stage.iter_values({iv: iv.var for iv in stage.leaf})
    names = {iv.var: v for iv, v in values.items() if iv not in stage.leaf}
    return {iv: simplify(substitute(ext[iv], names)) for iv in stage.leaf}


def _global_root_values(stage: Stage, regions: dict[Stage, Region]) -> dict[Var, Expr]:
    """Root axis variable → global index, as expressions of the stage's leaf loop variables."""
    local = stage.root_values({iv: iv.var for iv in stage.leaf})
    out: dict[Var, Expr] = {}
    region = regions.get(stage)
    for d, iv in enumerate(stage.op.axes):
        out[iv.var] = (simplify(region.lo[d] + local[iv] * region.stride[d]) if stage.attach is not None
                       else local[iv])
    for iv in stage.op.reduce_axes:
        out[iv.var] = local[iv]
    return out


def infer_bounds(sch: Schedule) -> dict[Stage, Region]:
    """The region each lowered stage computes (consumers first)."""
    inline_stages(sch)
    stages = _lowered(sch)
    regions: dict[Stage, Region] = {}
    all_extents: dict[Var, Expr] = {}
    for stage in reversed(stages):
        if stage.attach is None:
            shape = stage.op.shape
            regions[stage] = Region([Const(0)] * len(shape), [Const(s) for s in shape], list(shape))
        else:
            regions[stage] = _infer_region(stage, stages, regions, all_extents)
        for iv, e in _leaf_extents(stage, regions).items():
            all_extents[iv.var] = e
    return regions


def _const_ranges(extents: dict[Var, Expr]) -> dict[Var, tuple[Expr, Expr]]:
    return {v: (Const(0), Const(const_upper_bound(e) - 1)) for v, e in extents.items()}


def _infer_region(stage: Stage, stages: list[Stage], regions: dict[Stage, Region],
                  extents: dict[Var, Expr]) -> Region:
    fixed = set(_enclosing(stage))
    varying = {v: (Const(0), simplify(e - 1)) for v, e in extents.items() if v not in fixed}
    varying_const = {v: r for v, r in _const_ranges(extents).items() if v not in fixed}
    everything = _const_ranges(extents)
    enclosing = [(v, extents[v]) for v in _enclosing(stage)]
    buffer = stage.tensor.buffer
    ndim = len(stage.op.axes)
    los: list[list[Expr]] = [[] for _ in range(ndim)]
    his: list[list[Expr]] = [[] for _ in range(ndim)]
    reads_of: list[list[tuple[Expr, bool]]] = [[] for _ in range(ndim)]  # (index, zero-padded)
    for consumer in stages:
        if consumer is stage or consumer not in regions:
            continue
        reads: list[BufferLoad] = []
        map_expr(consumer.op.body, lambda e: reads.append(e) if isinstance(e, BufferLoad)
                 and e.buffer is buffer else None)
        if not reads:
            continue
        roots = _global_root_values(consumer, regions)
        for load in reads:
            for d, index in enumerate(load.indices):
                g = simplify(substitute(index, roots))
                lo, hi = interval(g, varying)
                # Ranges whose ends still depend on varying loops (variable-size tiles
                # inside the attach point) fall back to constant loop bounds.
                if _depends(lo, varying) or _depends(hi, varying):
                    lo, hi = interval(g, varying_const)
                los[d].append(lo)
                his[d].append(hi)
                reads_of[d].append((g, load.zero_outside))
    if ndim and not los[0]:
        raise ScheduleError(f"stage {stage.name} is placed with compute_at but nothing inside reads it")
    # A copy that adds zero padding keeps contiguous regions: the DMA's pad frame
    # counts whole positions, which a strided region would not line up with.
    padded_reads: list[BufferLoad] = []
    map_expr(stage.op.body, lambda e: padded_reads.append(e) if isinstance(e, BufferLoad) and e.zero_outside
             else None)
    padded_copy = bool(padded_reads)
    lo_out, ext_out, alloc, strides = [], [], [], []
    for d in range(ndim):
        lo, hi = los[d][0], his[d][0]
        for x in los[d][1:]:
            lo = simplify(Min(lo, x))
        for x in his[d][1:]:
            hi = simplify(Max(hi, x))
        size = stage.op.shape[d]
        below = _bound(lo, enclosing, everything)[0] < 0
        above = _bound(hi, enclosing, everything)[1] > size - 1
        step = 1 if below or above or padded_copy else _read_stride(reads_of[d], varying_const)
        if step > 1 and not isinstance(simplify(hi - lo), Const):
            step = 1  # a variable-size tile: keep the contiguous region
        alloc.append(min(size, const_upper_bound(simplify(FloorDiv(hi - lo, Const(step)) + 1))))
        # Clip to the stage's own domain where some executed iteration leaves it
        # (a partial last tile); guarded-off iterations do not count.
        if below:
            lo = simplify(Max(lo, Const(0)))
        if above:
            hi = simplify(Min(hi, Const(size - 1)))
        lo_out.append(lo)
        ext_out.append(simplify(FloorDiv(hi - lo, Const(step)) + 1))
        strides.append(step)
    return Region(lo_out, ext_out, alloc, strides)


def _read_stride(reads: list[tuple[Expr, bool]], varying: dict[Var, tuple[Expr, Expr]]) -> int:
    """The step between the indices one axis is read at inside the attach point: the
    gcd of the coefficients of the loops that vary there, when every read is the same
    affine index without zero padding (else 1: the region is contiguous)."""
    first = reads[0][0]
    if any(padded or not same_expr(g, first) for g, padded in reads):
        return 1
    step = 0
    for var, (lo, hi) in varying.items():
        if isinstance(lo, Const) and isinstance(hi, Const) and lo.value == hi.value:
            continue
        coefficient = linear_coefficient(first, var)
        if coefficient is None:
            return 1
        step = gcd(step, abs(coefficient))
    return max(step, 1)


def _bound(e: Expr, enclosing, everything) -> tuple[float, float]:
    """(min, max) of ``e`` over the executed enclosing iterations: enumerated when
    feasible, else bounded over constant loop ranges (infinite when unknown)."""
    exact = extremes(e, enclosing)
    if exact is not None:
        return exact
    try:
        lo, hi = interval(e, everything)
    except ValueError:
        return float("-inf"), float("inf")
    return (lo.value if isinstance(lo, Const) else float("-inf"),
            hi.value if isinstance(hi, Const) else float("inf"))


def _depends(e: Expr, ranges: dict) -> bool:
    return bool(free_vars(e) & set(ranges))


# ============================================================================ code generation

def schedule_to_ir(sch: Schedule, regions: dict[Stage, Region] | None = None) -> Stmt:
    """The loop IR of a schedule (runs `infer_bounds` when ``regions`` is not given)."""
    if regions is None:
        regions = infer_bounds(sch)
    stages = _lowered(sch)
    buffers: dict[Stage, Buffer] = {}
    for stage in stages:
        if stage.scope == "global":
            buffers[stage] = stage.tensor.buffer
        else:
            entry = stage.tensor.buffer.entry_dims
            shape = tuple(regions[stage].alloc)
            full = stage.op.shape
            if entry and tuple(shape[-entry:]) != tuple(full[-entry:]):
                raise ScheduleError(f"stage {stage.name} in scope {stage.scope} must hold whole entries: "
                                    f"its region {list(shape)} cuts the entry dimensions {list(full[-entry:])}")
            dtype = "int32" if stage.scope == "acc" else stage.tensor.dtype
            buffers[stage] = Buffer(stage.name, shape, dtype, stage.scope, entry)
    by_buffer = {s.tensor.buffer: s for s in stages}
    # Loops of extent 1 only ever take 0; strided reads need them gone to divide exactly.
    unit_loops = {iv.var: Const(0) for stage in stages
                  for iv, e in _leaf_extents(stage, regions).items() if isinstance(e, Const) and e.value == 1}
    gen = _Generator(regions, buffers, by_buffer, stages, unit_loops)
    roots = [s for s in stages if s.attach is None]
    body = seq(gen.stage(s) for s in roots)
    for s in reversed(roots):
        if s.scope != "global":
            body = Allocate(buffers[s], body)
    return body


class _Generator:
    def __init__(self, regions, buffers, by_buffer, stages, unit_loops) -> None:
        self.regions = regions
        self.unit_loops = unit_loops
        self.buffers = buffers
        self.by_buffer = by_buffer
        self.stages = stages

    def _value(self, stage: Stage, expr: Expr, roots: dict[Var, Expr]) -> Expr:
        """A body expression with axes bound and reads redirected to realized buffers."""
        def fn(e: Expr):
            if isinstance(e, BufferLoad):
                producer = self.by_buffer.get(e.buffer)
                if producer is None:  # a placeholder in DRAM
                    return None
                region = self.regions[producer]
                idx = e.indices
                if producer.attach is not None:
                    idx = tuple(self._local_index(i, region, d) for d, i in enumerate(idx))
                return BufferLoad(self.buffers[producer], idx, e.zero_outside)
            return None
        return map_expr(substitute(expr, roots), fn)

    def _local_index(self, index: Expr, region: Region, d: int) -> Expr:
        """Position of a global index in the region's on-chip copy."""
        offset = simplify(index - region.lo[d])
        step = region.stride[d]
        if step == 1:
            return offset
        local = simplify(FloorDiv(simplify(substitute(offset, self.unit_loops)), Const(step)))
        if isinstance(local, FloorDiv):
            raise ScheduleError(f"index {index!r} does not step by {step} over the strided region of "
                                f"{region!r}")
        return local

    def stage(self, stage: Stage) -> Stmt:
        regions = self.regions
        extents = _leaf_extents(stage, regions)
        roots = _global_root_values(stage, regions)
        local = stage.root_values({iv: iv.var for iv in stage.leaf})
        buf = self.buffers[stage]
        # Stores index the realized buffer: the global tensor for root stages, the
        # region-relative on-chip copy for attached ones (the leaf values are local).
        store_idx = tuple(local[iv] for iv in stage.op.axes)
        body = stage.op.body
        init = None
        if isinstance(body, Reduce):
            value = self._value(stage, body.value, roots)
            stmt: Stmt = BufferStore(buf, store_idx, Add(BufferLoad(buf, store_idx), value))
            first_reduce = next(i for i, iv in enumerate(stage.leaf) if iv.kind == "reduce")
            init = self._init_nest(stage, buf, store_idx, extents, first_reduce)
        else:
            stmt = BufferStore(buf, store_idx, self._value(stage, body, roots))
            first_reduce = None
        attached = {iv: [s for s in self.stages if s.attach is not None and s.attach[0] is stage
                         and s.attach[1] is iv] for iv in stage.leaf}
        if stage.leaf:
            stmt = self._with_attached(attached[stage.leaf[-1]], stmt)
        for i in reversed(range(len(stage.leaf))):
            iv = stage.leaf[i]
            kind, thread = stage.kinds.get(iv, (ForKind.SERIAL, None))
            loop: Stmt = For(iv.var, simplify(extents[iv]), stmt, kind, thread)
            if iv in stage.tensorized:
                loop = AttrStmt("tensorize", stage.tensorized[iv], loop)
            for key in stage.pragmas.get(iv, []):
                loop = AttrStmt(key, None, loop)
            if i == first_reduce:
                loop = seq([init, loop])
            stmt = loop
            if i > 0:
                stmt = self._with_attached(attached[stage.leaf[i - 1]], stmt)
        return stmt

    def _with_attached(self, producers: list[Stage], inner: Stmt) -> Stmt:
        if not producers:
            return inner
        body = seq([self.stage(p) for p in producers] + [inner])
        for p in reversed(producers):
            if p.scope != "global":
                body = Allocate(self.buffers[p], body)
        return body

    def _init_nest(self, stage: Stage, buf: Buffer, store_idx, extents, first_reduce: int) -> Stmt:
        stmt: Stmt = BufferStore(buf, store_idx, Const(0, buf.dtype))
        for iv in reversed(stage.leaf[first_reduce:]):
            if iv.kind == "reduce":
                continue
            stmt = For(iv.var, simplify(extents[iv]), stmt)
            if iv in stage.tensorized:
                stmt = AttrStmt("tensorize_init", stage.tensorized[iv], stmt)
        return stmt
