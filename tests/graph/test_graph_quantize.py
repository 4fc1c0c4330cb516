"""int8 quantization (`compiler/graph/quantize.py`) against ONNX Runtime: outputs that are
already float32, the int32 accumulator's range, biases large next to their weights and adds
of operands at scales far apart."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from gemforge.compiler.graph import GraphError
from gemforge.compiler.graph.evaluate import evaluate
from gemforge.compiler.graph.ir import Graph, Node, Value
from gemforge.driver.runtime.model import Model, compile_model
from onnx_models import model, ort_run

N = helper.make_node


def _writers(q: Model) -> dict[str, int]:
    count: dict[str, int] = {}
    for node in q.graph.nodes:
        count[node.output] = count.get(node.output, 0) + 1
    return count


def _float_path_output_models(rng):
    """Models where a tensor computed in float32 by the int8 network (a global average pool,
    a softmax, a clip narrower than its input) is a model output and read by an int8 node."""
    w = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    fc = rng.normal(0, 0.3, (8, 5)).astype(np.float32)
    conv = [N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Relu", ["c"], ["r"])]
    yield "global_pool", model(conv + [N("GlobalAveragePool", ["r"], ["feat"]), N("Flatten", ["feat"], ["f"]),
                                       N("Gemm", ["f", "fc"], ["logits"])],
                               [("x", [1, 3, 8, 8])], [("logits", None), ("feat", None)], {"w": w, "fc": fc})
    yield "softmax", model(conv + [N("Softmax", ["r"], ["s"], axis=1), N("Mul", ["s", "r"], ["z"])],
                           [("x", [1, 3, 8, 8])], [("s", None), ("z", None)], {"w": w})
    yield "clip", model(conv + [N("Clip", ["r", "lo", "hi"], ["k"]), N("Add", ["k", "r"], ["z"])],
                        [("x", [1, 3, 8, 8])], [("k", None), ("z", None)],
                        {"w": w, "lo": np.float32(0), "hi": np.float32(0.1)})


@pytest.mark.parametrize("which", ["global_pool", "softmax", "clip"])
def test_a_float32_tensor_that_is_an_output_and_read_by_an_int8_node(which):
    """Such a tensor got a second writer (a dequantize at exit writing its name), and the run
    failed with "x must be float32, not int8" on every device."""
    rng = np.random.default_rng(7)
    m = dict(_float_path_output_models(rng))[which]
    samples = rng.normal(size=(6, 1, 3, 8, 8)).astype(np.float32)
    x = samples[0]
    q = compile_model(m, quantize="int8", calibrate=samples, config="default")
    assert max(_writers(q).values()) == 1
    on_fsim, on_cpu = q.run(x, "fsim"), q.run(x, "cpu")
    loaded = Model.from_bytes(q.to_bytes()).run(x, "cpu")
    reference = dict(zip(q.outputs, ort_run(m, {"x": x})))
    scale = max(np.abs(r).max() for r in reference.values())     # the clip's error is its input's step
    for name, expected in reference.items():
        np.testing.assert_array_equal(on_fsim[name], on_cpu[name])
        np.testing.assert_array_equal(loaded[name], on_cpu[name])
        assert np.abs(on_cpu[name] - expected).max() <= 0.05 * scale


@pytest.mark.parametrize("copy", ["listed", "Identity", "Dropout"])
def test_an_input_returned_as_an_output_comes_back_exactly(copy):
    """A graph input returned as an output (listed directly, or through Identity or Dropout)
    came back through int8 at its calibrated scale, rounded and saturated (50 as 3.97); listed
    directly, a dequantize node even wrote over the graph input's own name."""
    rng = np.random.default_rng(14)
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [N("Conv", ["x", "w"], ["z"], pads=[1] * 4)]
    if copy != "listed":
        nodes.append(N(copy, ["x"], ["y"]))
    out = "x" if copy == "listed" else "y"
    m = model(nodes, [("x", [1, 3, 6, 6])], [("z", None), (out, [1, 3, 6, 6])], {"w": w})
    samples = rng.normal(size=(5, 1, 3, 6, 6)).astype(np.float32)
    x = samples[0].copy()
    x[0, 0, 0, 0] = 50.0                       # beyond the calibrated range
    q = compile_model(m, quantize="int8", calibrate=samples, config="default")
    assert "x" not in _writers(q) and max(_writers(q).values()) == 1
    expected = ort_run(m, {"x": x})[1]
    on_fsim, on_cpu = q.run(x, "fsim"), q.run(x, "cpu")
    np.testing.assert_array_equal(on_fsim["z"], on_cpu["z"])
    for got in (on_fsim, on_cpu):
        np.testing.assert_array_equal(got[out], expected)
        np.testing.assert_array_equal(got[out], x)


def _graph(nodes, inputs=("x",), outputs=("y",)) -> Graph:
    names = set(inputs) | {n.output for n in nodes}
    return Graph(list(inputs), list(outputs), nodes, {k: Value(k, (2,)) for k in names})


