"""Benchmarks of the LLVM back ends, each next to its baseline in the same run.

- CPU, float32 GEMM against numpy's BLAS (same threads: both use every core);
- CPU, the ResNet-18 convolutions in float32 against ONNX Runtime running the
  same single Conv, and in int8 with the requantizing epilogue against ONNX
  Runtime's QLinearConv (int8 activations, and uint8 — its VNNI path — for
  reference), same threads;
- GPU (where one is present), float32 and int8 GEMM beside the device's peak;
- compile time per operator and target.

Timings interleave the candidate and the baseline and keep each one's best, so a
slow moment of a shared machine hits both; each block of calls starts with untimed
calls while the other side's threads stop spinning. Operands are cache-line aligned.
Every result is checked first.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import numpy as np

from gemforge.compiler.ops.common import out_size
from gemforge.models.resnet import RESNET18_LAYERS

from .measure import best_interleaved, cores, ort_session

__all__ = ["bench_cpu", "bench_gpu"]


def _args(op, host: dict[str, np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The kernel's argument arrays for ``host`` inputs, and its output array."""
    from gemforge.compiler.backends.cpu import aligned_empty

    def aligned(array: np.ndarray) -> np.ndarray:
        out = aligned_empty(array.shape, array.dtype)
        out[...] = array
        return out
    packed = op.pack_inputs(**host)
    arrays = [aligned(packed[b.name]) if b.name in packed else aligned(np.zeros(b.shape, b.dtype))
              for b in op.program.params]
    return arrays, arrays[-1]


def _conv_model(xs, ws, stride, padding, w: np.ndarray):
    import onnx
    from onnx import helper, numpy_helper
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(xs))
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[padding] * 4)
    graph = helper.make_graph([node], "conv", [x], [y], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _qconv_model(xs, ws, stride, padding, w: np.ndarray, bias: np.ndarray, activation: str):
    """QLinearConv with power-of-two scales: the epilogue's requantization, except that
    ONNX rounds to nearest where the epilogue's shift floors (the same work)."""
    import onnx
    from onnx import helper, numpy_helper
    elem = onnx.TensorProto.INT8 if activation == "int8" else onnx.TensorProto.UINT8
    x = helper.make_tensor_value_info("x", elem, list(xs))
    y = helper.make_tensor_value_info("y", elem, None)
    zero = np.array(0 if activation == "int8" else 128, np.int8 if activation == "int8" else np.uint8)
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "x_scale"), numpy_helper.from_array(zero, "x_zp"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1.0, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
             numpy_helper.from_array(np.array(256.0, np.float32), "y_scale"), numpy_helper.from_array(zero, "y_zp"),
             numpy_helper.from_array(bias, "b")]
    node = helper.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "b"],
                            ["y"], strides=[stride] * 2, pads=[padding] * 4)
    graph = helper.make_graph([node], "qconv", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _conv_flops(xs, ws, stride, padding) -> int:
    oh, ow = (out_size(xs[d], ws[d], stride, padding) for d in (2, 3))
    return 2 * xs[0] * ws[0] * ws[1] * ws[2] * ws[3] * oh * ow


#: The CPU target with its AVX-512 turned off (LLVM drops the AVX-512 extensions with their base):
#: what an AVX2 machine gets, measured here.
WITHOUT_AVX512 = "host,-avx512f"


def bench_cpu_gemm(size: int = 1024, rounds: int = 5) -> dict[str, Any]:
    """float32 GEMM size³ on the CPU back end against numpy's BLAS and ONNX Runtime's MatMul (where
    installed), for this CPU and for it with AVX-512 turned off (`WITHOUT_AVX512`)."""
    from gemforge.compiler import CpuTarget
    from gemforge.compiler.backends.cpu import has_feature
    from gemforge.compiler.ops import compile_dense
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(np.float32)
    b = rng.standard_normal((size, size)).astype(np.float32)
    expect = a @ b
    candidates, plans, compile_seconds = {}, {}, 0.0
    targets = {"gemforge": CpuTarget()}
    if has_feature(CpuTarget(), "avx512f"):
        targets["gemforge_avx2"] = CpuTarget(features=WITHOUT_AVX512)
    for name, target in targets.items():
        start = time.perf_counter()
        op = compile_dense(target, size, size, size, dtype="float32")
        if name == "gemforge":
            compile_seconds = time.perf_counter() - start
        # Both sides get the same cache-line aligned operands.
        arrays, out = _args(op, {"a": a, "b": b})
        op.program(*arrays)
        if not np.allclose(op.unpack_output(out), expect, rtol=1e-3, atol=1e-3 * np.abs(expect).max()):
            raise AssertionError("the CPU GEMM differs from numpy; benchmark is void")
        candidates[name] = lambda kernel=op.program, arrays=arrays: kernel(*arrays)
        plans[name] = op.plan
    candidates["numpy"] = lambda: a @ b
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnx
        from onnx import TensorProto, helper
        graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "gemm",
                                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])],
                                  [onnx.numpy_helper.from_array(b, "b")])
        session = ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))
        candidates["onnxruntime"] = lambda: session.run(None, {"a": a})
    t = best_interleaved(candidates, rounds=rounds)
    flops = 2 * size ** 3
    gflops = {name: round(flops / seconds / 1e9, 1) for name, seconds in t.items()}
    best_library = min(t[k] for k in ("numpy", "onnxruntime") if k in t)
    out = {"shape": [size] * 3, "threads": cores(), "plan": plans["gemforge"],
           "compile_seconds": round(compile_seconds, 3), "gemforge_gflops": gflops["gemforge"],
           "numpy_gflops": gflops["numpy"], "ratio_vs_numpy": round(t["numpy"] / t["gemforge"], 2),
           "ratio_vs_best_library": round(best_library / t["gemforge"], 2)}
    if "onnxruntime" in t:
        out["onnxruntime_gflops"] = gflops["onnxruntime"]
    if "gemforge_avx2" in t:
        out.update(avx2_gflops=gflops["gemforge_avx2"], avx2_plan=plans["gemforge_avx2"],
                   avx2_ratio_vs_best_library=round(best_library / t["gemforge_avx2"], 2))
    return out


