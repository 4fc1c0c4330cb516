"""The ``.gfm`` artefact: a compiled network as one file, written whole and read back checked.

The artefact is a zip archive: ``manifest.json`` (format version, the input model's SHA-256,
the config, the graph with its quantization, the partition and the memory plan),
``constants.npz`` (weights and biases in the host layout) and ``programs/*.gfp`` (the
accelerator layers' programs, weights included). It holds no native code (loading a file
never runs code from it): the host layers' kernels are compiled for the CPU that runs them,
once per machine (the CPU back end's kernel cache). Reading checks the whole file before
anything runs (`_read_network`): a file that would unpack beyond what its manifest describes,
or that was changed after compiling, is refused with one sentence. `model.Model` saves and
loads through `network_to_bytes` and `network_from_bytes`.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib
from typing import Any

import numpy as np

from gemforge import __version__
from gemforge.compiler.backends.accel.layout import ceil_div, int_dtype, pack_bias, pack_matrix_b, pack_oihw
from gemforge.compiler.backends.cpu import prebuilt
from gemforge.compiler.graph.memory_plan import MemoryPlan, pack_layouts, plan_alignment, slot_key
from gemforge.compiler.graph.partition import ACCEL_OPS, AccelLayer, is_depthwise
from gemforge.compiler.ops.common import int8_clamp_steps
from gemforge.compiler.target import CPU_LEVELS, named_cpu
from gemforge.compiler.tuning import TuningError
from gemforge.compiler.tuning.log import records_from_dicts
from gemforge.compiler.ops.accel.widened import (MAX_OPERAND_SHIFT, division_by_multiply, pack_depthwise, pool_bias,
                                                 pool_weights, scaled_add_bias, scaled_add_weights)
from gemforge.compiler.graph.network import CompiledNetwork
from gemforge.compiler.graph.ir import (MAX_DIM, MAX_ELEMENTS, MAX_RANK, Graph, GraphError, GraphNotes, Node, Value,
                                        whole_number)
from gemforge.compiler.graph.operators import ATTRIBUTE_TYPES, OPERATORS
from gemforge.compiler.graph.passes import infer_shapes
from gemforge.files import npz_bytes
from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import Alu, AluOp, Load, MemType, Store, insn_bytes, mnemonic
from gemforge.hw.program import TENSOR_DTYPES, Program, ProgramError, arena_alignment


__all__ = ["ModelError", "FORMAT_VERSION", "network_to_bytes", "network_from_bytes"]

FORMAT_VERSION = 1
_TUPLE_ATTRS = ("kernel", "stride", "dilation", "padding", "shape", "target", "lshift", "perm", "squeeze", "unsqueeze",
                "axes", "pads", "starts", "steps", "indices")


class ModelError(GraphError):
    """A compiled model cannot be saved, loaded or run as asked."""


def network_to_bytes(net: CompiledNetwork) -> bytes:
    """The ``.gfm`` artefact's bytes for ``net``."""
    g = net.graph
    manifest = {
        "format": "gemforge-model", "version": FORMAT_VERSION, "gemforge": __version__,
        "dtype": net.dtype, "config": net.config.to_dict() if net.config else None,
        "model_sha256": g.notes.model_sha256,
        "graph": {
            "inputs": g.inputs, "outputs": g.outputs,
            "values": {k: {"shape": list(v.shape), "dtype": v.dtype, "exponent": v.exponent}
                       for k, v in g.values.items()},
            "nodes": [{"op": n.op, "name": n.name, "inputs": n.inputs, "output": n.output,
                       "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in n.attrs.items()},
                       "device": n.device} for n in g.nodes],
            "notes": g.notes.to_dict(),
        },
        "layers": {name: {"kind": layer.kind, "data": layer.data, "data_shape": list(layer.data_shape),
                          "out_shape": list(layer.out_shape), "plan": layer.plan,
                          "program": f"programs/{i}.gfp"}
                   for i, (name, layer) in enumerate(net.layers.items())},
        "plan": net.plan.to_dict() if net.plan else {}, "compile_seconds": net.compile_seconds,
    }
    kernels, members = prebuilt.to_archive(net.host_kernels)
    if kernels:
        manifest["host_kernels"] = kernels
    if net.tuning:
        manifest["tuning"] = net.tuning
    if net.host_target:
        manifest["host_target"] = net.host_target
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1, default=_json_default))
        # Every constant, including the weights the accelerator programs carry packed:
        # `--device cpu` runs an int8 artefact's every layer on the host.
        z.writestr("constants.npz", npz_bytes(g.constants))
        for i, layer in enumerate(net.layers.values()):
            z.writestr(f"programs/{i}.gfp", layer.program.to_bytes())
        for name, data in members.items():
            z.writestr(f"{HOST_KERNELS}/{name}", data)
    return buffer.getvalue()



