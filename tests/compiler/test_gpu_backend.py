"""The GPU back end: kernels, barriers, thread binding, PTX checked by ptxas, and — where a
GPU is present — results on the GPU.

Without a GPU, two checks still cover the kernels: ptxas assembles every
kernel's PTX for sm_80 and sm_90, and each GPU schedule's loop IR is run on
the CPU with its thread loops serial and its shared buffers local (the
sequential meaning of the schedule), against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import max_pool_ignoring_nan, with_nan_and_inf
from gemforge.compiler import CpuTarget, GpuTarget
from gemforge.compiler.backends import stages
from gemforge.compiler.backends.gpu import cuda, ptxas_path
from gemforge.compiler.ir import Allocate, Buffer, For, ForKind, StmtMutator, replace_buffers, walk
from gemforge.compiler.ops import (
    compile_conv2d, compile_dense, compile_elementwise, compile_pool2d, conv2d_reference, dense_reference,
    elementwise_reference, max_pool2d_reference, avg_pool2d_reference,
)
from gemforge.compiler.pipeline import run_stages, tracing

HAVE_PTXAS = ptxas_path() is not None
HAVE_GPU = cuda.available()
NO_GPU = "no GPU here (no CUDA driver or device): GPU kernels are compiled and checked by ptxas, not run"


def _data(rng, shape, dtype):
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(-128, 128, shape).astype(np.int8)


def _cases():
    """(name, compile(target), inputs(rng), reference(inputs), exact)."""
    def dense(dtype):
        epi = {"shift": 6, "relu": True} if dtype == "int8" else {"relu": True}

        def inputs(rng):
            bias = (rng.integers(-999, 999, 70).astype(np.int32) if dtype == "int8"
                    else rng.standard_normal(70).astype(np.float32))
            return {"a": _data(rng, (100, 90), dtype), "b": _data(rng, (90, 70), dtype), "bias": bias}
        return (f"dense-{dtype}", lambda t: compile_dense(t, 100, 90, 70, dtype=dtype, bias=True, **epi), inputs,
                lambda i: dense_reference(i["a"], i["b"], i["bias"], **epi), dtype == "int8")

    def conv(dtype, shape, weight, stride, padding, groups):
        epi = {"shift": 5} if dtype == "int8" else {}

        def inputs(rng):
            return {"x": _data(rng, shape, dtype), "w": _data(rng, weight, dtype)}
        return (f"conv2d-{dtype}-{shape[1]}x{weight[0]}-k{weight[2]}s{stride}g{groups}",
                lambda t: compile_conv2d(t, shape, weight, stride=stride, padding=padding, groups=groups,
                                         dtype=dtype, **epi),
                inputs, lambda i: conv2d_reference(i["x"], i["w"], None, stride, padding, groups=groups, **epi),
                dtype == "int8")

    def elementwise(dtype):
        def inputs(rng):
            return {"x": _data(rng, (2, 3, 9, 9), dtype), "y": _data(rng, (3, 1, 9), dtype)}
        epi = {"shift": 1} if dtype == "int8" else {}
        return (f"add-{dtype}", lambda t: compile_elementwise(t, "add", (2, 3, 9, 9), dtype=dtype, y_shape=(3, 1, 9),
                                                               **epi),
                inputs, lambda i: elementwise_reference("add", i["x"], np.broadcast_to(i["y"], i["x"].shape), **epi),
                dtype == "int8")

    def pool(kind, dtype):
        ref = max_pool2d_reference if kind == "max" else avg_pool2d_reference
        return (f"{kind}-pool-{dtype}", lambda t: compile_pool2d(t, kind, (1, 4, 9, 9), 3, stride=2, padding=1,
                                                                  dtype=dtype),
                lambda rng: {"x": _data(rng, (1, 4, 9, 9), dtype)}, lambda i: ref(i["x"], 3, 2, 1), dtype == "int8")

    def pool_windows(kind, dtype):
        # Uneven padding, a partial last window (ceil mode) and dilated taps.
        window = dict(stride=(2, 1), padding=(1, 0, 0, 2), dilation=(1, 2), ceil_mode=True)
        ref = max_pool2d_reference if kind == "max" else avg_pool2d_reference
        return (f"{kind}-pool-windows-{dtype}",
                lambda t: compile_pool2d(t, kind, (1, 4, 9, 8), (2, 3), dtype=dtype, **window),
                lambda rng: {"x": _data(rng, (1, 4, 9, 8), dtype)}, lambda i: ref(i["x"], (2, 3), **window),
                dtype == "int8")

    def max_pool_with_nan():
        # NaN never wins a window (PTX max.f32, not max.NaN.f32); ±inf are ordinary values.
        return ("max-pool-float32-nan", lambda t: compile_pool2d(t, "max", (1, 4, 9, 9), 3, stride=2, padding=1,
                                                                   dtype="float32"),
                lambda rng: {"x": with_nan_and_inf(rng, (1, 4, 9, 9))},
                lambda i: max_pool_ignoring_nan(i["x"], 3, 2, 1), True)

    return [dense("float32"), dense("int8"),
            conv("float32", (2, 8, 11, 10), (12, 8, 3, 3), 1, 1, 1), conv("int8", (1, 6, 9, 9), (10, 6, 3, 3), 2, 1, 1),
            conv("float32", (1, 8, 10, 10), (8, 1, 3, 3), 1, 1, 8), conv("int8", (1, 6, 8, 8), (6, 2, 3, 3), 1, 1, 3),
            elementwise("float32"), elementwise("int8"), pool("max", "float32"), pool("avg", "int8"),
            pool_windows("max", "float32"), pool_windows("avg", "int8"), max_pool_with_nan()]


CASES = _cases()
IDS = [c[0] for c in CASES]


def _check(got, want, exact):
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_stages_are_one_ordered_list():
    assert list(stages(GpuTarget())) == ["split_kernels", "insert_barriers", "bind_threads", "make_llvm_ir",
                                         "emit_ptx", "check_ptx", "load"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_kernel_assembles_with_ptxas(case, arch):
    if not HAVE_PTXAS:
        pytest.skip("ptxas is not on PATH: the PTX is generated but not assembled")
    _, make, _, _, _ = case
    kernel = make(GpuTarget(arch)).program
    assert f".target {arch}" in kernel.ptx and ".entry" in kernel.ptx
    assert kernel.cubin is not None and kernel.cubin[:4] == b"\x7fELF"


def test_tiled_products_stage_operands_in_shared_memory_with_barriers():
    kernel = compile_dense(GpuTarget(), 128, 64, 128, dtype="float32").program
    assert "bar.sync" in kernel.ptx and ".shared" in kernel.ptx
    (k,) = kernel.program.kernels
    assert k.block == (16, 16, 1) and k.grid == (2, 2, 1)
    assert "registers" in kernel.ptxas_log or not HAVE_PTXAS


def test_trace_shows_every_gpu_stage():
    seen = []
    with tracing(seen.append):
        compile_dense(GpuTarget(), 16, 16, 16, dtype="float32")
    assert [t.splitlines()[0] for t in seen] == ["== lower"] + [f"== {s}" for s in stages(GpuTarget())]


def _serial_on_cpu(func):
    """A GPU function run on the CPU: thread loops serial, shared buffers local."""
    class Serial(StmtMutator):
        def visit_For(self, s: For):
            kind = ForKind.SERIAL if s.kind is ForKind.THREAD_BINDING else s.kind
            return For(s.var, s.extent, self.visit(s.body), kind, None)
    shared: dict[Buffer, Buffer] = {}

    def visit(s) -> None:
        if isinstance(s, Allocate) and s.buffer.scope == "shared":
            shared[s.buffer] = Buffer(s.buffer.name, s.buffer.shape, s.buffer.dtype, "local")
    walk(func.body, visit)
    body = replace_buffers(Serial().visit(func.body), shared)
    return run_stages(func.with_body(body), CpuTarget())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gpu_schedules_compute_the_operator(case):
    """The GPU schedule's loop IR, run sequentially on the CPU, equals numpy: bounds,
    padding and the shared-memory staging of the schedule are right."""
    name, make, inputs, reference, exact = case
    op = make(GpuTarget())
    kernel = _serial_on_cpu(op.program.program.source)
    host = inputs(np.random.default_rng(11))
    packed = op.pack_inputs(**host)
    arrays = [packed[b.name] if b.name in packed else np.zeros(b.shape, b.dtype) for b in kernel.params]
    kernel(*arrays)
    _check(op.unpack_output(arrays[-1]), reference(host), exact)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_the_large_tile_computes_the_product(dtype):
    """The 128×128 tile (8×8 outputs per thread) large products get, run sequentially."""
    from gemforge.compiler.ops import gpu as gpu_schedules
    from gemforge.compiler.ops.common import Epilogue
    from gemforge.compiler.pipeline import lower
    t, s, plan = gpu_schedules.dense(130, 20, 140, dtype, Epilogue(), tile=gpu_schedules.LARGE_TILE)
    assert plan["tile"] == [128, 128, 8, 8, 8]
    kernel = _serial_on_cpu(lower(s, GpuTarget(), [t["a"], t["w"], t["out"]]))
    rng = np.random.default_rng(13)
    a, b = _data(rng, (130, 20), dtype), _data(rng, (20, 140), dtype)
    out = np.zeros(t["out"].shape, t["out"].dtype)
    kernel(a, b, out)
    _check(out[:130, :140], dense_reference(a, b), dtype == "int8")


@pytest.mark.skipif(not HAVE_GPU, reason=NO_GPU)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_on_the_gpu(case):
    from gemforge.driver.runtime.device import open_device
    name, make, inputs, reference, exact = case
    device = open_device("gpu")
    op = make(device.target)
    host = inputs(np.random.default_rng(12))
    out, result = op.run(device, **host)
    _check(out, reference(host), exact)
    assert result.seconds is not None


def test_barriers_sit_outside_thread_guards():
    """Barriers go between a shared stage's writes and reads and at the top of the
    reduction loop, never in a thread-bound loop's body; a guarded (partial) thread loop
    around a barrier is refused rather than left to deadlock."""
    from gemforge.compiler import build, create_schedule
    from gemforge.compiler.backends.gpu import GpuCompileError
    from gemforge.compiler.ir import Evaluate, IfThenElse
    from gemforge.compiler.te import compute, placeholder, reduce_axis, sum_
    kernel = compile_dense(GpuTarget(), 128, 64, 128, dtype="float32").program
    (k,) = kernel.program.kernels

    def barriers(stmt):
        found = []
        walk(stmt, lambda s: found.append(s) if isinstance(s, Evaluate) else None)
        return found
    guards = []
    walk(k.func.body, lambda s: guards.append(s) if isinstance(s, IfThenElse) else None)
    assert all(not barriers(g) for g in guards)
    assert len(barriers(k.func.body)) == 2   # before the chunk's copies, and between copies and use

    def partial_tile():
        a = placeholder((20, 20), "float32", "a")
        b = placeholder((20, 20), "float32", "b")
        r = reduce_axis(20, "r")
        c = compute((20, 20), lambda i, j: sum_(a[i, r] * b[r, j], [r]), name="c")
        s = create_schedule(c)
        cl = s.cache_write(c, "local")
        i, j = s[c].leaf
        io, ii = s[c].split(i, 16)
        s[c].bind(io, "blockIdx.x")
        s[c].bind(ii, "threadIdx.x")
        s[cl].compute_at(s[c], ii)
        sh = s.cache_read(a, "shared", [cl])
        s[sh].compute_at(s[cl], s[cl].leaf[2])
        return build(s, GpuTarget(), [a, b, c])
    with pytest.raises(GpuCompileError, match="around a barrier"):
        partial_tile()
