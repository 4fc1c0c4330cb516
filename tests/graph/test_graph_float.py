"""The float32 network on the CPU back end against ONNX Runtime, one supported op at a time
and as whole models (within 1e-4 relative), and the front end's refusals."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import helper

from gemforge.compiler.graph import GraphError
from gemforge.compiler.graph.evaluate import evaluate
from gemforge.driver.runtime.model import compile_model
from onnx_models import model, ort_run, small_cnn

pytest.importorskip("onnxruntime")


def _check(m, feeds, rtol=1e-4):
    expected = ort_run(m, feeds)
    compiled = compile_model(m)
    got = compiled.run(feeds if len(feeds) > 1 else next(iter(feeds.values())), "cpu")
    got = [got] if not isinstance(got, dict) else [got[o] for o in compiled.outputs]
    for e, g in zip(expected, got):
        assert g.shape == e.shape and g.dtype == np.float32
        scale = max(float(np.abs(e).max()), 1e-6)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * scale)
    # The graph's own numpy semantics agree too (the reference the int8 tests build on).
    ref = evaluate(compiled.graph, {k: v.astype(np.float32) for k, v in feeds.items()})
    for e, name in zip(expected, compiled.outputs):
        np.testing.assert_allclose(ref[name], e, rtol=rtol, atol=rtol * max(float(np.abs(e).max()), 1e-6))


def _unary(op, shape, rng, **attrs):
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", list(shape))], [("y", None)])
    _check(m, {"x": rng.normal(size=shape).astype(np.float32)})


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("groups,stride,pad,kernel,bias", [
    (1, 1, 1, 3, True), (1, 2, 0, 1, False), (2, 2, 1, 3, True), (4, 1, 2, 5, False), (1, 3, 1, 3, True)])
def test_conv(seed, groups, stride, pad, kernel, bias):
    rng = np.random.default_rng(seed)
    n, c, h, w = 1 + seed % 2, 4 * groups, 7 + seed, 9 - seed
    o = 2 * groups * (1 + seed)
    init = {"w": rng.normal(size=(o, c // groups, kernel, kernel)).astype(np.float32)}
    inputs = ["x", "w"]
    if bias:
        init["b"] = rng.normal(size=o).astype(np.float32)
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], group=groups, strides=[stride, stride], pads=[pad] * 4)
    m = model([node], [("x", [n, c, h, w])], [("y", None)], init)
    _check(m, {"x": rng.normal(size=(n, c, h, w)).astype(np.float32)})


@pytest.mark.parametrize("trans_b,alpha,beta,c_shape", [
    (0, 1.0, 1.0, (5,)), (1, 0.5, 2.0, (1, 5)), (1, 1.0, 1.0, (3, 5)), (0, 1.0, 0.0, None), (0, 2.0, 1.0, (1,))])
def test_gemm(trans_b, alpha, beta, c_shape):
    rng = np.random.default_rng(1)
    b = rng.normal(size=(5, 4) if trans_b else (4, 5)).astype(np.float32)
    init = {"b": b}
    inputs = ["a", "b"]
    if c_shape:
        init["c"] = rng.normal(size=c_shape).astype(np.float32)
        inputs.append("c")
    node = helper.make_node("Gemm", inputs, ["y"], transB=trans_b, alpha=alpha, beta=beta)
    _check(model([node], [("a", [3, 4])], [("y", None)], init), {"a": rng.normal(size=(3, 4)).astype(np.float32)})


def test_matmul_constant_and_variable():
    rng = np.random.default_rng(2)
    m = model([helper.make_node("MatMul", ["a", "w"], ["y"])], [("a", [2, 3, 6])], [("y", None)],
              {"w": rng.normal(size=(6, 7)).astype(np.float32)})
    _check(m, {"a": rng.normal(size=(2, 3, 6)).astype(np.float32)})
    m = model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [3, 6]), ("b", [6, 2])], [("y", None)])
    _check(m, {"a": rng.normal(size=(3, 6)).astype(np.float32), "b": rng.normal(size=(6, 2)).astype(np.float32)})


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("x_shape,y_shape", [
    ((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (3, 1, 1)), ((1, 4), (3, 1)), ((5,), (2, 3, 5)), ((2, 1, 4), (4,))])
def test_broadcasting_binary(op, x_shape, y_shape):
    rng = np.random.default_rng(3)
    m = model([helper.make_node(op, ["x", "y"], ["z"])], [("x", list(x_shape)), ("y", list(y_shape))], [("z", None)])
    _check(m, {"x": rng.normal(size=x_shape).astype(np.float32), "y": rng.normal(size=y_shape).astype(np.float32)})


def test_binary_with_constant_operand():
    rng = np.random.default_rng(4)
    m = model([helper.make_node("Mul", ["k", "x"], ["t"]), helper.make_node("Add", ["t", "b"], ["z"])],
              [("x", [2, 3, 4])], [("z", None)],
              {"k": rng.normal(size=(3, 1)).astype(np.float32), "b": rng.normal(size=(2, 3, 4)).astype(np.float32)})
    _check(m, {"x": rng.normal(size=(2, 3, 4)).astype(np.float32)})


def test_relu_clip_identity_dropout_softmax():
    rng = np.random.default_rng(5)
    _unary("Relu", (2, 3, 4), rng)
    _unary("Identity", (3, 4), rng)
    _unary("Softmax", (2, 7), rng)
    _unary("Softmax", (2, 3, 4, 5), rng, axis=1)
    m = model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], [("x", [4, 6])], [("y", None)],
              {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)})
    _check(m, {"x": rng.normal(size=(4, 6)).astype(np.float32)})
    m = model([helper.make_node("Clip", ["x", "", "hi"], ["y"]), helper.make_node("Dropout", ["y"], ["z"])],
              [("x", [4, 6])], [("z", None)], {"hi": np.array(0.2, np.float32)})
    _check(m, {"x": rng.normal(size=(4, 6)).astype(np.float32)})


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("GlobalAveragePool", {}),
])
def test_pooling(op, attrs):
    _unary(op, (2, 3, 9, 8), np.random.default_rng(6), **attrs)


@pytest.mark.parametrize("op,attrs", [
    # Uneven padding, ceil mode's partial windows (counted as ONNX Runtime counts them), dilations.
    ("MaxPool", dict(kernel_shape=[3, 2], strides=[2, 3], pads=[0, 1, 2, 0], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[2, 1], dilations=[3, 2], pads=[1, 0, 0, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER", dilations=[2, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, count_include_pad=1, pads=[1, 0, 0, 1])),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[3, 2], ceil_mode=1, pads=[0, 1, 1, 0])),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[1, 2], dilations=[2, 3], count_include_pad=1, pads=[1, 1, 1, 0])),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER")),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 3], auto_pad="VALID", ceil_mode=1)),
])
def test_pooling_windows(op, attrs):
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", [2, 3, 9, 8])], [("y", ["n", "c", "h", "w"])],
              opset=19)
    _check(m, {"x": np.random.default_rng(7).normal(size=(2, 3, 9, 8)).astype(np.float32)})


@pytest.mark.parametrize("attrs", [
    dict(strides=[2, 2], auto_pad="SAME_UPPER"), dict(strides=[2, 2], auto_pad="SAME_LOWER"),
    dict(pads=[0, 1, 2, 1]), dict(dilations=[2, 3], pads=[2, 1, 1, 3]), dict(dilations=[2, 2], strides=[2, 2]),
    dict(strides=[3, 3], auto_pad="VALID", dilations=[1, 2]),
])
@pytest.mark.parametrize("groups", [1, 2])
def test_conv_windows(attrs, groups):
    """Dilated kernels (spread out with zeros), padding uneven or SAME at any stride (a Pad node
    before the convolution), on ONNX Runtime's figures."""
    rng = np.random.default_rng(8)
    w = rng.normal(size=(4, 4 // groups, 3, 2)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=groups, **attrs)
    m = model([node], [("x", [2, 4, 10, 9])], [("y", ["n", "c", "h", "w"])],
              {"w": w, "b": rng.normal(size=4).astype(np.float32)})
    _check(m, {"x": rng.normal(size=(2, 4, 10, 9)).astype(np.float32)})


def _random_window(rng) -> tuple[str, dict, np.ndarray | None]:
    op = str(rng.choice(["MaxPool", "AveragePool", "Conv"]))
    kernel = [int(k) for k in rng.integers(1, 4, 2)]
    stride = int(rng.integers(1, 4))
    attrs = dict(kernel_shape=kernel, dilations=[int(d) for d in rng.integers(1, 3, 2)],
                 strides=[stride] * 2 if op == "Conv" else [int(s) for s in rng.integers(1, 4, 2)])
    auto = str(rng.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto == "NOTSET":
        # A pooling window's padding stays below its size (ONNX Runtime's rule); a convolution's need not.
        attrs["pads"] = [int(rng.integers(0, kernel[i % 2] + 2 * (op == "Conv"))) for i in range(4)]
    else:
        attrs["auto_pad"] = auto
    if op != "Conv":
        attrs["ceil_mode"] = int(rng.integers(0, 2))
    if op == "AveragePool":
        attrs["count_include_pad"] = int(rng.integers(0, 2))
    weight = rng.normal(size=(3, 2, *kernel)).astype(np.float32) if op == "Conv" else None
    return op, attrs, weight


@pytest.mark.parametrize("seed", range(4))
def test_random_windows_agree_with_onnx_runtime_or_are_refused(seed):
    """Random windows over random images: where ONNX Runtime answers, gemforge gives its figures
    or a GraphError naming the node (never another exception, never different numbers)."""
    import onnxruntime as ort
    rng = np.random.default_rng(100 + seed)
    ran = 0
    for _ in range(12):
        op, attrs, weight = _random_window(rng)
        shape = [1, 2, int(rng.integers(3, 11)), int(rng.integers(3, 11))]
        m = model([helper.make_node(op, ["x", "w"] if op == "Conv" else ["x"], ["y"], name="win", **attrs)],
                  [("x", shape)], [("y", ["n", "c", "h", "w"])], {} if weight is None else {"w": weight}, opset=19)
        x = rng.normal(size=shape).astype(np.float32)
        try:
            expected = ort_run(m, {"x": x})[0]
        except (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidArgument):
            expected = None       # ONNX Runtime refuses this model (a dilated SAME convolution, say)
        try:
            got = compile_model(m).run(x, "cpu")
        except GraphError as e:
            assert str(e).startswith("node win ("), e
            continue
        if expected is not None:
            ran += 1
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * max(float(np.abs(expected).max()), 1e-6),
                                       err_msg=f"{op} {attrs} on {shape}")
    assert ran >= 6


def test_max_pool_ignores_nan_as_onnx_runtime_does():
    """A window holding NaN gives the maximum of its other values, one all NaN gives NaN, ±inf
    are values. (ONNX Runtime's answer depends on where in the window a NaN sits: with a NaN
    last it may give NaN or a value below the maximum. These windows avoid that.)"""
    n, inf = np.nan, np.inf
    x = np.array([[n, 1, n, n, -inf, 7],
                  [4, 5, n, n, n, 2],
                  [n, inf, n, 3, -inf, -inf],
                  [2, -3, -1, 0.5, -inf, 1]], np.float32)[None, None]
    m = model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], [("x", [1, 1, 4, 6])],
              [("y", None)])
    expected = ort_run(m, {"x": x})[0]
    np.testing.assert_array_equal(expected.ravel(), [5, n, 7, inf, 3, 1])
    compiled = compile_model(m)
    np.testing.assert_array_equal(compiled.run(x, "cpu"), expected)
    np.testing.assert_array_equal(evaluate(compiled.graph, {"x": x})["y"], expected)