def network_from_bytes(data: bytes, source: str = "model") -> CompiledNetwork:
    """The network a ``.gfm`` file's bytes hold, checked whole before anything runs
    (`_read_network`): a file that is no model, or one changed after compiling, is refused
    with one sentence."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            _check_unpacked_size(z, source)
            manifest = json.loads(z.read("manifest.json"))
            if not isinstance(manifest, dict) or manifest.get("format") != "gemforge-model":
                raise ModelError(f"{source} is not a gemforge model")
            if manifest.get("version") != FORMAT_VERSION:
                raise ModelError(f"{source} has format version {manifest.get('version')}; this gemforge reads "
                                 f"{FORMAT_VERSION}")
            try:
                net = _read_network(z, manifest, source)
            except ModelError as exc:
                raise ModelError(f"{source} is not a valid gemforge model ({exc})") from None
    except ModelError:
        raise
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError, OSError,
            KeyError, IndexError, ValueError, TypeError, AttributeError,
            ArithmeticError, RecursionError, GraphError, ProgramError) as exc:
        raise ModelError(f"{source} is not a valid gemforge model ({type(exc).__name__}: {exc})") from None
    return net


#: Most bytes a model file may unpack to (its members together): far beyond any network it
#: holds (ResNet-18's is about 50 MB), far below what would exhaust a machine's memory. Each
#: member is bounded more tightly by what the manifest says it holds (`_read_constants`,
#: `_read_layer`).
MAX_UNPACKED_BYTES = 4 << 30
#: Most bytes its JSON description may unpack to (ResNet-18's is about 30 KB).
MAX_MANIFEST_BYTES = 64 << 20


def _check_unpacked_size(archive: zipfile.ZipFile, source: str) -> None:
    """Refuse an archive whose members would unpack beyond `MAX_UNPACKED_BYTES` (a zip bomb), from
    the sizes its directory states; zipfile itself stops a member that inflates beyond them."""
    for info in archive.infolist():
        if info.filename.endswith(".json") and info.file_size > MAX_MANIFEST_BYTES:
            raise ModelError(f"{source}: {info.filename} unpacks to {info.file_size:,} bytes, more than the "
                             f"{MAX_MANIFEST_BYTES:,} a model's description may take")
    total = sum(info.file_size for info in archive.infolist())
    if total > MAX_UNPACKED_BYTES:
        raise ModelError(f"{source} unpacks to {total:,} bytes, more than the {MAX_UNPACKED_BYTES:,} a gemforge "
                         "model may hold")


def _read_network(z: zipfile.ZipFile, manifest: dict, source: str) -> CompiledNetwork:
    """The network of a model file, each part checked before the next is read: the graph (its
    tensors, constants, operators and notes), each accelerator layer's program (its size
    bounded by its node's shapes before it is read), the layers against their nodes, and the
    memory plan. Every field of the manifest is checked, but for those kept and never read:
    ``gemforge`` (the writing version), a layer's ``plan`` (its tiling, for the report) and the
    graph's ``partition`` note (the compiler's report)."""
    dtype, config = manifest["dtype"], manifest["config"]
    if dtype not in ("float32", "int8"):
        raise ModelError(f"unknown network type {str(dtype)[:40]!r}; a model is float32 or int8")
    config = None if config is None else AccelConfig.from_dict(config, source=f"{source} config")
    if config is not None and dtype != "int8":
        raise ModelError("a float32 network has no accelerator config (only an int8 network runs on the accelerator)")
    gj = manifest["graph"]
    if not (isinstance(gj, dict) and all(isinstance(gj.get(k), kind) for k, kind in (
            ("inputs", list), ("outputs", list), ("values", dict), ("nodes", list), ("notes", dict)))):
        raise ModelError("the graph must be an object of inputs, outputs (lists), values, nodes and notes")
    values = {name: _read_value(name, v) for name, v in gj["values"].items()}
    nodes = [Node(n["op"], n["name"], list(n["inputs"]), n["output"],
                  {k: tuple(v) if k in _TUPLE_ATTRS and isinstance(v, list) else v for k, v in n["attrs"].items()},
                  n["device"]) for n in gj["nodes"]]
    constants = _read_constants(z, values, gj["inputs"], nodes)
    graph = Graph(list(gj["inputs"]), list(gj["outputs"]), nodes, values, constants,
                  _read_notes(gj["notes"], list(gj["inputs"])))
    _check_graph(graph, dtype)
    accel = {node.name: node for node in graph.nodes if node.device == "accel"}
    if not isinstance(manifest["layers"], dict):
        raise ModelError("the layers must be an object of layers by node name")
    layers = {name: _read_layer(z, name, lj, accel.get(name), graph, config, source)
              for name, lj in manifest["layers"].items()}
    seconds, digest, plan = manifest.get("compile_seconds", 0.0), manifest.get("model_sha256"), manifest["plan"]
    if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < math.inf):
        raise ModelError(f"compile_seconds is {str(seconds)[:40]}; it is a number of seconds ≥ 0")
    what = GraphNotes.problem("model_sha256", digest)
    if what:
        raise ModelError(f"model_sha256 is {str(digest)[:80]!r}; it is {what}")
    if not isinstance(plan, dict):
        raise ModelError("the memory plan must be an object")
    net = CompiledNetwork(graph, dtype, config, layers, None, float(seconds), _read_host_kernels(z, manifest),
                          _read_tuning(manifest), _read_host_target(manifest))
    _check_layers(net)
    run_wide = _check_memory_plan(net, plan)
    if config is not None:
        net.plan = MemoryPlan.from_dict(plan, config, run_wide=run_wide)
    return net


def _read_host_target(manifest: dict) -> dict[str, str] | None:
    """The x86-64 level the host kernels were compiled for, if not the compiling machine's CPU."""
    named = manifest.get("host_target")
    if named is None:
        return None
    level = named.get("cpu") if isinstance(named, dict) else None
    if level not in CPU_LEVELS or set(named) != {"cpu", "features"} \
            or named["features"] != named_cpu(level).features:
        raise ModelError(f"host_target must name an x86-64 level ({', '.join(CPU_LEVELS)}) and its features, "
                         f"not {str(named)[:120]}")
    return {"cpu": level, "features": named["features"]}


def _read_tuning(manifest: dict) -> list[dict]:
    """The tuning records the model's CPU kernels were compiled with (none in older files)."""
    try:
        return [r.as_dict() for r in records_from_dicts(manifest.get("tuning", []), "the manifest's tuning")]
    except TuningError as exc:
        raise ModelError(str(exc)) from None


