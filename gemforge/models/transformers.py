"""Transformer encoders as ONNX graphs with seeded random weights: a ViT-tiny-style image
classifier and a BERT-tiny-style text encoder.

Both are written node for node as PyTorch's ``torch.onnx.export`` writes such models (static
shapes, constant folding on): ``nn.Linear`` of a 3-D activation is a MatMul by the transposed
weight (an initializer) and an Add whose first operand is the bias, a 2-D one a Gemm with
``transB=1``; ``nn.GELU()`` is ``x · (erf(x / √2) + 1) · ½``; ``x[:, 0]`` and ``qkv[0]`` are
Gathers with a scalar index; shape arguments and scalars are Constant nodes; tensor names
follow the exporter's ``/module/path/Op_output_0`` scheme. The ViT is exported at opset 17,
where LayerNorm is one LayerNormalization node; the BERT at opset 14, where the exporter
writes LayerNorm out as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul and Add. The
compiler thereby meets both forms.

The weights are normal with a standard deviation of 1/√fan-in (LayerNorm's scales near 1),
so every activation is of order one and the attention weights are far from uniform: a
quantization error shows in the outputs rather than vanishing in a near-constant softmax.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_vit_tiny", "build_bert_tiny"]


class _Exporter:
    """Collects nodes and initializers the way torch.onnx names them; each op returns its output."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}

    def _name(self, scope: str, op: str) -> str:
        key = f"{scope}/{op}"
        k = self._counts.get(key, 0)
        self._counts[key] = k + 1
        return f"{key}_{k}" if k else key

    def op(self, scope: str, op: str, inputs: list[str], **attrs: object) -> str:
        name = self._name(scope, op)
        self.nodes.append(helper.make_node(op, inputs, [f"{name}_output_0"], name=name, **attrs))
        return f"{name}_output_0"

    def constant(self, scope: str, value: np.ndarray) -> str:
        """A Constant node (the exporter's form for shapes, indices and scalars)."""
        name = self._name(scope, "Constant")
        self.nodes.append(helper.make_node("Constant", [], [f"{name}_output_0"], name=name,
                                           value=numpy_helper.from_array(np.asarray(value))))
        return f"{name}_output_0"

    def param(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return self.rng.normal(0.0, std, shape)

    def linear(self, scope: str, x: str, name: str, fan_in: int, fan_out: int) -> str:
        """``nn.Linear`` of a 3-D (or 4-D) activation: MatMul by Wᵀ, then Add(bias, ·)."""
        w = self.param(f"onnx::MatMul_{len(self.inits)}", self.normal((fan_in, fan_out), 1 / math.sqrt(fan_in)))
        b = self.param(f"{name}.bias", self.normal((fan_out,), 0.1))
        return self.op(scope, "Add", [b, self.op(scope, "MatMul", [x, w])])

    def gemm(self, scope: str, x: str, name: str, fan_in: int, fan_out: int) -> str:
        """``nn.Linear`` of a 2-D activation: Gemm with the (out, in) weight, transB=1."""
        w = self.param(f"{name}.weight", self.normal((fan_out, fan_in), 1 / math.sqrt(fan_in)))
        b = self.param(f"{name}.bias", self.normal((fan_out,), 0.1))
        return self.op(scope, "Gemm", [x, w, b], alpha=1.0, beta=1.0, transB=1)

    def layer_norm(self, scope: str, x: str, name: str, dim: int, eps: float, opset: int) -> str:
        gamma = self.param(f"{name}.weight", 1.0 + self.normal((dim,), 0.1))
        beta = self.param(f"{name}.bias", self.normal((dim,), 0.1))
        if opset >= 17:
            return self.op(scope, "LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)
        # torch.onnx's layer_norm below opset 17 (symbolic_opset9.native_layer_norm).
        mean = self.op(scope, "ReduceMean", [x], axes=[-1], keepdims=1)
        centred = self.op(scope, "Sub", [x, mean])
        square = self.op(scope, "Pow", [centred, self.constant(scope, np.array(2.0, np.float32))])
        var = self.op(scope, "ReduceMean", [square], axes=[-1], keepdims=1)
        std = self.op(scope, "Sqrt", [self.op(scope, "Add", [var, self.constant(scope, np.array(eps, np.float32))])])
        normalized = self.op(scope, "Div", [centred, std])
        return self.op(scope, "Add", [self.op(scope, "Mul", [normalized, gamma]), beta])

    def gelu(self, scope: str, x: str) -> str:
        """``nn.GELU()`` as torch.onnx writes it below opset 20."""
        div = self.op(scope, "Div", [x, self.constant(scope, np.array(1.4142135381698608, np.float32))])
        erf = self.op(scope, "Add", [self.op(scope, "Erf", [div]), self.constant(scope, np.array(1.0, np.float32))])
        return self.op(scope, "Mul", [self.op(scope, "Mul", [x, erf]), self.constant(scope, np.array(0.5, np.float32))])

    def reshape(self, scope: str, x: str, shape: tuple[int, ...]) -> str:
        return self.op(scope, "Reshape", [x, self.constant(scope, np.array(shape, np.int64))])

    def model(self, graph_name: str, inputs: list[onnx.ValueInfoProto], outputs: list[tuple[str, str, list[int]]],
              opset: int) -> onnx.ModelProto:
        # The last nodes' outputs take the model's output names, as the exporter does.
        renames = {internal: name for internal, name, _ in outputs}
        for node in self.nodes:
            node.output[:] = [renames.get(o, o) for o in node.output]
            node.input[:] = [renames.get(i, i) for i in node.input]
        graph = helper.make_graph(
            self.nodes, graph_name, inputs,
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for _, name, shape in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8,
                                  producer_name="gemforge.models")
        onnx.checker.check_model(model, full_check=True)
        return model


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")


def _check_heads(dim: int, heads: int) -> None:
    if dim % heads:
        raise ValueError(f"dim must be a multiple of heads, not {dim} with {heads} heads")


def build_vit_tiny(image: int = 32, patch: int = 8, dim: int = 64, heads: int = 2, depth: int = 2, classes: int = 10,
                   batch: int = 1, *, mlp_ratio: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A ViT (timm's ``VisionTransformer``, pre-LN) for ``[batch, 3, image, image]`` float32
    ``input``, giving ``[batch, classes]`` ``logits``; opset 17.

    The patch embedding is a Conv with kernel = stride = ``patch``, reshaped to (N, dim,
    tokens) and transposed to (N, tokens, dim); a class token (a constant (batch, 1, dim): the
    exporter folds ``cls_token.expand(N, -1, -1)`` for a fixed batch) is concatenated in front
    and position embeddings added. Each of ``depth`` blocks is LayerNormalization, the qkv
    MatMul and Add, Reshape to (N, T, 3, heads, d), Transpose to (3, N, heads, T, d), q, k, v
    as Gathers of indices 0, 1, 2 on axis 0, q · kᵀ (a Transpose of k) times 1/√d, Softmax,
    times v, Transpose and Reshape back, the projection and the residual Add; then
    LayerNormalization, MatMul + Add, GELU (Div, Erf, Add, Mul, Mul), MatMul + Add and the
    residual Add. A final LayerNormalization, the class token (Gather of index 0 on axis 1)
    and a Gemm head give the logits.
    """
    _check_sizes(image=image, patch=patch, dim=dim, heads=heads, depth=depth, classes=classes, batch=batch,
                 mlp_ratio=mlp_ratio)
    _check_heads(dim, heads)
    if image % patch:
        raise ValueError(f"image must be a multiple of patch, not {image} with patches of {patch}")
    e = _Exporter(np.random.default_rng(seed))
    grid, d, hidden = image // patch, dim // heads, dim * mlp_ratio
    tokens = grid * grid + 1
    eps = 1e-6                                                            # timm's ViT LayerNorm

    scope = "/patch_embed/proj"
    w = e.param("patch_embed.proj.weight", e.normal((dim, 3, patch, patch), 1 / math.sqrt(3 * patch * patch)))
    b = e.param("patch_embed.proj.bias", e.normal((dim,), 0.1))
    x = e.op(scope, "Conv", ["input", w, b], dilations=[1, 1], group=1, kernel_shape=[patch, patch],
             pads=[0, 0, 0, 0], strides=[patch, patch])
    x = e.reshape("/patch_embed", x, (batch, dim, grid * grid))          # x.flatten(2)
    x = e.op("/patch_embed", "Transpose", [x], perm=[0, 2, 1])           # .transpose(1, 2)
    cls = e.param("onnx::Concat_cls_token", np.broadcast_to(e.normal((1, 1, dim), 1.0), (batch, 1, dim)))
    x = e.op("", "Concat", [cls, x], axis=1)
    x = e.op("", "Add", [x, e.param("pos_embed", e.normal((1, tokens, dim), 0.5))])

    for i in range(depth):
        blk = f"/blocks.{i}"
        h = e.layer_norm(f"{blk}/norm1", x, f"blocks.{i}.norm1", dim, eps, 17)
        attn = f"{blk}/attn"
        qkv = e.linear(f"{attn}/qkv", h, f"blocks.{i}.attn.qkv", dim, 3 * dim)
        qkv = e.reshape(attn, qkv, (batch, tokens, 3, heads, d))
        qkv = e.op(attn, "Transpose", [qkv], perm=[2, 0, 3, 1, 4])
        q, k, v = (e.op(attn, "Gather", [qkv, e.constant(attn, np.array(j, np.int64))], axis=0) for j in range(3))
        scores = e.op(attn, "MatMul", [q, e.op(attn, "Transpose", [k], perm=[0, 1, 3, 2])])
        scores = e.op(attn, "Mul", [scores, e.constant(attn, np.array(d ** -0.5, np.float32))])
        probs = e.op(f"{attn}/softmax", "Softmax", [scores], axis=-1)
        out = e.op(attn, "Transpose", [e.op(attn, "MatMul", [probs, v])], perm=[0, 2, 1, 3])
        out = e.reshape(attn, out, (batch, tokens, dim))
        x = e.op(blk, "Add", [x, e.linear(f"{attn}/proj", out, f"blocks.{i}.attn.proj", dim, dim)])
        h = e.layer_norm(f"{blk}/norm2", x, f"blocks.{i}.norm2", dim, eps, 17)
        mlp = f"{blk}/mlp"
        h = e.gelu(f"{mlp}/act", e.linear(f"{mlp}/fc1", h, f"blocks.{i}.mlp.fc1", dim, hidden))
        x = e.op(blk, "Add", [x, e.linear(f"{mlp}/fc2", h, f"blocks.{i}.mlp.fc2", hidden, dim)])

    x = e.layer_norm("/norm", x, "norm", dim, eps, 17)
    x = e.op("", "Gather", [x, e.constant("", np.array(0, np.int64))], axis=1)     # x[:, 0]
    logits = e.gemm("/head", x, "head", dim, classes)
    return e.model("vit_tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image, image])],
                   [(logits, "logits", [batch, classes])], opset=17)


def build_bert_tiny(seq: int = 16, dim: int = 64, heads: int = 2, depth: int = 2, batch: int = 1, *,
                    mlp_ratio: int = 4, padding: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A BERT encoder (Hugging Face's ``BertModel``, post-LN) for float32 ``embeddings`` of
    shape ``[batch, seq, dim]``, giving ``last_hidden_state`` ``[batch, seq, dim]`` and
    ``pooler_output`` ``[batch, dim]``; opset 14, so each LayerNorm is written out in
    ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul and Add.

    The input is the sum of the word, position and token-type embeddings: gemforge's model
    inputs are float32 tensors, so the token ids and the embedding lookup (a Gather of an
    integer input) are out of scope; the embeddings' LayerNorm is in. The attention mask is a
    constant additive (batch, 1, 1, seq) tensor, 0 on the tokens and −10000 on the last
    ``padding`` positions (what ``get_extended_attention_mask`` makes of a 0/1 mask).

    Each of ``depth`` blocks: query, key and value MatMul + Add, each Reshaped to (N, seq,
    heads, d) and Transposed to (N, heads, seq, d) (the key straight to (N, heads, d, seq)),
    q · kᵀ divided by √d, plus the mask, Softmax, times v, Transpose and Reshape back, the
    output MatMul + Add, the residual Add and LayerNorm; then MatMul + Add, GELU (Div, Erf, Add,
    Mul, Mul), MatMul + Add, the residual Add and LayerNorm. The pooler takes token 0 (Gather
    of index 0 on axis 1), a MatMul + Add and Tanh.
    """
    _check_sizes(seq=seq, dim=dim, heads=heads, depth=depth, batch=batch, mlp_ratio=mlp_ratio)
    _check_heads(dim, heads)
    if not isinstance(padding, int) or not 0 <= padding < seq:
        raise ValueError(f"padding must be an integer from 0 to seq - 1 = {seq - 1}, not {padding!r}")
    e = _Exporter(np.random.default_rng(seed))
    d, hidden, eps, opset = dim // heads, dim * mlp_ratio, 1e-12, 14     # BERT's LayerNorm epsilon

    mask = np.zeros((batch, 1, 1, seq), np.float32)
    mask[..., seq - padding:] = -10000.0
    mask = e.param("onnx::Add_extended_attention_mask", mask)
    x = e.layer_norm("/embeddings/LayerNorm", "embeddings", "embeddings.LayerNorm", dim, eps, opset)

    def heads_first(scope: str, t: str, perm: list[int]) -> str:
        return e.op(scope, "Transpose", [e.reshape(scope, t, (batch, seq, heads, d))], perm=perm)

    for i in range(depth):
        layer, name = f"/encoder/layer.{i}", f"encoder.layer.{i}"
        attn = f"{layer}/attention/self"
        q = heads_first(attn, e.linear(f"{attn}/query", x, f"{name}.attention.self.query", dim, dim), [0, 2, 1, 3])
        # key.permute(0, 2, 1, 3).transpose(-1, -2): the exporter's peephole merges the two.
        k = heads_first(attn, e.linear(f"{attn}/key", x, f"{name}.attention.self.key", dim, dim), [0, 2, 3, 1])
        v = heads_first(attn, e.linear(f"{attn}/value", x, f"{name}.attention.self.value", dim, dim), [0, 2, 1, 3])
        scores = e.op(attn, "Div", [e.op(attn, "MatMul", [q, k]), e.constant(attn, np.array(math.sqrt(d), np.float32))])
        probs = e.op(attn, "Softmax", [e.op(attn, "Add", [scores, mask])], axis=-1)
        context = e.op(attn, "Transpose", [e.op(attn, "MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = e.reshape(attn, context, (batch, seq, dim))
        out = f"{layer}/attention/output"
        h = e.linear(f"{out}/dense", context, f"{name}.attention.output.dense", dim, dim)
        x = e.layer_norm(f"{out}/LayerNorm", e.op(out, "Add", [h, x]), f"{name}.attention.output.LayerNorm", dim, eps,
                         opset)
        h = e.gelu(f"{layer}/intermediate/intermediate_act_fn",
                   e.linear(f"{layer}/intermediate/dense", x, f"{name}.intermediate.dense", dim, hidden))
        out = f"{layer}/output"
        h = e.linear(f"{out}/dense", h, f"{name}.output.dense", hidden, dim)
        x = e.layer_norm(f"{out}/LayerNorm", e.op(out, "Add", [h, x]), f"{name}.output.LayerNorm", dim, eps, opset)

    first = e.op("/pooler", "Gather", [x, e.constant("/pooler", np.array(0, np.int64))], axis=1)
    pooled = e.op("/pooler/activation", "Tanh", [e.linear("/pooler/dense", first, "pooler.dense", dim, dim)])
    return e.model("bert_tiny", [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, [batch, seq, dim])],
                   [(x, "last_hidden_state", [batch, seq, dim]), (pooled, "pooler_output", [batch, dim])],
                   opset=opset)
