"""A float32 residual add fused into the convolution that feeds it (`passes.fuse_residual_adds`),
and a batch norm no convolution precedes run as one ``scale_shift`` (`passes.fuse_scale_shift`):
which nodes fuse, the kernels against numpy on the CPU (and compiled for the GPU), the networks
against ONNX Runtime, the model file round trip, and refusals. And a dense layer written as a
convolution over one pixel, run as the dense kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_models import model
from gemforge.compiler import CpuTarget, GpuTarget
from gemforge.compiler.ops import OpError, conv2d_reference, host
from gemforge.driver.runtime.device import open_device
from gemforge.driver.runtime.model import Model, compile_model


@pytest.mark.parametrize("kernel,stride,padding", [(1, 1, 0), (1, 2, 0), (3, 2, 1), (3, 1, 1)])
@pytest.mark.parametrize("epilogue", [{}, {"relu": True}, {"relu": True, "clip": (0.0, 0.5)}])
@pytest.mark.parametrize("rows", [False, True])
def test_conv_epilogue_adds_the_residual_before_the_relu(kernel, stride, padding, epilogue, rows, monkeypatch):
    """Either product (`host._pixel_rows`), a padded stride-1 one with its rows a pitch apart."""
    monkeypatch.setattr(host, "_pixel_rows", lambda *args: rows)
    rng = np.random.default_rng(kernel + stride + len(epilogue))
    shape, weight = (2, 5, 9, 11), (7, 5, kernel, kernel)
    op = host.compile_conv2d(CpuTarget(), shape, weight, stride=stride, padding=padding, dtype="float32",
                             bias=True, residual=True, **epilogue)
    x, w = rng.normal(size=shape).astype(np.float32), rng.normal(size=weight).astype(np.float32)
    b = rng.normal(size=7).astype(np.float32)
    base = conv2d_reference(x, w, b, stride, padding)
    skip = rng.normal(size=base.shape).astype(np.float32)
    out, _ = op.run(open_device("cpu"), x=x, w=w, bias=b, residual=skip)
    expect = base + skip
    if epilogue.get("relu"):
        expect = np.maximum(expect, 0)
    if "clip" in epilogue:
        expect = np.clip(expect, *epilogue["clip"])
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4 * float(np.abs(expect).max()))


def test_the_gpu_compiles_the_residual_epilogue():
    op = host.compile_conv2d(GpuTarget("sm_90"), (1, 8, 8, 8), (16, 8, 1, 1), dtype="float32", bias=True,
                             residual=True, relu=True)
    assert "residual" in [p.name for p in op.program.params]


def test_refusals():
    with pytest.raises(OpError, match="float32 convolutions with one group"):
        host.compile_conv2d(CpuTarget(), (1, 4, 8, 8), (4, 4, 1, 1), dtype="int8", shift=4, residual=True)
    with pytest.raises(OpError, match="float32 convolutions with one group"):
        host.compile_conv2d(CpuTarget(), (1, 4, 8, 8), (4, 1, 3, 3), groups=4, padding=1, dtype="float32",
                            residual=True)
    op = host.compile_conv2d(CpuTarget(), (1, 4, 8, 8), (4, 4, 1, 1), dtype="float32", residual=True)
    with pytest.raises(OpError, match="compiled with a residual input"):
        op.pack_inputs(x=np.zeros((1, 4, 8, 8), np.float32), w=np.zeros((4, 4, 1, 1), np.float32))


def _network():
    """Adds after a 1×1 (fuses), a strided 3×3 (fuses), a padded stride-1 3×3 (fuses), a ReLU'd
    convolution (stays), a convolution read twice (stays) and a broadcasting add (stays)."""
    rng = np.random.default_rng(0)

    def w(o, i, k):
        return rng.normal(size=(o, i, k, k)).astype(np.float32) * 0.3

    def b(o):
        return rng.normal(size=o).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),                                  # 1x1
        helper.make_node("Add", ["x", "c1"], ["a1"]),                                         # fuses (c1 second)
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1] * 4),   # strided 3x3
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["c2", "p1"], ["a2"]),                                        # fuses
        helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"], pads=[1] * 4),                   # padded 3x3: fuses
        helper.make_node("Add", ["c3", "a2"], ["a3"]),
        helper.make_node("Conv", ["a3", "w4", "b4"], ["c4"]),
        helper.make_node("Relu", ["c4"], ["r4"]),                                             # ReLU'd: stays
        helper.make_node("Add", ["r4", "a3"], ["a4"]),
        helper.make_node("Conv", ["a4", "w5", "b5"], ["c5"]),
        helper.make_node("Add", ["c5", "a4"], ["a5"]),                                        # c5 read twice
        helper.make_node("Mul", ["c5", "a5"], ["m5"]),
        helper.make_node("Conv", ["m5", "w6", "b6"], ["c6"]),
        helper.make_node("Add", ["c6", "s"], ["y"]),                                          # broadcast: stays
    ]
    inits = {"w1": w(6, 6, 1), "b1": b(6), "w2": w(6, 6, 3), "b2": b(6), "w3": w(6, 6, 3), "b3": b(6),
             "w4": w(6, 6, 1), "b4": b(6), "w5": w(6, 6, 1), "b5": b(6), "w6": w(6, 6, 1), "b6": b(6),
             "s": rng.normal(size=(1, 6, 1, 1)).astype(np.float32)}
    return model(nodes, [("x", [1, 6, 10, 10])], [("y", None)], inits)


def test_which_adds_fuse_and_the_network_equals_onnx_runtime(tmp_path):
    import onnxruntime as ort
    m = _network()
    compiled = compile_model(m)
    fused = [n for n in compiled.graph.nodes if n.attrs.get("residual")]
    assert len(fused) == 3 and sum(n.op == "add" for n in compiled.graph.nodes) == 3
    assert fused[0].attrs["relu"] and not fused[1].attrs["relu"] and not fused[2].attrs["relu"]
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).normal(size=(1, 6, 10, 10)).astype(np.float32)
    expect = session.run(None, {"x": x})[0]
    for got in (compiled.run(x, "cpu"), compiled.run(x, "cpu")):      # traced, then replayed
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * float(np.abs(expect).max()))
    compiled.save(tmp_path / "m.gfm")
    np.testing.assert_allclose(Model.load(tmp_path / "m.gfm").run(x, "cpu"), expect, rtol=1e-4,
                               atol=1e-4 * float(np.abs(expect).max()))
    # The int8 pipeline keeps its adds (its add requantizes).
    q = compile_model(m, quantize="int8", calibrate=x[None], config="tiny")
    assert not any(n.attrs.get("residual") for n in q.graph.nodes)


# ---------------------------------------------------------------------------- scale_shift

def _pre_activation_network():
    """Batch norms no convolution precedes (BN → ReLU → conv, DenseNet's and a pre-activation
    ResNet's order), one read twice, and multiply/add pairs that are not per-channel."""
    rng = np.random.default_rng(5)

    def bn(name, c):
        return {f"{name}.s": rng.uniform(0.5, 1.5, c).astype(np.float32), f"{name}.b": rng.normal(size=c).astype(np.float32),
                f"{name}.m": rng.normal(size=c).astype(np.float32), f"{name}.v": rng.uniform(0.5, 2, c).astype(np.float32)}
    inits = {**bn("bn1", 4), **bn("bn2", 6), "w1": rng.normal(size=(6, 4, 3, 3)).astype(np.float32) * 0.3,
             "row": rng.normal(size=(1, 1, 1, 7)).astype(np.float32), "k": np.float32(0.5),
             "per_channel": rng.normal(size=(6, 1, 1)).astype(np.float32)}
    nodes = [
        helper.make_node("BatchNormalization", ["x", "bn1.s", "bn1.b", "bn1.m", "bn1.v"], ["n1"]),   # fuses
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w1"], ["c1"], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r2"]),
        helper.make_node("BatchNormalization", ["r2", "bn2.s", "bn2.b", "bn2.m", "bn2.v"], ["n2"]),  # fuses
        helper.make_node("Mul", ["n2", "row"], ["m3"]),                      # varies along the width: stays
        helper.make_node("Add", ["m3", "k"], ["a3"]),
        helper.make_node("Mul", ["per_channel", "a3"], ["m4"]),              # constant first: fuses
        helper.make_node("Add", ["m4", "per_channel"], ["a4"]),
        helper.make_node("Mul", ["a4", "k"], ["m5"]),                        # read twice: stays
        helper.make_node("Add", ["m5", "k"], ["a5"]),
        helper.make_node("Add", ["a5", "m5"], ["y"]),
    ]
    return model(nodes, [("x", [1, 4, 6, 7])], [("y", None)], inits)


