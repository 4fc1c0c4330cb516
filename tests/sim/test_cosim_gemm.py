"""The compiled GEMM (dense without epilogue) on the Verilator backend equals numpy (what `run-op gemm --device
verilator` runs), and reports the hardware counters."""

import numpy as np
import pytest

from gemforge.compiler import compile_dense, run_dense
from gemforge.driver.runtime.device import available_backends, open_device
from gemforge.hw.config import PRESETS
from gemforge.sim.cosim import harness


def test_rtl_backends_are_registered():
    assert {"verilator", "icarus"} <= set(available_backends())


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
@pytest.mark.parametrize("name,shape", [("tiny", (5, 9, 7)), ("default", (20, 40, 24)), ("tiny", (16, 48, 32))])
def test_gemm_on_verilator_equals_numpy(name, shape):
    m, k, n = shape
    rng = np.random.default_rng(m * k * n)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    device = open_device("verilator", PRESETS[name], dram_bytes=1 << 22)
    c, result = run_dense(device, a, b)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))
    _, reference = run_dense(open_device("fsim", PRESETS[name]), a, b)
    assert result.cycles and result.hw_counters["gemm_active"] == reference.counters["gemm_uops"] > 0
    # The reduction starts with an overwriting GEMM: no reset micro-ops run.
    assert result.hw_counters["gemm_reset"] == reference.counters["gemm_reset_uops"] == 0
    assert result.hw_counters["dma_bytes_written"] > 0


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
@pytest.mark.parametrize("latency_hiding", [True, False])
@pytest.mark.parametrize("name, x_shape, w_shape, stride, padding, shift, relu", [
    ("tiny", (1, 6, 7, 9), (5, 6, 3, 3), 2, 1, 7, True),
    ("default", (1, 20, 6, 6), (18, 20, 1, 1), 1, 0, None, False),
    ("default", (1, 32, 9, 11), (48, 32, 1, 1), 2, 0, None, False),   # strided input DMA
])
def test_conv2d_on_verilator_equals_numpy(name, x_shape, w_shape, stride, padding, shift, relu, latency_hiding):
    """Compiled conv2d with a fused epilogue, with and without latency hiding, bit-exact on RTL."""
    from gemforge.compiler import conv2d_reference, run_conv2d
    rng = np.random.default_rng(sum(x_shape) + stride)
    x = rng.integers(-128, 128, x_shape, dtype=np.int8)
    w = rng.integers(-128, 128, w_shape, dtype=np.int8)
    bias = rng.integers(-3000, 3000, w_shape[0], dtype=np.int32)
    device = open_device("verilator", PRESETS[name], dram_bytes=1 << 22)
    y, result = run_conv2d(device, x, w, bias, stride=stride, padding=padding, shift=shift, relu=relu,
                           latency_hiding=latency_hiding)
    np.testing.assert_array_equal(y, conv2d_reference(x, w, bias, stride=stride, padding=padding,
                                                      shift=shift, relu=relu))
    _, reference = run_conv2d(open_device("fsim", PRESETS[name]), x, w, bias, stride=stride, padding=padding,
                              shift=shift, relu=relu, latency_hiding=latency_hiding)
    for hw, fsim in (("gemm_active", "gemm_uops"), ("gemm_reset", "gemm_reset_uops"), ("alu_active", "alu_uops")):
        assert result.hw_counters[hw] == reference.counters[fsim]


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
def test_both_thread_orders_on_verilator_equal_numpy():
    """The two virtual-thread orders give the same result on RTL, and the store-bound
    1x1 layer (ResNet-18's conv3 shortcut, int32 outputs) runs faster sequentially,
    the planner's choice for it. (The tiling is cut into four reduction chunks: with
    one chunk per tile the staggered interleaving is already thread by thread.)"""
    from gemforge.compiler import conv2d_reference
    from gemforge.compiler.ops.accel import conv2d as conv
    config = PRESETS["default"]
    xs, ws = (1, 64, 56, 56), (128, 64, 1, 1)
    data, kernel = (1, 4, 56, 56), (8, 4, 1, 1)
    chosen = conv.plan_conv2d(config, data, kernel, 2, 0, threads=2, epilogue=conv.Epilogue())
    assert chosen["order"] == "sequential"
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, xs, dtype=np.int8)
    w = rng.integers(-128, 128, ws, dtype=np.int8)
    device = open_device("verilator", config, dram_bytes=1 << 23)
    cycles = {}
    for order in ("interleaved", "sequential"):
        t = conv.conv2d_te(config, data, kernel, 2, 0, conv.Epilogue())
        program = conv.build(conv.conv2d_schedule(config, t, dict(chosen, tic=1, order=order)), config,
                             [t["x"], t["w"], t["out"]])
        outs, result = device.run_program(
            program, {"x": conv.pack_nchw(config, x), "w": conv.pack_oihw(config, w)}, ["out"])
        np.testing.assert_array_equal(conv.unpack_nchw(outs["out"], 1, 128), conv2d_reference(x, w, None, 2, 0))
        cycles[order] = result.cycles
    assert cycles["sequential"] < 0.9 * cycles["interleaved"]


def _fused_epilogue_case(name):
    """A conv2d and a dense with bias, shift and clip on preset ``name``: the fused epilogue
    (overwriting first GEMM, requantizing STOREs) on RTL equals numpy, and fsim's counters."""
    from gemforge.compiler import conv2d_reference, run_conv2d
    from gemforge.compiler.ops.common import reference_epilogue
    config = PRESETS[name]
    rng = np.random.default_rng(len(name))
    device = open_device("verilator", config, dram_bytes=1 << 22)
    fsim = open_device("fsim", config)
    x = rng.integers(-128, 128, (1, 2 * config.block_in, 6, 5), dtype=np.int8)
    w = rng.integers(-128, 128, (3 * config.block_out, 2 * config.block_in, 3, 3), dtype=np.int8)
    bias = rng.integers(-3000, 3000, w.shape[0], dtype=np.int32)
    for relu in (True, False):
        y, result = run_conv2d(device, x, w, bias, stride=1, padding=1, shift=9, relu=relu)
        np.testing.assert_array_equal(y, conv2d_reference(x, w, bias, stride=1, padding=1, shift=9, relu=relu))
        _, reference = run_conv2d(fsim, x, w, bias, stride=1, padding=1, shift=9, relu=relu)
        assert result.hw_counters["gemm_reset"] == reference.counters["gemm_reset_uops"] == 0
        assert result.hw_counters["alu_active"] == reference.counters["alu_uops"]   # the bias addition only
        assert result.hw_counters["dma_bytes_written"] == y.size   # int8 stored once
    m, k, n = 3 * config.batch, 3 * config.block_in, 2 * config.block_out
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    op = compile_dense(config, m, k, n, bias=True, shift=6, relu=False)
    dense_bias = rng.integers(-500, 500, n, dtype=np.int32)
    got, _ = op.run(device, a=a, b=b, bias=dense_bias)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(got, reference_epilogue(acc, dense_bias, 6, False, channel_axis=1))


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
@pytest.mark.parametrize("name", ["tiny", "default", "ulx3s"])
def test_fused_int8_epilogue_on_verilator_equals_numpy(name):
    _fused_epilogue_case(name)


@pytest.mark.slow
@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
def test_fused_int8_epilogue_on_verilator_equals_numpy_large():
    _fused_epilogue_case("large")
