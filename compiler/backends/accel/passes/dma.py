"""DMA intrinsic injection: copy nests marked ``dma_copy`` become 2-D strided DMAs.

A copy nest moves a region of whole entries between a DRAM tensor and an
on-chip buffer, one loop per dimension. This pass turns it into `DmaCopy`
statements the LOAD/STORE instructions execute directly:

- the innermost dimension is the DMA row (``x``); inner dimensions that span
  the whole tensor and the whole on-chip buffer are merged into it;
- the next dimension is the row count (``y``), with the DRAM row stride;
- a strided region (the on-chip copy holds every s-th index of a dimension,
  see `lower.Region`) multiplies that dimension's DRAM step by s; when the
  innermost dimension is strided, each of its positions is a DMA row of the
  full dimensions inside it;
- remaining outer dimensions stay loops around the DMA;
- reads of a zero-padded tensor (`te.pad` inlined into the copy) become the
  DMA's ``y_pad``/``x_pad`` zero frames, computed per tile (border tiles get
  padding, interior tiles none);
- the on-chip row pitch is the allocation's, so a short row is filled up
  with extra ``x_pad1`` entries (loads) or stored row by row (stores).

Loads go DRAM → ``inp``/``wgt``/``acc``; stores ``acc`` → DRAM (the back end
picks the output buffer when the tensor is narrower than the accumulator).
"""

from __future__ import annotations

from typing import NamedTuple

from gemforge.hw.config import AccelConfig

from ....errors import CompileError
from ....ir import (
    AttrStmt, BufferLoad, BufferStore, Cast, Const, Expr, For, Max, Min, Stmt, StmtMutator, Var,
    const_upper_bound, extremes, free_vars, interval, linear_coefficient, simplify, simplify_in,
)
from ..nodes import BufferRef, DmaCopy

__all__ = ["inject_dma", "DmaInjectionError"]


class DmaInjectionError(CompileError):
    """A copy nest cannot be expressed with 2-D strided DMA."""


def inject_dma(stmt: Stmt, config: AccelConfig) -> Stmt:
    """Replace ``dma_copy`` nests by `DmaCopy` statements (plus loops for extra dimensions)."""
    class Mutator(StmtMutator):
        def __init__(self) -> None:
            self.loops: list[tuple[Var, Expr]] = []

        def visit_For(self, s: For) -> Stmt:
            self.loops.append((s.var, s.extent))
            try:
                return self.generic_visit(s)
            finally:
                self.loops.pop()

        def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
            if s.key == "dma_copy":
                return _lower_copy(s.body, list(self.loops), config.max_dma_pad)
            return self.generic_visit(s)
    return Mutator().visit(stmt)


