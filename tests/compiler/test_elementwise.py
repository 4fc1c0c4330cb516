"""Element-wise add/relu/clip and max pooling on the tensor ALU, and the int8 add widened on the
GEMM core, against numpy."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from compiler_helpers import CONFIGS, device_for
from gemforge.compiler.ops import (
    OpError, avg_pool2d_reference, compile_add, compile_clip, compile_max_pool2d, compile_pool2d, compile_relu,
    max_pool2d_reference,
)
from gemforge.compiler.graph.numeric import int8_clipped, rounding_shift
from gemforge.compiler.ops.accel.widened import (
    MAX_OPERAND_SHIFT, compile_int8_depthwise_conv2d, compile_int8_pool2d, compile_scaled_add, division_by_multiply,
)
from gemforge.compiler.ops.accel import compile_conv2d
from gemforge.compiler.ops.host import compile_conv2d as compile_host_conv2d
from gemforge.compiler.target import target_of
from gemforge.compiler.ops.reference import conv2d_sums
from gemforge.compiler.ops.common import reference_epilogue
from gemforge.driver.runtime.device import open_device
from gemforge.hw.isa import Load, MemType

SHAPES = [(1, 3, 5, 7), (2, 20, 9, 9), (1, 17, 1, 1)]
CPU = open_device("cpu")


def int32(rng, shape, bits=20):
    return rng.integers(-(1 << bits), 1 << bits, shape, dtype=np.int32)


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=lambda c: c.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("latency_hiding", [True, False], ids=["lh", "no-lh"])
def test_add_relu_clip(config, shape, latency_hiding):
    rng = np.random.default_rng(7)
    dev = device_for(config)
    x, y = int32(rng, shape), int32(rng, shape)
    for shift, relu in [(None, False), (8, True), (None, True), (12, False)]:
        out, _ = compile_add(config, shape, shift=shift, relu=relu, latency_hiding=latency_hiding).run(dev, x=x, y=y)
        expect = reference_epilogue(x.astype(np.int64) + y, None, shift, relu, 1)
        assert out.dtype == expect.dtype
        np.testing.assert_array_equal(out, expect)
    out, _ = compile_relu(config, shape, latency_hiding=latency_hiding).run(dev, x=x)
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    out, _ = compile_clip(config, shape, -1000, 3000, latency_hiding=latency_hiding).run(dev, x=x)
    np.testing.assert_array_equal(out, np.clip(x, -1000, 3000))


def test_add_wraps_like_the_accumulator():
    config = CONFIGS["tiny"]
    x = np.full((1, 4, 2, 2), 2**31 - 1, np.int32)
    out, _ = compile_add(config, x.shape).run(device_for(config), x=x, y=np.ones_like(x))
    assert (out == -2**31).all()


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=lambda c: c.name)
@pytest.mark.parametrize("kernel,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1), (1, 1, 0), (3, 3, 0)])
@pytest.mark.parametrize("latency_hiding", [True, False], ids=["lh", "no-lh"])
def test_max_pool2d(config, kernel, stride, padding, latency_hiding):
    rng = np.random.default_rng(8)
    shape = (2, 6, 9, 8)
    x = int32(rng, shape)
    if padding:
        x = np.abs(x)  # zero padding is exact for non-negative (post-ReLU) inputs
    op = compile_max_pool2d(config, shape, kernel, stride=stride, padding=padding, latency_hiding=latency_hiding)
    out, _ = op.run(device_for(config), x=x)
    np.testing.assert_array_equal(out, max_pool2d_reference(x, kernel, stride, padding, zero_padding=True))


def test_bad_arguments_are_refused():
    c = CONFIGS["tiny"]
    with pytest.raises(OpError, match="immediate.s range -32768..32767"):
        compile_clip(c, (1, 1, 1, 1), -(1 << 20), 5)
    with pytest.raises(OpError, match="exceeds the upper bound"):
        compile_clip(c, (1, 1, 1, 1), 5, 4)
    with pytest.raises(OpError, match="positive NCHW shape"):
        compile_relu(c, (1, 0, 2, 2))
    with pytest.raises(OpError, match="padding must be below the kernel"):
        compile_max_pool2d(c, (1, 4, 8, 8), 2, padding=2)
    with pytest.raises(OpError, match="was compiled for shape"):
        compile_relu(c, (1, 4, 2, 2)).pack_inputs(x=np.zeros((1, 4, 2, 3), np.int32))


# ---------------------------------------------------------------- int8 add and subtraction on the GEMM core

#: The configs whose core blocks are square (the int8 add's identity weights need them), with a
#: batched one: the identity maps each image's lanes alike.
SQUARE_CONFIGS = [c for c in CONFIGS.values() if c.block_in == c.block_out] + [
    dataclasses.replace(CONFIGS["batched"], name="batched-square", block_out=4)]


@pytest.mark.parametrize("config", SQUARE_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("latency_hiding", [True, False], ids=["lh", "no-lh"])
def test_int8_add_and_sub_widened_on_the_gemm_core_equal_the_graph_definition(config, latency_hiding):
    """``clip(((x << lx) ± (y << ly) + round) >> s, lo, 127)``, bit for bit as the int8 graph
    defines it (`rounding_shift`, `int8_clipped`), for random shapes, operand shifts, shifts,
    ReLU and either sign, on every config with square core blocks."""
    rng = np.random.default_rng([zlib.crc32(config.name.encode()), latency_hiding])
    dev = open_device("fsim", config, dram_bytes=1 << 22) if config.name == "batched-square" else device_for(config)
    for _ in range(3):
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 40)), int(rng.integers(1, 9)), int(rng.integers(1, 9)))
        lshift = tuple(int(v) for v in rng.integers(0, MAX_OPERAND_SHIFT + 1, 2))
        shift, relu, negate = int(rng.integers(0, 10)), bool(rng.integers(2)), bool(rng.integers(2))
        x, y = (rng.integers(-128, 128, shape, dtype=np.int8) for _ in range(2))
        op = compile_scaled_add(config, shape, lshift=lshift, shift=shift, relu=relu, negate_y=negate,
                                latency_hiding=latency_hiding)
        out, _ = op.run(dev, x=x, y=y)
        sign = -1 if negate else 1
        value = (x.astype(np.int64) << lshift[0]) + sign * (y.astype(np.int64) << lshift[1])
        np.testing.assert_array_equal(out, int8_clipped(rounding_shift(value, shift), 0 if relu else -128))


def test_int8_add_operands_are_two_regions_one_after_the_other():
    """A network binds each operand where its producer wrote it: no transfer may span both."""
    config = CONFIGS["default"]
    program = compile_scaled_add(config, (1, 64, 14, 14), shift=1).program
    x, y = program.tensors["x"], program.tensors["y"]
    assert y.offset == x.offset + x.nbytes and x.shape == y.shape == (1, 4, 14, 14, 1, 16)
    for insn in program.instructions:
        if isinstance(insn, Load) and insn.mem == MemType.INP:
            start, end = program.dram_span(insn)
            assert end <= y.offset or start >= y.offset, insn


@pytest.mark.parametrize("config, kwargs, message", [
    ("default", {"lshift": (7, 0)}, "shifts its operands left by 0 to 6 bits"),
    ("default", {"shift": 40}, "shift must be an integer between 0 and 31"),
    ("cramped", {"shape": (1, 4, 3)}, "takes a positive NCHW shape"),
])
def test_int8_add_refuses_what_it_cannot_compute(config, kwargs, message):
    kwargs = {"shape": (1, 4, 3, 3), **kwargs}
    with pytest.raises(OpError, match=message):
        compile_scaled_add(CONFIGS[config], kwargs.pop("shape"), **kwargs)


def test_int8_add_needs_square_core_blocks():
    with pytest.raises(OpError, match="needs block_in = block_out; config 'batched' has 4 and 8"):
        compile_scaled_add(CONFIGS["batched"], (1, 4, 3, 3))


# ---------------------------------------------------------------- int8 pools on the GEMM core

@pytest.mark.parametrize("config", SQUARE_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_int8_pools_widened_on_the_gemm_core_equal_the_reference(config, kind):
    """Random shapes, windows, strides, dilations and padding: max pools of non-negative inputs
    (zero padding) and of any input unpadded, average pools with count_include_pad, all bit for
    bit the reference's (the average rounded half up, `avg_pool2d_reference`)."""
    rng = np.random.default_rng([zlib.crc32(config.name.encode()), kind == "max"])
    dev = open_device("fsim", config, dram_bytes=1 << 22) if config.name == "batched-square" else device_for(config)
    for case in range(4):
        kernel = tuple(int(v) for v in rng.integers(1, 4, 2))
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        dilation = (1, 1) if case < 3 else tuple(int(v) for v in rng.integers(1, 3, 2))
        # Padded windows (cases 0 and 2) keep an input element each: pads below the kernel.
        pads = (0, 0, 0, 0) if case % 2 else tuple(int(rng.integers(0, min(k, 2))) for k in kernel + kernel)
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 24)), int(rng.integers(6, 11)), int(rng.integers(6, 11)))
        nonnegative = any(pads) or bool(rng.integers(2))
        x = rng.integers(0 if nonnegative and kind == "max" else -128, 128, shape, dtype=np.int8)
        lshift = int(rng.integers(0, 4)) if kind == "avg" else 0
        op = compile_int8_pool2d(config, shape, kind, kernel, stride=stride, padding=pads, dilation=dilation,
                                 count_include_pad=True, nonnegative=nonnegative, lshift=lshift)
        out, _ = op.run(dev, x=x)
        if kind == "max":
            expect = max_pool2d_reference(x, kernel, stride, pads, dilation=dilation)
        else:       # an output lshift bits finer: the mean of the shifted input, saturated
            expect = int8_clipped(avg_pool2d_reference(x.astype(np.int64) << lshift, kernel, stride, pads,
                                                       dilation=dilation, count_include_pad=True))
        np.testing.assert_array_equal(out, expect)
        if kind == "avg":       # the CPU back end's kernel of the same definition
            cpu = compile_pool2d("cpu", "avg", shape, kernel, stride=stride, padding=pads, dilation=dilation,
                                 count_include_pad=True, lshift=lshift)
            np.testing.assert_array_equal(cpu.run(CPU, x=x)[0], expect)