def bench_cpu_convs(layers, rounds: int = 3) -> dict[str, Any]:
    """Each ResNet-18 convolution on the CPU back end: float32 against ONNX Runtime's Conv,
    int8 (bias, >> 8, ReLU) against its QLinearConv (int8 and uint8 activations)."""
    from gemforge.compiler import CpuTarget
    from gemforge.compiler.ops import compile_conv2d, conv2d_reference
    target = CpuTarget()
    rng = np.random.default_rng(1)
    rows: dict[str, Any] = {}
    for name, xs, ws, stride, padding in layers:
        flops = _conv_flops(xs, ws, stride, padding)
        row: dict[str, Any] = {"flops": flops}
        # float32
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(ws[1] * ws[2] * ws[3])).astype(np.float32)
        start = time.perf_counter()
        op = compile_conv2d(target, xs, ws, stride=stride, padding=padding, dtype="float32")
        row["compile_seconds"] = round(time.perf_counter() - start, 3)
        arrays, out = _args(op, {"x": x, "w": w})
        op.program(*arrays)
        session = ort_session(_conv_model(xs, ws, stride, padding, w))
        expect = session.run(None, {"x": x})[0]
        if not np.allclose(op.unpack_output(out), expect, rtol=1e-3, atol=1e-3):
            raise AssertionError(f"{name}: the CPU conv2d differs from ONNX Runtime; benchmark is void")
        t = best_interleaved({"gemforge": lambda: op.program(*arrays),
                              "ort": lambda: session.run(None, {"x": x})}, rounds=rounds)
        row["float32"] = {"gemforge_gflops": round(flops / t["gemforge"] / 1e9, 1),
                          "ort_gflops": round(flops / t["ort"] / 1e9, 1), "ratio_vs_ort": round(t["ort"] / t["gemforge"], 2),
                          "gemforge_ms": round(t["gemforge"] * 1e3, 3), "ort_ms": round(t["ort"] * 1e3, 3),
                          "plan": op.plan}
        # int8 with the requantizing epilogue
        x8 = rng.integers(-128, 128, xs).astype(np.int8)
        w8 = rng.integers(-128, 128, ws).astype(np.int8)
        bias = rng.integers(-4096, 4096, ws[0]).astype(np.int32)
        op8 = compile_conv2d(target, xs, ws, stride=stride, padding=padding, dtype="int8", bias=True, shift=8, relu=True)
        arrays8, out8 = _args(op8, {"x": x8, "w": w8, "bias": bias})
        op8.program(*arrays8)
        if not np.array_equal(op8.unpack_output(out8), conv2d_reference(x8, w8, bias, stride, padding, 8, True)):
            raise AssertionError(f"{name}: the CPU int8 conv2d differs from numpy; benchmark is void")
        q8 = ort_session(_qconv_model(xs, ws, stride, padding, w8, bias, "int8"))
        qu8 = ort_session(_qconv_model(xs, ws, stride, padding, w8, bias, "uint8"))
        xu8 = (x8.astype(np.int16) + 128).astype(np.uint8)
        t = best_interleaved({"gemforge": lambda: op8.program(*arrays8), "ort_s8": lambda: q8.run(None, {"x": x8}),
                              "ort_u8": lambda: qu8.run(None, {"x": xu8})}, rounds=rounds)
        row["int8"] = {"gemforge_gops": round(flops / t["gemforge"] / 1e9, 1),
                       "ort_int8_gops": round(flops / t["ort_s8"] / 1e9, 1),
                       "ort_uint8_gops": round(flops / t["ort_u8"] / 1e9, 1),
                       "ratio_vs_ort_int8": round(t["ort_s8"] / t["gemforge"], 2),
                       "ratio_vs_ort_uint8": round(t["ort_u8"] / t["gemforge"], 2),
                       "gemforge_ms": round(t["gemforge"] * 1e3, 3), "plan": op8.plan}
        rows[name] = row
    f_ratio = sum(r["float32"]["ort_ms"] for r in rows.values()) / sum(r["float32"]["gemforge_ms"] for r in rows.values())
    return {"threads": cores(), "layers": rows, "float32_total_ratio_vs_ort": round(f_ratio, 2)}


