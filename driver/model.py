"""Whole networks: compile an ONNX model, save it as one ``.gfm`` file, run it on any device.

``compile_model(model, quantize="int8", calibrate=samples, config="default")`` runs
the graph compiler (`gemforge.compiler.graph`) and returns a `Model`;
``model.save("net.gfm")`` writes the artefact, ``Model.load`` reads it, and
``model.run(x, device=...)`` runs it:

- ``cpu`` (and ``gpu`` for a float32 network): every node on the LLVM back end;
  an int8 network computes exactly what the accelerator computes;
- ``fsim``, ``verilator``, ``icarus`` (int8 networks compiled for a config): the
  accelerator's layers run on that device, one program each, reading and writing
  their packed tensors at the memory plan's offsets in one activation arena in
  device DRAM (a layer's output is the next layer's input in place); the other
  layers run on the CPU back end, with the tensor copied out of and back into
  device DRAM around them.

Inputs and outputs are the ONNX model's (float32, its layouts). A model compiled
with a symbolic batch dimension runs any multiple of its compiled batch, in
chunks.

The artefact is a zip archive: ``manifest.json`` (format version, the input
model's SHA-256, the config, the graph with its quantization, the partition and
the memory plan), ``constants.npz`` (weights and biases in the host layout) and
``programs/*.gfp`` (the accelerator layers' programs, weights included). The
host layers' code is compiled when the model is first run on a host, for that
host's CPU.
"""

from __future__ import annotations

import io
import json
import math
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gemforge import __version__
from gemforge.compiler.graph.accel import AccelLayer, slot_key
from gemforge.compiler.graph.batch import batched_values
from gemforge.compiler.graph.compile import CompiledNetwork, compile_network
from gemforge.compiler.graph.cpu_kernels import HostKernel, host_kernel
from gemforge.compiler.graph.ir import BINARY_OPS, OPS, Graph, GraphError, Node, Value
from gemforge.compiler.graph.passes import infer_shapes
from gemforge.compiler.target import target_of
from gemforge.files import check_regular_input, npz_bytes, write_bytes_atomic
from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import insn_bytes
from gemforge.hw.program import Program, ProgramError

from .device import Buffer, Device, open_device

__all__ = ["Model", "ModelError", "compile_model", "ACCEL_DEVICES", "HOST_DEVICES", "FORMAT_VERSION"]

FORMAT_VERSION = 1
ACCEL_DEVICES = ("fsim", "verilator", "icarus")
HOST_DEVICES = ("cpu", "gpu")
_TUPLE_ATTRS = ("kernel", "stride", "dilation", "padding", "shape", "target", "lshift", "perm", "squeeze", "unsqueeze",
                "axes", "pads")


class ModelError(GraphError):
    """A compiled model cannot be saved, loaded or run as asked."""


def compile_model(model, *, quantize: str | None = None, calibrate=None, config=None, batch: int = 1,
                  input_shapes=None, trace=None, report=None) -> Model:
    """Compile an ONNX model (path, bytes or `onnx.ModelProto`) into a `Model`.

    ``quantize="int8"`` with ``calibrate`` (sample inputs stacked on a new first axis)
    builds the int8 network; ``config`` (preset, file or `AccelConfig`) puts its layers
    on that accelerator where it can run them. ``trace`` receives the graph after
    every pass, ``report`` the partition and the memory plan."""
    net = compile_network(model, quantize_to=quantize, calibration=calibrate, config=config, batch=batch,
                          input_shapes=input_shapes, trace=trace, report=report)
    return Model(net)


@dataclass
class LayerProfile:
    """One node of a run: where it ran and what it cost."""

    node: str
    op: str
    device: str
    seconds: float
    cycles: int | None = None
    gemm_utilization: float | None = None
    macs: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {"node": self.node, "op": self.op, "device": self.device, "seconds": round(self.seconds, 6),
               "macs": self.macs}
        if self.cycles is not None:
            out["cycles"] = self.cycles
        if self.gemm_utilization is not None:
            out["gemm_utilization"] = round(self.gemm_utilization, 4)
        return out