#: The folder of a model file that holds its host layers' compiled CPU kernels.
HOST_KERNELS = "host"


def _read_host_kernels(z: zipfile.ZipFile, manifest: dict) -> dict:
    """The host layers' compiled kernels (`backends.cpu.prebuilt`), each checked against the
    digests its index holds: a kernel changed, cut short or missing refuses the file (its native
    code would run in this process)."""
    index = manifest.get("host_kernels", {})
    if not isinstance(index, dict):
        raise ModelError("host_kernels must be an object of kernels by key")
    prefix = f"{HOST_KERNELS}/"
    names = [n for n in z.namelist() if n.startswith(prefix)]
    members = {n[len(prefix):]: z.read(n) for n in names}
    try:
        kernels = prebuilt.from_archive(index, members)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    expected = {f"{key}{suffix}" for key in kernels for suffix in (".o", ".ll.z")}
    stray = sorted(set(members) - expected)
    if stray:
        raise ModelError(f"{prefix}{stray[0]} is no host kernel the manifest lists")
    return kernels


#: The types of a graph's tensors: float32, and the int8 network's int8 tensors and int32 biases.
_VALUE_DTYPES = ("float32", "int8", "int32", "int64")


def _read_value(name: str, v) -> Value:
    """A tensor of the manifest: whole dimensions within the compiler's bounds, a type of
    `_VALUE_DTYPES`, and a scale exponent within the ``exponent`` attribute's bounds, or none."""
    shape = v.get("shape") if isinstance(v, dict) else None
    if not (isinstance(shape, list) and len(shape) <= MAX_RANK and all(whole_number(d) and d <= MAX_DIM for d in shape)
            and math.prod(shape) <= MAX_ELEMENTS):
        raise ModelError(f"tensor {name!r} has shape {str(shape)[:60]}; a shape is a list of at most {MAX_RANK} "
                         f"whole numbers up to {MAX_DIM:,}, with {MAX_ELEMENTS:,} elements at most")
    if v.get("dtype") not in _VALUE_DTYPES:
        raise ModelError(f"tensor {name!r} has type {str(v.get('dtype'))[:40]!r}; a tensor is "
                         f"{', '.join(_VALUE_DTYPES)}")
    exponent = v.get("exponent")
    if not ATTRIBUTE_TYPES["exponent"](exponent):
        raise ModelError(f"tensor {name!r} has scale exponent {str(exponent)[:40]}; an exponent is a whole "
                         "number from -126 to 127 (a scale a float32 holds), or null")
    return Value(name, tuple(shape), v["dtype"], exponent)


#: Bytes an .npy file holds beyond its data: magic, version and header length, then the header,
#: which numpy reads up to 10,000 bytes long.
_NPY_HEADER_BYTES = 12 + 10_000
#: A zip member's own records (local header, data descriptor, directory entry, Zip64 fields)
#: beyond its name, and an archive's end records with the longest comment a zip can have.
_ZIP_MEMBER_BYTES, _ZIP_END_BYTES = 256, 128 + 0xFFFF


def _read_constants(z: zipfile.ZipFile, values: dict[str, Value], inputs: list, nodes: list[Node]
                    ) -> dict[str, np.ndarray]:
    """constants.npz's arrays, each checked against the manifest before it is read. The
    constants are the tensors no node writes and no input is, so their shapes say what the
    archive and each member may unpack to: a member larger than that (a small file that
    inflates to gigabytes), of another shape or type, or of no such tensor is refused
    unread. A constant the archive lacks is found by the graph's check (`_check_graph`)."""
    written = set(inputs) | {node.output for node in nodes}
    expected = {name: value for name, value in values.items() if name not in written}
    need = {name: math.prod(v.shape) * np.dtype(v.dtype).itemsize for name, v in expected.items()}
    bound = _ZIP_END_BYTES + sum(size + _NPY_HEADER_BYTES + _ZIP_MEMBER_BYTES + 2 * len(f"{name}.npy".encode())
                                 for name, size in need.items())
    packed = z.getinfo("constants.npz").file_size
    if packed > bound:
        raise ModelError(f"constants.npz unpacks to {packed:,} bytes, more than the {bound:,} that the manifest's "
                         f"{len(expected)} constants take")
    constants: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(io.BytesIO(z.read("constants.npz"))) as npz:
        for info in npz.infolist():
            name = info.filename.removesuffix(".npy")
            value = expected.get(name) if info.filename.endswith(".npy") else None
            if value is None or name in constants:
                raise ModelError(f"constants.npz holds {info.filename[:80]!r}, which is no constant of the graph "
                                 "(a tensor that no node writes and no input is) or is there twice")
            if info.file_size > need[name] + _NPY_HEADER_BYTES:
                raise ModelError(f"constant {name!r} unpacks to {info.file_size:,} bytes, more than the "
                                 f"{need[name]:,} of the manifest's {value.dtype}{list(value.shape)} and a header")
            with npz.open(info) as member:
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(np.lib.format.read_magic(member))
                if read_header is None:
                    raise ModelError(f"constant {name!r} is not an .npy array of version 1 or 2")
                shape, _, dtype = read_header(member)
            if shape != value.shape or dtype != np.dtype(value.dtype):
                raise ModelError(f"constant {name!r} holds {dtype}{list(shape)}, but the manifest describes "
                                 f"{value.dtype}{list(value.shape)}")
            with npz.open(info) as member:
                constants[name] = np.lib.format.read_array(member, allow_pickle=False)
    return constants


