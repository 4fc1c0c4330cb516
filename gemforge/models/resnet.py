"""ResNet-18 (torchvision's topology) as an ONNX graph with random weights.

The benchmarks and tests need a realistic, full-size network without downloading
one: the layer shapes, not the trained weights, decide the compiler's and the
accelerator's work. The weights are seeded, so a given build is reproducible.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_resnet18", "RESNET18_CONVS", "RESNET18_LAYERS"]

#: The distinct convolutions of ResNet-18 after the first (batch 1, 224×224): (name, input
#: NCHW, weight OIHW, stride, padding, how many times the network runs it). Each stage's
#: first block opens with a stride-2 3×3 and a 1×1 stride-2 downsample; its other three
#: 3×3 convolutions are alike (the first stage has four, and no downsample).
RESNET18_CONVS = [
    ("conv2_3x3", (1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 4),
    ("conv3_3x3_s2", (1, 64, 56, 56), (128, 64, 3, 3), 2, 1, 1),
    ("conv3_1x1_s2", (1, 64, 56, 56), (128, 64, 1, 1), 2, 0, 1),
    ("conv3_3x3", (1, 128, 28, 28), (128, 128, 3, 3), 1, 1, 3),
    ("conv4_3x3_s2", (1, 128, 28, 28), (256, 128, 3, 3), 2, 1, 1),
    ("conv4_1x1_s2", (1, 128, 28, 28), (256, 128, 1, 1), 2, 0, 1),
    ("conv4_3x3", (1, 256, 14, 14), (256, 256, 3, 3), 1, 1, 3),
    ("conv5_3x3_s2", (1, 256, 14, 14), (512, 256, 3, 3), 2, 1, 1),
    ("conv5_1x1_s2", (1, 256, 14, 14), (512, 256, 1, 1), 2, 0, 1),
    ("conv5_3x3", (1, 512, 7, 7), (512, 512, 3, 3), 1, 1, 3),
]

#: The same layers without their counts: (name, input NCHW, weight OIHW, stride, padding).
RESNET18_LAYERS = [row[:5] for row in RESNET18_CONVS]


class LayerBuilder:
    """Collects nodes and initializers; each layer returns its output's name."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def param(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def conv_bn(self, x: str, name: str, cin: int, cout: int, k: int, stride: int, groups: int = 1) -> str:
        # He-normal keeps the activations' scale steady through the ReLUs.
        w = self.rng.normal(0.0, np.sqrt(2.0 / (cin // groups * k * k)), (cout, cin // groups, k, k))
        self.nodes.append(helper.make_node(
            "Conv", [x, self.param(f"{name}.weight", w)], [f"{name}.conv"], name=name,
            kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
            **({"group": groups} if groups != 1 else {})))
        bn = [self.param(f"{name}.bn.{p}", v) for p, v in (
            ("scale", self.rng.uniform(0.5, 1.5, cout)), ("bias", self.rng.normal(0.0, 0.1, cout)),
            ("mean", self.rng.normal(0.0, 0.1, cout)), ("var", self.rng.uniform(0.5, 1.5, cout)))]
        self.nodes.append(helper.make_node(
            "BatchNormalization", [f"{name}.conv", *bn], [f"{name}.bn"], name=f"{name}.bn", epsilon=1e-5))
        return f"{name}.bn"

    def op(self, op: str, inputs: list[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def classified(self, x: str, features: int, classes: int, classifier: str, scale: float, name: str,
                   batch: int, image: int) -> onnx.ModelProto:
        """The model of the layers so far, closed by global average pooling and a dense
        ``classifier`` to ``logits`` (weights ``scale``/sqrt(features)), for
        ``[batch, 3, image, image]`` float32 ``input``."""
        x = self.op("Flatten", [self.op("GlobalAveragePool", [x], "avgpool")], "flatten", axis=1)
        weight = self.param(f"{classifier}.weight", self.rng.normal(0.0, scale / np.sqrt(features),
                                                                    (classes, features)))
        bias = self.param(f"{classifier}.bias", self.rng.normal(0.0, 0.01, classes))
        self.nodes.append(helper.make_node("Gemm", [x, weight, bias], ["logits"], name=classifier, transB=1))
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image, image])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                                  producer_name="gemforge.models")
        onnx.checker.check_model(model)
        return model

    def basic_block(self, x: str, name: str, cin: int, cout: int, stride: int) -> str:
        y = self.op("Relu", [self.conv_bn(x, f"{name}.conv1", cin, cout, 3, stride)], f"{name}.relu1")
        y = self.conv_bn(y, f"{name}.conv2", cout, cout, 3, 1)
        skip = self.conv_bn(x, f"{name}.downsample", cin, cout, 1, stride) if stride != 1 or cin != cout else x
        return self.op("Relu", [self.op("Add", [y, skip], f"{name}.add")], f"{name}.relu2")


def build_resnet18(batch: int = 1, image: int = 224, classes: int = 1000, width: int = 64,
                   seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 for ``[batch, 3, image, image]`` float32 ``input``, giving ``[batch, classes]``
    ``logits``; ``width`` is the first stage's channel count (64 in the paper)."""
    b = LayerBuilder(np.random.default_rng(seed))
    x = b.op("Relu", [b.conv_bn("input", "conv1", 3, width, 7, 2)], "relu")
    x = b.op("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage in range(4):
        cout = width << stage
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            x = b.basic_block(x, f"layer{stage + 1}.{block}", cin, cout, stride)
            cin = cout
    # Random BN statistics do not normalize, so each residual block grows the activations:
    # the pooled features come out at an RMS of roughly 15-120 (more for larger images).
    # Classifier weights 50 times smaller than the usual 1/sqrt(fan-in) bring the logits back to O(1).
    return b.classified(x, cin, classes, "fc", 0.02, "resnet18", batch, image)
