"""Networks as exporters write them (`gemforge.models.exported`, `gemforge.models.transformers`,
`gemforge.models.mobilenet`):
per network its size, the ONNX operators it uses, its float32 error against ONNX Runtime, the
int8 network's cosine to the float32 one, the share of its multiply-accumulates the accelerator
runs, the compile times, and how long a new process takes to load the float32 network's `.gfm`
and run it once, with the CPU kernel cache cold (every kernel compiled) and warm (the kernels of
that cold run loaded), and the `.gfm` carrying its host kernels with the cache empty. The int8 network's outputs must be bit-identical on fsim and the CPU, and
the float32 ones within 1e-4 of ONNX Runtime, or the benchmark is void."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from gemforge.models import (build_alexnet_style, build_bert_tiny, build_crnn_style, build_mobilenet_v2,
                             build_unet_style, build_vit_tiny, build_yolo_style)

from ..runtime.model import compile_model
from .measure import cosine

__all__ = ["bench_models", "MODELS"]

#: (name, builder) of every network measured, in the order reported.
MODELS: tuple[tuple[str, Callable[[], onnx.ModelProto]], ...] = (
    ("YOLOv8-style detector", build_yolo_style),
    ("U-Net (size-matching F.pad)", build_unet_style),
    ("CRNN text recognizer", build_crnn_style),
    ("AlexNet-style, opset 11", build_alexnet_style),
    ("ViT-tiny-style encoder", build_vit_tiny),
    ("BERT-tiny-style encoder", build_bert_tiny),
    ("MobileNetV2 (torchvision, 224×224)", build_mobilenet_v2),
)
#: Calibration samples of each int8 compile.
SAMPLES = 4


def _macs(graph, node) -> int:
    """Multiply-accumulates of a convolution or dense node (0 for any other)."""
    if node.op not in ("conv2d", "dense"):
        return 0
    out = graph.values[node.output].shape
    w = graph.values[node.inputs[1]].shape
    if node.op == "conv2d":
        return math.prod(out) * math.prod(w[1:])
    if node.op == "dense":
        return math.prod(out) * w[0]
    return 0


def _first(result) -> np.ndarray:
    """A model's first output (`Model.run` returns a dict for several)."""
    return result if isinstance(result, np.ndarray) else next(iter(result.values()))


#: A new process's load and first run of a model (its seconds, printed), the cache as the
#: environment says.
_FIRST_RUN = """
import sys, time
import numpy as np
start = time.perf_counter()
from gemforge.driver.runtime.model import Model
Model.load(sys.argv[1]).run(np.load(sys.argv[2]), "cpu")
print(time.perf_counter() - start)
"""


def _first_runs(model, x: np.ndarray) -> tuple[float, float, float]:
    """Seconds a new process takes to import gemforge, load ``model`` from its file and run it
    once on the CPU: the file without host kernels and an empty kernel cache (every kernel
    compiled), then with the cache that run filled; and the file with its host kernels compiled
    in (`Model.compile_host_kernels`, as `gemforge compile` writes it) and an empty cache: a
    machine of the same CPU that never compiled the network."""
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        np.save(folder / "x.npy", x)
        model.net.host_kernels = {}
        model.save(folder / "bare.gfm")
        model.compile_host_kernels()
        model.save(folder / "aot.gfm")
        times = []
        for name, cache in (("bare", "cache"), ("bare", "cache"), ("aot", "empty")):
            env = dict(os.environ, GEMFORGE_CACHE=str(folder / cache))
            done = subprocess.run([sys.executable, "-c", _FIRST_RUN, str(folder / f"{name}.gfm"),
                                   str(folder / "x.npy")], env=env, capture_output=True, text=True, check=True)
            times.append(float(done.stdout.split()[-1]))
    return times[0], times[1], times[2]


def _measure(name: str, build: Callable[[], onnx.ModelProto], config: str) -> dict[str, Any]:
    import onnxruntime as ort
    m = build()
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(dims).astype(np.float32)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = session.run(None, {m.graph.input[0].name: x})[0]
    start = time.perf_counter()
    float_model = compile_model(m)
    float_seconds = time.perf_counter() - start
    got = _first(float_model.run(x, "cpu"))
    scale = float(np.abs(reference).max()) or 1.0
    error = float(np.abs(got - reference).max()) / scale
    if error > 1e-4:
        raise AssertionError(f"{name}: the float32 network differs from ONNX Runtime by {error:.2g} of its "
                             "range; the benchmark is void")
    cold, warm, from_file = _first_runs(float_model, x)
    samples = rng.standard_normal((SAMPLES, *dims)).astype(np.float32)
    start = time.perf_counter()
    int8_model = compile_model(m, quantize="int8", calibrate=samples, config=config)
    int8_seconds = time.perf_counter() - start
    on_cpu, on_fsim = _first(int8_model.run(x, "cpu")), _first(int8_model.run(x, "fsim"))
    if not np.array_equal(on_cpu, on_fsim):
        raise AssertionError(f"{name}: the int8 network differs between fsim and the CPU; the benchmark is void")
    g = int8_model.graph
    macs = {node.name: _macs(g, node) for node in g.nodes}
    total = sum(macs.values())
    on_accel = sum(macs[node.name] for node in g.nodes if node.device == "accel")
    return {"name": name, "onnx_nodes": len(m.graph.node), "opset": next(o.version for o in m.opset_import
                                                                          if o.domain in ("", "ai.onnx")),
            "operators": sorted({n.op_type for n in m.graph.node}), "float32_error": error,
            "int8_cosine": round(cosine(on_cpu, got), 5), "macs": total,
            "accelerator_mac_share": on_accel / total if total else 0.0,
            "accelerator_nodes": sum(node.device == "accel" for node in g.nodes), "int8_nodes": len(g.nodes),
            "float32_compile_seconds": round(float_seconds, 3), "int8_compile_seconds": round(int8_seconds, 3),
            "float32_first_run_cold_seconds": round(cold, 3), "float32_first_run_warm_seconds": round(warm, 3),
            "float32_first_run_file_kernels_seconds": round(from_file, 3)}


def bench_models(config: str = "default", quick: bool = False) -> dict[str, Any]:
    """Every network of `MODELS` (with ``quick`` the smallest, the CRNN), compiled for ``config``."""
    chosen = [m for m in MODELS if m[1] is build_crnn_style] if quick else MODELS
    return {"config": config, "samples": SAMPLES, "models": [_measure(name, build, config) for name, build in chosen]}
