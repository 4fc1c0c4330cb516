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


def run_benchmarks(config: AccelConfig, quick: bool = False) -> dict[str, Any]:
    m, k, n = (64, 256, 256) if quick else (512, 1024, 1024)
    return {"fsim_gemm": bench_fsim_gemm(config, m, k, n, repeats=1 if quick else 3)}
