"""Schedules: how a tensor expression is computed (loop order, tiling, placement).

A `Schedule` holds one `Stage` per operation, producers first. Each stage
starts with one loop per axis (its *root* iteration variables) and is
transformed by primitives that only record relations; `lower` turns the
result into loop IR. Scheduling never rewrites the tensor expressions: a
stage keeps its own copy of its operation's body (which cache stages
redirect), so one expression can be scheduled for several targets.

- loop structure: `Stage.split`, `Stage.fuse`, `Stage.reorder`, `Stage.tile`;
- placement: `Stage.compute_at` (inside another stage's loop, the region it
  computes is inferred from what the consumers read), `Stage.compute_inline`;
- memory: `Schedule.cache_read` / `Schedule.cache_write` (a copy stage in
  another storage scope), `Stage.set_scope`. Scopes are names the target
  defines and checks when lowering (the accelerator's ``inp``, ``wgt``,
  ``acc``; the GPU's ``shared`` and ``local``; the CPU's ``local``);
- loop annotations: `Stage.vectorize`, `Stage.parallel`, `Stage.unroll`,
  `Stage.bind` (GPU thread axes), `Stage.vthread` (virtual threads). They set
  `ir.ForKind` on the generated loop; each back end decides what it supports;
- marks for back-end passes: `Stage.tensorize` (the loops under an axis
  become a tensor intrinsic), `Stage.pragma` (``dma_copy``, ``alu`` on the
  accelerator).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from .ir import Buffer, BufferLoad, Const, Expr, ForKind, Min, Reduce, Var, map_expr, simplify, substitute
from .te import ComputeOp, IterVar, PlaceholderOp, Tensor, buffers_read, compute, reduce_axes_of, tensor_of
from .errors import CompileError

__all__ = ["Schedule", "Stage", "Split", "Fuse", "create_schedule", "ScheduleError", "split_extents"]


#: How `Stage.vthread` issues the threads' instructions (see `passes.vthread`).
VTHREAD_ORDERS = ("interleaved", "sequential")


class ScheduleError(CompileError):
    """A schedule primitive was misused (wrong stage, axis or order)."""


@dataclass(eq=False)
class Split:
    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int


@dataclass(eq=False)
class Fuse:
    outer: IterVar
    inner: IterVar
    fused: IterVar


@dataclass(eq=False)
class Stage:
    """The schedule of one operation. ``body`` is this schedule's copy of the
    operation's body (cache stages redirect its reads); the operation itself is
    never modified."""

    op: Any
    tensor: Tensor
    body: Expr | None = None
    leaf: list[IterVar] = field(default_factory=list)
    relations: list = field(default_factory=list)
    attach: tuple["Stage", IterVar] | None = None
    scope: str = "global"
    inlined: bool = False
    kinds: dict[IterVar, tuple[ForKind, str | None]] = field(default_factory=dict)
    pragmas: dict[IterVar, list[str]] = field(default_factory=dict)
    tensorized: dict[IterVar, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Stage({self.op.name})"

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    @property
    def reduce_axes(self) -> list[IterVar]:
        return reduce_axes_of(self.body)

    @property
    def root_axes(self) -> list[IterVar]:
        if self.is_placeholder:
            return []
        return list(self.op.axes) + self.reduce_axes

    def input_buffers(self) -> list[Buffer]:
        """The buffers this stage reads, in first-read order."""
        return [] if self.body is None else buffers_read(self.body)

    def _check_leaf(self, iv: IterVar) -> int:
        if iv not in self.leaf:
            raise ScheduleError(f"{iv.name} is not a current loop of stage {self.name} "
                                f"(loops: {', '.join(a.name for a in self.leaf)})")
        return self.leaf.index(iv)

    # ------------------------------------------------------------------ loop structure

    def split(self, iv: IterVar, factor: int | None = None, nparts: int | None = None
              ) -> tuple[IterVar, IterVar]:
        """``iv`` → ``(outer, inner)`` with ``iv = outer·factor + inner``; the last
        inner range is clipped when the extent is not a multiple of ``factor``."""
        pos = self._check_leaf(iv)
        if (factor is None) == (nparts is None):
            raise ScheduleError("split takes exactly one of factor and nparts")
        extent = simplify(iv.extent)
        if nparts is not None:
            if not isinstance(extent, Const):
                raise ScheduleError(f"split of {iv.name} by nparts needs a constant extent")
            factor = -(-extent.value // nparts)
        if not isinstance(factor, int) or factor < 1:
            raise ScheduleError(f"split factor must be a positive integer, not {factor!r}")
        outer_v, inner_v = Var(f"{iv.name}.o"), Var(f"{iv.name}.i")
        outer_ext, inner_ext = split_extents(extent, factor, outer_v)
        outer, inner = IterVar(outer_v, outer_ext, iv.kind), IterVar(inner_v, inner_ext, iv.kind)
        self.relations.append(Split(iv, outer, inner, factor))
        self.leaf[pos:pos + 1] = [outer, inner]
        return outer, inner

    def fuse(self, outer: IterVar, inner: IterVar) -> IterVar:
        """Two adjacent loops → one over their product (the inner extent must be constant)."""
        pos = self._check_leaf(outer)
        if pos + 1 >= len(self.leaf) or self.leaf[pos + 1] is not inner:
            raise ScheduleError(f"fuse needs adjacent loops, outer first: {outer.name}, {inner.name}")
        ie, oe = simplify(inner.extent), simplify(outer.extent)
        if not isinstance(ie, Const) or not isinstance(oe, Const):
            raise ScheduleError(f"fuse of {outer.name} and {inner.name} needs constant extents")
        fused = IterVar(Var(f"{outer.name}.{inner.name}.f"), Const(ie.value * oe.value),
                        "reduce" if outer.kind == inner.kind == "reduce" else "data")
        self.relations.append(Fuse(outer, inner, fused))
        self.leaf[pos:pos + 2] = [fused]
        return fused

    def reorder(self, *order: IterVar) -> None:
        """Put the given loops in this order, in the positions they occupy now."""
        positions = sorted(self._check_leaf(iv) for iv in order)
        if len(set(order)) != len(order):
            raise ScheduleError("reorder lists a loop twice")
        for pos, iv in zip(positions, order):
            self.leaf[pos] = iv

    def tile(self, x: IterVar, y: IterVar, x_factor: int, y_factor: int
             ) -> tuple[IterVar, IterVar, IterVar, IterVar]:
        """2-D tiling: returns ``(x_outer, y_outer, x_inner, y_inner)`` in that loop order."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    # ------------------------------------------------------------------ placement and memory

    def compute_at(self, parent: "Stage", iv: IterVar) -> None:
        """Compute this stage inside ``parent``'s loop ``iv``, just the region its consumers need there."""
        parent._check_leaf(iv)
        if self.is_placeholder:
            raise ScheduleError(f"{self.name} is an input; cache it (cache_read) to place a copy")
        self.attach = (parent, iv)

    def compute_inline(self) -> None:
        """Substitute this stage's formula into its readers (it gets no loops or storage)."""
        if self.is_placeholder or self.reduce_axes:
            raise ScheduleError(f"{self.name} cannot be inlined (only element-wise computes can)")
        self.inlined = True

    def set_scope(self, scope: str) -> None:
        """Store this stage's output in ``scope`` (the target checks the name when lowering)."""
        self.scope = _check_scope(scope)

    # ------------------------------------------------------------------ annotations

    def tensorize(self, iv: IterVar, intrin: Any) -> None:
        """Replace the loops from ``iv`` inwards with the tensor intrinsic ``intrin``."""
        self._check_leaf(iv)
        self.tensorized[iv] = intrin

    def pragma(self, iv: IterVar, key: str) -> None:
        """Annotate the loop ``iv`` (``dma_copy``, ``alu``); passes act on the annotation."""
        self._check_leaf(iv)
        self.pragmas.setdefault(iv, []).append(key)

    def vthread(self, iv: IterVar, order: str = "interleaved") -> None:
        """Run the iterations of ``iv`` as virtual threads (latency hiding), each with
        its own part of every on-chip buffer allocated inside.

        ``order`` is how the threads' instructions are issued: ``interleaved``
        (chunk by chunk: one thread's loads run under another's GEMMs — for
        compute- and load-bound tiles) or ``sequential`` (thread by thread: one
        thread's store runs under the next thread's whole tile — for store-bound
        tiles)."""
        if order not in VTHREAD_ORDERS:
            raise ScheduleError(f"vthread order must be one of {', '.join(VTHREAD_ORDERS)}, not {order!r}")
        self._set_kind(iv, ForKind.VTHREAD)
        if order != "interleaved":
            self.pragma(iv, f"vthread_{order}")

    def vectorize(self, iv: IterVar) -> None:
        self._set_kind(iv, ForKind.VECTORIZED)

    def parallel(self, iv: IterVar) -> None:
        self._set_kind(iv, ForKind.PARALLEL)

    def unroll(self, iv: IterVar) -> None:
        self._set_kind(iv, ForKind.UNROLLED)

    def bind(self, iv: IterVar, thread: str) -> None:
        """Bind a loop to a GPU index (``blockIdx.x``, ``threadIdx.x``, ...)."""
        self._set_kind(iv, ForKind.THREAD_BINDING, thread)

    def _set_kind(self, iv: IterVar, kind: ForKind, thread: str | None = None) -> None:
        self._check_leaf(iv)
        self.kinds[iv] = (kind, thread)

    # ------------------------------------------------------------------ index reconstruction

    def root_values(self, leaf_values: dict[IterVar, Expr],
                    extents: dict[IterVar, Expr] | None = None) -> dict[IterVar, Expr]:
        """Root axis values as expressions of the leaf loop values (inverting splits and fuses)."""
        values = self.iter_values(leaf_values, extents)
        return {iv: values[iv] for iv in self.root_axes}

    def iter_values(self, leaf_values: dict[IterVar, Expr],
                    extents: dict[IterVar, Expr] | None = None) -> dict[IterVar, Expr]:
        """Every iteration variable's value (root, intermediate, leaf) from the leaf values.
        A fuse divides by its inner axis's extent: ``extents`` gives the one in effect
        (an attached stage's axes span its region), else the schedule's."""
        values: dict[IterVar, Expr] = dict(leaf_values)
        for rel in reversed(self.relations):
            if isinstance(rel, Split):
                values[rel.parent] = values[rel.outer] * rel.factor + values[rel.inner]
            else:
                ext = simplify((extents or {}).get(rel.inner, rel.inner.extent))
                values[rel.outer] = values[rel.fused] // ext
                values[rel.inner] = values[rel.fused] % ext
        return {iv: simplify(v) for iv, v in values.items()}