def _check_graph(g: Graph, dtype: str) -> None:
    """A loaded graph is consistent before anything runs: known operators and devices, every
    tensor defined once, float32 inputs, notes of the types their readers expect, and shapes
    and types that shape inference reproduces."""
    defined = set(g.inputs) | set(g.constants)
    stored = {k: (v.shape, v.dtype) for k, v in g.values.items()}
    if not all(isinstance(name, str) and name in g.values for name in (*g.inputs, *g.outputs)) \
            or len(set(g.inputs)) != len(g.inputs):
        raise ModelError("the graph's inputs and outputs must name its tensors, each input once")
    for node in g.nodes:
        if not (isinstance(node.name, str) and isinstance(node.output, str) and isinstance(node.attrs, dict)
                and all(isinstance(i, str) for i in node.inputs)):
            raise ModelError(f"node {node.name!r}: names must be strings and attributes a table")
        for key, value in node.attrs.items():
            if not ATTRIBUTE_TYPES.get(key, lambda v: True)(value):
                raise ModelError(f"node {node.name!r}: attribute {key} = {str(value)[:40]} has the wrong type or is "
                                 "out of range")
        if node.op not in OPERATORS or node.device not in ("cpu", "accel"):
            raise ModelError(f"node {node.name!r} has an unknown operator {node.op!r} or device {node.device!r}")
        _check_attrs_present(node, OPERATORS[node.op].attrs)
        try:
            OPERATORS[node.op].check_arity(node)
        except GraphError as exc:
            raise ModelError(str(exc)) from None
        missing = [i for i in node.inputs if i not in defined or i not in g.values]
        if missing or node.output not in g.values:
            raise ModelError(f"node {node.name!r} reads undefined tensors {missing or [node.output]}")
        if node.output in defined:
            raise ModelError(f"node {node.name!r} writes tensor {node.output!r}, which an input, a constant or an "
                             "earlier node already defines")
        defined.add(node.output)
    undefined = sorted(set(g.values) - defined)
    if undefined:
        raise ModelError(f"tensor {undefined[0]!r} is no input, no constant and no node's output")
    if any(o not in defined for o in g.outputs) or any(c.shape != g.values[k].shape for k, c in g.constants.items()):
        raise ModelError("the graph's outputs or constants do not match its tensors")
    floats = [name for name in g.inputs if g.values[name].dtype != "float32"]
    if floats:   # a run feeds float32 (an int8 network quantizes its inputs itself)
        raise ModelError(f"input {floats[0]!r} is {g.values[floats[0]].dtype}; a network's inputs are float32")
    producer = g.producer()
    indices = {name for name, node in producer.items() if OPERATORS[node.op].out_dtype == "int64"}
    if any(v.dtype == "int64" and v.name not in indices for v in g.values.values()):
        raise ModelError("an int64 tensor is not the output of an index operator (argmax)")
    if dtype == "float32" and any(v.dtype not in ("float32", "int64") for v in g.values.values()):
        raise ModelError("a float32 network has an int8 or int32 tensor")
    _check_notes(g)
    infer_shapes(g)
    changed = sorted(k for k, v in g.values.items() if (v.shape, v.dtype) != stored[k])
    if changed:
        (shape, kind), v = stored[changed[0]], g.values[changed[0]]
        raise ModelError(f"the stored tensor shapes disagree with the graph's operators: {changed[0]!r} is stored as "
                         f"{kind}{list(shape)}, its operator makes {v.dtype}{list(v.shape)}")
    for node in g.nodes:
        # By the type shape inference gives the node's operand: an int8 network computes some
        # adds and products in float32 (those of its float path's results).
        if node.inputs and g.values[node.inputs[0]].dtype == "int8":
            _check_attrs_present(node, OPERATORS[node.op].int8_attrs)


#: A layer program's header (its config and a handful of tensor regions, about 1 KB), with the
#: magic number and lengths before it.
_PROGRAM_HEADER_BYTES = 1 << 16
#: Most instructions, and most micro-ops, a layer's program holds per unit of its work (an output
#: entry's reduction steps and its store), beyond a fixed allowance: a GEMM runs a micro-op or
#: more, and a LOAD or STORE moves an entry one of them reads or writes. Compiled layers hold
#: far less than one per unit, but for a small layer's fixed few.
_STEPS_PER_WORK, _FIXED_STEPS = 4, 256


def _read_layer(z: zipfile.ZipFile, name: str, lj, node: Node | None, graph: Graph, config: AccelConfig | None,
                source: str) -> AccelLayer:
    """The layer of accelerator node ``node``, its program's member checked against what the
    node's shapes let a program hold (`_program_bytes`) before it is read."""
    if node is None or not isinstance(lj, dict) or lj.get("kind") != node.op or node.op not in ACCEL_OPS:
        raise ModelError(f"layer {name[:80]!r} belongs to no accelerator node of its kind ({', '.join(ACCEL_OPS)})")
    if config is None:
        raise ModelError(f"accelerator node {name!r} has no program for the model's config")
    shapes = (lj.get("data_shape"), lj.get("out_shape"))
    if not (isinstance(lj.get("data"), str) and isinstance(lj.get("plan"), dict) and isinstance(lj.get("program"), str)
            and all(isinstance(shape, list) and all(whole_number(d) for d in shape) for shape in shapes)):
        raise ModelError(f"layer {name!r}: its data, data_shape, out_shape, plan or program is malformed")
    info = z.getinfo(lj["program"])
    bound = _program_bytes(config, graph, node)
    if info.file_size > bound:
        raise ModelError(f"accelerator node {name!r}: its program {lj['program'][:80]} unpacks to "
                         f"{info.file_size:,} bytes, more than the {bound:,} that a {node.op} of its shapes needs")
    program = Program.from_bytes(z.read(info), source=f"{source}:{lj['program']}")
    return AccelLayer(lj["kind"], program, lj["data"], tuple(lj["data_shape"]), tuple(lj["out_shape"]), lj["plan"])


