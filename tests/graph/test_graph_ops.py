"""The operators added to the first set — Squeeze, Unsqueeze, Transpose, Sub, Div, Neg, the float
functions (Sigmoid, Tanh, Exp, Log, LeakyRelu, Sqrt, Abs, Pow of 2), ReduceMean and Pad, and the
operators composed of others (HardSigmoid, HardSwish, GlobalMaxPool, Sum, Mean, Max, Min,
Reciprocal) — against ONNX
Runtime: float32 on the cpu, int8 on fsim and the cpu (bit-identical, and equal to the graph's
numpy semantics), random shapes and data; their refusals, how they treat a batch, how the GPU back
end takes them, and the .gfm round trip of every one."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gemforge.compiler.graph import GraphError
from gemforge.compiler.graph.evaluate import evaluate
from gemforge.compiler.graph.quantize import FLOAT_ONLY
from gemforge.driver.runtime.model import Model, compile_model
from onnx_models import model, ort_run

pytest.importorskip("onnxruntime")
N = helper.make_node


def _normal(rng, shape) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def _by_name(compiled: Model, result) -> dict[str, np.ndarray]:
    return result if isinstance(result, dict) else {compiled.outputs[0]: result}


def _same_as_onnx_runtime(m, feeds: dict[str, np.ndarray], rng, *, int8: bool = True, rtol: float = 1e-5,
                          int8_tol: float = 0.05):
    """The float32 network (and the graph's numpy semantics) equals ONNX Runtime within ``rtol``
    on the cpu. The int8 network, calibrated on ``feeds`` and a few samples like them (negated,
    shuffled), gives the same bits on fsim and the cpu, and in numpy (up to an int8 step where a
    float32 path feeds it), within ``int8_tol`` of the largest output of ONNX Runtime."""
    expected = dict(zip([o.name for o in m.graph.output], ort_run(m, feeds)))
    scale = max(float(np.max(np.abs(e[np.isfinite(e)]), initial=0)) for e in expected.values()) or 1.0
    arg = feeds if len(feeds) > 1 else next(iter(feeds.values()))
    compiled = compile_model(m)
    got, ref = _by_name(compiled, compiled.run(arg, "cpu")), evaluate(compiled.graph, feeds)
    for name, e in expected.items():
        assert got[name].shape == e.shape and got[name].dtype == np.float32, (name, got[name].shape, e.shape)
        np.testing.assert_allclose(got[name], e, rtol=rtol, atol=rtol * scale)
        np.testing.assert_allclose(ref[name], e, rtol=rtol, atol=rtol * scale)
    if not int8:
        return
    samples = {k: np.stack([v, -v, *(rng.permutation(v.ravel()).reshape(v.shape) for _ in range(2))])
               for k, v in feeds.items()}
    q = compile_model(m, quantize="int8", calibrate=samples, config="tiny")
    got, on_fsim, ref = _by_name(q, q.run(arg, "cpu")), _by_name(q, q.run(arg, "fsim")), evaluate(q.graph, feeds)
    # numpy computes a float32 path in float64: a result an ulp apart may round to the next int8 step.
    floating = any(node.op in FLOAT_ONLY for node in q.graph.nodes)
    step = max((2.0 ** -v.exponent for v in q.graph.values.values() if v.dtype == "int8"), default=0.0)
    for name, e in expected.items():
        assert got[name].shape == e.shape and got[name].dtype == np.float32, (name, got[name].shape, e.shape)
        np.testing.assert_array_equal(on_fsim[name], got[name])
        np.testing.assert_allclose(ref[name], got[name], rtol=1e-5 if floating else 0, atol=step if floating else 0)
        assert np.abs(got[name] - e).max() <= int8_tol * scale, (name, np.abs(got[name] - e).max(), scale)


# ------------------------------------------------------------------------ Squeeze, Unsqueeze, Transpose

@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_transpose_of_every_rank(rank):
    """A random permutation and the default (the axes reversed), in float32 and int8; rank 4 after
    a convolution, so that the transposed tensor comes from the accelerator."""
    rng = np.random.default_rng(rank)
    shape = [int(d) for d in rng.integers(1, 6, rank)]
    perm = [int(p) for p in rng.permutation(rank)]
    nodes, inputs, init = [], "x", {}
    if rank == 4:
        shape[1] = 4
        init["w"] = rng.normal(0, 0.4, (4, 4, 3, 3)).astype(np.float32)
        nodes.append(N("Conv", ["x", "w"], ["c"], pads=[1] * 4))
        inputs = "c"
    nodes += [N("Transpose", [inputs], ["y"], perm=perm), N("Transpose", [inputs], ["z"])]
    m = model(nodes, [("x", shape)], [("y", None), ("z", None)], init)
    _same_as_onnx_runtime(m, {"x": _normal(rng, shape)}, rng)


def test_transpose_of_a_scalar_and_of_integer_constants():
    rng = np.random.default_rng(10)
    m = model([N("Transpose", ["x"], ["y"])], [("x", [])], [("y", [])])
    _same_as_onnx_runtime(m, {"x": np.array(-1.5, np.float32)}, rng, int8=False)
    # An int64 shape transposed (folded at import) reshapes the input.
    m = model([N("Transpose", ["s"], ["t"]), N("Reshape", ["t", "flat"], ["f"]), N("Reshape", ["x", "f"], ["y"])],
              [("x", [2, 3, 4])], [("y", [4, 6])], {"s": np.int64([[4], [6]]), "flat": np.int64([-1])})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 4))}, rng)


@pytest.mark.parametrize("nodes, shape, axes", [
    ([N("Squeeze", ["x"], ["y"])], [1, 3, 1, 2, 1], None),                          # every axis of size 1
    ([N("Squeeze", ["x", "a"], ["y"])], [1, 3, 1, 2, 1], np.int64([])),              # as ONNX Runtime: the same
    ([N("Squeeze", ["x", "a"], ["y"])], [1, 3, 1, 2, 1], np.int64([-1, 0, -5])),     # negative, repeated
    ([N("Squeeze", ["x"], ["y"])], [1, 1], None),                                   # to a scalar
    ([N("Unsqueeze", ["x", "a"], ["y"])], [3, 2], np.int64([4, 0, -3])),             # unsorted, negative
    ([N("Unsqueeze", ["x", "a"], ["y"])], [], np.int64([0])),                        # a scalar
    ([N("Unsqueeze", ["x", "a"], ["y"])], [3, 2], np.int64(1)),                      # 0-d axes: ONNX Runtime's one axis
    ([N("Unsqueeze", ["x", "a"], ["u"]), N("Squeeze", ["u", "a"], ["y"])], [2, 3], np.int64([1])),
])
def test_squeeze_and_unsqueeze(nodes, shape, axes):
    rng = np.random.default_rng(len(shape))
    init = {} if axes is None else {"a": axes}
    m = model(nodes, [("x", shape)], [("y", None)], init)
    _same_as_onnx_runtime(m, {"x": _normal(rng, shape)}, rng)


@pytest.mark.parametrize("node, shape, init, match", [
    (N("Squeeze", ["x", "a"], ["y"], name="s"), [1, 3], {}, r"node s \(Squeeze\): the axes must be a constant"),
    (N("Squeeze", ["x", "a"], ["y"], name="s"), [1, 3], {"a": np.int64([1])},
     r"node s \(reshape\): it squeezes axes of size 1 only, not axis 1 \(3\) of \[1, 3\]"),
    (N("Squeeze", ["x", "a"], ["y"], name="s"), [1, 3], {"a": np.int64([2])},
     r"node s \(reshape\): axes \[2\] are out of range for rank 2 \(from -2 to 1\)"),
    (N("Squeeze", ["x", "a"], ["y"], name="s"), [1, 3], {"a": np.float32([0])},
     r"node s \(Squeeze\): the axes must be a 1-D int64 tensor, not float32 of shape \[1\]"),
    (N("Unsqueeze", ["x", "a"], ["y"], name="u"), [2, 3], {"a": np.int64([1, -3])},
     r"node u \(reshape\): axes \[1, -3\] name an axis of the rank-4 output twice"),
    (N("Unsqueeze", ["x", "a"], ["y"], name="u"), [2, 3], {"a": np.int64([3])},
     r"node u \(reshape\): axes \[3\] are out of range for rank 3 \(from -3 to 2\)"),
    (N("Transpose", ["x"], ["y"], perm=[1, 1], name="t"), [2, 3], {},
     r"node t \(transpose\): perm \[1, 1\] must be a permutation of the input's axes, \[0, 1\]"),
    (N("Transpose", ["x"], ["y"], perm=[-1, 0], name="t"), [2, 3], {}, r"perm \[-1, 0\] must be a permutation"),
    (N("Transpose", ["x"], ["y"], perm=[0], name="t"), [2, 3], {}, r"perm \[0\] must be a permutation"),
    # More than numpy's 64 axes (ONNX Runtime refuses them too).
    (N("Unsqueeze", ["x", "a"], ["y"], name="u"), [2, 3], {"a": np.arange(63, dtype=np.int64)},
     r"^node u \(reshape\): its output would have 65 axes, more than the 64 gemforge compiles \(numpy's limit\)$"),
    (N("Reshape", ["x", "s"], ["y"], name="r"), [2, 3], {"s": np.int64([2, 3] + [1] * 98)},
     r"^node r \(reshape\): its output would have 100 axes, more than the 64 gemforge compiles"),
])
def test_layout_refusals(node, shape, init, match):
    inputs = [("x", shape)] + ([("a", [1])] if "a" in node.input and "a" not in init else [])
    m = model([node], inputs, [("y", [1])], init)
    with pytest.raises(GraphError, match=match) as info:
        compile_model(m)
    assert "\n" not in str(info.value)


def test_up_to_64_axes():
    """numpy's limit: 64 axes compile and run as in ONNX Runtime; 65, from a constant folded at
    import or a model input, are refused by name (numpy failed on them when run or folded)."""
    rng = np.random.default_rng(21)
    m = model([N("Unsqueeze", ["x", "a"], ["y"])], [("x", [2, 3])], [("y", None)], {"a": np.arange(62, dtype=np.int64)})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3))}, rng)
    m = model([N("Unsqueeze", ["c", "a"], ["u"], name="u"), N("Add", ["x", "u"], ["y"])], [("x", [3])], [("y", None)],
              {"c": np.float32([1, 2, 3]), "a": np.arange(64, dtype=np.int64)})
    with pytest.raises(GraphError, match=r"^node u \(reshape\): its output would have 65 axes, more than the 64"):
        compile_model(m)
    m = model([N("Relu", ["x"], ["y"])], [("x", [1] * 65)], [("y", [1] * 65)])
    with pytest.raises(GraphError, match=r"^model input 'x' has 65 axes, more than the 64 gemforge compiles"):
        compile_model(m)


def test_layout_operators_on_a_batch():
    """Transpose and Unsqueeze that keep axis 0 run a multiple of the compiled batch in chunks,
    as ONNX Runtime runs it whole; one that moves the batch axis is named when asked to."""
    rng = np.random.default_rng(20)
    w = rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32)
    keep = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
                  N("Unsqueeze", ["t", "a"], ["u"]), N("Squeeze", ["u", "a"], ["y"])],
                 [("x", ["N", 3, 4, 4])], [("y", ["N", 4, 4, 4])], {"w": w, "a": np.int64([1])})
    x = _normal(rng, (6, 3, 4, 4))
    expected = ort_run(keep, {"x": x})[0]
    q = compile_model(keep, quantize="int8", calibrate=x[:, None], config="tiny", batch=1)
    np.testing.assert_array_equal(q.run(x, "fsim"), q.run(x, "cpu"))
    assert np.abs(q.run(x, "cpu") - expected).max() <= 0.05 * np.abs(expected).max()
    np.testing.assert_allclose(compile_model(keep).run(x, "cpu"), expected, rtol=1e-5, atol=1e-5)
    moves = model([N("Transpose", ["x"], ["y"], perm=[1, 0, 2, 3], name="swap")], [("x", ["N", 3, 4, 4])],
                  [("y", [3, "N", 4, 4])])
    with pytest.raises(GraphError, match=r"node swap \(transpose\): it moves the batch axis; compile it with "
                                         "--batch 6"):
        compile_model(moves).run(x, "cpu")
    squeezes = model([N("Squeeze", ["x"], ["y"], name="sq")], [("x", ["N", 3, 1])], [("y", [3])])
    with pytest.raises(GraphError, match=r"node sq \(reshape\): it reshapes across the batch axis"):
        compile_model(squeezes).run(_normal(rng, (2, 3, 1)), "cpu")



# ------------------------------------------------------------------------ Sub, Div, Neg

def _away_from_zero(rng, shape) -> np.ndarray:
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


@pytest.mark.parametrize("op", ["Sub", "Div"])
@pytest.mark.parametrize("x_shape, y_shape", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((4,), (2, 3, 1)),
                                              ((1, 4), (3, 1)), ((), (2, 3))])
def test_sub_and_div_broadcast_both_ways(op, x_shape, y_shape):
    """Either operand may be the smaller one (a kernel that swapped them would flip the sign)."""
    rng = np.random.default_rng(len(x_shape) * 10 + len(y_shape))
    m = model([N(op, ["x", "y"], ["z"])], [("x", list(x_shape)), ("y", list(y_shape))], [("z", None)])
    _same_as_onnx_runtime(m, {"x": _normal(rng, x_shape), "y": _away_from_zero(rng, y_shape)}, rng)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
def test_broadcasting_beyond_32_axes(op):
    """np.broadcast_shapes takes at most 32 axes: a 40-axis operator failed with its RuntimeError.
    Incompatible shapes of that rank are refused by name."""
    rng = np.random.default_rng(32)
    x_shape, y_shape = [1] * 37 + [2, 1, 3], [2] + [1] * 36 + [1, 4, 3]
    if op == "Pow":
        m = model([N(op, ["x", "y"], ["z"])], [("x", x_shape)], [("z", None)], {"y": np.full(y_shape, 2, np.float32)})
        _same_as_onnx_runtime(m, {"x": _normal(rng, x_shape)}, rng)
        return
    m = model([N(op, ["x", "y"], ["z"])], [("x", x_shape), ("y", y_shape)], [("z", None)])
    _same_as_onnx_runtime(m, {"x": _normal(rng, x_shape), "y": _away_from_zero(rng, y_shape)}, rng)
    m = model([N(op, ["x", "y"], ["z"], name="b")], [("x", x_shape), ("y", y_shape[:-1] + [2])], [("z", x_shape)])
    with pytest.raises(GraphError, match=rf"^node b \({op.lower()}\): shapes \[1, 1, .*, 2, 1, 3\] and "
                                         r"\[2, 1, .*, 1, 4, 2\] do not broadcast$"):
        compile_model(m)


@pytest.mark.parametrize("op", ["Sub", "Div"])
def test_sub_and_div_with_a_constant_on_either_side(op):
    rng = np.random.default_rng(30)
    m = model([N(op, ["x", "c"], ["a"]), N(op, ["c", "y"], ["b"]), N("Add", ["a", "b"], ["z"])],
              [("x", [2, 3, 4]), ("y", [2, 3, 4])], [("z", None)], {"c": _away_from_zero(rng, (3, 1))})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 4)), "y": _away_from_zero(rng, (2, 3, 4))}, rng)


def test_division_by_zero_gives_inf_and_nan_as_onnx_runtime_does():
    """Float32 only: an int8 network cannot be calibrated where a tensor is infinite or NaN."""
    x = np.float32([1, -1, 0, 2, -0.0, np.inf])
    y = np.float32([0, 0, 0, -0.0, 1, np.inf])
    m = model([N("Div", ["x", "y"], ["z"])], [("x", [6]), ("y", [6])], [("z", None)])
    expected = ort_run(m, {"x": x, "y": y})[0]
    np.testing.assert_array_equal(expected, [np.inf, -np.inf, np.nan, -np.inf, -0.0, np.nan])
    compiled = compile_model(m)
    np.testing.assert_array_equal(compiled.run({"x": x, "y": y}, "cpu"), expected)
    np.testing.assert_array_equal(evaluate(compiled.graph, {"x": x, "y": y})["z"], expected)


def test_neg():
    """x · (−1), exactly, in float32 and in int8 (after a convolution on the accelerator)."""
    rng = np.random.default_rng(31)
    w = rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32)
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Neg", ["c"], ["y"]), N("Neg", ["x"], ["z"])],
              [("x", [1, 3, 5, 5])], [("y", None), ("z", None)], {"w": w})
    x = _normal(rng, (1, 3, 5, 5))
    _same_as_onnx_runtime(m, {"x": x}, rng)
    q = compile_model(m, quantize="int8", calibrate=np.stack([x, -x]), config="tiny")
    by_layer = evaluate(q.graph, {"x": x}, keep=True)
    for tensor in ("c", "x"):
        q_in = next(n for n in q.graph.nodes if n.output.startswith(f"{tensor}/q")).output
        q_out = next(n for n in q.graph.nodes if n.inputs[0] == q_in and n.op == "mul").output
        assert q.graph.values[q_in].exponent == q.graph.values[q_out].exponent
        np.testing.assert_array_equal(by_layer[q_out], np.minimum(-by_layer[q_in].astype(np.int16), 127))
    # Of an integer constant (a shape computed in the model), folded at import.
    m = model([N("Neg", ["s"], ["t"]), N("Reshape", ["x", "t"], ["y"])], [("x", [2, 3, 4])], [("y", [6, 4])],
              {"s": np.int64([-6, -4])})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 4))}, rng, int8=False)



# ------------------------------------------------------------------------ float functions

@pytest.mark.parametrize("op, attrs", [("Sigmoid", {}), ("Tanh", {}), ("Exp", {}), ("Sqrt", {}), ("Abs", {}),
                                       ("LeakyRelu", {}), ("LeakyRelu", {"alpha": -0.3}), ("Pow", {})])
def test_float_functions(op, attrs):
    """Between a convolution and a multiply: the int8 network computes the function in float32
    from the convolution's dequantized output (the accelerator's, on fsim), and the multiply
    quantizes its result. Its error is the input's rounding carried through the function
    (within 15 % of the largest output, as for a whole network, where the function is steep)."""
    rng = np.random.default_rng(sum(map(ord, op)) + len(attrs))
    init = {"w": rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32), "k": _away_from_zero(rng, (4, 1, 1))}
    nodes = [N("Conv", ["x", "w"], ["c"], pads=[1] * 4)]
    if op == "Sqrt":
        nodes.append(N("Abs", ["c"], ["c_abs"]))
    if op == "Pow":
        init["two"] = np.float32(2)
    nodes += [N(op, [nodes[-1].output[0]] + (["two"] if op == "Pow" else []), ["f"], **attrs),
              N("Mul", ["f", "k"], ["y"])]
    m = model(nodes, [("x", [2, 3, 5, 6])], [("y", None)], init)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 5, 6))}, rng, int8_tol=0.15)


def test_float_function_kernels():
    """The kernels against ONNX Runtime and, more tightly, against the graph's float64 semantics,
    over a wide range and at ±inf, NaN, ±0 and values whose exponentials overflow or vanish.
    ONNX Runtime's Sigmoid and Tanh are approximations good to about 1e-7 absolute."""
    x = np.concatenate([np.random.default_rng(52).normal(0, 8, 500),
                        [-np.inf, -100, -20, -1e-8, -0.0, 0.0, 1e-8, 0.5, 20, 88.5, 100, np.inf, np.nan]])
    x = x.astype(np.float32)
    for op in ("Sigmoid", "Tanh", "Exp", "Sqrt", "Abs", "LeakyRelu"):
        m = model([N(op, ["x"], ["y"])], [("x", [len(x)])], [("y", None)])
        expected = ort_run(m, {"x": x})[0]
        compiled = compile_model(m)
        got = compiled.run(x, "cpu")
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=op)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=op)
        np.testing.assert_allclose(got, evaluate(compiled.graph, {"x": x})["y"], rtol=1e-6, atol=1e-37, err_msg=op)


