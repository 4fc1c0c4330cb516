"""Schedule → loop IR: bounds inference and loop-nest generation.

`infer_bounds` decides, for every stage placed with ``compute_at``, which
region of its output the consumers need per iteration of the attach loop
(TVM's InferBound): each consumer read is bounded over the loops that run
inside the attach point, while the enclosing loops stay symbolic. The region
gives the stage's on-chip allocation (constant upper bounds) and its loop
extents (exact, possibly depending on enclosing loops).

`schedule_to_ir` then emits one loop nest per stage: stages attached to a
loop are emitted inside it before the consumer's inner loops, each stage
outside main memory inside an `Allocate`; reductions get their
initialization nest (with the same loop kinds) before the outermost
reduction loop; pragmas, tensorize marks and loop kinds become `AttrStmt`
and `For.kind`. `lower_schedule` wraps the result in a `PrimFunc` whose
parameters are the given tensors, allocates the other main-memory stages,
and runs the verifier with the target's scopes.

Lowering reads the schedule and never changes it (inlined bodies are
computed here, not written back), so a schedule can be lowered again.

Target knowledge enters through two questions a `Target` answers: which
scopes exist, and in which type a scope stores a tensor (the accelerator's
``acc`` holds every value at the accumulator's width). One rule comes from
the GPU's memory hierarchy: a stage in ``shared`` scope attached inside
thread-bound loops covers the region of every thread of the block, so those
loops are relaxed when its region is inferred (TVM's storage-rank rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd

from .ir import (
    Allocate, AttrStmt, Buffer, BufferLoad, BufferStore, Cast, Const, Expr, FloorDiv, For, ForKind, Max, Min,
    PrimFunc, Reduce, Stmt, Var, VerifyError, const_upper_bound, extremes, free_vars, interval, linear_coefficient,
    map_expr, same_expr, seq, simplify, substitute, verify, walk_expr,
)
from .schedule import Schedule, ScheduleError, Split, Stage, split_extents
from .te import IterVar, Tensor

__all__ = ["Region", "infer_bounds", "schedule_to_ir", "inline_bodies", "lower_schedule"]

#: Scopes whose stages, attached inside loops bound to these thread axes, serve every
#: thread of the block: the loops are relaxed in their region.
_SHARED_BY_THREADS = {"shared": ("threadIdx.",)}


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


def inline_bodies(sch: Schedule) -> dict[Stage, Expr]:
    """Every stage's body with the ``compute_inline`` stages' formulas substituted
    into it (the schedule itself is left as it is)."""
    bodies = {s: s.body for s in sch.stages if not s.is_placeholder}
    for stage in sch.stages:
        if not stage.inlined:
            continue
        op = stage.op

        def fn(e: Expr, op=op, stage=stage):
            if isinstance(e, BufferLoad) and e.buffer is op.output.buffer:
                return substitute(bodies[stage], {a.var: i for a, i in zip(op.axes, e.indices)})
            return None
        for reader in bodies:
            if reader is not stage:
                bodies[reader] = map_expr(bodies[reader], fn)
    return bodies


def _lowered(sch: Schedule) -> list[Stage]:
    return [s for s in sch.stages if not s.is_placeholder and not s.inlined]


def _enclosing_loops(stage: Stage) -> list[tuple[Stage, IterVar]]:
    """The loops around a stage's nest, outermost first, with the stage owning each."""
    if stage.attach is None:
        return []
    parent, iv = stage.attach
    return _enclosing_loops(parent) + [(parent, l) for l in parent.leaf[:parent.leaf.index(iv) + 1]]


def _enclosing(stage: Stage) -> list[Var]:
    """Variables of the loops around a stage's nest."""
    return [iv.var for _, iv in _enclosing_loops(stage)]


def _fixed_enclosing(stage: Stage) -> set[Var]:
    """The enclosing loops a stage's region may depend on: all of them, except the
    thread axes its scope is shared by (`_SHARED_BY_THREADS`)."""
    shared_by = _SHARED_BY_THREADS.get(stage.scope, ())
    fixed = set()
    for owner, iv in _enclosing_loops(stage):
        kind, thread = owner.kinds.get(iv, (ForKind.SERIAL, None))
        if kind is ForKind.THREAD_BINDING and thread and thread.startswith(shared_by):
            continue
        fixed.add(iv.var)
    return fixed


def _all_extents(stage: Stage, regions: dict[Stage, Region]) -> dict[IterVar, Expr]:
    """Extent of every iteration variable of a stage (root, intermediate, leaf); an attached
    stage's data axes span its region."""
    ext: dict[IterVar, Expr] = {}
    region = regions.get(stage)
    for d, iv in enumerate(stage.op.axes):
        ext[iv] = region.extent[d] if region is not None and stage.attach is not None else iv.extent
    for iv in stage.reduce_axes:
        ext[iv] = iv.extent
    for rel in stage.relations:
        if isinstance(rel, Split):
            # Recomputed from the parent's extent here: an attached stage's data axes
            # span its region, not the whole tensor the schedule split.
            ext[rel.outer], ext[rel.inner] = split_extents(ext[rel.parent], rel.factor, rel.outer.var)
        else:
            outer, inner = simplify(ext[rel.outer]), simplify(ext[rel.inner])
            if not (isinstance(outer, Const) and isinstance(inner, Const)):
                raise ScheduleError(f"stage {stage.name} fuses {rel.outer.name} and {rel.inner.name}, whose "
                                    f"extents ({outer!r}, {inner!r}) are not constant here")
            ext[rel.fused] = Const(outer.value * inner.value)
    return ext