def _packed_regions(config: AccelConfig, graph: Graph, node: Node) -> dict[str, tuple[tuple[int, ...], str]]:
    """The tensor regions an accelerator node's program has, by name, with the shapes and types
    its tensors pack to (`backends.accel.layout`'s table): its data first (``x`` of a
    convolution, ``a`` of a dense layer, ``x`` and ``y`` of an add), then its weights, bias
    and output (an add's weights are its operands' scaled identities, its bias the rounding
    of its shift, absent without one)."""
    b, bi, bo = config.batch, config.block_in, config.block_out
    x, y = graph.values[node.inputs[0]].shape, graph.values[node.output].shape
    if node.op in ("add", "sub"):
        (n, c, h, wd) = x
        data = (ceil_div(n, b), ceil_div(c, bi), h, wd, b, bi)
        regions = {"x": (data, "inp"), "y": (data, "inp"), "w": ((2, bo, bi), "wgt")}
        if node.attrs["shift"]:
            regions["bias"] = ((ceil_div(c, bo), b, bo), "acc")
        regions["out"] = ((ceil_div(n, b), ceil_div(c, bo), h, wd, b, bo), "out")
        return _typed(config, regions)
    if node.op in ("max_pool", "avg_pool"):
        (n, c, h, wd), (_, _, oh, ow) = x, y
        regions = {"x": ((ceil_div(n, b), ceil_div(c, bi), h, wd, b, bi), "inp"), "w": ((1, bo, bi), "wgt")}
        if node.op == "avg_pool":
            regions["bias"] = ((ceil_div(c, bo), b, bo), "acc")
        regions["out"] = ((ceil_div(n, b), ceil_div(c, bo), oh, ow, b, bo), "out")
        return _typed(config, regions)
    w = graph.values[node.inputs[1]].shape
    if node.op == "conv2d" and node.attrs["groups"] != 1:      # depthwise: a diagonal tile per block and tap
        (n, c, h, wd), (_, _, kh, kw), (_, _, oh, ow) = x, w, y
        shapes = {"x": (ceil_div(n, b), ceil_div(c, bi), h, wd, b, bi), "w": (ceil_div(c, bo), kh, kw, bo, bi),
                  "bias": (ceil_div(c, bo), b, bo), "out": (ceil_div(n, b), ceil_div(c, bo), oh, ow, b, bo)}
    elif node.op == "conv2d":
        (n, c, h, wd), (o, _, kh, kw), (_, _, oh, ow) = x, w, y
        shapes = {"x": (ceil_div(n, b), ceil_div(c, bi), h, wd, b, bi),
                  "w": (ceil_div(o, bo), ceil_div(c, bi), kh, kw, bo, bi),
                  "bias": (ceil_div(o, bo), b, bo), "out": (ceil_div(n, b), ceil_div(o, bo), oh, ow, b, bo)}
    else:
        m, (k, n) = math.prod(x[:-1]), w        # the data as a matrix: (…, K) → (M, K)
        shapes = {"a": (ceil_div(m, b), ceil_div(k, bi), b, bi), "w": (ceil_div(n, bo), ceil_div(k, bi), bo, bi),
                  "bias": (ceil_div(n, bo), b, bo), "out": (ceil_div(m, b), ceil_div(n, bo), b, bo)}
    return _typed(config, {name: (shape, buffer) for (name, shape), buffer in zip(shapes.items(), BUFFER_ROLES)})


#: The buffers a convolution's or dense layer's regions are entries of, in their order: data,
#: weights, bias (accumulator entries) and output.
BUFFER_ROLES = ("inp", "wgt", "acc", "out")


def _typed(config: AccelConfig, regions: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, tuple]:
    """Regions given by (shape, buffer) as (shape, the type of that buffer's elements)."""
    return {name: (shape, int_dtype(config.entry_layout(buffer)[2]).name) for name, (shape, buffer) in regions.items()}


def _program_bytes(config: AccelConfig, graph: Graph, node: Node) -> int:
    """The most bytes an accelerator node's program can hold: a header, instructions and
    micro-ops in proportion to the node's work, its packed weights and bias, and the zero
    blocks the compiler adds for all-padding tiles (each loaded whole into its on-chip buffer,
    so no larger than that buffer)."""
    packed = _packed_regions(config, graph, node)
    out_entries = math.prod(packed["out"][0][:-2])
    reduction = math.prod(packed["w"][0][1:-2])        # input-channel blocks × kernel taps
    if node.op in ("max_pool", "avg_pool"):
        reduction = math.prod(node.attrs["kernel"])     # a window's taps, widened and summed or compared
    steps = _STEPS_PER_WORK * out_entries * (reduction + 1) + _FIXED_STEPS
    weights = sum(math.prod(packed[k][0]) * np.dtype(packed[k][1]).itemsize for k in ("w", "bias") if k in packed)
    zeros = config.inp_buffer_bytes + config.wgt_buffer_bytes + config.acc_buffer_bytes
    return _PROGRAM_HEADER_BYTES + steps * (insn_bytes(config) + config.uop_entry_bytes) + weights + zeros