def _macs(graph: Graph, node: Node) -> int:
    if node.op == "conv2d":
        w = graph.values[node.inputs[1]].shape
        out = graph.values[node.output].shape
        return int(np.prod(out)) * w[1] * w[2] * w[3]
    if node.op == "dense":
        x = graph.values[node.inputs[0]].shape
        return int(np.prod(x)) * graph.values[node.inputs[1]].shape[1]
    return 0


class Model:
    """A compiled network, ready to save or run."""

    def __init__(self, net: CompiledNetwork) -> None:
        self.net = net
        self._kernels: dict[str, dict[str, HostKernel]] = {}
        self._cpu: Device | None = None
        self.last_profile: list[LayerProfile] = []
        self._readers: set[str] | None = None

    # ------------------------------------------------------------------ facts

    @property
    def graph(self) -> Graph:
        return self.net.graph

    @property
    def dtype(self) -> str:
        return self.net.dtype

    @property
    def config(self) -> AccelConfig | None:
        return self.net.config

    @property
    def inputs(self) -> dict[str, tuple[int, ...]]:
        return {name: self.graph.values[name].shape for name in self.graph.inputs}

    @property
    def outputs(self) -> list[str]:
        return list(self.graph.outputs)

    def summary(self) -> dict[str, Any]:
        g = self.graph
        out = {"dtype": self.dtype, "config": self.config.name if self.config else None,
               "inputs": {k: list(v) for k, v in self.inputs.items()}, "outputs": self.outputs,
               "nodes": len(g.nodes), "accelerator_nodes": sum(n.device == "accel" for n in g.nodes),
               "model_sha256": g.notes.get("model_sha256"), "compile_seconds": round(self.net.compile_seconds, 3)}
        if "memory" in g.notes:
            out["memory"] = g.notes["memory"]
        if "coarser_weights" in g.notes:
            out["coarser_weights"] = g.notes["coarser_weights"]
        return out

    # ------------------------------------------------------------------ running

    def run(self, inputs, device: str | Device = "cpu", *, progress: Callable[[int, int], None] | None = None,
            **device_options):
        """Run the network on ``inputs`` (an array for a one-input model, else a dict by
        name; float32 in the ONNX model's layout) on ``device`` (a name or an open
        `Device`, opened with ``device_options``). Returns the output array (a dict by name
        for several outputs); the per-node costs of the last chunk are in ``last_profile``;
        ``progress(done, total)`` is called after each batch chunk."""
        feeds = self._feeds(inputs)
        chunks = self._chunks(feeds)
        own, dev = self._open(device, device_options)
        try:
            results = []
            for i, chunk in enumerate(chunks):
                results.append(self._run_once(chunk, dev))
                if progress:
                    progress(i + 1, len(chunks))
        finally:
            if own:
                dev.close()
        # An output computed without the batched inputs is the same in every chunk.
        batched = batched_values(self.graph, self._batched_inputs()) if len(results) > 1 else set()
        outputs = {name: np.concatenate([r[name] for r in results]) if name in batched else results[0][name]
                   for name in self.outputs}
        return outputs[self.outputs[0]] if len(outputs) == 1 else outputs

    def _feeds(self, inputs) -> dict[str, np.ndarray]:
        if not isinstance(inputs, dict):
            if len(self.graph.inputs) != 1:
                raise ModelError(f"the model has inputs {', '.join(self.graph.inputs)}; pass a dict by name (on the "
                                 "command line, a .npz of arrays by input name)")
            inputs = {self.graph.inputs[0]: inputs}
        feeds = {}
        for name, shape in self.inputs.items():
            if name not in inputs:
                raise ModelError(f"missing input {name!r} (the model takes {', '.join(self.inputs)})")
            array = np.asarray(inputs[name])
            if array.dtype.kind not in "fiu":
                raise ModelError(f"input {name!r} must be numeric, not {array.dtype}")
            with np.errstate(over="ignore"):     # a float64 beyond float32's range becomes inf, refused below
                array = array.astype(np.float32, copy=False)
            if self.dtype == "int8" and array.size and not np.isfinite(array).all():
                raise ModelError(f"input {name!r} holds NaN or infinite values (as float32), which int8 cannot "
                                 "represent")
            feeds[name] = array
        unknown = set(inputs) - set(self.inputs)
        frozen = sorted(unknown & set(self.graph.notes.get("frozen_inputs", ())))
        if frozen:
            raise ModelError(f"input(s) {', '.join(frozen)} are initializers the ONNX model also lists as inputs; "
                             f"gemforge compiles them as the constants they hold, so the model takes "
                             f"{', '.join(self.inputs)} (remove them from the feeds, or recompile a model in which "
                             "they are plain inputs)")
        if unknown:
            raise ModelError(f"unknown input(s) {', '.join(sorted(unknown))}; the model takes {', '.join(self.inputs)}")
        return feeds

    def _batched_inputs(self) -> list[str]:
        notes = self.graph.notes
        # Files from before the note: every input was taken as batched.
        return list(notes.get("batched_inputs", self.inputs if notes.get("symbolic_batch") else ()))

    def _chunks(self, feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """The runs that make up ``feeds``: the inputs with a symbolic batch dimension may hold
        any multiple of the compiled batch, run a batch at a time (the other inputs go whole
        to every run), where the network keeps the items apart (`batch.batch_mixing`)."""
        notes = self.graph.notes
        batched = set(self._batched_inputs())
        counts = set()
        for name, shape in self.inputs.items():
            array = feeds[name]
            if array.shape == tuple(shape):
                if name in batched:
                    counts.add(1)
            elif name in batched and array.ndim == len(shape) and \
                    array.shape[1:] == tuple(shape[1:]) and array.shape[0] % shape[0] == 0 and array.shape[0]:
                counts.add(array.shape[0] // shape[0])
            else:
                allowed = (f"{list(shape)}, or a multiple of its batch {shape[0]}" if name in batched
                           else f"{list(shape)}")
                raise ModelError(f"input {name!r} has shape {list(array.shape)}; the model was compiled for {allowed}")
        if len(counts) > 1:
            raise ModelError("the batched inputs hold different numbers of batches: "
                             + ", ".join(f"{name!r} {feeds[name].shape[0]} items" for name in self.inputs
                                         if name in batched))
        n = counts.pop() if counts else 1
        if n > 1 and notes.get("batch_mixing"):
            size = self.inputs[next(name for name in self.inputs if name in batched)][0]
            raise ModelError(f"the model was compiled for batch {size} and cannot run {n * size} items a batch at a "
                             f"time: {notes['batch_mixing']}; compile it with --batch {n * size}")
        return [{name: feeds[name][i * shape[0]:(i + 1) * shape[0]] if n > 1 and name in batched else feeds[name]
                 for name, shape in self.inputs.items()} for i in range(n)]

    def _open(self, device, options) -> tuple[bool, Any]:
        if not isinstance(device, str):
            kind = getattr(device, "kind", None)
            if kind is None or not hasattr(device, "run_program"):
                raise ModelError(f"device must be a name ({', '.join(ACCEL_DEVICES + HOST_DEVICES)}) or an open "
                                 f"device, not {device!r}")
            self._check_device(kind if kind in HOST_DEVICES else "accel", device)
            return False, device
        if device.startswith("uart:"):       # a board with the board top, through its UART bridge
            self._check_device("accel", None, device)
            return True, open_device(device, self.config, **options)
        if device not in ACCEL_DEVICES + HOST_DEVICES:
            raise ModelError(f"unknown device {device!r}; choose one of {', '.join(ACCEL_DEVICES + HOST_DEVICES)} "
                             "or uart:PORT[@BAUD]")
        self._check_device(device if device in HOST_DEVICES else "accel", None, device)
        if device in ACCEL_DEVICES:
            if device != "fsim":   # the simulated DRAM window holds the arena and one layer's program
                options.setdefault("sim_dram_bytes", self._sim_dram_bytes())
            return True, open_device(device, self.config, **options)
        return True, open_device(device, **options)

    def _check_device(self, kind: str, dev, name: str | None = None) -> None:
        if kind == "accel":
            if self.config is None:
                raise ModelError(f"this {self.dtype} network was compiled without an accelerator config; run it on "
                                 "the cpu" + (" or gpu" if self.dtype == "float32" else "") +
                                 " (compile with --quantize int8 --config CFG for the accelerator)")
            if dev is not None and dev.config != self.config:
                raise ModelError(f"the device runs config {dev.config.name!r}; the model was compiled for "
                                 f"{self.config.name!r}")
        elif kind == "gpu" and self.dtype == "int8":
            raise ModelError("int8 networks run on the cpu or the accelerator devices; the gpu runs float32 networks")

    def _sim_dram_bytes(self) -> int:
        programs = sum(layer.program.arena_bytes + len(layer.program.instructions) * insn_bytes(layer.program.config)
                       for layer in self.net.layers.values())
        largest = max((layer.program.arena_bytes for layer in self.net.layers.values()), default=0)
        need = self.net.plan.get("peak_bytes", 0) + min(programs, 2 * largest + (1 << 20)) + (1 << 20)
        return max(16 << 20, 1 << (need - 1).bit_length())

    def _host_kernel(self, node: Node, target_kind: str) -> HostKernel:
        """``node`` compiled for a host target (once per model and target). Keyed by the tensor
        it writes, which no other node writes (a model file from before node names were made
        unique may repeat a name)."""
        kernels = self._kernels.setdefault(target_kind, {})
        if node.output not in kernels:
            kernels[node.output] = host_kernel(self.graph, node, target_of(target_kind))
        return kernels[node.output]

    def _cpu_device(self):
        if self._cpu is None:
            self._cpu = open_device("cpu")
        return self._cpu

    def _run_once(self, feeds: dict[str, np.ndarray], dev) -> dict[str, np.ndarray]:
        graph = self.graph
        on_accel = not (getattr(dev, "kind", None) in HOST_DEVICES)
        host_kind = dev.kind if not on_accel else "cpu"
        host_dev = dev if not on_accel else self._cpu_device()
        env: dict[str, np.ndarray] = dict(graph.constants)
        env.update(feeds)
        profile: list[LayerProfile] = []
        arena = None
        resident: dict[tuple, Buffer] = {}   # (tensor, packed shape, dtype) → its buffer, when valid
        slots: dict[tuple, dict] = {}
        if on_accel:
            slots = {slot_key(t["tensor"], (t["shape"], t["dtype"])): t for t in self.net.plan.get("tensors", [])}
            if slots:
                arena = dev.alloc(self.net.plan["peak_bytes"], align=max(4096, self.net.plan["alignment"]))
        try:
            for step, node in enumerate(graph.nodes):
                start = time.perf_counter()
                if on_accel and node.device == "accel":
                    row = self._run_accel(step, node, dev, env, arena, slots, resident)
                else:
                    args = [env[name] for name in node.inputs]
                    env[node.output], result = self._host_kernel(node, host_kind).run(host_dev, args)
                    row = LayerProfile(node.name, node.op, host_kind if result is not None else "host (data)",
                                       0.0, macs=_macs(graph, node))
                row.seconds = time.perf_counter() - start
                profile.append(row)
            outputs = {name: env[name] for name in graph.outputs}
        finally:
            if arena is not None:
                dev.free(arena)
        self.last_profile = profile
        return outputs

    def _host_readers(self) -> set[str]:
        """Accelerator outputs the host needs: those a host node or the caller reads, and
        those a later accelerator node reads in another packed layout (through the host)."""
        if self._readers is None:
            readers = set(self.graph.outputs)
            layers = self.net.layers
            produced = {n.output: layers[n.name].packed_out for n in self.graph.nodes if n.device == "accel"}
            for node in self.graph.nodes:
                if node.device != "accel":
                    readers.update(node.inputs)
                elif node.inputs[0] in produced and produced[node.inputs[0]] != layers[node.name].packed_in:
                    readers.add(node.inputs[0])
            self._readers = readers
        return self._readers

    def _run_accel(self, step, node, dev, env, arena, slots, resident) -> LayerProfile:
        layer = self.net.layers[node.name]
        out_shape, out_dtype = layer.packed_out
        in_key = slot_key(node.inputs[0], layer.packed_in)
        out_key = slot_key(node.output, layer.packed_out)

        def buffer(key) -> Buffer:
            slot = slots[key]
            return Buffer(arena.address + slot["offset"], slot["nbytes"])
        if in_key not in resident:
            host = env[node.inputs[0]]     # on the host: `_host_readers` copied it out if a layer made it
            buf = buffer(in_key)
            dev.write(buf, layer.pack(host))
            resident[in_key] = buf
        out_buf = buffer(out_key)
        loaded = dev.load_program(layer.program, {layer.data: resident[in_key], "out": out_buf})
        try:
            result = dev.run(loaded)
        finally:
            dev.unload_program(loaded)
        # The plan reuses the space of tensors no later accelerator node reads.
        for key in list(resident):
            if slots[key]["last"] <= step:
                del resident[key]
        resident[out_key] = out_buf
        if node.output in self._host_readers():
            # Copied out now: a later layer may reuse the space before the host reads it.
            env[node.output] = layer.unpack(dev.read(out_buf, out_dtype, out_shape)).reshape(
                self.graph.values[node.output].shape)   # a dense layer's (M, N) as the graph's (…, N)
        row = LayerProfile(node.name, node.op, dev.kind, 0.0, cycles=result.cycles, macs=_macs(self.graph, node),
                           counters=dict(result.counters))
        hw = result.hw_counters
        if result.cycles:
            row.gemm_utilization = (hw.get("gemm_active", 0) - hw.get("gemm_reset", 0)) / result.cycles
        return row

    # ------------------------------------------------------------------ the artefact

    def to_bytes(self) -> bytes:
        g = self.graph
        manifest = {
            "format": "gemforge-model", "version": FORMAT_VERSION, "gemforge": __version__,
            "dtype": self.dtype, "config": self.config.to_dict() if self.config else None,
            "model_sha256": g.notes.get("model_sha256"),
            "graph": {
                "inputs": g.inputs, "outputs": g.outputs,
                "values": {k: {"shape": list(v.shape), "dtype": v.dtype, "exponent": v.exponent}
                           for k, v in g.values.items()},
                "nodes": [{"op": n.op, "name": n.name, "inputs": n.inputs, "output": n.output,
                           "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in n.attrs.items()},
                           "device": n.device} for n in g.nodes],
                "notes": {k: v for k, v in g.notes.items()},
            },
            "layers": {name: {"kind": layer.kind, "data": layer.data, "data_shape": list(layer.data_shape),
                              "out_shape": list(layer.out_shape), "plan": layer.plan,
                              "program": f"programs/{i}.gfp"}
                       for i, (name, layer) in enumerate(self.net.layers.items())},
            "plan": self.net.plan, "compile_seconds": self.net.compile_seconds,
        }
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1, default=_json_default))
            # Every constant, including the weights the accelerator programs carry packed:
            # `--device cpu` runs an int8 artefact's every layer on the host.
            z.writestr("constants.npz", npz_bytes(g.constants))
            for i, layer in enumerate(self.net.layers.values()):
                z.writestr(f"programs/{i}.gfp", layer.program.to_bytes())
        return buffer.getvalue()

    def save(self, path: str | Path) -> None:
        """Write the artefact (atomically: an existing file is replaced only once the new one is complete)."""
        write_bytes_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | Path) -> Model:
        path = Path(path)
        try:
            check_regular_input(path)
            data = path.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read model {path}: {exc.strerror}") from None
        return cls.from_bytes(data, source=str(path))

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "model") -> Model:
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                _check_unpacked_size(z, source)
                manifest = json.loads(z.read("manifest.json"))
                if not isinstance(manifest, dict) or manifest.get("format") != "gemforge-model":
                    raise ModelError(f"{source} is not a gemforge model")
                if manifest.get("version") != FORMAT_VERSION:
                    raise ModelError(f"{source} has format version {manifest.get('version')}; this gemforge reads "
                                     f"{FORMAT_VERSION}")
                with np.load(io.BytesIO(z.read("constants.npz")), allow_pickle=False) as npz:
                    _check_unpacked_size(npz.zip, f"{source}:constants.npz")
                    constants = {k: npz[k] for k in npz.files}
                config = AccelConfig.from_dict(manifest["config"], source=f"{source} config") \
                    if manifest["config"] else None
                gj = manifest["graph"]
                values = {k: Value(k, tuple(int(d) for d in v["shape"]), str(v["dtype"]),
                                   None if v["exponent"] is None else int(v["exponent"]))
                          for k, v in gj["values"].items()}
                nodes = [Node(n["op"], n["name"], list(n["inputs"]), n["output"],
                              {k: tuple(v) if k in _TUPLE_ATTRS and isinstance(v, list) else v
                               for k, v in n["attrs"].items()}, n["device"]) for n in gj["nodes"]]
                graph = Graph(list(gj["inputs"]), list(gj["outputs"]), nodes, values, constants, dict(gj["notes"]))
                layers = {}
                for name, lj in manifest["layers"].items():
                    program = Program.from_bytes(z.read(lj["program"]), source=f"{source}:{lj['program']}")
                    layers[name] = AccelLayer(lj["kind"], program, lj["data"], tuple(lj["data_shape"]),
                                              tuple(lj["out_shape"]), lj["plan"])
                net = CompiledNetwork(graph, str(manifest["dtype"]), config, layers, dict(manifest["plan"]),
                                      float(manifest.get("compile_seconds", 0.0)))
                try:
                    _check_network(net)
                except ModelError as exc:
                    raise ModelError(f"{source} is not a valid gemforge model ({exc})") from None
        except ModelError:
            raise
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError, OSError,
                KeyError, IndexError, ValueError, TypeError, AttributeError,
                ArithmeticError, RecursionError, GraphError, ProgramError) as exc:
            raise ModelError(f"{source} is not a valid gemforge model ({type(exc).__name__}: {exc})") from None
        return cls(net)


