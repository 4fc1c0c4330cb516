"""Networks as real exporters write them (`gemforge.models.exported`): each compiled in float32
and run on the cpu against ONNX Runtime, and in int8 for ``tiny``, bit-identical on fsim and the
cpu and close to the float network.

Measured with these seeds (run with ``-s`` to print them; seconds on 2 shared cores, varying
with the load). f32 error: the largest difference from ONNX Runtime over max|y|. int8: cosine
similarity to ONNX Runtime's output, and the largest difference over the output's range.
Compile: `compile_model`'s seconds, float32 / int8; JIT: the first cpu run's, most of it
compiling the host kernels (most of this file's time).

=========  =====  ======  =======  ======  ========  =====  ===========  ==========
network    nodes  opset   f32      int8    int8      MACs   compile s    JIT s
                          error    cosine  error     accel  f32 / int8   f32 / int8
=========  =====  ======  =======  ======  ========  =====  ===========  ==========
yolo         206  17      1.9e-07  0.9999  1.2 %     100 %  0.03 / 2.4   6.2 / 8.8
unet          52  13      1.8e-06  0.9949  8.0 %     100 %  0.01 / 3.0   2.8 / 4.0
crnn          25  13      1.2e-06  0.9947  11.7 %    100 %  0.00 / 1.0   1.3 / 1.7
alexnet       32  11      6.3e-07  0.9879  20.4 %    100 %  0.02 / 0.7   1.5 / 2.2
=========  =====  ======  =======  ======  ========  =====  ===========  ==========

MACs: 10.7 M (yolo), 25.1 M (unet), 3.2 M (crnn), 3.9 M (alexnet). ONNX operators besides
Constant: yolo Add BatchNormalization Concat Conv Div Gather MaxPool Mul Reshape Resize Shape
Sigmoid Softmax Split Sub Transpose Unsqueeze; unet Cast Concat Conv ConvTranspose MaxPool Relu
Resize Shape Slice; crnn Add BatchNormalization Conv MatMul MaxPool Relu Softmax Squeeze
Transpose; alexnet Concat Conv Dropout Flatten Gemm LRN MaxPool Relu Softmax.

The int8 errors are the quantization's, grown by the softmaxes: over 12 draws (4 calibration
sets × 3 inputs) the least cosines were 0.9999, 0.9938, 0.9913 and 0.9013 (AlexNet's logits
stay within 0.75 of ranges near 10; a softmax over 10 classes turns that into up to 0.12 of
probability), so the bounds are 0.999, 0.98, 0.98 and 0.85. YOLO's output concatenates box
coordinates (up to 128 pixels) with the class probabilities; joined at the coarsest part's int8
scale, every class probability (0.46 to 0.54 in float) came out 0 or 1, so a returned
concatenation of parts at different scales is joined in float32 (`quantize`).

The U-Net as milesial's Pytorch-UNet exports it (190 nodes: its size-matching ``F.pad``, whose
amounts torch.onnx computes with an integer Div and its floor fix-up of Less, Xor, Mod, Equal,
Not, And and Where, all folded at import): float32 error 1.9e-06 of max|y| 4.6, int8 cosine 0.9941.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

import numpy as np
import onnx
import pytest

from gemforge.driver.runtime.model import compile_model
from gemforge.models.exported import build_alexnet_style, build_crnn_style, build_unet_style, build_yolo_style


class _Case(NamedTuple):
    build: Callable[[], onnx.ModelProto]
    #: Draws inputs of a shape: images as the network's preprocessing leaves them.
    draw: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]
    #: The least cosine similarity of the int8 output to ONNX Runtime's: below the least of 12
    #: draws (4 calibration sets × 3 inputs; see the module's docstring).
    min_cosine: float


def _unit(rng, shape):          # YOLO's images / 255
    return rng.uniform(0.0, 1.0, shape)


def _signed(rng, shape):        # crnn.pytorch's (x - 0.5) / 0.5
    return rng.uniform(-1.0, 1.0, shape)


def _normal(rng, shape):        # mean and deviation normalized
    return rng.normal(size=shape)


CASES = {
    "yolo": _Case(build_yolo_style, _unit, 0.999),
    "unet": _Case(lambda: build_unet_style(size_matching_pad=False), _normal, 0.98),
    "crnn": _Case(build_crnn_style, _signed, 0.98),
    "alexnet": _Case(build_alexnet_style, _normal, 0.85),
    "unet_padded": _Case(build_unet_style, _normal, 0.98),
}


def _ort_run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3     # the model zoo's initializers listed as inputs warn once each
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {m.graph.input[0].name: x})[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", [
    "yolo", "unet", "crnn", "alexnet", "unet_padded",
])
def test_exported_network_float32_and_int8(name):
    case = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    m = case.build()
    shape = tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)
    x = case.draw(rng, shape).astype(np.float32)
    expected = _ort_run(m, x)
    scale = float(np.abs(expected).max())

    start = time.perf_counter()
    compiled = compile_model(m)
    float_seconds = time.perf_counter() - start
    start = time.perf_counter()
    got = compiled.run(x, "cpu")
    float_run_seconds = time.perf_counter() - start        # its host kernels JIT-compiled first
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * scale)

    samples = np.stack([case.draw(rng, shape) for _ in range(6)]).astype(np.float32)
    start = time.perf_counter()
    q = compile_model(m, quantize="int8", calibrate=samples, config="tiny")
    int8_seconds = time.perf_counter() - start
    start = time.perf_counter()
    on_cpu = q.run(x, "cpu")
    int8_run_seconds = time.perf_counter() - start
    on_fsim = q.run(x, "fsim")
    np.testing.assert_array_equal(on_fsim, on_cpu)
    cosine = _cosine(on_fsim, expected)
    assert cosine >= case.min_cosine, (name, cosine)
    # Every convolution and dense layer here has one group and constant weights: all on the accelerator.
    macs = sum(r.macs for r in q.last_profile)
    accel_share = sum(r.macs for r in q.last_profile if r.device == "fsim") / macs
    assert accel_share == 1.0, (name, accel_share)
    ops = sorted({n.op_type for n in m.graph.node} - {"Constant"})
    print(f"\n{name}: {len(m.graph.node)} nodes; {' '.join(ops)}; opset {m.opset_import[0].version}; float32 max "
          f"error {np.abs(got - expected).max() / scale:.2g} of max|y| {scale:.3g}; int8 cosine {cosine:.4f}, max "
          f"error {np.abs(on_fsim - expected).max():.3g} of range {np.ptp(expected):.3g}; {macs:,} MACs, "
          f"{accel_share:.0%} on the accelerator; compile {float_seconds:.2f} s float32, {int8_seconds:.2f} s int8; "
          f"first cpu run (JIT) {float_run_seconds:.1f} s float32, {int8_run_seconds:.1f} s int8")


def test_builders_write_the_exporters_habits():
    """What the builders claim to imitate is in the ONNX files, and gemforge reports the old
    operator set it upgraded from."""
    yolo = build_yolo_style()
    resize = next(n for n in yolo.graph.node if n.op_type == "Resize")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in resize.attribute}
    assert resize.input[1] == "" and attrs["coordinate_transformation_mode"] == b"asymmetric"
    assert attrs["nearest_mode"] == b"floor"
    producer = {out: n for n in yolo.graph.node for out in n.output}
    silu = [n for n in yolo.graph.node if n.op_type == "Mul" and n.input[1] in producer
            and producer[n.input[1]].op_type == "Sigmoid"
            and producer[n.input[1]].input[0] == n.input[0]]
    ops = [n.op_type for n in yolo.graph.node]
    assert len(silu) == ops.count("Sigmoid") - 1       # every SiLU; the last Sigmoid is the class scores'
    assert {"Shape", "Split", "Transpose", "Softmax"} <= set(ops)
    alexnet = build_alexnet_style()
    assert alexnet.opset_import[0].version == 11
    dropouts = [n for n in alexnet.graph.node if n.op_type == "Dropout"]
    assert dropouts and all(len(n.output) == 2 for n in dropouts)
    assert {t.name for t in alexnet.graph.initializer} <= {v.name for v in alexnet.graph.input}
    compiled = compile_model(alexnet)
    assert compiled.summary()["opset"] == 11 and list(compiled.inputs) == ["data_0"]
