"""`gemforge bench`: performance figures, each measured next to its baseline in the same run.

Results are JSON so regressions can be tracked by machines; BENCHMARKS.md
records the latest figures with the command that made them.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from gemforge.hw.config import AccelConfig

__all__ = ["bench_fsim_gemm", "run_benchmarks"]


def _best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def bench_fsim_gemm(config: AccelConfig, m: int, k: int, n: int, repeats: int = 3) -> dict[str, Any]:
    """fsim's speed on the compiled GEMM, against numpy's int32 matmul of the same product."""
    from gemforge.compiler import compile_dense
    from .device import open_device

    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    compile_seconds, op = _best_of(1, lambda: compile_dense(config, m, k, n))
    device = open_device("fsim", config)
    loaded = device.load_program(op.program)
    for name, array in op.pack_inputs(a=a, b=b).items():
        device.write(loaded.tensor_buffer(name), array)
    seconds, result = _best_of(repeats, lambda: device.run(loaded))
    region = op.program.tensors[op.output]
    c = op.unpack_output(device.read(loaded.tensor_buffer(op.output), region.dtype, region.shape))
    a32, b32 = a.astype(np.int32), b.astype(np.int32)
    numpy_seconds, expected = _best_of(repeats, lambda: a32 @ b32)
    if not np.array_equal(c, expected):
        raise AssertionError("fsim GEMM result differs from numpy; benchmark is void")
    uops = result.counters["gemm_uops"] - result.counters["gemm_reset_uops"]
    return {
        "config": config.name, "shape": [m, k, n], "instructions": result.counters["insns"],
        "compile_seconds": round(compile_seconds, 4),
        "gemm_uops": uops, "seconds": round(seconds, 4),
        "uops_per_second": round(uops / seconds),
        "macs_per_second": round(result.counters["macs"] / seconds),
        "numpy_int32_seconds": round(numpy_seconds, 4),
        "time_ratio_vs_numpy": round(seconds / numpy_seconds, 2),
    }


#: The distinct convolution layers of ResNet-18 after the first (batch 1):
#: (name, input NCHW, weight OIHW, stride, padding).
RESNET18_LAYERS = [
    ("conv2_3x3", (1, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("conv3_3x3_s2", (1, 64, 56, 56), (128, 64, 3, 3), 2, 1),
    ("conv3_1x1_s2", (1, 64, 56, 56), (128, 64, 1, 1), 2, 0),
    ("conv3_3x3", (1, 128, 28, 28), (128, 128, 3, 3), 1, 1),
    ("conv4_3x3_s2", (1, 128, 28, 28), (256, 128, 3, 3), 2, 1),
    ("conv4_1x1_s2", (1, 128, 28, 28), (256, 128, 1, 1), 2, 0),
    ("conv4_3x3", (1, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    ("conv5_3x3_s2", (1, 256, 14, 14), (512, 256, 3, 3), 2, 1),
    ("conv5_1x1_s2", (1, 256, 14, 14), (512, 256, 1, 1), 2, 0),
    ("conv5_3x3", (1, 512, 7, 7), (512, 512, 3, 3), 1, 1),
]


def _utilization_run(device, op, inputs: dict[str, np.ndarray], expected: np.ndarray) -> dict[str, Any]:
    start = time.perf_counter()
    out, result = op.run(device, **inputs)
    wall = time.perf_counter() - start
    if not np.array_equal(out, expected):
        raise AssertionError(f"{op.name} on {device.kind} differs from numpy; benchmark is void")
    if result.cycles is None:
        raise ValueError(f"device {device.kind!r} reports no cycles; utilization needs an RTL device")
    active = result.hw_counters["gemm_active"]
    return {"cycles": result.cycles, "gemm_active_cycles": active,
            "utilization": round(active / result.cycles, 4), "sim_seconds": round(wall, 2),
            "sim_cycles_per_second": round(result.cycles / wall)}


def bench_utilization(config: AccelConfig, device_kind: str, layers: list | None = None) -> dict[str, Any]:
    """GEMM-core utilization (GEMM-active cycles / total cycles, from the RTL counters) of
    dense 256×1024·1024×1024 and the ResNet-18 convolutions, each with latency hiding on
    and off in the same run; compile time per operator."""
    from gemforge.compiler import compile_conv2d, compile_dense, conv2d_reference, dense_reference
    from .device import open_device

    rng = np.random.default_rng(0)
    report: dict[str, Any] = {"config": config.name, "device": device_kind}
    with open_device(device_kind, config) as device:
        a = rng.integers(-128, 128, (256, 1024), dtype=np.int8)
        b = rng.integers(-128, 128, (1024, 1024), dtype=np.int8)
        expected = dense_reference(a, b)
        t0 = time.perf_counter()
        op = compile_dense(config, 256, 1024, 1024)
        entry = {"compile_seconds": round(time.perf_counter() - t0, 3)}
        entry.update(_utilization_run(device, op, {"a": a, "b": b}, expected))
        report["dense_256x1024x1024"] = entry
        rows = {}
        for name, xs, ws, stride, padding in (layers or RESNET18_LAYERS):
            x = rng.integers(-128, 128, xs, dtype=np.int8)
            w = rng.integers(-128, 128, ws, dtype=np.int8)
            expected = conv2d_reference(x, w, stride=stride, padding=padding)
            row = {}
            for hiding in (True, False):
                t0 = time.perf_counter()
                op = compile_conv2d(config, xs, ws, stride=stride, padding=padding, latency_hiding=hiding)
                compile_s = round(time.perf_counter() - t0, 3)
                run = _utilization_run(device, op, {"x": x, "w": w}, expected)
                row["latency_hiding" if hiding else "no_latency_hiding"] = {"compile_seconds": compile_s, **run}
            rows[name] = row
        report["resnet18"] = rows
        for key in ("latency_hiding", "no_latency_hiding"):
            values = [r[key]["utilization"] for r in rows.values()]
            report[f"resnet18_mean_utilization_{key}"] = round(sum(values) / len(values), 4)
    return report


def run_benchmarks(config: AccelConfig, quick: bool = False, device: str | None = None) -> dict[str, Any]:
    """The fsim speed benchmark; with an RTL ``device``, also the utilization suite."""
    m, k, n = (64, 256, 256) if quick else (512, 1024, 1024)
    results: dict[str, Any] = {"fsim_gemm": bench_fsim_gemm(config, m, k, n, repeats=1 if quick else 3)}
    if device is not None and device != "fsim":
        from .rtl_perf import measure
        results["rtl_core"] = measure(config, simulator=device)
        results["utilization"] = bench_utilization(config, device, RESNET18_LAYERS[:2] if quick else None)
    return results