#: Most bytes a model file may unpack to (its members together): far beyond any network it
#: holds (ResNet-18's is about 50 MB), far below what would exhaust a machine's memory.
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


def _check_network(net: CompiledNetwork) -> None:
    """A loaded network is consistent before anything runs: known operators and devices,
    every tensor defined, shapes that shape inference reproduces, a layer for every
    accelerator node and a memory plan that holds its tensors."""
    g = net.graph
    if net.dtype not in ("float32", "int8"):
        raise ModelError(f"unknown network type {net.dtype!r}")
    defined = set(g.inputs) | set(g.constants)
    stored = {k: v.shape for k, v in g.values.items()}
    for node in g.nodes:
        if not (isinstance(node.name, str) and isinstance(node.output, str) and isinstance(node.attrs, dict)
                and all(isinstance(i, str) for i in node.inputs)):
            raise ModelError(f"node {node.name!r}: names must be strings and attributes a table")
        for key, value in node.attrs.items():
            if not _ATTR_TYPES.get(key, lambda v: True)(value):
                raise ModelError(f"node {node.name!r}: attribute {key} = {str(value)[:40]} has the wrong type or is "
                                 "out of range")
        _check_attrs_present(node, _REQUIRED_ATTRS)
        if node.op not in OPS or node.device not in ("cpu", "accel"):
            raise ModelError(f"node {node.name!r} has an unknown operator {node.op!r} or device {node.device!r}")
        missing = [i for i in node.inputs if i not in defined or i not in g.values]
        if missing or node.output not in g.values:
            raise ModelError(f"node {node.name!r} reads undefined tensors {missing or [node.output]}")
        if node.device == "accel":
            layer = net.layers.get(node.name)
            if net.config is None or layer is None or layer.kind != node.op or layer.program.config != net.config:
                raise ModelError(f"accelerator node {node.name!r} has no program for the model's config")
            if layer.data_shape != g.values[node.inputs[0]].shape or layer.out_shape != g.values[node.output].shape:
                raise ModelError(f"accelerator node {node.name!r}'s layer shapes disagree with its tensors")
            _check_layer_matches_node(g, node, layer)
        if node.output in defined:
            raise ModelError(f"node {node.name!r} writes tensor {node.output!r}, which an input, a constant or an "
                             "earlier node already defines")
        defined.add(node.output)
    for key in ("batched_inputs", "frozen_inputs"):
        names = g.notes.get(key, [])
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise ModelError(f"the graph's note {key} must be a list of input names")
    if any(o not in defined for o in g.outputs) or any(c.shape != g.values[k].shape for k, c in g.constants.items()):
        raise ModelError("the graph's outputs or constants do not match its tensors")
    infer_shapes(g)
    if any(g.values[k].shape != shape for k, shape in stored.items()):
        raise ModelError("the stored tensor shapes disagree with the graph's operators")
    for node in g.nodes:
        # By the type shape inference gives the node's operand: an int8 network computes some
        # adds and products in float32 (those of its float path's results).
        if node.inputs and g.values[node.inputs[0]].dtype == "int8":
            _check_attrs_present(node, _INT8_ATTRS)
    _check_memory_plan(net)