def test_batch_norms_no_convolution_precedes_run_as_one_scale_shift(tmp_path):
    import onnxruntime as ort
    m = _pre_activation_network()
    compiled = compile_model(m)
    ops = [n.op for n in compiled.graph.nodes]
    assert ops.count("scale_shift") == 3 and ops.count("mul") == 2, ops
    assert [n.attrs["relu"] for n in compiled.graph.nodes if n.op == "scale_shift"] == [True, False, False]
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (1, 2):
        x = np.random.default_rng(seed).normal(size=(1, 4, 6, 7)).astype(np.float32)
        expect = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(compiled.run(x, "cpu"), expect, rtol=1e-4, atol=1e-4 * float(np.abs(expect).max()))
    compiled.save(tmp_path / "m.gfm")
    np.testing.assert_allclose(Model.load(tmp_path / "m.gfm").run(x, "cpu"), expect, rtol=1e-4,
                               atol=1e-4 * float(np.abs(expect).max()))
    # The int8 pipeline keeps the multiply and the add (it requantizes both).
    q = compile_model(m, quantize="int8", calibrate=x[None], config="tiny")
    assert "scale_shift" not in [n.op for n in q.graph.nodes]


@pytest.mark.parametrize("shape", [(2, 5), (1, 3, 7), (2, 16, 5, 9)])
@pytest.mark.parametrize("relu", [False, True])
def test_scale_shift_kernel(shape, relu):
    rng = np.random.default_rng(len(shape))
    x = rng.normal(size=shape).astype(np.float32)
    a, b = rng.normal(size=shape[1]).astype(np.float32), rng.normal(size=shape[1]).astype(np.float32)
    out, _ = host.compile_scale_shift(CpuTarget(), shape, relu=relu).run(open_device("cpu"), x=x, a=a, b=b)
    bcast = (1, -1) + (1,) * (len(shape) - 2)
    expect = x * a.reshape(bcast) + b.reshape(bcast)
    np.testing.assert_allclose(out, np.maximum(expect, 0) if relu else expect, rtol=1e-6, atol=1e-6)
    assert "scale_shift" in host.compile_scale_shift(GpuTarget("sm_90"), shape).program.name
    with pytest.raises(OpError, match="scales the channels"):
        host.compile_scale_shift(CpuTarget(), (5,))


