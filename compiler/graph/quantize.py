"""int8 quantization with power-of-two scales, calibrated on sample inputs.

Every int8 tensor ``q`` stands for ``q · 2**-e`` (per tensor, activations and
weights alike), so requantizing from one scale to another is a shift — the
accelerator's ``>>`` in its epilogue — and nothing needs a multiplier:

- activations: ``e`` is the largest exponent at which the calibration maximum
  ``|x|`` still fits 127 (``calibrate`` runs the float network on the samples);
- a convolution or dense layer with input ``e_x`` and weights ``e_w``
  accumulates at ``e_x + e_w`` in int32; its bias is quantized there, plus the
  rounding term ``2**(s−1)``, and ``s = e_x + e_w − e_y`` (0–31) brings the sum to
  the output's exponent: ``clip((acc + bias) >> s, lo, 127)``, ``lo = 0`` with ReLU; constant
  weights take a coarser ``e_w`` where the sum's exact worst case over every int8 input
  (Σ|w|·128 + |bias| per channel) would otherwise overflow int32 (a very long dot product, a
  bias large next to its weights);
- an add (or a subtraction) shifts its operands left to the finer of their two scales, adds
  (subtracts), and shifts right with rounding into its output's (a residual add with its ReLU
  is one pass); an operand more than 2^MAX_LSHIFT finer than the other is first requantized
  (a constant: quantized) to 2^MAX_LSHIFT finer; a multiply's product has exponent ``e_x + e_y``;
- pooling, ReLU, clip, reshapes, transposes, slices and pads keep their input's scale (a pad whose
  value is off that grid runs in float32), except an average pool whose output range is narrower
  (a global pool's): it comes out up to 6 bits finer (``lshift``, the mean of the shifted input,
  exact in int32); a concat takes the coarsest of its inputs' scales
  (the others are requantized to it); a tensor only clips read is calibrated on what the
  clips let through (a ReLU6's 6, not the 900 its producer reaches);
- the operators of `FLOAT_ONLY` (softmax, a mean, division, an element-wise max or min,
  sigmoid, tanh and the other float functions) run in float32 on their dequantized inputs, and so does an average pool whose
  output range is more than 6 bits narrower than its input's; so do the adds, products, ReLUs
  and moves of their results (``OpDef.float_propagating``: a layer norm stays float32 to its end).
  The nodes reading float32 results where an int8 tensor is needed quantize them. The network quantizes its inputs at entry and dequantizes its
  outputs at exit, so it takes and returns float32 like the ONNX model (an output already
  in float32 — an input returned as it is, or a copy of it, a softmax's — leaves exactly as
  it is).
"""

from __future__ import annotations

import math

import numpy as np

from .evaluate import evaluate
from .ir import Graph, GraphError, Node, Value
from .numeric import quantize_array
from .operators import FLOAT_ONLY, Int8, OpDef, op_def
from .operators.pooling import MAX_AVERAGE_LSHIFT

__all__ = ["calibrate", "quantize", "exponent_for", "MAX_LSHIFT", "FLOAT_ONLY"]

#: Largest left shift of an add operand: 127 · 2**23, twice, still fits int32.
MAX_LSHIFT = 23
_EXPONENT_RANGE = (-24, 30)


def exponent_for(max_abs: float, what: str = "a tensor") -> int:
    """The largest ``e`` with ``max_abs · 2**e ≤ 127`` (0 for an all-zero tensor), within
    `_EXPONENT_RANGE`. A range too small for the finest scale rounds to zero, an error below
    the tensor's own magnitude; one too large for the coarsest would saturate and is refused."""
    if not np.isfinite(max_abs):
        raise GraphError("calibration produced a non-finite value; check the model and the samples")
    if max_abs <= 0:
        return 0
    e = math.floor(math.log2(127.0 / max_abs))
    if e < _EXPONENT_RANGE[0]:
        raise GraphError(f"{what} reaches {max_abs:.3g}, beyond the ±{127 * 2.0 ** -_EXPONENT_RANGE[0]:.3g} int8 "
                         f"represents at its coarsest scale 2^{-_EXPONENT_RANGE[0]}; scale the model's values down")
    return int(min(e, _EXPONENT_RANGE[1]))