def test_flatten_reshape_concat_batchnorm():
    rng = np.random.default_rng(7)
    _unary("Flatten", (2, 3, 4, 5), rng, axis=2)
    m = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", [2, 3, 4])], [("y", None)],
              {"s": np.array([0, -1], np.int64)})
    _check(m, {"x": rng.normal(size=(2, 3, 4)).astype(np.float32)})
    m = model([helper.make_node("Concat", ["x", "y", "x"], ["z"], axis=-1)], [("x", [2, 3]), ("y", [2, 4])],
              [("z", None)])
    _check(m, {"x": rng.normal(size=(2, 3)).astype(np.float32), "y": rng.normal(size=(2, 4)).astype(np.float32)})
    init = {k: rng.uniform(0.5, 1.5, 3).astype(np.float32) for k in ("g", "b", "m", "v")}
    for shape in ((2, 3, 4, 5), (4, 3)):   # BatchNorm without a convolution before it: x·a + b
        m = model([helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], epsilon=1e-3)],
                  [("x", list(shape))], [("y", None)], init)
        _check(m, {"x": rng.normal(size=shape).astype(np.float32)})


@pytest.mark.parametrize("seed", range(2))
def test_whole_model(seed):
    rng = np.random.default_rng(seed)
    m = small_cnn(rng, channels=8 + 8 * seed, image=8, batch=2, softmax=bool(seed))
    _check(m, {"input": rng.normal(size=(2, 3, 8, 8)).astype(np.float32)})