# ------------------------------------------------------------------------ composed operators

def _survives_save_and_load(m, x: np.ndarray, tmp_path) -> None:
    """The float32 network and the int8 one (on tiny) saved to a .gfm and loaded: the same
    nodes, and the same bits on the cpu (and fsim)."""
    for options in ({}, {"quantize": "int8", "calibrate": np.stack([x, -x]), "config": "tiny"}):
        compiled = compile_model(m, **options)
        compiled.save(tmp_path / "m.gfm")
        loaded = Model.load(tmp_path / "m.gfm")
        assert [n.describe() for n in loaded.graph.nodes] == [n.describe() for n in compiled.graph.nodes]
        for device in ("cpu", "fsim") if options else ("cpu",):
            np.testing.assert_array_equal(loaded.run(x, device), compiled.run(x, device))



@pytest.mark.parametrize("op, attrs", [("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.35, "beta": 0.3}),
                                       ("HardSigmoid", {"alpha": -0.5, "beta": 0.8}), ("HardSwish", {}),
                                       ("GlobalMaxPool", {})])
def test_hard_sigmoid_hard_swish_and_global_max_pool(op, attrs):
    """After a convolution (the accelerator's, in int8): HardSigmoid and HardSwish import as a
    product, a sum and a clip (and HardSwish's product by x), so the int8 network keeps them
    in int8; GlobalMaxPool is a max pool over the whole image."""
    rng = np.random.default_rng(sum(map(ord, op)) + len(attrs))
    w = rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    h, wd = (int(d) for d in rng.integers(2, 8, 2))
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N(op, ["c"], ["y"], **attrs)],
              [("x", [2, 3, h, wd])], [("y", None)], {"w": w}, opset=14)
    # A HardSigmoid's output spans [0, 1] while its input's int8 step is that of a convolution
    # reaching ±20 (2^-2): alpha times half that step is its own error, up to 10 % of the output.
    _same_as_onnx_runtime(m, {"x": 3 * _normal(rng, (2, 3, h, wd))}, rng,
                          int8_tol=0.12 if op == "HardSigmoid" else 0.05)
    q = compile_model(m, quantize="int8", calibrate=3 * _normal(rng, (3, 2, 3, h, wd)))
    assert not any(node.op in FLOAT_ONLY for node in q.graph.nodes)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_variadic_operators_with_broadcasting(op, count):
    """Sum, Mean, Max and Min of one to four operands of broadcast shapes (a constant among
    them from three on): a chain of binary nodes, left to right; Mean divides the sum by the
    count; Max and Min run in float32 in an int8 network."""
    rng = np.random.default_rng(count * 7 + len(op))
    shapes = [(2, 3, 4), (3, 1), (4,), (1, 3, 4)][:count]
    names = [f"x{i}" for i in range(count)]
    init = {}
    if count >= 3:
        init[names[-1]] = _normal(rng, shapes[-1])
    inputs = [(n, list(s)) for n, s in zip(names, shapes) if n not in init]
    m = model([N(op, names, ["y"])], inputs, [("y", None)], init)
    _same_as_onnx_runtime(m, {n: _normal(rng, s) for n, s in zip(names, shapes) if n not in init}, rng)


def test_max_and_min_propagate_nan_and_keep_infinities():
    x = np.float32([np.nan, 1, -np.inf, np.inf, -0.0, 3])
    y = np.float32([0, np.nan, 5, -2, 0.0, -np.inf])
    for op in ("Max", "Min"):
        m = model([N(op, ["x", "y"], ["z"])], [("x", [6]), ("y", [6])], [("z", None)])
        expected = ort_run(m, {"x": x, "y": y})[0]
        got = compile_model(m).run({"x": x, "y": y}, "cpu")
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=op)
        np.testing.assert_array_equal(got[~np.isnan(got)], expected[~np.isnan(expected)], err_msg=op)


