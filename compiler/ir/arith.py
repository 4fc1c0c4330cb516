"""Integer arithmetic on the IR: canonical simplification, intervals, evaluation.

- `simplify` puts integer index arithmetic in a canonical affine form, so
  bounds like ``(t*4 + 3) - t*4 + 1`` fold to ``4``; other expressions get
  their constant parts folded (floating-point arithmetic is never
  re-associated);
- `interval` gives the bounds of an expression over loop ranges (the engine
  of bounds inference), `const_upper_bound` a constant bound, `extremes`
  the exact range over the executed iterations;
- `evaluate` and `compile_expr` compute concrete values (the accelerator back
  end unrolls host loops with them);
- `substitute_stmt` replaces variables in a statement and re-simplifies what
  they appeared in.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .dtypes import int_range, is_float, is_int
from .expr import (
    Add, And, BinOp, BufferLoad, Cast, Cmp, Const, Div, Expr, FloorDiv, FloorMod, Max, Min, Mul, Not, Or, Select,
    Shr, Sub, Var,
)
from .stmt import BufferStore, Stmt
from .traversal import StmtMutator, free_vars, map_expr, node_fields, substitute

__all__ = [
    "simplify", "same_expr", "simplify_in", "linear_coefficient", "interval", "const_upper_bound",
    "evaluate", "extremes", "compile_expr", "wrap_int", "substitute_stmt",
]

#: Types whose arithmetic is canonicalized as affine forms (index arithmetic);
#: narrower integer data arithmetic only has its constants folded.
_AFFINE_TYPES = ("int32", "int64")


def wrap_int(value: int, dtype: str) -> int:
    """``value`` wrapped into the range of the integer type ``dtype`` (two's complement)."""
    lo, hi = int_range(dtype)
    span = hi - lo + 1
    return (value - lo) % span + lo


# ============================================================================ simplification

def _linear(expr: Expr) -> dict[Any, int]:
    """Canonical affine form: {atom: coefficient}, constant under key 1."""
    if isinstance(expr, Const):
        return {1: expr.value}
    if isinstance(expr, Var):
        return {expr: 1}
    if isinstance(expr, Add) or isinstance(expr, Sub):
        a, b = _linear(expr.a), _linear(expr.b)
        sign = 1 if isinstance(expr, Add) else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return {k: v for k, v in out.items() if v != 0 or k == 1}
    if isinstance(expr, Mul):
        a, b = _linear(expr.a), _linear(expr.b)
        if set(b) == {1}:
            return {k: v * b[1] for k, v in a.items()}
        if set(a) == {1}:
            return {k: v * a[1] for k, v in b.items()}
    atom = _atom(expr)
    if isinstance(atom, Const):
        return {1: atom.value}
    return {_AtomKey(atom): 1}




class _AtomKey:
    """A non-affine subexpression used as a variable of the affine form (structural identity)."""

    def __init__(self, expr: Expr) -> None:
        self.expr = expr
        self.key = _key(expr)

    def __eq__(self, other) -> bool:
        return isinstance(other, _AtomKey) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def _key(expr: Any) -> Any:
    """A hashable structural key: equal keys mean the same computation."""
    if isinstance(expr, Var):
        return ("var", id(expr))
    if isinstance(expr, Const):
        return ("const", expr.value, expr.dtype)
    if isinstance(expr, BinOp):
        return (type(expr).__name__, _key(expr.a), _key(expr.b))
    if isinstance(expr, BufferLoad):
        return ("load", id(expr.buffer), tuple(_key(i) for i in expr.indices), expr.zero_outside)
    if isinstance(expr, Expr) and dataclasses.is_dataclass(expr):
        parts = []
        for name, _ in node_fields(expr):
            value = getattr(expr, name)
            if isinstance(value, Expr):
                parts.append(_key(value))
            elif isinstance(value, tuple) and all(isinstance(v, Expr) for v in value):
                parts.append(tuple(_key(v) for v in value))
            elif isinstance(value, (str, int, float, bool)):
                parts.append(value)
            else:
                parts.append(("obj", id(value)))
        return (type(expr).__name__, *parts)
    return ("obj", id(expr))


def _decided(expr: Cmp, diff: Const) -> bool:
    """The value of ``a op b`` given the constant ``b - a``."""
    return {"<": diff.value > 0, "<=": diff.value >= 0, "==": diff.value == 0, "!=": diff.value != 0}[expr.op]


def _atom(expr: Expr) -> Expr:
    """Simplify the children of a non-affine node and fold constants."""
    if isinstance(expr, BinOp):
        a, b = simplify(expr.a), simplify(expr.b)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(_fold(type(expr), a.value, b.value, expr.dtype), expr.dtype)
        if not is_int(expr.dtype):
            return expr if a is expr.a and b is expr.b else type(expr)(a, b)
        if isinstance(expr, FloorDiv) and isinstance(b, Const) and b.value == 1:
            return a
        if isinstance(expr, FloorMod) and isinstance(b, Const) and b.value == 1:
            return Const(0, expr.dtype)
        if isinstance(expr, (Min, Max)) and _key(a) == _key(b):
            return a
        if isinstance(expr, (Min, Max)) and expr.dtype in _AFFINE_TYPES:
            diff = simplify(Sub(a, b))
            if isinstance(diff, Const):  # a = b + c: the comparison is decided
                pick_a = (diff.value <= 0) == isinstance(expr, Min)
                return a if pick_a else b
        if isinstance(expr, FloorDiv) and isinstance(b, Const) and b.value > 0 and expr.dtype in _AFFINE_TYPES:
            lin = _linear(a)
            if all(v % b.value == 0 for v in lin.values()):
                return simplify(_rebuild({k: v // b.value for k, v in lin.items()}, expr.dtype))
        return type(expr)(a, b)
    if isinstance(expr, Cmp):
        a, b = simplify(expr.a), simplify(expr.b)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(int(_compare(expr.op, a.value, b.value)), "bool")
        if a.dtype in _AFFINE_TYPES:
            diff = simplify(Sub(b, a))
            if isinstance(diff, Const):
                return Const(int(_decided(expr, diff)), "bool")
        return Cmp(expr.op, a, b)
    if isinstance(expr, Select):
        c = simplify(expr.cond)
        if isinstance(c, Const):
            return simplify(expr.then if c.value else expr.other)
        return Select(c, simplify(expr.then), simplify(expr.other))
    if isinstance(expr, Cast):
        value = simplify(expr.value)
        if isinstance(value, Const):
            return _cast_const(value, expr.to)
        return Cast(expr.to, value)
    if isinstance(expr, Not):
        value = simplify(expr.value)
        return Const(int(not value.value), "bool") if isinstance(value, Const) else Not(value)
    if isinstance(expr, Var) or not dataclasses.is_dataclass(expr):
        return expr
    # Any other node (loads, calls): simplify its expression fields.
    changes = {}
    for name, _ in node_fields(expr):
        value = getattr(expr, name)
        if isinstance(value, Expr):
            new = simplify(value)
            if new is not value:
                changes[name] = new
        elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
            new_t = tuple(simplify(v) for v in value)
            if any(x is not y for x, y in zip(new_t, value)):
                changes[name] = new_t
    return dataclasses.replace(expr, **changes) if changes else expr


def _compare(op: str, a, b) -> bool:
    return {"<": a < b, "<=": a <= b, "==": a == b, "!=": a != b}[op]


def _cast_const(c: Const, to: str) -> Const:
    if is_float(to):
        return Const(float(c.value), to)
    if to == "bool":
        return Const(int(bool(c.value)), to)
    value = int(c.value)  # float → int truncates toward zero
    return Const(wrap_int(value, to), to)


def _fold(kind: type, a, b, dtype: str = "int32"):
    """``a kind b`` on Python numbers with the IR's semantics for ``dtype``."""
    if kind is Add:
        v = a + b
    elif kind is Sub:
        v = a - b
    elif kind is Mul:
        v = a * b
    elif kind is Div:
        v = a / b if b else float("nan")
    elif kind is FloorDiv:
        v = a // b if b else 0
    elif kind is FloorMod:
        v = a % b if b else 0
    elif kind is Min:
        v = min(a, b)
    elif kind is Max:
        v = max(a, b)
    elif kind is Shr:
        v = a >> b if b >= 0 else a << -b
    elif kind is And:
        return int(bool(a) and bool(b))
    elif kind is Or:
        return int(bool(a) or bool(b))
    else:
        raise ValueError(f"cannot fold {kind.__name__}")
    if is_int(dtype) and dtype not in _AFFINE_TYPES:
        v = wrap_int(int(v), dtype)
    return v


def _rebuild(lin: dict[Any, int], dtype: str = "int32") -> Expr:
    terms: list[Expr] = []
    for k, v in lin.items():
        if k == 1 or v == 0:
            continue
        base = k.expr if isinstance(k, _AtomKey) else k
        terms.append(base if v == 1 else Mul(base, Const(v, dtype)))
    c = lin.get(1, 0)
    if not terms:
        return Const(c, dtype)
    out = terms[0]
    for t in terms[1:]:
        out = Add(out, t)
    if c > 0:
        out = Add(out, Const(c, dtype))
    elif c < 0:
        out = Sub(out, Const(-c, dtype))
    return out


def simplify(expr: Expr) -> Expr:
    """Canonicalize index arithmetic (affine parts collected and folded) and fold
    the constants of everything else."""
    if isinstance(expr, (Add, Sub, Mul)):
        if expr.dtype not in _AFFINE_TYPES:
            return _atom(expr)
        return _rebuild(_linear(expr), expr.dtype)
    if isinstance(expr, (Var, Const)):
        return expr
    return _atom(expr)


def same_expr(a: Expr, b: Expr) -> bool:
    """Structural equality after simplification."""
    return _key(simplify(a)) == _key(simplify(b))


def simplify_in(expr: Expr, ranges: dict[Var, tuple[Expr, Expr]]) -> Expr:
    """`simplify`, then use ``ranges`` (inclusive constant bounds of loop variables) like
    TVM's arithmetic analyzer: decide ``min``/``max`` whose operands' order is fixed,
    and split ``(q·c + r) // c`` into ``q`` and ``(q·c + r) % c`` into ``r`` when
    ``0 ≤ r < c`` (a tiled index divided by its tile size)."""
    def fn(e: Expr):
        if isinstance(e, (FloorDiv, FloorMod)):
            return _divmod_in(e, ranges)
        if isinstance(e, (Min, Max)):
            try:
                lo, hi = interval(simplify(Sub(e.a, e.b)), ranges)
            except ValueError:
                return None
            a_le_b = isinstance(hi, Const) and hi.value <= 0
            a_ge_b = isinstance(lo, Const) and lo.value >= 0
            if isinstance(e, Min):
                return e.a if a_le_b else e.b if a_ge_b else None
            return e.a if a_ge_b else e.b if a_le_b else None
        return None
    return simplify(map_expr(simplify(expr), fn))


def _divmod_in(e: FloorDiv | FloorMod, ranges) -> Expr | None:
    divisor = simplify(e.b)
    if not (isinstance(divisor, Const) and divisor.value > 0 and e.dtype in _AFFINE_TYPES):
        return None
    c = divisor.value
    lin = _linear(simplify(e.a))
    quotient: dict[Any, int] = {}
    rest: dict[Any, int] = {}
    for k, v in lin.items():
        if k == 1:
            quotient[1], rest[1] = divmod(v, c)
        elif v % c == 0:
            quotient[k] = v // c
        else:
            rest[k] = v
    remainder = _rebuild(rest, e.dtype)
    try:
        lo, hi = interval(remainder, ranges)
    except ValueError:
        return None
    if not (isinstance(lo, Const) and isinstance(hi, Const) and lo.value >= 0 and hi.value < c):
        return None
    return simplify(_rebuild(quotient, e.dtype)) if isinstance(e, FloorDiv) else remainder


def linear_coefficient(expr: Expr, var: Var) -> int | None:
    """The constant coefficient of ``var`` in ``expr``, or None if ``expr`` is not affine in it."""
    lin = _linear(simplify(expr))
    for k in lin:
        if isinstance(k, _AtomKey) and var in free_vars(k.expr):
            return None
    return lin.get(var, 0)


# ============================================================================ intervals and evaluation

def interval(expr: Expr, ranges: dict[Var, tuple[Expr, Expr]]) -> tuple[Expr, Expr]:
    """Inclusive bounds ``(lo, hi)`` of ``expr`` while each var in ``ranges`` takes
    every value in ``[lo, hi]``; other variables stay symbolic. Exact for affine
    expressions, conservative for the rest."""
    def go(e: Expr) -> tuple[Expr, Expr]:
        if isinstance(e, Var):
            return ranges.get(e, (e, e))
        if isinstance(e, Const):
            return e, e
        if isinstance(e, Add):
            (a0, a1), (b0, b1) = go(e.a), go(e.b)
            return a0 + b0, a1 + b1
        if isinstance(e, Sub):
            (a0, a1), (b0, b1) = go(e.a), go(e.b)
            return a0 - b1, a1 - b0
        if isinstance(e, Mul):
            for x, y in ((e.a, e.b), (e.b, e.a)):
                c = simplify(y)
                if isinstance(c, Const):
                    lo, hi = go(x)
                    return (lo * c, hi * c) if c.value >= 0 else (hi * c, lo * c)
        if isinstance(e, FloorDiv):
            c = simplify(e.b)
            if isinstance(c, Const) and c.value > 0:
                lo, hi = go(e.a)
                return FloorDiv(lo, c), FloorDiv(hi, c)
        if isinstance(e, FloorMod):
            c = simplify(e.b)
            if isinstance(c, Const) and c.value > 0:
                lo, hi = go(e.a)
                if _key(simplify(lo)) == _key(simplify(hi)):
                    return FloorMod(lo, c), FloorMod(hi, c)
                return Const(0), Const(c.value - 1)
        if isinstance(e, (Min, Max)):
            (a0, a1), (b0, b1) = go(e.a), go(e.b)
            k = type(e)
            return k(a0, b0), k(a1, b1)
        if not (free_vars(e) & set(ranges)):
            return e, e
        raise ValueError(f"cannot bound {e!r}")
    lo, hi = go(expr)
    return simplify(lo), simplify(hi)


def const_upper_bound(expr: Expr) -> int:
    """A constant ≥ every value of ``expr`` (for allocation sizes of variable-size tiles).

    ``min(a, b)`` is bounded by whichever operand has a constant bound, also
    inside sums (``min(x + 7, 39) - x + 1 ≤ 8``)."""
    e = simplify(expr)
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Max):
        return max(const_upper_bound(e.a), const_upper_bound(e.b))
    found: list[Min] = []
    map_expr(e, lambda x: found.append(x) if isinstance(x, Min) and not found else None)
    if found:
        target = found[0]
        bounds = []
        for part in (target.a, target.b):
            try:
                bounds.append(const_upper_bound(map_expr(e, lambda x, p=part: p if x is target else None)))
            except ValueError:
                pass
        if bounds:
            return min(bounds)
    raise ValueError(f"{e!r} has no constant upper bound")


def evaluate(expr: Expr, env: dict[Var, int]) -> int:
    """The value of ``expr`` with variables bound by ``env``."""
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Var):
        try:
            return env[expr]
        except KeyError:
            raise ValueError(f"variable {expr.name} is unbound") from None
    if isinstance(expr, BinOp):
        return _fold(type(expr), evaluate(expr.a, env), evaluate(expr.b, env), expr.dtype)
    if isinstance(expr, Cmp):
        return int(_compare(expr.op, evaluate(expr.a, env), evaluate(expr.b, env)))
    if isinstance(expr, Not):
        return int(not evaluate(expr.value, env))
    if isinstance(expr, Select):
        return evaluate(expr.then if evaluate(expr.cond, env) else expr.other, env)
    if isinstance(expr, Cast):
        return _cast_const(Const(evaluate(expr.value, env), expr.value.dtype), expr.to).value
    raise ValueError(f"cannot evaluate {expr!r} to a number")


_ENUMERATION_LIMIT = 1 << 14


def extremes(e: Expr, loops: list[tuple[Var, Expr]]) -> tuple[int, int] | None:
    """Exact (min, max) of ``e`` over the executed iterations of ``loops`` (outer first),
    or None when there are too many to enumerate."""
    count = 1
    for _, ext in loops:
        count *= const_upper_bound(ext)
    if count > _ENUMERATION_LIMIT:
        return None

    if all(isinstance(ext, Const) for _, ext in loops):
        # A rectangular nest: every iteration at once, as numpy arrays broadcast over the loops.
        try:
            whole = compile_expr(e, vector=True)
        except ValueError:
            whole = None
        if whole is not None:
            shape = [int(ext.value) for _, ext in loops]
            if 0 in shape:
                return None
            env = {var: np.arange(n, dtype=np.int64).reshape([n if k == j else 1 for k in range(len(shape))])
                   for j, ((var, _), n) in enumerate(zip(loops, shape))}
            try:
                with np.errstate(divide="raise", invalid="raise"):
                    values = np.asarray(whole(env))
            except KeyError:        # depends on a variable outside ``loops``
                return None
            except FloatingPointError:
                values = None       # a division by zero: raised as one iteration at a time raises it
            if values is not None:
                return int(values.min()), int(values.max())

    def fast(x: Expr):
        try:
            return compile_expr(x)
        except ValueError:
            return lambda env, x=x: evaluate(x, env)
    value_of = fast(e)
    extents = [(var, fast(ext)) for var, ext in loops]
    values: list[int] = []

    def go(level: int, env: dict) -> None:
        if level == len(extents):
            values.append(value_of(env))
            return
        var, ext = extents[level]
        for i in range(ext(env)):
            env[var] = i
            go(level + 1, env)
        env.pop(var, None)
    try:
        go(0, {})
    except (KeyError, ValueError):  # depends on a variable outside ``loops``
        return None
    return (min(values), max(values)) if values else None


_PY_OPS = {Add: "+", Sub: "-", Mul: "*", FloorDiv: "//", FloorMod: "%"}
#: Python text of the other two-operand nodes; truth values as 0/1 like `evaluate`.
_PY_FORMS = {Min: "min({}, {})", Max: "max({}, {})",
             And: "int(bool({}) and bool({}))", Or: "int(bool({}) or bool({}))"}
#: The same, element-wise over numpy arrays (`compile_expr`'s ``vector``).
_NUMPY_FORMS = {Min: "_np.minimum({}, {})", Max: "_np.maximum({}, {})",
                And: "_np.int64(_np.logical_and({}, {}))", Or: "_np.int64(_np.logical_or({}, {}))"}


def compile_expr(expr: Expr, *, vector: bool = False) -> Callable[[dict], int]:
    """``expr`` as a Python function of an environment ``{Var: int}``; same results
    as `evaluate`, much faster when one expression is evaluated many times. With ``vector``
    the environment's values are integer numpy arrays (broadcast together) and so is the
    result, element by element what `evaluate` gives (Python's and numpy's integer ``//`` and
    ``%`` both round towards minus infinity)."""
    names: dict[Var, str] = {}
    forms = _NUMPY_FORMS if vector else _PY_FORMS

    def src(e: Expr) -> str:
        if isinstance(e, Const) and is_int(e.dtype):
            return repr(int(e.value))
        if isinstance(e, Var):
            if e not in names:
                names[e] = f"v{len(names)}"
            return names[e]
        if type(e) in _PY_OPS and e.dtype in _AFFINE_TYPES:
            return f"({src(e.a)} {_PY_OPS[type(e)]} {src(e.b)})"
        if type(e) in forms:
            return forms[type(e)].format(src(e.a), src(e.b))
        if isinstance(e, Cmp):
            return f"_np.int64({src(e.a)} {e.op} {src(e.b)})" if vector else f"int({src(e.a)} {e.op} {src(e.b)})"
        if isinstance(e, Not):
            return f"_np.int64(_np.logical_not({src(e.value)}))" if vector else f"int(not {src(e.value)})"
        if isinstance(e, Select):
            if vector:
                return f"_np.where({src(e.cond)}, {src(e.then)}, {src(e.other)})"
            return f"({src(e.then)} if {src(e.cond)} else {src(e.other)})"
        raise ValueError(f"cannot compile {e!r} to Python")
    body = src(expr)
    binds = "".join(f"    {n} = env[_vars[{i}]]\n" for i, n in enumerate(names.values()))
    code = f"def _f(env):\n{binds}    return {body}\n"
    scope: dict = {"_vars": list(names), "_np": np}
    exec(code, scope)  # noqa: S102 - generated from IR nodes only
    return scope["_f"]


def substitute_stmt(stmt: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    """Replace variables everywhere in a statement tree. Index expressions, extents
    and conditions are re-simplified; stored values are substituted but not
    re-associated (passes pattern-match them)."""
    class Substitute(StmtMutator):
        def visit_expr(self, e: Expr) -> Expr:
            return simplify(substitute(e, mapping))

        def visit_BufferStore(self, s: BufferStore) -> Stmt:
            return BufferStore(self.visit_buffer(s.buffer), tuple(self.visit_expr(i) for i in s.indices),
                               substitute(s.value, mapping))
    if not mapping:
        return stmt
    return Substitute().visit(stmt)