def bench_compile_times() -> dict[str, Any]:
    """Compile time of dense and conv2d for each target (the GPU's includes ptxas)."""
    from gemforge.compiler import CpuTarget, GpuTarget
    from gemforge.compiler.ops import compile_conv2d, compile_dense
    from gemforge.hw.config import PRESETS
    out: dict[str, Any] = {}
    for target_name, target in (("accel (default)", PRESETS["default"]), ("cpu", CpuTarget()), ("gpu", GpuTarget())):
        row = {}
        for op_name, make in (("dense 256×1024·1024", lambda: compile_dense(target, 256, 1024, 1024)),
                              ("conv2d 64×56×56, 3×3", lambda: compile_conv2d(target, (1, 64, 56, 56), (64, 64, 3, 3),
                                                                              padding=1))):
            start = time.perf_counter()
            make()
            row[op_name] = round(time.perf_counter() - start, 3)
        out[target_name] = row
    return out


def bench_cpu(quick: bool = False) -> dict[str, Any]:
    """The CPU back end's figures (`quick`: a small GEMM only)."""
    if quick:
        return {"gemm": bench_cpu_gemm(256, rounds=1)}
    results = {"gemm": bench_cpu_gemm(1024)}
    if importlib.util.find_spec("onnxruntime") is None:  # the baseline is a dev extra
        results["resnet18_convs_skipped"] = ("ONNX Runtime, their baseline, is not installed "
                                             "(pip install 'gemforge[dev]')")
    else:
        results["resnet18_convs"] = bench_cpu_convs(RESNET18_LAYERS)
    results["compile_seconds"] = bench_compile_times()
    return results


def bench_gpu(size: int = 4096) -> dict[str, Any]:
    """float32 and int8 GEMM on the GPU (kernels alone, data resident), checked against
    numpy on a slice, beside the device's float32 peak (SMs × 128 lanes × 2 × clock)."""
    from gemforge.compiler.backends.gpu import cuda
    from gemforge.compiler.ops import compile_dense
    from gemforge.driver.runtime.device import open_device
    device = open_device("gpu")
    dev = cuda.device()
    peak = dev.multiprocessors * 128 * 2 * dev.clock_khz * 1e3
    rng = np.random.default_rng(2)
    report: dict[str, Any] = {"device": dev.name, "arch": dev.arch, "fp32_peak_tflops": round(peak / 1e12, 1)}
    for dtype in ("float32", "int8"):
        if dtype == "float32":
            a = rng.standard_normal((size, size)).astype(np.float32)
            b = rng.standard_normal((size, size)).astype(np.float32)
        else:
            a = rng.integers(-128, 128, (size, size)).astype(np.int8)
            b = rng.integers(-128, 128, (size, size)).astype(np.int8)
        start = time.perf_counter()
        op = compile_dense(device.target, size, size, size, dtype=dtype)
        compile_seconds = time.perf_counter() - start
        arrays, out = _args(op, {"a": a, "b": b})
        seconds = op.program.time(*arrays, repeats=5)
        got = op.unpack_output(out)
        rows = slice(0, 64)
        expect = (a[rows].astype(np.float64) @ b.astype(np.float64)) if dtype == "float32" else \
            (a[rows].astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
        ok = np.allclose(got[rows], expect, rtol=1e-3, atol=1e-2) if dtype == "float32" else \
            np.array_equal(got[rows], expect)
        if not ok:
            raise AssertionError(f"the GPU {dtype} GEMM differs from numpy; benchmark is void")
        rate = 2 * size ** 3 / seconds
        report[dtype] = {"shape": [size] * 3, "seconds": round(seconds, 5), "tflops": round(rate / 1e12, 2),
                         "fraction_of_fp32_peak": round(rate / peak, 3), "compile_seconds": round(compile_seconds, 3),
                         "plan": op.plan}
    return report