def _on_grid(value: float, exponent: int) -> bool:
    """Whether int8 at scale 2^-exponent holds ``value`` exactly."""
    q = value * 2.0 ** exponent
    return bool(np.isfinite(q)) and q == round(q) and -128 <= q <= 127


def calibrate(graph: Graph, samples: dict[str, np.ndarray]) -> dict[str, float]:
    """The largest ``|value|`` of every tensor over the samples (each input's samples
    stacked on a new first axis), from the float network in numpy."""
    if not isinstance(samples, dict):
        raise GraphError(f"calibration samples are a dict of arrays by input name, not {type(samples).__name__}")
    for name, stack in samples.items():
        if np.ndim(stack) == 0:
            raise GraphError(f"calibration samples of input {name!r} must be stacked on a new first axis (an array "
                             f"of rank ≥ 1), not {type(stack).__name__} {stack!r}"[:200])
    counts = {name: len(samples[name]) for name in graph.inputs if name in samples}
    unknown = sorted(set(samples) - set(graph.inputs))
    if unknown:
        raise GraphError(f"calibration samples for unknown input(s) {', '.join(unknown)}; the model takes "
                         f"{', '.join(graph.inputs)}")
    missing = [name for name in graph.inputs if name not in samples]
    if missing:
        raise GraphError(f"calibration samples are missing for input(s) {', '.join(missing)}")
    if len(set(counts.values())) != 1 or not min(counts.values()):
        raise GraphError(f"every input needs the same, positive number of calibration samples; got {counts}")
    for name in graph.inputs:
        kind = np.asarray(samples[name][:1]).dtype
        if kind.kind not in "fiu":
            raise GraphError(f"calibration samples of input {name!r} must be numeric (float or integer), "
                             f"not {kind}")
    peaks: dict[str, float] = {}
    for i in range(next(iter(counts.values()))):
        inputs = {}
        for name in graph.inputs:
            try:
                with np.errstate(over="ignore"):    # beyond float32's range: inf, refused below
                    sample = np.asarray(samples[name][i], dtype=np.float32)
            except (TypeError, ValueError):
                raise GraphError(f"calibration samples of input {name!r} must be numeric, not "
                                 f"{np.asarray(samples[name]).dtype}") from None
            if not np.isfinite(sample).all():
                raise GraphError(f"calibration sample {i} of input {name!r} holds NaN or infinite values (or values "
                                 "beyond float32's range)")
            if sample.shape != graph.values[name].shape:
                raise GraphError(f"calibration sample {i} of input {name!r} has shape {list(sample.shape)}; "
                                 f"the model takes {list(graph.values[name].shape)} (samples are stacked on a "
                                 "new first axis)")
            inputs[name] = sample
        with np.errstate(over="ignore", invalid="ignore"):   # an overflow is refused by name below
            values = evaluate(graph, inputs, keep=True)
        for name, array in values.items():
            if name not in graph.constants:
                peak = float(np.max(np.abs(array))) if array.size else 0.0
                if not np.isfinite(peak):
                    raise GraphError(f"calibration sample {i} makes tensor {name!r} overflow float32 (NaN or "
                                     "infinite values); the model cannot be calibrated on it")
                peaks[name] = max(peaks.get(name, 0.0), peak)
    # An all-zero input gives no range to scale by: every tensor it feeds would take the finest
    # scale, and any real input would saturate it (results silently wrong, not just imprecise).
    silent = [name for name in graph.inputs if peaks.get(name, 0.0) == 0.0 and graph.values[name].shape
              and math.prod(graph.values[name].shape)]
    if silent:
        raise GraphError(f"the calibration samples of input(s) {', '.join(map(repr, silent))} are 0 everywhere; "
                         "int8 scales come from the range the samples reach, so give inputs like the ones the "
                         "network will see")
    return peaks


def _quantized_constant(graph: Graph, name: str, at_most: int | None = None) -> tuple[str, int]:
    """Constant ``name`` in int8 at its own scale, or at the coarser ``2^-at_most`` when given."""
    array = graph.constants[name]
    e = exponent_for(float(np.max(np.abs(array))) if array.size else 0.0, f"constant {name!r}")
    if at_most is not None:
        e = min(e, at_most)
    return graph.add_constant(f"{name}/q", quantize_array(array, e), e), e