def _check_attrs_present(node: Node, required: dict[str, tuple[str, ...]]) -> None:
    missing = [k for k in required.get(node.op, ()) if k not in node.attrs]
    if missing:
        raise ModelError(f"node {node.name!r} ({node.op}) lacks attribute(s) {', '.join(missing)}")


def _check_layer_matches_node(graph: Graph, node: Node, layer: AccelLayer) -> None:
    """An accelerator layer's program computes its node as the manifest states it: the weights
    and bias it carries packed are the node's constants packed, and its requantizing STOREs
    shift and clamp by the node's ``shift`` and ``relu``. The device runs the program and the
    CPU back end the node, so a file edited in one place only would give each a different
    network without a word; it is refused, naming the node and what differs."""
    from gemforge.compiler.backends.accel.layout import pack_bias, pack_matrix_b, pack_oihw
    from gemforge.hw.isa import Store
    config, program = layer.program.config, layer.program
    w, bias = (graph.constants.get(name) for name in node.inputs[1:3])
    if w is None or bias is None:
        raise ModelError(f"accelerator node {node.name!r} has no constant weights and bias")
    expected = {"w": (pack_oihw if node.op == "conv2d" else pack_matrix_b)(config, w), "bias": pack_bias(config, bias)}
    for name, packed in expected.items():
        stored = program.constants.get(name)
        if stored is None or stored.shape != packed.shape or not np.array_equal(stored, packed):
            what = "weights" if name == "w" else "bias"
            raise ModelError(f"accelerator node {node.name!r}: the {what} packed in its program differ from "
                             f"the manifest's {node.inputs[1 if name == 'w' else 2]!r}; the file was changed "
                             "after compiling (compile the model again)")
    stores = [insn for insn in program.instructions if isinstance(insn, Store) and insn.requant]
    for attr in ("shift", "relu"):
        found = sorted({getattr(insn, attr) for insn in stores})
        if found != [node.attrs[attr]]:
            raise ModelError(f"accelerator node {node.name!r}: its program's {attr} is "
                             f"{', '.join(map(str, found)) or 'absent'} but the manifest's is {node.attrs[attr]}; "
                             "the file was changed after compiling (compile the model again)")


