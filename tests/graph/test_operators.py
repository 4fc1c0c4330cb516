"""The graph operators' definitions (`compiler.graph.operators`): complete, and read where they are used."""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.compiler.graph import GraphError
from gemforge.compiler.graph.ir import Graph, Node, Value
from gemforge.compiler.graph.operators import OPERATORS, Int8, op_def
from gemforge.compiler.graph.operators.__main__ import GENERATED, with_generated
from gemforge.compiler.graph.passes import infer_shapes
from gemforge.compiler.ops.functions import FLOAT_FUNCTIONS
from gemforge.driver.runtime.model import Model


@pytest.mark.parametrize("what", list(GENERATED))
def test_the_generated_operator_lists_are_current(what):
    """compiler/EXTENDING.md holds the table the definitions give, and the README the list of ONNX
    operators the import's handlers give (regenerate both with
    ``python -m gemforge.compiler.graph.operators --write``)."""
    page = GENERATED[what][0].read_text()
    assert with_generated(page, what) == page


@pytest.mark.parametrize("name", list(OPERATORS))
def test_every_operator_runs_on_the_host_or_is_removed_before(name):
    """An operator a compiled graph can hold has a host kernel or a numpy data movement; the one
    that has neither (batch_norm) is folded away before anything compiles."""
    d = OPERATORS[name]
    assert d.name == name and callable(d.shape) and callable(d.evaluate)
    assert (d.host is not None) != (d.move is not None) or (d.int8 == Int8.NONE and name == "batch_norm")


def test_every_float_function_is_a_float_island_with_its_gpu_support():
    for name, f in FLOAT_FUNCTIONS.items():
        d = OPERATORS[name]
        assert d.int8 == Int8.FLOAT and d.gpu == f.gpu and ("alpha" in d.attrs) == f.alpha


def _graph(node: Node, shapes: dict[str, tuple[int, ...]]) -> Graph:
    values = {k: Value(k, v) for k, v in shapes.items()}
    values[node.output] = Value(node.output)
    return Graph([k for k in shapes], [node.output], [node], values)


@pytest.mark.parametrize("node, message", [
    (Node("relu", "r", ["x", "y"], "out"), r"node r \(relu\): it has 2 inputs; relu takes 1"),
    (Node("add", "a", ["x"], "out", {"relu": False}), r"node a \(add\): it has 1 input; add takes 2"),
    (Node("conv2d", "c", ["x"], "out", {"stride": 1, "padding": 0, "groups": 1, "relu": False}),
     r"node c \(conv2d\): it has 1 input; conv2d takes 2 to 4"),
    (Node("gelu", "g", ["x"], "out"), r"node g: unknown graph operator 'gelu'; known: conv2d, unfold, dense, add"),
])
def test_shape_inference_checks_the_arity_and_the_operator(node, message):
    with pytest.raises(GraphError, match=message):
        infer_shapes(_graph(node, {"x": (2, 3), "y": (2, 3)}))


def test_a_network_on_the_gpu_runs_what_the_gpu_back_end_lacks_on_the_cpu():
    """The runtime places a node by its definition's GPU support: softmax, means and the
    exponential functions beside the GPU, on the CPU; everything else stays on the GPU."""
    placed = {name: Model._host_target_kind(Node(name, name, ["x"], "y"), "gpu") for name in OPERATORS}
    assert placed["softmax"] == placed["reduce_mean"] == placed["sigmoid"] == placed["exp"] == "cpu"
    assert placed["conv2d"] == placed["relu"] == placed["sqrt"] == placed["max_pool"] == "gpu"
    assert all(Model._host_target_kind(Node(name, name, ["x"], "y"), "cpu") == "cpu" for name in OPERATORS)


def test_the_semantics_are_the_definitions():
    """`evaluate` is each definition's semantics: a new function is computed where it is defined."""
    x = np.float32([-2, -0.5, 0, 0.5, 2])
    node = Node("thresholded_relu", "t", ["x"], "y", {"alpha": 0.5})
    np.testing.assert_array_equal(op_def(node).evaluate(node, [x]), np.float32([0, 0, 0, 0, 2]))


@pytest.mark.parametrize("seed", range(6))
def test_unfold_then_a_1x1_convolution_is_the_convolution(seed):
    """`unfold`'s patches, in the weights' (I, H, W) order, make any convolution (strides, uneven
    padding, rectangular kernels) a 1×1 convolution of the reshaped weights: equal in float64 sums
    and exactly equal in int8 arithmetic."""
    from gemforge.compiler.graph.operators.linear import _unfold_evaluate
    rng = np.random.default_rng(seed)
    c, o, kh, kw, stride = (int(v) for v in (rng.integers(1, 4), rng.integers(1, 5), rng.integers(1, 6),
                                              rng.integers(1, 6), rng.integers(1, 4)))
    pads = tuple(int(v) for v in rng.integers(0, 3, 4))
    x = rng.integers(-128, 128, (2, c, int(rng.integers(kh, 12)), int(rng.integers(kw, 12)))).astype(np.int8)
    w = rng.integers(-128, 128, (o, c, kh, kw)).astype(np.int8)
    conv = Node("conv2d", "c", ["x", "w"], "y", {"stride": stride, "padding": pads, "groups": 1, "relu": False})
    unfold = Node("unfold", "u", ["x"], "p", {"kernel": (kh, kw), "stride": stride, "padding": pads})
    patches = _unfold_evaluate(unfold, [x])
    expected = OPERATORS["conv2d"].evaluate(conv, [x.astype(np.float64), w.astype(np.float64)])
    one_by_one = Node("conv2d", "c1", ["p", "w1"], "y", {"stride": 1, "padding": 0, "groups": 1, "relu": False})
    got = OPERATORS["conv2d"].evaluate(one_by_one, [patches.astype(np.float64),
                                                    w.reshape(o, -1, 1, 1).astype(np.float64)])
    assert patches.shape == (2, c * kh * kw, *expected.shape[2:])
    np.testing.assert_array_equal(got, expected)
