"""Small networks written as real exporters write them, with seeded random weights.

`onnx.helper` makes idealised graphs: one node per layer, constants as initializers, every
attribute at its default. What torch.onnx and older converters hand a compiler is messier, and
these builders reproduce that mess on purpose, so that the importer meets it in the tests:

- torch.onnx's names (``/model.2/cv1/conv/Conv`` writing ``/model.2/cv1/conv/Conv_output_0``,
  parameters ``model.2.cv1.conv.weight``), every attribute spelt out (Conv's dilations, group,
  pads, strides), and small constants as ``Constant`` nodes rather than initializers;
- activations as their decompositions (SiLU as Sigmoid and Mul), ``chunk`` as Split with a
  constant split input, ``x.view(x.size(0), …)`` as a Shape → Gather → Unsqueeze → Concat
  chain feeding the Reshape, ``F.pad`` with amounts computed from shapes (Python's ``//`` of
  sizes as Div with its floor fix-up of Less, Xor, Mod, Equal, Not, And and Where) and the
  ConstantOfShape/Concat/Reshape/Slice/Transpose/Cast chain that reorders them for ONNX's Pad;
- ``nn.Linear`` on a 3-D sequence as MatMul + Add (with the weight transposed under a name
  like ``onnx::MatMul_100``), BatchNormalization left as a node (as tf2onnx and paddle2onnx
  write it; torch.onnx folds one that follows a conv in an eval-mode export, as in the U-Net);
- Resize as ``nn.Upsample`` exports it (an empty roi name, constant scales, ``asymmetric`` and
  ``floor``) and as ``F.interpolate(size=…)`` does (empty roi and scales constants, sizes
  computed from another tensor's shape);
- an old operator set (11) with Caffe-era layers (LRN, ceil-mode pooling, Dropout declaring
  its mask) and initializers also listed as graph inputs, as the ONNX model zoo's files are.

The sizes are small (32-64 pixels, 8-32 channels) so that a test compiles and runs each
network in seconds; the topology, not the size or the trained weights, is what they test. A
given seed builds the same model.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_yolo_style", "build_unet_style", "build_crnn_style", "build_alexnet_style"]


class _TorchExport:
    """Collects nodes, initializers and names the way torch.onnx writes them: a node
    ``/{scope}/{Op}`` (``_1``, ``_2`` … for further ones of that type in the scope) writes
    ``/{scope}/{Op}_output_{i}``; a parameter of module ``a/b`` is ``a.b.{name}``."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count: dict[str, int] = {}

    def node(self, op: str, inputs: list[str], scope: str, outputs: int = 1, output: str | None = None,
             **attrs: object) -> str | list[str]:
        """Appends an ``op`` node in ``scope``; returns its output's name (a list for several).
        ``output`` names a graph output (torch.onnx gives those the names the user chose)."""
        base = f"/{scope}/{op}" if scope else f"/{op}"
        seen = self._count.get(base, 0)
        self._count[base] = seen + 1
        name = base if not seen else f"{base}_{seen}"
        names = [output] if output else [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=name, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, scope: str, value) -> str:
        """A ``Constant`` node holding ``value`` (torch.onnx's form for small literals)."""
        tensor = numpy_helper.from_array(np.asarray(value))
        return self.node("Constant", [], scope, value=tensor)

    def param(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv(self, x: str, scope: str, cin: int, cout: int, k, stride=1, pad=None, bias: bool = False,
             std: float | None = None, output: str | None = None) -> str:
        """``nn.Conv2d``: He-normal weights (which keep the activations' scale through a ReLU or
        SiLU), padding ``k // 2`` unless given, every attribute written out."""
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        ph, pw = (kh // 2, kw // 2) if pad is None else ((pad, pad) if isinstance(pad, int) else pad)
        std = np.sqrt(2.0 / (cin * kh * kw)) if std is None else std
        dotted = scope.replace("/", ".")
        inputs = [x, self.param(f"{dotted}.weight", self.rng.normal(0.0, std, (cout, cin, kh, kw)))]
        if bias:
            inputs.append(self.param(f"{dotted}.bias", self.rng.normal(0.0, 0.05, cout)))
        return self.node("Conv", inputs, scope, output=output, dilations=[1, 1], group=1, kernel_shape=[kh, kw],
                         pads=[ph, pw, ph, pw], strides=[sh, sw])

    def batch_norm(self, x: str, scope: str, c: int, eps: float = 1e-5, momentum: float = 0.9) -> str:
        """``nn.BatchNorm2d`` in inference mode, its own node (for gemforge's BatchNorm folding),
        with random affine parameters and running statistics."""
        dotted = scope.replace("/", ".")
        stats = [self.param(f"{dotted}.{p}", v) for p, v in (
            ("weight", self.rng.uniform(0.5, 1.5, c)), ("bias", self.rng.normal(0.0, 0.1, c)),
            ("running_mean", self.rng.normal(0.0, 0.1, c)), ("running_var", self.rng.uniform(0.5, 1.5, c)))]
        return self.node("BatchNormalization", [x, *stats], scope, epsilon=eps, momentum=momentum)

    def model(self, name: str, inputs, outputs, opset: int) -> onnx.ModelProto:
        """The checked model; ``inputs``/``outputs`` are (name, shape) pairs."""
        graph = helper.make_graph(self.nodes, name,
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                                  self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8,
                              producer_name="pytorch", producer_version="2.3.0")
        onnx.checker.check_model(m, full_check=True)
        return m


# ----------------------------------------------------------------------------- YOLOv8


def _silu_conv(b: _TorchExport, x: str, scope: str, cin: int, cout: int, k: int = 1, s: int = 1) -> str:
    """Ultralytics' ``Conv``: conv (no bias) → BatchNorm (eps 1e-3, momentum 0.97) → SiLU,
    which torch.onnx writes as ``x * sigmoid(x)``. (``yolo export`` fuses the BatchNorm into the
    conv first; it is kept here for gemforge to fold.)"""
    y = b.batch_norm(b.conv(x, f"{scope}/conv", cin, cout, k, s), f"{scope}/bn", cout, eps=1e-3, momentum=0.97)
    return b.node("Mul", [y, b.node("Sigmoid", [y], f"{scope}/act")], f"{scope}/act")


def _c2f(b: _TorchExport, x: str, scope: str, cin: int, cout: int, shortcut: bool) -> str:
    """Ultralytics' ``C2f`` with one bottleneck: a 1×1 conv, ``chunk(2, 1)`` (a Split with a
    constant split input), a bottleneck of two 3×3 convs on the second half (plus it, where
    ``shortcut``), the three concatenated and a 1×1 conv."""
    c = cout // 2
    y = _silu_conv(b, x, f"{scope}/cv1", cin, 2 * c)
    y0, y1 = b.node("Split", [y, b.const(scope, np.int64([c, c]))], scope, outputs=2, axis=1)
    m = _silu_conv(b, _silu_conv(b, y1, f"{scope}/m.0/cv1", c, c, 3), f"{scope}/m.0/cv2", c, c, 3)
    if shortcut:
        m = b.node("Add", [y1, m], f"{scope}/m.0")
    return _silu_conv(b, b.node("Concat", [y0, y1, m], scope, axis=1), f"{scope}/cv2", 3 * c, cout)


def _sppf(b: _TorchExport, x: str, scope: str, cin: int, cout: int) -> str:
    """Ultralytics' ``SPPF``: a 1×1 conv, three chained 5×5 max pools (stride 1, padding 2),
    the four concatenated, a 1×1 conv."""
    y = [_silu_conv(b, x, f"{scope}/cv1", cin, cin // 2)]
    for _ in range(3):
        y.append(b.node("MaxPool", [y[-1]], f"{scope}/m", ceil_mode=0, dilations=[1, 1], kernel_shape=[5, 5],
                        pads=[2, 2, 2, 2], strides=[1, 1]))
    return _silu_conv(b, b.node("Concat", y, scope, axis=1), f"{scope}/cv2", 2 * cin, cout)


def _upsample(b: _TorchExport, x: str, scope: str) -> str:
    """``nn.Upsample(scale_factor=2, mode="nearest")``: Resize with an empty roi name and
    constant scales, coordinates ``asymmetric``, rounding ``floor``."""
    scales = b.const(scope, np.float32([1.0, 1.0, 2.0, 2.0]))
    return b.node("Resize", [x, "", scales], scope, coordinate_transformation_mode="asymmetric",
                  cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")


def _anchors(levels: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ultralytics' ``make_anchors`` (offset 0.5) for (height, width, stride) levels, in the
    exported layout: points (1, 2, A) as (x, y), strides (1, A)."""
    points, strides = [], []
    for h, w, stride in levels:
        sy, sx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        points.append(np.stack([sx.ravel(), sy.ravel()]))
        strides.append(np.full(h * w, stride))
    return (np.concatenate(points, axis=1)[None].astype(np.float32),
            np.concatenate(strides)[None].astype(np.float32))


def build_yolo_style(batch: int = 1, image: int = 64, width: int = 16, classes: int = 4,
                     seed: int = 0) -> onnx.ModelProto:
    """A YOLOv8-style detector (Ultralytics' ``yolov8n.pt`` topology, narrowed to two output
    levels) as ``yolo export format=onnx`` writes it (torch.onnx, opset 17).

    ``images`` [batch, 3, image, image] (``image`` a multiple of 16) gives ``output0`` [batch,
    4 + classes, A]: per anchor (A of them: (image/4)² + (image/8)²) the box centre, width and
    height in input pixels, then the class probabilities. ``width`` channels at stride 4 (2 ×
    ``width`` below it), 8 to 32 channels in all at the default.

    The layers: Conv + BatchNorm + SiLU (Sigmoid and Mul) stems at stride 2, C2f blocks (Split
    in two halves, a bottleneck with its residual Add, Concat, 1×1 conv), SPPF (chained 5×5
    max pools, Concat), a PAN neck (two ``nn.Upsample`` Resizes and Concats up, a stride-2 conv
    and Concat down), and the ``Detect`` head: per level a box branch (4 × 16 distribution
    bins) and a class branch concatenated; ``x.view(x.shape[0], no, -1)`` (its batch size
    taken by Shape → Gather → Unsqueeze → Concat) and Concat over levels; Split into boxes and
    classes; DFL (Reshape to (N, 4, 16, A), Transpose, Softmax over the bins, a 1×1 conv with
    weights 0…15, Reshape); ``dist2bbox`` (Split, Sub, Add, Div by 2, Concat) times the
    strides; Sigmoid of the class scores and Concat of both.
    """
    if image % 16 or image < 16:
        raise ValueError(f"image must be a positive multiple of 16, not {image!r}")
    b = _TorchExport(seed)
    w, reg_max, no = width, 16, 64 + classes
    x = _silu_conv(b, "images", "model.0", 3, w // 2, 3, 2)
    x = _silu_conv(b, x, "model.1", w // 2, w, 3, 2)
    p3 = _c2f(b, x, "model.2", w, w, shortcut=True)                          # stride 4
    x = _silu_conv(b, p3, "model.3", w, 2 * w, 3, 2)
    p4 = _c2f(b, x, "model.4", 2 * w, 2 * w, shortcut=True)                  # stride 8
    x = _silu_conv(b, p4, "model.5", 2 * w, 2 * w, 3, 2)
    p5 = _sppf(b, x, "model.6", 2 * w, 2 * w)                               # stride 16
    x = b.node("Concat", [_upsample(b, p5, "model.7"), p4], "model.8", axis=1)
    n4 = _c2f(b, x, "model.9", 4 * w, 2 * w, shortcut=False)
    x = b.node("Concat", [_upsample(b, n4, "model.10"), p3], "model.11", axis=1)
    out3 = _c2f(b, x, "model.12", 3 * w, w, shortcut=False)
    x = b.node("Concat", [_silu_conv(b, out3, "model.13", w, w, 3, 2), n4], "model.14", axis=1)
    out4 = _c2f(b, x, "model.15", 3 * w, 2 * w, shortcut=False)

    head, c2, c3 = "model.16", 2 * w, w
    level = []
    for i, (feature, cin) in enumerate(((out3, w), (out4, 2 * w))):
        box = _silu_conv(b, _silu_conv(b, feature, f"{head}/cv2.{i}/cv2.{i}.0", cin, c2, 3),
                         f"{head}/cv2.{i}/cv2.{i}.1", c2, c2, 3)
        box = b.conv(box, f"{head}/cv2.{i}/cv2.{i}.2", c2, 4 * reg_max, 1, bias=True, std=0.1)
        cls = _silu_conv(b, _silu_conv(b, feature, f"{head}/cv3.{i}/cv3.{i}.0", cin, c3, 3),
                         f"{head}/cv3.{i}/cv3.{i}.1", c3, c3, 3)
        cls = b.conv(cls, f"{head}/cv3.{i}/cv3.{i}.2", c3, classes, 1, bias=True, std=0.1)
        level.append(b.node("Concat", [box, cls], head, axis=1))
    # x.view(shape[0], self.no, -1) for each level, shape = x[0].shape: traced, so the batch
    # size comes from a Shape node.
    n = b.node("Unsqueeze", [b.node("Gather", [b.node("Shape", [level[0]], head), b.const(head, np.int64(0))],
                                    head, axis=0), b.const(head, np.int64([0]))], head)
    view = b.node("Concat", [n, b.const(head, np.int64([no])), b.const(head, np.int64([-1]))], head, axis=0)
    x = b.node("Concat", [b.node("Reshape", [f, view], head) for f in level], head, axis=2)
    box, cls = b.node("Split", [x, b.const(head, np.int64([4 * reg_max, classes]))], head, outputs=2, axis=1)

    anchors = (image // 4) ** 2 + (image // 8) ** 2
    dfl = f"{head}/dfl"
    x = b.node("Reshape", [box, b.const(dfl, np.int64([batch, 4, reg_max, anchors]))], dfl)
    x = b.node("Softmax", [b.node("Transpose", [x], dfl, perm=[0, 2, 1, 3])], dfl, axis=1)
    x = b.node("Conv", [x, b.param(f"{head}.dfl.conv.weight", np.arange(reg_max).reshape(1, reg_max, 1, 1))],
               f"{dfl}/conv", dilations=[1, 1], group=1, kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1])
    distance = b.node("Reshape", [x, b.const(dfl, np.int64([batch, 4, anchors]))], dfl)

    points, strides = _anchors([(image // 4, image // 4, 4), (image // 8, image // 8, 8)])
    lt, rb = b.node("Split", [distance, b.const(head, np.int64([2, 2]))], head, outputs=2, axis=1)
    x1y1 = b.node("Sub", [b.param(f"{head}.anchors", points), lt], head)
    x2y2 = b.node("Add", [f"{head}.anchors", rb], head)
    centre = b.node("Div", [b.node("Add", [x1y1, x2y2], head), b.const(head, np.float32(2.0))], head)
    size = b.node("Sub", [x2y2, x1y1], head)
    dbox = b.node("Mul", [b.node("Concat", [centre, size], head, axis=1), b.param(f"{head}.strides", strides)],
                  head)
    b.node("Concat", [dbox, b.node("Sigmoid", [cls], head)], head, output="output0", axis=1)
    return b.model("main_graph", [("images", [batch, 3, image, image])],
                   [("output0", [batch, 4 + classes, anchors])], opset=17)


# ----------------------------------------------------------------------------- U-Net


def _double_conv(b: _TorchExport, x: str, scope: str, cin: int, cout: int) -> str:
    """U-Net's ``DoubleConv``: two 3×3 conv + ReLU (torch.onnx folds an eval-mode BatchNorm
    into its convolution's weights and bias, so none is left)."""
    y = b.node("Relu", [b.conv(x, f"{scope}/double_conv/double_conv.0", cin, cout, 3, bias=True)],
               f"{scope}/double_conv/double_conv.1")
    return b.node("Relu", [b.conv(y, f"{scope}/double_conv/double_conv.2", cout, cout, 3, bias=True)],
                  f"{scope}/double_conv/double_conv.3")


def _floor_div(b: _TorchExport, x: str, divisor: int, scope: str) -> str:
    """Python's ``x // divisor`` of a traced int64 scalar as torch.onnx (opset 10 and later)
    writes it: ONNX's Div truncates, so a Where subtracts 1 where the signs differ and the
    remainder (Mod) is not 0, a mask built of Less, Xor, Equal, Not and And."""
    d, zero = b.const(scope, np.int64(divisor)), b.const(scope, np.int64(0))
    div = b.node("Div", [x, d], scope)
    negative = b.node("Xor", [b.node("Less", [x, zero], scope), b.node("Less", [d, zero], scope)], scope)
    inexact = b.node("Not", [b.node("Equal", [b.node("Mod", [x, d], scope, fmod=0), zero], scope)], scope)
    fixup = b.node("Sub", [div, b.const(scope, np.int64(1))], scope)
    return b.node("Where", [b.node("And", [negative, inexact], scope), fixup, div], scope)


def _pad_to(b: _TorchExport, x: str, like: str, scope: str) -> str:
    """milesial's ``Up.forward``: ``F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])`` with
    ``dy, dx`` the size differences of ``like`` and ``x``, traced, as torch.onnx writes a pad of
    computed amounts: the amounts from Shape → Gather → Sub and `_floor_div`, unsqueezed and
    concatenated, extended with zeros (ConstantOfShape) to the rank's 8, then reordered from
    torch's last-axis-first pairs to ONNX's begins-then-ends (Reshape to pairs, a reversing
    Slice, Transpose, Reshape, Cast) for a constant-mode Pad. Here the sizes agree: the pads
    are 0."""
    def size(t: str, axis: int) -> str:
        return b.node("Gather", [b.node("Shape", [t], scope), b.const(scope, np.int64(axis))], scope, axis=0)

    amounts = []
    for axis in (3, 2):
        diff = b.node("Sub", [size(like, axis), size(x, axis)], scope)
        half = _floor_div(b, diff, 2, scope)
        amounts += [half, b.node("Sub", [diff, half], scope)]
    pads = b.node("Concat", [b.node("Unsqueeze", [a, b.const(scope, np.int64([0]))], scope) for a in amounts],
                  scope, axis=0)
    zeros = b.node("ConstantOfShape", [b.node("Sub", [b.const(scope, np.int64([8])), b.node("Shape", [pads], scope)],
                                              scope)], scope, value=numpy_helper.from_array(np.int64([0])))
    pairs = b.node("Reshape", [b.node("Concat", [pads, zeros], scope, axis=0), b.const(scope, np.int64([-1, 2]))],
                   scope)
    reverse = b.node("Slice", [pairs, b.const(scope, np.int64([-1])), b.const(scope, np.int64([-(2 ** 63 - 1)])),
                               b.const(scope, np.int64([0])), b.const(scope, np.int64([-1]))], scope)
    flat = b.node("Reshape", [b.node("Transpose", [reverse], scope, perm=[1, 0]), b.const(scope, np.int64([-1]))],
                  scope)
    return b.node("Pad", [x, b.node("Cast", [flat], scope, to=TensorProto.INT64), b.const(scope, np.float32(0.0))],
                  scope, mode="constant")


def build_unet_style(batch: int = 1, image: int = 64, width: int = 8, classes: int = 2, seed: int = 0,
                     size_matching_pad: bool = True) -> onnx.ModelProto:
    """A small U-Net (milesial's Pytorch-UNet, three levels instead of four) with a feature
    pyramid's nearest-neighbour lateral, as torch.onnx (opset 13) exports it.

    ``input`` [batch, 3, image, image] (``image`` a multiple of 8) gives per-pixel ``output``
    logits [batch, classes, image, image]; ``width`` channels at full resolution, doubled at
    each level down to 4 × ``width`` (8 to 32 channels at the default).

    Encoder: double 3×3 conv + ReLU, 2×2 max pool, three times down. Decoder: up once by a
    ConvTranspose of kernel 2, stride 2 (``nn.ConvTranspose2d(c, c // 2, 2, 2)``), once by one
    of kernel 3, stride 2, pads 1, output_padding 1, each followed by milesial's size-matching
    pad (a constant Pad whose amounts a chain of shape arithmetic computes; left out, the
    upsampled tensor goes straight to the Concat, where not ``size_matching_pad``) and a Concat
    with the encoder's skip; the last step up is ``F.interpolate(x, size=skip.shape[-2:],
    mode="nearest")``, a Resize with empty roi and scales constants and sizes computed from the
    skip's shape (Shape → Slice → Concat), as an FPN's top-down path writes it. A 1×1 conv
    gives the logits.
    """
    if image % 8 or image < 8:
        raise ValueError(f"image must be a positive multiple of 8, not {image!r}")
    b = _TorchExport(seed)
    w = width
    x1 = _double_conv(b, "input", "inc", 3, w)
    pool = dict(ceil_mode=0, dilations=[1, 1], kernel_shape=[2, 2], pads=[0, 0, 0, 0], strides=[2, 2])
    x2 = _double_conv(b, b.node("MaxPool", [x1], "down1/maxpool_conv/maxpool_conv.0", **pool),
                      "down1/maxpool_conv/maxpool_conv.1", w, 2 * w)
    x3 = _double_conv(b, b.node("MaxPool", [x2], "down2/maxpool_conv/maxpool_conv.0", **pool),
                      "down2/maxpool_conv/maxpool_conv.1", 2 * w, 4 * w)
    x4 = _double_conv(b, b.node("MaxPool", [x3], "down3/maxpool_conv/maxpool_conv.0", **pool),
                      "down3/maxpool_conv/maxpool_conv.1", 4 * w, 4 * w)

    def transposed(x: str, scope: str, cin: int, cout: int, k: int, pad: int, output_padding: int) -> str:
        dotted = scope.replace("/", ".")
        # ConvTranspose weights are (in, out, kH, kW); an output pixel sums about cin·(k/2)²
        # products at stride 2, the fan-in of He's initialisation.
        weight = b.param(f"{dotted}.weight", b.rng.normal(0.0, np.sqrt(2.0 / (cin * k * k / 4)), (cin, cout, k, k)))
        bias = b.param(f"{dotted}.bias", b.rng.normal(0.0, 0.05, cout))
        return b.node("ConvTranspose", [x, weight, bias], scope, dilations=[1, 1], group=1, kernel_shape=[k, k],
                      output_padding=[output_padding] * 2, pads=[pad] * 4, strides=[2, 2])

    up = transposed(x4, "up1/up", 4 * w, 2 * w, 2, 0, 0)
    x = b.node("Concat", [x3, _pad_to(b, up, x3, "up1") if size_matching_pad else up], "up1", axis=1)
    x = _double_conv(b, x, "up1/conv", 6 * w, 2 * w)
    up = transposed(x, "up2/up", 2 * w, w, 3, 1, 1)
    x = b.node("Concat", [x2, _pad_to(b, up, x2, "up2") if size_matching_pad else up], "up2", axis=1)
    x = _double_conv(b, x, "up2/conv", 3 * w, w)

    # F.interpolate(x, size=x1.shape[-2:], mode="nearest")
    scope = "up3"
    hw = b.node("Slice", [b.node("Shape", [x1], scope), b.const(scope, np.int64([2])), b.const(scope, np.int64([4])),
                          b.const(scope, np.int64([0]))], scope)
    nc = b.node("Slice", [b.node("Shape", [x], scope), b.const(scope, np.int64([0])), b.const(scope, np.int64([2])),
                          b.const(scope, np.int64([0]))], scope)
    sizes = b.node("Concat", [nc, b.node("Cast", [hw], scope, to=TensorProto.INT64)], scope, axis=0)
    roi, scales = b.const(scope, np.zeros(0, np.float32)), b.const(scope, np.zeros(0, np.float32))
    up = b.node("Resize", [x, roi, scales, sizes], scope,
                coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.75, mode="nearest",
                nearest_mode="floor")
    x = _double_conv(b, b.node("Concat", [x1, up], scope, axis=1), "up3/conv", 2 * w, w)
    b.conv(x, "outc/conv", w, classes, 1, bias=True, output="output")
    return b.model("main_graph", [("input", [batch, 3, image, image])],
                   [("output", [batch, classes, image, image])], opset=13)


# ----------------------------------------------------------------------------- CRNN


def build_crnn_style(batch: int = 1, height: int = 32, width: int = 64, channels: int = 32, classes: int = 37,
                     seed: int = 0) -> onnx.ModelProto:
    """A CRNN text recognizer (meijieru's crnn.pytorch, with the (2, 1)-strided convolution of
    PaddleOCR's backbones) as torch.onnx (opset 13) exports it, its BiLSTM replaced by a
    two-layer perceptron.

    ``input`` [batch, 1, height, width] (a grey text line; ``height`` 32, ``width`` a multiple of
    4) gives ``output`` [T, batch, classes], T = width / 4 + 1 time steps of class
    probabilities (36 characters and CTC's blank at the default).

    The convolutions keep the width where they halve the height: 3×3 convs + ReLU (BatchNorm
    after two of them, a node of its own as paddle2onnx writes it), 2×2 max pools, then a
    2×2 max pool of strides (2, 1) and pads (0, 1) (crnn.pytorch's), a 3×3 conv of strides
    (2, 1) and a (2, 1) max pool (PaddleOCR's), bringing the height to 1. ``conv.squeeze(2)``
    (Squeeze with its axes as a constant input) and ``permute(2, 0, 1)`` (Transpose) give the
    (T, N, C) sequence; ``nn.Linear`` on it is MatMul + Add (torch.onnx writes Gemm for 2-D
    inputs only), then ReLU, the second MatMul + Add, and Softmax over the classes.
    """
    if height != 32 or width % 4 or width < 8:
        raise ValueError(f"the text line must be 32 pixels high and a multiple of 4 (at least 8) wide, not "
                         f"{height!r}×{width!r}")
    b = _TorchExport(seed)
    c = channels
    pool = dict(ceil_mode=0, dilations=[1, 1], kernel_shape=[2, 2], pads=[0, 0, 0, 0], strides=[2, 2])
    x = b.node("Relu", [b.conv("input", "cnn/conv0", 1, c // 4, 3, bias=True)], "cnn/relu0")
    x = b.node("MaxPool", [x], "cnn/pooling0", **pool)                                     # 16 × W/2
    x = b.node("Relu", [b.conv(x, "cnn/conv1", c // 4, c // 2, 3, bias=True)], "cnn/relu1")
    x = b.node("MaxPool", [x], "cnn/pooling1", **pool)                                     # 8 × W/4
    x = b.node("Relu", [b.batch_norm(b.conv(x, "cnn/conv2", c // 2, c, 3, bias=True), "cnn/batchnorm2", c)],
               "cnn/relu2")
    x = b.node("Relu", [b.conv(x, "cnn/conv3", c, c, 3, bias=True)], "cnn/relu3")
    x = b.node("MaxPool", [x], "cnn/pooling2", ceil_mode=0, dilations=[1, 1], kernel_shape=[2, 2],
               pads=[0, 1, 0, 1], strides=[2, 1])                                           # 4 × W/4 + 1
    x = b.node("Relu", [b.batch_norm(b.conv(x, "cnn/conv4", c, c, 3, stride=(2, 1), bias=True), "cnn/batchnorm4",
                                     c)], "cnn/relu4")                                      # 2 × W/4 + 1
    x = b.node("MaxPool", [x], "cnn/pooling3", ceil_mode=0, dilations=[1, 1], kernel_shape=[2, 1],
               pads=[0, 0, 0, 0], strides=[2, 1])                                           # 1 × W/4 + 1
    x = b.node("Squeeze", [x, b.const("", np.int64([2]))], "")
    x = b.node("Transpose", [x], "", perm=[2, 0, 1])
    hidden = 2 * c
    for i, (cin, cout) in enumerate(((c, hidden), (hidden, classes))):
        scope = f"rnn/embedding{i}"
        w = b.param(f"onnx::MatMul_{100 + i}", b.rng.normal(0.0, np.sqrt(2.0 / cin), (cin, cout)))
        x = b.node("Add", [b.param(f"rnn.embedding{i}.bias", b.rng.normal(0.0, 0.05, cout)),
                           b.node("MatMul", [x, w], scope)], scope)
        if i == 0:
            x = b.node("Relu", [x], "rnn/relu")
    b.node("Softmax", [x], "", output="output", axis=2)
    steps = width // 4 + 1
    return b.model("main_graph", [("input", [batch, 1, height, width])], [("output", [steps, batch, classes])],
                   opset=13)


# ----------------------------------------------------------------------------- AlexNet / GoogLeNet


def build_alexnet_style(opset: int = 11, batch: int = 1, image: int = 64, classes: int = 10,
                        seed: int = 0) -> onnx.ModelProto:
    """An AlexNet/GoogLeNet-style classifier as the ONNX model zoo's Caffe-era files are written
    (bvlc_alexnet, bvlc_googlenet: Caffe2's exporter), at an old operator set (``opset``, 10 to
    12; gemforge upgrades it to 13 on import).

    ``data_0`` [batch, 3, image, image] (``image`` a multiple of 32) gives ``prob_1`` [batch,
    classes], a Softmax's probabilities.

    The layers: GoogLeNet's stem (7×7 stride-2 conv + ReLU, 3×3 stride-2 max pool in Caffe's
    ceil mode, LRN of size 5, 1×1 and 3×3 convs + ReLU, LRN, ceil-mode pool), one inception
    block (1×1; 1×1 → 3×3; 1×1 → 5×5; 3×3 max pool → 1×1; Concat), a ceil-mode pool, then
    AlexNet's classifier: Flatten, Dropout (its mask output declared, read by nothing), Gemm
    with transB=1, ReLU, Dropout, Gemm, Softmax. The model zoo's habits: nodes without names,
    tensors named after their Caffe blobs, and every initializer listed among the graph's
    inputs too.
    """
    if not 10 <= opset <= 12:
        raise ValueError(f"opset must be 10, 11 or 12 (ceil-mode pooling needs 10; 13 is gemforge's own), "
                         f"not {opset!r}")
    if image % 32 or image < 32:
        raise ValueError(f"image must be a positive multiple of 32, not {image!r}")
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def param(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def op(kind: str, inputs: list[str], output: str, extra: tuple[str, ...] = (), **attrs) -> str:
        nodes.append(helper.make_node(kind, inputs, [output, *extra], **attrs))   # no name, as Caffe2 wrote them
        return output

    def conv(x: str, name: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        w = param(f"{name}_w_0", rng.normal(0.0, np.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k)))
        y = op("Conv", [x, w, param(f"{name}_b_0", rng.normal(0.0, 0.05, cout))], f"{name}_1",
               kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride])
        return op("Relu", [y], f"{name}_2")

    def pool(x: str, name: str, stride: int = 2, pad: int = 0) -> str:
        return op("MaxPool", [x], name, kernel_shape=[3, 3], strides=[stride, stride], pads=[pad] * 4,
                  ceil_mode=1 if stride > 1 else 0)

    def lrn(x: str, name: str) -> str:
        return op("LRN", [x], name, size=5, alpha=1e-4, beta=0.75, bias=1.0)

    def dropout(x: str, name: str) -> str:
        if opset < 12:
            return op("Dropout", [x], f"{name}_1", extra=(f"{name}_mask_1",), ratio=0.5)
        return op("Dropout", [x, param(f"{name}_ratio", np.float32(0.5))], f"{name}_1", extra=(f"{name}_mask_1",))

    x = pool(conv("data_0", "conv1_7x7_s2", 3, 16, 7, 2), "pool1_3x3_s2_1")                # image/4, ceil
    x = lrn(x, "pool1_norm1_1")
    x = conv(conv(x, "conv2_3x3_reduce", 16, 16, 1), "conv2_3x3", 16, 32, 3)
    x = pool(lrn(x, "conv2_norm2_1"), "pool2_3x3_s2_1")                                   # image/8
    branches = [conv(x, "inception_3a_1x1", 32, 8, 1),
                conv(conv(x, "inception_3a_3x3_reduce", 32, 12, 1), "inception_3a_3x3", 12, 16, 3),
                conv(conv(x, "inception_3a_5x5_reduce", 32, 4, 1), "inception_3a_5x5", 4, 8, 5),
                conv(pool(x, "inception_3a_pool_1", stride=1, pad=1), "inception_3a_pool_proj", 32, 8, 1)]
    x = pool(op("Concat", branches, "inception_3a_output_1", axis=1), "pool3_3x3_s2_1")    # image/16
    features = 40 * (image // 16) ** 2
    x = dropout(op("Flatten", [x], "OC2_DUMMY_0", axis=1), "drop6")
    x = op("Gemm", [x, param("fc6_w_0", rng.normal(0.0, np.sqrt(2.0 / features), (64, features))),
                    param("fc6_b_0", rng.normal(0.0, 0.05, 64))], "fc6_1", transB=1)
    x = dropout(op("Relu", [x], "fc6_2"), "drop7")
    x = op("Gemm", [x, param("fc7_w_0", rng.normal(0.0, 2.4 / np.sqrt(64), (classes, 64))),
                    param("fc7_b_0", rng.normal(0.0, 0.05, classes))], "fc7_1", transB=1)
    op("Softmax", [x], "prob_1")
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [batch, 3, image, image]),
         *(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits)],
        [helper.make_tensor_value_info("prob_1", TensorProto.FLOAT, [batch, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=6,
                              producer_name="onnx-caffe2")
    onnx.checker.check_model(model, full_check=True)
    return model
