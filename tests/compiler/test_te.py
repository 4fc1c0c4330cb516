"""Tensor expressions: placeholders, computes, reductions, padding."""

from __future__ import annotations

import pytest

from gemforge.compiler.ir import BufferLoad, Const, Reduce, Var
from gemforge.compiler.te import (
    ComputeOp, PlaceholderOp, TeError, clip, compute, pad, placeholder, reduce_axis, sum_, tensor_of,
)


def test_placeholder_and_indexing():
    a = placeholder((3, 4, 1, 16), "int8", "a")
    assert isinstance(a.op, PlaceholderOp) and a.shape == (3, 4, 1, 16) and a.dtype == "int8"
    i = Var("i")
    load = a[i, 0, 0, 1]
    assert isinstance(load, BufferLoad) and load.buffer is a.buffer and load.indices[0] is i
    assert tensor_of(a.buffer) is a
    with pytest.raises(TeError, match="has 4 dimensions, indexed with 2"):
        a[0, 1]
    with pytest.raises(TeError, match="non-positive dimension"):
        placeholder((0, 2), "int8", "z")


def test_compute_with_reduction():
    a = placeholder((2, 3, 1, 4), "int8", "a")
    w = placeholder((5, 3, 4, 4), "int8", "w")
    ko, ki = reduce_axis(3, "ko"), reduce_axis(4, "ki")
    c = compute((2, 5, 1, 4), lambda m, n, b, o: sum_(a[m, ko, b, ki].astype("int32") * w[n, ko, o, ki].astype("int32"),
                                                      [ko, ki]), name="c")
    assert isinstance(c.op, ComputeOp) and c.dtype == "int32"
    assert isinstance(c.op.body, Reduce) and c.op.reduce_axes == [ko, ki]
    assert c.op.input_buffers() == [a.buffer, w.buffer]


def test_compute_errors():
    a = placeholder((2, 2), "int32", "a", tile_dims=0)
    with pytest.raises(TeError, match="2 dimensions but its function takes 1"):
        compute((2, 2), lambda i: a[i, i], name="bad")
    k = reduce_axis(2, "k")
    with pytest.raises(TeError, match="whole body"):
        compute((2,), lambda i: sum_(a[i, k], [k]) + 1, name="nested", tile_dims=0)
    with pytest.raises(TeError, match="not a reduction axis"):
        from gemforge.compiler.te import IterVar
        sum_(a[0, 0], [IterVar(Var("x"), Const(2))])
    with pytest.raises(TeError, match="positive integer"):
        reduce_axis(0)


def test_pad_reads_zero_outside():
    x = placeholder((1, 1, 4, 4, 1, 4), "int8", "x")
    xp = pad(x, (0, 0, 1, 1, 0, 0), (0, 0, 2, 1, 0, 0))
    assert xp.shape == (1, 1, 7, 6, 1, 4) and xp.op.tag == "pad"
    body = xp.op.body
    assert isinstance(body, BufferLoad) and body.zero_outside and body.buffer is x.buffer


def test_clip_builds_min_of_max():
    x = placeholder((1, 1, 4), "int32", "x", tile_dims=1)
    e = clip(x[0, 0, 0], -128, 127)
    assert type(e).__name__ == "Min" and type(e.a).__name__ == "Max"
