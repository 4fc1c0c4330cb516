"""Workloads for design sweeps: a config's accelerator programs for a named layer set or an ONNX model.

A workload is compiled for each design point (tilings depend on the config), so what it is
made of is a *spec*, a string any worker can rebuild from:

==================  ==============================================================================
spec                what it compiles
==================  ==============================================================================
``resnet18-convs``  the ten distinct convolutions of ResNet-18 after the first, as a quantized
                    network runs them (int8 out: bias, shift, ReLU fused), each counted as often
                    as the network runs it (`gemforge.models.resnet.RESNET18_CONVS`)
``resnet18``        the whole ResNet-18 (built in code, seeded weights) quantized to int8: every
                    layer the partitioner puts on the accelerator (all between the input's
                    quantize and the output's dequantize: residual adds and pools included)
``mobilenet_v2``    the whole MobileNetV2 (torchvision's topology, seeded weights), quantized
                    the same way: depthwise convolutions and ReLU6 included
``digits``          the bundled digits CNN (`gemforge.models.digits`), quantized the same way
``PATH.onnx``       any ONNX model, quantized with seeded random calibration inputs (a layer's
                    program, hence its cycles, depends on shapes, not on values)
==================  ==============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.hw.program import Program

__all__ = ["WORKLOADS", "Workload", "WorkloadLayer", "WorkloadError", "build_workload"]

WORKLOADS = ("resnet18-convs", "resnet18", "mobilenet_v2", "digits")


class WorkloadError(ValueError):
    """A workload spec that names nothing known, or a model that cannot be compiled."""


@dataclass
class WorkloadLayer:
    """One accelerator program of a workload, run ``count`` times, of ``macs`` multiply-accumulates."""

    name: str
    program: Program
    count: int
    macs: int


@dataclass
class Workload:
    spec: str
    layers: list[WorkloadLayer]

    @property
    def macs(self) -> int:
        return sum(layer.macs * layer.count for layer in self.layers)


def _resnet18_convs(config: AccelConfig) -> list[WorkloadLayer]:
    from gemforge.compiler import compile_conv2d
    from gemforge.models.resnet import RESNET18_CONVS
    layers = []
    for name, xs, ws, stride, padding, count in RESNET18_CONVS:
        op = compile_conv2d(config, xs, ws, stride=stride, padding=padding, bias=True, shift=8, relu=True)
        oh = (xs[2] + 2 * padding - ws[2]) // stride + 1
        macs = xs[0] * ws[0] * oh * oh * ws[1] * ws[2] * ws[3]
        layers.append(WorkloadLayer(name, op.program, count, macs))
    return layers


def _network(config: AccelConfig, model) -> list[WorkloadLayer]:
    from gemforge.compiler.graph.compile import compile_network
    from gemforge.compiler.graph.onnx_import import import_onnx
    from gemforge.driver.runtime.model import _macs
    graph = import_onnx(model)
    rng = np.random.default_rng(0)
    samples = {name: rng.normal(0.0, 1.0, (4, *graph.values[name].shape)).astype(np.float32)
               for name in graph.inputs}
    net = compile_network(model, quantize_to="int8", calibration=samples, config=config)
    layers = [WorkloadLayer(node.name, net.layers[node.name].program, 1, _macs(net.graph, node))
              for node in net.graph.nodes if node.name in net.layers]
    if not layers:
        raise WorkloadError("no layer of the model runs on the accelerator, so there is nothing to sweep")
    return layers


def build_workload(spec: str, config: AccelConfig) -> Workload:
    """Compile the workload ``spec`` (see the module docstring) for ``config``."""
    if spec == "resnet18-convs":
        return Workload(spec, _resnet18_convs(config))
    if spec == "resnet18":
        from gemforge.models import build_resnet18
        return Workload(spec, _network(config, build_resnet18()))
    if spec == "mobilenet_v2":
        from gemforge.models import build_mobilenet_v2
        return Workload(spec, _network(config, build_mobilenet_v2()))
    if spec == "digits":
        from gemforge.models import MODEL_PATH
        return Workload(spec, _network(config, str(MODEL_PATH)))
    if spec.endswith(".onnx"):
        if not Path(spec).is_file():
            raise WorkloadError(f"the workload model {spec} does not exist")
        return Workload(spec, _network(config, spec))
    raise WorkloadError(f"unknown workload {spec!r}: use one of {', '.join(WORKLOADS)} or a path to an .onnx model")