def _check_layers(net: CompiledNetwork) -> None:
    """Every accelerator node has its layer, compiled for the model's config, with the node's
    shapes, weights, epilogue (`_check_layer_matches_node`) and tensor bindings
    (`_check_layer_program`)."""
    g = net.graph
    for node in g.nodes:
        if node.device != "accel":
            continue
        layer = net.layers.get(node.name)
        if net.config is None or layer is None or layer.kind != node.op or layer.program.config != net.config:
            raise ModelError(f"accelerator node {node.name!r} has no program for the model's config")
        if any(g.values[name].dtype != "int8" for name, _ in layer.bound_inputs(node)) or \
                (node.op == "conv2d" and node.attrs["groups"] != 1 and not is_depthwise(g, node)):
            raise ModelError(f"accelerator node {node.name!r} is not an int8 {node.op} the accelerator runs (one "
                             "group or depthwise, int8 data)")
        x, y = g.values[node.inputs[0]].shape, g.values[node.output].shape
        if node.op == "dense":      # its layer takes the data as a matrix (…, K) → (M, K)
            x, y = (math.prod(x[:-1]), x[-1]), (math.prod(y[:-1]), y[-1])
        if layer.data_shape != x or layer.out_shape != y or \
                any(g.values[name].shape != x for name, _ in layer.bound_inputs(node)):
            raise ModelError(f"accelerator node {node.name!r}'s layer shapes disagree with its tensors")
        _check_layer_matches_node(g, node, layer)
        _check_layer_program(g, node, layer)


def _check_attrs_present(node: Node, required: tuple[str, ...]) -> None:
    missing = [k for k in required if k not in node.attrs]
    if missing:
        raise ModelError(f"node {node.name!r} ({node.op}) lacks attribute(s) {', '.join(missing)}")


def _check_layer_matches_node(graph: Graph, node: Node, layer: AccelLayer) -> None:
    """An accelerator layer's program computes its node as the manifest states it: the weights
    and bias it carries packed are the node's constants packed, and its requantizing STOREs
    shift and clamp by the node's ``shift`` and ``relu``. The device runs the program and the
    CPU back end the node, so a file edited in one place only would give each a different
    network without a word; it is refused, naming the node and what differs."""
    config, program = layer.program.config, layer.program
    if node.op in ("add", "sub"):
        # Its weights and bias follow from its attributes: the operands' scaled identities and
        # the rounding of its shift.
        _check_attrs_present(node, ("lshift", "shift", "relu"))
        lshift, shift = tuple(node.attrs["lshift"]), node.attrs["shift"]
        if not (len(lshift) == 2 and all(whole_number(v) and v <= MAX_OPERAND_SHIFT for v in lshift)
                and whole_number(shift) and shift <= 31):
            raise ModelError(f"accelerator node {node.name!r}: its lshift {lshift} or shift {shift} is beyond what "
                             f"the accelerator's {node.op} takes (operand shifts up to {MAX_OPERAND_SHIFT}, a shift "
                             "up to 31)")
        expected = {"w": scaled_add_weights(config, lshift, node.op == "sub")}
        if shift:
            expected["bias"] = scaled_add_bias(config, graph.values[node.output].shape[1], shift)
        sources = {"w": "its attribute lshift", "bias": "its attribute shift"}
        store = {"shift": shift, "relu": node.attrs["relu"]}
    elif node.op in ("max_pool", "avg_pool"):
        # The identity that widens the window, and an average's divisor as a multiply and shift.
        lshift = node.attrs.get("lshift", 0)
        expected, store = {"w": pool_weights(config, lshift)}, {"shift": 0, "relu": False}
        if node.op == "avg_pool":
            count = math.prod(node.attrs["kernel"])
            division = division_by_multiply(count, config.alu_imm_range[1], lshift)
            if division is None:
                raise ModelError(f"accelerator node {node.name!r} averages over {count} taps, which the accelerator "
                                 "cannot divide by exactly")
            expected["bias"] = pool_bias(config, graph.values[node.output].shape[1], count, *division)
            store["shift"] = division[1]
        sources = {"w": "the identity a pool widens by", "bias": "its window's divisor"}
    else:
        w, bias = (graph.constants.get(name) for name in node.inputs[1:3])
        if w is None or bias is None:
            raise ModelError(f"accelerator node {node.name!r} has no constant weights and bias")
        pack = pack_matrix_b if node.op == "dense" else pack_oihw if node.attrs["groups"] == 1 else pack_depthwise
        expected = {"w": pack(config, w), "bias": pack_bias(config, bias)}
        sources = {"w": f"the manifest's {node.inputs[1]!r}", "bias": f"the manifest's {node.inputs[2]!r}"}
        # Below an upper bound the ALU takes the part of the shift its immediate needs first,
        # then the bound as its MIN's immediate.
        _, cap, rest = int8_clamp_steps(node.attrs["shift"], node.attrs.get("hi", 127))
        store = {"shift": rest, "relu": node.attrs["relu"]}
        caps = {insn.imm for insn in program.instructions if isinstance(insn, Alu) and insn.op == AluOp.MIN} - {127}
        if caps != ({cap} if cap is not None else set()):
            raise ModelError(f"accelerator node {node.name!r}: its program clamps below {sorted(caps) or 'nothing'} but "
                             f"the manifest's node makes it {cap if cap is not None else 'nothing'} (its hi "
                             f"{node.attrs.get('hi', 127)}); the file was changed after compiling (compile the model "
                             "again)")
    for name, packed in expected.items():
        stored = program.constants.get(name)
        if stored is None or stored.shape != packed.shape or not np.array_equal(stored, packed):
            what = "weights" if name == "w" else "bias"
            raise ModelError(f"accelerator node {node.name!r}: the {what} packed in its program differ from "
                             f"{sources[name]}; the file was changed after compiling (compile the model again)")
    stores = [insn for insn in program.instructions if isinstance(insn, Store) and insn.requant]
    for attr, value in store.items():
        found = sorted({getattr(insn, attr) for insn in stores})
        if found != [value]:
            raise ModelError(f"accelerator node {node.name!r}: its program's {attr} is "
                             f"{', '.join(map(str, found)) or 'absent'} but the manifest's node makes it {value}; "
                             "the file was changed after compiling (compile the model again)")


