"""The graph compiler at its edges: names that collide or are made up, calibration samples that
cannot be used, artefacts that are corrupt or could never run, batch chunking, int8 clips and
scales far apart, constants of every kind, and the front end's messages for models that break
ONNX's rules."""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import numpy as np
import onnx
import pytest
from onnx import helper

from gemforge.compiler.graph import GraphError
from gemforge.compiler.graph.evaluate import evaluate
from gemforge.driver.tools.cli import main
from gemforge.driver.runtime.model import Model, ModelError, compile_model
from onnx_models import model, ort_run, small_cnn

N = helper.make_node


def test_accelerator_output_read_later_in_another_layout():
    """conv c0's packed output is read again, after another accelerator layer, by a dense
    layer that needs the matrix layout: it goes through the host, not a dead arena slot."""
    rng = np.random.default_rng(19)
    init = {"w0": rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32),
            "w1": rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32),
            "m": rng.normal(0, 0.5, (4, 4)).astype(np.float32)}
    m = model([N("Conv", ["x", "w0"], ["c0"], pads=[1] * 4), N("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
               N("MatMul", ["c0", "m"], ["d"]), N("Add", ["d", "c1"], ["y"])], [("x", [1, 4, 4, 4])], [("y", None)],
              init)
    x = rng.normal(size=(1, 4, 4, 4)).astype(np.float32)
    q = compile_model(m, quantize="int8", calibrate=x[None], config="tiny")
    assert [n.device for n in q.graph.nodes if n.op in ("conv2d", "dense")] == ["accel"] * 3
    np.testing.assert_array_equal(q.run(x, "fsim"), q.run(x, "cpu"))


def test_duplicate_and_colliding_node_names():
    rng = np.random.default_rng(16)
    w = {"w": rng.normal(size=(4, 4, 3, 3)).astype(np.float32), "v": rng.normal(size=(4, 4, 1, 1)).astype(np.float32)}
    m = model([N("Conv", ["x", "w"], ["a"], pads=[1] * 4, name="conv"), N("Conv", ["a", "v"], ["y"], name="conv")],
              [("x", [1, 4, 5, 5])], [("y", None)], w)
    x = rng.normal(size=(1, 4, 5, 5)).astype(np.float32)
    unique = onnx.ModelProto()
    unique.CopyFrom(m)
    unique.graph.node[1].name = "conv_2"      # ONNX Runtime refuses the duplicate; the checker does not
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(unique, {"x": x})[0], rtol=1e-4, atol=1e-4)
    # A node named "b" writes a; an unnamed node writes b.
    m = model([N("Relu", ["x"], ["a"], name="b"), N("MaxPool", ["a"], ["y"], kernel_shape=[2, 2])],
              [("x", [1, 4, 5, 5])], [("y", None)])
    m.graph.node[1].output[0] = "b"
    m.graph.output[0].name = "b"
    assert compile_model(m).run(x, "cpu").shape == ort_run(m, {"x": x})[0].shape == (1, 4, 4, 4)


def test_outputs_keep_their_onnx_names():
    m = model([N("Relu", ["x"], ["r"]), N("Identity", ["r"], ["y"]), N("Relu", ["x"], ["z0"]),
               N("Dropout", ["z0"], ["z"])], [("x", [2, 3])], [("y", [2, 3]), ("z", [2, 3])])
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    for compiled in (compile_model(m), compile_model(m, quantize="int8", calibrate=x[None], config="tiny")):
        assert compiled.outputs == ["y", "z"]
        out = compiled.run(x, "cpu")
        assert set(out) == {"y", "z"} and np.allclose(out["y"], np.maximum(x, 0), atol=0.02)
    # Two outputs of one tensor are two outputs.
    m = model([N("Relu", ["x"], ["r"]), N("Identity", ["r"], ["y"])], [("x", [2, 3])], [("y", [2, 3]), ("r", [2, 3])])
    out = compile_model(m).run(x, "cpu")
    assert set(out) == {"y", "r"} and np.array_equal(out["y"], out["r"])


def test_calibration_refuses_non_finite_unknown_and_non_numeric_samples():
    m = small_cnn(np.random.default_rng(1), channels=4, image=6, batch=1)
    bad = np.zeros((2, 1, 3, 6, 6), np.float32)
    bad[1, 0, 0, 0, 0] = np.nan
    for calibrate, match in ((bad, "NaN or infinite"), ({"input": bad[:1], "other": bad[:1]}, "unknown input"),
                             (np.array([["a"]]), "must be numeric"), (bad.astype(bool), "must be numeric"),
                             (bad.astype(np.complex64), "must be numeric")):
        with pytest.raises(GraphError, match=match):
            compile_model(m, quantize="int8", calibrate=calibrate, config="tiny")