def split_extents(extent: Expr, factor: int, outer: Var) -> tuple[Expr, Expr]:
    """The extents of ``(outer, inner)`` when a loop of ``extent`` is split by ``factor``:
    the last inner range is clipped when ``factor`` does not divide the extent."""
    extent = simplify(extent)
    if isinstance(extent, Const):
        n_outer = -(-extent.value // factor)
        if extent.value % factor == 0:
            return Const(n_outer), Const(factor)
        if n_outer == 1:
            return Const(1), Const(extent.value)
        return Const(n_outer), Min(Const(factor), extent - outer * factor)  # the last tile is partial
    return simplify((extent + (factor - 1)) // factor), Min(Const(factor), extent - outer * factor)


class Schedule:
    """Stages of every operation that the outputs depend on, producers first."""

    def __init__(self, outputs: Sequence[Tensor]) -> None:
        self.outputs = list(outputs)
        self.stages: list[Stage] = []
        self._by_tensor: dict[int, Stage] = {}
        for t in self.outputs:
            self._add(t)

    def _add(self, tensor: Tensor) -> Stage:
        if id(tensor) in self._by_tensor:
            return self._by_tensor[id(tensor)]
        if isinstance(tensor.op, ComputeOp):
            for buf in tensor.op.input_buffers():
                self._add(tensor_of(buf))
        stage = Stage(tensor.op, tensor, body=getattr(tensor.op, "body", None))
        stage.leaf = list(stage.root_axes)
        self.stages.append(stage)
        self._by_tensor[id(tensor)] = stage
        return stage

    def __getitem__(self, tensor: Tensor) -> Stage:
        try:
            return self._by_tensor[id(tensor)]
        except KeyError:
            raise ScheduleError(f"{tensor.name} is not part of this schedule") from None

    def readers(self, tensor: Tensor) -> list[Stage]:
        return [s for s in self.stages if not s.is_placeholder and tensor.buffer in s.input_buffers()]

    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor]) -> Tensor:
        """A copy of ``tensor`` in ``scope`` that ``readers`` read instead of it."""
        _check_scope(scope)
        copy = compute(tensor.shape, lambda *i: tensor[i], name=f"{tensor.name}.{scope}",
                       dtype=tensor.dtype, tile_dims=tensor.buffer.tile_dims)
        stage = Stage(copy.op, copy, body=copy.op.body, scope=scope)
        stage.leaf = list(stage.root_axes)
        for reader in readers:
            _redirect(self[reader], tensor, copy)
        self.stages.insert(self.stages.index(self[tensor]) + 1, stage)
        self._by_tensor[id(copy)] = stage
        return copy

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute ``tensor`` in ``scope``; ``tensor`` becomes a copy of the result.
        Must come before the stage's loops are transformed."""
        _check_scope(scope)
        stage = self[tensor]
        if stage.is_placeholder:
            raise ScheduleError(f"{tensor.name} is an input; cache_write needs a computed tensor")
        if stage.relations:
            raise ScheduleError(f"cache_write of {tensor.name} must come before split/fuse on it")
        op = stage.op
        cached = compute(tensor.shape, lambda *i: _rename_body(op, stage.body, i), name=f"{tensor.name}.{scope}",
                         dtype=tensor.dtype, tile_dims=tensor.buffer.tile_dims)
        new_stage = Stage(cached.op, cached, body=cached.op.body, scope=scope)
        new_stage.leaf = list(new_stage.root_axes)
        # The original stage now copies the cached result out.
        stage.body = BufferLoad(cached.buffer, tuple(a.var for a in op.axes))
        stage.leaf = list(stage.root_axes)
        self.stages.insert(self.stages.index(stage), new_stage)
        self._by_tensor[id(cached)] = new_stage
        return cached