def test_resnet18_float_on_cpu():
    from gemforge.models import build_resnet18
    rng = np.random.default_rng(0)
    m = build_resnet18(image=32, width=16, classes=10)
    _check(m, {"input": rng.normal(size=(1, 3, 32, 32)).astype(np.float32)})


@pytest.mark.parametrize("nodes, initializers", [
    ([helper.make_node("Relu", ["x"], ["y"])], {}),
    ([helper.make_node("Add", ["x", "c"], ["y"])], {"c": np.float32(2.5)}),
    ([helper.make_node("Mul", ["x", "x"], ["y"])], {}),
    ([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"lo": np.float32(-1), "hi": np.float32(1)}),
])
def test_rank_0_tensors_run_as_onnx_runtime_runs_them(nodes, initializers):
    m = model(nodes, [("x", [])], [("y", [])], initializers)
    for value in (-1.75, 0.5, 3.0):
        _check(m, {"x": np.array(value, np.float32)})


def test_tensors_named_like_numpys_own_parameters_survive_save_and_load(tmp_path):
    """``file`` and ``allow_pickle`` are np.savez's own parameters: a constant or an output so
    named still reaches the saved artefact and the outputs' .npz."""
    from gemforge.driver.tools.cli import main
    from gemforge.driver.runtime.model import Model
    rng = np.random.default_rng(5)
    weights = rng.normal(size=(3, 4)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "file"], ["allow_pickle"]), helper.make_node("Relu", ["x"], ["other"])],
              [("x", [2, 3])], [("allow_pickle", [2, 4]), ("other", [2, 3])], {"file": weights})
    x = rng.normal(size=(2, 3)).astype(np.float32)
    compile_model(m).save(tmp_path / "m.gfm")
    loaded = Model.load(tmp_path / "m.gfm")
    expected = ort_run(m, {"x": x})
    got = loaded.run(x, "cpu")
    np.testing.assert_allclose(got["allow_pickle"], expected[0], rtol=1e-5)
    np.save(tmp_path / "x.npy", x)
    argv = ["run", tmp_path / "m.gfm", "--input", tmp_path / "x.npy", "-o", tmp_path / "y.npz"]
    assert main([str(a) for a in argv]) == 0
    with np.load(tmp_path / "y.npz") as y:
        assert sorted(y.files) == ["allow_pickle", "other"]
        np.testing.assert_allclose(y["other"], expected[1], rtol=1e-6)