def test_log_and_reciprocal():
    """Log is a float function (−inf at 0, NaN below, as ONNX Runtime gives); Reciprocal is a
    division of 1 by x (±inf at ±0)."""
    x = np.concatenate([np.random.default_rng(61).uniform(-3, 40, 300), [0, -0.0, 1e-38, np.inf, -1, np.nan]])
    x = x.astype(np.float32)
    for op in ("Log", "Reciprocal"):
        m = model([N(op, ["x"], ["y"])], [("x", [len(x)])], [("y", None)])
        expected = ort_run(m, {"x": x})[0]
        compiled = compile_model(m)
        got = compiled.run(x, "cpu")
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=op)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0, err_msg=op)
        np.testing.assert_array_equal(got, evaluate(compiled.graph, {"x": x})["y"], err_msg=op)
    # Within a network, on the accelerator's outputs (in float32 there, like exp).
    rng = np.random.default_rng(62)
    m = model([N("Conv", ["x", "w"], ["c"]), N("Abs", ["c"], ["a"]), N("Add", ["a", "one"], ["p"]),
               N("Log", ["p"], ["l"]), N("Reciprocal", ["p"], ["r"]), N("Add", ["l", "r"], ["y"])],
              [("x", [1, 3, 6, 6])], [("y", None)],
              {"w": rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "one": np.float32(1)})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (1, 3, 6, 6))}, rng, int8_tol=0.1)


def test_composed_operators_survive_save_and_load(tmp_path):
    rng = np.random.default_rng(63)
    w = rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("HardSwish", ["c"], ["h"]), N("Abs", ["c"], ["a"]),
               N("Max", ["h", "a", "k"], ["mx"]), N("Min", ["mx", "a"], ["mn"]), N("Add", ["mn", "k"], ["p"]),
               N("Log", ["p"], ["l"]), N("GlobalMaxPool", ["l"], ["y"])],
              [("x", [1, 3, 5, 5])], [("y", None)], {"w": w, "k": np.float32(0.5)}, opset=14)
    x = _normal(rng, (1, 3, 5, 5))
    _survives_save_and_load(m, x, tmp_path)


@pytest.mark.parametrize("node, match", [
    # ONNX's checker already refuses these (the importer checks every model).
    (N("Sum", [], ["y"], name="s"), r"^the ONNX model is invalid: .*Sum"),
    (N("HardSwish", ["x"], ["y"], alpha=0.5, name="h"), r"^the ONNX model is invalid: Unrecognized attribute: alpha"),
    (N("HardSigmoid", ["x"], ["y"], alpha=float("nan"), name="h"),
     r"node h \(HardSigmoid\): alpha must be a finite number, not nan"),
])
def test_composed_operator_refusals(node, match):
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    with pytest.raises(GraphError, match=match):
        compile_model(m)


@pytest.mark.parametrize("node, init, match", [
    (N("Pow", ["x", "p"], ["y"], name="p"), {"p": np.float32(0)},
     r"node p \(Pow\): an exponent of 0 \(a tensor of ones\) is not supported"),
    (N("Pow", ["x", "p"], ["y"], name="p"), {"p": np.float32([2, 3.5, 2])},
     r"node p \(Pow\): an exponent Y whose elements differ \(\[2\.0, 3\.5\]…\) must have no integer element"),
    (N("Pow", ["x", "p"], ["y"], name="p"), {"p": np.zeros(0, np.float32)}, r"must be a non-empty numeric constant"),
    (N("Pow", ["x", "p"], ["y"], name="p"), {"p": np.float32(65)}, r"an integer exponent must be within ±64, not 65"),
    (N("Celu", ["x"], ["y"], alpha=0.0, name="c"), {}, r"node c \(Celu\): alpha must not be 0"),
    (N("Elu", ["x"], ["y"], alpha=float("nan"), name="e"), {}, r"node e \(Elu\): alpha must be a finite number"),
    (N("Pow", ["x", "p"], ["y"], name="p"), {}, r"node p \(Pow\): the exponent Y must be a constant"),
    (N("LeakyRelu", ["x"], ["y"], alpha=float("inf"), name="l"), {},
     r"node l \(LeakyRelu\): alpha must be a finite number, not inf"),
])
def test_float_function_refusals(node, init, match):
    inputs = [("x", [2, 3])] + ([("p", [])] if "p" in node.input and "p" not in init else [])
    with pytest.raises(GraphError, match=match):
        compile_model(model([node], inputs, [("y", [2, 3])], init))


@pytest.mark.parametrize("x_shape, p_shape", [((3,), (1, 1)), ((), (2,)), ((2, 3), (4, 1, 3))])
def test_pow_with_an_exponent_of_twos_of_higher_rank_broadcasts_as_onnx_runtime_does(x_shape, p_shape):
    """An exponent of any shape whose elements are all 2: one element or many (a Y of shape [2]
    beside a scalar x was refused as though it were not 2)."""
    rng = np.random.default_rng(50)
    m = model([N("Pow", ["x", "p"], ["y"])], [("x", list(x_shape))], [("y", list(np.broadcast_shapes(x_shape, p_shape)))],
              {"p": np.full(p_shape, 2, np.float32)})
    _same_as_onnx_runtime(m, {"x": _normal(rng, x_shape)}, rng)



# ------------------------------------------------------------------------ activations of exporters

_ACTIVATIONS = [
    ("Elu", {}, 13), ("Elu", {"alpha": 0.4}, 13), ("Selu", {}, 13), ("Selu", {"alpha": 1.2, "gamma": 0.9}, 13),
    ("Celu", {"alpha": 2.0}, 13), ("Softplus", {}, 13), ("Softsign", {}, 13), ("Erf", {}, 13),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20), ("Mish", {}, 18),
    ("ThresholdedRelu", {}, 13), ("ThresholdedRelu", {"alpha": -0.5}, 13),
]


@pytest.mark.parametrize("op, attrs, opset", _ACTIVATIONS)
def test_activation_kernels_against_onnx_runtime(op, attrs, opset):
    """Each activation over a wide range and where its pieces overflow, vanish or switch
    (±inf, NaN, ±0, exponentials past float32's range), against ONNX Runtime and the graph's
    float64 semantics."""
    x = np.concatenate([np.random.default_rng(len(op)).normal(0, 4, 400), np.linspace(-5, 5, 101),
                        [-np.inf, -100, -20, -1e-8, -0.0, 0.0, 1e-8, 0.5, 20, 88.5, 100, np.inf, np.nan]])
    x = x.astype(np.float32)
    m = model([N(op, ["x"], ["y"], **attrs)], [("x", [len(x)])], [("y", [len(x)])], opset=opset)
    expected = ort_run(m, {"x": x})[0]
    compiled = compile_model(m)
    got = compiled.run(x, "cpu")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(evaluate(compiled.graph, {"x": x})["y"], expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op, attrs, opset", [a for a in _ACTIVATIONS if a[0] in ("Elu", "Softplus", "Gelu", "Mish")])
def test_activations_in_an_int8_network(op, attrs, opset):
    """After a convolution: float32 against ONNX Runtime, and the int8 network (the function a
    float32 island) alike on fsim and the cpu."""
    rng = np.random.default_rng(sum(map(ord, op)))
    init = {"w": rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32), "k": _away_from_zero(rng, (4, 1, 1))}
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N(op, ["c"], ["f"], **attrs), N("Mul", ["f", "k"], ["y"])],
              [("x", [2, 3, 5, 6])], [("y", None)], init, opset=opset)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 5, 6))}, rng, int8_tol=0.15)


@pytest.mark.parametrize("slope_shape", [(), (1,), (4, 1, 1), (6,)])
def test_prelu_with_its_slope_broadcast(slope_shape):
    """PRelu of a convolution's output, its slope per channel, one for all or per column: float32
    as ONNX Runtime, and int8 alike on fsim and the cpu (composed of operators with int8 forms)."""
    rng = np.random.default_rng(len(slope_shape))
    init = {"w": rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32),
            "slope": rng.uniform(-0.5, 0.5, slope_shape).astype(np.float32)}
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("PRelu", ["c", "slope"], ["y"])],
              [("x", [2, 3, 5, 6])], [("y", None)], init)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 5, 6))}, rng, int8_tol=0.1)


@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 4.0, 7.0, 13.0, -1.0, -2.0, 0.5, 1.7, -0.3])
def test_pow_of_a_constant_exponent(exponent):
    """Integer exponents as squares and products (negative bases too), ½ as a square root,
    others as exp(e · log x) (NaN for negative bases, as pow gives)."""
    rng = np.random.default_rng(int(exponent * 10) % 97)
    x = rng.uniform(-3, 3, (3, 7)).astype(np.float32)
    x[0, :3] = (0.0, -0.0, 1.0)
    m = model([N("Pow", ["x", "p"], ["y"])], [("x", [3, 7])], [("y", [3, 7])], {"p": np.float32(exponent)})
    expected = ort_run(m, {"x": x})[0]
    got = compile_model(m).run(x, "cpu")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_pow_of_an_exponent_per_element():
    rng = np.random.default_rng(5)
    x = rng.uniform(0.1, 3, (2, 3)).astype(np.float32)
    m = model([N("Pow", ["x", "p"], ["y"])], [("x", [2, 3])], [("y", [2, 3])], {"p": np.float32([[0.5, 1.5, -2.5]])})
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5)


# ------------------------------------------------------------------------ ReduceMean, Pad

@pytest.mark.parametrize("shape, attrs, axes, opset", [
    ((2, 3, 4, 5), {}, [2, 3], 18),                                 # axes as an input (opset 18)
    ((2, 3, 4, 5), {"axes": [-1, 1], "keepdims": 0}, None, 13),
    ((3, 4), {}, None, 13),                                          # every axis
    ((2, 3, 4), {"keepdims": 0}, None, 13),                          # every axis, to a scalar
    ((2, 3, 4), {"noop_with_empty_axes": 1}, [], 18),                # no axes: the input as it is
])
def test_reduce_mean(shape, attrs, axes, opset):
    """After a ReLU, so that the int8 network averages a dequantized int8 tensor in float32."""
    rng = np.random.default_rng(len(shape) + len(attrs) + opset)
    inputs = ["r"] + (["a"] if axes is not None else [])
    init = {} if axes is None else {"a": np.int64(axes)}
    m = model([N("Relu", ["x"], ["r"]), N("ReduceMean", inputs, ["y"], **attrs)], [("x", list(shape))],
              [("y", None)], init, opset=opset)
    _same_as_onnx_runtime(m, {"x": _normal(rng, shape)}, rng)


@pytest.mark.parametrize("shape, pads, value, axes, opset", [
    ((2, 3, 4, 5), [0, 0, 1, 2, 0, 0, 3, 1], None, None, 13),       # zeros
    ((2, 3, 4, 5), [0, 1, 1, 2, 0, 0, 0, 1], 0.5, None, 13),        # on the int8 grid: an int8 pad
    ((2, 3, 4, 5), [0, 1, 1, 2, 0, 0, 0, 1], 0.3, None, 13),        # off it: in float32
    ((2, 3, 4, 5), [2, 0, 1, 1], -1.0, [-1, 1], 18),                # some axes, negative
    ((7,), [3, 0], 2.0, None, 13),
])
def test_pad(shape, pads, value, axes, opset):
    """After a convolution where the input is 4-D (the accelerator's output padded in int8)."""
    rng = np.random.default_rng(len(pads) + opset + int(10 * (value or 0)))
    init = {"p": np.int64(pads), "w": rng.normal(0, 0.4, (3, 3, 3, 3)).astype(np.float32)}
    inputs = ["c" if len(shape) == 4 else "x", "p", "" if value is None else "v"] + (["a"] if axes else [])
    if value is not None:
        init["v"] = np.float32(value)
    if axes:
        init["a"] = np.int64(axes)
    nodes = [N("Conv", ["x", "w"], ["c"], pads=[1] * 4)] if len(shape) == 4 else []
    m = model(nodes + [N("Pad", inputs, ["y"])], [("x", list(shape))], [("y", None)],
              {k: v for k, v in init.items() if nodes or k != "w"}, opset=opset)
    _same_as_onnx_runtime(m, {"x": _normal(rng, shape)}, rng)


