"""ONNX models built in code for tests, the demo and benchmarks: no model or dataset is downloaded.

- `build_resnet18`: torchvision's ResNet-18 topology with seeded random weights,
  at any batch, image size, class count and width; `build_mobilenet_v2` the same for
  MobileNetV2 (depthwise convolutions, ReLU6, inverted residuals), `build_densenet121` for
  DenseNet-121 (concat-heavy dense blocks, pre-activation BatchNorms).
- `exported`: networks written as exporters write them (torch.onnx's habits, an older
  opset): a YOLOv8-style detector, a U-Net, a CRNN text recognizer, an AlexNet.
- `transformers`: a ViT-tiny-style and a BERT-tiny-style encoder.
- `digits`: a small CNN trained in numpy on scikit-learn's bundled 8×8 digits;
  the trained model is committed at `MODEL_PATH`, `load_split` gives the data it
  was trained and tested on, and `accuracy` scores logits against labels.
"""

from __future__ import annotations

from typing import Any

from .densenet import build_densenet121
from .exported import build_alexnet_style, build_crnn_style, build_unet_style, build_yolo_style
from .mobilenet import build_mobilenet_v2
from .resnet import RESNET18_CONVS, build_resnet18
from .transformers import build_bert_tiny, build_vit_tiny

__all__ = ["MODEL_PATH", "RESNET18_CONVS", "accuracy", "build_alexnet_style", "build_bert_tiny", "build_crnn_style",
           "build_densenet121", "build_mobilenet_v2",
           "build_resnet18", "build_unet_style", "build_vit_tiny", "build_yolo_style", "load_split"]


def __getattr__(name: str) -> Any:
    # `digits` is imported on first use, not here: `python -m gemforge.models.digits`
    # would otherwise import it twice (runpy warns about that).
    if name in ("MODEL_PATH", "accuracy", "load_split"):
        from . import digits
        return getattr(digits, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