def _leaf_extents(stage: Stage, regions: dict[Stage, Region]) -> dict[IterVar, Expr]:
    """Extent of every leaf loop."""
    ext = _all_extents(stage, regions)
    # A partial split's extent names its outer loop, which a later fuse may have
    # replaced: express it in the loops that exist.
    values = stage.iter_values({iv: iv.var for iv in stage.leaf}, ext)
    names = {iv.var: v for iv, v in values.items() if iv not in stage.leaf}
    return {iv: simplify(substitute(ext[iv], names)) for iv in stage.leaf}


def _local_root_values(stage: Stage, regions: dict[Stage, Region]) -> dict[IterVar, Expr]:
    """Root axis values (within the stage's region) as expressions of its leaf loop variables."""
    return stage.root_values({iv: iv.var for iv in stage.leaf}, _all_extents(stage, regions))


def _global_root_values(stage: Stage, regions: dict[Stage, Region]) -> dict[Var, Expr]:
    """Root axis variable → global index, as expressions of the stage's leaf loop variables."""
    local = _local_root_values(stage, regions)
    out: dict[Var, Expr] = {}
    region = regions.get(stage)
    for d, iv in enumerate(stage.op.axes):
        out[iv.var] = (simplify(region.lo[d] + local[iv] * region.stride[d]) if stage.attach is not None
                       else local[iv])
    for iv in stage.reduce_axes:
        out[iv.var] = local[iv]
    return out


def infer_bounds(sch: Schedule, bodies: dict[Stage, Expr] | None = None) -> dict[Stage, Region]:
    """The region each lowered stage computes (consumers first)."""
    bodies = inline_bodies(sch) if bodies is None else bodies
    stages = _lowered(sch)
    regions: dict[Stage, Region] = {}
    all_extents: dict[Var, Expr] = {}
    for stage in reversed(stages):
        if stage.attach is None:
            shape = stage.op.shape
            regions[stage] = Region([Const(0)] * len(shape), [Const(s) for s in shape], list(shape))
        else:
            regions[stage] = _infer_region(stage, stages, regions, all_extents, bodies)
        for iv, e in _leaf_extents(stage, regions).items():
            all_extents[iv.var] = e
    return regions


def _const_ranges(extents: dict[Var, Expr]) -> dict[Var, tuple[Expr, Expr]]:
    return {v: (Const(0), Const(const_upper_bound(e) - 1)) for v, e in extents.items()}


