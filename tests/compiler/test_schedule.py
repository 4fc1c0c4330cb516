"""Schedule primitives and their lowering to loop IR (bounds inference included)."""

from __future__ import annotations

import pytest

from gemforge.compiler.ir import Allocate, AttrStmt, Const, For, ForKind, Min, format_ir, simplify, walk
from gemforge.compiler.lower import infer_bounds, schedule_to_ir
from gemforge.compiler.schedule import ScheduleError, create_schedule
from gemforge.compiler.te import compute, placeholder, reduce_axis, sum_


def _vector_add(n=10):
    a = placeholder((n, 1, 4), "int32", "a", tile_dims=2)
    b = compute((n, 1, 4), lambda i, x, y: a[i, x, y] + 1, name="b")
    return a, b


def _loops(stmt):
    found = []
    walk(stmt, lambda s: found.append(s) if isinstance(s, For) else None)
    return found


def test_split_exact_and_partial():
    _, b = _vector_add(12)
    s = create_schedule(b)
    i, _, _ = s[b].leaf
    o, inner = s[b].split(i, 4)
    assert o.extent == Const(3) and inner.extent == Const(4)
    _, b = _vector_add(10)
    s = create_schedule(b)
    o, inner = s[b].split(s[b].leaf[0], 4)
    assert o.extent == Const(3) and isinstance(inner.extent, Min)
    o2, _ = s[b].split(o, nparts=2)
    assert o2.extent == Const(2)
    with pytest.raises(ScheduleError, match="exactly one of factor and nparts"):
        s[b].split(inner)


def test_fuse_reorder_tile_and_errors():
    a = placeholder((6, 8, 1, 4), "int32", "a")
    b = compute((6, 8, 1, 4), lambda i, j, x, y: a[i, j, x, y], name="b")
    st = create_schedule(b)[b]
    i, j, x, y = st.leaf
    io, jo, ii, ji = st.tile(i, j, 3, 4)
    assert st.leaf[:4] == [io, jo, ii, ji]
    f = st.fuse(io, jo)
    assert f.extent == Const(4) and st.leaf[0] is f
    with pytest.raises(ScheduleError, match="adjacent"):
        st.fuse(f, ji)
    with pytest.raises(ScheduleError, match="not a current loop"):
        st.reorder(i, j)
    st.reorder(ji, ii)
    assert st.leaf[1:3] == [ji, ii]


def test_lowering_follows_the_leaf_order_and_kinds():
    _, b = _vector_add(8)
    s = create_schedule(b)
    st = s[b]
    o, inner = st.split(st.leaf[0], 2)
    st.vthread(inner)
    st.unroll(st.leaf[-1])
    ir = schedule_to_ir(s)
    loops = _loops(ir)
    assert [simplify(l.extent) for l in loops[:2]] == [Const(4), Const(2)]
    assert loops[1].kind is ForKind.VTHREAD and loops[-1].kind is ForKind.UNROLLED
    st.bind(o, "blockIdx.x")
    assert _loops(schedule_to_ir(s))[0].thread == "blockIdx.x"


def test_compute_at_region_is_inferred_from_the_reads():
    """A 3-row window per output row: the copy computes (toh-1)*s + 3 rows, not the whole tensor."""
    x = placeholder((1, 20, 1, 4), "int32", "x")
    k = reduce_axis(3, "k")
    y = compute((1, 9, 1, 4), lambda n, h, b, o: sum_(x[n, h * 2 + k, b, o], [k]), name="y")
    s = create_schedule(y)
    xc = s.cache_read(x, "acc", [y])
    st = s[y]
    ho, hi = st.split(st.leaf[1], 3)
    s[xc].compute_at(st, ho)
    regions = infer_bounds(s)
    assert simplify(regions[s[xc]].extent[1]) == Const(7)  # (3-1)*2 + 3
    assert regions[s[xc]].alloc == [1, 7, 1, 4]
    ir = schedule_to_ir(s)
    allocs = []
    walk(ir, lambda n: allocs.append(n.buffer) if isinstance(n, Allocate) else None)
    assert [b.shape for b in allocs] == [(1, 7, 1, 4)]
    assert "x.acc" in format_ir(ir)


def test_compute_inline_and_pragmas():
    a = placeholder((4, 1, 4), "int32", "a")
    b = compute((4, 1, 4), lambda i, x, y: a[i, x, y] * 2, name="b")
    c = compute((4, 1, 4), lambda i, x, y: b[i, x, y] + 1, name="c")
    s = create_schedule(c)
    s[b].compute_inline()
    s[c].pragma(s[c].leaf[0], "alu")
    ir = schedule_to_ir(s)
    assert isinstance(ir, AttrStmt) and ir.key == "alu"
    assert "b[" not in format_ir(ir) and "a[" in format_ir(ir)


def test_reduction_gets_an_init_nest_before_the_reduce_loop():
    a = placeholder((2, 6, 1, 4), "int32", "a")
    k = reduce_axis(6, "k")
    c = compute((2, 1, 4), lambda i, x, y: sum_(a[i, k, x, y], [k]), name="c")
    text = format_ir(schedule_to_ir(create_schedule(c)))
    assert text.index("= 0") < text.index("for k in")


def test_compute_at_on_a_placeholder_is_refused():
    a, b = _vector_add()
    s = create_schedule(b)
    with pytest.raises(ScheduleError, match="is an input"):
        s[a].compute_at(s[b], s[b].leaf[0])
    with pytest.raises(ScheduleError, match="storage scope is a name"):
        s[b].set_scope("l2 cache")


