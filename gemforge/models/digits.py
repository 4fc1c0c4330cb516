"""A small CNN for scikit-learn's bundled 8×8 digits, trained in numpy, exported to ONNX.

The demo and the accuracy tests need a *trained* network whose accuracy means
something, yet nothing may be downloaded: scikit-learn ships the digits data,
and the network is small enough to train with a hand-written forward/backward
pass and Adam in seconds. The trained model is committed as ``digits_cnn.onnx``;
``python -m gemforge.models.digits`` rebuilds it (deterministically for a seed).

Network: Conv 3×3 (1→16) + ReLU → MaxPool 2 → Conv 3×3 (16→32) + ReLU →
MaxPool 2 → Flatten → Gemm (128→10), giving logits.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

from ..files import write_bytes_atomic

__all__ = ["MODEL_PATH", "accuracy", "load_split", "main", "train"]

MODEL_PATH = Path(__file__).parent / "digits_cnn.onnx"

Params = dict[str, np.ndarray]


def load_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: float32 N×1×8×8 images in [0, 1], int64
    labels; a stratified 75/25 split, fixed by ``seed``."""
    # Imported here so that importing gemforge.models does not pull in scikit-learn.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images[:, None] / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_train, y_train, x_test, y_test


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of rows whose largest logit is at the label."""
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def _im2col(x: np.ndarray) -> np.ndarray:
    """N×C×H×W → (N·H·W)×(C·9) patches of a 3×3, pad 1 convolution, in the weights' (C, kh, kw) order."""
    n, c, h, w = x.shape
    windows = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def _col2im(cols: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The adjoint of `_im2col`: scatter-add patch gradients back onto the image."""
    n, c, h, w = shape
    cols = cols.reshape(n, h, w, c, 3, 3)
    padded = np.zeros((n, c, h + 2, w + 2), cols.dtype)
    for i in range(3):
        for j in range(3):
            padded[:, :, i:i + h, j:j + w] += cols[..., i, j].transpose(0, 3, 1, 2)
    return padded[:, :, 1:-1, 1:-1]


def _conv_relu_pool(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Conv 3×3 pad 1 + ReLU + MaxPool 2×2; returns the output and what backward needs."""
    n, _, h, wd = x.shape
    cols = _im2col(x)
    act = np.maximum(cols @ w.reshape(len(w), -1).T + b, 0).reshape(n, h, wd, -1).transpose(0, 3, 1, 2)
    blocks = act.reshape(n, len(w), h // 2, 2, wd // 2, 2)
    out = blocks.max(axis=(3, 5))
    return out, (x.shape, cols, blocks, out)


def _conv_relu_pool_backward(grad: np.ndarray, w: np.ndarray, cache: tuple) -> tuple[np.ndarray, ...]:
    """Gradients of `_conv_relu_pool` for its input, weight and bias."""
    shape, cols, blocks, out = cache
    # The gradient goes to the window's maximum; a zero maximum is a ReLU that is off.
    mask = (blocks == out[:, :, :, None, :, None]) & (blocks > 0)
    dact = (mask * grad[:, :, :, None, :, None]).reshape(shape[0], len(w), shape[2], shape[3])
    dact = dact.transpose(0, 2, 3, 1).reshape(-1, len(w))
    dx = _col2im(dact @ w.reshape(len(w), -1), shape)
    return dx, (dact.T @ cols).reshape(w.shape), dact.sum(axis=0)


def _forward(p: Params, x: np.ndarray) -> tuple[np.ndarray, list]:
    h1, c1 = _conv_relu_pool(x, p["conv1.weight"], p["conv1.bias"])
    h2, c2 = _conv_relu_pool(h1, p["conv2.weight"], p["conv2.bias"])
    flat = h2.reshape(len(x), -1)
    return flat @ p["fc.weight"].T + p["fc.bias"], [c1, c2, flat, h2.shape]


def _backward(p: Params, dlogits: np.ndarray, cache: list) -> Params:
    c1, c2, flat, h2_shape = cache
    g = {"fc.weight": dlogits.T @ flat, "fc.bias": dlogits.sum(axis=0)}
    dh2 = (dlogits @ p["fc.weight"]).reshape(h2_shape)
    dh1, g["conv2.weight"], g["conv2.bias"] = _conv_relu_pool_backward(dh2, p["conv2.weight"], c2)
    _, g["conv1.weight"], g["conv1.bias"] = _conv_relu_pool_backward(dh1, p["conv1.weight"], c1)
    return g


def _to_onnx(p: Params) -> onnx.ModelProto:
    def conv_relu_pool(x: str, layer: str) -> list[onnx.NodeProto]:
        return [helper.make_node("Conv", [x, f"{layer}.weight", f"{layer}.bias"], [f"{layer}.conv"],
                                 name=layer, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", [f"{layer}.conv"], [f"{layer}.relu"], name=f"{layer}.relu"),
                helper.make_node("MaxPool", [f"{layer}.relu"], [f"{layer}.pool"], name=f"{layer}.pool",
                                 kernel_shape=[2, 2], strides=[2, 2])]

    nodes = [*conv_relu_pool("input", "conv1"), *conv_relu_pool("conv1.pool", "conv2"),
             helper.make_node("Flatten", ["conv2.pool"], ["flatten"], name="flatten", axis=1),
             helper.make_node("Gemm", ["flatten", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in p.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                              producer_name="gemforge.models.digits")
    onnx.checker.check_model(model)
    return model


def _params(model: onnx.ModelProto) -> Params:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def train(seed: int = 0, epochs: int = 30, batch: int = 32, lr: float = 3e-3) -> onnx.ModelProto:
    """Train on `load_split` (``seed`` fixes the split, the initial weights and the batch
    order) with softmax cross-entropy and Adam; return the network as an ONNX model."""
    x, y, _, _ = load_split(seed)
    rng = np.random.default_rng(seed)
    shapes = {"conv1.weight": (16, 1, 3, 3), "conv1.bias": (16,), "conv2.weight": (32, 16, 3, 3),
              "conv2.bias": (32,), "fc.weight": (10, 128), "fc.bias": (10,)}
    # He-normal weights, zero biases.
    p = {k: (rng.normal(0.0, np.sqrt(2.0 / np.prod(s[1:])), s) if len(s) > 1 else np.zeros(s)).astype(np.float32)
         for k, s in shapes.items()}
    mean = {k: np.zeros_like(w) for k, w in p.items()}  # Adam's gradient moments
    sq = {k: np.zeros_like(w) for k, w in p.items()}
    beta1, beta2, step = 0.9, 0.999, 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            logits, cache = _forward(p, x[idx])
            prob = np.exp(logits - logits.max(axis=1, keepdims=True))
            prob /= prob.sum(axis=1, keepdims=True)
            prob[np.arange(len(idx)), y[idx]] -= 1  # d(mean cross-entropy)/d(logits), times the batch size
            step += 1
            for k, g in _backward(p, prob / len(idx), cache).items():
                mean[k] = beta1 * mean[k] + (1 - beta1) * g
                sq[k] = beta2 * sq[k] + (1 - beta2) * g * g
                mhat, vhat = mean[k] / (1 - beta1 ** step), sq[k] / (1 - beta2 ** step)
                p[k] -= (lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
    return _to_onnx(p)


def main(argv: list[str] | None = None) -> None:
    """Train, report the accuracies and write the ONNX model (atomically)."""
    parser = argparse.ArgumentParser(prog="python -m gemforge.models.digits", description=__doc__.split("\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=MODEL_PATH, help="ONNX file (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="split, initialization and batch-order seed")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    model = train(args.seed)
    elapsed = time.perf_counter() - start
    x_train, y_train, x_test, y_test = load_split(args.seed)
    p = _params(model)
    print(f"trained in {elapsed:.1f} s: train accuracy {accuracy(_forward(p, x_train)[0], y_train):.4f}, "
          f"test accuracy {accuracy(_forward(p, x_test)[0], y_test):.4f}")
    write_bytes_atomic(args.output, model.SerializeToString())
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
