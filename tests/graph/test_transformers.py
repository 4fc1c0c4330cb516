"""The transformer encoders of `gemforge.models.transformers`: float32 against ONNX Runtime,
and int8 with every product of a weight on the accelerator (fsim bit-identical to the CPU
back end, close to float32).

Measured on this machine (2 shared cores; the tiny config; the seeds below):

=====================  ==================================  ==================================
                       ViT-tiny (32², patch 8, 64-d,       BERT-tiny (seq 16, 64-d, 2 heads,
                       2 heads, depth 2, 10 classes)       depth 2, 4 padded positions)
=====================  ==================================  ==================================
ONNX nodes             86 (opset 17)                       140 (opset 14)
ONNX operators         Conv, Reshape, Transpose, Concat,   ReduceMean, Sub, Pow, Sqrt, Div,
                       Add, LayerNormalization, MatMul,    Mul, Add (LayerNorm written out),
                       Gather, Mul, Softmax, Div, Erf,     MatMul, Reshape, Transpose, Softmax,
                       Gemm, Constant                      Erf, Gather, Tanh, Constant
gemforge nodes         float32 165, int8 203               float32 166, int8 199
float32 max |error|    8.9e-7 (logits reach 1.7)           1.3e-6 (hidden state reaches 3.9),
vs ONNX Runtime        (batch 2)                           7.5e-7 (pooler output) (batch 2)
int8 cosine to         0.998 mean of six inputs, worst     hidden state 0.998, pooler 0.996
float32                0.9955                              (worst of six: 0.9975, 0.9941)
MACs on accelerator    1,868,416 of 1,942,400 (96.2 %)     1,576,960 of 1,642,496 (96.0 %)
compile                float32 0.15 s, int8 0.45 s; the    float32 0.14 s, int8 0.47 s; first
                       first run JIT-compiles the host     run about 4 s
                       kernels: about 4 s
=====================  ==================================  ==================================

The remaining MACs are attention's Q·Kᵀ and weights·V, products of two activations, which
the partitioning rule (`compiler/graph/partition.py`) keeps on the CPU: the accelerator's
weights are constants. Each MatMul's bias Add is a node of its own on the CPU (the fusion pass
joins a ReLU to a dense node, not an Add of a bias; a Gemm's bias is the dense node's own).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gemforge.driver.runtime.model import compile_model
from gemforge.models.transformers import build_bert_tiny, build_vit_tiny

#: name → (builder, one input item's shape)
MODELS = {"vit_tiny": (build_vit_tiny, (3, 32, 32)), "bert_tiny": (build_bert_tiny, (16, 64))}


def _by_output(onnx_model, y) -> list[np.ndarray]:
    """``Model.run``'s result (an array, or a dict for several outputs) in the ONNX model's order."""
    names = [o.name for o in onnx_model.graph.output]
    return [y[n] for n in names] if isinstance(y, dict) else [y]


def _onnx_runtime(onnx_model, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {onnx_model.graph.input[0].name: x})


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", list(MODELS))
def test_float32_equals_onnx_runtime(name):
    build, item = MODELS[name]
    m = build(batch=2)
    x = np.random.default_rng(10).normal(size=(2, *item)).astype(np.float32)
    ours = _by_output(m, compile_model(m).run(x, "cpu"))
    for got, want in zip(ours, _onnx_runtime(m, x)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("name", list(MODELS))
def test_int8_weights_on_accelerator_fsim_equals_cpu_close_to_float(name):
    build, item = MODELS[name]
    m = build()
    rng = np.random.default_rng(20)
    calib = rng.normal(size=(6, 1, *item)).astype(np.float32)
    model = compile_model(m, quantize="int8", calibrate=calib, config="tiny")
    g = model.graph

    # Every product by a constant weight (the MatMuls, the Gemm, the patch Conv) runs on the
    # accelerator; the products of two activations (attention's) on the CPU, in int8.
    weighted = [n for n in g.nodes if n.op in ("dense", "conv2d") and g.is_constant(n.inputs[1])]
    attention = [n for n in g.nodes if n.op == "dense" and not g.is_constant(n.inputs[1])]
    assert len(weighted) == {"vit_tiny": 10, "bert_tiny": 13}[name]
    assert [n.name for n in weighted if n.device != "accel"] == []
    # Two blocks × two heads × (Q·Kᵀ, weights·V).
    assert len(attention) == 8 and all(n.device == "cpu" for n in attention)
    assert all(g.values[i].dtype == "int8" for n in attention for i in n.inputs[:2])

    def macs(n):       # a dense node: rows × K × N; a convolution: outputs × its kernel's (C, H, W)
        if n.op == "dense":
            return int(np.prod(g.values[n.inputs[0]].shape)) * g.values[n.inputs[1]].shape[1]
        return int(np.prod(g.values[n.output].shape)) * int(np.prod(g.values[n.inputs[1]].shape[1:]))
    assert sum(map(macs, weighted)) / sum(map(macs, weighted + attention)) > 0.95

    x = rng.normal(size=(1, *item)).astype(np.float32)
    on_fsim = _by_output(m, model.run(x, "fsim"))
    on_cpu = _by_output(m, model.run(x, "cpu"))
    for a, b in zip(on_fsim, on_cpu):
        np.testing.assert_array_equal(a, b)
    reference = _by_output(m, compile_model(m).run(x, "cpu"))
    for a, r in zip(on_cpu, reference):
        assert _cosine(a, r) > 0.985         # here 0.998 (ViT), 0.998 and 0.996 (BERT)


@pytest.mark.parametrize(("build", "args", "message"), [
    (build_vit_tiny, {"dim": 0}, "dim must be a positive integer, not 0"),
    (build_vit_tiny, {"image": 30}, "image must be a multiple of patch, not 30 with patches of 8"),
    (build_vit_tiny, {"heads": 3}, "dim must be a multiple of heads, not 64 with 3 heads"),
    (build_bert_tiny, {"seq": 2.0}, "seq must be a positive integer, not 2.0"),
    (build_bert_tiny, {"padding": 16}, "padding must be an integer from 0 to seq - 1 = 15, not 16"),
])
def test_builders_refuse_bad_sizes(build, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(**args)


def test_int8_layer_norm_of_a_narrow_row():
    """The smallest form of a transformer's residual Add then LayerNorm: one row of large values,
    one of small ones. The layer norm stays in float32 in an int8 network, x − mean included
    (squared in int8, at the squares' coarse scale 2^0, the small row's squares of about 0.04
    rounded to 0 and its outputs came out 78 off)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["h"]),
         helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)], "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        [numpy_helper.from_array(np.zeros(16, np.float32), "b"),
         numpy_helper.from_array(np.ones(16, np.float32), "gamma"),
         numpy_helper.from_array(np.zeros(16, np.float32), "beta")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(0, 4.0, 16), rng.normal(0, 0.2, 16)]).astype(np.float32)
    int8 = compile_model(m, quantize="int8", calibrate=x[None], config="tiny").run(x, "cpu")
    # Rounding x to its int8 grid (2^-3) alone moves the small row's normalized values by up to 0.46.
    np.testing.assert_allclose(int8, _onnx_runtime(m, x)[0], atol=1.0)