@pytest.mark.parametrize("opset", [13, 18])
def test_pad_of_a_scalar_is_the_scalar(opset):
    """A scalar has no axes to pad (its pads are empty): the pad is the input as it is, in the
    graph's numpy semantics (np.pad raised a TypeError on the empty pads, folding a constant or
    evaluating) as in its kernels, float32 and int8. ONNX Runtime 1.31 refuses a scalar Pad
    ("Input tensor has no dimensions"), so the expected value is the input itself."""
    axes = ["a"] if opset == 18 else []
    init = {"p": np.int64([]), "v": np.float32(0.5), "c": np.float32(-2.25), "a": np.int64([])}
    m = model([N("Pad", ["x", "p", "v"] + axes, ["t"]), N("Pad", ["c", "p", ""] + axes, ["k"]),   # folded at import
               N("Add", ["t", "k"], ["y"])], [("x", [])], [("y", [])],
              {k: v for k, v in init.items() if axes or k != "a"}, opset=opset)
    compiled = compile_model(m)
    for x in (np.array(1.5, np.float32), np.array(-3.0, np.float32)):
        np.testing.assert_array_equal(compiled.run(x, "cpu"), x - 2.25)
        np.testing.assert_array_equal(evaluate(compiled.graph, {"x": x})["y"], x - 2.25)
        q = compile_model(m, quantize="int8", calibrate=np.stack([x, -x]), config="tiny")
        for device in ("cpu", "fsim"):
            np.testing.assert_array_equal(q.run(x, device), x - 2.25)


@pytest.mark.parametrize("node, init, match", [
    (N("ReduceMean", ["x"], ["y"], axes=[1, -2], name="m"), {},
     r"node m \(reduce_mean\): axes \[1, -2\] name an axis of the rank-3 input twice"),
    (N("ReduceMean", ["x"], ["y"], axes=[3], name="m"), {}, r"node m \(reduce_mean\): axes \[3\] are out of range"),
    (N("Pad", ["x", "p"], ["y"], mode="reflect", name="p"), {"p": np.int64([0] * 6)},
     r"node p \(Pad\): mode reflect is not supported \(only constant\)"),
    (N("Pad", ["x", "p"], ["y"], name="p"), {"p": np.int64([0, -1, 0, 0, 0, 0])},
     r"node p \(Pad\): pads \[0, -1, 0, 0, 0, 0\] are negative somewhere \(cropping\)"),
    (N("Pad", ["x", "p"], ["y"], name="p"), {"p": np.int64([1, 1])},
     r"node p \(pad\): pads \[1, 1\] must give a start and an end for each of the 3 padded axes"),
    (N("Pad", ["x", "p"], ["y"], name="p"), {}, r"node p \(Pad\): the pads must be a constant"),
    (N("Pad", ["x", "p", "v"], ["y"], name="p"), {"p": np.int64([0] * 6), "v": np.float32([1, 2])},
     r"node p \(Pad\): the constant_value must be a scalar, not of shape \[2\]"),
])
def test_reduce_mean_and_pad_refusals(node, init, match):
    inputs = [("x", [2, 3, 4])] + ([("p", [6])] if "p" in node.input and "p" not in init else [])
    with pytest.raises(GraphError, match=match) as info:
        compile_model(model([node], inputs, [("y", [1])], init))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("op, shapes, init, opset, match", [
    # Squeeze, Unsqueeze and ReduceMean take int64 axes only; Squeeze and ReduceMean a 1-D tensor
    # (Unsqueeze a scalar too, which ONNX Runtime reads as one axis and runs).
    ("Squeeze", ([1, 3], [3]), {"a": np.int32([0])}, 13,
     r"the axes must be a 1-D int64 tensor, not int32 of shape \[1\]"),
    ("Squeeze", ([1, 3], [3]), {"a": np.int64(0)}, 13, r"the axes must be a 1-D int64 tensor, not int64 of shape \[\]"),
    ("Unsqueeze", ([2, 3], [1, 2, 3]), {"a": np.int32([0])}, 13,
     r"the axes must be a 1-D or scalar int64 tensor, not int32 of shape \[1\]"),
    ("ReduceMean", ([2, 3], [1, 3]), {"a": np.int32([0])}, 18,
     r"the axes must be a 1-D int64 tensor, not int32 of shape \[1\]"),
    ("ReduceMean", ([2, 3], [1, 3]), {"a": np.int64(0)}, 18,
     r"the axes must be a 1-D int64 tensor, not int64 of shape \[\]"),
    # Pad: the constant_value of the data's type, int64 pads, 1-D axes (int32 or int64).
    ("Pad", ([2, 3], [2, 5]), {"p": np.int64([0, 1, 0, 1]), "v": np.int64(2)}, 13,
     r"the constant_value must have the data's type, float32, not int64"),
    ("Pad", ([2, 3], [2, 5]), {"p": np.int64([0, 1, 0, 1]), "v": np.bool_(True)}, 18,
     r"the constant_value must have the data's type, float32, not bool"),
    ("Pad", ([2, 3], [2, 5]), {"p": np.int32([0, 1, 0, 1])}, 13,
     r"the pads must be a 1-D int64 tensor, not int32 of shape \[4\]"),
    ("Pad", ([2, 3], [2, 5]), {"p": np.int64([1, 1]), "": None, "a": np.int64(1)}, 18,
     r"the axes must be a 1-D int32 or int64 tensor, not int64 of shape \[\]"),
    # Reshape: an int64 target shape.
    ("Reshape", ([2, 3], [3, 2]), {"s": np.int32([3, 2])}, 13,
     r"the target shape must be a 1-D int64 tensor, not int32 of shape \[2\]"),
    ("Reshape", ([2, 3], [3, 2]), {"s": np.uint64([3, 2])}, 13,
     r"the target shape must be a 1-D int64 tensor, not uint64 of shape \[2\]"),
    # Clip: min and max of the data's type, scalars (or of shape [1], which ONNX Runtime takes).
    ("Clip", ([2, 3], [2, 3]), {"lo": np.int64(0)}, 13, r"the min must have the data's type, float32, not int64"),
    ("Clip", ([2, 3], [2, 3]), {"": None, "hi": np.int32(1)}, 13,
     r"the max must have the data's type, float32, not int32"),
    ("Clip", ([2, 3], [2, 3]), {"lo": np.bool_(False)}, 13, r"the min must have the data's type, float32, not bool"),
    ("Clip", ([2, 3], [2, 3]), {"lo": np.float32([[0]])}, 13,
     r"the min must be a scalar \(or of shape \[1\]\), not of shape \[1, 1\]"),
    ("Clip", ([2, 3], [2, 3]), {"lo": np.float32(0), "hi": np.float32([[[1]]])}, 13,
     r"the max must be a scalar \(or of shape \[1\]\), not of shape \[1, 1, 1\]"),
    # Dropout: a float scalar ratio in [0, 1) (its kernel checks the range in inference too) and
    # a bool scalar training_mode.
    ("Dropout", ([2, 3], [2, 3]), {"r": np.int64(0)}, 13, r"the ratio must be a float32 scalar, not int64 of shape \[\]"),
    ("Dropout", ([2, 3], [2, 3]), {"r": np.float32([0.5])}, 13,
     r"the ratio must be a float32 scalar, not float32 of shape \[1\]"),
    ("Dropout", ([2, 3], [2, 3]), {"r": np.float32(1)}, 13, r"the ratio must be in \[0, 1\), not 1\.0"),
    ("Dropout", ([2, 3], [2, 3]), {"r": np.float32(-0.5)}, 13, r"the ratio must be in \[0, 1\), not -0\.5"),
    ("Dropout", ([2, 3], [2, 3]), {"": None, "t": np.int64(0)}, 13,
     r"the training_mode must be a bool scalar, not int64 of shape \[\]"),
    ("Dropout", ([2, 3], [2, 3]), {"r": np.float32(0.5), "t": np.bool_([False])}, 13,
     r"the training_mode must be a bool scalar, not bool of shape \[1\]"),
    # Gemm: B and C of A's type (C even where beta is 0).
    ("Gemm", ([2, 3], [2, 4]), {"w": np.ones((3, 4), np.int64)}, 13, r"B must have A's type, float32, not int64"),
    ("Gemm", ([2, 3], [2, 4]), {"w": np.ones((3, 4), np.bool_)}, 13, r"B must have A's type, float32, not bool"),
    ("Gemm", ([2, 3], [2, 4]), {"w": np.ones((3, 4), np.float32), "c": np.ones(4, np.int32)}, 13,
     r"C must have A's type, float32, not int32"),
    ("Gemm", ([2, 3], [2, 4]), {"w": np.ones((3, 4), np.float32), "c": np.ones((2, 4), np.int64)}, 13,
     r"C must have A's type, float32, not int64"),
])
def test_axes_pads_and_values_onnx_runtime_refuses_are_refused_at_import(op, shapes, init, opset, match):
    """gemforge compiled these, and ONNX Runtime refuses each (its type check when loading, or
    its kernel when run): int32 axes where ONNX takes int64, a scalar where it takes a 1-D
    tensor, int32 pads, a Pad's constant_value or a Clip's min or max of another type than its
    data, a Clip's min or max of more than one axis, an int32 (or uint64) Reshape target shape,
    a Dropout's ratio or training_mode of another type or shape (or a ratio out of range), and a
    Gemm's B or C of another type than A (cast to float32)."""
    m = model([N(op, ["x", *init], ["y"], name="n")], [("x", shapes[0])], [("y", shapes[1])],
              {k: v for k, v in init.items() if k}, opset=opset)
    with pytest.raises(GraphError, match=rf"^node n \({op}\): {match}$"):
        compile_model(m)
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        ort_run(m, {"x": np.ones(shapes[0], np.float32)})


@pytest.mark.parametrize("op, a, b, match", [
    ("Add", np.int32([3, 2]), np.int64([0, 0]), r"its inputs have different types \(int32, int64\); ONNX needs one"),
    ("Sub", np.int64([3, 2]), np.int32([0, 0]), r"its inputs have different types \(int32, int64\); ONNX needs one"),
    ("Mul", np.int64([3, 2]), np.uint8([1, 1]), r"its inputs have different types \(int64, uint8\); ONNX needs one"),
    ("Add", np.int64([3, 2]), np.int64([0, 0, 0]), r"shapes \[2\] and \[3\] do not broadcast"),
])
def test_integer_arithmetic_folded_at_import_takes_one_type_and_shapes_that_broadcast(op, a, b, match):
    """Add, Sub and Mul of integer constants (a shape computed in the model) folded with numpy's
    promotion: int32 beside int64 compiled, which ONNX Runtime refuses (one type parameter), and
    shapes that do not broadcast raised numpy's ValueError."""
    m = model([N(op, ["a", "b"], ["s"], name="n"), N("Reshape", ["x", "s"], ["y"])], [("x", [2, 3])], [("y", [3, 2])],
              {"a": a, "b": b})
    with pytest.raises(GraphError, match=rf"^node n \({op.lower()}\): {match}$"):
        compile_model(m)
    with pytest.raises(Exception, match="ONNXRuntimeError"):
        ort_run(m, {"x": np.ones((2, 3), np.float32)})


def test_clip_bounds_of_shape_1_run_as_onnx_runtime():
    """ONNX types Clip's min and max as scalars; ONNX Runtime takes shape [1] too (not [1, 1],
    which is refused above), and so does gemforge."""
    rng = np.random.default_rng(70)
    m = model([N("Clip", ["x", "lo", "hi"], ["y"])], [("x", [2, 3])], [("y", [2, 3])],
              {"lo": np.float32([-0.5]), "hi": np.float32([0.7])})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3))}, rng)


@pytest.mark.parametrize("ratio, mode", [(np.float32(0.5), np.bool_(False)), (np.float32(0), None), (None, np.bool_(0))])
def test_dropout_with_a_ratio_and_training_mode_off_is_the_identity_as_in_onnx_runtime(ratio, mode):
    rng = np.random.default_rng(71)
    init = {"r": ratio, "t": mode}
    m = model([N("Dropout", ["x", *("" if v is None else k for k, v in init.items())], ["d"]), N("Relu", ["d"], ["y"])],
              [("x", [2, 3])], [("y", [2, 3])], {k: v for k, v in init.items() if v is not None})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3))}, rng)


@pytest.mark.parametrize("attrs, opset", [({"keepdims": 2}, 13), ({"keepdims": -1}, 13),
                                          ({"noop_with_empty_axes": 2}, 18), ({"noop_with_empty_axes": -1}, 18)])
