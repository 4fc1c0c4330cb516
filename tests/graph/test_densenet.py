"""A small DenseNet of DenseNet-121's topology (concat-heavy blocks, pre-activation BatchNorms,
transitions) against ONNX Runtime in float32, and int8 on the accelerator bit-identical to the CPU."""

from __future__ import annotations

import numpy as np

from gemforge.driver.runtime.model import compile_model
from gemforge.models import build_densenet121


def test_small_densenet_float32_equals_onnx_runtime_and_int8_runs_on_fsim():
    import onnxruntime as ort
    m = build_densenet121(image=32, classes=10, growth=8, blocks=(2, 3), init=16, bn_size=2)
    assert sum(n.op_type == "Concat" for n in m.graph.node) == 2 + 3   # per block: one per layer after the first, one for its output
    x = np.random.default_rng(0).normal(size=(2, 1, 3, 32, 32)).astype(np.float32)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    expect = session.run(None, {"input": x[0]})[0]
    compiled = compile_model(m)
    for _ in range(2):
        got = compiled.run(x[0], "cpu")
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * float(np.abs(expect).max()))
    q = compile_model(m, quantize="int8", calibrate=x, config="tiny")
    np.testing.assert_array_equal(q.run(x[1], "fsim"), q.run(x[1], "cpu"))