# ------------------------------------------------------------------------ refusals

def _error(m, match, **options):
    with pytest.raises(GraphError, match=match):
        compile_model(m, **options)


def test_unsupported_operator_is_named():
    m = model([helper.make_node("Sin", ["x"], ["y"], name="act7")], [("x", [2, 3])], [("y", None)])
    _error(m, r"node act7 \(Sin\): operator Sin is not supported; supported: Conv, ConvTranspose, Gemm")


def test_refusals():
    x = [("x", [1, 2, 5, 5])]
    w = {"w": np.ones((2, 2, 3, 3), np.float32)}
    _error(model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [1])], opset=6),
           "opset 6; gemforge reads opsets 7 and newer")
    _error(model([helper.make_node("Conv", ["x", "w"], ["y"], dilations=[0, 1], name="c")], x, [("y", [1])], w),
           r"dilations must be two positive integers, not \[0, 1\]")
    _error(model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[2, 0, 0, 0], name="p")], x,
                 [("y", [1])]), r"node p \(max_pool\): padding \[2, 0, 0, 0\] \(top, left, bottom, right\) must be smaller")
    _error(model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[3, 1], pads=[1, 0, 1, 0],
                                   name="p")], [("x", [1, 2, 2, 5])], [("y", [1])]), "has no tap inside the input's 2 rows")
    _error(model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[1, 1], strides=[3, 3],
                                   auto_pad="SAME_UPPER", name="p")], x, [("y", [1])]),
           r"window \(1\) shorter than the stride \(3\) is not supported")
    _error(model([helper.make_node("Conv", ["x", "v"], ["y"], dilations=[2, 2], name="c")], x + [("v", [2, 2, 3, 3])],
                 [("y", [1])]), r"a computed weight W is supported with equal strides and no dilation")
    _error(model([helper.make_node("Add", ["x", "z"], ["y"], name="a")], x + [("z", [3, 5])], [("y", [1])]),
           "do not broadcast")
    _error(model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, "H"])], [("y", [1])]), "symbolic dimension 1")
    with pytest.raises(GraphError, match="not an ONNX file"):
        compile_model(b"\x00garbage\xff" * 10)
    with pytest.raises(GraphError, match="needs calibration samples"):
        compile_model(model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [1])]), quantize="int8")