def test_the_graph_checker_refuses_a_second_writer_or_a_written_input():
    _graph([Node("relu", "a", ["x"], "y")]).check_writers()
    with pytest.raises(GraphError, match=r"internal error: tensor 'y' is written twice, by node a \(relu\) and "
                                         r"by node b \(identity\)"):
        _graph([Node("relu", "a", ["x"], "y"), Node("identity", "b", ["x"], "y")]).check_writers()
    with pytest.raises(GraphError, match=r"internal error: node b \(dequantize\) writes graph input 'x'"):
        _graph([Node("relu", "a", ["x"], "y"), Node("dequantize", "b", ["y"], "x")]).check_writers()


def _int32_worst_case(q: Model, node) -> float:
    """Σ|w_q|·128 + |bias_q| per output channel, the largest: recomputed from the compiled graph."""
    w, bias = (q.graph.constants[i].astype(np.float64) for i in node.inputs[1:3])
    per_channel = np.abs(w).reshape(len(w), -1).sum(axis=1) if node.op == "conv2d" else np.abs(w).sum(axis=0)
    return float((per_channel * 128 + np.abs(bias)).max())


@pytest.mark.parametrize("op", ["dense", "conv2d"])
def test_a_sum_that_could_overflow_int32_takes_coarser_weights(op):
    """140,000 products of int8 values at the top of their range (127 · 127 each) wrapped the
    int32 accumulator: the sign flipped, on fsim and the CPU alike, without a word."""
    k = 140_000
    w = np.full((k, 2), 127 / 2 ** 13, np.float32)
    w[:, 1] *= -1
    if op == "dense":
        m = model([N("MatMul", ["x", "w"], ["y"])], [("x", [1, k])], [("y", None)], {"w": w})
        x = np.full((1, k), 127 / 64, np.float32)
    else:      # C/groups·kh·kw = 15,556 · 3 · 3 = 140,004
        m = model([N("Conv", ["x", "w"], ["y"])], [("x", [1, 15_556, 3, 3])], [("y", None)],
                  {"w": np.full((2, 15_556, 3, 3), 127 / 2 ** 13, np.float32) * np.float32([1, -1])[:, None, None, None]})
        x = np.full((1, 15_556, 3, 3), 127 / 64, np.float32)
    q = compile_model(m, quantize="int8", calibrate=x[None], config="default")
    node = next(n for n in q.graph.nodes if n.op == op)
    assert _int32_worst_case(q, node) <= 2 ** 31 - 1
    expected = ort_run(m, {"x": x})[0]
    got = q.run(x, "fsim")
    np.testing.assert_array_equal(got, q.run(x, "cpu"))
    np.testing.assert_allclose(got, expected, rtol=0.02)


def test_an_int32_sum_of_variable_operands_that_could_overflow_is_refused():
    m = model([N("MatMul", ["a", "b"], ["y"])], [("a", [1, 140_000]), ("b", [140_000, 2])], [("y", None)])
    samples = {"a": np.ones((1, 1, 140_000), np.float32), "b": np.ones((1, 140_000, 2), np.float32)}
    with pytest.raises(GraphError, match=r"node y \(dense\): its int32 accumulator could reach 2\.29\de\+09 "
                                         r"\(beyond 2\^31 − 1\) with its variable weights"):
        compile_model(m, quantize="int8", calibrate=samples)