def _integers(value, minimum: int | None = None, maximum: int | None = None) -> bool:
    """An integer (or a tuple of them, or None: not set), each in ``minimum..maximum``."""
    values = value if isinstance(value, tuple) else () if value is None else (value,)
    return all(isinstance(v, int) and not isinstance(v, bool) and (minimum is None or v >= minimum)
               and (maximum is None or v <= maximum) for v in values)


#: The types of the graph's operator attributes a run relies on (a loaded model's are checked).
_ATTR_TYPES: dict[str, Callable[[Any], bool]] = {
    **{k: lambda v: _integers(v, 1) for k in ("stride", "kernel", "groups", "dilation")},
    **{k: lambda v: _integers(v, 0) for k in ("padding", "perm", "squeeze", "unsqueeze", "axes", "pads")},
    **{k: _integers for k in ("axis", "flatten_axis", "shape")},
    # Shifts of int64 arithmetic, and scales 2^-e a float32 can hold.
    **{k: lambda v: _integers(v, 0, 62) for k in ("shift", "lshift")},
    "exponent": lambda v: _integers(v, -126, 127),
    **{k: lambda v: isinstance(v, bool) for k in ("relu", "ceil_mode", "count_include_pad", "keepdims")},
    **{k: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
       for k in ("lo", "hi", "epsilon", "alpha", "value")},
}