def _have_gpu() -> bool:
    from gemforge.compiler.backends.gpu import cuda
    return cuda.available()


@pytest.mark.skipif(not _have_gpu(), reason="no GPU here (no CUDA driver or device): the float32 network on the "
                                            "GPU runs where one is")
def test_float_network_on_the_gpu():
    rng = np.random.default_rng(11)
    m = small_cnn(rng, channels=16, image=8, batch=2)
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    expected = ort_run(m, {"input": x})[0]
    got = compile_model(m).run(x, "gpu")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
    from gemforge.models import build_resnet18
    r = build_resnet18(image=64, width=16, classes=10)
    x = rng.normal(size=(1, 3, 64, 64)).astype(np.float32)
    expected = ort_run(r, {"input": x})[0]
    got = compile_model(r).run(x, "gpu")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


def test_float_network_compiles_for_the_gpu():
    """Every node of a float network builds for an sm_90 GPU here too (PTX checked by ptxas where present)."""
    from gemforge.compiler.graph.cpu_kernels import host_kernel
    from gemforge.compiler.target import GpuTarget
    model = compile_model(small_cnn(np.random.default_rng(12), batch=2))
    kinds = {n.op: type(host_kernel(model.graph, n, GpuTarget("sm_90")).op).__name__ for n in model.graph.nodes}
    assert kinds["conv2d"] == kinds["dense"] == kinds["max_pool"] == "CompiledOp"
    assert kinds["concat"] == kinds["reshape"] == "NoneType"      # data movement, on the host


@pytest.mark.parametrize("nodes, initializers, columns", [
    ([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], {"w": np.zeros((3, 0), np.float32)}, 3),
    ([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1, name="mm")], {"w": np.zeros((0, 3), np.float32)}, 3),
    ([helper.make_node("Mul", ["x", "w"], ["y"], name="mm")], {"w": np.zeros((0,), np.float32)}, 1),
])
def test_an_empty_result_is_refused_when_compiling(nodes, initializers, columns):
    """A zero-size weight gives an empty tensor (ONNX Runtime returns one), which no kernel
    computes: refused by name at compile time, not when the compiled model runs."""
    m = model(nodes, [("x", [2, columns])], [("y", [2, 0])], initializers)
    _error(m, r"node mm \((dense|mul)\): its output would have shape \[2, 0\], with no elements")
    q = dict(quantize="int8", calibrate=np.ones((2, 2, columns), np.float32))
    _error(m, "with no elements", **q)


@pytest.mark.parametrize("a_shape", [(2, 3, 4), (4,)])
def test_a_constant_left_operand_of_other_rank_times_an_input(a_shape):
    """MatMul of a constant [2, 3, 4] or [4] by the input [4, 5] (once refused): numpy's matmul,
    as ONNX Runtime computes it."""
    m = model([helper.make_node("MatMul", ["a", "x"], ["y"], name="mm")], [("x", [4, 5])], [("y", None)],
              {"a": np.arange(np.prod(a_shape), dtype=np.float32).reshape(a_shape)})
    x = np.random.default_rng(4).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5)


@pytest.mark.parametrize("flag, value, inputs, x_shape, a", [
    ("transA", 2, ["x", "w"], [3, 2], np.ones((3, 4), np.float32)),      # a variable A: said 'transA=1'
    ("transA", 2, ["w", "x"], [3, 4], np.ones((3, 2), np.float32)),      # a constant A
    ("transB", 2, ["x", "w"], [2, 3], np.ones((4, 3), np.float32)),
    ("transB", -1, ["x", "w"], [2, 3], np.ones((4, 3), np.float32)),
])
def test_a_gemm_transpose_flag_other_than_0_or_1_is_refused(flag, value, inputs, x_shape, a):
    """ONNX's transA and transB are 0 or 1: another value is refused naming it (a variable A with
    transA=2 was refused as 'transA=1'; other cases compiled it as 1)."""
    m = model([helper.make_node("Gemm", inputs, ["y"], name="g", **{flag: value})], [("x", x_shape)], [("y", None)],
              {"w": a})
    _error(m, rf"node g \(Gemm\): {flag} must be 0 or 1, not {value}$")