def test_reduce_mean_flags_other_than_0_or_1_are_refused(attrs, opset):
    """ONNX Runtime reads such a keepdims or noop_with_empty_axes as 0 (keepdims=2 drops the
    reduced axes; noop_with_empty_axes=2 without axes averages everything); they were read as 1."""
    (flag, value), = attrs.items()
    m = model([N("ReduceMean", ["x"], ["y"], name="m", **attrs)], [("x", [2, 3, 4])], [("y", None)], opset=opset)
    with pytest.raises(GraphError, match=rf"^node m \(ReduceMean\): {flag} must be 0 or 1, not {value}$"):
        compile_model(m)


def test_reduce_mean_and_pad_on_a_batch():
    """Over other axes they keep the items apart; over the batch axis they are named."""
    rng = np.random.default_rng(60)
    keep = model([N("Pad", ["x", "p"], ["t"]), N("ReduceMean", ["t"], ["y"], axes=[2], keepdims=0)],
                 [("x", ["N", 3, 4])], [("y", ["N", 3])], {"p": np.int64([0, 0, 1, 0, 0, 2])})
    x = _normal(rng, (4, 3, 4))
    np.testing.assert_allclose(compile_model(keep).run(x, "cpu"), ort_run(keep, {"x": x})[0], rtol=1e-6)
    for node, match in ((N("ReduceMean", ["x"], ["y"], axes=[0], name="m"), r"node m \(reduce_mean\): it averages "
                                                                            "over the batch axis"),
                        (N("Pad", ["x", "p"], ["y"], name="p"), r"node p \(pad\): it pads the batch axis")):
        m = model([node], [("x", ["N", 3, 4])], [("y", [1, 3, 4])], {"p": np.int64([1, 0, 0, 0, 0, 0])})
        with pytest.raises(GraphError, match=match):
            compile_model(m).run(x, "cpu")


def test_an_int8_layer_norm_keeps_its_epsilon():
    """(x − mean) / √(var + ε) in an int8 network: what follows the means stays in float32, so a
    row of equal values gives 0 as in ONNX Runtime. The variance was quantized before ε was
    added, ε (1e-5, far below its grid) rounded away, and that row came out 0 / 0 = NaN."""
    rng = np.random.default_rng(61)
    nodes = [N("ReduceMean", ["x"], ["mean"], axes=[-1]), N("Sub", ["x", "mean"], ["d"]), N("Pow", ["d", "two"], ["d2"]),
             N("ReduceMean", ["d2"], ["var"], axes=[-1]), N("Add", ["var", "eps"], ["ve"]), N("Sqrt", ["ve"], ["sd"]),
             N("Div", ["d", "sd"], ["y"])]
    m = model(nodes, [("x", [3, 16])], [("y", None)], {"two": np.float32(2), "eps": np.float32(1e-5)})
    x = 3 * _normal(rng, (3, 16))
    x[1] = 0.7
    _same_as_onnx_runtime(m, {"x": x}, rng, int8_tol=1e-5)
    # Its float32 adds and products in an int8 network survive a save and load.
    q = compile_model(m, quantize="int8", calibrate=np.stack([x, -x]), config="tiny")
    assert any(node.op in ("add", "sub", "mul") and q.graph.values[node.output].dtype == "float32"
               for node in q.graph.nodes)
    np.testing.assert_array_equal(Model.from_bytes(q.to_bytes()).run(x, "fsim"), q.run(x, "cpu"))


# ------------------------------------------------------------------------ shape computations

def test_a_flatten_computed_from_the_shape_as_pytorch_exports_it():
    """x.view(x.size(0), -1): Shape, Gather, Unsqueeze, Concat, Reshape, folded to a constant
    target at import; a symbolic batch compiles for the batch asked for."""
    rng = np.random.default_rng(70)
    w = rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32)
    fc = rng.normal(0, 0.4, (4 * 4 * 5, 7)).astype(np.float32)
    nodes = [N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Relu", ["c"], ["r"]), N("Shape", ["r"], ["s"]),
             N("Gather", ["s", "zero"], ["b"], axis=0), N("Unsqueeze", ["b", "ax0"], ["bu"]),
             N("Concat", ["bu", "minus1"], ["target"], axis=0), N("Reshape", ["r", "target"], ["f"]),
             N("MatMul", ["f", "fc"], ["y"])]
    m = model(nodes, [("x", ["N", 3, 4, 5])], [("y", ["N", 7])],
              {"w": w, "fc": fc, "zero": np.int64(0), "ax0": np.int64([0]), "minus1": np.int64([-1])})
    x = _normal(rng, (3, 3, 4, 5))
    expected = ort_run(m, {"x": x})[0]
    compiled = compile_model(m, batch=3)
    assert not any(node.op in ("shape", "gather") for node in compiled.graph.nodes)
    np.testing.assert_allclose(compiled.run(x, "cpu"), expected, rtol=1e-5, atol=1e-5)
    q = compile_model(m, batch=3, quantize="int8", calibrate=np.stack([x, -x]), config="tiny")
    np.testing.assert_array_equal(q.run(x, "fsim"), q.run(x, "cpu"))
    assert np.abs(q.run(x, "cpu") - expected).max() <= 0.05 * np.abs(expected).max()


@pytest.mark.parametrize("seed", range(12))
def test_shape_slice_gather_cast_and_constant_of_shape_fold_as_onnx_runtime_computes_them(seed):
    """Random Slices of a constant (negative, clamped and huge bounds, backward steps), Gathers
    (negative indices), Shape ranges cast to float and a ConstantOfShape, each reaching the
    arithmetic on the model's inputs: folded at import, equal to ONNX Runtime."""
    rng = np.random.default_rng(seed)
    data = _normal(rng, (6, 7))
    ends = [int(v) for v in rng.integers(-9, 9, 2)]
    ends[int(rng.integers(2))] = [2 ** 62, -(2 ** 62)][int(rng.integers(2))]
    init = {"data": data, "st": np.int64(rng.integers(-9, 9, 2)), "en": np.int64(ends), "axes": np.int64([1, -2]),
            "steps": np.int64(rng.choice([-3, -2, -1, 1, 2, 3], 2)), "idx": np.int64(rng.integers(-7, 7, (2, 3)))}
    folds = [N("Slice", ["data", "st", "en", "axes", "steps"], ["sl"]), N("Gather", ["data", "idx"], ["g"], axis=1)]
    probe = model(folds + [N("Relu", ["a"], ["r"])], [("a", [1])], [("sl", None), ("g", None), ("r", None)], init)
    sliced, gathered, _ = ort_run(probe, {"a": np.ones(1, np.float32)})
    if sliced.size:
        m = model(folds + [N("Add", ["a", "sl"], ["y0"]), N("Mul", ["b", "g"], ["y1"])],
                  [("a", list(sliced.shape)), ("b", list(gathered.shape))], [("y0", None), ("y1", None)], init)
        feeds = {"a": _normal(rng, sliced.shape), "b": _normal(rng, gathered.shape)}
        got = compile_model(m).run(feeds, "cpu")
        for name, e in zip(("y0", "y1"), ort_run(m, feeds)):
            np.testing.assert_array_equal(got[name], e)
    else:     # an empty slice: gemforge computes tensors of one element or more
        m = model(folds[:1] + [N("Add", ["a", "sl"], ["y0"])], [("a", [1])], [("y0", None)], init)
        with pytest.raises(GraphError, match="no elements"):
            compile_model(m)
    shape = [int(d) for d in rng.integers(1, 6, 4)]
    start, end = (int(v) for v in rng.integers(-5, 5, 2))
    if not shape[start:end]:
        start, end = 0, 4
    m = model([N("Shape", ["x"], ["s"], start=start, end=end), N("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
               N("ReduceMean", ["x"], ["m"], axes=[1, 2, 3], keepdims=0), N("ReduceMean", ["sf"], ["n"]),
               N("Add", ["m", "n"], ["y0"]), N("Shape", ["x"], ["full"]),
               N("ConstantOfShape", ["full"], ["k"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
               N("Mul", ["x", "k"], ["y1"])], [("x", shape)], [("y0", None), ("y1", None)], opset=15)
    x = _normal(rng, shape)
    got = compile_model(m).run(x, "cpu")
    for name, e in zip(("y0", "y1"), ort_run(m, {"x": x})):
        np.testing.assert_allclose(got[name], e, rtol=1e-6)


@pytest.mark.parametrize("node, init, match", [
    (N("Gather", ["k", "x"], ["y"], name="g"), {"k": np.float32([1, 2])},
     r"node g \(Gather\): the indices must be a constant"),
    (N("Gather", ["k", "i"], ["y"], name="g"), {"k": np.float32([1, 2]), "i": np.int64([2])},
     r"node g \(Gather\): an index is outside \[-2, 1\], the data's axis 0"),
    (N("Slice", ["k", "i", "i", "i", "z"], ["y"], name="s"), {"k": np.float32([1, 2]), "i": np.int64([0]),
                                                              "z": np.int64([0])},
     r"node s \(Slice\): a step of 0 is not allowed"),
    (N("Slice", ["x", "i", "i"], ["y"], name="s"), {"i": np.int64([0])},
     r"node s \(Slice\): the slice of the computed tensor is empty"),
    (N("Cast", ["x"], ["y"], to=TensorProto.INT64, name="c"), {},
     r"node c \(Cast\): a computed float32 tensor can only be cast to float32"),
])
def test_shape_computation_refusals(node, init, match):
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", node.op_type == "Cast" and TensorProto.INT64
                                                         or TensorProto.FLOAT, [2])],
                          [numpy_helper.from_array(v, k) for k, v in init.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    with pytest.raises(GraphError, match=match):
        compile_model(m)


# ------------------------------------------------------------------------ the .gfm round trip

def _every_new_operator(rng):
    """One network with an operator of each kind this file tests, each attribute set."""
    w = rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32)
    nodes = [N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             N("Unsqueeze", ["t", "one"], ["u"]), N("Squeeze", ["u", "one"], ["s"]), N("Neg", ["s"], ["n"]),
             N("Sub", ["n", "k"], ["d"]), N("Pad", ["d", "pads", "half"], ["p"]), N("Div", ["p", "k"], ["q"]),
             N("LeakyRelu", ["q"], ["l"], alpha=0.25), N("Sigmoid", ["l"], ["g"]), N("Mul", ["g", "k"], ["h"]),
             N("ReduceMean", ["h"], ["y"], axes=[2], keepdims=0)]
    return model(nodes, [("x", [1, 3, 4, 5])], [("y", None)],
                 {"w": w, "one": np.int64([1]), "k": _away_from_zero(rng, (4,)), "half": np.float32(0.5),
                  "pads": np.int64([0, 1, 0, 0, 0, 0, 2, 0])})


def test_every_new_operator_survives_save_and_load(tmp_path):
    rng = np.random.default_rng(40)
    m = _every_new_operator(rng)
    x = _normal(rng, (1, 3, 4, 5))
    _survives_save_and_load(m, x, tmp_path)


@pytest.fixture(scope="module")
def every_new_operator_gfm() -> bytes:
    """The int8 network of `_every_new_operator` as a .gfm file's bytes."""
    rng = np.random.default_rng(41)
    x = _normal(rng, (1, 3, 4, 5))
    return compile_model(_every_new_operator(rng), quantize="int8", calibrate=np.stack([x, -x]),
                         config="tiny").to_bytes()


@pytest.mark.parametrize("op, attr, value, match", [
    ("transpose", "perm", [0, 1, 2, 3], r"node d \(sub\): shapes \[1, 4, 4, 5\] and \[4\] do not broadcast"),
    ("pad", "pads", [0, 0, 0, 0, 0, 0, 0, 1], r"node q \(div\): shapes \[1, 4, 5, 5\] and \[4\] do not broadcast"),
    ("pad", "value", "0", "attribute value"),
    ("leaky_relu", "alpha", None, "lacks attribute"),
    ("reduce_mean", "keepdims", 1, "attribute keepdims"),
    ("transpose", "perm", ["a"], "attribute perm"),
    ("transpose", "perm", None, "lacks attribute"),
    ("reshape", "squeeze", [-1], "attribute squeeze"),
    ("reshape", "unsqueeze", [4], r"node s \(reshape\): it squeezes axes of size 1 only"),
    ("sub", "lshift", None, "lacks attribute"),
])
def test_an_edited_attribute_of_a_new_operator_is_refused_when_loaded(op, attr, value, match, every_new_operator_gfm):
    from test_graph_int8 import _edit_manifest

    def edit(manifest):
        node = next(n for n in manifest["graph"]["nodes"] if n["op"] == op and (attr in n["attrs"] or value is None))
        if value is None:
            node["attrs"].pop(attr)
        else:
            node["attrs"][attr] = value
    with pytest.raises(GraphError, match=f"not a valid gemforge model.*{match}"):
        Model.from_bytes(_edit_manifest(every_new_operator_gfm, edit))



# ------------------------------------------------------------------------ the GPU back end

def test_gpu_kernels_or_one_line_refusals():
    """Every new operator builds for an sm_90 GPU (PTX checked by ptxas where present), except
    those needing exp, log or tanh, which the GPU back end lacks, and the mean, which has no GPU
    schedule (as softmax has none): they are refused by name, pointing at the cpu."""
    from gemforge.compiler.graph.cpu_kernels import host_kernel
    from gemforge.compiler.ops.common import OpError
    from gemforge.compiler.target import GpuTarget
    rng = np.random.default_rng(51)
    m = model([N("Transpose", ["x"], ["t"], perm=[1, 0]), N("Sub", ["t", "k"], ["s"]), N("Div", ["s", "k"], ["d"]),
               N("Neg", ["d"], ["n"]), N("Sqrt", ["n"], ["q"]), N("Abs", ["q"], ["a"]), N("LeakyRelu", ["a"], ["l"]),
               N("Pad", ["l", "pads", "one"], ["y"]), N("Sigmoid", ["y"], ["z1"]), N("Tanh", ["y"], ["z2"]),
               N("Exp", ["y"], ["z3"]), N("ReduceMean", ["y"], ["z4"], axes=[0]), N("Log", ["a"], ["z5"]),
               N("Max", ["y", "one"], ["z6"]), N("Min", ["one", "y"], ["z7"])],
              [("x", [3, 4])], [(f"z{i}", None) for i in range(1, 8)],
              {"k": _away_from_zero(rng, (3,)), "pads": np.int64([1, 0, 0, 2]), "one": np.float32(1)})
    graph = compile_model(m).graph
    gpu = GpuTarget("sm_90")
    for node in graph.nodes:
        if node.op in ("sigmoid", "tanh", "exp", "log", "reduce_mean"):
            with pytest.raises(OpError, match=rf"^{node.op} has no GPU (kernel \(the GPU back end has no exp, log or tanh: "
                                              r"no libdevice\)|schedule); run it on the cpu$"):
                host_kernel(graph, node, gpu)
        else:
            assert host_kernel(graph, node, gpu).op is not None, node.op


# ------------------------------------------------------------------------ LRN

@pytest.mark.parametrize("attrs, shape", [({"size": 5}, (2, 7, 4, 5)),
                                          ({"size": 3, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, (1, 4, 3, 3)),
                                          ({"size": 1}, (1, 6, 5, 2)), ({"size": 9}, (1, 3, 2, 2))])
def test_lrn_as_onnx_runtime(attrs, shape):
    """AlexNet's and GoogLeNet's local response normalization: windows of one channel to more
    than there are; float32 as ONNX Runtime, int8 alike on fsim and the cpu."""
    rng = np.random.default_rng(attrs["size"])
    init = {"w": rng.normal(0, 0.4, (shape[1], 3, 3, 3)).astype(np.float32)}
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("LRN", ["c"], ["y"], **attrs)],
              [("x", [shape[0], 3, *shape[2:]])], [("y", None)], init)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (shape[0], 3, *shape[2:]))}, rng, int8_tol=0.1)