# ---------------------------------------------------------------------------- a dense layer as a convolution

@pytest.mark.parametrize("quantize", [None, "int8"])
def test_a_convolution_of_a_one_pixel_image_runs_as_the_dense_kernel(quantize):
    """A classifier written as a 1×1 convolution after a global pool (as the int8 pipeline
    writes a dense layer, `image_dense`) runs as the dense kernel (one pixel: a convolution's
    product would vectorize it), equal to ONNX Runtime in float32 and bit-identical to fsim
    in int8."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("GlobalAveragePool", ["r0"], ["g"]),
             helper.make_node("Conv", ["g", "w1", "b1"], ["y"])]
    inits = {"w0": rng.normal(size=(16, 3, 3, 3)).astype(np.float32) * 0.3, "b0": rng.normal(size=16).astype(np.float32),
             "w1": rng.normal(size=(24, 16, 1, 1)).astype(np.float32) * 0.3, "b1": rng.normal(size=24).astype(np.float32)}
    m = model(nodes, [("x", [1, 3, 8, 8])], [("y", None)], inits)
    x = rng.normal(size=(1, 3, 8, 8)).astype(np.float32)
    compiled = compile_model(m, quantize=quantize, calibrate=x[None] if quantize else None,
                             config="default" if quantize else None)
    classifier = [n for n in compiled.graph.nodes if n.op == "conv2d"][-1]
    assert compiled._host_kernel(classifier, "cpu").op.name == "dense"
    got = compiled.run(x, "cpu")
    if quantize:
        np.testing.assert_array_equal(got, compiled.run(x, "fsim"))
    else:
        import onnxruntime as ort
        expect = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)
