"""Expressions of the loop IR: immutable dataclasses with a data type.

Leaves are variables and constants; inner nodes are arithmetic, comparisons,
logic, selects, casts, buffer loads, calls of intrinsics, and (in tensor
expressions only) reductions. Python operators build nodes (``i * 4 + j``);
a binary operation checks its operand types (`dtypes.promote`), and a
constant operand takes the type of the other side, so ``x + 1`` on a float
``x`` is a float addition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .dtypes import (
    BOOL, VOID, DTypeError, check_dtype, int_range, is_bool, is_float, is_int, promote,
)

__all__ = [
    "Expr", "Var", "Const", "BinOp", "Add", "Sub", "Mul", "Div", "FloorDiv", "FloorMod", "Min", "Max",
    "Shr", "And", "Or", "Not", "Cmp", "Select", "Cast", "BufferLoad", "Call", "Reduce", "reduction_identity",
    "const", "as_expr", "eq", "ne", "INTRINSICS", "Intrinsic", "register_intrinsic",
]


class Expr:
    """Base of all expressions; Python operators build IR nodes."""

    dtype: str = "int32"

    def __add__(self, o): return Add(self, as_expr(o))
    def __radd__(self, o): return Add(as_expr(o), self)
    def __sub__(self, o): return Sub(self, as_expr(o))
    def __rsub__(self, o): return Sub(as_expr(o), self)
    def __mul__(self, o): return Mul(self, as_expr(o))
    def __rmul__(self, o): return Mul(as_expr(o), self)
    def __truediv__(self, o): return Div(self, as_expr(o))
    def __rtruediv__(self, o): return Div(as_expr(o), self)
    def __floordiv__(self, o): return FloorDiv(self, as_expr(o))
    def __mod__(self, o): return FloorMod(self, as_expr(o))
    def __rshift__(self, o): return Shr(self, as_expr(o))
    def __neg__(self): return Sub(Const(0, self.dtype), self)
    def __lt__(self, o): return Cmp("<", self, as_expr(o))
    def __le__(self, o): return Cmp("<=", self, as_expr(o))
    def __gt__(self, o): return Cmp("<", as_expr(o), self)
    def __ge__(self, o): return Cmp("<=", as_expr(o), self)

    def astype(self, dtype: str) -> Expr:
        return self if dtype == self.dtype else Cast(dtype, self)

    # Nodes other than constants compare by identity; keep them hashable for dict keys.
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
    """A constant. Equal constants (same value and type) are interchangeable: they
    compare and hash alike."""

    value: int | float
    dtype: str = "int32"

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if is_float(self.dtype):
            object.__setattr__(self, "value", float(self.value))
        elif is_int(self.dtype) or is_bool(self.dtype):
            if isinstance(self.value, float) and not self.value.is_integer():
                raise DTypeError(f"constant {self.value!r} is not an integer but has type {self.dtype}")
            object.__setattr__(self, "value", int(self.value))

    def __hash__(self) -> int:
        return hash((self.value, self.dtype))

    def __repr__(self) -> str:
        if is_float(self.dtype):
            return f"{self.value!r}f"
        return str(self.value)


def const(value: int | float, dtype: str = "int32") -> Const:
    """A constant of ``dtype``; integers must lie in the type's range."""
    check_dtype(dtype)
    if is_int(dtype):
        lo, hi = int_range(dtype)
        if not lo <= int(value) <= hi:
            raise DTypeError(f"constant {value} does not fit {dtype} ({lo}..{hi})")
    return Const(value, dtype)


def as_expr(value: Any) -> Expr:
    """``value`` as an expression: expressions stay, Python ints become int32 and
    floats float32 constants, an iteration variable stands for its variable."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(int(value), BOOL)
    if isinstance(value, float):
        return Const(value, "float32")
    if isinstance(value, int) or hasattr(value, "__index__"):
        return Const(int(value))
    if isinstance(getattr(value, "var", None), Var):  # a te.IterVar stands for its variable
        return value.var
    raise TypeError(f"cannot use {value!r} as an IR expression")


def _operands(node, *names: str) -> None:
    """Python numbers given as operands become constants (``Min(i, 4)``)."""
    for name in names:
        value = getattr(node, name)
        if not isinstance(value, Expr):
            object.__setattr__(node, name, as_expr(value))


def _coerce(c: Const, dtype: str, op: str) -> Const:
    """A constant operand converted to the other operand's type."""
    if is_float(dtype):
        return Const(float(c.value), dtype)
    if is_int(dtype) and not is_float(c.dtype):
        lo, hi = int_range(dtype)
        if not lo <= c.value <= hi:  # a silent wrap would change what the program means
            raise DTypeError(f"{op} has the constant {c.value}, which does not fit its {dtype} operand ({lo}..{hi})")
        return Const(c.value, dtype)
    if is_bool(dtype) and is_int(c.dtype):
        return Const(int(bool(c.value)), dtype)
    raise DTypeError(f"{op} mixes {dtype} with the {c.dtype} constant {c!r}; cast explicitly")


