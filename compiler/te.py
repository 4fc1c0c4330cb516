"""Tensor expressions: what an operator computes, independent of how.

A `Tensor` is produced by an operation: a `placeholder` (an input in DRAM) or
a `compute` (an element-wise formula over its output axes, optionally a
``sum`` over reduction axes). Reading a tensor, ``t[i, j]``, builds a
`BufferLoad` of the tensor's canonical buffer; the schedule later redirects
such reads to on-chip copies.

Tensors in blocked layouts end with *tile dimensions* (``tile_dims``; for
the accelerator's ``(..., batch, block_in)`` the last two: the entry one
micro-op or DMA moves).

Example (dense on packed tiles)::

    a = placeholder((mt, kt, B, BI), "int8", "a", tile_dims=2)
    w = placeholder((nt, kt, BO, BI), "int8", "w", tile_dims=2)
    ko, ki = reduce_axis(kt, "ko"), reduce_axis(BI, "ki")
    c = compute((mt, nt, B, BO), lambda m, n, b, o:
                sum_(a[m, ko, b, ki].astype("int32") * w[n, ko, o, ki].astype("int32"), [ko, ki]),
                name="c", tile_dims=2)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Sequence

import weakref

from .ir import Buffer, BufferLoad, Cast, Const, Expr, Max, Min, Reduce, Var, as_expr, check_dtype, walk_expr
from .errors import CompileError

__all__ = [
    "IterVar", "Tensor", "Operation", "PlaceholderOp", "ComputeOp",
    "placeholder", "compute", "reduce_axis", "sum_", "reduce_max", "reduce_fmax", "reduce_min", "pad", "clip", "max_", "min_",
    "TeError",
    "tensor_of", "reduce_axes_of", "buffers_read",
]

# Which tensor owns a buffer: reads in bodies name buffers, schedules need tensors.
_PRODUCERS: "weakref.WeakKeyDictionary[Buffer, Tensor]" = weakref.WeakKeyDictionary()


def tensor_of(buffer: Buffer) -> "Tensor":
    """The tensor whose canonical buffer is ``buffer``."""
    return _PRODUCERS[buffer]


class TeError(CompileError):
    """A tensor expression is malformed (shape, arity or axis misuse)."""


@dataclass(eq=False)
class IterVar:
    """An axis: a variable with an extent (an int, or an expression after splitting)
    and a kind, ``data`` (spatial) or ``reduce``."""

    var: Var
    extent: Expr
    kind: str = "data"

    @property
    def name(self) -> str:
        return self.var.name

    def __repr__(self) -> str:
        return f"IterVar({self.var.name}, {self.extent!r}, {self.kind})"

    # In arithmetic an axis stands for its variable (``rc * kh + rh``).
    def __add__(self, o): return self.var + o
    def __radd__(self, o): return o + self.var
    def __sub__(self, o): return self.var - o
    def __rsub__(self, o): return o - self.var
    def __mul__(self, o): return self.var * o
    def __rmul__(self, o): return o * self.var
    def __floordiv__(self, o): return self.var // o
    def __mod__(self, o): return self.var % o


def reduce_axis(extent: int, name: str = "k") -> IterVar:
    """A reduction axis over ``range(extent)``."""
    if not isinstance(extent, int) or extent < 1:
        raise TeError(f"reduction extent must be a positive integer, not {extent!r}")
    return IterVar(Var(name), Const(extent), "reduce")


def _reduce(combiner: str, value: Expr, axes: Sequence[IterVar]) -> Reduce:
    axes = tuple(axes)
    for a in axes:
        if a.kind != "reduce":
            raise TeError(f"{combiner} over {a.name}, which is not a reduction axis")
    return Reduce(combiner, as_expr(value), axes)


def sum_(value: Expr, axes: Sequence[IterVar]) -> Reduce:
    """Sum ``value`` over the reduction ``axes`` (must be the whole body of a compute)."""
    return _reduce("sum", value, axes)


def reduce_max(value: Expr, axes: Sequence[IterVar]) -> Reduce:
    """The maximum of ``value`` over the reduction ``axes``."""
    return _reduce("max", value, axes)


def reduce_fmax(value: Expr, axes: Sequence[IterVar]) -> Reduce:
    """The maximum of floating-point ``value`` over the reduction ``axes``, NaN values ignored
    (NaN when every value is NaN)."""
    return _reduce("fmax", value, axes)


def reduce_min(value: Expr, axes: Sequence[IterVar]) -> Reduce:
    """The minimum of ``value`` over the reduction ``axes``."""
    return _reduce("min", value, axes)


def max_(a, b) -> Expr:
    return Max(as_expr(a), as_expr(b))


def min_(a, b) -> Expr:
    return Min(as_expr(a), as_expr(b))


def clip(x, lo: int | float, hi: int | float) -> Expr:
    """``min(max(x, lo), hi)`` (the bounds take ``x``'s type)."""
    return Min(Max(as_expr(x), as_expr(lo)), as_expr(hi))


class Operation:
    name: str
    output: "Tensor"


@dataclass(eq=False)
class PlaceholderOp(Operation):
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(eq=False)
class ComputeOp(Operation):
    """``output[axes] = body`` for every point of ``axes`` (body may be a `Reduce`)."""

    name: str
    axes: list[IterVar]
    body: Expr
    dtype: str
    tag: str = ""

    @property
    def reduce_axes(self) -> list[IterVar]:
        return reduce_axes_of(self.body)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(a.extent.value) for a in self.axes)

    def input_buffers(self) -> list[Buffer]:
        """The buffers this operation reads, in first-read order."""
        return buffers_read(self.body)


