"""ONNX models built in code for tests, the demo and benchmarks: no model or dataset is downloaded.

- `build_resnet18`: torchvision's ResNet-18 topology with seeded random weights,
  at any batch, image size, class count and width.
- `digits`: a small CNN trained in numpy on scikit-learn's bundled 8×8 digits;
  the trained model is committed at `MODEL_PATH`, `load_split` gives the data it
  was trained and tested on, and `accuracy` scores logits against labels.
"""

from __future__ import annotations

from typing import Any

from .resnet import RESNET18_CONVS, build_resnet18

__all__ = ["MODEL_PATH", "RESNET18_CONVS", "accuracy", "build_resnet18", "load_split"]


def __getattr__(name: str) -> Any:
    # `digits` is imported on first use, not here: `python -m gemforge.models.digits`
    # would otherwise import it twice (runpy warns about that).
    if name in ("MODEL_PATH", "accuracy", "load_split"):
        from . import digits
        return getattr(digits, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