@pytest.mark.parametrize("shape, kernel", [((1, 64, 7, 7), (7, 7)), ((1, 40, 10, 10), (10, 10)),
                                           ((1, 16, 8, 8), (8, 8))])
def test_int8_global_average_pool_divides_exactly(shape, kernel):
    """A network's global pool: 49 and 100 taps by a multiply and shift, 64 by a shift alone,
    at the extremes of the int8 range too (every sum, by `division_by_multiply`'s check)."""
    config = CONFIGS["default"]
    rng = np.random.default_rng(3)
    op = compile_int8_pool2d(config, shape, "avg", kernel)
    for x in (rng.integers(-128, 128, shape, dtype=np.int8), np.full(shape, -128, np.int8),
              np.full(shape, 127, np.int8)):
        out, _ = op.run(device_for(config), x=x)
        np.testing.assert_array_equal(out, avg_pool2d_reference(x, kernel, kernel, 0))
    assert (op.plan.get("multiplier"), op.plan.get("shift")) == division_by_multiply(kernel[0] * kernel[1], 32767)


def test_division_by_multiply_is_exact_or_refused():
    """Every window up to 92 taps (9×9) divides exactly; some larger ones (93, 13×13 = 169,
    14×14 = 196) need a multiplier beyond the ALU's 16-bit immediate and stay on the CPU."""
    for count in range(1, 200):
        found = division_by_multiply(count, 32767)
        if found is None:
            assert count >= 93
            continue
        m, t = found
        n = np.arange(count // 2, 256 * count, dtype=np.int64)
        assert np.array_equal((n * m) >> t, n // count) and m <= 32767 and n[-1] * m < 2 ** 31
    assert division_by_multiply(49, 32767) == (2675, 17) and division_by_multiply(64, 32767) == (1, 6)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "max", "padding": (1, 1, 1, 1)}, "a padded max pool of inputs that may be negative"),
    ({"kind": "avg", "padding": (1, 1, 1, 1)}, "without count_include_pad divides its border windows"),
    ({"kind": "avg", "kernel": (13, 13), "shape": (1, 4, 13, 13)}, "an average over 169 taps has no exact multiply"),
    ({"kind": "max", "kernel": (5, 5), "shape": (1, 4, 3, 3)}, "a 5x5 window does not fit the 3x3 input"),
    ({"kind": "max", "kernel": (1, 1), "padding": (1, 0, 0, 0), "nonnegative": True},
     "a window of the max pool lies wholly in the padding"),
    ({"kind": "sum"}, "pooling is max or avg"),
])
def test_int8_pools_refuse_what_they_cannot_compute_exactly(kwargs, message):
    kwargs = {"shape": (1, 4, 6, 6), "kernel": (3, 3), **kwargs}
    with pytest.raises(OpError, match=message):
        compile_int8_pool2d(CONFIGS["default"], kwargs.pop("shape"), kwargs.pop("kind"), kwargs.pop("kernel"), **kwargs)