def reduce_axes_of(body: Expr) -> list[IterVar]:
    """The reduction axes of a compute body (none unless it is a `Reduce`)."""
    return list(body.axes) if isinstance(body, Reduce) else []


def buffers_read(body: Expr) -> list[Buffer]:
    """The buffers ``body`` reads, in first-read order."""
    seen: list[Buffer] = []
    walk_expr(body, lambda e: seen.append(e.buffer) if isinstance(e, BufferLoad) and e.buffer not in seen else None)
    return seen


@dataclass(eq=False)
class Tensor:
    """The output of an operation; ``t[indices]`` reads it."""

    op: Operation
    shape: tuple[int, ...]
    dtype: str
    buffer: Buffer = field(repr=False)

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices) -> BufferLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != self.ndim:
            raise TeError(f"{self.name} has {self.ndim} dimensions, indexed with {len(indices)}")
        idx = tuple(i.var if isinstance(i, IterVar) else as_expr(i) for i in indices)
        return BufferLoad(self.buffer, idx)


def _make_tensor(op: Operation, shape: tuple[int, ...], dtype: str, tile_dims: int) -> Tensor:
    tensor = Tensor(op, shape, dtype, Buffer(op.name, shape, dtype, "global", tile_dims))
    op.output = tensor
    _PRODUCERS[tensor.buffer] = tensor
    return tensor


def placeholder(shape: Sequence[int], dtype: str, name: str, tile_dims: int = 0) -> Tensor:
    """An input tensor in main memory (DRAM)."""
    check_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if any(s < 1 for s in shape):
        raise TeError(f"placeholder {name} has a non-positive dimension in {list(shape)}")
    return _make_tensor(PlaceholderOp(name, shape, dtype), shape, dtype, tile_dims)


def compute(shape: Sequence[int], fcompute: Callable[..., Expr], name: str, dtype: str | None = None,
            tag: str = "", tile_dims: int = 0) -> Tensor:
    """``output[i...] = fcompute(i...)`` over ``shape``; one argument per dimension.
    With ``dtype`` the body is converted to it (a reduction must already have it)."""
    shape = tuple(int(s) for s in shape)
    if any(s < 1 for s in shape):
        raise TeError(f"compute {name} has a non-positive dimension in {list(shape)}")
    params = inspect.signature(fcompute).parameters.values()
    arity = len(params)
    variadic = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if arity != len(shape) and not variadic:
        raise TeError(f"compute {name} has {len(shape)} dimensions but its function takes {arity} arguments")
    axes = [IterVar(Var(f"{name}.i{d}"), Const(s), "data") for d, s in enumerate(shape)]
    body = as_expr(fcompute(*(a.var for a in axes)))
    if not isinstance(body, Reduce):
        _check_no_nested_reduce(body, name)
        if dtype is not None and dtype != body.dtype:
            body = Cast(check_dtype(dtype), body)
    elif dtype is not None and dtype != body.dtype:
        raise TeError(f"compute {name}: the reduction is {body.dtype}, not {dtype}; cast its value instead")
    op = ComputeOp(name, axes, body, dtype or body.dtype, tag)
    return _make_tensor(op, shape, op.dtype, tile_dims)


def _check_no_nested_reduce(body: Expr, name: str) -> None:
    def visit(e: Expr) -> None:
        if isinstance(e, Reduce):
            raise TeError(f"compute {name}: a reduction must be the whole body, not nested in it")
    walk_expr(body, visit)


def pad(x: Tensor, before: Sequence[int], after: Sequence[int], name: str | None = None) -> Tensor:
    """``x`` framed by zeros: ``before[d]``/``after[d]`` elements on each side of dimension d.

    The body reads ``x`` with out-of-bounds reads giving zero, which the DMA
    engine implements in hardware when the pad is inlined into an on-chip copy."""
    if len(before) != x.ndim or len(after) != x.ndim:
        raise TeError(f"pad of {x.name} needs {x.ndim} before/after widths")
    shape = tuple(s + b + a for s, b, a in zip(x.shape, before, after))

    def body(*idx):
        return BufferLoad(x.buffer, tuple(i - b for i, b in zip(idx, before)), zero_outside=True)
    return compute(shape, body, name or f"{x.name}.pad", dtype=x.dtype, tag="pad",
                   tile_dims=x.buffer.tile_dims)

