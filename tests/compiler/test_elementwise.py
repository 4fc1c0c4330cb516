"""Element-wise add/relu/clip and max pooling on the tensor ALU, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import CONFIGS, device_for
from gemforge.compiler.ops import (
    OpError, compile_add, compile_clip, compile_max_pool2d, compile_relu, max_pool2d_reference,
)
from gemforge.compiler.ops.common import reference_epilogue

SHAPES = [(1, 3, 5, 7), (2, 20, 9, 9), (1, 17, 1, 1)]


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
