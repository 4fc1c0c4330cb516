"""The ONNX front end: an ONNX model (opset 13 and newer; opsets 7 to 12, as older
exporters write them, are first upgraded to 13 by onnx's version converter) → a `Graph`.

Every ONNX node becomes one graph node, or a few (HardSigmoid, HardSwish, a
Gemm, the variadic Sum, Mean, Max and Min), or a rename (``Identity``,
inference-mode ``Dropout``), or a constant (``Constant``, any node of constants
only, and the shape computations Shape, Gather, Slice, Cast, ConstantOfShape),
or a `GraphError` that names the node, its op type and what is supported:
nothing is silently dropped. Attributes are checked here, where the ONNX names
are known; shapes are left to the `infer_shapes` pass (a Shape node infers its
input's on a copy).
"""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper, version_converter

from .evaluate import evaluate_node
from .ir import MAX_DIM, MAX_ELEMENTS, MAX_RANK, Graph, GraphError, Node, Value
from .passes import infer_shapes, output_shape

__all__ = ["SUPPORTED_OPS", "operator_list", "MIN_OPSET", "OLDEST_OPSET", "load_onnx", "import_onnx", "model_digest"]

#: The operator set the importer reads; a model of an older one is upgraded to it on import.
MIN_OPSET = 13
#: The oldest operator set upgraded (older ones predate the operators' current forms:
#: BatchNormalization's is_test, Dropout's is_test, consumed_inputs).
OLDEST_OPSET = 7
#: The longest name (UTF-8 bytes) of a zip member: a 16-bit length field.
_MAX_MEMBER_NAME = 0xFFFF

_ONNX_DTYPES = {onnx.TensorProto.FLOAT: "float32"}
#: The input positions of each operator that may be omitted (given an empty name).
_OPTIONAL_INPUTS = {"Conv": (2,), "Gemm": (2,), "Clip": (1, 2), "Dropout": (1, 2), "Squeeze": (1,), "Resize": (1, 2, 3),
                    "ReduceMean": (1,), "ReduceSum": (1,), "ReduceSumSquare": (1,), "ReduceL2": (1,),
                    "ReduceMax": (1,), "ReduceMin": (1,), "Pad": (2, 3), "LayerNormalization": (2,), "Split": (1,)}
#: Floating-point element types other than float32 (refused in constants: see `check_float32`).
_OTHER_FLOATS = {onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16,
                 *(getattr(onnx.TensorProto, t) for t in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                                          "FLOAT8E5M2FNUZ", "FLOAT4E2M1")
                   if hasattr(onnx.TensorProto, t))}


def load_onnx(source) -> onnx.ModelProto:
    """An ONNX model from a path, bytes or a `ModelProto`, checked by onnx's checker."""
    return _load_checked(source)[0]