def test_calibration_overflow_is_one_error_without_numpy_warnings():
    m = model([N("MatMul", ["x", "w"], ["y"])], [("x", [2, 4])], [("y", [2, 3])],
              {"w": np.full((4, 3), 1e30, np.float32)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # numpy's RuntimeWarning would fail the test
        with pytest.raises(GraphError, match="calibration sample 0 makes tensor 'y' overflow float32"):
            compile_model(m, quantize="int8", calibrate=np.full((1, 2, 4), 1e20, np.float32), config="tiny")
        with pytest.raises(GraphError, match="beyond float32's range"):
            compile_model(m, quantize="int8", calibrate=np.full((1, 2, 4), 1e300), config="tiny")


def test_concat_of_scales_far_apart_stays_exact():
    rng = np.random.default_rng(10)
    m = model([N("Concat", ["x", "y"], ["z"], axis=1)], [("x", [2, 3]), ("y", [2, 3])], [("z", None)])
    x, y = (rng.normal(size=(2, 3)) * 1e-8).astype(np.float32), (rng.normal(size=(2, 3)) * 1e4).astype(np.float32)
    q = compile_model(m, quantize="int8", calibrate={"x": x[None], "y": y[None]}, config="tiny")
    feeds = {"x": np.full((2, 3), 1e-7, np.float32), "y": y}
    np.testing.assert_array_equal(q.run(feeds, "cpu"), evaluate(q.graph, feeds)["z"])


def _rezip(data: bytes, edit) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for item in src.namelist():
            content = src.read(item)
            if item == "manifest.json":
                content = json.dumps(edit(json.loads(content))).encode()
            z.writestr(item, content)
    return out.getvalue()


def test_corrupt_artefacts_are_refused(tmp_path):
    rng = np.random.default_rng(2)
    m = small_cnn(rng, channels=4, image=6, batch=1)
    data = compile_model(m, quantize="int8", calibrate=rng.normal(size=(1, 1, 3, 6, 6)).astype(np.float32),
                         config="tiny").to_bytes()

    def node_edit(key, value, index=1):
        def edit(manifest):
            manifest["graph"]["nodes"][index][key] = value
            return manifest
        return edit
    edits = [lambda mf: [mf], lambda mf: {k: v for k, v in mf.items() if k != "dtype"},
             node_edit("inputs", ["nowhere"]), node_edit("op", "frobnicate"), node_edit("attrs", {}),
             node_edit("device", "accel", index=0), lambda mf: {**mf, "plan": {**mf["plan"], "peak_bytes": 1}},
             node_edit("attrs", {"exponent": 2000}, index=0), node_edit("attrs", {"exponent": -10 ** 6}, index=0)]
    for i, edit in enumerate(edits):
        with pytest.raises(ModelError, match="not a valid gemforge model|is not a gemforge model"):
            Model.from_bytes(_rezip(data, edit), source=f"edit{i}")
    flipped = bytearray(data)
    start = data.index(b"PK\x03\x04", 4)      # inside the first member's compressed bytes
    flipped[start - 40:start - 30] = b"\xff" * 10
    with pytest.raises(ModelError):
        Model.from_bytes(bytes(flipped))
    (tmp_path / "bad.gfm").write_bytes(_rezip(data, node_edit("op", "frobnicate")))
    assert main(["run", str(tmp_path / "bad.gfm"), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 2


def test_external_data_and_multi_input_calibration_from_the_cli(tmp_path, capsys):
    rng = np.random.default_rng(22)
    w = rng.normal(size=(8, 4)).astype(np.float32)
    m = model([N("MatMul", ["a", "w"], ["p"]), N("Add", ["p", "b"], ["y"])], [("a", [2, 8]), ("b", [2, 4])],
              [("y", None)], {"w": w})
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin",
                    size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    a, b = rng.normal(size=(2, 8)).astype(np.float32), rng.normal(size=(2, 4)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", a=np.stack([a, -a]), b=np.stack([b, -b]))
    assert main(["compile", str(path), "--quantize", "int8", "--calibrate", str(tmp_path / "calib.npz"),
                 "--config", "tiny", "-o", str(tmp_path / "q.gfm")]) == 0
    capsys.readouterr()
    np.savez(tmp_path / "x.npz", a=a, b=b)
    assert main(["run", str(tmp_path / "q.gfm"), "--input", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npy"),
                 "--device", "fsim"]) == 0
    expected = a @ w + b
    assert np.abs(np.load(tmp_path / "y.npy") - expected).max() < 0.1 * np.abs(expected).max()


def test_device_argument_must_be_a_device():
    m = compile_model(model([N("Relu", ["x"], ["y"])], [("x", [2])], [("y", None)]))
    for bad in (None, 5):
        with pytest.raises(ModelError, match="device must be a name"):
            m.run(np.zeros(2, np.float32), bad)


def test_conv_padded_beyond_its_kernel_and_input_checks(tmp_path, capsys):
    rng = np.random.default_rng(5)
    m = model([N("Conv", ["x", "w"], ["y"], pads=[2] * 4)], [("x", [1, 3, 4, 4])], [("y", None)],
              {"w": rng.normal(size=(4, 3, 1, 1)).astype(np.float32)})
    x = rng.normal(size=(1, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    q = compile_model(m, quantize="int8", calibrate=x[None], config="tiny")   # the accelerator refuses: CPU
    assert [r["device"] for r in q.graph.notes.partition if r["op"] == "conv2d"] == ["cpu"]
    np.testing.assert_array_equal(q.run(x, "fsim"), q.run(x, "cpu"))
    with pytest.raises(GraphError, match="non-positive dimension"):
        compile_model(model([N("Relu", ["x"], ["y"])], [("x", [0, 3])], [("y", [0, 3])]))
    mixed = model([N("Constant", [], ["c"], value=helper.make_tensor("v", onnx.TensorProto.INT64, [2], [1, 2])),
                   N("Add", ["x", "c"], ["y"])], [("x", [2])], [("y", [2])])
    with pytest.raises(GraphError, match="reads constant 'c' of type int64; its operands must be float32"):
        compile_model(mixed)
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    assert main(["compile", str(tmp_path / "m.onnx"), "--config", "tiny", "-o", str(tmp_path / "m.gfm")]) == 2
    assert "--config chooses the accelerator of an int8 network" in capsys.readouterr().err


def test_made_up_tensor_names_never_take_the_models():
    """A Gemm's scaled weight and bias get made-up names (``y/w``, ``y/bias``); a model may
    already use them, as an initializer or as a later node's output."""
    rng = np.random.default_rng(21)
    init = {"w": rng.normal(size=(3, 5)).astype(np.float32), "c": rng.normal(size=(5,)).astype(np.float32),
            "y/bias": rng.normal(size=(5,)).astype(np.float32)}
    m = model([N("Gemm", ["x", "w", "c"], ["y"], beta=2.0), N("Add", ["y", "y/bias"], ["t"]),
               N("Relu", ["t"], ["y/w"]), N("Add", ["y/w", "y/bias"], ["z"])],
              [("x", [2, 3])], [("z", [2, 5])], init)
    x = rng.normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_node_names_the_passes_make_up_stay_unique():
    """Nodes the import and the passes add (``y/identity``, ``bn/scale``, ``x/quantize``) and two
    requantizations of one tensor for two Concats each get a name, and a kernel, of their own."""
    rng = np.random.default_rng(22)
    init = {"k": np.float32(3.0), "s": rng.uniform(0.5, 2, 4).astype(np.float32),
            "b": rng.normal(size=4).astype(np.float32), "mean": rng.normal(size=4).astype(np.float32),
            "var": rng.uniform(0.5, 2, 4).astype(np.float32)}
    m = model([N("Mul", ["x", "k"], ["m"], name="y/identity"), N("Relu", ["m"], ["r"], name="bn/scale"),
               N("BatchNormalization", ["r", "s", "b", "mean", "var"], ["n"], name="bn"),
               N("Identity", ["n"], ["y"])], [("x", [2, 4])], [("y", [2, 4])], init)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    net = compile_model(m)
    assert len({node.name for node in net.graph.nodes}) == len(net.graph.nodes)
    np.testing.assert_allclose(net.run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)

    # DenseNet-style reuse: x joins two Concats whose other inputs need different scales (read
    # inside the network: a Concat the model returns with parts at different scales is float32).
    m = model([N("Mul", ["x", "k10"], ["m10"], name="x/quantize"), N("Mul", ["x", "k100"], ["m100"]),
               N("Concat", ["x", "m10"], ["c1"], axis=1), N("Concat", ["x", "m100"], ["c2"], axis=1),
               N("Relu", ["c1"], ["y1"]), N("Relu", ["c2"], ["y2"])],
              [("x", [2, 4])], [("y1", [2, 8]), ("y2", [2, 8])],
              {"k10": np.float32(10), "k100": np.float32(100)})
    q = compile_model(m, quantize="int8", calibrate=rng.normal(size=(16, 2, 4)).astype(np.float32),
                      config="tiny")
    assert len({node.name for node in q.graph.nodes}) == len(q.graph.nodes)
    assert len([node for node in q.graph.nodes if node.op == "requantize"]) == 2
    exact = evaluate(q.graph, {"x": x})
    for device in ("cpu", "fsim"):
        got = q.run(x, device)
        for name in ("y1", "y2"):
            np.testing.assert_array_equal(got[name], exact[name])


@pytest.mark.parametrize("nodes, init, mixes", [
    ([N("Softmax", ["x"], ["y"], axis=0)], {}, "normalizes over the batch axis"),
    ([N("Flatten", ["x"], ["y"], axis=0)], {}, "reshapes across the batch axis"),
    ([N("Concat", ["x", "c"], ["y"], axis=0)], {"c": np.ones((1, 3), np.float32)}, "concatenates along the batch"),
    ([N("Add", ["x", "c"], ["y"])], {"c": np.ones((2, 1, 3), np.float32)}, "broadcasting moves the batch axis"),
    ([N("Softmax", ["x"], ["s"], axis=1), N("Flatten", ["s"], ["f"]), N("Add", ["f", "c"], ["y"])],
     {"c": np.ones((1, 3), np.float32)}, None),
])
def test_batch_chunks_only_where_items_stay_apart(nodes, init, mixes):
    """A symbolic-batch model compiled for batch 1 runs 4 items in chunks only where no node
    combines or moves them; elsewhere the run is refused, naming the node (never a wrong result)."""
    m = model(nodes, [("x", ["N", 3])], [("y", None)], init)
    x = np.random.default_rng(23).normal(size=(4, 3)).astype(np.float32)
    net = compile_model(m)
    if mixes:
        with pytest.raises(ModelError, match=f"cannot run 4 items a batch at a time: node .*{mixes}.*--batch 4"):
            net.run(x, "cpu")
        np.testing.assert_allclose(compile_model(m, batch=4).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)
    else:
        np.testing.assert_allclose(net.run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_an_input_of_fixed_shape_goes_whole_to_every_batch_chunk():
    m = model([N("Add", ["x", "b"], ["y"])], [("x", ["N", 3]), ("b", [1, 3])], [("y", None)])
    rng = np.random.default_rng(24)
    feeds = {"x": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=(1, 3)).astype(np.float32)}
    np.testing.assert_allclose(compile_model(m).run(feeds, "cpu"), ort_run(m, feeds)[0], rtol=1e-6)


def test_int8_add_of_a_constant_far_finer_than_its_tensor():
    """Add(x, 1e-7) and a BatchNormalization with mean 1e-8 were refused ("scales differ by
    2^25"); the constant is quantized no finer than the sum can align."""
    rng = np.random.default_rng(29)
    samples = rng.normal(size=(4, 2, 8)).astype(np.float32)
    m = model([N("Add", ["x", "c"], ["y"])], [("x", [2, 8])], [("y", [2, 8])], {"c": np.float32(1e-7)})
    q = compile_model(m, quantize="int8", calibrate=samples, config="tiny")
    np.testing.assert_allclose(q.run(samples[0], "fsim"), ort_run(m, {"x": samples[0]})[0], atol=2 ** -5)


def test_int8_range_beyond_the_coarsest_scale_is_refused_not_saturated():
    m = model([N("Relu", ["x"], ["y"])], [("x", [2, 8])], [("y", [2, 8])])
    with pytest.raises(GraphError, match=r"tensor 'x' reaches 3e\+10, beyond the ±2.13e\+09 int8 represents"):
        compile_model(m, quantize="int8", calibrate=np.full((1, 2, 8), 3e10, np.float32), config="tiny")


def test_front_end_messages_for_listed_twice_empty_names_and_initializer_inputs():
    m = model([N("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3]), ("y", [2, 3])])
    with pytest.raises(GraphError, match="model output 'y' is listed twice"):
        compile_model(m)
    # ONNX Runtime refuses a Concat with an omitted input; it was dropped silently.
    m = model([N("Concat", ["x", ""], ["y"], axis=1)], [("x", [2, 3])], [("y", [2, 3])])
    with pytest.raises(GraphError, match="input 1 has an empty name, which marks an omitted optional input"):
        compile_model(m)
    # An initializer listed as an input too is compiled as its constant, and feeding it says so.
    m = model([N("Add", ["x", "b"], ["y"])], [("x", [2, 3]), ("b", [3])], [("y", [2, 3])],
              {"b": np.ones(3, np.float32)})
    compiled = compile_model(m)
    x = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(compiled.run(x, "cpu"), np.ones((2, 3), np.float32))
    with pytest.raises(ModelError, match="input.s. b are initializers the ONNX model also lists as inputs"):
        compiled.run({"x": x, "b": np.zeros(3, np.float32)}, "cpu")


@pytest.mark.parametrize("u_shape", [[3, 4], []])
def test_an_output_computed_without_the_batch_is_not_repeated_per_chunk(u_shape):
    """v = Relu(u) beside y = Relu(x[N]): run in 4 chunks, v came back stacked 4 times (and a
    scalar v raised numpy's "zero-dimensional arrays cannot be concatenated")."""
    m = model([N("Relu", ["x"], ["y"]), N("Relu", ["u"], ["v"])], [("x", ["N", 4]), ("u", u_shape)],
              [("y", None), ("v", None)])
    rng = np.random.default_rng(28)
    feeds = {"x": rng.normal(size=(4, 4)).astype(np.float32), "u": rng.normal(size=u_shape).astype(np.float32)}
    got, expected = compile_model(m).run(feeds, "cpu"), ort_run(m, feeds)
    assert got["y"].shape == (4, 4) and got["v"].shape == tuple(u_shape)
    np.testing.assert_allclose(got["y"], expected[0])
    np.testing.assert_allclose(got["v"], expected[1])


@pytest.mark.parametrize("lo, hi, scale", [(-1.0, 1.0, 20.0), (0.0, 6.0, 80.0), (10.0, 20.0, 0.25)])
def test_int8_clip_quantizes_its_input_on_what_it_lets_through(lo, hi, scale):
    """A hardtanh after a layer reaching ~200 rounded ±1 to 0, a ReLU6 after one reaching ~900
    gave zeros, and a Clip(10, 20) of values near 2 saturated below 10: a tensor only clips
    read is now calibrated on the clips' outputs."""
    rng = np.random.default_rng(25)
    init = {"w": (rng.normal(size=(16, 8)) * scale).astype(np.float32), "lo": np.float32(lo), "hi": np.float32(hi)}
    m = model([N("Gemm", ["x", "w"], ["h"]), N("Clip", ["h", "lo", "hi"], ["y"])], [("x", [4, 16])],
              [("y", [4, 8])], init)
    x = rng.normal(size=(4, 16)).astype(np.float32)
    q = compile_model(m, quantize="int8", calibrate=rng.normal(size=(16, 4, 16)).astype(np.float32),
                      config="default")
    got = q.run(x, "fsim")
    np.testing.assert_array_equal(got, q.run(x, "cpu"))
    expected = ort_run(m, {"x": x})[0]
    # The layer's own int8 error is ~1 % of its range, so of the order of the clip's range:
    # the mean error, not each element's, shows whether the clip survived quantization.
    assert np.abs(got - expected).mean() <= 0.1 * np.abs(expected).max()


@pytest.mark.parametrize("between", ["Flatten", "MaxPool", "Relu"])
def test_int8_clip_narrows_through_operators_that_keep_the_scale(between):
    """Clip(Flatten(Conv(x)), -0.2, 0.2) with the conv reaching ~±10 was all zeros: the
    narrowing now follows the clip's input back through Flatten, MaxPool or Relu."""
    rng = np.random.default_rng(27)
    init = {"w": (rng.normal(size=(4, 3, 3, 3)) * 3).astype(np.float32), "lo": np.float32(-0.2),
            "hi": np.float32(0.2)}
    mid = N(between, ["c"], ["p"], **({"kernel_shape": [1, 1]} if between == "MaxPool" else {}))
    out_shape = [1, 144] if between == "Flatten" else [1, 4, 6, 6]
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), mid, N("Clip", ["p", "lo", "hi"], ["y"])],
              [("x", [1, 3, 6, 6])], [("y", out_shape)], init)
    samples = rng.normal(size=(6, 1, 3, 6, 6)).astype(np.float32)
    q = compile_model(m, quantize="int8", calibrate=samples, config="default")
    got, expected = q.run(samples[0], "fsim"), ort_run(m, {"x": samples[0]})[0]
    np.testing.assert_array_equal(got, q.run(samples[0], "cpu"))
    assert np.count_nonzero(got) >= 0.9 * np.count_nonzero(expected)
    assert np.abs(got - expected).mean() <= 0.1 * np.abs(expected).max()


def test_int8_clip_of_a_tensor_read_at_a_wider_range_runs_on_its_own_scale():
    """y = Clip(x, 0, 0.1) beside z = Relu(x), x reaching ~15: x keeps its coarse scale for the
    Relu, so the clip's bounds rounded to 0 and y was all zeros; it now runs in float32."""
    rng = np.random.default_rng(15)
    m = model([N("Clip", ["x", "lo", "hi"], ["y"]), N("Relu", ["x"], ["z"])], [("x", [2, 8])],
              [("y", [2, 8]), ("z", [2, 8])], {"lo": np.float32(0), "hi": np.float32(0.1)})
    samples = (rng.standard_normal((6, 2, 8)) * 5).astype(np.float32)
    q = compile_model(m, quantize="int8", calibrate=samples, config="default")
    got, expected = q.run(samples[0], "fsim")["y"], ort_run(m, {"x": samples[0]})[0]
    assert np.count_nonzero(got) == np.count_nonzero(expected) > 0
    assert np.abs(got - expected).max() <= 0.1 * 0.01


def test_constants_computed_from_constants_and_every_constant_attribute():
    """A Conv weight scaled by a Mul and a Reshape shape made by an Add are folded at import
    (they were refused as "must be a constant"); Constant's value_float(s)/value_int(s) work."""
    rng = np.random.default_rng(26)
    init = {"w0": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "k": np.float32(0.5),
            "s0": np.array([0, -2], np.int64), "s1": np.array([1, 1], np.int64)}
    m = model([N("Mul", ["w0", "k"], ["w"]), N("Conv", ["x", "w"], ["c"], pads=[1] * 4),
               N("Add", ["s0", "s1"], ["shape"]), N("Reshape", ["c", "shape"], ["y"])],
              [("x", [1, 3, 5, 5])], [("y", [1, 100])], init)
    x = rng.normal(size=(1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    m = model([N("Constant", [], ["f"], value_floats=[1.0, 2.0]), N("Constant", [], ["g"], value_float=3.0),
               N("Constant", [], ["s"], value_ints=[2, 3]), N("Add", ["x", "f"], ["a"]), N("Mul", ["a", "g"], ["b"]),
               N("Reshape", ["b", "s"], ["y"])], [("x", [3, 2])], [("y", [2, 3])])
    x = rng.normal(size=(3, 2)).astype(np.float32)
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-6)


def test_a_model_file_that_unpacks_beyond_reason_is_refused_unread():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", b" " * (100 << 20))      # 100 MiB of blanks, ~100 KB packed
    with pytest.raises(ModelError, match="manifest.json unpacks to 104,857,600 bytes"):
        Model.from_bytes(buffer.getvalue(), source="bomb.gfm")


def test_model_file_messages_say_what_is_wrong(tmp_path):
    (tmp_path / "dir.onnx").mkdir()
    (tmp_path / "empty.onnx").write_bytes(b"")
    for path, message in ((tmp_path / "dir.onnx", "is a directory or device, not a file"),
                          (tmp_path / "empty.onnx", "is an empty file, not an ONNX model"),
                          (tmp_path / "none.onnx", "no such file")):
        with pytest.raises(GraphError, match=message):
            compile_model(path)
    m = model([N("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])])
    m.opset_import.append(helper.make_opsetid("", 17))
    with pytest.raises(GraphError, match="imports the ONNX operator set 2 times .opsets 13, 17."):
        compile_model(m)


def test_an_opset_newer_than_onnx_knows_is_refused():
    m = model([N("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])])
    m.opset_import[0].version = 99
    with pytest.raises(GraphError, match="opset 99, which does not exist yet"):
        compile_model(m)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_a_float_constant_other_than_float32_is_refused_like_onnx_runtime(dtype):
    """ONNX Runtime refuses a float16 or double weight beside float32 activations; converting it
    would compile a model that runs nowhere else."""
    w = np.ones((4, 3), dtype)
    m = model([N("MatMul", ["x", "w"], ["y"])], [("x", [2, 4])], [("y", [2, 3])], {"w": w})
    kind = np.dtype(dtype).name.replace("float64", "double")
    with pytest.raises(GraphError, match=f"initializer 'w' is {kind}; gemforge compiles float32 models"):
        compile_model(m)
    m = model([N("Constant", [], ["w"], value=onnx.numpy_helper.from_array(w)), N("MatMul", ["x", "w"], ["y"])],
              [("x", [2, 4])], [("y", [2, 3])])
    with pytest.raises(GraphError, match=f"its value is {kind}"):
        compile_model(m)


@pytest.mark.parametrize("bias, message", [
    (np.ones(4, np.int64), "reads constant 'b' of type int64; its operands must be float32"),
    (np.ones(4, bool), "reads constant 'b' of type bool"),
    (np.ones(4, np.complex64), "constant 'b' holds complex64 values"),
    (np.array(["a"] * 4, object), "constant 'b' holds object values"),
])
def test_constants_of_other_types_are_refused_at_compile_time(bias, message):
    """They compiled and failed only when run (a string one with a numpy traceback on save)."""
    tensor = onnx.helper.make_tensor("b", onnx.TensorProto.STRING, [4], [b"a"] * 4) if bias.dtype == object \
        else onnx.numpy_helper.from_array(bias, "b")
    m = model([N("Add", ["x", "b"], ["y"])], [("x", [2, 4])], [("y", [2, 4])], {"b": np.ones(4, np.float32)})
    m.graph.initializer[0].CopyFrom(tensor)
    with pytest.raises(GraphError, match=message):
        compile_model(m)


def test_models_that_could_never_run_are_refused_at_compile_time():
    m = model([N("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])])
    del m.graph.output[:]
    with pytest.raises(GraphError, match="the model has no outputs"):
        compile_model(m)
    m = model([N("Relu", ["x"], ["y"])], [("x", [1, 3, 2 ** 40, 4])], [("y", [1, 3, 2 ** 40, 4])])
    with pytest.raises(GraphError, match=r"model input 'x' has shape \[1, 3, 1099511627776, 4\], beyond"):
        compile_model(m)
    m = model([N("Relu", ["x"], ["y"])], [("x", ["N", 1024])], [("y", ["N", 1024])])
    with pytest.raises(GraphError, match="beyond what gemforge compiles"):
        compile_model(m, batch=2 ** 31)
    m = model([N("Conv", ["x", "w"], ["y"], pads=[2 ** 30] * 4)], [("x", [1, 3, 4, 4])], [("y", None)],
              {"w": np.ones((2, 3, 1, 1), np.float32)})
    with pytest.raises(GraphError, match=r"its output would have shape \[1, 2, 2147483652, 2147483652\]"):
        compile_model(m)


@pytest.mark.parametrize("image", [7, 15])
def test_int8_global_average_pool_keeps_its_own_scale(image):
    """A global average pool's output range is far narrower than its input's; kept at the
    input's scale its int8 result was 4–7 % off ONNX Runtime after a dense layer, now about 1 %."""
    rng = np.random.default_rng(image)
    init = {"w": rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32),
            "fc": rng.normal(0, 0.3, (8, 10)).astype(np.float32)}
    m = model([N("Conv", ["x", "w"], ["c"], pads=[1] * 4), N("Relu", ["c"], ["r"]),
               N("GlobalAveragePool", ["r"], ["g"]), N("Flatten", ["g"], ["f"]), N("MatMul", ["f", "fc"], ["y"])],
              [("x", [2, 4, image, image])], [("y", [2, 10])], init)
    x = rng.normal(size=(2, 4, image, image)).astype(np.float32)
    samples = np.concatenate([x[None], rng.normal(size=(7, 2, 4, image, image)).astype(np.float32)])
    q = compile_model(m, quantize="int8", calibrate=samples, config="default")   # x within the calibrated range
    got = q.run(x, "fsim")
    np.testing.assert_array_equal(got, q.run(x, "cpu"))
    expected = ort_run(m, {"x": x})[0]
    assert np.abs(got - expected).max() <= 0.025 * np.abs(expected).max()