#: The attributes a run reads of each operator (`cpu_kernels`, `evaluate`), and those of an int8 graph.
_REQUIRED_ATTRS: dict[str, tuple[str, ...]] = {
    "conv2d": ("stride", "padding", "groups", "relu"), "dense": ("relu",), **{op: ("relu",) for op in BINARY_OPS},
    "clip": ("lo", "hi"), "leaky_relu": ("alpha",), "max_pool": ("kernel", "stride", "padding"),
    "avg_pool": ("kernel", "stride", "padding"), "reshape": ("shape",), "transpose": ("perm",),
    "pad": ("pads", "value"), "concat": ("axis",), "softmax": ("axis",), "reduce_mean": ("axes", "keepdims"),
    "batch_norm": ("epsilon",),
    "quantize": ("exponent",), "dequantize": ("exponent",), "requantize": ("shift",),
}
_INT8_ATTRS: dict[str, tuple[str, ...]] = {"conv2d": ("shift",), "dense": ("shift",),
                                           **{op: ("lshift", "shift") for op in ("add", "sub", "mul")}}


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_memory_plan(net: CompiledNetwork) -> None:
    """The memory plan's entries are well formed, inside the arena, and give every accelerator
    node's input and output a slot large enough for its packed layout (what a run looks up)."""
    plan = net.plan
    peak, alignment, tensors = plan.get("peak_bytes", 0), plan.get("alignment", 1), plan.get("tensors", [])
    if not (_whole(peak) and _whole(alignment) and alignment > 0 and isinstance(tensors, list)):
        raise ModelError("the memory plan's peak_bytes, alignment or tensors are malformed")
    slots = {}
    for t in tensors:
        if not (isinstance(t, dict) and isinstance(t.get("tensor"), str) and isinstance(t.get("dtype"), str)
                and isinstance(t.get("shape"), list) and all(_whole(d) for d in t["shape"])
                and all(_whole(t.get(k)) for k in ("offset", "nbytes", "first", "last"))):
            raise ModelError(f"the memory plan has a malformed entry {str(t)[:120]}")
        if not t["offset"] + t["nbytes"] <= peak:
            raise ModelError("the memory plan places a tensor outside its arena")
        slots[slot_key(t["tensor"], (t["shape"], t["dtype"]))] = t
    for node in net.graph.nodes:
        if node.device != "accel":
            continue
        layer = net.layers[node.name]
        for tensor, (shape, dtype) in ((node.inputs[0], layer.packed_in), (node.output, layer.packed_out)):
            slot = slots.get(slot_key(tensor, (shape, dtype)))
            if slot is None or slot["nbytes"] < math.prod(shape) * np.dtype(dtype).itemsize:
                raise ModelError(f"the memory plan has no slot for {tensor!r} of accelerator node {node.name!r}")


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__} in the manifest")