def _unify(node, a: Expr, b: Expr, what: str) -> str:
    """Make the operands of ``node`` agree in type (constants follow the other side)."""
    if a.dtype == b.dtype:
        return a.dtype
    if isinstance(b, Const) and not isinstance(a, Const):
        object.__setattr__(node, "b", _coerce(b, a.dtype, what))
        return a.dtype
    if isinstance(a, Const) and not isinstance(b, Const):
        object.__setattr__(node, "a", _coerce(a, b.dtype, what))
        return b.dtype
    if isinstance(a, Const) and isinstance(b, Const) and is_float(a.dtype) != is_float(b.dtype):
        target = a.dtype if is_float(a.dtype) else b.dtype
        object.__setattr__(node, "a", _coerce(a, target, what))
        object.__setattr__(node, "b", _coerce(b, target, what))
        return target
    return promote(a.dtype, b.dtype, what)


@dataclass(frozen=True, eq=False)
class BinOp(Expr):
    """A binary operation; its type follows from the operands' (`dtypes.promote`)."""

    a: Expr
    b: Expr
    dtype: str = field(init=False, default="int32")
    symbol = "?"
    #: Which kinds of operands the operation takes: "any", "int" or "float".
    domain = "any"

    def __post_init__(self) -> None:
        _operands(self, "a", "b")
        dtype = _unify(self, self.a, self.b, f"{type(self).__name__.lower()}")
        if self.domain == "int" and not (is_int(dtype) or is_bool(dtype)):
            raise DTypeError(f"{type(self).__name__} needs integer operands, not {dtype}"
                             + ("; use / for floating-point division" if type(self) is FloorDiv else ""))
        if self.domain == "float" and not is_float(dtype):
            raise DTypeError(f"{type(self).__name__} needs floating-point operands, not {dtype}; "
                             "use // (floor division) for integers")
        object.__setattr__(self, "dtype", dtype)

    def __repr__(self) -> str:
        if self.symbol.isalpha():
            return f"{self.symbol}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {self.symbol} {self.b!r})"


class Add(BinOp): symbol = "+"
class Sub(BinOp): symbol = "-"
class Mul(BinOp): symbol = "*"
class Min(BinOp): symbol = "min"
class Max(BinOp): symbol = "max"


class Div(BinOp):
    """Floating-point division (integers divide with `FloorDiv`)."""

    symbol = "/"
    domain = "float"


class FloorDiv(BinOp):
    symbol = "//"
    domain = "int"


class FloorMod(BinOp):
    symbol = "%"
    domain = "int"


class Shr(BinOp):
    """Arithmetic shift right of ``a`` by ``b`` bits (a negative ``b`` shifts left);
    the result has ``a``'s type."""

    symbol = ">>"
    domain = "int"

    def __post_init__(self) -> None:
        _operands(self, "a", "b")
        if not (is_int(self.a.dtype) and is_int(self.b.dtype)):
            raise DTypeError(f"shift needs integer operands, not {self.a.dtype} and {self.b.dtype}")
        object.__setattr__(self, "dtype", self.a.dtype)


class And(BinOp):
    """Logical and (operands are truth values)."""

    symbol = "and"

    def __post_init__(self) -> None:
        _operands(self, "a", "b")
        object.__setattr__(self, "dtype", BOOL)


class Or(BinOp):
    """Logical or."""

    symbol = "or"

    def __post_init__(self) -> None:
        _operands(self, "a", "b")
        object.__setattr__(self, "dtype", BOOL)


@dataclass(frozen=True, eq=False)
class Not(Expr):
    value: Expr
    dtype: str = field(init=False, default=BOOL)

    def __repr__(self) -> str:
        return f"not({self.value!r})"