_INT32_MAX = 2 ** 31 - 1


def _accumulator_bound(op: str, w_shape: tuple[int, ...], w_q: np.ndarray | None, bias_q: np.ndarray) -> float:
    """The exact worst case of ``|Σ x·w + bias|`` of a conv2d or dense layer over every int8
    input (``|x| ≤ 128``): ``max over channels of Σ|w_q|·128 + |bias_q|``, the sum over a
    conv's C/groups·kh·kw or a dense layer's K; variable weights (``w_q`` None) count 128
    each. Every partial sum is bounded by it too, in whatever order the products add."""
    if w_q is None:
        per_channel = math.prod(w_shape) / w_shape[0 if op == "conv2d" else 1] * 128.0 * 128.0
    else:
        # Summed as integers (exact) from int16 magnitudes: a float64 copy of a large layer's
        # weights cost seconds of page faults.
        magnitude = np.abs(w_q, dtype=np.int16)
        per_channel = magnitude.reshape(len(magnitude), -1).sum(axis=1, dtype=np.int64) if op == "conv2d" \
            else magnitude.sum(axis=0, dtype=np.int64)
        per_channel = per_channel * 128.0
    return float(np.max(per_channel + np.abs(bias_q), initial=0.0))


def _ranges_through_clips(graph: Graph, peaks: dict[str, float]) -> dict[str, float]:
    """``peaks``, but a tensor read only by clips takes the largest of their outputs' peaks: a
    clip keeps its input's scale, so the input must be on the grid of what the clip lets
    through (a hardtanh after a layer reaching 200 would otherwise round ±1 to 0, and a
    Clip(10, 20) of values near 2 would saturate below 10). What the finer grid saturates,
    the clip would have cut anyway. The narrowing follows the readers back through
    operators that keep the scale and commute with saturation (a Flatten or MaxPool between
    a convolution and its clip), so the convolution itself writes on the clip's grid."""
    narrowed = dict(peaks)
    consumers = graph.consumers()
    limited: set[str] = set()        # tensors every path from which reaches a clip through safe ops
    for node in reversed(graph.nodes):
        for name in dict.fromkeys(node.inputs):
            users = consumers.get(name, [])
            if name in limited or name not in peaks or name in graph.outputs or not users:
                continue
            # Through operators that keep the scale and commute with saturation (``OpDef.saturation_safe``).
            if all(u.op == "clip" or (op_def(u).saturation_safe and u.output in limited) for u in users):
                narrowed[name] = max(narrowed.get(u.output, 0.0) for u in users)
                limited.add(name)
    return narrowed


def quantize(graph: Graph, peaks: dict[str, float]) -> Graph:
    """Rewrite the float graph (after fusion) into its int8 network, using calibration ``peaks``."""
    return _Int8Rewrite(graph, _ranges_through_clips(graph, peaks)).run()


