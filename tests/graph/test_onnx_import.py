"""The ONNX front end (`compiler/graph/onnx_import.py`): what it reads beyond one node per
operator — sparse initializers, constants folded into attributes, given input shapes — and the
names it refuses. Results against ONNX Runtime."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gemforge.compiler.graph import SUPPORTED_OPS, GraphError
from gemforge.compiler.graph.onnx_import import MIN_OPSET, operator_list
from gemforge.driver.tools.cli import main
from gemforge.driver.runtime.model import Model, compile_model
from onnx_models import model, ort_run

pytest.importorskip("onnxruntime")
N = helper.make_node


def _same_as_onnx_runtime(m, x, **options):
    expected = ort_run(m, {"x": x})[0]
    got = compile_model(m, **options).run(x, "cpu")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _with_sparse(nodes, inputs, outputs, sparse):
    """A checked model whose initializers are the sparse tensors ``sparse``."""
    graph = helper.make_graph(nodes, "test", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              sparse_initializer=sparse)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _sparse(name, values, indices, dims):
    return helper.make_sparse_tensor(numpy_helper.from_array(np.asarray(values), name),
                                     numpy_helper.from_array(np.asarray(indices, np.int64), f"{name}_indices"), dims)


# ------------------------------------------------------------------------ sparse initializers

@pytest.mark.parametrize("coordinates", [False, True])
def test_sparse_initializer_is_read_as_its_dense_tensor(coordinates):
    w = np.zeros((6, 4), np.float32)
    w[1, 2], w[4, 0], w[5, 3] = 1.5, -2.0, 0.25
    nonzero = np.argwhere(w) if coordinates else np.flatnonzero(w)
    m = _with_sparse([N("MatMul", ["x", "W"], ["y"])], [("x", [2, 6])], [("y", [2, 4])],
                     [_sparse("W", w[w != 0], nonzero, w.shape)])
    _same_as_onnx_runtime(m, np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32))


def test_sparse_constant_node_and_sparse_shape():
    """A Constant's sparse_value, and an int64 sparse tensor as a Reshape's target shape."""
    m = _with_sparse([N("Constant", [], ["b"], sparse_value=_sparse("b", np.float32([3.0]), [2], [4])),
                      N("Add", ["x", "b"], ["s"]), N("Reshape", ["s", "shape"], ["y"])], [("x", [2, 4])], [("y", [8])],
                     [_sparse("shape", np.int64([-1]), [0], [1])])
    _same_as_onnx_runtime(m, np.arange(8, dtype=np.float32).reshape(2, 4))


@pytest.mark.parametrize("values, indices, dims, match", [
    (np.float32([1, 2]), [1, 1], [6], "gives a position twice"),
    (np.float32([1]), [6], [6], "index outside its 6 elements"),
    (np.float32([1]), [[0, 4]], [2, 4], r"index outside its dimensions \[2, 4\]"),
    (np.float32([1]), [[0, 1, 2]], [2, 4], r"indices of shape \[1, 3\] for 1 values"),
    (np.float64([1]), [0], [2], "is double; gemforge compiles float32 models"),
    (np.float32([1]), [0], [-2], "must be non-negative"),
])
def test_malformed_sparse_tensors_are_one_line_errors(values, indices, dims, match):
    """onnx's checker refuses most of these first; the importer does not rely on it."""
    from gemforge.compiler.graph.onnx_import import _densify
    with pytest.raises(GraphError, match=match) as info:
        _densify(_sparse("W", values, indices, dims), "sparse initializer 'W'")
    assert "\n" not in str(info.value) and str(info.value).startswith("sparse initializer 'W'")


# ------------------------------------------------------------------------ attributes and folding

def test_max_pool_storage_order_without_indices_is_accepted():
    """storage_order orders the Indices output only."""
    m = model([N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], storage_order=1)], [("x", [1, 2, 4, 5])], [("y", None)])
    _same_as_onnx_runtime(m, np.random.default_rng(2).standard_normal((1, 2, 4, 5)).astype(np.float32))


