"""MobileNetV2 (torchvision's topology) as an ONNX graph with random weights, as torch.onnx
exports it in eval mode: each convolution followed by its BatchNormalization (unfolded, as
exporters with constant folding off write it), ReLU6 as Clip(0, 6) with its bounds as
constant inputs (opset 11 and newer), the classifier's Dropout gone.

It is the depthwise network of the benchmarks and of the issues on whole networks and host
speed: 17 depthwise 3×3 convolutions, 10 residual adds, 35 ReLU6s.
"""

from __future__ import annotations

import numpy as np
import onnx

from .resnet import LayerBuilder

__all__ = ["build_mobilenet_v2", "MOBILENET_V2_BLOCKS"]

#: The inverted residual blocks: (expansion t, output channels c, repeats n, first stride s).
MOBILENET_V2_BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]


def _divisible(value: float, divisor: int = 8) -> int:
    """torchvision's `_make_divisible`: the nearest multiple of ``divisor``, never 10% below ``value``."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class _MobileNetBuilder(LayerBuilder):
    def relu6(self, x: str, name: str) -> str:
        low, high = (self.param(f"{name}.{k}", np.float32(v)) for k, v in (("min", 0.0), ("max", 6.0)))
        return self.op("Clip", [x, low, high], name)

    def inverted_residual(self, x: str, name: str, cin: int, cout: int, stride: int, expand: int) -> str:
        hidden = int(round(cin * expand))
        y = x
        if expand != 1:
            y = self.relu6(self.conv_bn(y, f"{name}.expand", cin, hidden, 1, 1), f"{name}.expand.relu6")
        y = self.relu6(self.conv_bn(y, f"{name}.dw", hidden, hidden, 3, stride, groups=hidden), f"{name}.dw.relu6")
        y = self.conv_bn(y, f"{name}.project", hidden, cout, 1, 1)
        return self.op("Add", [x, y], f"{name}.add") if stride == 1 and cin == cout else y


def build_mobilenet_v2(batch: int = 1, image: int = 224, classes: int = 1000, width: float = 1.0,
                       seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 for ``[batch, 3, image, image]`` float32 ``input``, giving ``[batch, classes]``
    ``logits``; ``width`` scales every layer's channels (torchvision's ``width_mult``)."""
    b = _MobileNetBuilder(np.random.default_rng(seed))
    cin = _divisible(32 * width)
    x = b.relu6(b.conv_bn("input", "features.0", 3, cin, 3, 2), "features.0.relu6")
    index = 1
    for expand, channels, repeats, stride in MOBILENET_V2_BLOCKS:
        cout = _divisible(channels * width)
        for k in range(repeats):
            x = b.inverted_residual(x, f"features.{index}", cin, cout, stride if k == 0 else 1, expand)
            cin, index = cout, index + 1
    last = _divisible(1280 * max(1.0, width))
    x = b.relu6(b.conv_bn(x, f"features.{index}", cin, last, 1, 1), f"features.{index}.relu6")
    # Random BN statistics do not normalize (see resnet.py): a small classifier keeps the logits O(1).
    return b.classified(x, last, classes, "classifier", 0.05, "mobilenet_v2", batch, image)
