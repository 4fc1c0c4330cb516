"""Whole networks: compile an ONNX model, save it as one ``.gfm`` file, run it on any device.

``compile_model(model, quantize="int8", calibrate=samples, config="default")`` runs
the graph compiler (`gemforge.compiler.graph`) and returns a `Model`;
``model.save("net.gfm")`` writes the artefact, ``Model.load`` reads it, and
``model.run(x, device=...)`` runs it:

- ``cpu`` (and ``gpu`` for a float32 network): every node on the LLVM back end;
  an int8 network computes exactly what the accelerator computes;
- ``fsim``, ``verilator``, ``icarus`` (int8 networks compiled for a config): the
  accelerator's layers run on that device, reading and writing their packed tensors
  at the memory plan's offsets in one activation arena in device DRAM (a layer's
  output is the next layer's input in place). Consecutive accelerator layers (an
  accelerator run, `partition.accel_runs`) run as one chained program (`hw.chain`):
  one START, one FINISH, the host writing the run's inputs before and reading its
  outputs after. The other layers run on the CPU back end, with the tensor copied
  out of and back into device DRAM around them. The profile still has a row per
  layer: the chain's counters are read at the link between layers where the device
  can (fsim, the RTL simulators).

Inputs and outputs are the ONNX model's (float32, its layouts). A model compiled
with a symbolic batch dimension runs any multiple of its compiled batch, in
chunks.

The artefact (a ``.gfm`` file: manifest, constants, programs) is written and read, checked
whole, by `artefact`.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gemforge.compiler.backends.cpu import prebuilt
from gemforge.compiler.graph.memory_plan import Slot, slot_key
from gemforge.compiler.graph.partition import accel_runs, host_reads, host_round_trips
from gemforge.compiler.graph.batch import batched_values
from gemforge.compiler.graph.network import CompiledNetwork
from gemforge.compiler.graph import blocked as blocked_layout
from gemforge.compiler.graph.cpu_kernels import HostKernel, host_kernel
from gemforge.compiler.graph.ir import Graph, Node
from gemforge.compiler.graph.operators import OPERATORS
from gemforge.compiler.backends.cpu import runs_here
from gemforge.compiler.target import CpuTarget, named_cpu, target_of
from gemforge.compiler import tuning as tuning_dispatch
from gemforge.files import check_regular_input, write_bytes_atomic
from gemforge.hw.chain import chain_refusal
from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import insn_bytes

from .host_plan import HostPlan
from .artefact import FORMAT_VERSION, ModelError, network_from_bytes, network_to_bytes
from .device import ACCEL_DEVICES, HOST_DEVICES, Buffer, Device, DeviceError, RunResult, open_device

__all__ = ["Model", "ModelError", "compile_model", "ACCEL_DEVICES", "HOST_DEVICES", "FORMAT_VERSION"]

#: Runs on the CPU replay a traced `HostPlan` (``GEMFORGE_HOST_PLAN=0``: every node the ordinary way).
HOST_PLANS = os.environ.get("GEMFORGE_HOST_PLAN", "1") != "0"
#: CPU runs hold images in the blocked layout between layers (``GEMFORGE_BLOCKED_LAYOUT=0``: NCHW
#: throughout, for comparison).
BLOCKED_LAYOUTS = os.environ.get("GEMFORGE_BLOCKED_LAYOUT", "1") != "0"


def compile_model(model, *, quantize: str | None = None, calibrate=None, config=None, batch: int = 1,
                  input_shapes=None, trace=None, report=None, tuning=(), shipped_tuning: bool = True) -> Model:
    """Compile an ONNX model (path, bytes or `onnx.ModelProto`) into a `Model`.

    ``quantize="int8"`` with ``calibrate`` (sample inputs stacked on a new first axis)
    builds the int8 network; ``config`` (preset, file or `AccelConfig`) puts its layers
    on that accelerator where it can run them. ``trace`` receives the graph after
    every pass, ``report`` the partition and the memory plan. ``tuning``: a tuning log
    (`gemforge.compiler.tuning.log.TuningLog`, used where it applies to this model and
    target) or its records, whose configurations the compile uses where their operator,
    workload and target match; the model keeps the CPU ones for the host kernels it
    compiles later. An accelerator preset's layers take the tilings gemforge ships for it
    where the log gives none (``shipped_tuning=False``: the planner's own)."""
    # Imported here: the ONNX front end is what compiling needs and loading and running do not
    # (onnx alone takes most of a second to import).
    from gemforge.compiler.graph.compile import compile_network
    net = compile_network(model, quantize_to=quantize, calibration=calibrate, config=config, batch=batch,
                          input_shapes=input_shapes, trace=trace, report=report, tuning=tuning,
                          shipped_tuning=shipped_tuning)
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
    #: Which program start of the inference (counted from 0) ran it, for an accelerator layer:
    #: layers chained into one program share it.
    run: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"node": self.node, "op": self.op, "device": self.device, "seconds": round(self.seconds, 6),
               "macs": self.macs}
        if self.run is not None:
            out["run"] = self.run
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


