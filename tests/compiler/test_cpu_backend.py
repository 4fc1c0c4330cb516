"""The CPU back end: LLVM code for the loop IR's semantics, loop kinds and artefacts."""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.compiler import CpuTarget, build, create_schedule
from gemforge.compiler.backends import stages
from gemforge.compiler.backends.cpu import KernelArgumentError
from gemforge.compiler.ir import Call, Cast, Const, FloorDiv, FloorMod, IfThenElse, Max, Min, Select, Shr, Var, walk
from gemforge.compiler.pipeline import lower, run_stages
from gemforge.compiler.te import compute, pad, placeholder, reduce_axis, reduce_max, reduce_min, sum_

CPU = CpuTarget()


def _run(s, args, *arrays):
    kernel = build(s, CPU, args)
    kernel(*arrays)
    return kernel


def test_stages_are_one_ordered_list():
    assert list(stages(CPU)) == ["partition_tiles", "make_llvm_ir", "optimize", "jit"]


@pytest.mark.parametrize("vectorize", [False, True])
def test_integer_semantics_floor_division_shifts_and_wrapping(vectorize):
    """//, % floor (remainder takes the divisor's sign), >> is arithmetic with negative
    amounts shifting left and large amounts saturating, narrowing casts wrap."""
    rng = np.random.default_rng(1)
    n = 67
    x = placeholder((n,), "int32", "x")
    d = placeholder((n,), "int32", "d")
    sh = placeholder((n,), "int32", "sh")
    out = compute((n, 4), lambda i, j: Select(j < 1, FloorDiv(x[i], d[i]), Select(j < 2, FloorMod(x[i], d[i]),
                  Select(j < 3, Shr(x[i], sh[i]), Cast("int32", Cast("int8", x[i]))))), name="out")
    s = create_schedule(out)
    if vectorize:
        s[out].reorder(*reversed(s[out].leaf))
        s[out].vectorize(s[out].leaf[-1])
    X = rng.integers(-(1 << 20), 1 << 20, n).astype(np.int32)
    D = rng.choice([-7, -3, -1, 1, 2, 5, 9], n).astype(np.int32)
    SH = rng.integers(-40, 41, n).astype(np.int32)
    O = np.zeros((n, 4), np.int32)
    _run(s, [x, d, sh, out], X, D, SH, O)
    x64 = X.astype(np.int64)
    shifted = np.where(SH >= 0, x64 >> np.minimum(SH, 31), np.where(-SH >= 32, 0, (x64 << np.clip(-SH, 0, 31))))
    shifted = ((shifted + (1 << 31)) % (1 << 32)) - (1 << 31)
    np.testing.assert_array_equal(O[:, 0], X // D)
    np.testing.assert_array_equal(O[:, 1], X % D)
    np.testing.assert_array_equal(O[:, 2], shifted)
    np.testing.assert_array_equal(O[:, 3], X.astype(np.int8).astype(np.int32))


def test_float_to_int_conversion_saturates_and_math_calls():
    x = placeholder((8,), "float32", "x")
    out_i = compute((8,), lambda i: Cast("int8", x[i]), name="oi")
    out_f = compute((8,), lambda i: Call("fma", (Call("exp", (x[i] / 1e8,)), Call("sqrt", (Call("fabs", (x[i],)),)),
                                                   Call("tanh", (x[i] / 300.0,)))), name="of")
    s = create_schedule([out_i, out_f])
    X = np.array([-1e9, -300.0, -128.9, -0.5, 0.7, 127.9, 300.0, 1e9], np.float32)
    oi, of = np.zeros(8, np.int8), np.zeros(8, np.float32)
    _run(s, [x, out_i, out_f], X, oi, of)
    np.testing.assert_array_equal(oi, np.clip(np.trunc(X), -128, 127).astype(np.int8))
    np.testing.assert_allclose(of, np.exp(X / 1e8) * np.sqrt(np.abs(X)) + np.tanh(X / 300), rtol=1e-5)


@pytest.mark.parametrize("vectorize", [False, True])
def test_zero_padding_and_select_never_read_outside(vectorize):
    """A padded read (masked vector loads when vectorized) and a select whose unused side
    indexes past the array: both give the right values and touch no other memory."""
    a = placeholder((5, 37), "float32", "a")
    ap = pad(a, (2, 3), (2, 3), "ap")
    out = compute((9, 43), lambda i, j: ap[i, j] + Select(j < 37, a[Min(i, 4), j], Const(0.0, "float32")),
                  name="out")
    s = create_schedule(out)
    s[ap].compute_inline()
    if vectorize:
        s[out].vectorize(s[out].leaf[1])
    A = np.random.default_rng(2).standard_normal((5, 37)).astype(np.float32)
    O = np.zeros((9, 43), np.float32)
    _run(s, [a, out], A, O)
    expect = np.pad(A, ((2, 2), (3, 3)))
    expect[:, :37] += A[np.minimum(np.arange(9), 4)]
    np.testing.assert_allclose(O, expect, rtol=1e-6)


def test_reductions_sum_max_min_with_local_stages():
    x = placeholder((7, 50), "int8", "x")
    k = reduce_axis(50, "k")
    hi = compute((7,), lambda i: reduce_max(x[i, k], [k]), name="hi")
    k2 = reduce_axis(50, "k2")
    lo = compute((7,), lambda i: reduce_min(x[i, k2], [k2]), name="lo")
    k3 = reduce_axis(50, "k3")
    total = compute((7,), lambda i: sum_(x[i, k3].astype("int32"), [k3]), name="total")
    out = compute((7, 3), lambda i, j: Select(j < 1, hi[i].astype("int32"), Select(j < 2, lo[i].astype("int32"),
                                                                                    total[i])), name="out")
    s = create_schedule(out)
    for t in (hi, lo, total):
        s[t].set_scope("local")
        s[t].compute_at(s[out], s[out].leaf[0])
    X = np.random.default_rng(3).integers(-128, 128, (7, 50)).astype(np.int8)
    O = np.zeros((7, 3), np.int32)
    _run(s, [x, out], X, O)
    np.testing.assert_array_equal(O, np.stack([X.max(1), X.min(1), X.astype(np.int32).sum(1)], 1))


def _matmul_schedule(m, k, n, threads_axis=True):
    a = placeholder((m, k), "float32", "a")
    b = placeholder((k, n), "float32", "b")
    r = reduce_axis(k, "r")
    c = compute((m, n), lambda i, j: sum_(a[i, r] * b[r, j], [r]), name="c")
    s = create_schedule(c)
    i, j, rr = s[c].leaf
    jo, ji = s[c].split(j, 16)
    s[c].reorder(i, jo, rr, ji)
    s[c].vectorize(ji)
    if threads_axis:
        s[c].parallel(i)
    return s, a, b, c


def _check_matmul(kernel, m: int, k: int, n: int, seed: int) -> None:
    """Run a float32 (m×k)·(k×n) kernel on random data against numpy."""
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    C = np.zeros((m, n), np.float32)
    kernel(A, B, C)
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_vectorized_loops_are_native_and_correct(threads):
    s, a, b, c = _matmul_schedule(37, 29, 48)
    kernel = build(s, CpuTarget(threads=threads), [a, b, c])
    assert "gf_parallel_for" in kernel.llvm_ir and ".parallel" in kernel.llvm_ir   # outlined body
    assert "<16 x float>" in kernel.llvm_ir and ("zmm" in kernel.assembly or "ymm" in kernel.assembly)
    _check_matmul(kernel, 37, 29, 48, seed=4)


def test_partial_tiles_get_a_constant_extent_branch():
    """A split that does not divide its axis: full tiles run code with constant extents
    (unrolled, vectorized), the last tile the general code; both are right."""
    s, a, b, c = _matmul_schedule(10, 8, 45, threads_axis=False)
    func = run_stages(lower(s, CPU, [a, b, c]), CPU, until="partition_tiles")
    branches = []
    walk(func.body, lambda x: branches.append(x) if isinstance(x, IfThenElse) else None)
    assert branches, "no partition of the partial tile"
    _check_matmul(build(s, CPU, [a, b, c]), 10, 8, 45, seed=5)


def test_unrolled_local_accumulators_live_in_registers():
    """A register tile: the unrolled, vectorized accumulator array is promoted out of memory."""
    a = placeholder((12, 64), "float32", "a")
    b = placeholder((64, 32), "float32", "b")
    r = reduce_axis(64, "r")
    c = compute((12, 32), lambda i, j: sum_(a[i, r] * b[r, j], [r]), name="c")
    s = create_schedule(c)
    cc = s.cache_write(c, "local")
    i, j = s[c].leaf
    io, ii = s[c].split(i, 4)
    s[cc].compute_at(s[c], io)
    ci, cj, cr = s[cc].leaf
    s[cc].reorder(cr, ci, cj)
    s[cc].unroll(ci)
    s[cc].vectorize(cj)
    kernel = build(s, CPU, [a, b, c])
    assert "alloca" not in kernel.llvm_ir            # SROA removed the local array
    assert kernel.assembly.count("vfmadd") >= 4      # one FMA per accumulator row
    _check_matmul(kernel, 12, 64, 32, seed=6)


def test_kernel_arguments_are_checked():
    s, a, b, c = _matmul_schedule(4, 4, 16)
    kernel = build(s, CPU, [a, b, c])
    ok = [np.zeros((4, 4), np.float32), np.zeros((4, 16), np.float32), np.zeros((4, 16), np.float32)]
    with pytest.raises(KernelArgumentError, match="takes 3 arrays"):
        kernel(*ok[:2])
    with pytest.raises(KernelArgumentError, match=r"argument b must be float32\[4, 16\], not float64"):
        kernel(ok[0], ok[1].astype(np.float64), ok[2])
    with pytest.raises(KernelArgumentError, match="C-contiguous"):
        kernel(ok[0], np.zeros((16, 4), np.float32).T, ok[2])


def test_one_expression_scheduled_for_accel_cpu_and_gpu():
    """Scheduling never rewrites the tensor expressions: the accelerator's packed dense,
    scheduled for the accelerator, then for the CPU and the GPU in the same process,
    gives the same results on fsim and on the CPU."""
    from compiler_helpers import device_for
    from gemforge.compiler import GpuTarget
    from gemforge.compiler.ops.accel.dense import dense_schedule, dense_te
    from gemforge.compiler.ops.common import Epilogue
    from gemforge.hw.config import PRESETS
    config = PRESETS["tiny"]
    t = dense_te(config, 3, 2, 4, Epilogue())
    body = repr(t["c"].op.body)
    args = [t["a"], t["w"], t["out"]]
    program = build(dense_schedule(config, t, dict(tm=1, tn=2, tk=2, threads=2)), config, args)
    s = create_schedule(t["out"])
    kernel = build(s, CPU, args)
    s = create_schedule(t["out"])
    s[t["out"]].bind(s[t["out"]].leaf[0], "blockIdx.x")
    s[t["out"]].bind(s[t["out"]].leaf[1], "threadIdx.x")
    gpu = build(s, GpuTarget(), args)
    assert repr(t["c"].op.body) == body and ".entry" in gpu.ptx
    rng = np.random.default_rng(7)
    A = rng.integers(-128, 128, t["a"].shape).astype(np.int8)
    W = rng.integers(-128, 128, t["w"].shape).astype(np.int8)
    on_cpu = np.zeros(t["out"].shape, np.int32)
    kernel(A, W, on_cpu)
    on_fsim, _ = device_for(config).run_program(program, {"a": A, "w": W}, ["out"])
    np.testing.assert_array_equal(on_cpu, on_fsim["out"])
    expect = np.einsum("mkbi,nkoi->mnbo", A.astype(np.int64), W.astype(np.int64)).astype(np.int32)
    np.testing.assert_array_equal(on_cpu, expect)


@pytest.mark.parametrize("vectorize", [False, True])
def test_edge_semantics_never_trap_and_wrap_like_the_ir(vectorize):
    """Division by 0 is 0, INT_MIN // −1 wraps (no SIGFPE); int32 comparisons see wrapped
    sums; shifts clamp their amount in its own width; float max keeps NaN (numpy's rule)."""
    n = 8
    x = placeholder((n,), "int32", "x")
    d = placeholder((n,), "int32", "d")
    s8 = placeholder((n,), "int8", "s8")
    f = placeholder((n,), "float32", "f")
    div = compute((n,), lambda i: FloorDiv(x[i], d[i]), name="div")
    mod = compute((n,), lambda i: FloorMod(x[i], d[i]), name="mod")
    neg = compute((n,), lambda i: Select((x[i] + d[i]) < 0, Const(1), Const(0)), name="neg")
    sh = compute((n,), lambda i: Shr(s8[i], d[i]), name="sh")
    mx = compute((n,), lambda i: Max(f[i], Const(0.0, "float32")), name="mx")
    s = create_schedule([div, mod, neg, sh, mx])
    if vectorize:
        for t in (div, mod, neg, sh, mx):
            s[t].vectorize(s[t].leaf[0])
    X = np.array([7, -7, -2**31, 5, 2**31 - 1, 9, -9, 100], np.int32)
    D = np.array([0, 0, -1, -1, 1, 256, -300, 3], np.int32)
    S8 = np.array([-100, -1, 100, 1, -128, 127, 64, -64], np.int8)
    F = np.array([np.nan, -1.0, 2.0, -np.inf, np.inf, 0.5, -0.0, 3.0], np.float32)
    outs = [np.zeros(n, np.int32) for _ in range(3)] + [np.zeros(n, np.int8), np.zeros(n, np.float32)]
    _run(s, [x, d, s8, f, div, mod, neg, sh, mx], X, D, S8, F, *outs)
    x64, d64 = X.astype(np.int64), D.astype(np.int64)
    safe = np.where((D == 0) | (D == -1), 1, d64)
    want_div = np.where(D == 0, 0, np.where(D == -1, -x64, x64 // safe))
    want_mod = np.where((D == 0) | (D == -1), 0, x64 % safe)
    wrap = lambda v: ((v + 2**31) % 2**32) - 2**31  # noqa: E731
    np.testing.assert_array_equal(outs[0], wrap(want_div))
    np.testing.assert_array_equal(outs[1], want_mod)
    np.testing.assert_array_equal(outs[2], (wrap(x64 + d64) < 0).astype(np.int32))
    amount = d64
    want_sh = np.where(amount >= 0, S8.astype(np.int64) >> np.minimum(amount, 7),
                       np.where(-amount >= 8, 0, S8.astype(np.int64) << np.clip(-amount, 0, 7)))
    np.testing.assert_array_equal(outs[3], want_sh.astype(np.int8))
    np.testing.assert_array_equal(outs[4], np.maximum(F, 0))   # NaN stays NaN


@pytest.mark.parametrize("length", [72, 75, 95, 127, 3000])
def test_float_max_reductions_of_any_length_compile(length):
    """Reductions with float max (softmax's) for lengths LLVM's vectorizer once choked on."""
    x = placeholder((2, length), "float32", "x")
    k = reduce_axis(length, "k")
    m = compute((2,), lambda i: reduce_max(x[i, k], [k]), name="m")
    X = np.random.default_rng(length).standard_normal((2, length)).astype(np.float32)
    M = np.zeros(2, np.float32)
    _run(create_schedule(m), [x, m], X, M)
    np.testing.assert_array_equal(M, X.max(1))


def _jit_func(func, target=CpuTarget()):
    from gemforge.compiler.backends.cpu import jit, make_llvm_ir, optimize
    return jit(optimize(make_llvm_ir(func, target), target), target)


def test_vectorized_read_modify_write_with_shared_elements_equals_serial():
    """B[i // 2] += A[i]: two lanes update one element, so the loop must stay serial."""
    from gemforge.compiler.ir import Add, Buffer, BufferLoad, BufferStore, For, ForKind, PrimFunc
    a_buf, b_buf = Buffer("A", (16,), "int32"), Buffer("B", (8,), "int32")
    i = Var("i", "int32")
    idx = FloorDiv(i, Const(2))
    store = BufferStore(b_buf, (idx,), Add(BufferLoad(b_buf, (idx,)), BufferLoad(a_buf, (i,))))
    a = np.random.default_rng(3).integers(-100, 100, 16, dtype=np.int32)
    for kind in (ForKind.SERIAL, ForKind.VECTORIZED):
        b = np.zeros(8, np.int32)
        _jit_func(PrimFunc("rmw", [a_buf, b_buf], For(i, Const(16), store, kind)))(a, b)
        np.testing.assert_array_equal(b, a.reshape(8, 2).sum(axis=1))


def test_let_binding_ends_with_its_body_before_a_parallel_loop():
    """A parallel loop captures what is in scope; a let of an earlier loop is not."""
    from gemforge.compiler.ir import Buffer, BufferLoad, BufferStore, For, ForKind, LetStmt, PrimFunc, Seq
    a_buf = Buffer("A", (8,), "int32")
    i, j, x = Var("i", "int32"), Var("j", "int32"), Var("x", "int32")
    body = Seq([For(i, Const(8), LetStmt(x, i * 2, BufferStore(a_buf, (i,), x))),
                For(j, Const(8), BufferStore(a_buf, (j,), BufferLoad(a_buf, (j,)) + 1), ForKind.PARALLEL)])
    a = np.zeros(8, np.int32)
    _jit_func(PrimFunc("let_then_parallel", [a_buf], body))(a)
    np.testing.assert_array_equal(a, np.arange(8) * 2 + 1)


@pytest.mark.parametrize("stride", [2, 3, 4, 5])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("room", [False, True])
def test_strided_vector_loads_read_one_span_and_never_outside(stride, padded, room):
    """Lanes a small constant stride apart load as one span and a shuffle (no gather), a
    zero-padded one masked lane by lane; a span that would reach past the array's end is
    masked too. Wider strides gather. Values equal numpy's either way, at both vector widths
    the loop splits into (36 = 32 + 4)."""
    width = 36
    # Without room the last lane reads the last element, so no span fits: masked loads.
    columns = stride * (width - 1) + 1 + (stride if room else 0)
    a = placeholder((3, columns), "float32", "a")
    if padded:   # shifted by one column: the first lane of each row reads the zero padding
        from gemforge.compiler.ir import BufferLoad
        out = compute((3, width), lambda i, j: BufferLoad(a.buffer, (i, j * stride - 1), zero_outside=True) * 2.0,
                      name="out")
    else:
        out = compute((3, width), lambda i, j: a[i, j * stride] * 2.0, name="out")
    s = create_schedule(out)
    s[out].vectorize(s[out].leaf[1])
    A = np.random.default_rng(stride).standard_normal((3, columns)).astype(np.float32)
    O = np.zeros((3, width), np.float32)
    kernel = _run(s, [a, out], A, O)
    if padded:
        expect = np.concatenate([np.zeros((3, 1), np.float32), A], axis=1)[:, ::stride][:, :width] * 2
    else:
        expect = A[:, ::stride][:, :width] * 2
    np.testing.assert_array_equal(O, expect)
    assert ("llvm.masked.gather" in kernel.llvm_ir) == (stride > 4)
    if stride <= 4:
        assert "shufflevector" in kernel.llvm_ir
        assert ("llvm.masked.load" in kernel.llvm_ir) == (padded or not room)


@pytest.mark.parametrize("dst", ["int8", "int16", "int32", "int64"])
@pytest.mark.parametrize("src", ["float32", "float64"])
def test_vectorized_float_to_int_conversion_saturates_without_scalar_code(src, dst):
    """A vectorized float → signed int conversion truncates in range, saturates outside (NaN →
    0), lane by lane as the scalar one does, in vector instructions (x86 turns LLVM's
    saturating intrinsic into a compare and convert per lane)."""
    info = np.iinfo(dst)
    edges = [info.min, info.max, float(info.min) - 1e3, float(info.max) + 1e3, 2.0 ** (info.bits - 1),
             -(2.0 ** (info.bits - 1)), np.nan, np.inf, -np.inf, -0.7, 0.7, 1.5, -1.5, 0.0, 1e30, -1e30]
    rng = np.random.default_rng(info.bits)
    X = np.array(edges + list(rng.uniform(-1.5, 1.5, 48) * float(info.max)), src)
    x = placeholder((X.size,), src, "x")
    out = compute((X.size,), lambda i: Cast(dst, x[i]), name="out")
    s = create_schedule(out)
    s[out].vectorize(s[out].leaf[0])
    got = np.zeros(X.size, dst)
    kernel = _run(s, [x, out], X, got)

    def saturated(v: float) -> int:
        if np.isnan(v):
            return 0
        if v >= 2.0 ** (info.bits - 1):
            return int(info.max)
        if v < -(2.0 ** (info.bits - 1)):
            return int(info.min)
        return int(np.trunc(v))
    np.testing.assert_array_equal(got, np.array([saturated(float(v)) for v in X], dst))
    assert "fptosi.sat" not in kernel.llvm_ir