def test_lrn_refusals():
    for attrs, match in (({"size": 4}, r"node n \(LRN\): size must be a positive odd integer \(as ONNX Runtime "
                                        r"requires\), not 4"),
                         ({"size": 3, "beta": float("inf")}, r"beta must be a finite number")):
        with pytest.raises(GraphError, match=match):
            compile_model(model([N("LRN", ["x"], ["y"], name="n", **attrs)], [("x", [1, 4, 2, 2])], [("y", [1, 4, 2, 2])]))


# ------------------------------------------------------------------------ Gemm's attributes

@pytest.mark.parametrize("attrs, b_input, c", [
    ({"transA": 1}, False, "row"), ({"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, False, "matrix"),
    ({"transB": 1}, True, None), ({"alpha": 0.25}, True, "row"), ({"transA": 1, "transB": 1, "alpha": 3.0}, True, "matrix"),
    ({"beta": 0.5}, True, "input"), ({"alpha": 2.0, "beta": -1.0, "transA": 1}, True, "input"),
])
def test_gemm_attributes_with_variable_operands(attrs, b_input, c):
    """transA of a computed A, transB and alpha of a graph-input B, beta of a graph-input C: as ONNX
    Runtime computes alpha · A'B' + beta · C."""
    rng = np.random.default_rng(len(attrs) + 3 * b_input)
    m_, k, n = 3, 4, 5
    a_shape = (k, m_) if attrs.get("transA") else (m_, k)
    b_shape = (n, k) if attrs.get("transB") else (k, n)
    inputs, feeds, init = [("a", list(a_shape))], {"a": _normal(rng, a_shape)}, {}
    if b_input:
        inputs.append(("b", list(b_shape)))
        feeds["b"] = _normal(rng, b_shape)
    else:
        init["b"] = _normal(rng, b_shape)
    operands = ["a", "b"]
    if c == "input":
        inputs.append(("c", [m_, n]))
        feeds["c"] = _normal(rng, (m_, n))
        operands.append("c")
    elif c is not None:
        init["c"] = _normal(rng, (n,) if c == "row" else (m_, n))
        operands.append("c")
    m = model([N("Gemm", operands, ["y"], **attrs)], inputs, [("y", [m_, n])], init)
    _same_as_onnx_runtime(m, feeds, rng, int8=not b_input and c != "input")


# ------------------------------------------------------------------------ Resize

def _resize_model(attrs, scales=None, sizes=None, shape=(1, 4, 3, 5), opset=13, batch=None):
    init = {"w": np.random.default_rng(1).normal(0, 0.4, (shape[1], 3, 3, 3)).astype(np.float32)}
    operands = ["c", ""]
    if scales is not None:
        init["scales"] = np.float32(scales)
        operands.append("scales")
    if sizes is not None:
        init["sizes"] = np.int64(sizes)
        operands += ([""] if scales is None else []) + ["sizes"]
    return model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Resize", operands, ["y"], name="r", **attrs)],
                 [("x", [batch or shape[0], 3, *shape[2:]])], [("y", None)], init, opset=opset)


@pytest.mark.parametrize("attrs, scales, sizes", [
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 2, 2], None),
    ({"mode": "nearest"}, [1, 1, 2, 3], None),                                   # half_pixel, round_prefer_floor
    ({"mode": "nearest", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [1, 4, 6, 5]),
    ({"mode": "nearest", "coordinate_transformation_mode": "align_corners"}, [1, 1, 1, 1], None),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 4, 2], None),
])
def test_nearest_resize_by_whole_factors(attrs, scales, sizes):
    """Nearest-neighbour upsampling as detection heads and feature pyramids export it: float32 as
    ONNX Runtime, and int8 exactly the repeated pixels (fsim = cpu)."""
    rng = np.random.default_rng(len(attrs))
    m = _resize_model(attrs, scales, sizes)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (1, 3, 3, 5))}, rng)


@pytest.mark.parametrize("coordinates, scales, sizes", [
    ("half_pixel", [1, 1, 2, 2], None), ("pytorch_half_pixel", None, [1, 4, 9, 5]), ("asymmetric", [1, 1, 4, 3], None),
    ("half_pixel", [1, 1, 1, 3], None),
])
def test_linear_resize_by_whole_factors(coordinates, scales, sizes):
    """Bilinear upsampling as segmentation heads export it (F.interpolate(mode="bilinear",
    align_corners=False)): float32 as ONNX Runtime, int8 alike on fsim and the cpu."""
    rng = np.random.default_rng(len(coordinates) + (scales or sizes)[2])
    m = _resize_model({"mode": "linear", "coordinate_transformation_mode": coordinates}, scales, sizes)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (1, 3, 3, 5))}, rng, int8_tol=0.08)


def test_nearest_resize_keeps_a_symbolic_batch():
    rng = np.random.default_rng(3)
    m = _resize_model({"mode": "nearest"}, [1, 1, 2, 2], batch="N")
    x = _normal(rng, (3, 3, 3, 5))
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs, scales, sizes", [
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 2], None),
    ({"mode": "linear"}, [1, 1, 1.5, 0.6], None),                                # half_pixel, shrinking one axis
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [1, 4, 1, 11]),
    ({"mode": "nearest"}, [1, 1, 1.5, 2], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 0.5, 0.7],
     None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "round_prefer_ceil"},
     [1, 1, 2, 2], None),
    ({"mode": "cubic"}, [1, 1, 2, 2], None),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners", "cubic_coeff_a": -0.5}, None, [1, 4, 7, 4]),
    ({"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 0.5, 1.7], None),
    ({"mode": "cubic"}, [1, 1, 1.5, 1.4], None),               # 5 · 1.4f is 7 in float32 (6 in float64)
])
def test_any_resize_is_taken_neighbours_weighted_as_onnx_runtime(attrs, scales, sizes):
    """Sizes that are no whole multiple, shrinking, align_corners and cubic: per axis the
    neighbours taken and weighted as ONNX Runtime computes them. float32 as ONNX Runtime, int8
    alike on fsim and the cpu."""
    rng = np.random.default_rng(len(attrs) + len(str(scales or sizes)))
    m = _resize_model(attrs, scales, sizes)
    graph = compile_model(m).graph
    assert any(n.op == "take" for n in graph.nodes)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (1, 3, 3, 5))}, rng, int8_tol=0.12)


def test_onnx_resize_node_cases_with_constant_scales_equal_onnx_runtime():
    """ONNX's own Resize node cases (`onnx.backend.test.case`), their scales, sizes and ROI made
    initializers as exporters write them: each equals ONNX Runtime (which for two downsampling
    align_corners cases differs from the cases' own expected outputs, computed from the
    fractional output length) or is refused by name — antialias, exclude_outside, axes,
    keep_aspect_ratio_policy, tf_crop_and_resize and half_pixel_symmetric."""
    import warnings

    import onnx
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases(None)
                 if c.data_sets and {n.op_type for n in c.model.graph.node} == {"Resize"}]
    passed, refused = [], []
    for case in cases:
        inputs, expected = case.data_sets[0]
        m = onnx.ModelProto()
        m.CopyFrom(case.model)
        names = [i.name for i in m.graph.input]
        m.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), n) for n, v in zip(names[1:], inputs[1:]))
        del m.graph.input[1:]
        try:
            compiled = compile_model(m)
        except GraphError as exc:
            assert "\n" not in str(exc) and "Resize" in str(exc), (case.name, str(exc))
            refused.append(case.name)
            continue
        got, reference = compiled.run(inputs[0], "cpu"), ort_run(m, {names[0]: inputs[0]})[0]
        assert got.shape == reference.shape, case.name
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5, err_msg=case.name)
        passed.append(case.name)
    assert len(passed) >= 19 and len(cases) >= 39, (passed, refused)