def _per_layer(results: list[RunResult], count: int, chained: bool) -> list[dict[str, int] | None]:
    """Each layer's counters (``cycles``, ``gemm_active`` and ``gemm_reset`` where the device
    counts them, and its event counters): one run per layer, or one chain split at its links'
    marks (None for every layer when the device reads no marks)."""
    def totals(result: RunResult) -> dict[str, int]:
        out = dict(result.counters)
        if result.cycles is not None:
            out["cycles"] = result.cycles
            for name in ("gemm_active", "gemm_reset"):
                if name in result.hw_counters:
                    out[name] = result.hw_counters[name]
        return out
    if not chained:
        return [totals(r) for r in results]
    (result,) = results
    if len(result.marks) != count - 1:
        return [None] * count
    points = [*result.marks, totals(result)]
    names = set.intersection(*(set(p) for p in points))       # what every mark has
    points = [dict.fromkeys(names, 0), *points]
    return [{name: after[name] - before[name] for name in names} for before, after in zip(points, points[1:])]


@dataclass
class _Placed:
    """What a model keeps in one accelerator device's memory between runs: the activation arena
    and each accelerator run's chained programs (by its first step), all bound to that arena."""

    device: weakref.ref
    arena: Buffer | None = None
    chains: dict[int, Any] = field(default_factory=dict)