#: The compiler's zero blocks (`backends.accel.emission`): a tile lying wholly in the padding is
#: loaded from the block of its buffer.
_ZERO_BLOCKS = {MemType.INP: "zeros.inp", MemType.WGT: "zeros.wgt", MemType.ACC: "zeros.acc"}


def _check_layer_program(graph: Graph, node: Node, layer: AccelLayer) -> None:
    """An accelerator layer's program reads and writes where the network puts its tensors.
    A run binds its data and output regions to the memory plan's slots, and a LOAD or STORE
    that starts in a bound region moves with it (`Program.relocated`); the others stay in the
    program's arena. So its regions are those the node's shapes pack to (`_packed_regions`,
    and the compiler's zero blocks), aligned as the compiler lays them out, and each LOAD and
    STORE lies wholly inside a region of its role: input-buffer LOADs in the data, weight
    LOADs in the weights, accumulator LOADs in the bias (each may read its buffer's zero
    block instead), micro-op LOADs in the micro-op table and STOREs in the output. A program
    edited otherwise (a region moved, a transfer's address changed) would read or write beside
    its tensors and compute other values without a word; it is refused, naming the node and
    what is inconsistent."""
    program, config = layer.program, layer.program.config

    def changed(what: str) -> ModelError:
        return ModelError(f"accelerator node {node.name!r}: {what}; the file was changed after compiling (compile "
                          "the model again)")
    expected = _packed_regions(config, graph, node)
    data = layer.inputs
    if layer.data != data[0]:
        raise changed(f"its layer's data tensor is {layer.data[:40]!r}, not the {node.op}'s {data[0]!r}")
    for name, (shape, dtype) in expected.items():
        region = program.tensors.get(name)
        if region is None or (region.shape, region.dtype) != (shape, dtype):
            found = "absent" if region is None else f"{region.dtype}{list(region.shape)}"
            raise changed(f"its program's tensor {name} is {found}, but the node's tensors pack to "
                          f"{dtype}{list(shape)}")
    zero_blocks = set(_ZERO_BLOCKS.values())
    other = sorted(set(program.tensors) - set(expected) - zero_blocks)
    if other:
        raise changed(f"its program has tensor {other[0][:40]!r}, which the compiler never makes")
    align = arena_alignment(config)
    stacked = {}      # an add's operands: one stacked tensor, ``y`` where ``x`` ends (`ops.accel.widened`)
    if len(data) == 2:
        first, second = (program.tensors[name] for name in data)
        if second.offset != first.offset + first.nbytes:
            raise changed(f"its program's tensor {second.name} does not follow {first.name}, as its stacked "
                          "operands do")
        stacked = {second.name}
    for region in program.tensors.values():
        if region.offset % align and region.name not in stacked:
            raise changed(f"its program's tensor {region.name} starts at byte {region.offset}, not at a multiple of "
                          f"the {align} bytes the compiler aligns tensors to")
    carried = set(program.constants)
    if carried - {"w", "bias"} - zero_blocks or zero_blocks & set(program.tensors) - carried:
        raise changed(f"its program carries the constants {sorted(carried)}; a layer carries its weights, its bias "
                      "and its zero blocks")
    for name in zero_blocks & carried:
        if program.constants[name].any():
            raise changed(f"its program's {name} block is not all zeros")
    try:
        program.check_loadable()
    except ProgramError as exc:
        raise changed(str(exc)) from None
    roles = {mem: (*names, block) for (mem, block), names in zip(_ZERO_BLOCKS.items(), (data, ("w",), ("bias",)))}
    uops = (program.uop_offset, program.uop_offset + len(program.uops) * config.uop_entry_bytes)
    for index, insn in enumerate(program.instructions):
        if not isinstance(insn, (Load, Store)) or not (insn.y_size and insn.x_size):
            continue
        start, end = program.dram_span(insn)
        if isinstance(insn, Load) and insn.mem == MemType.UOP:
            where, spans = "the micro-op table", [uops]
        else:
            names = ("out",) if isinstance(insn, Store) else roles.get(insn.mem, ())
            where = " or ".join(names) or "any tensor"
            spans = [(r.offset, r.offset + r.nbytes) for r in map(program.tensors.get, names) if r is not None]
        if not any(lo <= start and end <= hi for lo, hi in spans):
            raise changed(f"its instruction {index} ({mnemonic(insn)}) moves bytes {start}..{end} of its arena, "
                          f"which lie outside {where}")


def _read_notes(notes: dict[str, Any], inputs: list[str]) -> GraphNotes:
    """The graph's notes, each of the type its readers expect (`GraphNotes.from_dict`)."""
    try:
        read = GraphNotes.from_dict(notes)
    except GraphError as exc:
        raise ModelError(str(exc)) from None
    if read.symbolic_batch and "batched_inputs" not in notes:
        read.batched_inputs = list(inputs)      # files from before the note took every input as batched
    return read


def _check_notes(g: Graph) -> None:
    # A run cuts the batched inputs into chunks of their first dimension, the compiled batch.
    batched = g.notes.batched_inputs
    if not set(batched) <= set(g.inputs) or \
            len({g.values[name].shape[:1] for name in batched}) > 1 or any(g.values[n].shape[:1] in ((), (0,))
                                                                          for n in batched):
        raise ModelError("the graph's note batched_inputs must name inputs whose first dimension is the same "
                         "batch of 1 or more")