def _check_scope(scope: str) -> str:
    if not isinstance(scope, str) or not scope.replace("_", "").isalnum():
        raise ScheduleError(f"a storage scope is a name such as 'global' or 'shared', not {scope!r}")
    return scope


def _rename_body(op: ComputeOp, body: Expr, new_axes: tuple[Var, ...]) -> Expr:
    """``body`` (of ``op``) over new axis variables (reductions keep their own axes)."""
    mapping = {a.var: v for a, v in zip(op.axes, new_axes)}
    if isinstance(body, Reduce):
        return Reduce(body.combiner, substitute(body.value, mapping), body.axes)
    return substitute(body, mapping)


def _redirect(stage: Stage, old: Tensor, new: Tensor) -> None:
    """Make ``stage`` read ``new`` where it read ``old`` (the stage's body only)."""
    def fn(e: Expr):
        if isinstance(e, BufferLoad) and e.buffer is old.buffer:
            return BufferLoad(new.buffer, e.indices, e.zero_outside)
        return None
    stage.body = map_expr(stage.body, fn)


def create_schedule(outputs: Tensor | Sequence[Tensor]) -> Schedule:
    """A default schedule (one loop per axis, everything at the root) for ``outputs``."""
    if isinstance(outputs, Tensor):
        outputs = [outputs]
    return Schedule(outputs)

