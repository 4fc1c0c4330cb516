"""The loop IR's arithmetic: simplification, intervals, bounds, evaluation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemforge.compiler.ir import (
    Const, Max, Min, Var, const_upper_bound, evaluate, extremes, interval,
    linear_coefficient, same_expr, simplify, simplify_in,
)

i, j, t = Var("i"), Var("j"), Var("t")


def test_affine_simplification_cancels_terms():
    assert simplify((t * 4 + 3) - t * 4 + 1) == Const(4)
    assert same_expr((i + j) * 2 - j, i * 2 + j)
    assert same_expr((i * 8 + 4) // 4, i * 2 + 1)
    assert simplify(Min(i + 3, i + 5)) is not None and same_expr(Min(i + 3, i + 5), i + 3)


def test_interval_over_loop_ranges():
    ranges = {i: (Const(0), Const(3)), j: (Const(0), Const(9))}
    lo, hi = interval(t * 4 + i - j, ranges)
    assert same_expr(lo, t * 4 - 9) and same_expr(hi, t * 4 + 3)
    lo, hi = interval(j % 4, ranges)
    assert (lo, hi) == (Const(0), Const(3))


def test_const_upper_bound_sees_through_min():
    assert const_upper_bound(Min(Const(8), Const(39) - t * 8)) == 8
    assert const_upper_bound(Min(t * 8 + 7, Const(39)) - t * 8 + 1) == 8
    with pytest.raises(ValueError):
        const_upper_bound(t + 1)


def test_simplify_in_decides_min_max():
    ranges = {i: (Const(0), Const(5))}
    assert same_expr(simplify_in(Max(i * 2, Const(0)), ranges), i * 2)
    assert same_expr(simplify_in(Min(i, Const(10)), ranges), i)
    assert isinstance(simplify_in(Min(i, Const(3)), ranges), Min)


def test_evaluate_and_linear_coefficient():
    assert evaluate((i * 7 + j) // 3 + j % 2, {i: 2, j: 5}) == 7
    assert linear_coefficient(i * 5 + j * 3 + 1, i) == 5
    assert linear_coefficient(i // 2 + j, i) is None
    assert linear_coefficient(j, i) == 0


def test_extremes_enumerates_executed_iterations():
    # t in range(3), j in range(min(2, 5 - 2t)): the last t runs one j only.
    loops = [(t, Const(3)), (j, Min(Const(2), Const(5) - t * 2))]
    assert extremes(t * 2 + j, loops) == (0, 4)


@st.composite
def _conditions(draw, variables, depth):
    from gemforge.compiler.ir import And, Cmp, Not, Or
    cond = Cmp(draw(st.sampled_from(["<", "<=", "==", "!="])), draw(_index_exprs(variables, depth)),
               draw(_index_exprs(variables, depth)))
    form = draw(st.sampled_from(["cmp", "not", "and", "or"]))
    if form == "not":
        return Not(cond)
    if form in ("and", "or"):
        other = Cmp("<", draw(_index_exprs(variables, depth)), Const(draw(st.integers(-3, 3))))
        return And(cond, other) if form == "and" else Or(cond, other)
    return cond


@st.composite
def _index_exprs(draw, variables, depth=3):
    """Integer index expressions over ``variables``: the forms bounds inference meets."""
    from gemforge.compiler.ir import FloorDiv, FloorMod, Select
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(variables)) if draw(st.booleans()) else Const(draw(st.integers(-9, 9)))
    a, b = draw(_index_exprs(variables, depth - 1)), draw(_index_exprs(variables, depth - 1))
    form = draw(st.sampled_from(["+", "-", "*", "//", "%", "min", "max", "select"]))
    if form in ("//", "%"):
        divisor = Const(draw(st.integers(1, 7)) * draw(st.sampled_from([1, -1])))
        return FloorDiv(a, divisor) if form == "//" else FloorMod(a, divisor)
    if form == "select":
        return Select(draw(_conditions(variables, depth - 1)), a, b)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "min": lambda: Min(a, b),
            "max": lambda: Max(a, b)}[form]()


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_extremes_of_a_rectangular_nest_are_those_of_every_iteration(data):
    """Over constant extents `extremes` evaluates all iterations at once (numpy); the result is
    the min and max of `evaluate` at each."""
    import itertools
    extents = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    loop_vars = [i, j, t][:len(extents)]
    e = data.draw(_index_exprs(loop_vars))
    values = [evaluate(e, dict(zip(loop_vars, point))) for point in itertools.product(*map(range, extents))]
    assert extremes(e, [(v, Const(n)) for v, n in zip(loop_vars, extents)]) == (min(values), max(values))


# ---------------------------------------------------------------------------- data types and nodes

def test_binary_operations_check_and_promote_dtypes():
    from gemforge.compiler.ir import BufferLoad, Buffer, Cast, Div, DTypeError
    x = Var("x", "float32")
    assert (x + 1).dtype == "float32" and (x + 1).b == Const(1.0, "float32")   # a constant follows the other side
    a8 = BufferLoad(Buffer("a", (4,), "int8"), (i,))
    a32 = BufferLoad(Buffer("b", (4,), "int32"), (i,))
    assert (a8 + a32).dtype == "int32"                                         # integers widen
    with pytest.raises(DTypeError, match="mixes float32 and int32"):
        x + a32                                                                # int/float needs a cast
    assert (x + Cast("float32", a32)).dtype == "float32"
    with pytest.raises(DTypeError, match="use // "):
        Div(i, Const(2))
    with pytest.raises(DTypeError, match="use / "):
        x // 2.0


def test_constants_hash_like_they_compare():
    assert Const(3) == Const(3) and hash(Const(3)) == hash(Const(3))
    assert Const(3) != Const(3, "int8") and len({Const(3), Const(3), Const(3, "int8")}) == 2
    assert len({Const(1.5, "float32"), Const(1.5, "float32")}) == 1


def test_calls_name_known_intrinsics():
    from gemforge.compiler.ir import Call, DTypeError
    x = Var("x", "float32")
    assert Call("exp", (x,)).dtype == "float32"
    assert Call("fma", (x, x, 1)).args[2] == Const(1.0, "float32")
    assert Call("threadIdx.x").dtype == "int32" and Call("barrier").dtype == "void"
    with pytest.raises(ValueError, match="unknown intrinsic"):
        Call("sin_cos", (x,))
    with pytest.raises(DTypeError, match="floating-point argument"):
        Call("exp", (i,))


def test_float_arithmetic_is_folded_but_not_reassociated():
    x = Var("x", "float32")
    assert simplify(Const(1.5, "float32") * Const(2.0, "float32")) == Const(3.0, "float32")
    e = (x + 1.0) - 1.0
    assert not isinstance(simplify(e), Var)    # (x + 1) - 1 is not x in floating point


def test_generic_traversal_rebuilds_back_end_nodes():
    """Substitution reaches the expressions inside a back end's own node kinds through
    their fields, with no rewriter written for them."""
    from gemforge.compiler.backends.accel.nodes import BufferRef, DmaCopy
    from gemforge.compiler.ir import Buffer, substitute_stmt
    dram, sram = Buffer("x", (8, 1, 4), "int8", tile_dims=2), Buffer("x.inp", (8, 1, 4), "int8", "inp", 2)
    copy = DmaCopy("load", BufferRef(dram, (t * 2,)), BufferRef(sram, (Const(0),)), Const(1), t + 1, 8)
    out = substitute_stmt(copy, {t: Const(3)})
    assert out.dram.indices == (Const(6),) and out.x_size == Const(4) and out.sram is copy.sram


def test_verifier_names_unbound_variables_and_unknown_buffers():
    from gemforge.compiler.ir import Buffer, BufferStore, For, PrimFunc, VerifyError, verify
    out = Buffer("out", (4,), "int32")
    stray = Buffer("stray", (4,), "int32")
    with pytest.raises(VerifyError, match="variable j is used outside"):
        verify(PrimFunc("f", [out], For(i, Const(4), BufferStore(out, (j,), Const(0)))))
    with pytest.raises(VerifyError, match="buffer stray is accessed"):
        verify(PrimFunc("f", [out], For(i, Const(4), BufferStore(stray, (i,), Const(0)))))
    with pytest.raises(VerifyError, match="store of a float32 value into out"):
        verify(PrimFunc("f", [out], For(i, Const(4), BufferStore(out, (i,), Const(1.0, "float32")))))


def test_a_constant_that_does_not_fit_its_operand_type_is_refused():
    """int8 x clipped to 300 must not silently become a clip to 44 (300 wrapped)."""
    from gemforge.compiler.ir import DTypeError, Max, Var
    x = Var("x", "int8")
    with pytest.raises(DTypeError, match="300.*int8"):
        Max(x, 300)
    assert Max(x, 100).b.dtype == "int8"