@pytest.mark.parametrize("target,scope", [("tiny", "shared"), ("cpu", "inp"), ("gpu", "acc")])
def test_the_target_validates_scopes(target, scope):
    """Scopes are names the target defines: a schedule using another target's scope is
    refused when it is lowered for this one, naming the scopes it has."""
    from gemforge.compiler.pipeline import lower
    a, b = _vector_add()
    s = create_schedule(b)
    s.cache_read(a, scope, [b])
    s[s.stages[1].tensor].compute_at(s[b], s[b].leaf[0])
    with pytest.raises(ScheduleError, match=f"scope '{scope}'; this target has"):
        lower(s, target, [a, b])


def test_a_stride_above_the_window_gives_a_strided_region():
    """A 1-tap window with stride 3: the copy holds every third row only, and the
    consumer reads it densely."""
    x = placeholder((1, 20, 1, 4), "int32", "x")
    k = reduce_axis(1, "k")
    y = compute((1, 6, 1, 4), lambda n, h, b, o: sum_(x[n, h * 3 + k, b, o], [k]), name="y")
    s = create_schedule(y)
    xc = s.cache_read(x, "acc", [y])
    st = s[y]
    ho, hi = st.split(st.leaf[1], 2)
    s[xc].compute_at(st, ho)
    region = infer_bounds(s)[s[xc]]
    assert region.stride == [1, 3, 1, 1]
    assert simplify(region.extent[1]) == Const(2) and region.alloc == [1, 2, 1, 4]
    text = format_ir(schedule_to_ir(s))
    assert "x[" in text and "* 3" in text  # the copy gathers rows h*3 ...


@pytest.mark.parametrize("taps,padded", [(2, False), (1, True)])
def test_overlapping_or_padded_windows_stay_contiguous(taps, padded):
    """Two taps with stride 3 read rows 3h and 3h+1 (no common step), and a zero-padded
    copy frames whole rows: both keep stride 1."""
    from gemforge.compiler.te import pad
    x = placeholder((1, 20, 1, 4), "int32", "x")
    src = pad(x, (0, 1, 0, 0), (0, 1, 0, 0), "xp") if padded else x
    k = reduce_axis(taps, "k")
    y = compute((1, 6, 1, 4), lambda n, h, b, o: sum_(src[n, h * 3 + k, b, o], [k]), name="y")
    s = create_schedule(y)
    if padded:
        s[src].compute_inline()
    xc = s.cache_read(src, "acc", [y])
    st = s[y]
    ho, hi = st.split(st.leaf[1], 2)
    s[xc].compute_at(st, ho)
    region = infer_bounds(s)[s[xc]]
    assert region.stride == [1, 1, 1, 1]


def test_vthread_order_is_checked():
    _, b = _vector_add()
    s = create_schedule(b)
    with pytest.raises(ScheduleError, match="vthread order must be one of interleaved, sequential"):
        s[b].vthread(s[b].leaf[0], order="random")


def test_scheduling_leaves_the_tensor_expressions_unchanged():
    """cache_read/cache_write/compute_inline change the schedule's stages, never the
    operations: the same expression can be scheduled (and lowered) twice."""
    from gemforge.compiler.te import pad
    a = placeholder((6, 8), "int32", "a")
    ap = pad(a, (1, 0), (1, 0))
    k = reduce_axis(8, "k")
    c = compute((8,), lambda i: sum_(ap[i, k] * 2, [k]), name="c")
    before = repr(c.op.body), repr(ap.op.body)
    s = create_schedule(c)
    s[ap].compute_inline()
    cc = s.cache_write(c, "local")
    s.cache_read(a, "local", [cc])
    first = format_ir(schedule_to_ir(s))
    assert (repr(c.op.body), repr(ap.op.body)) == before
    assert format_ir(schedule_to_ir(s)) == first           # lowering does not change the schedule either
    plain = format_ir(schedule_to_ir(create_schedule(c)))  # a fresh schedule sees the original expression
    assert "c.local" not in plain and "a.local" not in plain


def test_reduction_init_keeps_loop_kinds_and_thread_names():
    a = placeholder((64, 16), "float32", "a")
    k = reduce_axis(16, "k")
    c = compute((64,), lambda i: sum_(a[i, k], [k]), name="c")
    s = create_schedule(c)
    i, kk = s[c].leaf
    io, ii = s[c].split(i, 8)
    s[c].reorder(io, kk, ii)
    s[c].bind(io, "blockIdx.x")
    s[c].vectorize(ii)
    loops = _loops(schedule_to_ir(s))
    inner = [l for l in loops if l.var is ii.var]
    assert len(inner) == 2 and all(l.kind is ForKind.VECTORIZED for l in inner)   # init and update
    assert loops[0].kind is ForKind.THREAD_BINDING and loops[0].thread == "blockIdx.x"


def test_an_attached_stage_in_main_memory_writes_and_reads_its_region_of_the_tensor():
    """compute_at without another scope: the stage computes the region each iteration needs,
    in place in the whole tensor (rows of a workspace), and readers index it globally."""
    import numpy as np
    from gemforge.compiler import CpuTarget, build
    x = placeholder((3, 40), "float32", "x")
    y = compute((3, 40), lambda i, j: x[i, j] * 2.0, name="y")
    z = compute((3, 40), lambda i, j: y[i, 39 - j] + 1.0, name="z")
    s = create_schedule(z)
    s[y].compute_at(s[z], s[z].leaf[0])
    X = np.arange(120, dtype=np.float32).reshape(3, 40)
    Z = np.zeros((3, 40), np.float32)
    build(s, CpuTarget(), [x, z])(X, Z)
    np.testing.assert_array_equal(Z, X[:, ::-1] * 2 + 1)
