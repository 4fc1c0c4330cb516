"""Operators on the CPU back end, for random shapes: int8 bit for bit equal to numpy and to the
accelerator (fsim), float32 within 1e-4 of numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler_helpers import BATCHED, device_for, max_pool_ignoring_nan, with_nan_and_inf
from gemforge.compiler import CpuTarget
from gemforge.compiler.ops import (
    OpError, avg_pool2d_reference, compile_add, compile_clip, compile_conv2d, compile_dense, compile_elementwise,
    compile_max_pool2d, compile_mean, compile_pad, compile_pool2d, compile_relu, compile_softmax, compile_transpose,
    conv2d_reference, dense_reference, elementwise_reference, max_pool2d_reference, softmax_reference,
)
from gemforge.driver.runtime.device import open_device
from gemforge.hw.config import PRESETS

CPU = CpuTarget()
_SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def cpu():
    return open_device("cpu")


def _data(rng, shape, dtype):
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    if dtype == "int32":
        return rng.integers(-2**31, 2**31, shape).astype(np.int32)   # sums need more than 32 bits
    return rng.integers(-128, 128, shape).astype(np.int8)


def _close(got, expect):
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(expect).max())))


@_SETTINGS
@given(m=st.integers(1, 70), k=st.integers(1, 90), n=st.integers(1, 70), seed=st.integers(0, 2**16),
       epilogue=st.sampled_from([{}, {"shift": 7}, {"shift": 4, "relu": True}, {"relu": True}]),
       bias=st.booleans(), config=st.sampled_from(["tiny", "default"]))
def test_int8_dense_cpu_equals_fsim_and_numpy(m, k, n, seed, epilogue, bias, config):
    rng = np.random.default_rng(seed)
    a, b = _data(rng, (m, k), "int8"), _data(rng, (k, n), "int8")
    bv = rng.integers(-3000, 3000, n).astype(np.int32) if bias else None
    on_cpu, _ = compile_dense("cpu", m, k, n, bias=bias, **epilogue).run(open_device("cpu"), a=a, b=b, bias=bv)
    on_fsim, _ = compile_dense(config, m, k, n, bias=bias, **epilogue).run(device_for(PRESETS[config]), a=a, b=b,
                                                                             bias=bv)
    np.testing.assert_array_equal(on_cpu, dense_reference(a, b, bv, **epilogue))
    np.testing.assert_array_equal(on_cpu, on_fsim)


@_SETTINGS
@given(n=st.integers(1, 2), c=st.integers(1, 20), h=st.integers(1, 13), w=st.integers(1, 13),
       o=st.integers(1, 20), kernel=st.sampled_from([1, 2, 3, 5]), stride=st.integers(1, 3),
       padding=st.integers(0, 2), seed=st.integers(0, 2**16), shift=st.sampled_from([None, 6]),
       relu=st.booleans())
def test_int8_conv2d_cpu_equals_fsim_and_numpy(n, c, h, w, o, kernel, stride, padding, seed, shift, relu):
    if padding >= kernel or h + 2 * padding < kernel or w + 2 * padding < kernel:
        return
    rng = np.random.default_rng(seed)
    x, wt = _data(rng, (n, c, h, w), "int8"), _data(rng, (o, c, kernel, kernel), "int8")
    bias = rng.integers(-2000, 2000, o).astype(np.int32)
    options = dict(stride=stride, padding=padding, bias=True, shift=shift, relu=relu)
    on_cpu, _ = compile_conv2d("cpu", x.shape, wt.shape, **options).run(open_device("cpu"), x=x, w=wt, bias=bias)
    on_fsim, _ = compile_conv2d(BATCHED, x.shape, wt.shape, **options).run(device_for(BATCHED), x=x, w=wt, bias=bias)
    expect = conv2d_reference(x, wt, bias, stride, padding, shift, relu)
    np.testing.assert_array_equal(on_cpu, expect)
    np.testing.assert_array_equal(on_cpu, on_fsim)


@_SETTINGS
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 20), st.integers(1, 9), st.integers(1, 9)),
       seed=st.integers(0, 2**16), shift=st.sampled_from([None, 2]), relu=st.booleans(),
       bounds=st.tuples(st.integers(-500, 0), st.integers(1, 500)))
def test_int32_elementwise_cpu_equals_fsim_and_numpy(shape, seed, shift, relu, bounds):
    rng = np.random.default_rng(seed)
    x = rng.integers(-(1 << 20), 1 << 20, shape).astype(np.int32)
    y = rng.integers(-(1 << 20), 1 << 20, shape).astype(np.int32)
    device = device_for(PRESETS["tiny"])
    cpu_dev = open_device("cpu")
    results = {}
    for name, target in (("cpu", "cpu"), ("fsim", PRESETS["tiny"])):
        run_on = cpu_dev if name == "cpu" else device
        results[name] = (compile_add(target, shape, shift=shift, relu=relu).run(run_on, x=x, y=y)[0],
                         compile_relu(target, shape).run(run_on, x=x)[0],
                         compile_clip(target, shape, *bounds).run(run_on, x=x)[0])
    expect = (elementwise_reference("add", x, y, shift=shift, relu=relu), elementwise_reference("relu", x),
              elementwise_reference("clip", x, lo=bounds[0], hi=bounds[1]))
    for got_cpu, got_fsim, want in zip(results["cpu"], results["fsim"], expect):
        np.testing.assert_array_equal(got_cpu, want)
        np.testing.assert_array_equal(got_cpu, got_fsim)


@pytest.mark.parametrize("kernel,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_max_pool_cpu_equals_fsim_on_nonnegative_inputs(kernel, stride, padding, cpu):
    """The accelerator pads with zeros, the CPU with the lowest value: equal after ReLU."""
    rng = np.random.default_rng(kernel * 10 + stride)
    x = np.abs(rng.integers(-(1 << 20), 1 << 20, (2, 5, 9, 8))).astype(np.int32)
    on_cpu, _ = compile_max_pool2d("cpu", x.shape, kernel, stride=stride, padding=padding).run(cpu, x=x)
    config = PRESETS["tiny"]
    on_fsim, _ = compile_max_pool2d(config, x.shape, kernel, stride=stride, padding=padding).run(device_for(config),
                                                                                             x=x)
    np.testing.assert_array_equal(on_cpu, on_fsim)
    np.testing.assert_array_equal(on_cpu, max_pool2d_reference(x, kernel, stride, padding))


# ---------------------------------------------------------------------------- float32 and host-only operators

@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (33, 65, 17), (128, 256, 96), (6, 1000, 10)])
def test_float32_dense(m, k, n, cpu):
    rng = np.random.default_rng(m + k + n)
    a, b = _data(rng, (m, k), "float32"), _data(rng, (k, n), "float32")
    bias = rng.standard_normal(n).astype(np.float32)
    out, result = compile_dense("cpu", m, k, n, dtype="float32", bias=True, relu=True).run(cpu, a=a, b=b, bias=bias)
    assert out.dtype == np.float32 and result.seconds is not None
    _close(out, dense_reference(a, b, bias, relu=True))


@pytest.mark.parametrize("shape,weight,stride,padding,groups", [
    ((1, 8, 16, 16), (16, 8, 3, 3), 1, 1, 1),      # shifted-window product
    ((2, 6, 11, 9), (4, 6, 3, 3), 2, 1, 1),        # im2col
    ((1, 16, 7, 7), (32, 16, 1, 1), 1, 0, 1),      # direct 1x1
    ((1, 8, 10, 10), (8, 1, 3, 3), 1, 1, 8),       # depthwise (window sums, `depthwise_conv2d_te`)
    ((2, 12, 11, 9), (12, 1, 3, 3), 2, 1, 12),     # depthwise, strided, odd sizes
    ((1, 5, 9, 13), (10, 1, 5, 5), 1, 2, 5),       # depthwise, channel multiplier 2, 5x5
    ((1, 7, 6, 6), (7, 1, 3, 3), 2, 0, 7),         # depthwise, unpadded
    ((1, 4, 13, 11), (8, 1, 5, 5), 2, 2, 4),       # depthwise, strided 5x5 (taps two phase columns on)
    ((2, 3, 10, 14), (6, 1, 3, 2), 3, 1, 3),       # depthwise, stride 3, multiplier 2, a 3x2 kernel
    ((1, 12, 9, 9), (6, 4, 3, 3), 2, 1, 3),        # grouped, strided
    ((1, 3, 20, 20), (5, 3, 7, 7), 2, 3, 1),       # a stem-like 7x7
])
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_conv2d_every_method_and_grouping(shape, weight, stride, padding, groups, dtype, cpu):
    rng = np.random.default_rng(sum(shape) + sum(weight))
    x, w = _data(rng, shape, dtype), _data(rng, weight, dtype)
    bias = (rng.integers(-500, 500, weight[0]).astype(np.int32) if dtype == "int8"
            else rng.standard_normal(weight[0]).astype(np.float32))
    epi = {"shift": 5, "relu": True} if dtype == "int8" else {"relu": True}
    op = compile_conv2d("cpu", shape, weight, stride=stride, padding=padding, groups=groups, dtype=dtype,
                        bias=True, **epi)
    out, _ = op.run(cpu, x=x, w=w, bias=bias)
    expect = conv2d_reference(x, w, bias, stride, padding, groups=groups, **epi)
    if dtype == "int8":
        np.testing.assert_array_equal(out, expect)
    else:
        _close(out, expect)


@pytest.mark.parametrize("shape,o,kernel,stride,padding,rows", [
    ((1, 96, 7, 7), 40, 1, 1, 0, True),         # 49 pixels: channels vectorized
    ((2, 24, 9, 5), 20, 1, 2, 0, None),         # strided, batch 2, 20 channels (padded to a panel)
    ((1, 64, 14, 14), 16, 1, 1, 0, True),       # 196 pixels: the columns product would copy its input
    ((1, 8, 16, 16), 24, 1, 1, 0, False),       # 256 pixels, few input channels: pixels vectorized
    ((1, 64, 7, 7), 48, 3, 1, 1, True),         # 3x3 on 7x7: the shifted layout's pitch wastes 2 of 9
    ((1, 32, 14, 14), 64, 3, 2, 1, True),       # strided 3x3: no im2col matrix
    ((1, 3, 32, 32), 16, 7, 2, 3, None),        # a stem
    ((2, 5, 9, 11), 7, 3, 1, 0, None),          # unpadded, odd sizes
    ((1, 64, 56, 56), 64, 3, 1, 1, False),      # a large image: pixels vectorized
])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("forced", [False, True])
def test_float32_conv_with_pixels_for_rows(shape, o, kernel, stride, padding, rows, residual, forced, cpu,
                                           monkeypatch):
    """A float32 convolution with the output pixels for the product's rows (`nn.conv2d_rows_te`)
    where `host._pixel_rows` expects it faster, or always (``forced``): bias, residual and clip
    epilogue, any kernel, stride and padding."""
    from gemforge.compiler.ops import host
    weight = (o, shape[1], kernel, kernel)
    out_hw = tuple((size + 2 * padding - kernel) // stride + 1 for size in shape[2:])
    if forced:
        monkeypatch.setattr(host, "_pixel_rows", lambda *args: True)
    elif rows is not None:
        assert host._pixel_rows(o, shape[1], (kernel, kernel), stride, padding, 1, shape[3], out_hw, 16, 32) == rows
    rng = np.random.default_rng(sum(shape) + o)
    x, w = _data(rng, shape, "float32"), _data(rng, weight, "float32")
    bias = rng.standard_normal(o).astype(np.float32)
    op = host.compile_conv2d(CPU, shape, weight, stride=stride, padding=padding, dtype="float32", bias=True,
                             relu=True, clip=(0.0, 1.5), residual=residual)
    expect = conv2d_reference(x, w, bias, stride, padding)
    arrays = {"x": x, "w": w, "bias": bias}
    if residual:
        arrays["residual"] = _data(rng, expect.shape, "float32")
        expect = expect + arrays["residual"]
    out, _ = op.run(cpu, **arrays)
    if forced or rows is not None:
        assert (op.plan["method"] == "rows") == (forced or rows)
    _close(out, np.clip(expect, 0.0, 1.5))


@pytest.mark.parametrize("m,k,n", [(1, 1280, 1000), (5, 33, 17)])
def test_float32_dense_with_constant_weights_packed_once(m, k, n, cpu):
    """``constant_b``: the kernel reads the weights as `pack` laid them out (column panels),
    with no packing stage of its own, and computes what the packing kernel does."""
    rng = np.random.default_rng(m + k)
    a, b = _data(rng, (m, k), "float32"), _data(rng, (k, n), "float32")
    bias = rng.standard_normal(n).astype(np.float32)
    packed = compile_dense("cpu", m, k, n, dtype="float32", bias=True)
    from gemforge.compiler.ops import host
    constant = host.compile_dense(CPU, m, k, n, dtype="float32", bias=True, constant_b=True)
    assert constant.inputs == ["a", "wp", "bias"] and packed.inputs == ["a", "w", "bias"]
    np.testing.assert_array_equal(constant.run(cpu, a=a, b=b, bias=bias)[0], packed.run(cpu, a=a, b=b, bias=bias)[0])
    _close(constant.run(cpu, a=a, b=b, bias=bias)[0], dense_reference(a, b, bias))


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_broadcasting_add_and_mul(op, dtype, cpu):
    rng = np.random.default_rng(3)
    x, y = _data(rng, (2, 5, 7, 9), dtype), _data(rng, (5, 1, 9), dtype)
    epi = {"shift": 1} if dtype == "int8" else {"relu": True}
    out, _ = compile_elementwise("cpu", op, x.shape, dtype=dtype, y_shape=y.shape, **epi).run(cpu, x=x, y=y)
    want = elementwise_reference(op, x, np.broadcast_to(y, x.shape), **epi)
    if dtype == "float32":
        _close(out, want)
    else:
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("dtype", ["int8", "int32", "float32"])
@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), (2, 2, 0), ((7, 7), 1, 0)])
def test_pooling_including_global(kind, dtype, kernel, stride, padding, cpu):
    rng = np.random.default_rng(5)
    x = _data(rng, (2, 3, 7, 7), dtype)
    out, _ = compile_pool2d("cpu", kind, x.shape, kernel, stride=stride, padding=padding, dtype=dtype).run(cpu, x=x)
    k = kernel if isinstance(kernel, int) else kernel[0]
    ref = max_pool2d_reference if kind == "max" else avg_pool2d_reference
    want = ref(x, k, stride, padding)
    if dtype == "float32":
        _close(out, want)
    else:
        np.testing.assert_array_equal(out, want)


def _pool_by_window(x, kind, kernel, stride, pads, dilation, ceil_mode, count_include_pad):
    """Pooling one window at a time, from ONNX's definitions: the taps of each window, those inside
    the image pooled, the divisor counting taps inside the image (or inside the padded frame)."""
    n, c, h, w = x.shape
    size = []
    for axis, length in enumerate((h, w)):
        k, s, d, before, after = kernel[axis], stride[axis], dilation[axis], pads[axis], pads[axis + 2]
        room = length + before + after - ((k - 1) * d + 1)
        count = (-(-room // s) if ceil_mode else room // s) + 1
        size.append(count - (ceil_mode and (count - 1) * s >= length + before))
    out = np.zeros((n, c, *size), np.float64)
    for oy in range(size[0]):
        for ox in range(size[1]):
            ys = [oy * stride[0] - pads[0] + i * dilation[0] for i in range(kernel[0])]
            xs = [ox * stride[1] - pads[1] + j * dilation[1] for j in range(kernel[1])]
            rows, cols = [y for y in ys if 0 <= y < h], [v for v in xs if 0 <= v < w]
            window = x[:, :, rows][:, :, :, cols].astype(np.float64)
            if kind == "max":
                out[:, :, oy, ox] = window.max(axis=(2, 3))
                continue
            if count_include_pad:
                taps = (sum(-pads[0] <= y < h + pads[2] for y in ys) * sum(-pads[1] <= v < w + pads[3] for v in xs))
            else:
                taps = len(rows) * len(cols)
            total = window.sum(axis=(2, 3))
            out[:, :, oy, ox] = total / taps if x.dtype.kind == "f" else np.floor((total + taps // 2) / taps)
    return out.astype(x.dtype)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("dtype", ["int8", "int32", "float32"])
@pytest.mark.parametrize("seed", range(4))
def test_pooling_windows_uneven_padding_ceil_mode_and_dilation(kind, dtype, seed, cpu):
    rng = np.random.default_rng(40 + seed)
    kernel = tuple(int(k) for k in rng.integers(1, 4, 2))
    stride, dilation = tuple(int(s) for s in rng.integers(1, 4, 2)), tuple(int(d) for d in rng.integers(1, 3, 2))
    pads = tuple(int(rng.integers(0, kernel[i % 2])) for i in range(4))
    ceil_mode, include = bool(seed % 2), bool(seed // 2)
    x = _data(rng, (2, 3, 11, 10), dtype)
    op = compile_pool2d("cpu", kind, x.shape, kernel, stride=stride, padding=pads, dilation=dilation,
                        ceil_mode=ceil_mode, dtype=dtype, count_include_pad=include)
    out, _ = op.run(cpu, x=x)
    want = _pool_by_window(x, kind, kernel, stride, pads, dilation, ceil_mode, include)
    ref = (max_pool2d_reference(x, kernel, stride, pads, dilation=dilation, ceil_mode=ceil_mode) if kind == "max" else
           avg_pool2d_reference(x, kernel, stride, pads, dilation=dilation, ceil_mode=ceil_mode,
                                count_include_pad=include))
    for got in (out, ref):
        if dtype == "float32":
            _close(got, want)
        else:
            np.testing.assert_array_equal(got, want)


def test_pooling_refuses_windows_that_miss_the_image():
    with pytest.raises(OpError, match="window 0 has no tap inside the input's 2 rows"):
        compile_pool2d("cpu", "max", (1, 1, 2, 6), 2, stride=1, padding=(1, 0, 1, 0), dilation=(3, 1), dtype="float32")
    with pytest.raises(OpError, match=r"padding \[0, 0, 2, 0\] \(top, left, bottom, right\) must be smaller"):
        compile_pool2d("cpu", "avg", (1, 1, 6, 6), 2, padding=(0, 0, 2, 0), dtype="float32")


@pytest.mark.parametrize("kernel,stride,padding", [(3, 1, 1), (2, 2, 0), ((2, 3), (1, 2), (1, 1))])
def test_float_max_pool_ignores_nan(kernel, stride, padding, cpu):
    """A NaN in a window does not win (ONNX Runtime's MaxPool returns the other values' maximum);
    a window all NaN is NaN; ±inf are values like any other. Wide rows take the vectorized loop."""
    x = with_nan_and_inf(np.random.default_rng(8), (2, 3, 9, 37))
    want = max_pool_ignoring_nan(x, kernel, stride, padding)
    assert np.isnan(want).any() and not np.isnan(want).all()
    out, _ = compile_pool2d("cpu", "max", x.shape, kernel, stride=stride, padding=padding, dtype="float32").run(cpu, x=x)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(max_pool2d_reference(x, kernel, stride, padding), want)


@pytest.mark.parametrize("shape", [(10,), (3, 1000), (2, 3, 17), (2, 20000)])
def test_softmax(shape, cpu):
    x = (np.random.default_rng(6).standard_normal(shape) * 5).astype(np.float32)
    out, _ = compile_softmax("cpu", shape).run(cpu, x=x)
    np.testing.assert_allclose(out, softmax_reference(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", ["int8", "int32", "float32"])
def test_transpose_and_pad_move_every_type_exactly(dtype, cpu):
    rng = np.random.default_rng(9)
    x = _data(rng, (2, 3, 4, 5), dtype)
    for perm in ((3, 1, 0, 2), (0, 1, 2, 3), (3, 2, 1, 0)):
        out, _ = compile_transpose("cpu", x.shape, perm, dtype=dtype).run(cpu, x=x)
        np.testing.assert_array_equal(out, x.transpose(perm))
    for pads, value in (((0, 1, 0, 2, 1, 0, 3, 0), 0), ((1, 0, 2, 0, 0, 3, 0, 1), -7)):
        out, _ = compile_pad("cpu", x.shape, pads, value, dtype=dtype).run(cpu, x=x)
        np.testing.assert_array_equal(out, np.pad(x, list(zip(pads[:4], pads[4:])), constant_values=value))


def test_float_elementwise_and_mean(cpu):
    rng = np.random.default_rng(10)
    x, y = (rng.standard_normal((3, 40)) * 4).astype(np.float32), rng.uniform(0.5, 2, (40,)).astype(np.float32)
    for op, want in (("sub", x - y), ("div", x / y), ("exp", np.exp(x)), ("tanh", np.tanh(x)), ("abs", np.abs(x)),
                     ("sigmoid", 1 / (1 + np.exp(-x.astype(np.float64)))), ("sqrt", np.sqrt(np.abs(x)))):
        arg = np.abs(x) if op == "sqrt" else x
        options = {"y_shape": y.shape} if op in ("sub", "div") else {}
        kernel = compile_elementwise("cpu", op, x.shape, dtype="float32", **options)
        out, _ = kernel.run(cpu, x=arg, **({"y": y} if options else {}))
        np.testing.assert_allclose(out, want, rtol=1e-6, err_msg=op)
    out, _ = compile_elementwise("cpu", "leaky_relu", x.shape, dtype="float32", alpha=0.1).run(cpu, x=x)
    np.testing.assert_array_equal(out, np.where(x < 0, x * np.float32(0.1), x))
    out, _ = compile_mean("cpu", 3, 40).run(cpu, x=x)
    np.testing.assert_allclose(out, x.astype(np.float64).mean(axis=1), rtol=1e-6)


def test_bad_arguments_get_clear_errors(cpu):
    with pytest.raises(OpError, match="shift .* applies to int8 operands"):
        compile_dense("cpu", 4, 4, 4, dtype="float32", shift=3)
    with pytest.raises(OpError, match="groups .3. must divide the input channels .8."):
        compile_conv2d("cpu", (1, 8, 5, 5), (3, 2, 3, 3), groups=3)
    with pytest.raises(OpError, match="dense takes int8 or float32 data, not 'int16'"):
        compile_dense("cpu", 4, 4, 4, dtype="int16")
    with pytest.raises(OpError, match="softmax takes float32"):
        compile_softmax("cpu", (4, 4), dtype="int8")
    with pytest.raises(OpError, match="does not broadcast"):
        compile_elementwise("cpu", "add", (2, 3), dtype="int8", y_shape=(4,))
    with pytest.raises(OpError, match="runs on the cpu or gpu, not on the accelerator"):
        compile_softmax("tiny", (4, 4))
    with pytest.raises(OpError, match="sigmoid takes float32 data, not 'int8'"):
        compile_elementwise("cpu", "sigmoid", (4,), dtype="int8")
    with pytest.raises(OpError, match="alpha is the parameter of leaky_relu, elu and thresholded_relu; relu takes none"):
        compile_elementwise("cpu", "relu", (4,), dtype="float32", alpha=0.1)
    with pytest.raises(OpError, match=r"perm \[0, 0\] is not a permutation of the axes of a rank-2 tensor"):
        compile_transpose("cpu", (2, 3), (0, 0))
    with pytest.raises(OpError, match=r"pads must be 4 non-negative integers for a rank-2 tensor, not \[1, -1, 0, 0\]"):
        compile_pad("cpu", (2, 3), (1, -1, 0, 0))
    with pytest.raises(OpError, match=r"the pad value of an int8 tensor must be an integer in -128\.\.127, not 0\.5"):
        compile_pad("cpu", (2, 3), (1, 1, 0, 0), 0.5, dtype="int8")
    with pytest.raises(OpError, match="computes int8 operands, not float32"):
        compile_dense("tiny", 4, 4, 4, dtype="float32")
    op = compile_dense("cpu", 4, 4, 4, dtype="float32")
    with pytest.raises(OpError, match=r"must be float32, not int8"):
        op.run(cpu, a=np.zeros((4, 4), np.int8), b=np.zeros((4, 4), np.int8))
    with pytest.raises(OpError, match=r"compiled for A\[4, 4\] @ B\[4, 4\]"):
        op.run(cpu, a=np.zeros((3, 4), np.float32), b=np.zeros((4, 4), np.float32))


@pytest.mark.parametrize("cpu_name,features", [("host", "host"), ("host", "host,-avx512vnni"), ("x86-64-v2", "")],
                         ids=["vnni-if-present", "no-vnni", "sse4"])
def test_int8_products_with_and_without_vnni(cpu_name, features, cpu):
    """With AVX-512 VNNI the int8 products run on 4-byte dot products (activations offset
    to unsigned bytes, corrected by the weights' sums); on AVX2 without it, on the same dot
    products from byte and word multiply-adds; on older CPUs, on widened products. All are exact."""
    from gemforge.compiler.backends.cpu import has_feature
    from gemforge.compiler.ops.host import _vnni
    target = CpuTarget(cpu=cpu_name, features=features)
    vnni, avx2 = has_feature(target, "avx512vnni"), has_feature(target, "avx2")
    rng = np.random.default_rng(9)
    # Activations at both ends of the range: the top bit of an unsigned byte is the one AVX2's
    # saturating byte multiply-add cannot take as it is.
    x, w = _data(rng, (1, 7, 9, 10), "int8"), _data(rng, (9, 7, 3, 3), "int8")
    x.flat[::5], w.flat[::7] = 127, -128
    bias = rng.integers(-999, 999, 9).astype(np.int32)
    for stride in (1, 2):
        op = compile_conv2d(target, x.shape, w.shape, stride=stride, padding=1, bias=True, shift=5, relu=True)
        out, _ = op.run(cpu, x=x, w=w, bias=bias)
        np.testing.assert_array_equal(out, conv2d_reference(x, w, bias, stride, 1, 5, True))
        assert ("vpdpbusd" in op.program.assembly) == vnni
        assert ("vpmaddubsw" in op.program.assembly) == (avx2 and not vnni)
    a, b = _data(rng, (13, 30), "int8"), _data(rng, (30, 21), "int8")
    a[::2], b[:, ::3] = 127, -128
    op = compile_dense(target, 13, 30, 21)
    out, _ = op.run(cpu, a=a, b=b)
    np.testing.assert_array_equal(out, dense_reference(a, b))
    assert (op.plan.get("method") == "vnni") == (vnni or avx2) == _vnni(target, "int8")


@pytest.mark.parametrize("seed", range(4))
def test_int8_conv_of_a_nonnegative_input_takes_its_bytes_as_they_are(seed, cpu, monkeypatch):
    """An input known to hold no negative value (a ReLU's output: ``nonnegative``) goes into the
    4-byte dot products without the offset and its correction (`dot4_u7s8`), bit for bit the
    reference's in every method (the pixels for rows or for columns, stride 1 or 2)."""
    from gemforge.compiler.ops import host
    target = CpuTarget()
    if not host._vnni(target, "int8"):
        pytest.skip("this CPU has neither AVX-512 VNNI nor AVX2 (no 4-byte dot products)")
    rng = np.random.default_rng(40 + seed)
    monkeypatch.setattr(host, "_pixel_rows", lambda *args: bool(seed % 2))
    k = int(rng.choice([1, 3]))
    shape = (1, int(rng.integers(1, 20)), int(rng.integers(k, 12)), int(rng.integers(k, 12)))
    weight = (int(rng.integers(1, 40)), shape[1], k, k)
    stride, padding = 1 + seed // 2, int(rng.integers(0, k))
    x = rng.integers(0, 128, shape).astype(np.int8)
    x.flat[::3] = 127                                     # the largest a byte below 128 holds
    w = _data(rng, weight, "int8")
    w.flat[::5] = -128
    bias = rng.integers(-3000, 3000, weight[0]).astype(np.int32)
    op = host.compile_conv2d(target, shape, weight, stride=stride, padding=padding, bias=True, shift=6, relu=True,
                             nonnegative=True)
    assert op.plan["method"].startswith("vnni") and op.plan["nonnegative"]
    out, _ = op.run(cpu, x=x, w=w, bias=bias)
    np.testing.assert_array_equal(out, conv2d_reference(x, w, bias, stride, padding, shift=6, relu=True))
    # The promise is the caller's: a negative input (bytes of 128 and more) reads wrongly.
    negative = np.full(shape, -100, np.int8)
    out, _ = op.run(cpu, x=negative, w=w, bias=bias)
    assert not np.array_equal(out, conv2d_reference(negative, w, bias, stride, padding, shift=6, relu=True))


@pytest.mark.parametrize("registers", [16, 32])
def test_register_tiles_fit_the_register_file(registers):
    """A micro-kernel's accumulators, its loaded vectors and the broadcast fit the vector
    registers, for any output shape: 8 × 2 tiles on AVX2's 16 registers spilled every step
    and ran the 1024³ GEMM at a third of the speed of 6 × 2."""
    from gemforge.compiler.ops.cpu import TILE_EFFICIENCY, plan_tile
    rng = np.random.default_rng(registers)
    for _ in range(300):
        rows, cols, lanes = int(rng.integers(1, 3000)), int(rng.integers(1, 5000)), int(rng.choice([4, 8, 16]))
        mb, nb = plan_tile(rows, cols, lanes, registers)
        vectors = nb // lanes
        assert nb % lanes == 0 and 1 <= mb <= rows
        assert mb * vectors + vectors + 1 <= registers, (rows, cols, lanes, mb, nb)
    # A large product takes a tile measured as the fastest for its register file.
    mb, nb = plan_tile(1024, 1024, 8, registers)
    assert TILE_EFFICIENCY[registers][(mb, nb // 8)] == 1.0


@pytest.mark.parametrize("features", ["host", "host,-avx512f"], ids=["host", "no-avx512"])
def test_dense_tiles_follow_the_target_registers(features, cpu):
    """A float32 tile follows the target's register file (32 vector registers with AVX-512
    or on AArch64, else 16); int8 keeps its measured tiles (`host._registers`). Both exact."""
    from gemforge.compiler.backends.cpu import has_feature, vector_registers
    import platform
    target = CpuTarget(features=features)
    registers = vector_registers(target)
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert registers == (32 if has_feature(target, "avx512f") or not x86 else 16)
    rng = np.random.default_rng(5)
    for dtype in ("float32", "int8"):
        a, b = _data(rng, (61, 45), dtype), _data(rng, (45, 83), dtype)
        op = compile_dense(target, 61, 45, 83, dtype=dtype)
        vectors = op.plan["nb"] // op.plan["lanes"]
        assert op.plan["mb"] * vectors + vectors + 1 <= (registers if dtype == "float32" else 32)
        out, _ = op.run(cpu, a=a, b=b)
        if dtype == "int8":
            np.testing.assert_array_equal(out, dense_reference(a, b))
        else:
            np.testing.assert_allclose(out, dense_reference(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,exponent", [((2, 3, 5, 7), 4), ((37,), 0), ((), 6), ((1, 3, 16, 16), -2)])
def test_quantize_kernel_rounds_half_to_even_and_saturates(shape, exponent, cpu):
    """`host.compile_quantize` equals `numeric.quantize_array` (the graph's definition) on halves,
    the saturation edges, ±inf and NaN."""
    from gemforge.compiler.graph.numeric import quantize_array
    from gemforge.compiler.ops import host
    rng = np.random.default_rng(exponent + 10)
    x = np.array(rng.standard_normal(shape) * 200 / 2.0 ** exponent, np.float32)
    flat = x.reshape(-1)
    specials = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 127.5, -128.5, 126.5, np.nan, np.inf, -np.inf, 1e30],
                        np.float32) / np.float32(2.0 ** exponent)
    flat[:min(flat.size, specials.size)] = specials[:flat.size]
    out, _ = host.compile_quantize(CPU, shape, exponent).run(cpu, x=x)
    assert out.shape == shape and out.dtype == np.int8
    np.testing.assert_array_equal(out, quantize_array(x, exponent))


@pytest.mark.parametrize("shape,kernel,stride,padding", [
    ((1, 3, 17, 16), (3, 3), 2, (1, 1, 1, 1)),      # MobileNetV2's stem, unfolded
    ((2, 2, 9, 11), (7, 7), 2, (3, 3, 3, 3)),       # ResNet's
    ((1, 1, 6, 5), (2, 3), 1, (0, 1, 1, 0)),        # uneven padding
])
def test_unfold_kernel_equals_the_graph_definition(shape, kernel, stride, padding, cpu):
    from gemforge.compiler.graph.ir import Node
    from gemforge.compiler.graph.operators.linear import _unfold_evaluate
    from gemforge.compiler.ops import host
    x = np.random.default_rng(sum(shape)).integers(-128, 128, shape).astype(np.int8)
    out, _ = host.compile_unfold(CPU, shape, kernel, stride, padding).run(cpu, x=x)
    node = Node("unfold", "u", ["x"], "y", {"kernel": kernel, "stride": stride, "padding": padding})
    np.testing.assert_array_equal(out, _unfold_evaluate(node, [x]))


@pytest.mark.parametrize("shape,o,kernel,stride,padding", [
    ((1, 64, 7, 7), 48, 3, 1, 1),
    ((2, 6, 9, 11), 20, 3, 2, 1),         # channels no multiple of 4, batch 2, strided
    ((1, 3, 17, 17), 16, 7, 2, 3),        # a stem
    ((1, 96, 7, 7), 40, 1, 1, 0),
])
@pytest.mark.parametrize("forced", [False, True])
def test_int8_vnni_conv_with_pixels_for_rows(shape, o, kernel, stride, padding, forced, monkeypatch):
    """int8 on 4-byte dot products with the pixels for rows (`nn.conv2d_vnni_rows_te`), bit for
    bit the reference's (requantization, ReLU, upper bound)."""
    from gemforge.compiler.ops import host
    target = CPU
    if not host._vnni(target, "int8"):
        pytest.skip("this CPU has neither AVX-512 VNNI nor AVX2 (the rows product is the 4-byte dot products' path)")
    if forced:
        monkeypatch.setattr(host, "_pixel_rows", lambda *args: True)
    rng = np.random.default_rng(sum(shape) + o)
    weight = (o, shape[1], kernel, kernel)
    x, w = _data(rng, shape, "int8"), _data(rng, weight, "int8")
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    op = host.compile_conv2d(target, shape, weight, stride=stride, padding=padding, dtype="int8", bias=True,
                             shift=7, relu=True, hi=90)
    if forced:
        assert op.plan["method"] == "vnni-rows"
    out, _ = op.run(open_device("cpu"), x=x, w=w, bias=bias)
    expect = np.minimum(conv2d_reference(x, w, bias, stride, padding, shift=7, relu=True), 90)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("seed", range(6))
def test_convolutions_with_pixels_for_rows_on_random_shapes(seed, cpu, monkeypatch):
    """The rows products (float32, and int8 on 4-byte dot products) forced on random shapes, kernels,
    strides and paddings equal the reference (int8 bit for bit)."""
    from gemforge.compiler.ops import host
    monkeypatch.setattr(host, "_pixel_rows", lambda *args: True)
    rng = np.random.default_rng(100 + seed)
    k = int(rng.choice([1, 2, 3, 5]))
    stride, padding = int(rng.integers(1, 3)), int(rng.integers(0, k))
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 20)), int(rng.integers(k, 15)), int(rng.integers(k, 15)))
    weight = (int(rng.integers(1, 40)), shape[1], k, k)
    bias_f = rng.standard_normal(weight[0]).astype(np.float32)
    x, w = _data(rng, shape, "float32"), _data(rng, weight, "float32")
    out, _ = host.compile_conv2d(CPU, shape, weight, stride=stride, padding=padding, dtype="float32", bias=True,
                                 relu=True).run(cpu, x=x, w=w, bias=bias_f)
    _close(out, conv2d_reference(x, w, bias_f, stride, padding, relu=True))
    if host._vnni(CPU, "int8"):
        x8, w8 = _data(rng, shape, "int8"), _data(rng, weight, "int8")
        bias8 = rng.integers(-2000, 2000, weight[0]).astype(np.int32)
        op = host.compile_conv2d(CPU, shape, weight, stride=stride, padding=padding, dtype="int8", bias=True,
                                 shift=6, relu=False)
        assert op.plan["method"] == "vnni-rows"
        out8, _ = op.run(cpu, x=x8, w=w8, bias=bias8)
        np.testing.assert_array_equal(out8, conv2d_reference(x8, w8, bias8, stride, padding, shift=6))