_CMP_OPS = ("<", "<=", "==", "!=")


@dataclass(frozen=True, eq=False)
class Cmp(Expr):
    """A comparison (``<``, ``<=``, ``==``, ``!=``); its type is bool."""

    op: str
    a: Expr
    b: Expr
    dtype: str = field(init=False, default=BOOL)

    def __post_init__(self) -> None:
        _operands(self, "a", "b")
        if self.op not in _CMP_OPS:
            raise ValueError(f"comparison {self.op!r} is not one of {', '.join(_CMP_OPS)}")
        _unify(self, self.a, self.b, f"comparison {self.op}")

    def __repr__(self) -> str:
        return f"({self.a!r} {self.op} {self.b!r})"


def eq(a, b) -> Cmp:
    """``a == b`` as an expression (Python's ``==`` on nodes compares them)."""
    return Cmp("==", as_expr(a), as_expr(b))


def ne(a, b) -> Cmp:
    return Cmp("!=", as_expr(a), as_expr(b))


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """``then if cond else other`` (both sides are evaluated: no side effects in the IR)."""

    cond: Expr
    then: Expr
    other: Expr
    dtype: str = field(init=False, default="int32")

    def __post_init__(self) -> None:
        _operands(self, "cond", "then", "other")
        a, b = self.then, self.other
        if a.dtype != b.dtype:
            if isinstance(b, Const):
                object.__setattr__(self, "other", _coerce(b, a.dtype, "select"))
            elif isinstance(a, Const):
                object.__setattr__(self, "then", _coerce(a, b.dtype, "select"))
            else:
                promote(a.dtype, b.dtype, "select")
                raise DTypeError(f"select of {a.dtype} and {b.dtype}: cast one side explicitly")
        object.__setattr__(self, "dtype", self.then.dtype)

    def __repr__(self) -> str:
        return f"select({self.cond!r}, {self.then!r}, {self.other!r})"


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    """Conversion to ``to``: integers wrap to a narrower type (two's complement),
    floats to integers truncate toward zero."""

    to: str
    value: Expr

    def __post_init__(self) -> None:
        _operands(self, "value")
        check_dtype(self.to)

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.to

    def __repr__(self) -> str:
        return f"{self.to}({self.value!r})"


@dataclass(frozen=True, eq=False)
class BufferLoad(Expr):
    """``buffer[indices]``. With ``zero_outside`` an index outside the buffer's
    shape reads 0 (zero padding, inlined from `te.pad`)."""

    buffer: Any  # stmt.Buffer
    indices: tuple[Expr, ...]
    zero_outside: bool = False

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.buffer.dtype

    def __repr__(self) -> str:
        pad = "?" if self.zero_outside else ""
        return f"{self.buffer.name}{pad}[{', '.join(map(repr, self.indices))}]"


# ---------------------------------------------------------------------------- intrinsics

@dataclass(frozen=True)
class Intrinsic:
    """A named operation a back end implements: its arity and result type.

    ``result`` is a data type, or ``"arg"`` for the type of the first argument;
    ``kind`` is ``math`` (pure, on floats), ``int`` (pure, on int32), ``index``
    (a GPU thread or block index) or ``sync`` (a barrier; no value)."""

    name: str
    arity: int
    result: str
    kind: str
    doc: str


#: Every intrinsic a `Call` may name; back ends lower each one (or refuse it clearly).
INTRINSICS: dict[str, Intrinsic] = {}


def register_intrinsic(name: str, arity: int, result: str, kind: str, doc: str) -> Intrinsic:
    INTRINSICS[name] = Intrinsic(name, arity, result, kind, doc)
    return INTRINSICS[name]


for _name, _doc in (("exp", "e to the power x"), ("log", "natural logarithm"), ("sqrt", "square root"),
                    ("fabs", "absolute value"), ("tanh", "hyperbolic tangent")):
    register_intrinsic(_name, 1, "arg", "math", _doc)
register_intrinsic("roundeven", 1, "arg", "math", "x rounded to the nearest integer, halves to even (numpy's rint)")
register_intrinsic("fma", 3, "arg", "math", "a * b + c with one rounding")
register_intrinsic("fmax", 2, "arg", "math", "the larger of a and b, a NaN operand ignored (IEEE maxNum, numpy's "
                                             "fmax): NaN only when both are")