class Model:
    """A compiled network, ready to save or run."""

    def __init__(self, net: CompiledNetwork) -> None:
        self.net = net
        self._kernels: dict[str, dict[str, HostKernel]] = {}
        self._cpu: Device | None = None
        self.last_profile: list[LayerProfile] = []
        self._readers: set[str] | None = None
        self._runs: list[tuple[int, int]] | None = None
        self._node_macs: dict[str, int] = {}
        self._placed: dict[int, _Placed] = {}     # by id of the device (`_placed_on`)
        self._plans: dict[int, HostPlan] = {}     # CPU runs by thread count (`_run_host_planned`)
        self._blocked_values: frozenset[str] | None = None
        self._cpu_target: CpuTarget | None = None   # `_host_cpu`

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
               "model_sha256": g.notes.model_sha256, "compile_seconds": round(self.net.compile_seconds, 3)}
        if g.notes.opset is not None:    # the ONNX model's own operator set (older ones are upgraded)
            out["opset"] = g.notes.opset
        if self.config is not None:      # leaving the accelerator for the host and back, per inference
            out["host_round_trips"] = host_round_trips(g)
            out["accelerator_runs"] = len(self._accel_runs())    # device programs started per inference
        if g.notes.memory is not None:
            out["memory"] = g.notes.memory
        if g.notes.coarser_weights:
            out["coarser_weights"] = g.notes.coarser_weights
        if self.net.host_kernels:       # compiled CPU kernels the file carries
            out["host_kernels"] = len(self.net.host_kernels)
            out["host_kernels_cpu"] = self.net.host_target["cpu"] if self.net.host_target else "host"
        return out

    # ------------------------------------------------------------------ running

    def run(self, inputs, device: str | Device = "cpu", *, progress: Callable[[int, int], None] | None = None,
            chain: bool = True, **device_options):
        """Run the network on ``inputs`` (an array for a one-input model, else a dict by
        name; float32 in the ONNX model's layout) on ``device`` (a name or an open
        `Device`, opened with ``device_options``). Returns the output array (a dict by name
        for several outputs); the per-node costs of the last chunk are in ``last_profile``;
        ``progress(done, total)`` is called after each batch chunk. ``chain=False`` runs each
        accelerator layer as a program of its own (a profile per layer from a device that
        reads no counters between chained layers, a board)."""
        feeds = self._feeds(inputs)
        chunks = self._chunks(feeds)
        own, dev = self._open(device, device_options)
        try:
            results = []
            for i, chunk in enumerate(chunks):
                results.append(self._run_once(chunk, dev, chain))
                if progress:
                    progress(i + 1, len(chunks))
        finally:
            if own:
                self.release(dev)
                dev.close()
        # An output computed without the batched inputs is the same in every chunk.
        batched = batched_values(self.graph, self.graph.notes.batched_inputs) if len(results) > 1 else set()
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
        frozen = sorted(unknown & set(self.graph.notes.frozen_inputs))
        if frozen:
            raise ModelError(f"input(s) {', '.join(frozen)} are initializers the ONNX model also lists as inputs; "
                             f"gemforge compiles them as the constants they hold, so the model takes "
                             f"{', '.join(self.inputs)} (remove them from the feeds, or recompile a model in which "
                             "they are plain inputs)")
        if unknown:
            raise ModelError(f"unknown input(s) {', '.join(sorted(unknown))}; the model takes {', '.join(self.inputs)}")
        return feeds

    def _chunks(self, feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """The runs that make up ``feeds``: the inputs with a symbolic batch dimension may hold
        any multiple of the compiled batch, run a batch at a time (the other inputs go whole
        to every run), where the network keeps the items apart (`batch.batch_mixing`)."""
        notes = self.graph.notes
        batched = set(notes.batched_inputs)
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
        if n > 1 and notes.batch_mixing:
            size = self.inputs[next(name for name in self.inputs if name in batched)][0]
            raise ModelError(f"the model was compiled for batch {size} and cannot run {n * size} items a batch at a "
                             f"time: {notes.batch_mixing}; compile it with --batch {n * size}")
        return [{name: feeds[name][i * shape[0]:(i + 1) * shape[0]] if n > 1 and name in batched else feeds[name]
                 for name, shape in self.inputs.items()} for i in range(n)]

    def _open(self, device, options) -> tuple[bool, Any]:
        if not isinstance(device, str):
            kind = getattr(device, "kind", None)
            if kind is None or not hasattr(device, "run_program"):
                raise ModelError(f"device must be a name ({', '.join(ACCEL_DEVICES + HOST_DEVICES)}) or an open "
                                 f"device, not {device!r}")
            self._check_device(kind if getattr(device, "host", False) else "accel", device)
            return False, device
        if device.startswith("uart:"):       # a board with the board top, through its UART bridge
            self._check_device("accel", None, device)
            return True, open_device(device, self.config, **options)
        if device not in ACCEL_DEVICES + HOST_DEVICES:
            raise ModelError(f"unknown device {device!r}; choose one of {', '.join(ACCEL_DEVICES + HOST_DEVICES)} "
                             "or uart:PORT[@BAUD]")
        self._check_device(device if device in HOST_DEVICES else "accel", None, device)
        if device in ACCEL_DEVICES:
            if device != "fsim":   # the simulated DRAM window holds the arena and the layers' programs
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
        # A run chains its layers' programs: all of them are in DRAM at once.
        need = (self.net.plan.peak_bytes if self.net.plan else 0) + programs + (1 << 20)
        return max(16 << 20, 1 << (need - 1).bit_length())

    def compile_host_kernels(self, target_kind: str = "cpu", *, every_node: bool = False,
                             cpu: str | None = None) -> int:
        """Compile the host kernels a run needs for ``target_kind`` now rather than at the first
        run (`gemforge compile` does, so that `gemforge run` starts without compiling): every
        node's for a float32 network, the nodes the host runs beside the accelerator for one with
        a config (a run of it on the CPU compiles the rest once). The CPU kernels go into the
        kernel cache and into the model (`save` writes them into the file; a run on a machine of
        the same CPU loads them without compiling). ``every_node``: the accelerator's nodes
        too (what a run of an int8 network on the CPU compiles). ``cpu``: the CPU to compile for
        (`target.named_cpu`: ``host``, or an x86-64 level such as ``x86-64-v3``, whose code runs
        on every machine of that level; a run on a machine without its features compiles its own).
        Returns how many nodes have a kernel."""
        if cpu is not None:
            target = named_cpu(cpu)
            self.net.host_target = None if cpu == "host" else {"cpu": target.cpu, "features": target.features}
            self._cpu_target = None
        nodes = [node for node in self.graph.nodes if every_node or self.config is None or node.device != "accel"]
        self._kernels.pop(target_kind, None)       # found again (not compiled) and collected
        self._plans.clear()
        collected: dict = {}
        with prebuilt.collecting(collected):
            built = [self._host_kernel(node, kind, beside=kind != target_kind)
                     for node in nodes for kind in [self._host_target_kind(node, target_kind)]]
        if collected:
            # The model file carries them: a run on a machine they match loads them as they are.
            self.net.host_kernels = collected
        return sum(kernel.op is not None for kernel in built)

    def _host_kernel(self, node: Node, target_kind: str, *, beside: bool = False) -> HostKernel:
        """``node`` compiled for a host target (once per model and target). Keyed by the tensor
        it writes, which no other node writes (a model file from before node names were made
        unique may repeat a name). A CPU run of a network without an accelerator holds its images
        in the blocked layout where `blocked.plan` says; the CPU ``beside`` a GPU or an accelerator
        takes and gives NCHW."""
        blocked = self._blocked() if target_kind == "cpu" and not beside and self.config is None else frozenset()
        kernels = self._kernels.setdefault(target_kind if not beside else f"{target_kind} beside", {})
        if node.output not in kernels:
            tuned = tuning_dispatch.applied(self.net.tuning) if self.net.tuning else contextlib.nullcontext()
            target = self._host_cpu() if target_kind == "cpu" else target_of(target_kind)
            with prebuilt.embedded(self.net.host_kernels), tuned:
                kernels[node.output] = host_kernel(self.graph, node, target, blocked)
        return kernels[node.output]

    def _blocked(self) -> frozenset[str]:
        """The values a CPU run holds in the blocked layout (`blocked.plan`; none with
        ``GEMFORGE_BLOCKED_LAYOUT=0``)."""
        if self._blocked_values is None:
            self._blocked_values = blocked_layout.plan(self.graph) if BLOCKED_LAYOUTS else frozenset()
        return self._blocked_values

    def _host_cpu(self) -> CpuTarget:
        """The CPU target host kernels compile for: the one the model's kernels were compiled for
        (`CompiledNetwork.host_target`) where this machine has its features, so they are found
        as they are; else this machine's own (a kernel for features it lacks never runs)."""
        if self._cpu_target is None:
            named = self.net.host_target
            target = CpuTarget(named["cpu"], named["features"]) if named else CpuTarget()
            self._cpu_target = target if named is None or runs_here(target) else CpuTarget()
        return self._cpu_target

    @staticmethod
    def _host_target_kind(node: Node, host_kind: str) -> str:
        """Where a host node runs: on ``host_kind``, except that a network on the GPU runs the
        operators the GPU back end cannot compile (``OpDef.gpu``: softmax, means, the
        exponential functions) on the CPU beside it."""
        return "cpu" if host_kind == "gpu" and not OPERATORS[node.op].gpu else host_kind

    def _cpu_device(self):
        if self._cpu is None:
            self._cpu = open_device("cpu")
        return self._cpu

    def _run_once(self, feeds: dict[str, np.ndarray], dev, chain: bool = True) -> dict[str, np.ndarray]:
        graph = self.graph
        on_accel = not getattr(dev, "host", False)
        if not on_accel and dev.kind == "cpu" and HOST_PLANS:
            return self._run_host_planned(feeds, dev)
        host_kind = dev.kind if not on_accel else "cpu"
        host_dev = dev if not on_accel else self._cpu_device()
        env: dict[str, np.ndarray] = dict(graph.constants)
        env.update(feeds)
        profile: list[LayerProfile] = []
        arena = None
        resident: dict[tuple, Buffer] = {}   # (tensor, packed shape, dtype) → its buffer, when valid
        slots: dict[tuple, Slot] = {}
        placed = None
        if on_accel:
            slots = self.net.plan.by_key() if self.net.plan else {}
            placed = self._placed_on(dev)
            if slots and placed.arena is None:
                placed.arena = dev.alloc(self.net.plan.peak_bytes, align=self.net.plan.arena_alignment)
            arena = placed.arena
        runs = dict(self._accel_runs()) if on_accel else {}
        try:
            step = 0
            while step < len(graph.nodes):
                node = graph.nodes[step]
                if on_accel and node.device == "accel":
                    last = runs[step]
                    profile.extend(self._run_accel(step, last, dev, env, arena, slots, resident, profile, chain,
                                                   placed))
                    step = last + 1
                    continue
                start = time.perf_counter()
                args = [env[name] for name in node.inputs]
                kind = self._host_target_kind(node, host_kind)
                runner = host_dev if kind == host_kind else self._cpu_device()
                beside = on_accel or kind != host_kind
                env[node.output], result = self._host_kernel(node, kind, beside=beside).run(runner, args)
                profile.append(LayerProfile(node.name, node.op, kind if result is not None else "host (data)",
                                            time.perf_counter() - start, macs=self._macs(node)))
                step += 1
            outputs = {name: env[name] for name in graph.outputs}
        except BaseException:
            if placed is not None:     # a run that failed leaves nothing behind on the device
                self.release(dev)
            raise
        self.last_profile = profile
        return outputs

    def _run_host_planned(self, feeds: dict[str, np.ndarray], dev) -> dict[str, np.ndarray]:
        """A run on the CPU as a `HostPlan`: traced by the first run on a thread count, replayed
        by the next ones."""
        plan = self._plans.get(dev.threads)
        if plan is None:
            plan, outputs, profile = HostPlan.trace(
                self.graph, feeds, dev, lambda node: self._host_kernel(node, "cpu"),
                lambda node, kind, seconds: LayerProfile(node.name, node.op, kind, seconds, macs=self._macs(node)))
            self._plans[dev.threads] = plan
        else:
            outputs, profile = plan.run(feeds, dev, self.graph.outputs)
        self.last_profile = profile
        return outputs

    def _placed_on(self, dev) -> _Placed:
        """What this model keeps on ``dev`` between runs (`_Placed`), made at its first run there."""
        placed = self._placed.get(id(dev))
        if placed is None or placed.device() is not dev:
            placed = self._placed[id(dev)] = _Placed(weakref.ref(dev))
        return placed

    def release(self, device) -> None:
        """Free what the model keeps in an open accelerator ``device``'s memory between runs (its
        activation arena and its chained programs; `run` keeps them there, so that an inference
        after the first writes only its inputs and reads only its outputs)."""
        placed = self._placed.pop(id(device), None)
        if placed is None or placed.device() is not device:
            return
        for loaded in placed.chains.values():
            device.unload_program(loaded)
        if placed.arena is not None:
            device.free(placed.arena)

    def _host_readers(self) -> set[str]:
        """Accelerator outputs the host needs (`partition.host_reads`, computed once)."""
        if self._readers is None:
            self._readers = host_reads(self.graph, self.net.layers)
        return self._readers

    def _macs(self, node: Node) -> int:
        """A node's multiply-accumulates (`_macs`), computed once per node: a run's profile asks
        for every node's each inference."""
        if node.output not in self._node_macs:
            self._node_macs[node.output] = _macs(self.graph, node)
        return self._node_macs[node.output]

    def _accel_runs(self) -> list[tuple[int, int]]:
        """The accelerator runs (`partition.accel_runs`), computed once; one per layer for a
        model file whose memory plan predates chained runs (`MemoryPlan.run_wide`)."""
        if self._runs is None:
            if self.net.plan is not None and not self.net.plan.run_wide:
                self._runs = [(step, step) for step, node in enumerate(self.graph.nodes) if node.device == "accel"]
            else:
                self._runs = accel_runs(self.graph, self.net.layers)
        return self._runs

    def _run_accel(self, first, last, dev, env, arena, slots, resident, profile, chain, placed) -> list[LayerProfile]:
        """Run accelerator nodes ``first``..``last`` (one accelerator run): the host writes the
        inputs it made, the device runs the layers' programs chained into one (with ``chain``:
        one START, one FINISH; else, or where a program cannot be chained or all of them do not
        fit the device's memory at once, one program at a time), and the host reads the outputs
        it needs. Returns a profile row per node, split at the chain's links (``profile``: the
        rows of the inference so far, which number the device's program starts)."""
        started = time.perf_counter()
        graph = self.graph
        nodes = graph.nodes[first:last + 1]

        def buffer(key) -> Buffer:
            slot = slots[key]
            return Buffer(arena.address + slot.offset, slot.nbytes)
        parts = []
        for node in nodes:
            layer = self.net.layers[node.name]
            bindings = {}
            for tensor, name in layer.bound_inputs(node):
                in_key = slot_key(tensor, layer.packed(name))
                if in_key not in resident:
                    # From the host (`_host_readers` copied it out if a layer made it); the plan
                    # keeps its slot from the start of the run (`memory_plan.pack_layouts`).
                    buf = buffer(in_key)
                    dev.write(buf, layer.pack(env[tensor]))
                    resident[in_key] = buf
                bindings[name] = resident[in_key]
            out_key = slot_key(node.output, layer.packed_out)
            resident[out_key] = buffer(out_key)
            parts.append((layer.program, {**bindings, "out": resident[out_key]}))
        chained = chain and len(parts) > 1 and all(chain_refusal(p.instructions) is None for p, _ in parts)
        loaded = placed.chains.get(first) if chained else None
        if chained and loaded is None:
            try:
                # Kept for the next runs: the weights, micro-ops and stream stay in device memory.
                loaded = placed.chains[first] = dev.load_chain(parts)
            except DeviceError:
                # All the layers' programs at once do not fit the device's memory (a small
                # board's): one program at a time then, as they do alone.
                chained = False
        results = []
        if chained:
            results.append(dev.run(loaded))
        for part in ([] if chained else parts):
            loaded = dev.load_program(*part)
            try:
                results.append(dev.run(loaded))
            finally:
                dev.unload_program(loaded)
        # The plan reuses the space of tensors no later accelerator node reads.
        for key in list(resident):
            if slots[key].last <= last:
                del resident[key]
        for node in nodes:
            if node.output in self._host_readers():
                # Read now: a later layer may reuse the space before the host reads it.
                layer = self.net.layers[node.name]
                out_shape, out_dtype = layer.packed_out
                env[node.output] = layer.unpack(dev.read(buffer(slot_key(node.output, layer.packed_out)), out_dtype,
                                                         out_shape)).reshape(graph.values[node.output].shape)
        runs_before = 1 + max((r.run for r in profile if r.run is not None), default=-1)
        rows = [LayerProfile(node.name, node.op, dev.kind, 0.0, macs=self._macs(node),
                             run=runs_before + (0 if chained else k)) for k, node in enumerate(nodes)]
        for row, counters in zip(rows, _per_layer(results, len(nodes), chained)):
            if counters is None:
                continue
            row.cycles = counters.pop("cycles", None)
            active = counters.pop("gemm_active", None)
            reset = counters.pop("gemm_reset", 0)
            if row.cycles and active is not None:
                row.gemm_utilization = (active - reset) / row.cycles
            row.counters = counters
        # The run's wall time, shared by cycles (or instructions) where the device counts them.
        seconds = time.perf_counter() - started
        weights = [r.cycles or r.counters.get("insns", 0) for r in rows]
        total = sum(weights)
        for row, weight in zip(rows, weights):
            row.seconds = seconds * (weight / total if total else 1 / len(rows))
        return rows

    # ------------------------------------------------------------------ the artefact (`artefact`)

    def to_bytes(self) -> bytes:
        return network_to_bytes(self.net)

    def save(self, path: str | Path) -> None:
        """Write the artefact (atomically: an existing file is replaced only once the new one is complete)."""
        write_bytes_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | Path, *, file_kernels: bool = True) -> Model:
        """The model in a ``.gfm`` file (`from_bytes`)."""
        path = Path(path)
        try:
            check_regular_input(path)
            data = path.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read model {path}: {exc.strerror}") from None
        return cls.from_bytes(data, source=str(path), file_kernels=file_kernels)

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "model", *, file_kernels: bool = True) -> Model:
        """The model a ``.gfm`` file's bytes hold, checked whole before anything runs
        (`artefact.network_from_bytes`). The file's compiled host kernels (native code) are
        used where they match this CPU; ``file_kernels=False`` compiles them here instead."""
        net = network_from_bytes(data, source)
        if not file_kernels:
            net.host_kernels, net.host_target = {}, None      # compiled here, for this CPU
        return cls(net)