# ---------------------------------------------------------------- int8 depthwise convolutions on the GEMM core

@pytest.mark.parametrize("config", SQUARE_CONFIGS, ids=lambda c: c.name)
def test_int8_depthwise_conv2d_with_diagonal_weights_equals_the_reference(config):
    """Random channels, kernels, strides, dilations, padding, shifts and ReLU: bit for bit the
    int8 convolution of one group per channel (`conv2d_reference` with groups, requantized)."""
    rng = np.random.default_rng([zlib.crc32(config.name.encode()), 7])
    dev = open_device("fsim", config, dram_bytes=1 << 22) if config.name == "batched-square" else device_for(config)
    for case in range(3):
        kernel = tuple(int(v) for v in rng.integers(1, 4, 2))
        stride = (int(rng.integers(1, 3)),) * 2
        dilation = (1, 1) if case < 2 else (2, 1)
        pads = tuple(int(rng.integers(0, min(k, 2))) for k in kernel + kernel)
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 40)), int(rng.integers(5, 10)), int(rng.integers(5, 10)))
        shift, relu = int(rng.integers(0, 9)), bool(rng.integers(2))
        x = rng.integers(-128, 128, shape, dtype=np.int8)
        w = rng.integers(-128, 128, (shape[1], 1, *kernel), dtype=np.int8)
        bias = rng.integers(-3000, 3000, shape[1]).astype(np.int32)
        op = compile_int8_depthwise_conv2d(config, shape, kernel, stride=stride, padding=pads, dilation=dilation,
                                           shift=shift, relu=relu)
        out, _ = op.run(dev, x=x, w=w, bias=bias)
        padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        spread = np.zeros((shape[1], 1, (kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1), np.int8)
        spread[:, :, ::dilation[0], ::dilation[1]] = w           # the dilated kernel, zeros between its taps
        sums = conv2d_sums(padded, spread, stride[0], 0, groups=shape[1]) + bias[None, :, None, None]
        np.testing.assert_array_equal(out, int8_clipped(sums >> shift, 0 if relu else -128))


@pytest.mark.parametrize("config", SQUARE_CONFIGS[:3], ids=lambda c: c.name)
@pytest.mark.parametrize("shift, hi", [(3, 96), (12, 96), (15, 5), (10, -100), (0, 127)])
def test_an_int8_upper_bound_is_exact_on_the_accelerator_and_the_cpu(config, shift, hi):
    """A convolution clamped below 127 (a fused ReLU6): ``min(v >> s, hi)`` runs as
    ``min(v >> first, cap) >> rest`` (`int8_clamp_steps`: the cap an ALU immediate), bit for bit
    on fsim (one-group and depthwise) and the CPU, for shifts whose cap needs a first shift."""
    rng = np.random.default_rng(shift * 1000 + hi + 200)
    relu = hi >= 0
    shape, weight = (1, 20, 6, 6), (12, 20, 3, 3)
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    w = rng.integers(-128, 128, weight, dtype=np.int8)
    bias = rng.integers(-40000, 40000, 12).astype(np.int32)
    expect = np.minimum(int8_clipped((conv2d_sums(x, w, 1, 1) + bias[None, :, None, None]) >> shift,
                                     0 if relu else -128), hi)
    on_accel, _ = compile_conv2d(config, shape, weight, padding=1, bias=True, shift=shift, relu=relu,
                                 hi=hi).run(device_for(config), x=x, w=w, bias=bias)
    on_cpu, _ = compile_host_conv2d(target_of("cpu"), shape, weight, padding=1, bias=True, shift=shift, relu=relu,
                                    hi=hi).run(CPU, x=x, w=w, bias=bias)
    np.testing.assert_array_equal(on_accel, expect)
    np.testing.assert_array_equal(on_cpu, expect)
    dw = rng.integers(-128, 128, (20, 1, 3, 3), dtype=np.int8)
    dw_bias = rng.integers(-40000, 40000, 20).astype(np.int32)
    out, _ = compile_int8_depthwise_conv2d(config, shape, (3, 3), padding=(1, 1, 1, 1), shift=shift, relu=relu,
                                           hi=hi).run(device_for(config), x=x, w=dw, bias=dw_bias)
    sums = conv2d_sums(x, dw, 1, 1, groups=20) + dw_bias[None, :, None, None]
    np.testing.assert_array_equal(out, np.minimum(int8_clipped(sums >> shift, 0 if relu else -128), hi))


@pytest.mark.parametrize("channels", [12, 80])
def test_int8_depthwise_loads_its_bias_once_where_the_accumulator_has_room(channels):
    """12 channels' bias (3 blocks) is loaded once for all tiles; 80 channels' (20 blocks, more than a
    quarter of `cramped`'s 64 accumulator entries) per tile — both exact."""
    config = CONFIGS["cramped"]
    rng = np.random.default_rng(channels)
    shape = (1, channels, 6, 6)
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    w = rng.integers(-128, 128, (channels, 1, 3, 3), dtype=np.int8)
    bias = rng.integers(-3000, 3000, channels).astype(np.int32)
    op = compile_int8_depthwise_conv2d(config, shape, (3, 3), padding=(1, 1, 1, 1), shift=6, relu=True, hi=90)
    assert bool(op.plan.get("bias_once")) == (channels == 12)
    out, _ = op.run(device_for(config), x=x, w=w, bias=bias)
    sums = conv2d_sums(x, w, 1, 1, groups=channels) + bias[None, :, None, None]
    np.testing.assert_array_equal(out, np.minimum(int8_clipped(sums >> 6, 0), 90))