def _load_checked(source) -> tuple[onnx.ModelProto, str]:
    """`load_onnx`'s model and its `model_digest`. A model in memory is serialized once, for
    both the checker and the digest (each took seconds on a VGG's 575 MB of weights)."""
    if isinstance(source, (onnx.ModelProto, bytes, bytearray)):
        model = source if isinstance(source, onnx.ModelProto) else _parse(bytes(source), "the model")
        try:
            serialized = model.SerializeToString(deterministic=True)
        except Exception as exc:   # protobuf's EncodeError (a message it cannot encode, or too large)
            raise GraphError(f"the ONNX model is invalid: it cannot be serialized ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from None
        _check(serialized)
        return model, hashlib.sha256(serialized).hexdigest()
    # From a path, so that tensors stored as external data next to it resolve.
    path = Path(source)
    if not path.exists():
        raise GraphError(f"cannot read model {source}: no such file")
    if not path.is_file():
        raise GraphError(f"cannot read model {source}: it is a directory or device, not a file")
    if path.stat().st_size == 0:
        raise GraphError(f"model {source} is an empty file, not an ONNX model")
    try:
        model = onnx.load(str(path))
    except OSError as exc:
        raise GraphError(f"cannot read model {source}: {exc.strerror or exc}") from None
    except Exception as exc:  # protobuf's DecodeError, onnx's own (external data among them)
        # onnx.load checks external-data locations (and only those) with the checker's error.
        external = isinstance(exc, onnx.checker.ValidationError) or "external" in str(exc).lower()
        what = "its external data cannot be read" if external else "it is not an ONNX file"
        raise GraphError(f"cannot read model {source}: {what} ({type(exc).__name__}: {exc})") from None
    _check(str(path))
    return model, model_digest(model)


def _check(model: str | bytes) -> None:
    """onnx's checker on a model's path or serialized bytes."""
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise GraphError(f"the ONNX model is invalid: {first}") from None


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    try:
        return onnx.load_from_string(data)
    except Exception as exc:  # protobuf raises its own DecodeError
        raise GraphError(f"{what} is not an ONNX file ({type(exc).__name__}: {exc})") from None


def model_digest(model: onnx.ModelProto) -> str:
    """SHA-256 of the model's serialized bytes (recorded in compiled artefacts)."""
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def _densify(sparse: onnx.SparseTensorProto, what: str) -> np.ndarray:
    """The dense array of a sparse tensor: ``values`` at ``indices``, zero elsewhere. ONNX's
    indices are [NNZ] linear positions or [NNZ, rank] coordinates, both int64."""
    _Importer.check_float32(sparse.values, what)
    dims = tuple(int(d) for d in sparse.dims)
    if any(d < 0 for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        raise GraphError(f"{what} has dimensions {list(dims)}; they must be non-negative, with at most "
                         f"{MAX_ELEMENTS:,} elements in all")
    try:
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices) if sparse.HasField("indices") else np.zeros(0, np.int64)
    except (ValueError, TypeError, OSError) as exc:
        raise GraphError(f"{what} cannot be read: {exc}") from None
    size = math.prod(dims)
    nnz = values.size
    if values.ndim != 1:
        raise GraphError(f"{what} has values of shape {list(values.shape)}; ONNX's are a 1-D list")
    if indices.dtype.kind not in "iu":
        raise GraphError(f"{what} has {indices.dtype} indices; ONNX's are int64")
    if indices.shape == (nnz,):
        linear = indices.astype(np.int64)
    elif indices.shape == (nnz, len(dims)):
        if nnz and ((indices < 0).any() or (indices >= np.array(dims)).any()):
            raise GraphError(f"{what} has an index outside its dimensions {list(dims)}")
        linear = np.ravel_multi_index(indices.T.astype(np.int64), dims) if nnz else np.zeros(0, np.int64)
    else:
        raise GraphError(f"{what} has indices of shape {list(indices.shape)} for {nnz} values; ONNX takes [{nnz}] "
                         f"linear positions or [{nnz}, {len(dims)}] coordinates")
    if nnz and (linear.min() < 0 or linear.max() >= size):
        raise GraphError(f"{what} has an index outside its {size} elements")
    if len(np.unique(linear)) != nnz:
        raise GraphError(f"{what} gives a position twice")
    dense = np.zeros(size, values.dtype)
    dense[linear] = values
    return dense.reshape(dims)


def _truncating_division(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounded toward zero, as ONNX Runtime divides integers (C++'s ``/``)."""
    quotient = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -quotient, quotient).astype(np.result_type(a, b))


#: Integer arithmetic on constants (shapes and indices) folded at import.
_INTEGER_FOLDS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _truncating_division,
                  "max": np.maximum, "min": np.minimum}


def _dilated(w: np.ndarray, dilations: tuple[int, int]) -> np.ndarray:
    """An (O, I, kh, kw) kernel spread out with dilation − 1 zeros between its taps: exact, at the
    cost of multiplying those zeros (the convolution kernels have no dilation)."""
    if dilations == (1, 1):
        return w
    dh, dw = dilations
    spread = np.zeros(w.shape[:2] + ((w.shape[2] - 1) * dh + 1, (w.shape[3] - 1) * dw + 1), w.dtype)
    spread[:, :, ::dh, ::dw] = w
    return spread


def _conv_window(padding) -> dict:
    """A conv2d node's padding attributes: SAME auto_pad left to `infer_shapes`, one value where
    every side is alike, else (top, left, bottom, right), which the `pad_convolutions` pass
    splits off into a Pad node."""
    if isinstance(padding, str):
        return dict(padding=0, auto_pad=padding)
    return dict(padding=padding[0] if len(set(padding)) == 1 else tuple(padding))


def _fixed(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """A dimension the model fixes: a value, not a name or nothing, and not negative (some
    exporters write -1 for a dimension they leave open, the batch above all)."""
    return dim.HasField("dim_value") and dim.dim_value >= 0


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}



def reads(note: str):
    """Mark an ``op_<Type>`` handler with how much of its operator it reads, where that is less
    than all of it; the README's operator list (`operator_list`) gives the note."""
    def mark(handler):
        handler.reads = note
        return handler
    return mark

class _Importer:
    def __init__(self, model: onnx.ModelProto, batch: int, input_shapes: dict[str, tuple[int, ...]]) -> None:
        self.model = model
        self.batch = batch
        # Every tensor name the model uses, so that a name made up here (a Gemm's scaled weight
        # ``y/w``) never takes one a later node writes or an initializer already holds.
        g = model.graph
        self.onnx_names: set[str] = {t.name for t in (*g.initializer, *g.input, *g.output)}
        self.onnx_names.update(t.values.name for t in g.sparse_initializer)
        self.onnx_names.update(o for node in g.node for o in node.output)
        # Tensors something reads: a node, or the model's outputs.
        self.consumed: set[str] = {i for node in g.node for i in node.input if i} | {o.name for o in g.output}
        self.input_shapes = input_shapes
        self.values: dict[str, Value] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.alias: dict[str, str] = {}   # Identity/Dropout outputs → their input
        self.symbolic_batch = False
        self.batched_inputs: list[str] = []      # inputs whose first dimension is the symbolic batch
        self.frozen_inputs: list[str] = []       # graph inputs that are initializers too, compiled as constants
        # inputs whose symbolic first dimension ``input_shapes`` fixes at other than the batch
        self.fixed_first: dict[str, tuple[int, ...]] = {}
        self.node_names: set[str] = set()
        # `_static_shape`'s shapes and types of node outputs, inferred for the first nodes so far.
        self._inferred: dict[str, tuple] = {}
        self._inferred_nodes = 0

    # ------------------------------------------------------------------ helpers

    def fail(self, node: onnx.NodeProto, what: str) -> GraphError:
        return GraphError(f"node {node.name or '(unnamed)'} ({node.op_type}): {what}")

    def check_flags(self, node: onnx.NodeProto, attrs: dict, *flags: str) -> None:
        """Refuse a 0/1 attribute of ``node`` that is neither: ONNX Runtime reads such values
        inconsistently (ReduceMean's keepdims=2 as 0), where int() or bool() here would read 1."""
        for flag in flags:
            if flag in attrs and attrs[flag] not in (0, 1):
                raise self.fail(node, f"{flag} must be 0 or 1, not {attrs[flag]}")

    def name(self, onnx_name: str) -> str:
        return self.alias.get(onnx_name, onnx_name)

    def constant(self, node: onnx.NodeProto, onnx_name: str, what: str) -> np.ndarray:
        name = self.name(onnx_name)
        if name not in self.constants:
            raise self.fail(node, f"{what} must be a constant (an initializer or a Constant node)")
        return self.constants[name]

    @staticmethod
    def check_float32(tensor: onnx.TensorProto, what: str) -> None:
        """A floating-point constant must be float32, the type of every input: ONNX Runtime refuses
        a float16 or double weight beside float32 activations (one type parameter per operator),
        so converting it would compile a model that does not run elsewhere."""
        if tensor.data_type in _OTHER_FLOATS:
            kind = onnx.helper.tensor_dtype_to_string(tensor.data_type).removeprefix("TensorProto.").lower()
            raise GraphError(f"{what} is {kind}; gemforge compiles float32 models (its floating-point "
                             "constants and inputs all float32): convert the model to float32 first")

    def add_constant(self, name: str, array: np.ndarray) -> None:
        if array.dtype.kind not in "fiub":
            raise GraphError(f"constant {name!r} holds {array.dtype} values; gemforge reads float, integer and boolean tensors")
        if array.dtype.kind == "f":
            array = array.astype(np.float32, copy=False)
        self.constants[name] = array
        self.values[name] = Value(name, tuple(array.shape), array.dtype.name)

    def emit(self, op: str, node: onnx.NodeProto, inputs: list[str], output: str | None = None, **attrs) -> str:
        output = output or node.output[0]
        if output in self.values:
            raise self.fail(node, f"output {output!r} is written twice")
        self.values[output] = Value(output)
        # Node names key kernels and layers: a duplicate (ONNX allows them) gets a suffix.
        name, i = node.name or output, 1
        while name in self.node_names:
            name, i = f"{node.name or output}#{i}", i + 1
        self.node_names.add(name)
        new = Node(op, name, [self.name(i) for i in inputs], output, attrs)
        if new.inputs and all(i in self.constants for i in new.inputs):
            # Computed from constants only (a weight scaled by a Mul, a shape from an Add):
            # folded now, so that an operator needing a constant operand accepts it.
            self.add_constant(output, self._fold(node, new))
        else:
            self.nodes.append(new)
        return output

    def _fold(self, onnx_node: onnx.NodeProto, node: Node) -> np.ndarray:
        args = [self.constants[i] for i in node.inputs]
        integer = node.op in _INTEGER_FOLDS and all(a.dtype.kind in "iu" for a in args)
        if not integer and any(a.dtype.kind != "f" for a in args) and node.op not in ("concat", "reshape", "transpose"):
            # Concat, Reshape (Flatten, Squeeze, Unsqueeze) and Transpose only move elements: any
            # type folds (a Reshape's target shape is often a Concat of int64 constants).
            raise self.fail(onnx_node, f"{node.op} of integer constants is not supported")
        values = {i: Value(i, tuple(a.shape), a.dtype.name) for i, a in zip(node.inputs, args)}
        values[node.output] = Value(node.output)
        # Checks (one type, as ONNX Runtime requires of int32 beside int64 too; shapes that
        # broadcast) and resolves attrs.
        output_shape(Graph([], [], [node], values, dict(zip(node.inputs, args))), node)
        if integer:
            # Integer arithmetic on shapes and indices (the evaluator's integer path is int8's).
            if node.op == "div" and not np.all(args[1]):
                raise self.fail(onnx_node, "an integer division by zero")
            value = _INTEGER_FOLDS[node.op](args[0], args[1])
            return np.maximum(value, 0) if node.attrs.get("relu") else value
        return evaluate_node(node, args)

    # ------------------------------------------------------------------ the model

    def check_names(self) -> None:
        """Every tensor name must be one a zip member can hold: constants are stored in the
        .gfm (a zip) and outputs in ``gemforge run``'s .npz, one member per tensor name."""
        graph = self.model.graph
        named = [(t.name, "an initializer") for t in graph.initializer]
        named += [(t.values.name, "a sparse initializer") for t in graph.sparse_initializer]
        named += [(v.name, "a model input") for v in graph.input] + [(v.name, "a model output") for v in graph.output]
        for node in graph.node:
            where = f"node {node.name or '(unnamed)'} ({node.op_type})"
            named += [(t, f"an input of {where}") for t in node.input]
            named += [(t, f"an output of {where}") for t in node.output]
        for name, what in named:
            if "\0" in name:
                raise GraphError(f"tensor {name!r} ({what}) has a NUL character in its name, which a .gfm file "
                                 "(a zip archive) cannot store; rename it")
            if len(f"{name}.npy".encode()) > _MAX_MEMBER_NAME:
                raise GraphError(f"tensor {name[:40]!r}… ({what}) has a name of {len(name.encode()):,} bytes; a .gfm "
                                 f"file (a zip archive) stores names of up to {_MAX_MEMBER_NAME - 4:,}")

    def run(self) -> Graph:
        graph = self.model.graph
        self.check_names()
        for init in graph.initializer:
            self.check_float32(init, f"initializer {init.name!r}")
            try:
                array = numpy_helper.to_array(init)
            except (ValueError, TypeError, OSError) as exc:   # e.g. external data shorter than the tensor
                raise GraphError(f"initializer {init.name!r} cannot be read: {exc}") from None
            self.add_constant(init.name, array)
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            if name in self.constants:
                raise GraphError(f"initializer {name!r} is given twice (dense and sparse)")
            self.add_constant(name, _densify(sparse, f"sparse initializer {name!r}"))
        names = [vi.name for vi in graph.input if vi.name not in self.constants]
        for name in self.input_shapes:
            if name not in names:
                raise GraphError(f"a shape is given for {name!r}, which is not an input of the model (its inputs: "
                                 f"{', '.join(map(repr, names)) or 'none'})")
        inputs = []
        for vi in graph.input:
            if vi.name in self.constants:
                # An initializer listed as an input too (ONNX's overridable initializer, from
                # older exporters) is compiled as the constant it holds.
                self.frozen_inputs.append(vi.name)
                continue
            inputs.append(vi.name)
            self.values[vi.name] = self.graph_input(vi)
        if not inputs:
            raise GraphError("the model has no inputs (every graph input is an initializer)")
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                raise self.fail(node, f"operators of domain {node.domain!r} are not supported; "
                                      f"supported: {', '.join(SUPPORTED_OPS)}")
            handler = getattr(self, f"op_{node.op_type}", None)
            if handler is None:
                raise self.fail(node, f"operator {node.op_type} is not supported; supported: "
                                      f"{', '.join(SUPPORTED_OPS)}")
            for k, i in enumerate(node.input):
                if not i and k not in _OPTIONAL_INPUTS.get(node.op_type, ()):
                    raise self.fail(node, f"input {k} has an empty name, which marks an omitted optional input; "
                                          f"input {k} of {node.op_type} is required")
                if i and self.name(i) not in self.values:
                    raise self.fail(node, f"input {i!r} is not produced by any earlier node")
            handler(node, _attrs(node))
        if not graph.output:
            raise GraphError("the model has no outputs; gemforge compiles what the outputs need")
        outputs = []
        for out in graph.output:
            o = self.name(out.name)
            if o not in self.values:
                raise GraphError(f"model output {out.name!r} is not produced by any node")
            if o in self.constants:
                raise GraphError(f"model output {out.name!r} is a constant; gemforge compiles outputs computed "
                                 "from the inputs")
            if out.name in [o.name for o in graph.output[:len(outputs)]]:
                raise GraphError(f"model output {out.name!r} is listed twice; gemforge returns outputs by name, "
                                 "so each may appear once")
            if o != out.name or o in outputs:
                # An output that Identity/Dropout renamed (or a second output of one tensor)
                # keeps its ONNX name: an explicit copy writes it.
                if out.name in self.values:
                    raise GraphError(f"model output {out.name!r} is also the name of another tensor")
                self.values[out.name] = Value(out.name)
                name = f"{out.name}/identity"
                self.node_names.add(name)
                self.nodes.append(Node("identity", name, [o], out.name, {}))
                o = out.name
            outputs.append(o)
        g = Graph(inputs, outputs, self.nodes, self.values, self.constants)
        g.notes.symbolic_batch = self.symbolic_batch
        g.notes.batched_inputs = self.batched_inputs
        g.notes.frozen_inputs = self.frozen_inputs
        g.prune()
        for node in g.nodes:
            # Every operand an operator reads is a float32 tensor (shapes, axes and bounds
            # became attributes above): an int64 Conv weight or a bool bias would compile
            # and fail only when run.
            for name in node.inputs:
                if name in g.constants and g.constants[name].dtype != np.float32:
                    raise GraphError(f"node {node.name} ({node.op}) reads constant {name!r} of type "
                                     f"{g.constants[name].dtype}; its operands must be float32")
        return g

    def graph_input(self, vi: onnx.ValueInfoProto) -> Value:
        ttype = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or ttype.elem_type not in _ONNX_DTYPES:
            raise GraphError(f"model input {vi.name!r} must be a float32 tensor")
        declared = list(ttype.shape.dim) if ttype.HasField("shape") else None
        if vi.name in self.input_shapes:
            shape = self.given_shape(vi.name, declared)
        else:
            shape = []
            for axis, dim in enumerate(declared or ()):
                if _fixed(dim):
                    shape.append(int(dim.dim_value))     # a fixed 0 is refused below
                elif axis == 0:
                    shape.append(self.batch)      # a symbolic batch: the compiled batch size
                    self.symbolic_batch = True
                    self.batched_inputs.append(vi.name)
                else:
                    open_as = dim.dim_param or (str(dim.dim_value) if dim.HasField("dim_value") else "?")
                    raise GraphError(f"model input {vi.name!r} has a symbolic dimension {axis} "
                                     f"({open_as}); give its shape explicitly (gemforge compile "
                                     f"--input-shape {vi.name}=D1,D2,…; compile_model(input_shapes=…) in Python)")
            shape = tuple(shape)
        if any(d < 1 for d in shape):
            raise GraphError(f"model input {vi.name!r} has a non-positive dimension: {list(shape)}")
        if len(shape) > MAX_RANK:
            raise GraphError(f"model input {vi.name!r} has {len(shape)} axes, more than the {MAX_RANK} gemforge "
                             "compiles (numpy's limit)")
        if max(shape, default=1) > MAX_DIM or math.prod(shape) > MAX_ELEMENTS:
            raise GraphError(f"model input {vi.name!r} has shape {list(shape)}, beyond what gemforge compiles "
                             f"(dimensions up to {MAX_DIM:,} and {MAX_ELEMENTS:,} elements in all)")
        return Value(vi.name, shape, "float32")

    def given_shape(self, name: str, declared) -> tuple[int, ...]:
        """The shape ``input_shapes`` gives input ``name``: as many dimensions as the model
        declares, equal to its fixed ones. A given first dimension equal to the compiled batch,
        where the model's is symbolic, stays the batch (runs take any multiple of it)."""
        given = self.input_shapes[name]
        try:
            shape = tuple(given)
        except TypeError:
            shape = (given,)
        if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in shape):
            raise GraphError(f"the shape given for model input {name!r} must be integers, not {given!r}")
        shape = tuple(int(d) for d in shape)
        if declared is not None:
            if len(shape) != len(declared):
                raise GraphError(f"the shape given for model input {name!r}, {list(shape)}, has {len(shape)} "
                                 f"dimensions; the model's has {len(declared)}")
            for axis, (d, dim) in enumerate(zip(shape, declared)):
                if _fixed(dim) and dim.dim_value != d:
                    raise GraphError(f"the shape given for model input {name!r}, {list(shape)}, has {d} in "
                                     f"dimension {axis}, which the model fixes at {dim.dim_value}")
            if declared and not _fixed(declared[0]):
                if shape[0] == self.batch:
                    self.symbolic_batch = True
                    self.batched_inputs.append(name)
                else:
                    self.fixed_first[name] = shape
        return shape

    # ------------------------------------------------------------------ operators

    def _window(self, node, attrs) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], Any]:
        """A 2-D window's kernel, strides, dilations and padding: (top, left, bottom, right),
        or ``SAME_UPPER``/``SAME_LOWER``, which the input's size resolves (`infer_shapes`)."""
        kernel = list(attrs.get("kernel_shape", []))
        if len(kernel) != 2 or min(kernel) < 1:
            raise self.fail(node, f"2-D windows are supported (NCHW); kernel_shape is {kernel}")
        pairs = []
        for name in ("strides", "dilations"):
            pair = list(attrs.get(name, [1, 1]))
            if len(pair) != 2 or min(pair) < 1:
                raise self.fail(node, f"{name} must be two positive integers, not {pair}")
            pairs.append(tuple(int(v) for v in pair))
        auto = attrs.get("auto_pad", b"NOTSET")
        auto = auto.decode(errors="replace") if isinstance(auto, bytes) else str(auto)
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            padding = auto
        elif auto == "VALID":
            padding = (0, 0, 0, 0)
        elif auto == "NOTSET":
            pads = list(attrs.get("pads", [0, 0, 0, 0]))
            if len(pads) != 4 or min(pads) < 0:
                raise self.fail(node, f"pads must be four integers ≥ 0 (top, left, bottom, right), not {pads}")
            padding = tuple(int(p) for p in pads)
        else:
            raise self.fail(node, f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, not {auto!r}")
        return (int(kernel[0]), int(kernel[1])), pairs[0], pairs[1], padding

    def _lifted(self, node, attrs) -> bool:
        """A 1-D window (an (N, C, L) input: audio, text, signals) run as the 2-D one it is on an
        (N, C, 1, L) input — kernel (1, k), pads and dilations on the width only — and its output
        given back its three axes. False for any other input (the 2-D handler runs)."""
        # Told by the kernel's rank (a 3-D weight, one kernel_shape value), so that 2-D windows
        # never pay for inferring their input's shape here.
        kernel_rank = len(attrs["kernel_shape"]) if "kernel_shape" in attrs else None
        if node.op_type in ("Conv", "ConvTranspose") and self.name(node.input[1]) in self.constants:
            kernel_rank = self.constants[self.name(node.input[1])].ndim - 2
        if kernel_rank != 1:
            return False
        shape = self._static_shape(self.name(node.input[0]))
        if len(shape) != 3:
            raise self.fail(node, f"a 1-D window takes an (N, C, L) input, not shape {list(shape)}")
        lifted = dict(attrs)
        one_d = {"kernel_shape": 1, "strides": 1, "dilations": 1, "output_padding": 1, "pads": 2}
        for name, count in one_d.items():
            if name in attrs:
                values = list(attrs[name])
                if len(values) != count:
                    raise self.fail(node, f"{name} must have {count} value(s) for a 1-D window, not {values}")
        k = list(attrs.get("kernel_shape", []))
        stride = list(attrs.get("strides", [1]))[0]
        lifted["kernel_shape"] = [1, *k] if k else k
        # Over a height of 1 the height's stride is free: the width's keeps the convolution's
        # strides equal; a transposed one must not space that single row.
        lifted["strides"] = [1 if node.op_type == "ConvTranspose" else stride, stride]
        lifted["dilations"] = [1, *list(attrs.get("dilations", [1]))]
        if "output_padding" in attrs:
            lifted["output_padding"] = [0, *list(attrs["output_padding"])]
        if "pads" in attrs:
            begin, end = attrs["pads"]
            lifted["pads"] = [0, begin, 0, end]
        out = node.output[0]
        x = self.emit("reshape", node, [node.input[0]], output=self._fresh(f"{out}/as_2d"),
                      target=(0, shape[1], 1, shape[2]), allowzero=False)
        inputs = [x, *node.input[1:]]
        if node.op_type in ("Conv", "ConvTranspose"):
            w = self.constant(node, node.input[1], "the weight W")
            if w.ndim != 3:
                raise self.fail(node, f"a 1-D {node.op_type} takes 3-D weights, not shape {list(w.shape)}")
            inputs[1] = self._const_like(node, "w_2d", w[:, :, None, :])
            if not k:
                lifted["kernel_shape"] = [1, w.shape[2]]
        y = self._fresh(f"{out}/2d")
        two_d = onnx.helper.make_node(node.op_type, inputs, [y, *node.output[1:]], name=node.name,
                                      domain=node.domain)
        getattr(self, f"op_{node.op_type}")(two_d, lifted)
        result = self._static_shape(y)
        self.emit("reshape", node, [y], output=out, target=(0, result[1], result[3]), allowzero=False)
        return True

    @reads('groups included')
    def op_Conv(self, node, attrs):
        if self._lifted(node, attrs):
            return
        if self.name(node.input[1]) not in self.constants:
            self._variable_weight_conv(node, attrs)
            return
        w = self.constant(node, node.input[1], "the weight W")
        if w.ndim != 4:
            raise self.fail(node, f"2-D convolutions are supported (OIHW weights); W has shape {list(w.shape)}")
        attrs.setdefault("kernel_shape", list(w.shape[2:]))
        kernel, strides, dilations, padding = self._window(node, attrs)
        if tuple(w.shape[2:]) != kernel:
            raise self.fail(node, f"kernel_shape {list(kernel)} disagrees with W's shape {list(w.shape)}")
        weight = node.input[1]
        if dilations != (1, 1):
            weight = self._const_like(node, "w_dilated", _dilated(w, dilations))
        inputs = [node.input[0], weight] + ([node.input[2]] if len(node.input) > 2 and node.input[2] else [])
        if len(inputs) == 3:
            self.constant(node, inputs[2], "the bias B")
        group = int(attrs.get("group", 1))
        if strides[0] != strides[1]:
            self._unequal_strides(node, inputs, strides, dilations, kernel, padding, group)
            return
        self.emit("conv2d", node, inputs, stride=strides[0], groups=group, relu=False, **_conv_window(padding))

    def _variable_weight_conv(self, node, attrs) -> None:
        """A convolution whose weights are computed, or a graph input (the CPU kernel packs them at
        each run; the accelerator's weights are constants): equal strides and no dilation, which
        would need the weights spread out here; a computed bias is added after, per channel."""
        shape = self._static_shape(self.name(node.input[1]))
        if len(shape) != 4:
            raise self.fail(node, f"2-D convolutions are supported (OIHW weights); W has shape {list(shape)}")
        attrs.setdefault("kernel_shape", list(shape[2:]))
        kernel, strides, dilations, padding = self._window(node, attrs)
        if tuple(shape[2:]) != kernel:
            raise self.fail(node, f"kernel_shape {list(kernel)} disagrees with W's shape {list(shape)}")
        if dilations != (1, 1) or strides[0] != strides[1]:
            raise self.fail(node, f"a computed weight W is supported with equal strides and no dilation, not "
                                  f"strides {list(strides)} and dilations {list(dilations)}")
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        inputs = [node.input[0], node.input[1]] + ([bias] if bias and self.name(bias) in self.constants else [])
        out = node.output[0]
        later_bias = bias is not None and len(inputs) == 2
        conv = self.emit("conv2d", node, inputs, output=self._fresh(f"{out}/conv") if later_bias else out,
                         stride=strides[0], groups=int(attrs.get("group", 1)), relu=False, **_conv_window(padding))
        if later_bias:
            column = self.emit("reshape", node, [bias], output=self._fresh(f"{out}/bias_column"),
                               target=(shape[0], 1, 1), allowzero=True)
            self.emit("add", node, [conv, column], relu=False)

    def _unequal_strides(self, node, inputs, strides, dilations, kernel, padding, group) -> None:
        """A convolution whose strides differ along height and width (text recognizers' (2, 1)):
        the convolution at their greatest common divisor, then every (stride / gcd)-th output
        along each axis, which are exactly the outputs of the strided one (floor(floor(L/g) ·
        g/s) = floor(L/s)); the rows between are computed and dropped. SAME padding is worked
        out here for the real strides."""
        out = node.output[0]
        extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        if isinstance(padding, str):
            shape = self._static_shape(self.name(inputs[0]))
            pads = []
            for size, stride, extent in zip(shape[2:], strides, extents):
                total = max((-(-size // stride) - 1) * stride + extent - size, 0)
                pads.append((total // 2, total - total // 2) if padding == "SAME_UPPER" else
                            (total - total // 2, total // 2))
            padding = (pads[0][0], pads[1][0], pads[0][1], pads[1][1])
        common = math.gcd(*strides)
        full = self.emit("conv2d", node, inputs, output=self._fresh(f"{out}/stride{common}"), stride=common,
                         groups=group, relu=False, **_conv_window(padding))
        shape = self._static_shape(full)
        steps = [1, 1, strides[0] // common, strides[1] // common]
        counts = [shape[0], shape[1], -(-shape[2] // steps[2]), -(-shape[3] // steps[3])]
        self._slice(node, full, [0, 0, 0, 0], steps, counts, out)

    @reads('groups, dilations, output_padding; pads given')
    def op_ConvTranspose(self, node, attrs):
        if self._lifted(node, attrs):
            return
        self._conv_transpose(node, attrs)

    def _conv_transpose(self, node, attrs):
        """The transposed convolution as the direct one it equals: the input with stride − 1
        zeros after each pixel along each axis (a pad of a new axis, merged in: exact, and int8
        keeps its scale), framed by dk − 1 − pad rows (cut where negative, output_padding added at
        the end), then a convolution of stride 1 with the kernel flipped and its two channel
        axes swapped within each group (dk: the dilated kernel's extent)."""
        w = self.constant(node, node.input[1], "the weight W")
        if w.ndim != 4:
            raise self.fail(node, f"2-D transposed convolutions are supported (weights C×M/group×kH×kW); W has "
                                  f"shape {list(w.shape)}")
        attrs.setdefault("kernel_shape", list(w.shape[2:]))
        if "output_shape" in attrs:
            raise self.fail(node, "output_shape is not supported; give pads and output_padding")
        kernel, strides, dilations, padding = self._window(node, attrs)
        if isinstance(padding, str):
            raise self.fail(node, f"auto_pad {padding} is not supported; give pads (or VALID)")
        if tuple(w.shape[2:]) != kernel:
            raise self.fail(node, f"kernel_shape {list(kernel)} disagrees with W's shape {list(w.shape)}")
        extra = list(attrs.get("output_padding", [0, 0]))
        if len(extra) != 2 or any(not 0 <= e < max(s, d) for e, s, d in zip(extra, strides, dilations)):
            raise self.fail(node, f"output_padding must be two integers each below its stride or dilation, not {extra}")
        group = int(attrs.get("group", 1))
        x, out = node.input[0], node.output[0]
        shape = self._static_shape(self.name(x))
        if len(shape) != 4 or group < 1 or shape[1] % group or w.shape[0] != shape[1]:
            raise self.fail(node, f"the input {list(shape)} and W {list(w.shape)} need 4 axes and W's first axis "
                                  f"equal to the input's {group} group(s) of channels")
        # The direct convolution's weights: out channel g·M + m, in channel c of group g, taps flipped.
        cin, m = shape[1] // group, w.shape[1]
        direct = w.reshape(group, cin, m, *kernel)[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4).reshape(
            group * m, cin, *kernel)
        direct = _dilated(direct, dilations)
        extents = direct.shape[2:]
        current, dims = x, list(shape)
        for axis, step in ((2, strides[0]), (3, strides[1])):
            if step == 1:
                continue
            # (…, n, …) → (…, n, 1, …) → zeros after along the new axis → (…, n·step, …).
            split = self.emit("reshape", node, [current], output=self._fresh(f"{out}/axis{axis}_split"),
                              target=(0, *dims[1:axis + 1], 1, *dims[axis + 1:]), allowzero=False)
            pads = [0] * (2 * (len(dims) + 1))
            pads[len(dims) + 1 + axis + 1] = step - 1
            spaced = self.emit("pad", node, [split], output=self._fresh(f"{out}/axis{axis}_spaced"), pads=tuple(pads),
                               value=0.0, axes=None)
            dims[axis] *= step
            current = self.emit("reshape", node, [spaced], output=self._fresh(f"{out}/axis{axis}_zeros"),
                                target=(0, *dims[1:]), allowzero=False)
        # Rows to frame the zero-spaced input with (negative: rows to cut), before and after; the
        # spacing left stride − 1 zeros after the last pixel.
        top, left, bottom, right = padding
        before = [extents[0] - 1 - top, extents[1] - 1 - left]
        after = [extents[0] - 1 - bottom + extra[0] - (strides[0] - 1), extents[1] - 1 - right + extra[1] - (strides[1] - 1)]
        if min(before + after) < 0:
            starts = [0, 0, max(0, -before[0]), max(0, -before[1])]
            counts = [*dims[:2], dims[2] - starts[2] - max(0, -after[0]), dims[3] - starts[3] - max(0, -after[1])]
            if min(counts) < 1:
                raise self.fail(node, f"the pads {list(padding)} leave no output")
            current = self._slice(node, current, starts, [1] * 4, counts, self._fresh(f"{out}/cut"))
        frame = (max(before[0], 0), max(before[1], 0), max(after[0], 0), max(after[1], 0))
        inputs = [current, self._const_like(node, "w_direct", np.ascontiguousarray(direct).astype(np.float32))]
        if len(node.input) > 2 and node.input[2]:
            self.constant(node, node.input[2], "the bias B")
            inputs.append(node.input[2])
        self.emit("conv2d", node, inputs, stride=1, groups=group, relu=False, **_conv_window(frame))

    def op_Gemm(self, node, attrs):
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        self.check_flags(node, attrs, "transA", "transB")
        trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
        a, b = node.input[0], node.input[1]
        # A, B and C share one type: ONNX Runtime refuses an int64 (or bool) B or C beside float32
        # A, even where beta is 0, which would be cast here.
        kind = self.values[self.name(a)].dtype
        for i, what in ((1, "B"), (2, "C")):
            if len(node.input) > i and self.name(node.input[i]) in self.constants:
                given = self.constants[self.name(node.input[i])].dtype
                if given.name != kind:
                    raise self.fail(node, f"{what} must have A's type, {kind}, not {given}")
        out = node.output[0]
        if trans_a:
            if self.name(a) in self.constants:
                a = self._const_like(node, "at", self.constants[self.name(a)].T)
            else:
                a = self.emit("transpose", node, [a], output=self._fresh(f"{out}/a_t"), perm=(1, 0))
        scale = None                     # alpha, where it cannot be folded into a constant B
        if self.name(b) in self.constants:
            w = self.constants[self.name(b)]
            w = w.T if trans_b else w            # a view (no copy of a large layer's weights)
            b = self._const_like(node, "w", w * np.float32(alpha) if alpha != 1.0 else w)
        else:
            if trans_b:
                b = self.emit("transpose", node, [b], output=self._fresh(f"{out}/b_t"), perm=(1, 0))
            scale = alpha if alpha != 1.0 else None
        inputs = [a, b]
        c = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if c is None or beta == 0.0:
            self._scaled_product(node, inputs, scale, out)
            return
        columns = self.constants[self.name(b)].shape[1] if self.name(b) in self.constants else None
        if self.name(c) in self.constants:
            bias = self.constants[self.name(c)].astype(np.float32) * np.float32(beta)
            if columns is not None and bias.size in (1, columns) and (bias.ndim < 2 or bias.shape[0] == 1):
                # A per-column C is the dense operator's bias.
                inputs.append(self._const_like(node, "bias", np.broadcast_to(bias.reshape(-1), (columns,)).copy()))
                self.emit("dense", node, inputs, relu=False)
                return
            c = self._const_like(node, "c", bias)
        elif beta != 1.0:
            c = self._scaled(node, c, beta, suffix="beta_c")
        # A full-matrix (or variable) C: a separate, broadcasting Add.
        product = self._scaled_product(node, inputs, scale, self._fresh(f"{out}/matmul"))
        self.emit("add", node, [product, c], relu=False)

    def _scaled_product(self, node, inputs: list[str], scale: float | None, out: str) -> str:
        """A · B (a dense node), times ``scale`` when it is not None, into ``out``."""
        if scale is None:
            return self.emit("dense", node, inputs, output=out, relu=False)
        product = self.emit("dense", node, inputs, output=self._fresh(f"{node.output[0]}/product"), relu=False)
        return self._scaled(node, product, scale, out, "alpha")

    def _fresh(self, base: str) -> str:
        """``base``, or ``base_k``: a tensor name neither the model nor this import uses."""
        name, k = base, 1
        while name in self.values or name in self.onnx_names:
            name, k = f"{base}_{k}", k + 1
        return name

    def _const_like(self, node, suffix: str, array: np.ndarray) -> str:
        name = self._fresh(f"{node.output[0]}/{suffix}")
        self.add_constant(name, array)
        return name

    @reads("numpy's: batched, broadcast, of vectors, of computed operands")
    def op_MatMul(self, node, attrs):
        """numpy's matmul. (…, K) @ constant (K, N) is one dense node (on the accelerator in an
        int8 network); a 1-D operand gains and loses its axis as numpy's rule says; a computed
        (K, N) is one dense of the left operand's rows; operands with batch axes (attention's
        Q·Kᵀ and its weights times V) are one dense per pair of matrices the broadcast batch
        axes select, gathered and shaped back."""
        a, b, out = node.input[0], node.input[1], node.output[0]
        a_shape, b_shape = self._static_shape(self.name(a)), self._static_shape(self.name(b))
        if not a_shape or not b_shape:
            raise self.fail(node, "MatMul takes operands of at least one axis")
        if len(b_shape) == 2 and (len(a_shape) == 2 or self.name(b) in self.constants):
            self.emit("dense", node, [a, b], relu=False, matmul=True)
            return
        if len(a_shape) == 1 or len(b_shape) == 1:
            # numpy: a 1-D left operand is a row (its axis then removed), a 1-D right one a column.
            a2 = self._reshaped(node, a, (1, a_shape[0]), "row") if len(a_shape) == 1 else a
            b2 = self._reshaped(node, b, (b_shape[0], 1), "column") if len(b_shape) == 1 else b
            product = self._batched_matmul(node, a2, b2, self._fresh(f"{out}/product"))
            final = self._static_shape(product)
            final = final[:-2] + ((final[-2],) if len(a_shape) > 1 else ()) + ((final[-1],) if len(b_shape) > 1 else ())
            self._reshaped(node, product, tuple(final), out=out)
            return
        self._batched_matmul(node, a, b, out)

    def _reshaped(self, node, x: str, shape: tuple[int, ...], suffix: str = "", out: str | None = None) -> str:
        return self.emit("reshape", node, [x], output=out or self._fresh(f"{node.output[0]}/{suffix}"),
                         target=tuple(shape), allowzero=True)

    def _batched_matmul(self, node, a: str, b: str, out: str) -> str:
        """(…, M, K) @ (…, K, N) of two tensors of at least two axes, into ``out``."""
        a_shape, b_shape = self._static_shape(self.name(a)), self._static_shape(self.name(b))
        (m, k), (k2, n) = a_shape[-2:], b_shape[-2:]
        if k != k2:
            raise self.fail(node, f"cannot multiply {list(a_shape)} by {list(b_shape)}: {k} columns against {k2} rows")
        try:
            batch = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
        except ValueError:
            raise self.fail(node, f"the batch axes of {list(a_shape)} and {list(b_shape)} do not broadcast") from None
        if len(b_shape) == 2:
            # One right-hand matrix: every row of the left operand times it, in one product.
            rows = self._reshaped(node, a, (math.prod(a_shape[:-1]), k), "rows")
            product = self.emit("dense", node, [rows, b], output=self._fresh(f"{out}/rows_product"), relu=False,
                                matmul=True)
            return self._reshaped(node, product, tuple(a_shape[:-1]) + (n,), out=out)

        def matrix(x: str, shape, index, what: str) -> str:
            lead = len(shape) - 2
            own = [i if d > 1 else 0 for i, d in zip(index[len(index) - lead:], shape[:lead])]
            if not own or all(d == 1 for d in shape[:lead]):
                sliced = x
            else:
                sliced = self._slice(node, x, own + [0, 0], [1] * len(shape), [1] * lead + list(shape[-2:]),
                                     self._fresh(f"{out}/{what}{'_'.join(map(str, own))}"))
            return self._reshaped(node, sliced, tuple(shape[-2:]), f"{what}{'_'.join(map(str, own))}_matrix")

        products = []
        for index in np.ndindex(*batch) if batch else [()]:
            label = "_".join(map(str, index))
            left, right = matrix(a, a_shape, index, "a"), matrix(b, b_shape, index, "b")
            product = self.emit("dense", node, [left, right], output=self._fresh(f"{out}/product{label}"), relu=False,
                                matmul=True)
            products.append(self._reshaped(node, product, (1, m, n), f"product{label}_batched"))
        joined = products[0] if len(products) == 1 else self.emit(
            "concat", node, products, output=self._fresh(f"{out}/products"), axis=0)
        return self._reshaped(node, joined, tuple(batch) + (m, n), out=out)

    def op_Add(self, node, attrs):
        self.emit("add", node, list(node.input[:2]), relu=False)

    def op_Sub(self, node, attrs):
        self.emit("sub", node, list(node.input[:2]), relu=False)

    def op_Mul(self, node, attrs):
        self.emit("mul", node, list(node.input[:2]), relu=False)

    def op_Div(self, node, attrs):
        self.emit("div", node, list(node.input[:2]), relu=False)

    def op_Neg(self, node, attrs):
        # x · (−1), exact in float32 and in int8 too: −1 quantizes to −64 · 2^-6 and the
        # product's shift by 6 back to x's scale drops nothing, so no new kernel is needed.
        x = self.constants.get(self.name(node.input[0]))
        kind = x.dtype if x is not None and x.dtype.kind in "iu" else np.float32    # an integer constant folds
        self.emit("mul", node, [node.input[0], self._const_like(node, "minus_one", np.array(-1, kind))], relu=False)

    @reads('a constant exponent')
    def op_Pow(self, node, attrs):
        y = self.constant(node, node.input[1], "the exponent Y")
        if y.dtype.kind not in "fiu" or y.size == 0:
            raise self.fail(node, f"the exponent Y must be a non-empty numeric constant, not {y.dtype} of shape "
                                  f"{list(y.shape)}")
        values = np.unique(y.astype(np.float64))
        if len(values) > 1 and np.any(values == np.round(values)):
            # exp(Y · log x) is NaN for x < 0, where an integer exponent has a real power.
            raise self.fail(node, f"an exponent Y whose elements differ ({values[:4].tolist()}…) must have no "
                                  "integer element; give one exponent for every element")
        x, out = node.input[0], node.output[0]
        if y.ndim:
            # A Y of rank ≥ 1 broadcasts the power to its shape: times ones of it (exact).
            out = self._fresh(f"{out}/power")
        power = self._power(node, x, values[0], out) if len(values) == 1 else self._exp_log(node, x, y, out)
        if y.ndim:
            self.emit("mul", node, [power, self._const_like(node, "ones", np.ones(y.shape, np.float32))], relu=False)

    #: The largest integer exponent Pow computes, by squaring and multiplying (defined for
    #: negative bases, within an ulp per product of ONNX Runtime's pow); beyond, x^e overflows
    #: or vanishes for every |x| not within 1 % of 1, and exp(e · log x) would be NaN below 0.
    _INTEGER_EXPONENTS = 64

    def _power(self, node, x: str, e: float, out: str) -> str:
        """x^e for one constant ``e`` ≠ 0, into ``out``: by squaring and multiplying for
        integers (a reciprocal for negative ones), sqrt for 1/2, exp(e · log x) otherwise."""
        if e == round(e):
            n = int(abs(e))
            if n == 0:      # 1 everywhere (NaN and inf included), which no product of x gives
                raise self.fail(node, "an exponent of 0 (a tensor of ones) is not supported")
            if n > self._INTEGER_EXPONENTS:
                raise self.fail(node, f"an integer exponent must be within ±{self._INTEGER_EXPONENTS}, not {int(e)}")
            power = self._integer_power(node, x, n, out if e > 0 else self._fresh(f"{out}/power"))
            if e > 0:
                return power
            return self.emit("div", node, [self._const_like(node, "one", np.array(1, np.float32)), power], output=out,
                             relu=False)
        if e == 0.5:
            return self.emit("sqrt", node, [x], output=out)
        return self._exp_log(node, x, np.array(e, np.float32), out)

    def _integer_power(self, node, x: str, n: int, out: str) -> str:
        """x^n (n ≥ 1) into ``out``: the squares x^(2^k), times one another where n's bits are set."""
        if n == 1:
            return self.emit("mul", node, [x, self._const_like(node, "one", np.array(1, np.float32))], output=out,
                             relu=False)
        top = n.bit_length() - 1
        squares = [x]
        for k in range(1, top + 1):
            last = k == top and n == 1 << top
            squares.append(self.emit("mul", node, [squares[-1], squares[-1]],
                                     output=out if last else self._fresh(f"{out}/x{1 << k}"), relu=False))
        factors = [squares[bit] for bit in range(top + 1) if n >> bit & 1]
        product = factors[0]
        for k, factor in enumerate(factors[1:], 1):
            product = self.emit("mul", node, [product, factor],
                                output=out if k == len(factors) - 1 else self._fresh(f"{out}/product{k}"), relu=False)
        return product

    def _exp_log(self, node, x: str, e: np.ndarray, out: str) -> str:
        """exp(e · log x): NaN for x < 0, as pow is for a non-integer exponent."""
        log = self.emit("log", node, [x], output=self._fresh(f"{out}/log"))
        scaled = self.emit("mul", node, [log, self._const_like(node, "exponent", e.astype(np.float32))],
                           output=self._fresh(f"{out}/scaled"), relu=False)
        return self.emit("exp", node, [scaled], output=out)

    def op_Relu(self, node, attrs):
        self.emit("relu", node, [node.input[0]])

    def op_LeakyRelu(self, node, attrs):
        self.emit("leaky_relu", node, [node.input[0]], alpha=self._finite(node, attrs, "alpha", 0.01))

    def op_ThresholdedRelu(self, node, attrs):
        self.emit("thresholded_relu", node, [node.input[0]], alpha=self._finite(node, attrs, "alpha", 1.0))

    def _finite(self, node, attrs, name: str, default: float) -> float:
        value = float(attrs.get(name, default))
        if not math.isfinite(value):
            raise self.fail(node, f"{name} must be a finite number, not {value}")
        return value

    def _scaled(self, node, x: str, factor: float, out: str | None = None, suffix: str = "scaled") -> str:
        """x · factor (a float32 constant), into ``out`` or a fresh name."""
        return self.emit("mul", node, [x, self._const_like(node, suffix, np.array(factor, np.float32))],
                         output=out or self._fresh(f"{node.output[0]}/{suffix}"), relu=False)

    def op_Elu(self, node, attrs):
        self.emit("elu", node, [node.input[0]], alpha=self._finite(node, attrs, "alpha", 1.0))

    def op_Selu(self, node, attrs):
        # gamma · elu(x, alpha): ONNX's definition, with its defaults.
        alpha = self._finite(node, attrs, "alpha", 1.67326319217681884765625)
        gamma = self._finite(node, attrs, "gamma", 1.05070102214813232421875)
        elu = self.emit("elu", node, [node.input[0]], output=self._fresh(f"{node.output[0]}/elu"), alpha=alpha)
        self._scaled(node, elu, gamma, node.output[0], "gamma")

    def op_Celu(self, node, attrs):
        # max(0, x) + min(0, alpha · (e^(x/alpha) − 1)) = alpha · elu(x / alpha, 1).
        alpha = self._finite(node, attrs, "alpha", 1.0)
        if alpha == 0:
            raise self.fail(node, "alpha must not be 0 (CELU divides by it)")
        scaled = self._scaled(node, node.input[0], 1 / alpha, suffix="inverse_alpha")
        elu = self.emit("elu", node, [scaled], output=self._fresh(f"{node.output[0]}/elu"), alpha=1.0)
        self._scaled(node, elu, alpha, node.output[0], "alpha")

    def op_Softplus(self, node, attrs):
        self.emit("softplus", node, [node.input[0]])

    def op_Softsign(self, node, attrs):
        # x / (1 + |x|).
        out = node.output[0]
        magnitude = self.emit("abs", node, [node.input[0]], output=self._fresh(f"{out}/abs"))
        denominator = self.emit("add", node, [magnitude, self._const_like(node, "one", np.array(1, np.float32))],
                                output=self._fresh(f"{out}/denominator"), relu=False)
        self.emit("div", node, [node.input[0], denominator], relu=False)

    def op_Erf(self, node, attrs):
        self.emit("erf", node, [node.input[0]])

    def op_Gelu(self, node, attrs):
        # ONNX's definitions: x/2 · (1 + erf(x/√2)), or with approximate="tanh"
        # x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))).
        approximate = attrs.get("approximate", b"none")
        approximate = approximate.decode() if isinstance(approximate, bytes) else str(approximate)
        if approximate not in ("none", "tanh"):
            raise self.fail(node, f"approximate must be 'none' or 'tanh', not {approximate!r}")
        x, out = node.input[0], node.output[0]
        if approximate == "none":
            inner = self.emit("erf", node, [self._scaled(node, x, 1 / math.sqrt(2), suffix="inverse_sqrt2")],
                              output=self._fresh(f"{out}/erf"))
        else:
            cube = self.emit("mul", node, [self.emit("mul", node, [x, x], output=self._fresh(f"{out}/square"),
                                                     relu=False), x], output=self._fresh(f"{out}/cube"), relu=False)
            cubic = self.emit("add", node, [x, self._scaled(node, cube, 0.044715, suffix="cubic")],
                              output=self._fresh(f"{out}/cubic_sum"), relu=False)
            inner = self.emit("tanh", node, [self._scaled(node, cubic, math.sqrt(2 / math.pi), suffix="sqrt_2_pi")],
                              output=self._fresh(f"{out}/tanh"))
        one_plus = self.emit("add", node, [inner, self._const_like(node, "one", np.array(1, np.float32))],
                             output=self._fresh(f"{out}/one_plus"), relu=False)
        half_x = self._scaled(node, x, 0.5, suffix="half_x")
        self.emit("mul", node, [half_x, one_plus], relu=False)

    def op_Mish(self, node, attrs):
        # x · tanh(softplus(x)).
        out = node.output[0]
        soft = self.emit("softplus", node, [node.input[0]], output=self._fresh(f"{out}/softplus"))
        gate = self.emit("tanh", node, [soft], output=self._fresh(f"{out}/tanh"))
        self.emit("mul", node, [node.input[0], gate], relu=False)

    def op_PRelu(self, node, attrs):
        # relu(x) + (−slope) · relu(−x): slope · x below 0, x above, exact in float32, and made of
        # operators with int8 forms (an int8 network keeps it on its grid).
        x, slope, out = node.input[0], node.input[1], node.output[0]
        positive = self.emit("relu", node, [x], output=self._fresh(f"{out}/positive"))
        negated = self.emit("mul", node, [x, self._const_like(node, "minus_one", np.array(-1, np.float32))],
                            output=self._fresh(f"{out}/negated"), relu=True)
        minus_slope = self.emit("mul", node, [slope, self._const_like(node, "minus_one", np.array(-1, np.float32))],
                                output=self._fresh(f"{out}/minus_slope"), relu=False)
        below = self.emit("mul", node, [negated, minus_slope], output=self._fresh(f"{out}/below"), relu=False)
        self.emit("add", node, [positive, below], relu=False)

    def op_Sigmoid(self, node, attrs):
        self.emit("sigmoid", node, [node.input[0]])

    def op_Tanh(self, node, attrs):
        self.emit("tanh", node, [node.input[0]])

    def op_Exp(self, node, attrs):
        self.emit("exp", node, [node.input[0]])

    def op_Sqrt(self, node, attrs):
        self.emit("sqrt", node, [node.input[0]])

    def op_Abs(self, node, attrs):
        self.emit("abs", node, [node.input[0]])

    def op_Log(self, node, attrs):
        self.emit("log", node, [node.input[0]])

    def op_Reciprocal(self, node, attrs):
        self.emit("div", node, [self._const_like(node, "one", np.array(1, np.float32)), node.input[0]], relu=False)

    def _hard_sigmoid(self, node, attrs, default_alpha: float, output: str | None = None) -> str:
        """max(0, min(1, alpha · x + beta)), as ONNX defines HardSigmoid: a product, a sum and a
        clip, each of which has an int8 form, so an int8 network keeps it in int8."""
        alpha, beta = (self._finite(node, attrs, k, d) for k, d in (("alpha", default_alpha), ("beta", 0.5)))
        out = node.output[0]
        scaled = self.emit("mul", node, [node.input[0], self._const_like(node, "alpha", np.array(alpha, np.float32))],
                           output=self._fresh(f"{out}/scaled"), relu=False)
        shifted = self.emit("add", node, [scaled, self._const_like(node, "beta", np.array(beta, np.float32))],
                            output=self._fresh(f"{out}/shifted"), relu=False)
        return self.emit("clip", node, [shifted], output=output, lo=0.0, hi=1.0)

    def op_HardSigmoid(self, node, attrs):
        self._hard_sigmoid(node, attrs, 0.2)

    def op_HardSwish(self, node, attrs):
        # x · HardSigmoid(x) with alpha 1/6 and beta 0.5 (ONNX's definition; MobileNetV3's h-swish).
        gate = self._hard_sigmoid(node, {"alpha": 1 / 6}, 1 / 6, output=self._fresh(f"{node.output[0]}/gate"))
        self.emit("mul", node, [node.input[0], gate], relu=False)

    def _variadic(self, node, op: str, output: str | None = None) -> str:
        """``op`` over a Sum's, Mean's, Max's or Min's inputs (at least two), left to right as
        ONNX Runtime takes them (float32 sums round in that order), into ``output`` (the node's
        own output by default)."""
        total = node.input[0]
        for k, operand in enumerate(node.input[1:], 1):
            last = k == len(node.input) - 1
            total = self.emit(op, node, [total, operand],
                              output=output if last else self._fresh(f"{node.output[0]}/{op}{k}"), relu=False)
        return total

    def _single_input(self, node) -> bool:
        """Whether a variadic node has one input, which its output then names; none is refused."""
        if not node.input:
            raise self.fail(node, "it needs at least one input")
        if len(node.input) == 1:
            self.alias[node.output[0]] = self.name(node.input[0])    # a sum (max, min) of one tensor is it
            return True
        return False

    def op_Max(self, node, attrs):
        if not self._single_input(node):
            self._variadic(node, "max")

    def op_Min(self, node, attrs):
        if not self._single_input(node):
            self._variadic(node, "min")

    def op_Sum(self, node, attrs):
        if not self._single_input(node):
            self._variadic(node, "add")

    def op_Mean(self, node, attrs):
        if self._single_input(node):
            return
        # The sum divided by the count (not times 1/n, which float32 does not hold exactly for n = 3).
        total = self._variadic(node, "add", output=self._fresh(f"{node.output[0]}/sum"))
        self.emit("div", node, [total, self._const_like(node, "count", np.array(len(node.input), np.float32))],
                  relu=False)

    def op_Clip(self, node, attrs):
        # min and max are scalars (ONNX Runtime takes shape [1] too, not [1, 1]) of the data's
        # type: one type parameter, and ONNX Runtime refuses an int64 bound beside float32 data.
        data = self.values[self.name(node.input[0])].dtype
        bounds = []
        for i, which, default in ((1, "min", -np.inf), (2, "max", np.inf)):
            if len(node.input) > i and node.input[i]:
                value = self.constant(node, node.input[i], f"the {which}")
                if value.shape not in ((), (1,)):
                    raise self.fail(node, f"the {which} must be a scalar (or of shape [1]), not of shape "
                                          f"{list(value.shape)}")
                if value.dtype.name != data:
                    raise self.fail(node, f"the {which} must have the data's type, {data}, not {value.dtype}")
                bounds.append(float(value.reshape(-1)[0]))
            else:
                bounds.append(default)
        if bounds[0] > bounds[1]:
            raise self.fail(node, f"min {bounds[0]} exceeds max {bounds[1]}")
        self.emit("clip", node, [node.input[0]], lo=bounds[0], hi=bounds[1])

    def _pool(self, node, attrs, op, **extra):
        if self._lifted(node, attrs):
            return
        # storage_order (MaxPool) orders the Indices output only, which is refused here.
        if len(node.output) > 1 and node.output[1]:
            raise self.fail(node, "the Indices output is not supported")
        self.check_flags(node, attrs, "ceil_mode")
        kernel, strides, dilations, padding = self._window(node, attrs)
        window = dict(padding=(0, 0, 0, 0), auto_pad=padding) if isinstance(padding, str) else dict(padding=padding)
        self.emit(op, node, [node.input[0]], kernel=kernel, stride=strides, dilation=dilations,
                  ceil_mode=bool(attrs.get("ceil_mode", 0)), **window, **extra)

    def op_MaxPool(self, node, attrs):
        self._pool(node, attrs, "max_pool")

    def op_AveragePool(self, node, attrs):
        self.check_flags(node, attrs, "count_include_pad")
        self._pool(node, attrs, "avg_pool", count_include_pad=bool(attrs.get("count_include_pad", 0)))

    def op_LRN(self, node, attrs):
        """x / (bias + alpha/size · Σ x²)^beta, the sum over the ``size`` channels around each
        (ONNX's window: (size−1)//2 before, the rest after, cut at the edges). Composed: the
        squares' channels become a pool's rows — a (size × 1) average pool counting its zero
        padding, times size, is the window's sum — then the power as exp(−beta · log(·))."""
        size = attrs.get("size")
        # An even size ONNX defines (one channel more after than before) but ONNX Runtime refuses.
        if not isinstance(size, int) or size < 1 or size % 2 == 0:
            raise self.fail(node, f"size must be a positive odd integer (as ONNX Runtime requires), not {size!r}")
        alpha, beta, bias = (self._finite(node, attrs, k, d) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
        x, out = node.input[0], node.output[0]
        shape = self._static_shape(self.name(x))
        if len(shape) < 3:
            raise self.fail(node, f"the input must have a batch, channel and spatial axes, not shape {list(shape)}")
        c, pixels = shape[1], math.prod(shape[2:])
        square = self.emit("mul", node, [x, x], output=self._fresh(f"{out}/square"), relu=False)
        # Target 0 copies the batch axis, so a model of symbolic batch runs any multiple of it.
        rows = self.emit("reshape", node, [square], output=self._fresh(f"{out}/channels_as_rows"),
                         target=(0, 1, c, pixels), allowzero=False)
        before = (size - 1) // 2        # = size − 1 − before: the size is odd
        window = self.emit("avg_pool", node, [rows], output=self._fresh(f"{out}/window_mean"), kernel=(size, 1),
                           stride=(1, 1), dilation=(1, 1), padding=(before, 0, size - 1 - before, 0),
                           ceil_mode=False, count_include_pad=True)
        back = self.emit("reshape", node, [window], output=self._fresh(f"{out}/window_mean_nchw"),
                         target=(0, *shape[1:]), allowzero=False)
        scaled = self._scaled(node, back, alpha, suffix="alpha")          # alpha/size · Σ = alpha · mean
        base = self.emit("add", node, [scaled, self._const_like(node, "bias", np.array(bias, np.float32))],
                         output=self._fresh(f"{out}/base"), relu=False)
        power = self._exp_log(node, base, np.array(-beta, np.float32), self._fresh(f"{out}/power"))
        self.emit("mul", node, [x, power], relu=False)

    #: Resize's coordinate modes: the input coordinate of output coordinate ``x`` along an axis of
    #: ``n`` pixels resized to ``m`` with scale ``s`` (ONNX's definitions).
    _RESIZE_COORDINATES = {
        "half_pixel": lambda x, s, n, m: (x + 0.5) / s - 0.5,
        "pytorch_half_pixel": lambda x, s, n, m: (x + 0.5) / s - 0.5 if m > 1 else 0.0,
        "align_corners": lambda x, s, n, m: x * (n - 1) / (m - 1) if m > 1 else 0.0,
        "asymmetric": lambda x, s, n, m: x / s,
    }
    #: The most pixels Resize gives an axis it changes (each output pixel's neighbours and weights
    #: are worked out at compile time and kept with the graph).
    _MAX_RESIZED = 1 << 16
    #: The largest whole factor upsampled as interleaved phases.
    _MAX_PHASES = 8
    _NEAREST = {"round_prefer_floor": lambda v: math.ceil(v - 0.5), "round_prefer_ceil": lambda v: math.floor(v + 0.5),
                "floor": math.floor, "ceil": math.ceil}

    @reads('nearest, linear and cubic; scales or sizes; half_pixel, pytorch_half_pixel, align_corners and '
           'asymmetric coordinates; without antialias')
    def op_Resize(self, node, attrs):
        """Resizing as feature pyramids, detection and segmentation heads export it, one axis after
        the other. An upsampling by a whole factor whose every output pixel lies the same way
        between the same neighbours (nearest repeats, half-pixel and asymmetric linear) is
        interleaved phases: per phase a weighted sum of the tensor and a copy shifted by one
        pixel, exact in int8 for nearest. Any other size, coordinate map or cubic is, per axis,
        Σ_k take(x, indices_k) · weights_k: the neighbours' positions and weights computed here
        in float32 as ONNX Runtime computes them (nearest takes one neighbour, linear two with
        the coordinate clamped to the edges, cubic four with its edge pixels repeated). Modes,
        coordinate maps and options outside these are refused by name, never approximated."""
        def text(name, default):
            value = attrs.get(name, default)
            return value.decode() if isinstance(value, bytes) else str(value)
        mode, coordinates = text("mode", "nearest"), text("coordinate_transformation_mode", "half_pixel")
        rounding = text("nearest_mode", "round_prefer_floor")
        if mode not in ("nearest", "linear", "cubic"):
            raise self.fail(node, f"mode {mode!r} is not supported; gemforge resizes with modes 'nearest', 'linear' "
                                  "and 'cubic'")
        if coordinates not in self._RESIZE_COORDINATES:
            raise self.fail(node, f"coordinate_transformation_mode {coordinates!r} is not supported; supported: "
                                  f"{', '.join(self._RESIZE_COORDINATES)}")
        if rounding not in self._NEAREST:
            raise self.fail(node, f"nearest_mode {rounding!r} is not one of {', '.join(self._NEAREST)}")
        for name in ("antialias", "exclude_outside"):
            if attrs.get(name, 0):
                raise self.fail(node, f"{name}={attrs[name]} is not supported (resizing without it)")
        if text("keep_aspect_ratio_policy", "stretch") != "stretch" or "axes" in attrs:
            raise self.fail(node, "keep_aspect_ratio_policy and axes are not supported; give scales or sizes for "
                                  "every axis")
        cubic_a = self._finite(node, attrs, "cubic_coeff_a", -0.75)
        x, out = node.input[0], node.output[0]
        shape = self._static_shape(self.name(x))
        scales = self._resize_operand(node, 2, "scales", np.float32, len(shape))
        sizes = self._resize_operand(node, 3, "sizes", np.int64, len(shape))
        if (scales is None) == (sizes is None):
            raise self.fail(node, "exactly one of scales and sizes must be given")
        if sizes is not None:
            outputs = [int(v) for v in sizes]
            scales = [o / n for o, n in zip(outputs, shape)]
            scales32 = [np.float32(o) / np.float32(n) for o, n in zip(outputs, shape)]   # ONNX Runtime's scale
        else:
            scales32 = [np.float32(v) for v in scales]
            scales = [float(v) for v in scales]
            # floor(size · scale) in float32, as ONNX Runtime sizes it (5 · 1.4f is 7 there, 6 in float64).
            outputs = [int(np.floor(np.float32(n) * s)) for n, s in zip(shape, scales32)]
        where = self._RESIZE_COORDINATES[coordinates]
        for axis, (n, m, s) in enumerate(zip(shape, outputs, scales)):
            if m < 1 or not math.isfinite(s) or s <= 0:
                raise self.fail(node, f"axis {axis} would have {m} pixels (scale {s}); it needs at least one")
            if m != n and m > self._MAX_RESIZED:
                raise self.fail(node, f"axis {axis} would be resized to {m:,} pixels; gemforge resizes an axis to at "
                                      f"most {self._MAX_RESIZED:,}")
        if math.prod(outputs) > MAX_ELEMENTS:
            raise self.fail(node, f"its output {outputs} would hold more than the {MAX_ELEMENTS:,} elements gemforge "
                                  "compiles")
        plans = []                     # per axis: None (kept), ("phases", factor, phases) or ("taken", terms)
        for axis, (n, m, s) in enumerate(zip(shape, outputs, scales)):
            # Phases for small whole factors (a node or three each); larger ones take neighbours.
            factor = m // n if m % n == 0 and m // n <= self._MAX_PHASES else 0
            positions = [where(i, s, n, m) for i in range(m)]
            phases = factor and mode != "cubic" and (
                self._nearest_phases(positions, n, factor, rounding) if mode == "nearest" else
                self._linear_phases(positions, n, factor))
            if phases:
                plans.append(None if factor == 1 and phases == [((0, 1.0),)] else ("phases", factor, phases))
                continue
            terms = self._resize_terms(mode, rounding, cubic_a,
                                       self._positions32(coordinates, n, m, scales32[axis]), n)
            kept = len(terms) == 1 and terms[0][1] is None and terms[0][0] == tuple(range(n))
            plans.append(None if kept else ("taken", terms))
        if plans[0] is not None:
            raise self.fail(node, f"the batch axis must keep its size, not be resized from {shape[0]} to {outputs[0]}")
        current, dims = self.name(x), list(shape)
        last = max((a for a, plan in enumerate(plans) if plan is not None), default=None)
        if last is None:
            self.alias[out] = current                # every axis kept: the tensor itself
            return
        for axis, plan in enumerate(plans):
            if plan is None:
                continue
            target = out if axis == last else self._fresh(f"{out}/axis{axis}_resized")
            if plan[0] == "phases":
                current = self._interleaved(node, current, dims, axis, *plan[1:], target)
            else:
                current = self._taken(node, current, dims, axis, plan[1], target)

    @staticmethod
    def _positions32(coordinates: str, n: int, m: int, scale: np.float32) -> np.ndarray:
        """Each output pixel's position in the input along one axis, in float32 as ONNX Runtime
        computes it (its nearest pixel and linear weights then agree at every tie)."""
        x, half = np.arange(m, dtype=np.float32), np.float32(0.5)
        if coordinates == "align_corners":
            return x * np.float32(n - 1) / np.float32(m - 1) if m > 1 else np.zeros(m, np.float32)
        if coordinates == "asymmetric":
            return x / scale
        if coordinates == "pytorch_half_pixel" and m == 1:
            return np.zeros(m, np.float32)
        return (x + half) / scale - half

    def _resize_terms(self, mode: str, rounding: str, cubic_a: float, positions: np.ndarray, n: int):
        """One axis's resize as [(indices, weights or None)]: output pixel i is
        Σ_k weights_k[i] · x[indices_k[i]] (weights None: 1)."""
        last = n - 1
        if mode == "nearest":
            pick = self._NEAREST[rounding]
            return [(tuple(min(max(pick(float(v)), 0), last) for v in positions), None)]
        if mode == "linear":
            clamped = np.clip(positions, np.float32(0), np.float32(last))
            low = np.floor(clamped).astype(np.int64)
            upper = (clamped - low.astype(np.float32)).astype(np.float32)
            pairs = [(low, np.float32(1) - upper), (np.minimum(low + 1, last), upper)]
        else:
            # Cubic convolution (Keys, coefficient a) over the four neighbours floor(x) − 1 … + 2,
            # the edge pixels repeated beyond the ends (exclude_outside=0), as ONNX Runtime.
            a = np.float32(cubic_a)
            low = np.floor(positions).astype(np.int64)
            t = (positions - low.astype(np.float32)).astype(np.float32)
            one, two = np.float32(1), np.float32(2)
            coefficients = [((a * (t + one) - 5 * a) * (t + one) + 8 * a) * (t + one) - 4 * a,
                            ((a + 2) * t - (a + 3)) * t * t + one,
                            ((a + 2) * (one - t) - (a + 3)) * (one - t) * (one - t) + one,
                            ((a * (two - t) - 5 * a) * (two - t) + 8 * a) * (two - t) - 4 * a]
            pairs = [(np.clip(low + k - 1, 0, last), c.astype(np.float32)) for k, c in enumerate(coefficients)]
        terms = []
        for indices, weights in pairs:
            if not weights.any():
                continue
            terms.append((tuple(int(i) for i in indices), None if (weights == 1).all() else weights))
        return terms or [(tuple(int(i) for i in pairs[0][0]), np.zeros(len(positions), np.float32))]

    def _taken(self, node, x: str, dims: list[int], axis: int, terms, out: str) -> str:
        """Σ_k take(x, indices_k, axis) · weights_k (broadcast along ``axis``), into ``out``
        (``dims`` is updated)."""
        base = self._fresh(f"{out}/axis{axis}")
        m = len(terms[0][0])
        total = None
        for k, (indices, weights) in enumerate(terms):
            last = k == len(terms) - 1
            taken = self.emit("take", node, [x], output=out if last and weights is None and total is None
                              else self._fresh(f"{base}_take{k}"), axis=axis, indices=indices)
            if weights is not None:
                shaped = weights.reshape((1,) * axis + (m,) + (1,) * (len(dims) - axis - 1))
                taken = self.emit("mul", node, [taken, self._const_like(node, f"axis{axis}_weights{k}", shaped)],
                                  output=out if last and total is None else self._fresh(f"{base}_term{k}"),
                                  relu=False)
            total = taken if total is None else self.emit("add", node, [total, taken], relu=False,
                                                          output=out if last else self._fresh(f"{base}_sum{k}"))
        dims[axis] = m
        return total

    def _nearest_phases(self, positions, n: int, factor: int, rounding: str):
        """[((0, 1.0),)] · factor where rounding the positions repeats every pixel ``factor`` times."""
        pick = self._NEAREST[rounding]
        taken = [min(max(pick(v), 0), n - 1) for v in positions]
        return [((0, 1.0),)] * factor if taken == [i // factor for i in range(len(positions))] else None

    @staticmethod
    def _linear_phases(positions, n: int, factor: int):
        """Per phase p, ((offset, weight), …): output pixel factor·i + p is Σ weight · x[i + offset]
        (offsets −1, 0, 1, the neighbours clamped at the edges as the coordinates are), where
        that holds for every i; None where the fractions vary with i."""
        phases = []
        for p in range(factor):
            fraction = positions[p] - 0               # pixel i = 0's phase p, relative to pixel 0
            for i in range(n):
                if not math.isclose(positions[factor * i + p] - i, fraction, abs_tol=1e-9):
                    return None
            low = math.floor(fraction)
            if low not in (-1, 0):
                return None
            upper = fraction - low
            terms = [(low, 1.0 - upper), (low + 1, upper)]
            phases.append(tuple((offset, w) for offset, w in terms if w != 0.0) or ((0, 1.0),))
        return phases

    def _interleaved(self, node, x: str, dims: list[int], axis: int, factor: int, phases, out: str) -> str:
        """``factor`` phase tensors of ``x`` along ``axis`` — each Σ weight · (x shifted by offset,
        its edge pixel repeated) — interleaved into an axis ``factor`` times as long, into ``out``
        (``dims`` is updated)."""
        n, base = dims[axis], self._fresh(f"{out}/axis{axis}")

        def shifted(offset: int) -> str:
            if offset == 0 or n == 1:
                return x
            starts, counts = [0] * len(dims), list(dims)
            edge_starts, edge_counts = list(starts), list(counts)
            counts[axis] = n - 1
            edge_counts[axis] = 1
            if offset < 0:     # x[i − 1]: the first pixel, then all but the last
                edge_starts[axis], starts[axis] = 0, 0
                parts = (edge_starts, edge_counts), (starts, counts)
            else:              # x[i + 1]: all but the first, then the last
                starts[axis], edge_starts[axis] = 1, n - 1
                parts = (starts, counts), (edge_starts, edge_counts)
            pieces = [self._slice(node, x, s, [1] * len(dims), c, self._fresh(f"{base}_shift{offset}_{k}"))
                      for k, (s, c) in enumerate(parts)]
            return self.emit("concat", node, pieces, output=self._fresh(f"{base}_shift{offset}"), axis=axis)

        views = {}
        layers = []
        for p, terms in enumerate(phases):
            total = None
            for offset, weight in terms:
                source = views.setdefault(offset, shifted(offset))
                term = source if weight == 1.0 else self._scaled(node, source, weight, suffix=f"axis{axis}_w{p}")
                total = term if total is None else self.emit("add", node, [total, term], relu=False,
                                                              output=self._fresh(f"{base}_phase{p}"))
            split = self.emit("reshape", node, [total], output=self._fresh(f"{base}_phase{p}_split"),
                              target=(0, *dims[1:axis + 1], 1, *dims[axis + 1:]), allowzero=False)
            layers.append(split)
        joined = self.emit("concat", node, layers, output=self._fresh(f"{base}_phases"), axis=axis + 1)
        dims[axis] *= factor
        # Target 0 copies the batch axis (a model of symbolic batch runs any multiple).
        return self.emit("reshape", node, [joined], output=out, target=(0, *dims[1:]), allowzero=False)

    def _resize_operand(self, node, position: int, what: str, dtype, rank: int):
        """Resize's constant scales or sizes (None where omitted or empty), one per axis."""
        if len(node.input) <= position or not node.input[position]:
            return None
        value = self.constant(node, node.input[position], what)
        if value.size == 0:
            return None
        if value.dtype != dtype or value.shape != (rank,):
            raise self.fail(node, f"{what} must be {np.dtype(dtype).name} with one value per axis ({rank}), not "
                                  f"{value.dtype} of shape {list(value.shape)}")
        return value

    def op_GlobalAveragePool(self, node, attrs):
        self.emit("avg_pool", node, [node.input[0]], kernel=None, stride=(1, 1), dilation=(1, 1),
                  padding=(0, 0, 0, 0), ceil_mode=False, count_include_pad=False, global_pool=True)

    def op_GlobalMaxPool(self, node, attrs):
        self.emit("max_pool", node, [node.input[0]], kernel=None, stride=(1, 1), dilation=(1, 1),
                  padding=(0, 0, 0, 0), ceil_mode=False, global_pool=True)

    def op_Flatten(self, node, attrs):
        self.emit("reshape", node, [node.input[0]], flatten_axis=int(attrs.get("axis", 1)))

    def op_Reshape(self, node, attrs):
        shape = self.constant(node, node.input[1], "the target shape")
        if shape.ndim != 1 or shape.dtype != np.int64:    # ONNX Runtime refuses an int32 one
            raise self.fail(node, f"the target shape must be a 1-D int64 tensor, not {shape.dtype} of shape "
                                  f"{list(shape.shape)}")
        self.emit("reshape", node, [node.input[0]], target=tuple(int(d) for d in shape),
                  allowzero=bool(attrs.get("allowzero", 0)))

    def _axes(self, node, position: int = 1, dtypes: tuple[str, ...] = ("int64",),
              scalar: bool = False) -> tuple[int, ...] | None:
        """The constant axes of Squeeze, Unsqueeze (their second input since opset 13), ReduceMean
        (since opset 18) and Pad (its fourth, since opset 18); None where the input is omitted.
        ONNX takes a 1-D tensor of ``dtypes``: int64, and int32 too for Pad's (which ONNX Runtime
        1.31 refuses, against the spec). ONNX Runtime refuses another type, and a scalar but for
        Unsqueeze's (``scalar``), which it reads as one axis."""
        if len(node.input) <= position or not node.input[position]:
            return None
        axes = self.constant(node, node.input[position], "the axes")
        if axes.dtype.name not in dtypes or axes.ndim > 1 or (axes.ndim == 0 and not scalar):
            shape = "a 1-D or scalar" if scalar else "a 1-D"
            raise self.fail(node, f"the axes must be {shape} {' or '.join(dtypes)} tensor, not {axes.dtype} of "
                                  f"shape {list(axes.shape)}")
        return tuple(int(a) for a in axes.reshape(-1))

    def op_Squeeze(self, node, attrs):
        # No axes, or none given (as ONNX Runtime reads an empty list): every axis of size 1.
        self.emit("reshape", node, [node.input[0]], squeeze=self._axes(node) or None)

    def op_Unsqueeze(self, node, attrs):
        self.emit("reshape", node, [node.input[0]], unsqueeze=self._axes(node, scalar=True))

    def op_Transpose(self, node, attrs):
        perm = attrs.get("perm")
        self.emit("transpose", node, [node.input[0]], perm=None if perm is None else tuple(int(p) for p in perm))

    @reads('constant mode and pads')
    def op_Pad(self, node, attrs):
        mode = attrs.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            raise self.fail(node, f"mode {mode} is not supported (only constant)")
        pads = self.constant(node, node.input[1], "the pads")
        if pads.ndim != 1 or pads.dtype != np.int64:      # ONNX Runtime refuses an int32 one
            raise self.fail(node, f"the pads must be a 1-D int64 tensor, not {pads.dtype} of shape "
                                  f"{list(pads.shape)}")
        if (pads < 0).any():
            raise self.fail(node, f"pads {pads.tolist()} are negative somewhere (cropping), which is not supported")
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            given = self.constant(node, node.input[2], "the constant_value")
            if given.size != 1:
                raise self.fail(node, f"the constant_value must be a scalar, not of shape {list(given.shape)}")
            # One type parameter for data and constant_value: ONNX Runtime refuses an int64 value
            # beside float32 data.
            data = self.values[self.name(node.input[0])].dtype
            if given.dtype.name != data:
                raise self.fail(node, f"the constant_value must have the data's type, {data}, not {given.dtype}")
            value = float(given.reshape(-1)[0])
        self.emit("pad", node, [node.input[0]], pads=tuple(int(p) for p in pads),
                  axes=self._axes(node, 3, ("int32", "int64")), value=value)

    def op_BatchNormalization(self, node, attrs):
        if int(attrs.get("training_mode", 0)) or any(o for o in node.output[1:]):
            raise self.fail(node, "training mode is not supported (inference only)")
        for i, what in ((1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")):
            self.constant(node, node.input[i], what)
        self.emit("batch_norm", node, list(node.input[:5]), epsilon=float(attrs.get("epsilon", 1e-5)))

    def op_Concat(self, node, attrs):
        if "axis" not in attrs:
            raise self.fail(node, "the axis attribute is required")
        self.emit("concat", node, list(node.input), axis=int(attrs["axis"]))

    def op_Softmax(self, node, attrs):
        self.emit("softmax", node, [node.input[0]], axis=int(attrs.get("axis", -1)))

    @reads('their axes constant')
    def op_ReduceMean(self, node, attrs):
        self.check_flags(node, attrs, "keepdims", "noop_with_empty_axes")
        # The axes: an attribute before opset 18, an input since.
        axes = self._axes(node) if "axes" not in attrs else tuple(int(a) for a in attrs["axes"])
        if not axes and int(attrs.get("noop_with_empty_axes", 0)):
            self.alias[node.output[0]] = self.name(node.input[0])
            return
        # No axes: the mean of every element.
        self.emit("reduce_mean", node, [node.input[0]], axes=axes or None, keepdims=bool(attrs.get("keepdims", 1)))

    def _reduction(self, node, attrs) -> tuple[tuple[int, ...], bool, tuple[int, ...]] | None:
        """A reduction's axes (non-negative, sorted), keepdims and its input's shape; None when
        it reduces nothing (no axes and noop_with_empty_axes: the output is the input)."""
        self.check_flags(node, attrs, "keepdims", "noop_with_empty_axes")
        axes = self._axes(node) if "axes" not in attrs else tuple(int(a) for a in attrs["axes"])
        shape = self._static_shape(self.name(node.input[0]))
        if not axes:
            if int(attrs.get("noop_with_empty_axes", 0)):
                return None
            axes = tuple(range(len(shape)))
        if any(not -len(shape) <= a < len(shape) for a in axes) or len(set(a % max(len(shape), 1) for a in axes)) != len(axes):
            raise self.fail(node, f"the axes {list(axes)} must be distinct axes of the input's {len(shape)}")
        return tuple(sorted(a % len(shape) for a in axes)), bool(attrs.get("keepdims", 1)), shape

    def _sum(self, node, x: str, axes, keepdims: bool, shape, out: str) -> str:
        """Σ over ``axes``: the mean times the number of elements averaged."""
        mean = self.emit("reduce_mean", node, [x], output=self._fresh(f"{out}/mean"), axes=axes, keepdims=keepdims)
        return self._scaled(node, mean, float(math.prod(shape[a] for a in axes)), out, "count")

    @reads('their axes constant')
    def op_ReduceSum(self, node, attrs):
        reduction = self._reduction(node, attrs)
        if reduction is None:
            self.alias[node.output[0]] = self.name(node.input[0])
        else:
            self._sum(node, node.input[0], *reduction, node.output[0])

    @reads('their axes constant')
    def op_ReduceSumSquare(self, node, attrs):
        reduction = self._reduction(node, attrs)
        square = self.emit("mul", node, [node.input[0], node.input[0]], output=None if reduction is None else
                           self._fresh(f"{node.output[0]}/square"), relu=False)
        if reduction is not None:
            self._sum(node, square, *reduction, node.output[0])

    @reads('their axes constant')
    def op_ReduceL2(self, node, attrs):
        reduction = self._reduction(node, attrs)
        if reduction is None:
            self.emit("abs", node, [node.input[0]])             # the norm of each element alone
            return
        square = self.emit("mul", node, [node.input[0], node.input[0]], output=self._fresh(f"{node.output[0]}/square"),
                           relu=False)
        total = self._sum(node, square, *reduction, self._fresh(f"{node.output[0]}/sum"))
        self.emit("sqrt", node, [total])

    def _maximum(self, node, x: str, axes, keepdims: bool, shape, out: str) -> str:
        """max over ``axes``: the reduced axes moved last and both groups flattened into a
        (kept, 1, reduced, 1) tensor, whose global max pool is the maximum of each row, then the
        kept shape (with ones where the axes were, for keepdims). Exact."""
        kept = [a for a in range(len(shape)) if a not in axes]
        current = x
        if kept + list(axes) != list(range(len(shape))):
            current = self.emit("transpose", node, [x], output=self._fresh(f"{out}/reduced_last"),
                                perm=tuple(kept + list(axes)))
        rows = math.prod(shape[a] for a in kept)
        grid = self.emit("reshape", node, [current], output=self._fresh(f"{out}/rows"),
                         target=(rows, 1, math.prod(shape[a] for a in axes), 1), allowzero=False)
        pooled = self.emit("max_pool", node, [grid], output=self._fresh(f"{out}/pooled"), kernel=None, stride=(1, 1),
                           dilation=(1, 1), padding=(0, 0, 0, 0), ceil_mode=False, global_pool=True)
        target = tuple(1 if a in axes else shape[a] for a in range(len(shape))) if keepdims else \
            tuple(shape[a] for a in kept)
        return self.emit("reshape", node, [pooled], output=out, target=target, allowzero=True)

    @reads('their axes constant')
    def op_ReduceMax(self, node, attrs):
        self._extreme(node, attrs, sign=1)

    @reads('their axes constant')
    def op_ReduceMin(self, node, attrs):
        self._extreme(node, attrs, sign=-1)

    def _extreme(self, node, attrs, sign: int) -> None:
        """ReduceMax (``sign`` 1) or ReduceMin (−1, as −max(−x): exact); no axes with
        noop_with_empty_axes is the input itself."""
        reduction, out = self._reduction(node, attrs), node.output[0]
        if reduction is None:
            self.alias[out] = self.name(node.input[0])
            return
        if sign > 0:
            self._maximum(node, node.input[0], *reduction, out)
            return
        minus_one = self._const_like(node, "minus_one", np.array(-1, np.float32))
        negated = self.emit("mul", node, [node.input[0], minus_one], output=self._fresh(f"{out}/negated"), relu=False)
        largest = self._maximum(node, negated, *reduction, self._fresh(f"{out}/max"))
        self.emit("mul", node, [largest, minus_one], relu=False)

    def op_ArgMax(self, node, attrs):
        self._index_of_extreme(node, attrs, sign=1)

    def op_ArgMin(self, node, attrs):
        self._index_of_extreme(node, attrs, sign=-1)

    def _index_of_extreme(self, node, attrs, sign: int) -> None:
        """ArgMax, or ArgMin as the argmax of −x (exact): int64 indices along ``axis``, the first
        of equal extremes or with select_last_index the last."""
        self.check_flags(node, attrs, "keepdims", "select_last_index")
        x = node.input[0]
        if sign < 0:
            minus_one = self._const_like(node, "minus_one", np.array(-1, np.float32))
            x = self.emit("mul", node, [x, minus_one], output=self._fresh(f"{node.output[0]}/negated"), relu=False)
        self.emit("argmax", node, [x], axis=int(attrs.get("axis", 0)), keepdims=bool(attrs.get("keepdims", 1)),
                  last=bool(attrs.get("select_last_index", 0)))

    def op_LayerNormalization(self, node, attrs):
        """(x − mean) / sqrt(var + epsilon) · scale + B over the axes from ``axis`` on, composed of
        reduce_mean, sub, mul, add, sqrt and div (float32, as ONNX Runtime computes it); the
        optional outputs Mean and InvStdDev = 1 / sqrt(var + epsilon), with the reduced axes kept."""
        wanted = [o if len(node.output) > k and node.output[k] in self.consumed else None
                  for k, o in ((1, node.output[1] if len(node.output) > 1 else ""),
                               (2, node.output[2] if len(node.output) > 2 else ""))]
        shape = self._static_shape(self.name(node.input[0]))
        axis = int(attrs.get("axis", -1))
        if not -len(shape) <= axis < len(shape):
            raise self.fail(node, f"axis {axis} is not an axis of the input's {len(shape)}")
        epsilon = self._finite(node, attrs, "epsilon", 1e-5)
        axes = tuple(range(axis % len(shape), len(shape)))
        x, out = node.input[0], node.output[0]
        mean = self.emit("reduce_mean", node, [x], output=wanted[0] or self._fresh(f"{out}/mean"), axes=axes,
                         keepdims=True)
        centred = self.emit("sub", node, [x, mean], output=self._fresh(f"{out}/centred"), relu=False)
        square = self.emit("mul", node, [centred, centred], output=self._fresh(f"{out}/square"), relu=False)
        variance = self.emit("reduce_mean", node, [square], output=self._fresh(f"{out}/variance"), axes=axes,
                             keepdims=True)
        shifted = self.emit("add", node, [variance, self._const_like(node, "epsilon", np.array(epsilon, np.float32))],
                            output=self._fresh(f"{out}/variance_eps"), relu=False)
        deviation = self.emit("sqrt", node, [shifted], output=self._fresh(f"{out}/deviation"))
        if wanted[1]:
            self.emit("div", node, [self._const_like(node, "one", np.array(1, np.float32)), deviation],
                      output=wanted[1], relu=False)
        normal = self.emit("div", node, [centred, deviation], output=self._fresh(f"{out}/normalized"), relu=False)
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        scaled = self.emit("mul", node, [normal, node.input[1]], output=None if bias is None else
                           self._fresh(f"{out}/scaled"), relu=False)
        if bias is not None:
            self.emit("add", node, [scaled, bias], relu=False)

    def op_Identity(self, node, attrs):
        self.alias[node.output[0]] = self.name(node.input[0])

    @reads('its mask output, which exporters declare, left out where nothing reads it')
    def op_Dropout(self, node, attrs):
        # Exporters declare the mask output whether or not anything reads it: unread, it is
        # left out; read, it would be all ones (inference mode), a bool tensor gemforge has no
        # operators for.
        if len(node.output) > 1 and node.output[1] in self.consumed:
            raise self.fail(node, f"its mask output {node.output[1]!r} is read by the model; gemforge runs "
                                  "Dropout for inference, where only its first output is supported")
        # ratio is a float scalar in [0, 1) and training_mode a bool scalar: ONNX Runtime refuses
        # another type or shape (shape [1] too) when loading, and such a ratio when run.
        if len(node.input) > 1 and node.input[1]:
            ratio = self.values[self.name(node.input[1])]
            if ratio.dtype != "float32" or ratio.shape not in ((), None):     # None: computed here
                raise self.fail(node, f"the ratio must be a float32 scalar, not {ratio.dtype} of shape "
                                      f"{list(ratio.shape or ())}")
            value = self.constants.get(ratio.name)
            if value is not None and not 0 <= value < 1:
                raise self.fail(node, f"the ratio must be in [0, 1), not {float(value)}")
        if len(node.input) > 2 and node.input[2]:
            mode = self.constant(node, node.input[2], "training_mode")
            if mode.dtype != np.bool_ or mode.ndim:
                raise self.fail(node, f"the training_mode must be a bool scalar, not {mode.dtype} of shape "
                                      f"{list(mode.shape)}")
            if bool(mode):
                raise self.fail(node, "training mode is not supported (inference only)")
        self.alias[node.output[0]] = self.name(node.input[0])

    # ---------------------------------------------------------------- shape computations
    # Exporters compute shapes in the graph (PyTorch's x.view(x.size(0), -1): Shape, Gather,
    # Unsqueeze, Concat, Reshape). Every shape is static here, so these fold to constants at
    # import and reach the operators that need constant operands as constants.

    def _static_shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name``, inferred on copies of the nodes added since the last
        time (the `infer_shapes` pass later starts from the graph as imported); the shapes and
        types found are kept, so a model's shape questions cost one inference of each node."""
        if self.values[name].shape is not None:
            return tuple(self.values[name].shape)
        if name not in self._inferred:
            values = copy.deepcopy(self.values)
            for k, (shape, dtype) in self._inferred.items():
                values[k].shape, values[k].dtype = shape, dtype
            inputs = [k for k, v in values.items() if v.shape is not None and k not in self.constants]
            fresh = copy.deepcopy(self.nodes[self._inferred_nodes:])
            infer_shapes(Graph(inputs, [name], fresh, values, self.constants))
            self._inferred.update({node.output: (values[node.output].shape, values[node.output].dtype)
                                   for node in fresh})
            self._inferred_nodes = len(self.nodes)
        return tuple(self._inferred[name][0])

    def op_Shape(self, node, attrs):
        shape = self._static_shape(self.name(node.input[0]))
        rank = len(shape)
        start, end = (int(attrs.get(k, d)) for k, d in (("start", 0), ("end", rank)))
        # Negative positions count from the end; both are clamped to [0, rank] (ONNX, opset 15).
        start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
        self.add_constant(node.output[0], np.array(shape[start:end], np.int64))

    def _slice(self, node, x: str, starts, steps, counts, out: str) -> str:
        """A slice node of ``x`` (every axis given), or the tensor itself where it takes all."""
        shape = self._static_shape(self.name(x))
        if all(s == 0 and t == 1 and n == d for s, t, n, d in zip(starts, steps, counts, shape)):
            self.alias[out] = self.name(x)
            return out
        return self.emit("slice", node, [x], output=out, starts=tuple(starts), steps=tuple(steps),
                         shape=tuple(counts))

    @reads('constant indices, of any tensor')
    def op_Gather(self, node, attrs):
        indices = self.constant(node, node.input[1], "the indices")
        if indices.dtype not in (np.int32, np.int64):
            raise self.fail(node, f"the indices must be int32 or int64, not {indices.dtype}")
        data = self.constants.get(self.name(node.input[0]))
        shape = data.shape if data is not None else self._static_shape(self.name(node.input[0]))
        if not shape:
            raise self.fail(node, "the data must have at least one axis")
        axis = int(attrs.get("axis", 0))
        if not -len(shape) <= axis < len(shape):
            raise self.fail(node, f"axis {axis} is out of range for data of rank {len(shape)}")
        axis %= len(shape)
        size = shape[axis]
        if indices.size and (indices.min() < -size or indices.max() >= size):
            raise self.fail(node, f"an index is outside [-{size}, {size - 1}], the data's axis {axis}")
        if data is not None:
            self.add_constant(node.output[0], np.take(data, indices.astype(np.int64), axis=axis))
            return
        # A computed tensor (a transformer's class token, a detection head's columns): the
        # indices are constant, so the gather is slices along the axis — one with a step where
        # they advance evenly, else one per index, concatenated — then the indices' shape.
        flat = [int(i) % size for i in indices.reshape(-1)]
        if not flat:
            raise self.fail(node, "gathering no elements of a computed tensor is not supported")
        out = node.output[0]
        final = tuple(shape[:axis]) + tuple(indices.shape) + tuple(shape[axis + 1:])
        reshaped = final != tuple(shape[:axis]) + (len(flat),) + tuple(shape[axis + 1:])
        gathered = self._fresh(f"{out}/gathered") if reshaped else out
        step = flat[1] - flat[0] if len(flat) > 1 else 1
        even = step != 0 and all(b - a == step for a, b in zip(flat, flat[1:]))

        def along(start, step, count, output):
            starts, steps, counts = [0] * len(shape), [1] * len(shape), list(shape)
            starts[axis], steps[axis], counts[axis] = start, step, count
            return self._slice(node, node.input[0], starts, steps, counts, output)
        if even:
            along(flat[0], step, len(flat), gathered)
        else:
            parts = [along(i, 1, 1, self._fresh(f"{out}/index{k}")) for k, i in enumerate(flat)]
            self.emit("concat", node, parts, output=gathered, axis=axis)
        if reshaped:
            # Target 0 copies the batch axis where the gather leaves it alone.
            target = (0, *final[1:]) if axis > 0 else final
            self.emit("reshape", node, [gathered], output=out, target=target, allowzero=not (axis > 0))

    @reads('constant indices, of any tensor')
    def op_Slice(self, node, attrs):
        data = self.constants.get(self.name(node.input[0]))
        shape = data.shape if data is not None else self._static_shape(self.name(node.input[0]))
        parts = []
        for k, what in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")):
            if len(node.input) > k and node.input[k]:
                v = self.constant(node, node.input[k], f"the {what}")
                if v.dtype not in (np.int32, np.int64) or v.ndim != 1:
                    raise self.fail(node, f"the {what} must be a 1-D int32 or int64 tensor, not {v.dtype} of "
                                          f"shape {list(v.shape)}")
                parts.append([int(i) for i in v])
            else:
                parts.append(None)
        starts, ends, axes, steps = parts
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise self.fail(node, f"starts, ends, axes and steps must have one length, not {len(starts)}, "
                                  f"{len(ends)}, {len(axes)} and {len(steps)}")
        rank = len(shape)
        axes = [a + rank if a < 0 else a for a in axes]
        if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
            raise self.fail(node, f"the axes {parts[2]} must be distinct axes of the data's {rank}")
        index = [slice(None)] * rank
        first, step_of, count = [0] * rank, [1] * rank, list(shape)
        for a, start, end, step in zip(axes, starts, ends, steps):
            if step == 0:
                raise self.fail(node, "a step of 0 is not allowed")
            dim = shape[a]
            start, end = (v + dim if v < 0 else v for v in (start, end))
            # ONNX's clamping: both to [0, dim] forwards; backwards the start to [0, dim − 1] and
            # the end to [−1, dim − 1] (−1: past the first element).
            if step > 0:
                start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            else:
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[a] = slice(start, None if end < 0 else end, step)
            first[a], step_of[a], count[a] = start, step, len(range(start, end, step))
        if data is not None:
            self.add_constant(node.output[0], np.ascontiguousarray(data[tuple(index)]))
            return
        if 0 in count:
            raise self.fail(node, f"the slice of the computed tensor is empty (shape {count}); gemforge computes "
                                  "tensors of at least one element")
        self._slice(node, node.input[0], first, step_of, count, node.output[0])

    @reads('constant indices, of any tensor')
    def op_Split(self, node, attrs):
        """Each output a slice along the axis: sizes from the split input (or attribute, before
        opset 13), or equal parts (num_outputs since opset 18: the last part smaller)."""
        shape = self._static_shape(self.name(node.input[0]))
        axis = int(attrs.get("axis", 0))
        if not -len(shape) <= axis < len(shape):
            raise self.fail(node, f"axis {axis} is out of range for an input of rank {len(shape)}")
        axis %= len(shape)
        dim, outputs = shape[axis], len(node.output)
        if len(node.input) > 1 and node.input[1]:
            sizes = self.constant(node, node.input[1], "the split sizes")
            if sizes.dtype != np.int64 or sizes.ndim != 1:
                raise self.fail(node, f"split must be a 1-D int64 tensor, not {sizes.dtype} of shape {list(sizes.shape)}")
            sizes = [int(v) for v in sizes]
        elif "split" in attrs:
            sizes = [int(v) for v in attrs["split"]]
        else:
            parts = int(attrs.get("num_outputs", outputs))
            if parts != outputs:
                raise self.fail(node, f"num_outputs is {parts} but the node has {outputs} outputs")
            chunk = -(-dim // parts)
            if "num_outputs" not in attrs and dim % parts:
                raise self.fail(node, f"axis {axis} of {dim} does not split into {parts} equal parts; give split")
            sizes = [min(chunk, dim - k * chunk) for k in range(parts)]
        if len(sizes) != outputs or sum(sizes) != dim or any(v < 1 for v in sizes):
            raise self.fail(node, f"the split sizes {sizes} must be {outputs} positive sizes adding up to axis "
                                  f"{axis}'s {dim}")
        start = 0
        for size, out in zip(sizes, node.output):
            if out:
                starts, steps, counts = [0] * len(shape), [1] * len(shape), list(shape)
                starts[axis], counts[axis] = start, size
                self._slice(node, node.input[0], starts, steps, counts, out)
            start += size

    @reads('of any tensor')
    def op_Expand(self, node, attrs):
        """x broadcast against a constant shape (both ways, as ONNX's Expand): a constant folds, a
        computed tensor is multiplied by ones of that shape (exact, in int8 too)."""
        shape = self.constant(node, node.input[1], "the shape")
        if shape.dtype != np.int64 or shape.ndim != 1 or (shape < 1).any():
            raise self.fail(node, f"the shape must be a 1-D int64 tensor of positive sizes, not {shape.dtype} "
                                  f"{shape.tolist()}")
        data = self.constants.get(self.name(node.input[0]))
        if data is not None:
            try:
                target = np.broadcast_shapes(data.shape, tuple(int(d) for d in shape))
            except ValueError:
                raise self.fail(node, f"shape {shape.tolist()} does not broadcast with {list(data.shape)}") from None
            self.add_constant(node.output[0], np.ascontiguousarray(np.broadcast_to(data, target)))
            return
        self.emit("mul", node, [node.input[0], self._const_like(node, "ones", np.ones(tuple(shape), np.float32))],
                  relu=False)

    @reads('of any tensor')
    def op_Tile(self, node, attrs):
        """x repeated along each axis: a constant folds, a computed tensor is concatenated with
        itself (exact, in int8 too)."""
        repeats = self.constant(node, node.input[1], "the repeats")
        data = self.constants.get(self.name(node.input[0]))
        rank = data.ndim if data is not None else len(self._static_shape(self.name(node.input[0])))
        if repeats.dtype != np.int64 or repeats.shape != (rank,) or (repeats < 1).any():
            raise self.fail(node, f"the repeats must be {rank} positive int64 values, one per axis, not "
                                  f"{repeats.tolist()}")
        if data is not None:
            self.add_constant(node.output[0], np.tile(data, [int(r) for r in repeats]))
            return
        current, out = node.input[0], node.output[0]
        axes = [a for a, r in enumerate(repeats) if r > 1]
        if not axes:
            self.alias[out] = self.name(current)
            return
        for axis in axes:
            current = self.emit("concat", node, [current] * int(repeats[axis]), axis=axis,
                                output=out if axis == axes[-1] else self._fresh(f"{out}/axis{axis}"))

    def op_Cast(self, node, attrs):
        to = attrs.get("to")
        kinds = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT64: np.int64,
                 onnx.TensorProto.INT32: np.int32, onnx.TensorProto.BOOL: np.bool_}
        name = self.name(node.input[0])
        if name not in self.constants:
            self._static_shape(name)                 # its type inferred: float32, or int64 (an ArgMax's indices)
            kind = self._inferred[name][1] if name in self._inferred else self.values[name].dtype
            if to != {"float32": onnx.TensorProto.FLOAT, "int64": onnx.TensorProto.INT64}.get(kind):
                raise self.fail(node, f"a computed {kind} tensor can only be cast to {kind}: gemforge computes "
                                      "float32 tensors, and int64 ones only as ArgMax's and ArgMin's indices, "
                                      "which only the model's outputs read; constants cast to float32, int64, "
                                      "int32 and bool")
            self.alias[node.output[0]] = name        # to its own type: the tensor itself
            return
        if to not in kinds:
            raise self.fail(node, "constants cast to float32, int64, int32 and bool, not "
                                  f"{onnx.helper.tensor_dtype_to_string(to) if isinstance(to, int) else to!r}")
        value = self.constants[name]
        if value.dtype.kind == "f" and kinds[to] is not np.float32 and not np.isfinite(value).all():
            raise self.fail(node, "a NaN or infinite constant has no integer value")
        with np.errstate(invalid="ignore", over="ignore"):
            self.add_constant(node.output[0], value.astype(kinds[to]))

    def op_ConstantOfShape(self, node, attrs):
        shape = self.constant(node, node.input[0], "the shape")
        if shape.dtype != np.int64 or shape.ndim != 1 or (shape < 0).any():
            raise self.fail(node, f"the shape must be a 1-D int64 tensor of sizes ≥ 0, not {shape.dtype} "
                                  f"{shape.tolist()}"[:200])
        if math.prod(int(d) for d in shape) > MAX_ELEMENTS:
            raise self.fail(node, f"a constant of shape {shape.tolist()} is beyond the {MAX_ELEMENTS:,} elements "
                                  "gemforge compiles")
        if "value" in attrs:
            self.check_float32(attrs["value"], f"node {node.name or '(unnamed)'} (ConstantOfShape): its value")
            fill = numpy_helper.to_array(attrs["value"])
            if fill.size != 1:
                raise self.fail(node, f"the value must hold one element, not {fill.size}")
        else:
            fill = np.zeros(1, np.float32)
        self.add_constant(node.output[0], np.full(tuple(int(d) for d in shape), fill.reshape(-1)[0], fill.dtype))

    def op_Constant(self, node, attrs):
        if "value" in attrs:
            self.check_float32(attrs["value"], f"node {node.name or '(unnamed)'} (Constant): its value")
            self.add_constant(node.output[0], numpy_helper.to_array(attrs["value"]))
            return
        if "sparse_value" in attrs and len(attrs) == 1:
            self.add_constant(node.output[0], _densify(attrs["sparse_value"],
                                                       f"node {node.name or '(unnamed)'} (Constant): its sparse_value"))
            return
        scalar = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                  "value_ints": np.int64}
        given = [name for name in attrs if name in scalar]
        if len(given) != 1 or len(attrs) != 1:
            raise self.fail(node, f"a Constant takes one of value, sparse_value, {', '.join(scalar)}; not "
                                  f"{sorted(attrs)}")
        self.add_constant(node.output[0], np.array(attrs[given[0]], dtype=scalar[given[0]]))


#: The ONNX operators the front end takes: those `_Importer` has an ``op_<OpType>`` method for,
#: in the order they are defined there.
def _mod(a, b, fmod: int):
    if not np.all(b):
        raise GraphError("an integer modulo by zero")
    return np.fmod(a, b) if fmod else np.mod(a, b)


#: Operators exporters put in shape computations (PyTorch's floor division of a size: Div, then a
#: fix-up of Less, Xor, Mod, Equal, Not, And and Where), computed at import where every input is a
#: constant, as shapes are: (the numpy function of the inputs and attributes, its ONNX inputs).
_CONSTANT_ONLY = {
    "Less": lambda a, b, **_: np.less(a, b), "Greater": lambda a, b, **_: np.greater(a, b),
    "LessOrEqual": lambda a, b, **_: np.less_equal(a, b), "GreaterOrEqual": lambda a, b, **_: np.greater_equal(a, b),
    "Equal": lambda a, b, **_: np.equal(a, b), "Not": lambda a, **_: np.logical_not(a),
    "And": lambda a, b, **_: np.logical_and(a, b), "Or": lambda a, b, **_: np.logical_or(a, b),
    "Xor": lambda a, b, **_: np.logical_xor(a, b), "Where": lambda c, a, b, **_: np.where(c, a, b),
    "Mod": lambda a, b, fmod=0, **_: _mod(a, b, fmod),
    "Floor": lambda a, **_: np.floor(a), "Ceil": lambda a, **_: np.ceil(a),
    "Range": lambda start, limit, delta, **_: _range(start, limit, delta),
}


def _range(start, limit, delta):
    if not delta:
        raise GraphError("Range's delta must not be 0")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    if count > MAX_ELEMENTS:
        raise GraphError(f"Range would hold {count:,} elements, more than the {MAX_ELEMENTS:,} gemforge compiles")
    return (start + delta * np.arange(count)).astype(np.result_type(start, limit, delta))


def _constant_only(op_type: str):
    function = _CONSTANT_ONLY[op_type]

    def handler(self, node, attrs):
        arrays = [self.constant(node, i, f"input {i!r} (gemforge computes {op_type} of constants, such as "
                                         "shapes)") for i in node.input]
        with np.errstate(all="ignore"):
            try:
                value = function(*arrays, **attrs)
            except GraphError as exc:
                raise self.fail(node, str(exc)) from None
        self.add_constant(node.output[0], np.asarray(value))
    handler.__name__ = f"op_{op_type}"
    return reads("of constants and shapes, such as an exporter's floor division of a size; integer division "
                 "truncates, as in the runtime")(handler)


for _op_type in _CONSTANT_ONLY:
    setattr(_Importer, f"op_{_op_type}", _constant_only(_op_type))

SUPPORTED_OPS = tuple(name.removeprefix("op_") for name in vars(_Importer) if name.startswith("op_"))


def operator_list() -> str:
    """The README's list of the operators `import_onnx` reads: every handler in the order they
    are defined, each with its `reads` note (neighbours with the same note share it)."""
    groups: list[tuple[list[str], str | None]] = []
    for op in SUPPORTED_OPS:
        note = getattr(getattr(_Importer, f"op_{op}"), "reads", None)
        if groups and note is not None and groups[-1][1] == note:
            groups[-1][0].append(op)
        else:
            groups.append(([op], note))
    parts = []
    for names, note in groups:
        joined = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        parts.append(f"{joined} ({note})" if note else joined)
    return ", ".join(parts)


def import_onnx(source, *, batch: int = 1, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """The `Graph` of an ONNX model (path, bytes or `ModelProto`); a symbolic first input
    dimension becomes ``batch``, other symbolic dimensions need ``input_shapes``."""
    model, digest = _load_checked(source)       # the digest of the model as given, before any upgrade
    default = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if len(default) > 1:
        raise GraphError(f"the model imports the ONNX operator set {len(default)} times (opsets "
                         f"{', '.join(map(str, default))}); it may import it once")
    opsets = {o.domain: o.version for o in model.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx"))
    if opset is None:
        raise GraphError("the model imports no version of the ONNX operator set; gemforge reads opsets "
                         f"{OLDEST_OPSET} and newer")
    if opset < OLDEST_OPSET:
        raise GraphError(f"the model uses ONNX opset {opset}; gemforge reads opsets {OLDEST_OPSET} and newer "
                         f"(those before {MIN_OPSET} are upgraded to {MIN_OPSET} on import)")
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise GraphError(f"the model uses ONNX opset {opset}, which does not exist yet: the newest this onnx "
                         f"{onnx.__version__} knows is {newest}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise GraphError(f"batch must be a positive integer, not {batch!r}")
    if opset < MIN_OPSET:
        model = _upgrade(model, opset)
    importer = _Importer(model, batch, dict(input_shapes or {}))
    graph = importer.run()
    if batch != 1 and not graph.notes.symbolic_batch:
        if importer.fixed_first:
            # The model's first dimension is symbolic, but the shape given fixes it at another size.
            name, shape = next(iter(importer.fixed_first.items()))
            raise GraphError(f"batch {batch} applies to a symbolic first input dimension, but the shape given for "
                             f"model input {name!r}, {list(shape)}, fixes its first dimension at {shape[0]}; a "
                             f"first dimension of {batch} there stays the batch")
        raise GraphError(f"batch {batch} applies to a symbolic first input dimension, but the model's inputs have "
                         f"fixed shapes ({', '.join(f'{i}: {list(graph.values[i].shape)}' for i in graph.inputs)})")
    graph.notes.model_sha256 = digest
    graph.notes.opset = opset             # the model's own; read as MIN_OPSET when older
    return graph


def _upgrade(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` (of ONNX opset ``opset`` < `MIN_OPSET`) rewritten for `MIN_OPSET` by onnx's
    version converter, which applies each operator's documented changes between versions
    (Clip's bounds from attributes to inputs, Squeeze's axes, Softmax's 2-D coercion as
    Flatten and Reshape, ...) and is checked again after."""
    try:
        upgraded = version_converter.convert_version(model, MIN_OPSET)
        onnx.checker.check_model(upgraded)
    except Exception as exc:        # the converter's own errors are RuntimeError, ValueError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GraphError(f"the model uses ONNX opset {opset}, which gemforge upgrades to {MIN_OPSET} with onnx's "
                         f"version converter, and the converter failed: {first[:300]}") from None
    return upgraded