@pytest.mark.parametrize("attrs, scales, match", [
    ({"mode": "area"}, [1, 1, 2, 2], r"node r \(Resize\): mode 'area' is not supported; gemforge resizes with "
                                     r"modes 'nearest', 'linear' and 'cubic'"),
    ({"mode": "cubic", "exclude_outside": 1}, [1, 1, 2, 2], r"exclude_outside=1 is not supported"),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.5], r"antialias=1 is not supported"),     # opset 18
    ({"mode": "nearest"}, [1, 1, 0.1, 1], r"axis 2: 3 would have 0 pixels|axis 2 would have 0 pixels"),
    ({"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 2, 2],
     r"coordinate_transformation_mode 'tf_crop_and_resize' is not supported"),
    ({"mode": "nearest"}, [2, 1, 1, 1], r"the batch axis must keep its size"),
    ({"mode": "linear"}, [1, 1, 1e5, 1], r"axis 2 would be resized to 300,000 pixels; gemforge resizes an axis to "
                                          r"at most 65,536"),
])
def test_resizes_outside_the_supported_modes_are_refused_by_name(attrs, scales, match):
    with pytest.raises(GraphError, match=match):
        compile_model(_resize_model(attrs, scales, opset=18 if "antialias" in attrs else 13))


# ------------------------------------------------------------------------ LayerNormalization, reductions

@pytest.mark.parametrize("axis, shape, bias", [(-1, (2, 5, 8), True), (1, (2, 3, 4), False), (2, (1, 3, 4, 5), True)])
def test_layer_normalization(axis, shape, bias):
    """Transformers' LayerNormalization (opset 17) over the axes from ``axis`` on: float32 as ONNX
    Runtime, int8 (a float32 island) alike on fsim and the cpu."""
    rng = np.random.default_rng(len(shape) + axis)
    norm_shape = shape[axis % len(shape):]
    init = {"scale": rng.uniform(0.5, 1.5, norm_shape).astype(np.float32)}
    operands = ["x", "scale"]
    if bias:
        init["b"] = _normal(rng, norm_shape)
        operands.append("b")
    m = model([N("LayerNormalization", operands, ["y"], axis=axis, epsilon=1e-3)], [("x", list(shape))],
              [("y", list(shape))], init, opset=17)
    _same_as_onnx_runtime(m, {"x": _normal(rng, shape) * 3 + 1}, rng, rtol=5e-5, int8_tol=0.15)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes, keepdims", [((1,), 1), ((0, 2), 0), ((-1,), 0), (None, 1), (None, 0)])
def test_reductions(op, axes, keepdims):
    """Sums (as a mean times the count), squares and norms, and the maximum and minimum (as a
    global max pool over the reduced axes moved last): as ONNX Runtime at opset 18 (axes as an
    input) and at 13 (an attribute but for ReduceSum)."""
    rng = np.random.default_rng(len(op))
    x = _normal(rng, (3, 4, 5))
    for opset in (13, 18):
        inputs, init, attrs = ["x"], {}, {"keepdims": keepdims}
        if axes is not None:
            if opset == 18 or op == "ReduceSum":
                init["axes"] = np.int64(axes)
                inputs.append("axes")
            else:
                attrs["axes"] = list(axes)
        m = model([N(op, inputs, ["y"], **attrs)], [("x", [3, 4, 5])], [("y", None)], init, opset=opset)
        expected = ort_run(m, {"x": x})[0]
        got = compile_model(m).run(x, "cpu")
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_reduction_with_no_axes_and_noop_is_its_input():
    x = _normal(np.random.default_rng(1), (2, 3))
    for op in ("ReduceSum", "ReduceMax", "ReduceL2"):
        m = model([N(op, ["x"], ["y"], noop_with_empty_axes=1)], [("x", [2, 3])], [("y", [2, 3])], opset=18)
        np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-6)


# ------------------------------------------------------------------------ Slice, Split, Gather of computed tensors

def _after_conv(nodes, init, rng, out_shape=None, opset=13, channels=6, batch=2, declared=None):
    init = dict(init, w=rng.normal(0, 0.4, (channels, 3, 3, 3)).astype(np.float32))
    return model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4)] + nodes, [("x", [batch, 3, 5, 6])],
                 [(o, declared) for o in (out_shape or ["y"])], init, opset=opset)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1], [4], [1], None), ([0, 4], [3, 0], [2, 3], [2, -1]), ([-2], [-100], [3], [-2]), ([1, 0], [5, 100], [1, 2], [3, 2]),
])
def test_slice_of_a_computed_tensor(starts, ends, axes, steps):
    """YOLOv5's Focus slices (steps of 2), channel ranges, backwards slices: float32 as ONNX Runtime,
    int8 alike on fsim and the cpu (a slice keeps its input's scale)."""
    rng = np.random.default_rng(len(starts) + sum(map(abs, starts)))
    init = {"starts": np.int64(starts), "ends": np.int64(ends), "axes": np.int64(axes)}
    operands = ["c", "starts", "ends", "axes"]
    if steps is not None:
        init["steps"] = np.int64(steps)
        operands.append("steps")
    m = _after_conv([N("Slice", operands, ["y"])], init, rng)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 5, 6))}, rng)


@pytest.mark.parametrize("attrs, split, outputs, opset", [
    ({"axis": 1}, [2, 4], 2, 13), ({"axis": 1}, None, 3, 13), ({"axis": -2, "num_outputs": 2}, None, 2, 18),
    ({"axis": 2, "split": [1, 4]}, None, 2, 11),
])
def test_split_of_a_computed_tensor(attrs, split, outputs, opset):
    """YOLOv8's C2f splits its channels: explicit sizes, equal parts, num_outputs with a smaller
    last part (opset 18), the attribute of older opsets (upgraded)."""
    rng = np.random.default_rng(outputs + opset)
    names = [f"y{k}" for k in range(outputs)]
    init, operands = {}, ["c"]
    if split is not None:
        init["split"] = np.int64(split)
        operands.append("split")
    nodes = [N("Split", operands, names, **attrs)]
    m = _after_conv(nodes, init, rng, out_shape=names, opset=opset)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 5, 6))}, rng)


@pytest.mark.parametrize("indices, axis", [(np.int64(0), 1), (np.int64(-1), 3), (np.int64([0, 2, 4]), 1),
                                           (np.int64([3, 0, 1]), 2), (np.int64([[1, 2], [5, 0]]), 1)])
def test_gather_of_a_computed_tensor(indices, axis):
    """A transformer's class token (x[:, 0]) and other constant indices into a computed tensor:
    slices, concatenated where the indices do not advance evenly, then the indices' shape."""
    rng = np.random.default_rng(indices.size + axis)
    m = _after_conv([N("Gather", ["c", "i"], ["y"], axis=axis)], {"i": indices}, rng)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 5, 6))}, rng)


def test_a_slice_that_keeps_the_batch_runs_any_multiple_of_it():
    rng = np.random.default_rng(8)
    m = _after_conv([N("Slice", ["c", "s", "e", "a"], ["y"])], {"s": np.int64([1]), "e": np.int64([3]),
                                                                 "a": np.int64([1])}, rng, batch="N")
    x = _normal(rng, (4, 3, 5, 6))
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("node, init, match", [
    (N("Split", ["c"], ["a", "b", "d", "e"], axis=1, name="s"), {}, r"node s \(Split\): axis 1 of 6 does not split into 4 "
                                                                     r"equal parts; give split"),
    (N("Split", ["c", "k"], ["a", "b"], axis=1, name="s"), {"k": np.int64([2, 3])},
     r"the split sizes \[2, 3\] must be 2 positive sizes adding up to axis 1's 6"),
    (N("Slice", ["c", "s", "e"], ["y"], name="s"), {"s": np.int64([3]), "e": np.int64([1])},
     r"node s \(Slice\): the slice of the computed tensor is empty"),
    (N("Gather", ["c", "i"], ["y"], axis=1, name="g"), {"i": np.int64([6])}, r"an index is outside \[-6, 5\]"),
])
def test_slice_split_and_gather_refusals(node, init, match):
    rng = np.random.default_rng(0)
    with pytest.raises(GraphError, match=match):
        compile_model(_after_conv([node], init, rng, out_shape=list(node.output), declared=[1]))


def test_slices_survive_save_and_load(tmp_path):
    rng = np.random.default_rng(12)
    m = _after_conv([N("Split", ["c"], ["a", "b"], axis=1), N("Gather", ["a", "i"], ["g"], axis=1),
                     N("Slice", ["b", "s", "e", "ax", "st"], ["t"]), N("Add", ["g", "t"], ["y"])],
                    {"i": np.int64([2]), "s": np.int64([0, 5]), "e": np.int64([1, -100]), "ax": np.int64([1, 3]),
                     "st": np.int64([1, -1])}, rng, declared=[2, 1, 5, 6])
    _survives_save_and_load(m, _normal(rng, (2, 3, 5, 6)), tmp_path)


# ------------------------------------------------------------------------ ConvTranspose

@pytest.mark.parametrize("attrs, k, group, bias", [
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, 3, 1, True),     # a U-Net decoder
    ({"strides": [2, 2]}, 2, 1, True),                                                     # an FPN's upsampler
    ({"pads": [1, 1, 1, 1]}, 3, 1, False),
    ({"strides": [2, 3], "pads": [0, 1, 2, 0], "group": 2}, 3, 2, True),
    ({"strides": [2, 2], "dilations": [2, 1], "pads": [2, 1, 1, 0]}, 3, 1, False),
    ({"strides": [3, 1], "pads": [3, 0, 4, 2], "output_padding": [2, 0]}, 2, 1, True),    # pads past the kernel: cut
])
def test_conv_transpose_as_onnx_runtime(attrs, k, group, bias):
    """Transposed convolutions as decoders and pyramids export them: float32 as ONNX Runtime and int8
    (the direct convolution on the accelerator where it has one group) alike on fsim and the cpu."""
    rng = np.random.default_rng(k + group + len(attrs))
    cin, m = 4, 3
    init = {"w": rng.normal(0, 0.4, (cin, m, k, k)).astype(np.float32)}
    operands = ["x", "w"]
    if bias:
        init["b"] = _normal(rng, (m * group,))
        operands.append("b")
    node = N("ConvTranspose", operands, ["t"], **attrs)
    m_ = model([node, N("Relu", ["t"], ["y"])], [("x", [2, cin, 4, 5])], [("y", None)], init)
    _same_as_onnx_runtime(m_, {"x": _normal(rng, (2, cin, 4, 5))}, rng, int8_tol=0.08)


@pytest.mark.parametrize("attrs, match", [
    ({"output_shape": [8, 8]}, r"output_shape is not supported"),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, r"auto_pad SAME_UPPER is not supported"),
    ({"strides": [2, 2], "output_padding": [2, 0]}, r"output_padding must be two integers each below its stride"),
])
def test_conv_transpose_refusals(attrs, match):
    m = model([N("ConvTranspose", ["x", "w"], ["y"], name="t", **attrs)], [("x", [1, 2, 3, 3])], [("y", [1])],
              {"w": np.ones((2, 2, 3, 3), np.float32)})
    with pytest.raises(GraphError, match=match):
        compile_model(m)


@pytest.mark.parametrize("strides, pads, auto_pad, k", [((2, 1), [1, 1, 1, 1], None, 3), ((1, 2), [0, 0, 0, 0], None, 3),
                                                        ((3, 2), [1, 0, 2, 1], None, 2), ((2, 1), None, "SAME_UPPER", 3),
                                                        ((1, 3), None, "SAME_LOWER", 4)])
def test_convolutions_with_unequal_strides(strides, pads, auto_pad, k):
    """CRNN-style text recognizers stride (2, 1): the convolution at the strides' gcd, every
    (stride / gcd)-th output kept — float32 as ONNX Runtime, int8 alike on fsim and the cpu."""
    rng = np.random.default_rng(sum(strides) + k)
    attrs = {"strides": list(strides)}
    attrs.update({"auto_pad": auto_pad} if auto_pad else {"pads": pads})
    init = {"w": rng.normal(0, 0.4, (5, 3, k, k)).astype(np.float32), "b": _normal(rng, (5,))}
    m = model([N("Conv", ["x", "w", "b"], ["c"], **attrs), N("Relu", ["c"], ["y"])], [("x", [2, 3, 7, 9])],
              [("y", None)], init)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 3, 7, 9))}, rng)


# ------------------------------------------------------------------------ MatMul of any operands