def _infer_region(stage: Stage, stages: list[Stage], regions: dict[Stage, Region],
                  extents: dict[Var, Expr], bodies: dict[Stage, Expr]) -> Region:
    fixed = _fixed_enclosing(stage)
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
        walk_expr(bodies[consumer], lambda e: reads.append(e) if isinstance(e, BufferLoad)
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
    walk_expr(bodies[stage], lambda e: padded_reads.append(e) if isinstance(e, BufferLoad) and e.zero_outside
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

def schedule_to_ir(sch: Schedule, regions: dict[Stage, Region] | None = None, target=None) -> Stmt:
    """The loop IR of a schedule (runs `infer_bounds` when ``regions`` is not given).

    ``target`` (a `Target`, optional) decides the storage type of each scope;
    stages in main memory use their tensors' buffers, the others get buffers
    of their region's shape, inside an `Allocate` at their attach point."""
    bodies = inline_bodies(sch)
    if regions is None:
        regions = infer_bounds(sch, bodies)
    stages = _lowered(sch)
    buffers: dict[Stage, Buffer] = {}
    for stage in stages:
        if stage.scope == "global":
            buffers[stage] = stage.tensor.buffer
            continue
        tile = stage.tensor.buffer.tile_dims
        shape = tuple(regions[stage].alloc)
        full = stage.op.shape
        if tile and tuple(shape[-tile:]) != tuple(full[-tile:]):
            raise ScheduleError(f"stage {stage.name} in scope {stage.scope} must hold whole tiles: "
                                f"its region {list(shape)} cuts the tile dimensions {list(full[-tile:])}")
        dtype = stage.tensor.dtype if target is None else target.storage_dtype(stage.scope, stage.tensor.dtype)
        buffers[stage] = Buffer(stage.name, shape, dtype, stage.scope, tile)
    by_buffer = {s.tensor.buffer: s for s in stages}
    # Loops of extent 1 only ever take 0; strided reads need them gone to divide exactly.
    unit_loops = {iv.var: Const(0) for stage in stages
                  for iv, e in _leaf_extents(stage, regions).items() if isinstance(e, Const) and e.value == 1}
    gen = _Generator(regions, buffers, by_buffer, stages, unit_loops, bodies)
    roots = [s for s in stages if s.attach is None]
    body = seq(gen.stage(s) for s in roots)
    for s in reversed(roots):
        if s.scope != "global":
            body = Allocate(buffers[s], body)
    return body


def lower_schedule(sch: Schedule, args: list[Tensor], name: str = "main", target=None) -> PrimFunc:
    """Schedule → a verified `PrimFunc` whose parameters are the buffers of ``args``
    (inputs and outputs, in order). Main-memory stages that are not parameters
    (intermediate tensors) are allocated at the top of the function."""
    params = [t.buffer for t in args]
    if len(set(params)) != len(params):
        raise ScheduleError(f"function {name} lists a tensor twice among its arguments")
    body = schedule_to_ir(sch, target=target)
    for stage in reversed(_lowered(sch)):
        if stage.scope == "global" and stage.tensor.buffer not in params:
            body = Allocate(stage.tensor.buffer, body)
    func = PrimFunc(name, params, body)
    try:
        return verify(func, None if target is None else target.scopes)
    except VerifyError as exc:
        raise ScheduleError(str(exc)) from None


def _store(buf: Buffer, indices: tuple[Expr, ...], value: Expr) -> BufferStore:
    """A store that converts ``value`` to the buffer's storage type where they differ."""
    if value.dtype != buf.dtype:
        value = simplify(Cast(buf.dtype, value)) if isinstance(value, Const) else Cast(buf.dtype, value)
    return BufferStore(buf, indices, value)


class _Generator:
    def __init__(self, regions, buffers, by_buffer, stages, unit_loops, bodies) -> None:
        self.regions = regions
        self.unit_loops = unit_loops
        self.buffers = buffers
        self.by_buffer = by_buffer
        self.stages = stages
        self.bodies = bodies

    def _load(self, buf: Buffer, indices: tuple[Expr, ...], dtype: str, zero_outside: bool = False) -> Expr:
        """A read of a realized buffer as a value of the tensor's type ``dtype``."""
        load = BufferLoad(buf, indices, zero_outside)
        return load if buf.dtype == dtype else Cast(dtype, load)

    def _value(self, stage: Stage, expr: Expr, roots: dict[Var, Expr]) -> Expr:
        """A body expression with axes bound and reads redirected to realized buffers."""
        def fn(e: Expr):
            if isinstance(e, BufferLoad):
                producer = self.by_buffer.get(e.buffer)
                if producer is None:  # a placeholder in main memory
                    return None
                region = self.regions[producer]
                idx = e.indices
                if producer.attach is not None and producer.scope != "global":
                    idx = tuple(self._local_index(i, region, d) for d, i in enumerate(idx))
                return self._load(self.buffers[producer], idx, e.dtype, e.zero_outside)
            return None
        return map_expr(substitute(expr, roots), fn)

    def _local_index(self, index: Expr, region: Region, d: int) -> Expr:
        """Position of a global index in the region's copy."""
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
        local = _local_root_values(stage, regions)
        buf = self.buffers[stage]
        # Stores index the realized buffer: the whole tensor in main memory (root stages,
        # and attached ones computing their region of it), else the region-relative copy.
        if stage.attach is not None and stage.scope == "global":
            store_idx = tuple(roots[iv.var] for iv in stage.op.axes)
        else:
            store_idx = tuple(local[iv] for iv in stage.op.axes)
        body = self.bodies[stage]
        init = None
        first_reduce = None
        if isinstance(body, Reduce):
            value = self._value(stage, body.value, roots)
            acc = self._load(buf, store_idx, body.dtype)
            stmt: Stmt = _store(buf, store_idx, body.update(acc, value))
            first_reduce = next((i for i, iv in enumerate(stage.leaf) if iv.kind == "reduce"), None)
            if first_reduce is None:
                raise ScheduleError(f"stage {stage.name} reduces but none of its loops is a reduction loop "
                                    "(a reduction axis was fused with a data axis)")
            init = self._init_nest(stage, buf, store_idx, extents, first_reduce, body.identity())
        else:
            stmt = _store(buf, store_idx, self._value(stage, body, roots))
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

    def _init_nest(self, stage: Stage, buf: Buffer, store_idx, extents, first_reduce: int,
                   identity: Const) -> Stmt:
        """The reduction's initialization over the data loops inside the first
        reduction loop, each with its loop kind and thread binding."""
        stmt: Stmt = _store(buf, store_idx, identity)
        for iv in reversed(stage.leaf[first_reduce:]):
            if iv.kind == "reduce":
                continue
            kind, thread = stage.kinds.get(iv, (ForKind.SERIAL, None))
            stmt = For(iv.var, simplify(extents[iv]), stmt, kind, thread)
            if iv in stage.tensorized:
                stmt = AttrStmt("tensorize_init", stage.tensorized[iv], stmt)
        return stmt
