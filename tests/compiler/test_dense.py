"""dense on fsim against numpy: random shapes, every preset, epilogues, latency hiding on and off."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from compiler_helpers import CONFIGS, CRAMPED, device_for, int8
from gemforge.compiler.backends.accel.layout import pack_bias, pack_matrix_a, pack_matrix_b, unpack_matrix
from gemforge.compiler.ops import OpError, compile_dense, dense_reference, run_dense
from gemforge.compiler.ops.common import Epilogue
from gemforge.compiler.ops.accel.dense import dense_schedule, dense_te
from gemforge.compiler.pipeline import build
from gemforge.hw.config import PRESETS

@pytest.fixture
def rng():
    return np.random.default_rng(1234)


EPILOGUES = [(False, None, False), (True, None, False), (True, 6, True), (False, 0, False), (True, 9, False),
             (False, None, True)]


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=lambda c: c.name)
@pytest.mark.parametrize("latency_hiding", [True, False], ids=["lh", "no-lh"])
@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 40), epilogue=st.sampled_from(EPILOGUES),
       seed=st.integers(0, 2**32 - 1))
def test_dense_equals_numpy(config, latency_hiding, m, k, n, epilogue, seed):
    rng = np.random.default_rng(seed)
    bias_on, shift, relu = epilogue
    a, b = int8(rng, (m, k)), int8(rng, (k, n))
    bias = rng.integers(-(1 << 20), 1 << 20, n, dtype=np.int32) if bias_on else None
    out, result = run_dense(device_for(config), a, b, bias, shift=shift, relu=relu, latency_hiding=latency_hiding)
    expect = dense_reference(a, b, bias, shift, relu)
    assert out.dtype == expect.dtype
    np.testing.assert_array_equal(out, expect)
    tiles = -(-m // config.batch) * -(-k // config.block_in) * -(-n // config.block_out)
    assert result.counters["macs"] == tiles * config.macs_per_uop  # no redundant work


def test_extreme_values():
    """All −128 over a long K, int32 out: the largest magnitudes, exact."""
    a = np.full((3, 1024), -128, np.int8)
    b = np.full((1024, 5), -128, np.int8)
    out, _ = run_dense(device_for(PRESETS["default"]), a, b)
    assert (out == 1024 * 128 * 128).all()


def test_shift_rounds_toward_minus_infinity_and_saturates():
    a = np.array([[1, -1, 100, -100]], np.int8).T  # (4, 1)
    b = np.array([[3]], np.int8)                   # (1, 1)
    out, _ = run_dense(device_for(PRESETS["tiny"]), a, b, np.array([0], np.int32), shift=1)
    np.testing.assert_array_equal(out[:, 0], [1, -2, 127, -128])


@pytest.mark.parametrize("tm,tn,tk,threads", list(itertools.product([2, 3, 7], [2, 5], [2, 3], [1, 2])))
def test_hand_schedules_with_partial_tiles(rng, tm, tn, tk, threads):
    """Tile sizes that do not divide the shape: partial last tiles on every axis."""
    c = PRESETS["tiny"]
    m, k, n = 7, 20, 20
    epi = Epilogue(True, 5, False)
    t = dense_te(c, 7, 5, 5, epi)
    program = build(dense_schedule(c, t, dict(tm=tm, tn=tn, tk=tk, threads=threads)), c,
                    [t["a"], t["w"], t["bias"], t["out"]])
    a, b = int8(rng, (m, k)), int8(rng, (k, n))
    bias = rng.integers(-999, 999, n, dtype=np.int32)
    outs, _ = device_for(c).run_program(
        program, {"a": pack_matrix_a(c, a), "w": pack_matrix_b(c, b), "bias": pack_bias(c, bias)}, ["out"])
    np.testing.assert_array_equal(unpack_matrix(outs["out"], m, n), dense_reference(a, b, bias, 5, False))


def test_compiled_op_is_reusable_and_serializable(rng):
    from gemforge.hw.program import Program
    c = PRESETS["tiny"]
    op = compile_dense(c, 9, 13, 6, bias=True, shift=4, relu=True)
    program = Program.from_bytes(op.program.to_bytes())
    for _ in range(2):
        a, b = int8(rng, (9, 13)), int8(rng, (13, 6))
        bias = rng.integers(-300, 300, 6, dtype=np.int32)
        outs, _ = device_for(c).run_program(program, op.pack_inputs(a=a, b=b, bias=bias), [op.output])
        np.testing.assert_array_equal(op.unpack_output(outs[op.output]), dense_reference(a, b, bias, 4, True))


def test_uop_cache_reloads_when_kernels_do_not_fit(rng):
    op = compile_dense(CRAMPED, 24, 40, 24)
    assert len(op.program.uops) > CRAMPED.uop_depth  # kernels are reloaded on demand
    a, b = int8(rng, (24, 40)), int8(rng, (40, 24))
    out, _ = op.run(device_for(CRAMPED), a=a, b=b)
    np.testing.assert_array_equal(out, dense_reference(a, b))


def test_bad_arguments_are_refused():
    dev = device_for(PRESETS["tiny"])
    with pytest.raises(OpError, match=r"A \(M, K\) and B \(K, N\)"):
        run_dense(dev, np.zeros((2, 3), np.int8), np.zeros((4, 2), np.int8))
    with pytest.raises(OpError, match="must be int8"):
        run_dense(dev, np.zeros((2, 3), np.int16), np.zeros((3, 2), np.int8))
    with pytest.raises(OpError, match="shift must be an integer between 0 and 31"):
        compile_dense(PRESETS["tiny"], 2, 2, 2, shift=-1)
    with pytest.raises(OpError, match="dimension K must be a positive integer"):
        compile_dense(PRESETS["tiny"], 2, 0, 2)
    op = compile_dense(PRESETS["tiny"], 2, 3, 4, bias=True)
    with pytest.raises(OpError, match=r"bias of shape \(4,\)"):
        op.pack_inputs(a=np.zeros((2, 3), np.int8), b=np.zeros((3, 4), np.int8))


@pytest.mark.slow
@pytest.mark.parametrize("config", list(PRESETS.values()), ids=lambda c: c.name)
def test_dense_large_shapes(config, rng):
    m, k, n = 200, 700, 300
    a, b = int8(rng, (m, k)), int8(rng, (k, n))
    bias = rng.integers(-(1 << 16), 1 << 16, n, dtype=np.int32)
    for lh in (True, False):
        out, _ = run_dense(device_for(config), a, b, bias, shift=8, relu=True, latency_hiding=lh)
        np.testing.assert_array_equal(out, dense_reference(a, b, bias, 8, True))


def test_dimensions_beyond_one_dma_row_are_refused_in_user_terms():
    from gemforge.compiler.ops.accel import compile_dense as compile_accel_dense
    from gemforge.compiler.ops.common import OpError
    from gemforge.hw.config import PRESETS
    tiny = PRESETS["tiny"]
    with pytest.raises(OpError, match=r"K = 262144 .* rows of at most 65535 \(K and N up to 262140"):
        compile_accel_dense(tiny, 1, 65536 * tiny.block_in, 4)
    with pytest.raises(OpError, match=r"N = 262144"):
        compile_accel_dense(tiny, 1, 4, 65536 * tiny.block_out)


def test_compiled_op_refuses_operands_its_buffers_cannot_hold():
    """`CompiledOp.run` packs operands into the buffers' integer types: floats were truncated
    (1.9 → 1), uint8 200 wrapped to -56 and a bias beyond a 16-bit accumulator wrapped, all
    silently. Each is refused now; in-range integers of any type still run exactly."""
    tiny = PRESETS["tiny"]
    device = device_for(tiny)
    op = compile_dense(tiny, 2, 4, 4, bias=True)
    b, bias = np.ones((4, 4), np.int8), np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="a tensor of float32 where this config's buffer holds int8 integers"):
        op.run(device, a=np.full((2, 4), 1.9, np.float32), b=b, bias=bias)
    with pytest.raises(ValueError, match=r"uint8 holds values beyond int8 \(-128\.\.127\)"):
        op.run(device, a=np.full((2, 4), 200, np.uint8), b=b, bias=bias)
    a = np.arange(8, dtype=np.uint8).reshape(2, 4)          # uint8 within int8's range
    out, _ = op.run(device, a=a, b=b, bias=bias)
    np.testing.assert_array_equal(out, a.astype(np.int32) @ b.astype(np.int32))
    acc16 = tiny.replace(name="acc16", acc_width=16, acc_buffer_bytes=2048)
    op16 = compile_dense(acc16, 1, 4, 4, bias=True)
    with pytest.raises(ValueError, match=r"int32 holds values beyond int16"):
        op16.run(device_for(acc16), a=np.zeros((1, 4), np.int8), b=b, bias=np.full(4, 40000, np.int32))
    with pytest.raises(ValueError, match="a tensor of float64 where"):
        pack_bias(tiny, np.full(4, 2.5))


def test_untileable_dense_names_the_buffer_too_small():
    tiny = PRESETS["tiny"]
    one = tiny.replace(name="acc1", acc_buffer_bytes=tiny.acc_entry_bytes, out_buffer_bytes=tiny.out_entry_bytes)
    with pytest.raises(OpError, match=r"the accumulator buffer holds 1 entries and needs 2"):
        compile_dense(one, 4, 4, 4, bias=True)