class _Int8Rewrite:
    """One float graph's rewrite into its int8 network: each node takes its operator's int8
    form (`Int8`) or stays in float32, its operands quantized or dequantized on first use."""

    def __init__(self, graph: Graph, peaks: dict[str, float]):
        self.graph, self.peaks = graph, peaks
        self.new_nodes: list[Node] = []
        self.coarser: list[dict] = []         # layers whose weights went coarser than their range, so int32 holds
        self.exponent: dict[str, int] = {}    # int8 tensors of the new graph → their exponents
        self.rename: dict[str, str] = {}      # float tensor → its int8 version
        self.dequantized: dict[str, str] = {}  # float tensor → its int8 version dequantized to float32
        # Tensors of the float graph that the int8 graph still holds in float32 under their own
        # names: the inputs and what the float path computes (and identity copies of those). An
        # output among them leaves as it is, exactly, with no second writer.
        self.floating: set[str] = set(graph.inputs)
        self.forms = {Int8.PRODUCT: self._product, Int8.SHIFTED: self._shifted, Int8.COARSEST: self._coarsest,
                      Int8.SAME_SCALE: self._same_scale}

    def run(self) -> Graph:
        graph = self.graph
        for node in graph.nodes:
            definition = op_def(node)
            if self._stays_float(node, definition):
                # A softmax, a mean, a division or a float function runs in float32, and so does a pad
                # whose value int8 cannot hold at its input's scale. So does an average pool or a clip
                # whose range is narrower than its input's (a global pool's; a clip of a tensor that
                # other nodes read at a wider range): kept at its input's coarse scale, a 15×15 pool's
                # int8 output was 19 % off and a Clip(0, 0.1) of a tensor reaching 20 was all zeros;
                # computed from the dequantized input, it is quantized at its own scale where it is read.
                self.new_nodes.append(Node(node.op, node.name, [self.float_input(i) for i in node.inputs],
                                           node.output, dict(node.attrs)))
                self.floating.add(node.output)
                continue
            if node.op == "identity" and node.inputs[0] in self.floating:
                # A copy of a float32 tensor under an output's name copies it in float32: through
                # int8 it would come back rounded and saturated at the calibrated range.
                self.new_nodes.append(Node(node.op, node.name, list(node.inputs), node.output, dict(node.attrs)))
                self.floating.add(node.output)
                continue
            if definition.int8 not in self.forms:
                raise GraphError(f"node {node.name}: {node.op} has no int8 form")
            q, e = self.forms[definition.int8](node, definition)
            self.exponent[q] = e
            self.rename[node.output] = q
        # The outputs leave as float32 under their ONNX names: the int8 ones dequantized, the float
        # ones (an input returned as it is, a softmax's) as they are.
        for out in graph.outputs:
            if out in self.rename and out not in self.floating:
                self.new_nodes.append(Node("dequantize", f"{out}/dequantize", [self.rename[out]], out,
                                           {"exponent": self.exponent[self.rename[out]]}))
        graph.nodes = self.new_nodes
        for name, e in self.exponent.items():
            graph.values[name].exponent = e
        graph.notes.quantized = "int8"
        if self.coarser:
            graph.notes.coarser_weights = self.coarser
        graph.prune()
        return graph

    # ------------------------------------------------------------------ tensors

    def calibrated(self, name: str) -> int:
        """The exponent tensor ``name``'s calibrated range gives."""
        return exponent_for(self.peaks.get(name, 0.0), f"tensor {name!r}")

    def add_value(self, base: str, shape, dtype: str, e: int | None) -> str:
        name = self.graph.fresh_name(base)
        self.graph.values[name] = Value(name, shape, dtype, e)
        return name

    def int8_input(self, name: str) -> str:
        """The int8 version of tensor ``name`` (quantizing a float one on first use)."""
        if name in self.rename:
            return self.rename[name]
        if self.graph.is_constant(name):
            q, e = _quantized_constant(self.graph, name)
        else:
            e = self.calibrated(name)
            q = self.add_value(f"{name}/q", self.graph.values[name].shape, "int8", e)
            self.new_nodes.append(Node("quantize", f"{name}/quantize", [name], q, {"exponent": e}))
        self.exponent[q] = e
        self.rename[name] = q
        return q

    def float_input(self, name: str) -> str:
        """Tensor ``name`` in float32: as it is (a graph input, a constant, a float-path result), or
        its int8 version dequantized (once)."""
        if name not in self.rename or self.graph.is_constant(name):
            return name
        if name not in self.dequantized:
            q = self.rename[name]
            f = self.dequantized[name] = self.add_value(f"{name}/float", self.graph.values[name].shape, "float32",
                                                        None)
            self.new_nodes.append(Node("dequantize", f"{name}/dequantize", [q], f, {"exponent": self.exponent[q]}))
        return self.dequantized[name]

    def requantized(self, p: str, e: int) -> str:
        """int8 tensor ``p`` at the coarser exponent ``e``."""
        r = self.add_value(f"{p}/requant", self.graph.values[p].shape, "int8", e)
        # Any shift from 9 on rounds every int8 value to 0; 15 keeps the int32 kernel exact.
        self.new_nodes.append(Node("requantize", f"{p}/requantize", [p], r, {"shift": min(self.exponent[p] - e, 15)}))
        self.exponent[r] = e
        return r

    def output_exponent(self, name: str, accumulated: int) -> tuple[int, int]:
        """(shift, exponent) of an output calibrated at ``peaks[name]`` from ``accumulated``."""
        shift = min(max(accumulated - self.calibrated(name), 0), 31)
        return shift, accumulated - shift

    def _emit(self, node: Node, inputs: list[str], e: int, attrs: dict) -> tuple[str, int]:
        """``node`` in int8 on ``inputs``, its output at exponent ``e``."""
        q = self.add_value(f"{node.output}/q", self.graph.values[node.output].shape, "int8", e)
        self.new_nodes.append(Node(node.op, node.name, inputs, q, attrs))
        return q, e

    # ------------------------------------------------------------------ which form

    def _stays_float(self, node: Node, definition: OpDef) -> bool:
        """Whether ``node`` runs in float32 in the int8 network."""
        graph, op, out = self.graph, node.op, node.output
        finer = definition.float_when_narrower and (
            node.inputs[0] not in self.rename or self.calibrated(out) > self.exponent[self.rename[node.inputs[0]]]
            + (MAX_AVERAGE_LSHIFT if op == "avg_pool" else 0))
        # A concatenation the model returns, of parts calibrated at different scales, is joined in
        # float32: at its coarsest part's scale a detector's class probabilities beside its box
        # coordinates (up to 128 pixels) all came out 0 or 1.
        mixed_output = op == "concat" and out in graph.outputs and len(
            {self.calibrated(i) for i in node.inputs if not graph.is_constant(i)}) > 1
        # A pad keeps its input's scale where its value lies on that grid (zero always does).
        off_grid = op == "pad" and (node.inputs[0] not in self.rename
                                    or not _on_grid(node.attrs["value"], self.exponent[self.rename[node.inputs[0]]]))
        # An element-wise or layout operator one of whose variable operands is a float-path result
        # (a mean, a softmax, a float function's) stays in float32, its int8 operands dequantized:
        # the CPU runs it either way, and quantizing the result first only to add to it lost what
        # lies below its grid (a layer norm's variance plus its epsilon, 1e-5, rounded to 0, so a
        # row of equal values came out 0/0 = NaN where ONNX Runtime gives 0; and x − mean, squared
        # in int8, gave a narrow row a variance of 0 and an output tens of times too large).
        variable = [i for i in node.inputs if not graph.is_constant(i)]
        stays_float = definition.float_propagating and any(i in self.floating and i not in graph.inputs
                                                           for i in variable)
        return definition.int8 == Int8.FLOAT or finer or off_grid or stays_float or mixed_output

    # ------------------------------------------------------------------ the int8 forms

    def _product(self, node: Node, definition: OpDef) -> tuple[str, int]:
        """A conv2d or dense layer: int32 sums of int8 products, a bias at their scale, a shift."""
        graph, op, out = self.graph, node.op, node.output
        x = self.int8_input(node.inputs[0])
        channels = graph.values[node.inputs[1]].shape[0 if op == "conv2d" else 1]
        bias = np.zeros(channels, np.float64)
        if len(node.inputs) > 2:
            bias = graph.constants[node.inputs[2]].astype(np.float64)

        def at(ew: int, w_q: np.ndarray | None):
            # (shift, exponent, bias_q, worst |acc + bias|) with weights at 2^-ew (w_q: constant
            # weights; None: variable ones, anywhere in int8)
            acc = self.exponent[x] + ew
            shift, e = self.output_exponent(out, acc)
            bias_q = np.rint(bias * 2.0 ** acc) + (1 << (shift - 1) if shift else 0)
            return shift, e, bias_q, _accumulator_bound(op, graph.values[node.inputs[1]].shape, w_q, bias_q)

        if graph.is_constant(node.inputs[1]):
            # Weights as fine as their range allows, unless the int32 sum could then overflow
            # (a long dot product at the top of the range, a bias large next to the weights):
            # then one exponent coarser at a time until its exact worst case fits.
            weights = graph.constants[node.inputs[1]]
            ew = finest = exponent_for(float(np.max(np.abs(weights))) if weights.size else 0.0,
                                       f"constant {node.inputs[1]!r}")
            while True:
                w_q = quantize_array(weights, ew)
                shift, e, bias_q, bound = at(ew, w_q)
                if bound <= _INT32_MAX:
                    break
                if weights.any() and not w_q.any():
                    raise GraphError(f"node {node.name} ({op}): its int32 accumulator could reach "
                                     f"{bound:.4g} (beyond 2^31 − 1) at every scale where its weights do "
                                     "not all round to zero")
                ew -= 1
            if ew < finest:
                # Reported (compile prints it, the summary keeps it): the layer gave up
                # weight precision, which its range alone would not have cost.
                self.coarser.append({"node": node.name, "op": op, "bits": finest - ew, "exponent": ew,
                                     "worst_case": bound})
            w = graph.add_constant(f"{node.inputs[1]}/q", w_q, ew)
        else:
            w = self.int8_input(node.inputs[1])
            ew = self.exponent[w]
            shift, e, bias_q, bound = at(ew, None)
            if bound > _INT32_MAX:
                raise GraphError(f"node {node.name} ({op}): its int32 accumulator could reach {bound:.4g} "
                                 "(beyond 2^31 − 1) with its variable weights and bias at scale "
                                 f"2^-{self.exponent[x] + ew}")
        acc = self.exponent[x] + ew
        self.exponent[w] = ew
        b = graph.add_constant(f"{node.name}/bias_q", bias_q.astype(np.int32), acc)
        return self._emit(node, [x, w, b], e, dict(node.attrs, shift=shift))

    def _shifted(self, node: Node, definition: OpDef) -> tuple[str, int]:
        """An add or subtraction (operands shifted to the finer scale) or a product (exponents add)."""
        op = node.op
        constant = [self.graph.is_constant(i) for i in node.inputs]
        if op != "mul" and constant.count(True) == 1:
            # A constant far finer than the tensor it is added to (a bias of 1e-7) is
            # quantized no finer than the int32 sum can align: what it loses is below the
            # tensor's own resolution.
            t = self.int8_input(node.inputs[constant.index(False)])
            c, ec = _quantized_constant(self.graph, node.inputs[constant.index(True)], self.exponent[t] + MAX_LSHIFT)
            self.exponent[c] = ec
            x, y = (c, t) if constant[0] else (t, c)
        else:
            x, y = self.int8_input(node.inputs[0]), self.int8_input(node.inputs[1])
            if op != "mul" and abs(self.exponent[x] - self.exponent[y]) > MAX_LSHIFT:
                # So is a tensor far finer than the one it is added to (a residual branch
                # with a layer scale of 1e-7): requantized first, it loses what lies below
                # 2^-MAX_LSHIFT of the other's step.
                if self.exponent[x] > self.exponent[y]:
                    x = self.requantized(x, self.exponent[y] + MAX_LSHIFT)
                else:
                    y = self.requantized(y, self.exponent[x] + MAX_LSHIFT)
        ex, ey = self.exponent[x], self.exponent[y]
        if op != "mul":
            acc = max(ex, ey)
            lshift = (acc - ex, acc - ey)
            assert max(lshift) <= MAX_LSHIFT, (node.name, lshift)
        else:
            acc, lshift = ex + ey, (0, 0)
        shift, e = self.output_exponent(node.output, acc)
        return self._emit(node, [x, y], e, dict(node.attrs, lshift=lshift, shift=shift))

    def _coarsest(self, node: Node, definition: OpDef) -> tuple[str, int]:
        """A concat: every part at the coarsest part's scale."""
        parts = [self.int8_input(i) for i in node.inputs]
        e = min(self.exponent[p] for p in parts)
        aligned = [self.requantized(p, e) if self.exponent[p] != e else p for p in parts]
        return self._emit(node, aligned, e, dict(node.attrs))

    def _same_scale(self, node: Node, definition: OpDef) -> tuple[str, int]:
        """Pooling, ReLU, clip, moves: the input's scale (a clip's bounds, a pad's value on its grid).
        An average whose range is narrower than its input's (a global pool's) comes out at its
        own finer scale, up to `MAX_AVERAGE_LSHIFT` bits (``lshift``: the mean of ``x << lshift``,
        exact in int32); beyond that it ran in float32 (`_stays_float`)."""
        x = self.int8_input(node.inputs[0])
        attrs = dict(node.attrs)
        if definition.on_grid is not None:
            attrs = definition.on_grid(attrs, self.exponent[x])
        e = self.exponent[x]
        if node.op == "avg_pool" and self.calibrated(node.output) > e:
            attrs["lshift"] = self.calibrated(node.output) - e
            e += attrs["lshift"]
        return self._emit(node, [x], e, attrs)
