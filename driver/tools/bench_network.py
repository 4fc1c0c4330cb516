"""Whole-network benchmarks: compile time, fsim time, the float32 network on the CPU back end
against ONNX Runtime and the int8 one against ORT's static QDQ int8 (same threads, alternating
rounds), the int8 digits CNN's accuracy, and
with an RTL device ResNet-18's cycles and GEMM-core utilization layer by layer."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from gemforge.hw.config import AccelConfig

from .measure import best_interleaved, best_of, cores, cosine, ort_session, roofline
from ..runtime.model import compile_model
from ..runtime.profile import profile_totals

__all__ = ["bench_networks"]


def _cpu_vs_ort(onnx_model, x: np.ndarray, repeats: int) -> dict[str, Any]:
    """The float32 network on the CPU back end and in ONNX Runtime, alternating rounds, best of each."""
    model = compile_model(onnx_model, batch=x.shape[0])
    out = model.run(x, "cpu")                       # JIT-compiles every layer once
    row: dict[str, Any] = {"gemforge_seconds": None}
    if importlib.util.find_spec("onnxruntime") is None:
        row["gemforge_seconds"] = round(best_of(repeats, lambda: model.run(x, "cpu"))[0], 6)
        row["onnxruntime"] = "not installed (the dev extra)"
        return row
    session = ort_session(onnx_model)
    feed = {session.get_inputs()[0].name: x}
    reference = session.run(None, feed)[0]
    scale = float(np.abs(reference).max()) or 1.0
    if not np.allclose(out, reference, rtol=1e-4, atol=1e-4 * scale):
        raise AssertionError("the float32 network differs from ONNX Runtime; the benchmark is void")
    best = best_interleaved({"ours": lambda: model.run(x, "cpu"), "ort": lambda: session.run(None, feed)},
                            rounds=repeats, repeats=1)
    ours, theirs = best["ours"], best["ort"]
    row.update(gemforge_seconds=round(ours, 6), onnxruntime_seconds=round(theirs, 6),
               time_ratio=round(theirs / ours, 3), threads=cores())
    return row


def _int8_cpu_vs_ort_qdq(onnx_model, model, samples: np.ndarray, repeats: int) -> dict[str, Any]:
    """The int8 network (``model``, every layer on the CPU back end) against ONNX Runtime's static
    QDQ int8 of the same float model (u8 activations × s8 weights, per-tensor, calibrated on the
    same ``samples``, after ORT's own pre-processing, which folds BatchNorm first), alternating
    rounds, same threads; each output's cosine to the float32 network's."""
    if importlib.util.find_spec("onnxruntime") is None:
        return {"onnxruntime": "not installed (the dev extra)"}
    import tempfile
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    name = onnx_model.graph.input[0].name

    class Samples(CalibrationDataReader):
        def __init__(self):
            self.left = iter([{name: sample} for sample in samples])

        def get_next(self):
            return next(self.left, None)
    with tempfile.TemporaryDirectory() as folder:
        plain, ready, quantized = (str(Path(folder) / f) for f in ("float.onnx", "pre.onnx", "qdq.onnx"))
        onnx.save(onnx_model, plain)
        quant_pre_process(plain, ready, skip_symbolic_shape=True)
        quantize_static(ready, quantized, Samples(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        qdq = ort_session(onnx.load(quantized))
    x = samples[0]
    feed = {name: x}
    reference = ort_session(onnx_model).run(None, feed)[0]
    ours, theirs = model.run(x, "cpu"), qdq.run(None, feed)[0]
    best = best_interleaved({"ours": lambda: model.run(x, "cpu"), "ort": lambda: qdq.run(None, feed)},
                            rounds=repeats, repeats=1)
    return {"gemforge_seconds": round(best["ours"], 6), "onnxruntime_seconds": round(best["ort"], 6),
            "time_ratio": round(best["ort"] / best["ours"], 3), "threads": cores(),
            "gemforge_cosine": round(cosine(ours, reference), 5), "onnxruntime_cosine": round(cosine(theirs, reference), 5)}


def bench_networks(config: AccelConfig, device: str | None = None, quick: bool = False) -> dict[str, Any]:
    from gemforge.models import build_densenet121, build_mobilenet_v2, build_resnet18, digits
    results: dict[str, Any] = {}
    repeats = 3 if quick else 10

    # The digits CNN: accuracy of the int8 network on fsim against the float network.
    x_train, _, x_test, y_test = digits.load_split()
    start = time.perf_counter()
    int8 = compile_model(digits.MODEL_PATH, quantize="int8", calibrate=x_train[:len(x_test)][None], config=config,
                         batch=len(x_test))
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    logits = int8.run(x_test, "fsim")
    fsim_s = time.perf_counter() - start
    if not np.array_equal(logits, int8.run(x_test, "cpu")):
        raise AssertionError("the int8 digits network differs between fsim and the CPU; the benchmark is void")
    float_logits = compile_model(digits.MODEL_PATH, batch=len(x_test)).run(x_test, "cpu")
    results["digits"] = {
        "test_images": len(x_test), "float32_accuracy": round(digits.accuracy(float_logits, y_test), 4),
        "int8_accuracy": round(digits.accuracy(logits, y_test), 4), "int8_compile_seconds": round(compile_s, 3),
        "int8_fsim_seconds": round(fsim_s, 3),
        "cpu_float32": _cpu_vs_ort(onnx.load(str(digits.MODEL_PATH)), x_test, repeats),
    }
    if quick:
        return results

    # ResNet-18 (random weights, the standard topology), batch 1, 224x224.
    rng = np.random.default_rng(0)
    resnet = build_resnet18()
    x = rng.normal(size=(1, 3, 224, 224)).astype(np.float32)
    start = time.perf_counter()
    model = compile_model(resnet, quantize="int8", calibrate=x[None], config=config)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    on_fsim = model.run(x, "fsim")
    fsim_s = time.perf_counter() - start
    row: dict[str, Any] = {"int8_compile_seconds": round(compile_s, 3), "int8_fsim_seconds": round(fsim_s, 3),
                           **_placement(model), "memory": model.graph.notes.memory,
                           "cpu_float32": _cpu_vs_ort(resnet, x, repeats),
                           "cpu_int8": _int8_cpu_vs_ort_qdq(resnet, model, x[None], repeats)}
    if device not in (None, "fsim"):
        row["rtl"] = _on_rtl("ResNet-18", model, x, on_fsim, device, config)
    results["resnet18"] = row
    # MobileNetV2 (torchvision's topology, random weights): depthwise convolutions and ReLU6.
    mobilenet = build_mobilenet_v2()
    start = time.perf_counter()
    model = compile_model(mobilenet, quantize="int8", calibrate=x[None], config=config)
    compile_s = time.perf_counter() - start
    on_fsim = model.run(x, "fsim")
    if not np.array_equal(on_fsim, model.run(x, "cpu")):
        raise AssertionError("MobileNetV2 int8 differs between fsim and the CPU; the benchmark is void")
    row = {"int8_compile_seconds": round(compile_s, 3), **_placement(model),
           "cpu_float32": _cpu_vs_ort(mobilenet, x, repeats),
           "cpu_int8": _int8_cpu_vs_ort_qdq(mobilenet, model, x[None], repeats)}
    if device not in (None, "fsim"):
        row["rtl"] = _on_rtl("MobileNetV2", model, x, on_fsim, device, config)
    results["mobilenet_v2"] = row
    # DenseNet-121: concat-heavy blocks and pre-activation BatchNorms, float32 on the CPU.
    results["densenet121"] = {"cpu_float32": _cpu_vs_ort(build_densenet121(), x, repeats)}
    return results


def _placement(model) -> dict[str, Any]:
    """Where an int8 network's nodes run: how many, on the accelerator, the host round trips and the
    accelerator runs (chained programs) per inference."""
    nodes = model.graph.nodes
    summary = model.summary()
    return {"nodes": len(nodes), "accelerator_nodes": sum(n.device == "accel" for n in nodes),
            "host_round_trips": summary["host_round_trips"], "accelerator_runs": summary["accelerator_runs"]}


def _on_rtl(name: str, model, x: np.ndarray, on_fsim: np.ndarray, device: str, config: AccelConfig) -> dict[str, Any]:
    """An int8 network's run on an RTL device, checked against fsim: its cycles, GEMM-core and
    useful-MAC utilization, and the sum of its layers' rooflines (`measure.roofline`: each
    program's time on an ideal machine, its compute at the rate its micro-ops give — a
    depthwise layer's ``block_out`` useful products a cycle — or its DRAM traffic)."""
    start = time.perf_counter()
    on_rtl = model.run(x, device)
    wall = time.perf_counter() - start
    if not np.array_equal(on_rtl, on_fsim):
        raise AssertionError(f"{name} differs between {device} and fsim; the benchmark is void")
    layers = [r.as_dict() for r in model.last_profile if r.cycles is not None]
    totals = profile_totals(model.last_profile)
    macs = sum(r.macs or 0 for r in model.last_profile)
    bound = sum(roofline(model.net.layers[node.name].program)["cycles"]
                for node in model.graph.nodes if node.device == "accel")
    return {"device": device, "config": config.name, "wall_seconds": round(wall, 1), "cycles": totals["cycles"],
            "gemm_utilization": totals["gemm_utilization"], "macs": macs,
            "useful_mac_utilization": round(macs / (totals["cycles"] * config.macs_per_uop), 4),
            "roofline_cycles": bound, "layers": layers}