for _axis in "xyz":
    register_intrinsic(f"threadIdx.{_axis}", 0, "int32", "index", f"thread index in the block, axis {_axis}")
    register_intrinsic(f"blockIdx.{_axis}", 0, "int32", "index", f"block index in the grid, axis {_axis}")
register_intrinsic("barrier", 0, VOID, "sync", "wait until every thread of the block arrives (__syncthreads)")
register_intrinsic("dot4_u8s8", 2, "int32", "int",
                   "the dot product of a's four bytes as unsigned and b's four bytes as signed integers "
                   "(byte 0 the least significant): x86's VNNI vpdpbusd lane, the GPU's dp4a")
register_intrinsic("dot4_u7s8", 2, "int32", "int",
                   "dot4_u8s8 of an a whose bytes are all below 128 (non-negative int8 values): on AVX2 one "
                   "byte multiply-add whose 16-bit pair sums cannot saturate")


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A call of an intrinsic (`INTRINSICS`): math functions, GPU indices, barriers."""

    name: str
    args: tuple[Expr, ...] = ()
    dtype: str = field(init=False, default="int32")

    def __post_init__(self) -> None:
        intrin = INTRINSICS.get(self.name)
        if intrin is None:
            raise ValueError(f"unknown intrinsic {self.name!r}; known: {', '.join(sorted(INTRINSICS))}")
        if len(self.args) != intrin.arity:
            raise ValueError(f"intrinsic {self.name} takes {intrin.arity} arguments, not {len(self.args)}")
        args = tuple(as_expr(a) for a in self.args)
        if intrin.kind == "int":
            args = tuple(const(a.value, "int32") if isinstance(a, Const) else a for a in args)
            for a in args:
                if a.dtype != "int32":
                    raise DTypeError(f"{self.name} takes int32 arguments, not {a.dtype}")
        if intrin.kind == "math":
            if not is_float(args[0].dtype):
                raise DTypeError(f"{self.name} needs a floating-point argument, not {args[0].dtype}")
            args = tuple(_coerce(a, args[0].dtype, self.name) if isinstance(a, Const) and a.dtype != args[0].dtype
                         else a for a in args)
            for a in args:
                if a.dtype != args[0].dtype:
                    raise DTypeError(f"{self.name} arguments mix {args[0].dtype} and {a.dtype}")
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "dtype", args[0].dtype if intrin.result == "arg" else intrin.result)

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.args))})"


def reduction_identity(combiner: str, dtype: str) -> Const:
    """The value a reduction starts from: 0 for sums, the lowest (highest) value of
    ``dtype`` for max (min), NaN for fmax (which ignores it)."""
    if combiner == "sum":
        return Const(0, dtype)
    if combiner == "fmax":
        if not is_float(dtype):
            raise DTypeError(f"fmax reduces floating-point values, not {dtype}")
        return Const(math.nan, dtype)
    if is_float(dtype):
        return Const(-math.inf if combiner == "max" else math.inf, dtype)
    lo, hi = int_range(dtype)
    return Const(lo if combiner == "max" else hi, dtype)


@dataclass(frozen=True, eq=False)
class Reduce(Expr):
    """A commutative reduction (``sum``, ``max``, ``min`` or ``fmax``: the maximum of the
    values other than NaN, NaN when all are) of ``value`` over ``axes`` (tensor expressions
    only: lowering turns it into an initialization and an update)."""

    combiner: str
    value: Expr
    axes: tuple  # of te.IterVar

    COMBINERS = {"sum": Add, "max": Max, "min": Min, "fmax": lambda acc, value: Call("fmax", (acc, value))}

    def __post_init__(self) -> None:
        if self.combiner not in self.COMBINERS:
            raise ValueError(f"reduction {self.combiner!r} is not one of {', '.join(self.COMBINERS)}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.value.dtype

    def identity(self) -> Const:
        """The value the accumulator starts from."""
        return reduction_identity(self.combiner, self.dtype)

    def update(self, acc: Expr, value: Expr) -> Expr:
        """One step of the reduction."""
        return self.COMBINERS[self.combiner](acc, value)

    def __repr__(self) -> str:
        return f"{self.combiner}({self.value!r}, axes=[{', '.join(a.var.name for a in self.axes)}])"