def _check_memory_plan(net: CompiledNetwork, plan: dict) -> bool:
    """The memory plan (the manifest's form) is one the compiler could have made for these layers
    (`memory_plan.pack_layouts`, `memory_plan.plan_memory`): a slot for each accelerator node's packed input and output and for
    nothing else, each with the lifetime of the nodes that use it (a run lets a later slot take
    its bytes after its last use), the size of its layout, an offset aligned as relocation by
    whole entries needs, inside an arena no larger than its slots take, and no two slots live
    at once sharing a byte. Offsets are not recomputed: any such placement runs alike.
    Returns whether the lifetimes span whole accelerator runs (a file from before runs were
    chained has per-layer ones, and runs one program per layer)."""
    if net.config is None:
        if plan:
            raise ModelError("a network without an accelerator config has a memory plan")
        return True
    peak, alignment, tensors = plan.get("peak_bytes", 0), plan.get("alignment", 1), plan.get("tensors", [])
    if not (whole_number(peak) and whole_number(alignment) and alignment > 0 and isinstance(tensors, list)
            and whole_number(plan.get("naive_bytes", 0))):
        raise ModelError("the memory plan's peak_bytes, naive_bytes, alignment or tensors are malformed")
    slots = {}
    for t in tensors:
        if not (isinstance(t, dict) and isinstance(t.get("tensor"), str) and t.get("dtype") in TENSOR_DTYPES
                and isinstance(t.get("shape"), list) and all(whole_number(d) for d in t["shape"])
                and all(whole_number(t.get(k)) for k in ("offset", "nbytes", "first", "last", "size"))
                and isinstance(t.get("produced", False), bool)):
            raise ModelError(f"the memory plan has a malformed entry {str(t)[:120]}")
        if not t["offset"] + t["nbytes"] <= peak:
            raise ModelError("the memory plan places a tensor outside its arena")
        key = slot_key(t["tensor"], (t["shape"], t["dtype"]))
        if key in slots:
            raise ModelError(f"the memory plan has two slots for {t['tensor']!r} in one layout")
        slots[key] = t
    # The lifetimes the compiler gives (`memory_plan.pack_layouts`): the accelerator nodes that
    # use a slot, widened to the accelerator runs that write it in or read it out.
    def lifetimes(run_wide: bool) -> dict[tuple, list[int]]:
        uses = {}
        for entry in pack_layouts(net.graph, net.layers, run_wide=run_wide):
            key = slot_key(entry["tensor"], (entry["shape"], entry["dtype"]))
            slot = slots.get(key)
            if slot is None or slot["nbytes"] < entry["nbytes"]:
                raise ModelError(f"the memory plan has no slot for {entry['tensor']!r} in its packed layout "
                                 f"{list(entry['shape'])} {entry['dtype']}")
            uses[key] = [entry["first"], entry["last"]]
        return uses
    uses = lifetimes(True)
    run_wide = all([t["first"], t["last"]] == uses.get(key) for key, t in slots.items())
    if not run_wide:
        per_layer = lifetimes(False)
        if all([t["first"], t["last"]] == per_layer.get(key) for key, t in slots.items()):
            uses = per_layer
    need = plan_alignment(net.config)
    if alignment != need:
        raise ModelError(f"the memory plan aligns its tensors to {alignment} bytes; config {net.config.name!r} "
                         f"needs {need} (every entry size and the bus width, so bound tensors move by whole entries)")
    for key, t in slots.items():
        life = uses.get(key)
        if life is None:
            raise ModelError(f"the memory plan has a slot for {t['tensor']!r}, which no accelerator node reads or "
                             "writes in that layout")
        if [t["first"], t["last"]] != life:
            raise ModelError(f"the memory plan keeps {t['tensor']!r} from node {t['first']} to {t['last']}, but "
                             f"the accelerator uses it from {life[0]} to {life[1]}")
        nbytes = math.prod(t["shape"]) * np.dtype(t["dtype"]).itemsize
        if t["nbytes"] != nbytes or t["size"] != ceil_div(nbytes, alignment) * alignment or t["offset"] % alignment:
            raise ModelError(f"the memory plan's slot for {t['tensor']!r} ({t['nbytes']} bytes in {t['size']} at "
                             f"offset {t['offset']}) is not the {alignment}-byte-aligned block of its {nbytes} bytes")
    # Slots live at once share no byte: checked where each lifetime begins, among the slots
    # live there (two lifetimes that meet both hold where the later one begins).
    starts: dict[int, list[dict]] = {}
    for t in slots.values():
        starts.setdefault(t["first"], []).append(t)
    live: list[dict] = []
    for step in sorted(starts):
        live = [t for t in live if t["last"] >= step] + starts[step]
        spans = sorted((t["offset"], t["offset"] + t["size"], t["tensor"]) for t in live)
        for (_, stop, first), (start, _, second) in zip(spans, spans[1:]):
            if start < stop:
                raise ModelError(f"the memory plan gives {first!r} and {second!r} the same bytes ({start}..{stop}) "
                                 f"while both are in use (at node {step})")
    # The compiler's greedy placement ends every slot at most where all slots side by side end:
    # a larger arena is one a device would allocate for nothing.
    end = max((t["offset"] + t["size"] for t in slots.values()), default=0)
    total = sum(t["size"] for t in slots.values())
    if peak != end or peak > total:
        raise ModelError(f"the memory plan's arena of {peak:,} bytes is not what its slots take: they end at byte "
                         f"{end:,} and take {total:,} bytes side by side")
    return run_wide


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__} in the manifest")