def _lower_copy(nest: Stmt, enclosing: list[tuple[Var, Expr]], max_pad: int) -> Stmt:
    ranges = {v: (Const(0), Const(const_upper_bound(e) - 1)) for v, e in enclosing}
    loops: list[For] = []
    body = nest
    while isinstance(body, For):
        loops.append(body)
        body = body.body
    if not isinstance(body, BufferStore):
        raise DmaInjectionError(f"a dma_copy nest must end in one store, not {type(body).__name__}")
    value = body.value
    while isinstance(value, Cast):
        value = value.value
    if not isinstance(value, BufferLoad):
        raise DmaInjectionError(f"dma_copy into {body.buffer.name} computes {value!r}; a DMA only copies")
    dst, src = body.buffer, value.buffer
    if src.scope == "global" and dst.scope != "global":
        direction, dram, onchip = "load", src, dst
        dram_idx, chip_idx = value.indices, body.indices
    elif dst.scope == "global" and src.scope != "global":
        direction, dram, onchip = "store", dst, src
        dram_idx, chip_idx = body.indices, value.indices
    else:
        raise DmaInjectionError(f"dma_copy from {src!r} to {dst!r} must connect DRAM and an on-chip buffer")
    if value.zero_outside and direction == "store":
        raise DmaInjectionError("a store cannot read zero padding")
    for loop in loops:
        ranges[loop.var] = (Const(0), Const(const_upper_bound(loop.extent) - 1))

    ne = onchip.tile_dims
    n = len(onchip.shape) - ne
    loop_of = {l.var: l for l in loops}
    # Entry dimensions are moved whole by the hardware: drop their loops.
    for d in range(n, n + ne):
        v = chip_idx[d]
        if not (isinstance(v, Var) and v in loop_of and simplify(dram_idx[d]) is v):
            raise DmaInjectionError(f"copy {src.name} → {dst.name}: entry dimension {d} is not copied whole")
    dims: list[_Dim] = []
    for d in range(n):
        v = chip_idx[d]
        if isinstance(v, Var) and v in loop_of:
            loop, base, ext = loop_of[v], Const(0), simplify(loop_of[v].extent)
            step = linear_coefficient(dram_idx[d], v)
            if step is None or step < 1:
                raise DmaInjectionError(f"copy {src.name} → {dst.name}: DRAM index {dram_idx[d]!r} does not "
                                        f"step forward with the on-chip index {v!r}")
            lo = simplify(dram_idx[d] - v * step)
        elif not free_vars(v) & set(loop_of):
            # A dimension of extent 1 whose loop was fused away: a fixed index on both sides.
            loop, base, ext, step = None, simplify(v), Const(1), 1
            lo = simplify(dram_idx[d])
        else:
            raise DmaInjectionError(f"copy {src.name} → {dst.name}: on-chip index {v!r} of dimension {d} "
                                    "is neither a loop variable nor fixed")
        if free_vars(lo) & set(loop_of):
            raise DmaInjectionError(f"copy {src.name} → {dst.name}: DRAM index {dram_idx[d]!r} is not "
                                    f"an offset of the on-chip index {v!r}")
        if step > 1 and value.zero_outside:
            raise DmaInjectionError(f"copy {src.name} → {dst.name}: a strided dimension ({dram_idx[d]!r}) "
                                    "cannot take zero padding")
        dims.append(_Dim(loop, base, lo, ext, dram.outer_shape[d], onchip.outer_shape[d], step))

    def s(e: Expr) -> Expr:
        return simplify_in(e, ranges)

    # Per dimension: zero frame before/after, first valid DRAM index, valid size.
    pads0, pads1, starts, sizes = [], [], [], []
    for loop, _, lo, ext, size, _, _ in dims:
        if value.zero_outside:
            start = s(Max(lo, Const(0)))
            stop = s(Min(lo + ext, Const(size)))
            pads0.append(s(start - lo))
            sizes.append(s(stop - start))
            pads1.append(s(ext - (stop - start) - (start - lo)))
            starts.append(start)
        else:
            pads0.append(Const(0))
            pads1.append(Const(0))
            sizes.append(ext)
            starts.append(lo)

    def full(d: int) -> bool:
        dim = dims[d]
        return (dim.step == 1 and isinstance(dim.ext, Const) and dim.ext.value == dim.size == dim.alloc
                and _zero(pads0[d], ranges, enclosing) and _zero(pads1[d], ranges, enclosing))

    def entries_inside(d: int) -> int:
        """DRAM entries one position of dimension ``d`` spans (the dimensions inside it)."""
        inner = 1
        for e in range(d + 1, n):
            inner *= dims[e].size
        return inner

    # x: innermost dimension plus every full dimension merged into it.
    def x_run(x0: int):
        inner = entries_inside(x0)
        x_size = s(sizes[x0] * inner)
        x_pad0, x_pad1 = s(pads0[x0] * inner), s(pads1[x0] * inner)
        x_alloc = dims[x0].alloc * inner
        return x_size, x_pad0, x_pad1, x_alloc

    x0 = n - 1
    while x0 > 0 and full(x0):
        x0 -= 1
    if dims[x0].step > 1:
        # The positions of x0 are not contiguous in DRAM (a strided region): each
        # is a DMA row of the full dimensions inside it, x0 is the row count.
        inner = entries_inside(x0)
        x_size, x_pad0, x_pad1, x_alloc = Const(inner), Const(0), Const(0), inner
        y = x0
    else:
        x_size, x_pad0, x_pad1, x_alloc = x_run(x0)
        if x0 < n - 1 and not _zero(s(Const(x_alloc) - (x_pad0 + x_size + x_pad1)), ranges, enclosing):
            # The merged run would be short in a partial tile: keep the full inner
            # dimensions as the row and make the partial dimension the row count.
            x0 += 1
            x_size, x_pad0, x_pad1, x_alloc = x_run(x0)
        y = x0 - 1
    host = list(range(y)) if y >= 0 else []
    if direction == "store":
        row_fill = s(Const(x_alloc) - x_size)
        if y >= 0 and not _zero(row_fill, ranges, enclosing):
            host.append(y)  # on-chip rows are not contiguous: one DMA per row
            y = -1
    else:
        # Rows land at the allocation's pitch: a short row (partial tile) is filled
        # up with extra right padding, or, when that exceeds the pad field and the
        # rows need no padding, each row gets its own DMA.
        fill = s(Const(x_alloc) - (x_pad0 + x_size + x_pad1))
        if not _zero(fill, ranges, enclosing) and y >= 0 and _zero(pads0[y], ranges, enclosing) \
                and _zero(pads1[y], ranges, enclosing) and _upper(s(x_pad1 + fill)) > max_pad:
            host.append(y)
            y = -1
        else:
            x_pad1 = s(x_pad1 + fill)
    for d in host:
        if not (_zero(pads0[d], ranges, enclosing) and _zero(pads1[d], ranges, enclosing)):
            raise DmaInjectionError(f"copy {src.name} → {dst.name}: dimension {d} needs zero padding but "
                                    "only the two innermost copied dimensions can be padded")
    dram_stride = dims[y].step * entries_inside(y) if y >= 0 else entries_inside(-1)

    chip_ref, dram_ref = [], []
    for d in range(n):
        loop, base, lo, ext, size, alloc, step = dims[d]
        if d in host:
            chip_ref.append(base if loop is None else loop.var)
            dram_ref.append(lo if loop is None else s(lo + loop.var * step))
        elif d == y or d == x0:
            chip_ref.append(base)
            dram_ref.append(starts[d])
        else:  # merged into x: whole dimension from 0
            chip_ref.append(Const(0))
            dram_ref.append(Const(0))
    copy: Stmt = DmaCopy(
        direction=direction,
        dram=BufferRef(dram, tuple(dram_ref)),
        sram=BufferRef(onchip, tuple(chip_ref)),
        y_size=sizes[y] if y >= 0 else Const(1),
        x_size=x_size,
        x_stride=dram_stride if y >= 0 else max(1, const_upper_bound(x_size)),
        y_pad0=pads0[y] if y >= 0 else Const(0),
        y_pad1=pads1[y] if y >= 0 else Const(0),
        x_pad0=x_pad0 if direction == "load" else Const(0),
        x_pad1=x_pad1 if direction == "load" else Const(0),
    )
    for d in reversed(host):
        loop = dims[d].loop
        if loop is not None:
            copy = For(loop.var, dims[d].ext, copy, loop.kind, loop.thread)
    return copy


class _Dim(NamedTuple):
    """One outer dimension of a copy."""

    loop: For | None     # the copy loop over it (None: a fixed index)
    base: Expr           # first on-chip index
    lo: Expr             # DRAM index of on-chip position 0
    ext: Expr            # positions copied
    size: int            # DRAM tensor's size along it
    alloc: int           # on-chip allocation's size along it
    step: int            # DRAM index step between consecutive on-chip positions


def _upper(e: Expr) -> int:
    try:
        return const_upper_bound(e)
    except ValueError:
        return 1 << 30


def _zero(e: Expr, ranges: dict, enclosing: list[tuple[Var, Expr]]) -> bool:
    """``e`` is 0 in every executed iteration of the enclosing loops: proved over the
    loop ranges, or else checked by enumerating the iterations (guarded virtual
    threads make the ranges too coarse)."""
    e = simplify(e)
    if isinstance(e, Const):
        return e.value == 0
    try:
        lo, hi = interval(e, ranges)
        if isinstance(lo, Const) and isinstance(hi, Const) and lo.value == hi.value == 0:
            return True
    except ValueError:
        pass
    if free_vars(e) - {v for v, _ in enclosing}:
        return False
    found = extremes(e, enclosing)
    return found is not None and found == (0, 0)