def test_reshape_to_a_concat_of_integer_constants():
    m = model([N("Concat", ["a", "b"], ["s"], axis=0), N("Reshape", ["x", "s"], ["y"])], [("x", [2, 3, 4])],
              [("y", [2, 12])], {"a": np.int64([2]), "b": np.int64([-1])})
    _same_as_onnx_runtime(m, np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    # A 2-D integer Concat reshaped to the 1-D shape; an axis out of range is refused by name.
    m = model([N("Concat", ["a", "b"], ["s2"], axis=1), N("Reshape", ["s2", "flat"], ["s"]),
               N("Reshape", ["x", "s"], ["y"])], [("x", [2, 3, 4])], [("y", [6, 4])],
              {"a": np.int64([[6]]), "b": np.int64([[4]]), "flat": np.int64([-1])})
    _same_as_onnx_runtime(m, np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    m = model([N("Concat", ["a", "b"], ["s"], axis=1, name="cat"), N("Reshape", ["x", "s"], ["y"])],
              [("x", [2, 3, 4])], [("y", [6, 4])], {"a": np.int64([6]), "b": np.int64([4])})
    with pytest.raises(GraphError, match=r"cat.*axis 1"):
        compile_model(m)


# ------------------------------------------------------------------------ given input shapes

def _symbolic_relu():
    return model([N("Relu", ["x"], ["y"])], [("x", ["N", 2, "H", "W"])], [("y", ["N", 2, "H", "W"])])


def test_input_shapes_give_symbolic_dimensions_and_keep_the_batch():
    m = _symbolic_relu()
    with pytest.raises(GraphError, match=r"symbolic dimension 2 \(H\); give its shape explicitly \(gemforge compile "
                                         r"--input-shape x="):
        compile_model(m)
    compiled = compile_model(m, input_shapes={"x": (1, 2, 3, 5)})
    x = np.random.default_rng(3).standard_normal((4, 2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run(x, "cpu"), ort_run(m, {"x": x})[0])   # the batch stays symbolic


@pytest.mark.parametrize("shapes, match", [
    ({"z": (1, 2, 3, 5)}, r"a shape is given for 'z', which is not an input of the model \(its inputs: 'x'\)"),
    ({"x": (1, 2, 3)}, r"has 3 dimensions; the model's has 4"),
    ({"x": (1, 3, 3, 5)}, r"has 3 in dimension 1, which the model fixes at 2"),
    ({"x": (1, 2, 0, 5)}, r"non-positive dimension"),
    ({"x": (1, 2, 2.5, 5)}, r"must be integers"),
])
def test_input_shapes_that_do_not_fit_the_model(shapes, match):
    with pytest.raises(GraphError, match=match):
        compile_model(_symbolic_relu(), input_shapes=shapes)


def test_compile_takes_input_shapes_from_the_command_line(tmp_path, capsys):
    onnx.save(_symbolic_relu(), tmp_path / "m.onnx")
    base = ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.gfm")]
    assert main(base + ["--input-shape", "x=1,2,3,5"]) == 0
    x = np.random.default_rng(4).standard_normal((3, 2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(Model.load(tmp_path / "m.gfm").run(x, "cpu"), np.maximum(x, 0))
    for extra, message in ((["--input-shape", "x"], "--input-shape takes NAME=D1,D2,"),
                           (["--input-shape", "x=1,2,0,5"], "--input-shape x must be positive integers"),
                           (["--input-shape", "x=1,2,3,5", "--input-shape", "x=1,2,3,5"], "gives input 'x' twice"),
                           (["--input-shape", f"x=1,2,3,{2**40}"], "beyond what gemforge compiles"),
                           (["--input-shape", "y=1,2,3,5"], "a shape is given for 'y', which is not an input")):
        capsys.readouterr()
        assert main(base + extra) != 0
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def test_a_given_first_dimension_other_than_the_batch_is_named(tmp_path, capsys):
    """--input-shape x=2,… with --batch 3 on a symbolic first dimension: the refusal names the
    given shape (it said the model's inputs have fixed shapes, though its first one is symbolic)."""
    with pytest.raises(GraphError, match=r"batch 3 applies to a symbolic first input dimension, but the shape given "
                                         r"for model input 'x', \[2, 2, 3, 5\], fixes its first dimension at 2; a "
                                         r"first dimension of 3 there stays the batch"):
        compile_model(_symbolic_relu(), batch=3, input_shapes={"x": (2, 2, 3, 5)})
    onnx.save(_symbolic_relu(), tmp_path / "m.onnx")
    base = ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.gfm"), "--batch", "3", "--input-shape"]
    assert main(base + ["x=2,2,3,5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "fixes its first dimension at 2" in err and "fixed shapes" not in err and "\n" not in err, err
    assert main(base + ["x=3,2,3,5"]) == 0                         # equal to --batch: stays the batch


# ------------------------------------------------------------------------ names

@pytest.mark.parametrize("where", ["initializer", "node output", "input"])
def test_tensor_names_a_gfm_cannot_store_are_refused(where, tmp_path):
    bad = "b\x00ias"
    if where == "initializer":
        m = model([N("Add", ["x", bad], ["y"])], [("x", [2])], [("y", [2])], {bad: np.float32([1, 2])})
        what = "an initializer"
    elif where == "node output":
        m = model([N("Relu", ["x"], [bad], name="r"), N("Relu", [bad], ["y"])], [("x", [2])], [("y", [2])])
        what = r"an output of node r \(Relu\)"
    else:
        m = model([N("Relu", [bad], ["y"])], [(bad, [2])], [("y", [2])])
        what = "a model input"
    with pytest.raises(GraphError, match=rf"tensor 'b\\x00ias' \({what}\) has a NUL character in its name"):
        compile_model(m)
    # Other unusual characters survive saving and loading.
    odd = "b/ias ü\t=1"
    m = model([N("Add", ["x", odd], ["y"])], [("x", [2])], [("y", [2])], {odd: np.float32([1, 2])})
    compile_model(m).save(tmp_path / "m.gfm")
    np.testing.assert_array_equal(Model.load(tmp_path / "m.gfm").run(np.float32([1, 1]), "cpu"), [2, 3])


def test_a_tensor_name_longer_than_a_zip_member_name_is_refused():
    long = "w" * 70_000
    m = model([N("Add", ["x", long], ["y"])], [("x", [2])], [("y", [2])], {long: np.float32([1, 2])})
    with pytest.raises(GraphError, match=r"\(an initializer\) has a name of 70,000 bytes; a \.gfm file \(a zip "
                                         r"archive\) stores names of up to 65,531"):
        compile_model(m)


# ------------------------------------------------------------------------ the operator list

def test_the_readme_lists_the_supported_operators():
    """README.md names the operators `gemforge compile` reads, generated from the importer's handlers
    (`operator_list`: each with its `reads` note)."""
    text = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"reads ONNX opset {MIN_OPSET} and newer" in text
    assert "The operators it reads: <!-- ONNX operators: generated" in text and operator_list() in text
    assert set(re.findall(r"\b[A-Z]\w*", operator_list())) == set(SUPPORTED_OPS)   # no note hides a name


# ------------------------------------------------------------------------ models as older exporters write them

def _legacy_cnn(rng, opset: int, batch="N") -> onnx.ModelProto:
    """A small CNN written the way exporters of ONNX opset ``opset`` (7 to 12) write it: Clip's
    bounds as attributes before opset 11, Dropout's ratio as an attribute before 12 and its mask
    output declared (and unread), Squeeze and Unsqueeze taking axes as attributes, a Softmax over
    axis 1 of a 4-D tensor (the 2-D coercion of opsets before 13), a Gemm with its bias."""
    def f32(*shape, positive=False):
        a = rng.standard_normal(shape).astype(np.float32)
        return np.abs(a) + 0.5 if positive else a
    inits = {"w": f32(6, 3, 3, 3) * 0.3, "b": f32(6), "s": f32(6, positive=True), "bb": f32(6),
             "m": f32(6), "v": f32(6, positive=True), "gw": f32(6, 5) * 0.3, "gb": f32(5)}
    nodes = [N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             N("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"], epsilon=1e-5)]
    if opset >= 11:
        inits.update(lo=np.float32(0), hi=np.float32(6))
        nodes.append(N("Clip", ["bn", "lo", "hi"], ["r"]))
    else:
        nodes.append(N("Clip", ["bn"], ["r"], min=0.0, max=6.0))
    nodes += [N("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
              N("Dropout", ["p"], ["d", "mask"], **({"ratio": 0.3} if opset < 12 else {})),
              N("Softmax", ["d"], ["sm"], axis=1),
              N("ReduceMean", ["sm"], ["rm"], axes=[2, 3], keepdims=1),
              N("Squeeze", ["rm"], ["sq"], axes=[2, 3]),
              N("Unsqueeze", ["sq"], ["us"], axes=[2]),
              N("Flatten", ["us"], ["fl"], axis=1),
              N("Gemm", ["fl", "gw", "gb"], ["y"])]
    return model(nodes, [("x", [batch, 3, 8, 8])], [("y", [batch, 5])], inits, opset=opset)


@pytest.mark.parametrize("opset", [7, 9, 10, 11, 12])
def test_older_opsets_are_upgraded_and_compute_as_onnx_runtime_reads_the_original(opset):
    m = _legacy_cnn(np.random.default_rng(opset), opset)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    # The upgraded Softmax reshapes to its input's shape, which folds with the batch in it.
    compiled = compile_model(m, batch=2)
    assert compiled.summary()["opset"] == opset
    np.testing.assert_allclose(compiled.run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_an_older_opset_compiles_to_int8_and_runs_alike_on_fsim_and_cpu():
    rng = np.random.default_rng(9)
    m = _legacy_cnn(rng, 9)
    samples = rng.standard_normal((8, 1, 3, 8, 8)).astype(np.float32)
    compiled = compile_model(m, quantize="int8", calibrate=samples, config="tiny")
    x = samples[0]
    assert any(n.device == "accel" for n in compiled.graph.nodes)
    np.testing.assert_array_equal(compiled.run(x, "fsim"), compiled.run(x, "cpu"))


def test_opsets_before_7_and_failed_upgrades_are_refused_in_one_sentence(monkeypatch):
    old = model([N("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])], opset=6)
    with pytest.raises(GraphError, match=r"^the model uses ONNX opset 6; gemforge reads opsets 7 and newer \(those "
                                         r"before 13 are upgraded to 13 on import\)$"):
        compile_model(old)

    def fails(model, target):
        raise RuntimeError("No Adapter For Upsample\nmore detail")
    from gemforge.compiler.graph import onnx_import
    monkeypatch.setattr(onnx_import.version_converter, "convert_version", fails)
    with pytest.raises(GraphError, match=r"^the model uses ONNX opset 9, which gemforge upgrades to 13 with onnx's "
                                         r"version converter, and the converter failed: No Adapter For Upsample$"):
        compile_model(model([N("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])], opset=9))


def test_a_dropout_mask_that_is_read_is_refused_by_name():
    m = model([N("Dropout", ["x"], ["d", "mask"], name="drop"), N("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
               N("Add", ["d", "mf"], ["y"])], [("x", [2, 3])], [("y", [2, 3])])
    with pytest.raises(GraphError, match=r"node drop \(Dropout\): its mask output 'mask' is read by the model"):
        compile_model(m)


def test_an_input_dimension_of_minus_one_is_read_as_symbolic():
    """Some exporters write -1 for the batch they leave open (and for other open dimensions)."""
    m = _legacy_cnn(np.random.default_rng(2), 11, batch=-1)
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    compiled = compile_model(m, batch=2)
    np.testing.assert_allclose(compiled.run(x, "cpu"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)
    open_height = model([N("Relu", ["x"], ["y"])], [("x", [1, 2, -1, 4])], [("y", [1, 2, -1, 4])])
    with pytest.raises(GraphError, match=r"symbolic dimension 2 \(-1\); give its shape explicitly"):
        compile_model(open_height)
    np.testing.assert_array_equal(compile_model(open_height, input_shapes={"x": (1, 2, 3, 4)}).run(
        np.ones((1, 2, 3, 4), np.float32), "cpu"), np.ones((1, 2, 3, 4), np.float32))


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample_of_older_opsets_becomes_a_resize(opset):
    """Upsample (opsets 7 to 9), which the version converter turns into Resize."""
    if opset == 7:
        m = model([N("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 3.0])], [("x", [1, 2, 3, 3])],
                  [("y", [1, 2, 6, 9])], opset=7)
    else:
        m = model([N("Upsample", ["x", "s"], ["y"], mode="nearest")], [("x", [1, 2, 3, 3])], [("y", [1, 2, 6, 9])],
                  {"s": np.float32([1, 1, 2, 3])}, opset=9)
    x = np.random.default_rng(opset).standard_normal((1, 2, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(compile_model(m).run(x, "cpu"), ort_run(m, {"x": x})[0])
