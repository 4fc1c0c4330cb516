"""The loop IR's arithmetic: simplification, intervals, bounds, evaluation."""

from __future__ import annotations

import pytest

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
