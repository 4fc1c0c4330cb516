"""The layout operators (Squeeze, Unsqueeze, Transpose) against ONNX Runtime: float32 on the
cpu, int8 bit-identical on fsim, the cpu and the graph's numpy semantics, each network
through a .gfm round trip; their attributes' refusals and how they treat a batch."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from gemforge.compiler.graph import GraphError
from gemforge.compiler.graph.evaluate import evaluate
from gemforge.driver.model import Model, compile_model
from onnx_models import model, ort_run

pytest.importorskip("onnxruntime")
N = helper.make_node


def _normal(rng, shape) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def _same_as_onnx_runtime(m, feeds: dict[str, np.ndarray], rng, *, int8: bool = True, rtol: float = 1e-5):
    """The float32 network equals ONNX Runtime within ``rtol`` on the cpu (and so do the graph's
    numpy semantics and the network loaded from its .gfm); the int8 network, calibrated on
    ``feeds`` and a few more samples like them, runs bit for bit alike on fsim, the cpu, in
    numpy and loaded, within a few steps of its output's scale of ONNX Runtime's."""
    expected = dict(zip([o.name for o in m.graph.output], ort_run(m, feeds)))
    scale = max(float(np.nanmax(np.abs(e[np.isfinite(e)]), initial=0)) for e in expected.values()) or 1.0
    runs = [compile_model(m)]
    if int8:
        samples = {k: np.stack([v] + [_normal(rng, v.shape) * float(np.abs(v).max()) for _ in range(3)])
                   for k, v in feeds.items()}
        runs.append(compile_model(m, quantize="int8", calibrate=samples, config="tiny"))
    arg = feeds if len(feeds) > 1 else next(iter(feeds.values()))
    for compiled in runs:
        got = compiled.run(arg, "cpu")
        got = got if isinstance(got, dict) else {compiled.outputs[0]: got}
        loaded = Model.from_bytes(compiled.to_bytes()).run(arg, "cpu")
        loaded = loaded if isinstance(loaded, dict) else {compiled.outputs[0]: loaded}
        ref = evaluate(compiled.graph, feeds)
        if compiled.dtype == "int8":
            on_fsim = compiled.run(arg, "fsim")
            on_fsim = on_fsim if isinstance(on_fsim, dict) else {compiled.outputs[0]: on_fsim}
        for name, e in expected.items():
            g = got[name]
            assert g.shape == e.shape and g.dtype == np.float32, (name, g.shape, e.shape)
            np.testing.assert_array_equal(loaded[name], g)
            if compiled.dtype == "float32":
                np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * scale)
                np.testing.assert_allclose(ref[name], e, rtol=rtol, atol=rtol * scale)
            else:
                np.testing.assert_array_equal(on_fsim[name], g)
                np.testing.assert_array_equal(ref[name], g)
                assert np.abs(g - e).max() <= 0.05 * scale, (name, np.abs(g - e).max(), scale)
    return runs


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
     r"node s \(Squeeze\): the axes must be a 1-D integer tensor, not float32 of shape \[1\]"),
    (N("Unsqueeze", ["x", "a"], ["y"], name="u"), [2, 3], {"a": np.int64([1, -3])},
     r"node u \(reshape\): axes \[1, -3\] name an axis of the rank-4 output twice"),
    (N("Unsqueeze", ["x", "a"], ["y"], name="u"), [2, 3], {"a": np.int64([3])},
     r"node u \(reshape\): axes \[3\] are out of range for rank 3 \(from -3 to 2\)"),
    (N("Transpose", ["x"], ["y"], perm=[1, 1], name="t"), [2, 3], {},
     r"node t \(transpose\): perm \[1, 1\] must be a permutation of the input's axes, \[0, 1\]"),
    (N("Transpose", ["x"], ["y"], perm=[-1, 0], name="t"), [2, 3], {}, r"perm \[-1, 0\] must be a permutation"),
    (N("Transpose", ["x"], ["y"], perm=[0], name="t"), [2, 3], {}, r"perm \[0\] must be a permutation"),
])
def test_layout_refusals(node, shape, init, match):
    inputs = [("x", shape)] + ([("a", [1])] if "a" in node.input and "a" not in init else [])
    m = model([node], inputs, [("y", [1])], init)
    with pytest.raises(GraphError, match=match) as info:
        compile_model(m)
    assert "\n" not in str(info.value)


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
