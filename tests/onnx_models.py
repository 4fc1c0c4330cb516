"""ONNX models built in code for the graph compiler's tests (no model is downloaded)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, initializers=None, opset: int = 13) -> onnx.ModelProto:
    """A checked model: ``inputs``/``outputs`` are (name, shape) pairs, ``initializers`` name → array."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    if any(s is None for _, s in outputs):
        # Output shapes are left to ONNX's shape inference, which reports intermediate
        # tensors only: infer with the outputs demoted, then copy their types back.
        probe = onnx.ModelProto()
        probe.CopyFrom(m)
        del probe.graph.output[:]
        probe.graph.output.append(probe.graph.input[0])
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
        for out in m.graph.output:
            if out.name in inferred:
                out.CopyFrom(inferred[out.name])
    onnx.checker.check_model(m)
    return m


def ort_run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def small_cnn(rng, *, channels: int = 16, image: int = 8, batch="N", residual: bool = True,
              classes: int = 10, softmax: bool = False) -> onnx.ModelProto:
    """conv-BN-ReLU, conv-ReLU (+ residual add), max pool, concat with an avg pool, global
    pooling, flatten, dense: every int8 path of the graph compiler in a few layers."""
    c = channels
    init = {
        "w1": rng.normal(0, 0.4, (c, 3, 3, 3)).astype(np.float32), "b1": rng.normal(0, 0.1, c).astype(np.float32),
        "g": rng.uniform(0.5, 1.5, c).astype(np.float32), "be": rng.normal(0, 0.1, c).astype(np.float32),
        "mu": rng.normal(0, 0.1, c).astype(np.float32), "var": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "w2": rng.normal(0, 0.15, (c, c, 3, 3)).astype(np.float32),
        "w3": rng.normal(0, 0.2, (c, c, 1, 1)).astype(np.float32),
        "fc": rng.normal(0, 0.2, (classes, 2 * c)).astype(np.float32),
        "fcb": rng.normal(0, 0.1, classes).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["bn1"], name="bn1"),
        helper.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
    ]
    last = "c2"
    if residual:
        nodes.append(helper.make_node("Add", ["c2", "r1"], ["s"], name="residual"))
        last = "s"
    nodes += [
        helper.make_node("Relu", [last], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["p", "w3"], ["c3"], name="conv3"),
        helper.make_node("AveragePool", ["r2"], ["a"], kernel_shape=[2, 2], strides=[2, 2], name="avg"),
        helper.make_node("Concat", ["c3", "a"], ["cat"], axis=1, name="concat"),
        helper.make_node("GlobalAveragePool", ["cat"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1, name="fc"),
    ]
    out = "logits"
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], name="softmax"))
        out = "probs"
    return model(nodes, [("input", [batch, 3, image, image])], [(out, [batch, classes])], init)