@pytest.mark.parametrize("a_shape, b_shape, b_constant", [
    ((2, 3, 4), (4, 5), False), ((2, 3, 4, 5), (2, 3, 5, 6), False), ((1, 3, 4, 5), (2, 1, 5, 6), False),
    ((4,), (4, 5), False), ((3, 4), (4,), False), ((4,), (4,), False), ((2, 3, 4), (4,), True),
    ((2, 4), (3, 4, 5), True), ((3, 4), (4, 5), False),
])
def test_matmul_of_any_operands(a_shape, b_shape, b_constant):
    """Attention's Q·Kᵀ and weights·V (batched, both computed), 1-D operands and broadcast batch axes:
    numpy's matmul, as ONNX Runtime computes it; int8 (the products of computed tensors on the CPU)
    alike on fsim and the cpu."""
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    inputs, feeds, init = [("a", list(a_shape))], {"a": _normal(rng, a_shape)}, {}
    if b_constant:
        init["b"] = _normal(rng, b_shape)
    else:
        inputs.append(("b", list(b_shape)))
        feeds["b"] = _normal(rng, b_shape)
    out = list(np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape)
    m = model([N("MatMul", ["a", "b"], ["y"])], inputs, [("y", out)], init)
    _same_as_onnx_runtime(m, feeds, rng, int8=bool(out), rtol=1e-5 if out else 1e-4)   # a dot product may cancel


# ------------------------------------------------------------------------ 1-D windows

@pytest.mark.parametrize("op, attrs", [
    ("Conv", {"pads": [1, 2], "strides": [2]}), ("Conv", {"dilations": [2], "group": 2}),
    ("ConvTranspose", {"strides": [2], "pads": [1, 0], "output_padding": [1]}),
    ("MaxPool", {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ("AveragePool", {"kernel_shape": [2], "ceil_mode": 1, "strides": [2]}),
])
def test_one_dimensional_windows(op, attrs):
    """Convolutions and pools over (N, C, L) signals: run as their 2-D selves over a height of 1,
    float32 as ONNX Runtime, int8 alike on fsim and the cpu."""
    rng = np.random.default_rng(len(op) + len(attrs))
    init, operands = {}, ["x"]
    if op == "Conv":
        init["w"] = rng.normal(0, 0.4, (6, 4 // attrs.get("group", 1), 3)).astype(np.float32)
        operands.append("w")
    elif op == "ConvTranspose":
        init["w"] = rng.normal(0, 0.4, (4, 3, 3)).astype(np.float32)
        operands.append("w")
    m = model([N(op, operands, ["y"], **attrs)], [("x", [2, 4, 11])], [("y", None)], init)
    _same_as_onnx_runtime(m, {"x": _normal(rng, (2, 4, 11))}, rng, int8_tol=0.08)


def test_layer_normalization_gives_its_mean_and_inverse_deviation():
    rng = np.random.default_rng(17)
    m = model([N("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], axis=1)], [("x", [2, 3, 4])],
              [("y", [2, 3, 4]), ("mean", [2, 1, 1]), ("inv", [2, 1, 1])], {"s": _normal(rng, (3, 4))}, opset=17)
    x = _normal(rng, (2, 3, 4))
    got = compile_model(m).run(x, "cpu")
    for name, e in zip(("y", "mean", "inv"), ort_run(m, {"x": x})):
        np.testing.assert_allclose(got[name], e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias", [None, "constant", "input"])
def test_convolution_of_computed_weights(bias):
    """Weights as a graph input (ONNX's node tests, hypernetworks): the CPU kernel packs them at each
    run, the accelerator (whose weights are constants) leaves them; a computed bias is added after."""
    rng = np.random.default_rng(3)
    inputs, feeds, init, operands = [("x", [2, 4, 6, 6]), ("w", [5, 4, 3, 3])], {}, {}, ["x", "w"]
    feeds["x"], feeds["w"] = _normal(rng, (2, 4, 6, 6)), _normal(rng, (5, 4, 3, 3))
    if bias == "constant":
        init["b"] = _normal(rng, (5,))
        operands.append("b")
    elif bias == "input":
        inputs.append(("b", [5]))
        feeds["b"] = _normal(rng, (5,))
        operands.append("b")
    m = model([N("Conv", operands, ["y"], pads=[1] * 4, strides=[2, 2])], inputs, [("y", None)], init)
    _same_as_onnx_runtime(m, feeds, rng, int8_tol=0.1)


# ------------------------------------------------------------------------ shape arithmetic, Expand, Tile

def test_floor_division_of_a_size_as_pytorch_exports_it():
    """x[:, :-(x.size(1) // -3)]: torch.onnx's Div of integers and its floor fix-up (Less, Xor, Mod,
    Equal, Not, And, Where), all of constants once the Shape folds."""
    def c(name, v):
        return N("Constant", [], [name], value=numpy_helper.from_array(np.asarray(v)))
    nodes = [c("one", np.int64(1)), c("two", np.int64(-3)), c("zero", np.int64(0)), c("ax", np.int64([0])),
             N("Shape", ["x"], ["s"]), N("Gather", ["s", "one"], ["n"], axis=0),
             N("Div", ["n", "two"], ["q"]), N("Less", ["n", "zero"], ["a"]), N("Less", ["two", "zero"], ["b"]),
             N("Xor", ["a", "b"], ["neg"]), N("Mod", ["n", "two"], ["r"], fmod=0), N("Equal", ["r", "zero"], ["e"]),
             N("Not", ["e"], ["ne"]), N("And", ["neg", "ne"], ["m"]), N("Sub", ["q", "one"], ["qm"]),
             N("Where", ["m", "qm", "q"], ["half"]), N("Neg", ["half"], ["pos"]), N("Unsqueeze", ["pos", "ax"], ["u"]),
             c("start", np.int64([0])), c("axis1", np.int64([1])), N("Slice", ["x", "start", "u", "axis1"], ["y"])]
    # -(8 // -3) = 3 columns (a truncating division without the fix-up would give 2).
    m = model(nodes, [("x", [2, 8])], [("y", [2, 3])])
    x = _normal(np.random.default_rng(0), (2, 8))
    np.testing.assert_array_equal(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0])


def test_logic_of_computed_tensors_is_refused_by_name():
    m = model([N("Less", ["x", "x"], ["b"], name="l"), N("Where", ["b", "x", "x"], ["y"])], [("x", [2])], [("y", [2])])
    with pytest.raises(GraphError, match=r"node l \(Less\): input 'x' \(gemforge computes Less of constants"):
        compile_model(m)


@pytest.mark.parametrize("op, second, shape", [("Expand", np.int64([2, 1, 3]), [2, 4, 3]),
                                               ("Expand", np.int64([4, 1]), [4, 3]),
                                               ("Tile", np.int64([1, 2]), [4, 6]), ("Tile", np.int64([3, 1]), [12, 3])])
def test_expand_and_tile_of_computed_tensors(op, second, shape):
    rng = np.random.default_rng(len(shape))
    m = model([N("Relu", ["x"], ["r"]), N(op, ["r", "k"], ["y"])], [("x", [4, 3])], [("y", shape)], {"k": second})
    _same_as_onnx_runtime(m, {"x": _normal(rng, (4, 3))}, rng)


def test_a_returned_concatenation_of_parts_at_different_scales_keeps_each_part():
    """A detector's output: box coordinates up to 100 beside probabilities below 1. Joined at the
    coarsest part's int8 scale the probabilities all came out 0 or 1; the concatenation the model
    returns is joined in float32."""
    x = np.float32([[-1.0, -0.3, 0.3, 1.0]])
    m = model([N("Mul", ["x", "k"], ["boxes"]), N("Sigmoid", ["x"], ["scores"]),
               N("Concat", ["boxes", "scores"], ["y"], axis=1)], [("x", [1, 4])], [("y", [1, 8])], {"k": np.float32(100)})
    q = compile_model(m, quantize="int8", calibrate=np.stack([x, -x]), config="tiny")
    got, expected = q.run(x, "cpu"), ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(got[:, 4:], expected[:, 4:], atol=0.02)
    np.testing.assert_array_equal(got, q.run(x, "fsim"))


# ------------------------------------------------------------------------ ArgMax, ArgMin

@pytest.mark.parametrize("op, attrs", [("ArgMax", {"axis": 1}), ("ArgMin", {"axis": -1, "keepdims": 0}),
                                       ("ArgMax", {"axis": 2, "select_last_index": 1}), ("ArgMin", {})])
def test_argmax_and_argmin_give_int64_indices_as_onnx_runtime(op, attrs):
    """A segmentation or classification head's ArgMax/ArgMin: int64 indices equal to ONNX
    Runtime's in float32 (ties included: the first, or the last with select_last_index), saved and
    loaded; in an int8 network alike on fsim and the cpu."""
    rng = np.random.default_rng(len(attrs) + len(op))
    w = rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32)
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Relu", ["c"], ["r"]), N(op, ["r"], ["y"], **attrs)],
              [("x", ["N", 3, 6, 5])], [("y", None)], {"w": w})
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    x = rng.normal(size=(2, 3, 6, 5)).astype(np.float32)          # ReLU's zeros tie
    expected = ort_run(m, {"x": x})[0]
    got = Model.from_bytes(compile_model(m, batch=2).to_bytes()).run(x, "cpu")     # ArgMin's axis 0: the batch
    assert got.dtype == np.int64 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    q = compile_model(m, quantize="int8", calibrate=rng.normal(size=(3, 2, 3, 6, 5)).astype(np.float32), config="tiny",
                      batch=2)
    on_fsim = Model.from_bytes(q.to_bytes()).run(x, "fsim")
    np.testing.assert_array_equal(on_fsim, q.run(x, "cpu"))
    assert on_fsim.dtype == np.int64 and (on_fsim == expected).mean() > 0.7


def test_int64_indices_feed_only_the_outputs():
    m = model([N("ArgMax", ["x"], ["i"], axis=1), N("Add", ["i", "i"], ["y"], name="a")], [("x", [2, 3])],
              [("y", None)])
    with pytest.raises(GraphError, match=r"node a \(add\): it reads int64 indices \(an ArgMax's or ArgMin's\), "
                                         "which gemforge computes for the model's outputs only"):
        compile_model(m)
    m = model([N("ArgMax", ["x"], ["i"], axis=1), N("Cast", ["i"], ["y"], to=TensorProto.FLOAT, name="c")],
              [("x", [2, 3])], [("y", None)])
    with pytest.raises(GraphError, match=r"node c \(Cast\): a computed int64 tensor can only be cast to int64"):
        compile_model(m)


@pytest.mark.parametrize("lo, hi", [(0.0, 6.0), (-0.5, 0.25), (-np.inf, 1.0)])
def test_a_float_clip_joins_the_convolution_before_it(lo, hi):
    """ReLU6 and any Clip after a float32 convolution run in its epilogue (`fuse_clips`), giving
    ONNX Runtime's values; in an int8 network a clip from 0 or from the int8 minimum joins it
    too, alike on fsim and the cpu."""
    rng = np.random.default_rng(int(hi * 4))
    w = rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32)
    bounds = {k: np.float32(v) for k, v in (("lo", lo), ("hi", hi)) if np.isfinite(v)}
    operands = ["c", "lo" if "lo" in bounds else "", "hi"]
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Clip", operands, ["y"])], [("x", [1, 3, 7, 7])],
              [("y", None)], {"w": w, **bounds})
    compiled = compile_model(m)
    assert [n.op for n in compiled.graph.nodes] == ["conv2d"] and compiled.graph.nodes[0].attrs["hi"] == hi
    int8 = compile_model(m, quantize="int8", calibrate=_normal(rng, (3, 1, 3, 7, 7)), config="tiny").graph.nodes
    # int8: a lower bound of 0 (ReLU) or none joins the convolution too, as relu and hi (below
    # 127, the requantizing store's own clamp), run on the accelerator; other bounds stay apart.
    ops = [n.op for n in int8]
    if lo in (0.0, -np.inf):
        conv = int8[ops.index("conv2d")]
        assert "clip" not in ops and conv.attrs["relu"] == (lo == 0.0) and conv.attrs["hi"] < 127 and \
            conv.device == "accel"
    else:
        assert "clip" in ops
    _same_as_onnx_runtime(m, {"x": _normal(rng, (1, 3, 7, 7))}, rng, int8_tol=0.15)   # 0.75 wide: coarse int8
