"""DenseNet-121 (torchvision's topology) as an ONNX graph with random weights, as torch.onnx
exports it in eval mode (constant folding off): every layer's input is the channel concatenation
of all earlier layers' outputs in its block, each dense layer a pre-activation
BatchNormalization → ReLU → 1×1 convolution → BatchNormalization → ReLU → 3×3 convolution, the
transitions BN → ReLU → 1×1 convolution → 2×2 average pool.

It is the concat-heavy network of the host-speed benchmarks: 58 dense layers, 58 concats, and
pre-activation BatchNorms that no convolution before them can absorb.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .resnet import LayerBuilder

__all__ = ["build_densenet121", "DENSENET121_BLOCKS"]

#: Dense layers per block.
DENSENET121_BLOCKS = (6, 12, 24, 16)


class _DenseNetBuilder(LayerBuilder):
    def bn(self, x: str, name: str, channels: int) -> str:
        stats = [self.param(f"{name}.{p}", v) for p, v in (
            ("scale", self.rng.uniform(0.5, 1.5, channels)), ("bias", self.rng.normal(0.0, 0.1, channels)),
            ("mean", self.rng.normal(0.0, 0.1, channels)), ("var", self.rng.uniform(0.5, 1.5, channels)))]
        self.nodes.append(helper.make_node("BatchNormalization", [x, *stats], [name], name=name, epsilon=1e-5))
        return name

    def conv(self, x: str, name: str, cin: int, cout: int, k: int) -> str:
        w = self.rng.normal(0.0, np.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k))
        self.nodes.append(helper.make_node("Conv", [x, self.param(f"{name}.weight", w)], [name], name=name,
                                           kernel_shape=[k, k], pads=[k // 2] * 4))
        return name

    def dense_layer(self, x: str, name: str, cin: int, growth: int, bn_size: int) -> str:
        y = self.op("Relu", [self.bn(x, f"{name}.norm1", cin)], f"{name}.relu1")
        y = self.conv(y, f"{name}.conv1", cin, bn_size * growth, 1)
        y = self.op("Relu", [self.bn(y, f"{name}.norm2", bn_size * growth)], f"{name}.relu2")
        return self.conv(y, f"{name}.conv2", bn_size * growth, growth, 3)


def build_densenet121(batch: int = 1, image: int = 224, classes: int = 1000, growth: int = 32,
                      blocks: tuple[int, ...] = DENSENET121_BLOCKS, init: int = 64, bn_size: int = 4,
                      seed: int = 0) -> onnx.ModelProto:
    """DenseNet-121 for ``[batch, 3, image, image]`` float32 ``input``, giving ``[batch, classes]``
    ``logits``; ``growth``, ``blocks``, ``init`` and ``bn_size`` as torchvision names them
    (smaller ones give a small DenseNet of the same topology)."""
    b = _DenseNetBuilder(np.random.default_rng(seed))
    x = b.op("Relu", [b.conv_bn("input", "features.conv0", 3, init, 7, 2)], "features.relu0")
    x = b.op("MaxPool", [x], "features.pool0", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    channels = init
    for index, layers in enumerate(blocks, 1):
        features = [x]
        for k in range(layers):
            name = f"features.denseblock{index}.denselayer{k + 1}"
            joined = features[0] if len(features) == 1 else b.op("Concat", features, f"{name}.cat", axis=1)
            features.append(b.dense_layer(joined, name, channels + k * growth, growth, bn_size))
        x = b.op("Concat", features, f"features.denseblock{index}.cat", axis=1)
        channels += layers * growth
        if index != len(blocks):
            name = f"features.transition{index}"
            y = b.op("Relu", [b.bn(x, f"{name}.norm", channels)], f"{name}.relu")
            y = b.conv(y, f"{name}.conv", channels, channels // 2, 1)
            x = b.op("AveragePool", [y], f"{name}.pool", kernel_shape=[2, 2], strides=[2, 2])
            channels //= 2
    x = b.op("Relu", [b.bn(x, "features.norm5", channels)], "features.relu5")
    return b.classified(x, channels, classes, "classifier", 0.05, "densenet121", batch, image)
