"""Compile a whole network: ONNX → graph passes → a `CompiledNetwork`.

The pipeline, in order (``trace`` prints the graph after each stage):

1. ``infer_shapes``, ``pad_convolutions``, ``fold_constants``, ``fold_batch_norm``, ``fuse`` —
   the float graph; a float32 network then ``fuse_clips`` and ``fuse_residual_adds`` (clips and
   residual adds into the convolutions' epilogues) and ``fuse_scale_shift`` (a batch norm no
   convolution precedes in one pass);
2. with ``quantize="int8"``: ``quantize`` (power-of-two scales calibrated on sample
   inputs), then for an accelerator config ``partition``, ``pack_layouts`` and
   ``plan_memory`` (`accel`).

The result holds the graph, the accelerator layers' programs and the memory plan;
the host layers are compiled for the device that runs them when the network runs
(LLVM code is specific to the CPU it runs on).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable

import numpy as np

from gemforge.hw.config import load_config

from .. import tuning as tuning_dispatch
from ..target import CpuTarget
from ..tuning import target_identity
from ..tuning.log import KINDS, TuningLog, default_records
from .memory_plan import pack_layouts, plan_memory
from .network import CompiledNetwork
from .partition import partition
from .image_dense import dense_of_image_as_conv
from .unfold import unfold_small_channel_convs
from .batch import batch_mixing
from .ir import Graph, GraphError
from .onnx_import import import_onnx
from .passes import (fold_batch_norm, fold_constants, fuse, fuse_clips, fuse_residual_adds, fuse_scale_shift,
                     infer_shapes, pad_convolutions)
from .quantize import calibrate, quantize

__all__ = ["CompiledNetwork", "compile_network", "FLOAT_PASSES"]

FLOAT_PASSES = (infer_shapes, pad_convolutions, fold_constants, fold_batch_norm, fuse)


def _samples(graph: Graph, calibration) -> dict[str, np.ndarray]:
    if calibration is None:
        raise GraphError("int8 quantization needs calibration samples (--calibrate SAMPLES.npy): sample inputs "
                         "stacked on a new first axis")
    if isinstance(calibration, dict):
        return {k: np.asarray(v) for k, v in calibration.items()}
    if len(graph.inputs) != 1:
        raise GraphError(f"the model has {len(graph.inputs)} inputs; give calibration samples as a dict by name")
    return {graph.inputs[0]: np.asarray(calibration)}


def _tuning_records(tuning, graph: Graph, config, report) -> list[dict]:
    """The tuning records a compile applies, as dicts: a `TuningLog`'s where it applies to this
    model and target (the CPU runs use, or the accelerator ``config``), else none, reported."""
    if not isinstance(tuning, TuningLog):
        return [r if isinstance(r, dict) else r.as_dict() for r in tuning]
    if tuning.device == "fsim":
        target = target_identity(load_config(config)) if config is not None else None
        if target is None:
            why = "it tunes the accelerator's layers, and this network has no accelerator config"
        else:
            why = tuning.applicable(target, graph.notes.model_sha256)
    else:
        why = tuning.applicable(target_identity(CpuTarget()), graph.notes.model_sha256)
    if why:
        if report:
            report(f"tuning log not used: {why}")
        return []
    if report:
        report(f"tuning log: {len(tuning.records)} tuned {tuning.device} schedule(s) apply where their operators occur")
    return [r.as_dict() for r in tuning.records]


def compile_network(model, *, quantize_to: str | None = None, calibration=None, config=None, batch: int = 1,
                    input_shapes=None, trace: Callable[[str], None] | None = None,
                    report: Callable[[str], None] | None = None, tuning=(),
                    shipped_tuning: bool = True) -> CompiledNetwork:
    """Compile an ONNX model (path, bytes or ModelProto).

    ``quantize_to="int8"`` builds the int8 network from ``calibration`` samples (an
    array for a one-input model, else a dict by input name); with an accelerator
    ``config`` (preset, file or `AccelConfig`) its layers are partitioned between the
    accelerator and the CPU. Without quantization the network is float32 for the
    host back ends. ``tuning``: a `TuningLog` (used if it was made for this model, or for
    any, and for this CPU or config; else ``report`` says why not) or records to apply
    (`_tuning_records`), over the tilings gemforge ships for a preset config
    (`tuning.log.default_records`; ``shipped_tuning=False``: the planner's own)."""
    start = time.perf_counter()
    if quantize_to not in (None, "int8"):
        raise GraphError(f"quantization is to int8, not {quantize_to!r}")
    if config is not None and quantize_to is None:
        raise GraphError("a float32 network runs on the cpu (or gpu); compile with --quantize int8 to use the "
                         "accelerator")
    graph = import_onnx(model, batch=batch, input_shapes=input_shapes)
    records = _tuning_records(tuning, graph, config, report)
    cpu_records = [r for r in records if r["kind"] in KINDS["cpu"]]      # the model keeps them for its runs

    def stage(name: str, g: Graph) -> None:
        g.check_writers().unique_node_names()
        if trace:
            trace(f"== {name}\n{g.dump()}")
    stage("import", graph)
    for graph_pass in FLOAT_PASSES:
        graph = graph_pass(graph)
        stage(graph_pass.__name__, graph)
    if quantize_to is None:
        graph = fuse_clips(graph)
        stage("fuse_clips", graph)
        graph = fuse_residual_adds(graph)
        stage("fuse_residual_adds", graph)
        graph = fuse_scale_shift(graph)
        stage("fuse_scale_shift", graph)
        for node in graph.nodes:
            node.device = "cpu"
        _note_batch_mixing(graph)
        return CompiledNetwork(graph, "float32", compile_seconds=time.perf_counter() - start,
                               tuning=cpu_records)
    peaks = calibrate(graph, _samples(graph, calibration))
    never_nonzero = sorted(name for name, peak in peaks.items() if peak == 0.0)
    graph = quantize(graph, peaks)
    stage("quantize", graph)
    graph = fuse_clips(graph)           # the int8 clips, at their integer bounds
    stage("fuse_clips", graph)
    if report:
        if never_nonzero:
            many = len(never_nonzero) != 1
            report(f"quantize: {len(never_nonzero)} tensor{'s' * many} ({', '.join(never_nonzero[:5])}"
                   f"{', …' * (len(never_nonzero) > 5)}) {'were' if many else 'was'} 0 on every calibration "
                   "sample; int8 gives them the finest scale, so other inputs may saturate there")
        for row in graph.notes.coarser_weights:
            report(f"quantize: node {row['node']} ({row['op']}) takes its weights at 2^-{row['exponent']}, "
                   f"{row['bits']} bit{'s' * (row['bits'] != 1)} coarser than their range allows, so that its "
                   f"int32 sum cannot overflow (worst case {row['worst_case']:.4g})")
    net = CompiledNetwork(graph, "int8", tuning=cpu_records)
    if config is not None:
        net.config = load_config(config)
        graph = infer_shapes(unfold_small_channel_convs(graph, net.config))
        stage("unfold_small_channel_convs", graph)
        graph = infer_shapes(dense_of_image_as_conv(graph))
        stage("dense_of_image_as_conv", graph)
        # The shipped tilings for this config, then the log given (which overrides them).
        shipped = default_records(net.config) if shipped_tuning else []
        with tuning_dispatch.applied(shipped, strict=False) if shipped else nullcontext(), \
                tuning_dispatch.applied(records) if records else nullcontext():
            net.layers = partition(graph, net.config, report)
        stage("partition", graph)
        tensors = pack_layouts(graph, net.layers)
        stage("pack_layouts", graph)
        net.plan = plan_memory(graph, tensors, net.config)
        stage("plan_memory", graph)
        if report:
            m = graph.notes.memory
            report(f"memory plan: {m['tensors']} packed tensors ({m['handovers']} handed over between "
                   f"accelerator layers in DRAM), peak {m['peak_bytes']:,} bytes vs {m['naive_bytes']:,} "
                   "without reuse")
    else:
        for node in graph.nodes:
            node.device = "cpu"
    _note_batch_mixing(graph)
    net.compile_seconds = time.perf_counter() - start
    return net


def _note_batch_mixing(graph: Graph) -> None:
    """Record whether the network may run a multiple of its batch in chunks (`batch.batch_mixing`)."""
    if graph.notes.symbolic_batch:
        graph.notes.batch_mixing = batch_mixing(graph, graph.notes.batched_inputs)
