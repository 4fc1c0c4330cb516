"""int8 quantization (`compiler/graph/quantize.py`) against ONNX Runtime: outputs that are
already float32, the int32 accumulator's range, biases large next to their weights and adds
of operands at scales far apart."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from gemforge.compiler.graph import GraphError
from gemforge.compiler.graph.ir import Graph, Node, Value
from gemforge.driver.model import Model, compile_model
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
