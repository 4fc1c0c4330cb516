"""`gemforge bench --sections tuning`: what `gemforge tune` gains, and what it costs.

For ResNet-18 and MobileNetV2 (random weights, 224×224, batch 1):

- **CPU, float32**: the network tuned on this machine (`tune_model`, ``--trials`` per operator),
  then the untuned and the tuned model run in alternating rounds, best of each (same process,
  same threads); the outputs must agree.
- **Accelerator, int8**: the convolutions tuned on the cycle model for the config; the network's
  accelerator layers' cycles (cycle model, summed) untuned and tuned, and the tuned model's
  output bit-identical on fsim and on the CPU back end.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from gemforge.compiler.tuning.log import TuningLog
from gemforge.hw.config import AccelConfig
from gemforge.models import build_mobilenet_v2, build_resnet18
from gemforge.sim.cycle_model import run_cycle_model

from ..runtime.model import compile_model
from .measure import best_interleaved, cores
from .tune import tune_model

__all__ = ["bench_tuning"]


def bench_tuning(config: AccelConfig, quick: bool = False) -> dict[str, Any]:
    networks = {"resnet18": build_resnet18, "mobilenet_v2": build_mobilenet_v2}
    if quick:
        networks = {"resnet18": build_resnet18}
    cpu_trials, fsim_trials = (3, 4) if quick else (24, 32)
    out: dict[str, Any] = {"threads": cores(), "cpu_trials": cpu_trials, "fsim_trials": fsim_trials,
                           "config": config.name, "networks": {}}
    with tempfile.TemporaryDirectory() as folder:
        for name, build in networks.items():
            onnx_model = build()
            x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
            out["networks"][name] = {"cpu": _cpu(onnx_model, x, Path(folder) / f"{name}.cpu.jsonl", cpu_trials,
                                                 3 if quick else 7),
                                     "fsim": _fsim(onnx_model, x, Path(folder) / f"{name}.fsim.jsonl", config,
                                                   fsim_trials)}
    return out


def _cpu(onnx_model, x: np.ndarray, log: Path, trials: int, rounds: int) -> dict[str, Any]:
    start = time.perf_counter()
    summary = tune_model(onnx_model, log, trials=trials, progress=False, log=lambda _: None)
    tuning_seconds = time.perf_counter() - start
    untuned = compile_model(onnx_model)
    tuned = compile_model(onnx_model, tuning=TuningLog.load(log))
    reference, got = untuned.run(x, "cpu"), tuned.run(x, "cpu")
    scale = float(np.abs(reference).max()) or 1.0
    if not np.allclose(got, reference, rtol=1e-4, atol=1e-4 * scale):
        raise AssertionError("the tuned float32 network differs from the untuned one; the benchmark is void")
    best = best_interleaved({"untuned": lambda: untuned.run(x, "cpu"), "tuned": lambda: tuned.run(x, "cpu")},
                            rounds=rounds, repeats=1)
    return {"operators": summary["operators"], "trials": summary["trials"], "tuning_seconds": round(tuning_seconds, 1),
            "untuned_seconds": round(best["untuned"], 6), "tuned_seconds": round(best["tuned"], 6),
            "gain": round(best["untuned"] / best["tuned"], 3),
            "operators_gain_as_measured": summary["gain"]}


def _fsim(onnx_model, x: np.ndarray, log: Path, config: AccelConfig, trials: int) -> dict[str, Any]:
    start = time.perf_counter()
    summary = tune_model(onnx_model, log, device="fsim", trials=trials, quantize="int8", calibrate=x[None],
                         config=config, progress=False, log=lambda _: None)
    tuning_seconds = time.perf_counter() - start
    cycles = {}
    for label, tuning in (("untuned", ()), ("tuned", TuningLog.load(log))):
        model = compile_model(onnx_model, quantize="int8", calibrate=x[None], config=config, tuning=tuning,
                              shipped_tuning=False)
        cycles[label] = sum(run_cycle_model(layer.program.instructions, config).cycles
                            for layer in model.net.layers.values())
        if label == "tuned" and not np.array_equal(model.run(x, "fsim"), model.run(x, "cpu")):
            raise AssertionError("the tuned int8 network differs between fsim and the CPU; the benchmark is void")
    return {"operators": summary["operators"], "trials": summary["trials"], "tuning_seconds": round(tuning_seconds, 1),
            "untuned_cycles": cycles["untuned"], "tuned_cycles": cycles["tuned"],
            "gain": round(cycles["untuned"] / cycles["tuned"], 4)}