def test_a_bias_large_next_to_its_weights_takes_coarser_weights():
    """Weights near 1e-4 and a bias of 100 (a regression head) were refused: the bias did not fit
    int32 at the accumulator's scale 2^-25, though the output fits int8 at its own."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 4)) * 1e-4).astype(np.float32)
    m = model([N("Gemm", ["x", "w", "b"], ["y"])], [("x", [1, 16])], [("y", None)],
              {"w": w, "b": np.array([100, -50, 80, 30], np.float32)})
    samples = rng.random((8, 1, 16)).astype(np.float32)
    reported = []
    q = compile_model(m, quantize="int8", calibrate=samples, config="default", report=reported.append)
    node = next(n for n in q.graph.nodes if n.op == "dense")
    assert _int32_worst_case(q, node) <= 2 ** 31 - 1
    # The precision given up is reported, not silent: in the compile log and the summary.
    [row] = q.summary()["coarser_weights"]
    assert row["node"] == "y" and row["bits"] >= 1
    assert row["exponent"] == q.graph.values[node.inputs[1]].exponent
    assert any(line.startswith(f"quantize: node y (dense) takes its weights at 2^-{row['exponent']}, "
                               f"{row['bits']} bit") for line in reported)
    no_bias = model([N("MatMul", ["x", "w"], ["y"])], [("x", [1, 16])], [("y", None)], {"w": w})
    assert "coarser_weights" not in compile_model(no_bias, quantize="int8", calibrate=samples).summary()
    for x in samples[:3]:
        got = q.run(x, "fsim")
        np.testing.assert_array_equal(got, q.run(x, "cpu"))
        np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], atol=0.5)    # the output's step: 2^-0


def test_a_bias_no_weights_at_any_scale_can_sum_with_is_refused():
    w = np.full((16, 4), 1e-4, np.float32)
    m = model([N("Gemm", ["x", "w", "b"], ["y"])], [("x", [1, 16])], [("y", None)],
              {"w": w, "b": np.full(4, 1e9, np.float32)})
    with pytest.raises(GraphError, match=r"node y \(dense\): its int32 accumulator could reach .* at every scale "
                                         "where its weights do not all round to zero"):
        compile_model(m, quantize="int8", calibrate=np.ones((1, 1, 16), np.float32))


@pytest.mark.parametrize("order", [("x", "b"), ("b", "x")])
@pytest.mark.parametrize("branch", ["layer_scale", "input"])
def test_an_add_of_a_tensor_far_finer_than_the_other(order, branch):
    """x + Mul(x, 1e-7), a residual branch with a tiny layer scale: the operands' scales differed
    by more than the 2^23 an int32 sum aligns, and the add was refused. The finer one is
    requantized first (by 15 bits, all of them, where two inputs' scales are 2^40 apart)."""
    rng = np.random.default_rng(0)
    if branch == "layer_scale":
        m = model([N("Mul", ["x", "g"], ["b"]), N("Add", list(order), ["y"])], [("x", [2, 8])], [("y", [2, 8])],
                  {"g": np.full(8, 1e-7, np.float32)})
        samples = {"x": rng.standard_normal((8, 2, 8)).astype(np.float32)}
    else:
        m = model([N("Add", list(order), ["y"])], [("x", [2, 8]), ("b", [2, 8])], [("y", [2, 8])])
        samples = {"x": (rng.standard_normal((8, 2, 8)) * 1e6).astype(np.float32),
                   "b": (rng.standard_normal((8, 2, 8)) * 1e-6).astype(np.float32)}
    q = compile_model(m, quantize="int8", calibrate=samples, config="default")
    for i in range(3):
        feeds = {k: v[i] for k, v in samples.items()}
        got = q.run(feeds, "fsim")
        np.testing.assert_array_equal(got, q.run(feeds, "cpu"))
        np.testing.assert_array_equal(got, evaluate(q.graph, feeds)["y"])
        expected = ort_run(m, feeds)[0]
        assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()


def test_calibration_samples_that_are_zero_everywhere_are_refused():
    """All-zero samples gave every tensor the finest scale: a real input then saturated at
    127 · 2^-30 and the network answered 0 for everything, without a word."""
    m = model([N("Relu", ["x"], ["y"])], [("x", [1, 16])], [("y", None)])
    with pytest.raises(GraphError, match=r"the calibration samples of input\(s\) 'x' are 0 everywhere"):
        compile_model(m, quantize="int8", calibrate=np.zeros((3, 1, 16), np.float32))
    # One sample with any range is enough.
    samples = np.zeros((3, 1, 16), np.float32)
    samples[1, 0, 3] = -2.5
    x = np.random.default_rng(3).normal(size=(1, 16)).astype(np.float32)
    got = compile_model(m, quantize="int8", calibrate=samples).run(x, "cpu")
    # A peak of 2.5 takes the scale 2^-5 (power-of-two scales): int8 reaches 127/32.
    np.testing.assert_allclose(got, np.maximum(x, 0).clip(max=127 / 32), atol=1 / 64)


def test_a_tensor_that_is_zero_on_every_calibration_sample_is_reported():
    """A ReLU that only negative samples reach is 0 throughout calibration; its int8 scale is
    then a guess, and the report says so by name."""
    m = model([N("Neg", ["x"], ["n"]), N("Relu", ["n"], ["y"])], [("x", [1, 8])], [("y", None)])
    lines: list[str] = []
    compile_model(m, quantize="int8", calibrate=np.abs(np.random.default_rng(4).normal(size=(4, 1, 8))) + 0.1,
                  report=lines.append)
    assert any("quantize: 1 tensor (y) was 0 on every calibration sample" in line for line in lines), lines


@pytest.mark.parametrize("exponent", [-24, -5, 0, 6, 13, 30])
def test_quantize_array_in_float32_equals_the_exact_float64_rounding(exponent):
    """`quantize_array` scales float32 arrays in float32 (a power of two: exact, or saturating or
    flushing to what rounds the same): equal to rounding the exact float64 product, halves to
    even, infinities saturated, over magnitudes from 1e-40 to 1e38, in C and Fortran order."""
    from gemforge.compiler.graph.numeric import quantize_array
    rng = np.random.default_rng(exponent + 100)
    x = (rng.standard_normal(60_000) * 10.0 ** rng.uniform(-40, 38, 60_000)).astype(np.float32)
    halves = (np.arange(-300, 300) + 0.5).astype(np.float32) * np.float32(2.0 ** -exponent)
    x = np.concatenate([x, halves, np.float32([np.inf, -np.inf, 0.0, -0.0])])
    exact = np.clip(np.rint(x.astype(np.float64) * 2.0 ** exponent), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(quantize_array(x, exponent), exact)
    grid = x[:60_000].reshape(300, 200)
    np.testing.assert_array_equal(quantize_array(grid.T, exponent), exact[:60_000].reshape(300, 200).T)
    assert quantize_array(np.float32(x[0]), exponent) == exact[0]
