"""`gemforge bench`: performance figures, each measured next to its baseline in the same run.

Results are JSON so regressions can be tracked by machines; BENCHMARKS.md
records the latest figures with the command that made them.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.models.resnet import RESNET18_CONVS, RESNET18_LAYERS

from .measure import best_of, roofline

__all__ = ["bench_fsim_gemm", "run_benchmarks"]


def bench_fsim_gemm(config: AccelConfig, m: int, k: int, n: int, repeats: int = 3) -> dict[str, Any]:
    """fsim's speed on the compiled GEMM, against numpy's int32 matmul of the same product."""
    from gemforge.compiler import compile_dense
    from ..runtime.device import open_device

    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    compile_seconds, op = best_of(1, lambda: compile_dense(config, m, k, n))
    device = open_device("fsim", config)
    loaded = device.load_program(op.program)
    for name, array in op.pack_inputs(a=a, b=b).items():
        device.write(loaded.tensor_buffer(name), array)
    seconds, result = best_of(repeats, lambda: device.run(loaded))
    region = op.program.tensors[op.output]
    c = op.unpack_output(device.read(loaded.tensor_buffer(op.output), region.dtype, region.shape))
    a32, b32 = a.astype(np.int32), b.astype(np.int32)
    numpy_seconds, expected = best_of(repeats, lambda: a32 @ b32)
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


#: How each ResNet layer is compiled: (key, latency hiding, requantizing epilogue).
#: Without the epilogue the output is the int32 accumulator; with it, the layer
#: of a quantized network: ``clip((acc + bias) >> 8, 0, 127)`` as int8 — fused by
#: default (an overwriting first GEMM, bias, shift and ReLU in the requantizing
#: STORE), and on the ALU between the GEMMs with a reset GEMM in the ``_alu``
#: variant (`gemforge.compiler.backends.accel.fusion.alu_epilogue`), the baseline.
RESNET18_VARIANTS = [
    ("latency_hiding", True, False),
    ("no_latency_hiding", False, False),
    ("int8_epilogue", True, True),
    ("int8_epilogue_alu", True, True),
]


def _utilization_run(device, op, inputs: dict[str, np.ndarray], expected: np.ndarray) -> dict[str, Any]:
    start = time.perf_counter()
    out, result = op.run(device, **inputs)
    wall = time.perf_counter() - start
    if not np.array_equal(out, expected):
        raise AssertionError(f"{op.name} on {device.kind} differs from numpy; benchmark is void")
    if result.cycles is None:
        raise ValueError(f"device {device.kind!r} reports no cycles; utilization needs an RTL device")
    # Reset micro-ops occupy the GEMM core but multiply nothing: they do not count.
    macs = result.hw_counters["gemm_active"] - result.hw_counters["gemm_reset"]
    # The cycle model's prediction of the same program, and how long it took (issue 13).
    from gemforge.sim.cycle_model import run_cycle_model
    start = time.perf_counter()
    model = run_cycle_model(op.program.instructions, op.program.config).cycles
    model_seconds = time.perf_counter() - start
    ideal = roofline(op.program)
    ideal["roofline_cycles"] = ideal.pop("cycles")     # the ideal machine's, not the run's
    return {"cycles": result.cycles, "gemm_mac_cycles": macs,
            "model_cycles": model, "model_error": round(model / result.cycles - 1, 4),
            "model_seconds": round(model_seconds, 4),
            "gemm_reset_cycles": result.hw_counters["gemm_reset"],
            "utilization": round(macs / result.cycles, 4), **ideal,
            "sim_seconds": round(wall, 2), "sim_cycles_per_second": round(result.cycles / wall)}


def bench_utilization(config: AccelConfig, device_kind: str, layers: list | None = None) -> dict[str, Any]:
    """GEMM-core utilization (cycles the GEMM core multiply-accumulates / total cycles, from
    the RTL counters gemm_active − gemm_reset) of
    dense 256×1024·1024×1024 and the ResNet-18 convolutions (`RESNET18_VARIANTS`), each
    with latency hiding on and off in the same run; compile time and tiling per operator."""
    from gemforge.compiler import compile_conv2d, compile_dense, conv2d_reference, dense_reference
    from gemforge.compiler.backends.accel.fusion import alu_epilogue
    from ..runtime.device import open_device

    rng = np.random.default_rng(0)
    report: dict[str, Any] = {"config": config.name, "device": device_kind}
    with open_device(device_kind, config) as device:
        a = rng.integers(-128, 128, (256, 1024), dtype=np.int8)
        b = rng.integers(-128, 128, (1024, 1024), dtype=np.int8)
        expected = dense_reference(a, b)
        entry = {}
        for key, hiding in (("latency_hiding", True), ("no_latency_hiding", False)):
            t0 = time.perf_counter()
            op = compile_dense(config, 256, 1024, 1024, latency_hiding=hiding)
            entry[key] = {"compile_seconds": round(time.perf_counter() - t0, 3), "plan": op.plan,
                          **_utilization_run(device, op, {"a": a, "b": b}, expected)}
        report["dense_256x1024x1024"] = entry
        rows = {}
        for name, xs, ws, stride, padding in (layers or RESNET18_LAYERS):
            x = rng.integers(-128, 128, xs, dtype=np.int8)
            w = rng.integers(-128, 128, ws, dtype=np.int8)
            bias = rng.integers(-(1 << 12), 1 << 12, ws[0], dtype=np.int32)
            row = {}
            for key, hiding, epilogue in RESNET18_VARIANTS:
                t0 = time.perf_counter()
                with alu_epilogue() if key.endswith("_alu") else contextlib.nullcontext():
                    op = compile_conv2d(config, xs, ws, stride=stride, padding=padding, latency_hiding=hiding,
                                        bias=epilogue, shift=8 if epilogue else None, relu=epilogue)
                compile_s = round(time.perf_counter() - t0, 3)
                inputs = {"x": x, "w": w, **({"bias": bias} if epilogue else {})}
                expected = conv2d_reference(x, w, bias if epilogue else None, stride=stride, padding=padding,
                                            shift=8 if epilogue else None, relu=epilogue)
                run = _utilization_run(device, op, inputs, expected)
                row[key] = {"compile_seconds": compile_s, "plan": op.plan, **run}
            rows[name] = row
        report["resnet18"] = rows
        for key, _, _ in RESNET18_VARIANTS:
            values = [r[key]["utilization"] for r in rows.values()]
            report[f"resnet18_mean_utilization_{key}"] = round(sum(values) / len(values), 4)
        counts = {row[0]: row[5] for row in RESNET18_CONVS}
        if set(rows) == set(counts):
            # The whole network's offloaded convolutions: each layer's cycles times its count.
            report["resnet18_network_convs"] = {
                key: {"cycles": sum(r[key]["cycles"] * counts[n] for n, r in rows.items()),
                      "model_cycles": sum(r[key]["model_cycles"] * counts[n] for n, r in rows.items())}
                for key, _, _ in RESNET18_VARIANTS}
    return report


def bench_regress(configs: list[AccelConfig], device: str, quick: bool = False) -> dict[str, Any]:
    """Co-simulation regression throughput (`gemforge regress`): random programs per second
    checked on the RTL against fsim, batched in one simulator process (one job, and one per
    CPU), against the baseline of one simulator process per program (builds excluded)."""
    import os

    from gemforge.sim import regress
    from gemforge.sim.cosim import harness

    jobs = os.cpu_count() or 1
    rows = []
    for config in configs:
        harness.build(config, device)
        count = 60 if quick else 400
        single = regress.regress([config], count, 0, device, jobs=1, batch=100)
        parallel = regress.regress([config], count, 0, device, jobs=jobs, batch=100)
        baseline = regress.regress([config], 6 if quick else 20, 0, device, jobs=1, batch=1)
        for report in (single, parallel, baseline):
            if report.mismatches:
                raise RuntimeError(f"regression benchmark: {len(report.mismatches)} mismatch(es) on {config.name}")
        rows.append({"config": config.name, "programs": count, "jobs": jobs,
                     "programs_per_s_one_job": round(single.programs_per_second, 1),
                     "programs_per_s": round(parallel.programs_per_second, 1),
                     "baseline_programs_per_s": round(baseline.programs_per_second, 2),
                     "speedup_one_job": round(single.programs_per_second / baseline.programs_per_second, 1),
                     "cycles_per_program": round(parallel.cycles / parallel.programs)})
    return {"device": device, "configs": rows, "mutant": _bench_mutant(configs[0], device, 40 if quick else 100)}


def _bench_mutant(config: AccelConfig, device: str, count: int) -> dict[str, Any]:
    """Seconds to report the injected bug (`sim.mutants`) in a regression of ``count``
    programs, and to locate and shrink its first mismatch (builds excluded)."""
    import tempfile

    from gemforge.sim import regress
    from gemforge.sim.cosim import harness
    from gemforge.sim.mutants import applied

    with applied("alu-min-unsigned") as mutant:
        built = harness.build(config, device, variant=mutant.variant)
        harness.build(config, device, waves=harness.WAVE_FORMATS[device][0], variant=mutant.variant)
        t0 = time.perf_counter()
        report = regress.regress([config], count, 0, device, jobs=1, batch=100, variant=mutant.variant)
        detect = time.perf_counter() - t0
        if not report.mismatches:
            raise RuntimeError(f"the {mutant.name} mutant went unnoticed in {count} programs")
        with tempfile.TemporaryDirectory() as scratch:
            t1 = time.perf_counter()
            summary = regress.investigate(built, report.mismatches[0].case, Path(scratch))
            shrink = time.perf_counter() - t1
    return {"mutant": mutant.name, "config": config.name, "programs": count,
            "failing_programs": len(report.mismatches), "detect_s": round(detect, 1),
            "investigate_s": round(shrink, 1), "original_instructions": summary["instructions"]["original"],
            "reproducer_instructions": summary["instructions"]["reproducer"]}


#: What `bench --sections synth` synthesizes: (preset, target, board or None). Every preset
#: through generic Yosys; the bare accelerator through the ECP5 flow (place and route, minutes)
#: and the iCE40 fit check; the ulx3s preset's board top to a bitstream on its board.
SYNTH_POINTS = (("tiny", "generic", None), ("default", "generic", None), ("large", "generic", None),
                ("tiny", "ecp5-85f", None), ("tiny", "ice40-up5k", None), ("ulx3s", "ecp5-85f", "ulx3s"))


#: nextpnr's seeds. The bare accelerator on an FPGA is placed with each of them, as many at once
#: as the machine has cores, and its Fmax is the median of the placements that routed (another
#: seed moves Fmax a few percent either way, more than many a design change does). A board top,
#: whose clock is the board's, is built with the first seed that routes. A placement that router1
#: cannot route within `SYNTH_PLACE_TIMEOUT_S` (a congested draw can take it hours) is stopped.
SYNTH_SEEDS = (1, 2, 3)
SYNTH_PLACE_TIMEOUT_S = 1800.0


def _synth_point(name: str, target: str, board: str | None, out: Path, seed: int | None,
                 timeout_s: float | None) -> tuple[dict[str, Any], bool]:
    """`run_synth` of one point with one seed, its refusal or failure as a report (that is a
    result too); and whether place and route ran past ``timeout_s``."""
    from gemforge.hw.flow import synth
    from gemforge.hw.config import PRESETS
    place = synth.PlaceOptions(seed=seed, timeout_s=timeout_s) if target != "generic" else None
    try:
        return synth.run_synth(PRESETS[name], target, out, board=board, place=place), False
    except synth.FitError as exc:
        return {"config": name, "target": target, "status": "does not fit", "reason": str(exc)}, False
    except synth.PlaceTimeout as exc:
        return {"config": name, "target": target, "status": "failed", "reason": str(exc),
                "place_options": place.summary()}, True
    except synth.SynthError as exc:
        return {"config": name, "target": target, "status": "failed", "reason": str(exc)}, False


def bench_synth(points=SYNTH_POINTS, work_dir: str | None = None, seeds=SYNTH_SEEDS,
                timeout_s: float | None = SYNTH_PLACE_TIMEOUT_S, jobs: int | None = None) -> dict[str, Any]:
    """Resources and Fmax of each (preset, target, board) of ``points`` (`gemforge.hw.flow.synth.run_synth`).

    A bare accelerator on an FPGA target is placed with every one of ``seeds``, ``jobs`` at a
    time (default: the machine's cores); the point reports the median placement (the lower
    middle one of an even count) and lists every seed's Fmax. A board top uses the first of
    ``seeds`` that routes within ``timeout_s``. Either way the point records the seeds that
    ran past the limit."""
    import os
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    jobs = max(1, jobs or os.cpu_count() or 1)
    out: dict[str, Any] = {"points": []}
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        for name, target, board in points:
            start = time.perf_counter()

            def synthesize(seed, name=name, target=target, board=board):
                return _synth_point(name, target, board, Path(tmp) / f"{name}-{target}-{board}-{seed}", seed,
                                    timeout_s)
            if target == "generic":
                runs = [(None, *synthesize(None))]
            elif board is None:
                # In waves of `jobs` seeds, so that a refusal (the same for every seed) stops the
                # draws after the first wave. Threads suffice: each placement is a nextpnr process
                # (the GIL is released while the thread waits on it).
                runs = []
                with ThreadPoolExecutor(max_workers=min(jobs, len(seeds))) as pool:
                    for first in range(0, len(seeds), jobs):
                        wave = seeds[first:first + jobs]
                        runs += [(seed, *run) for seed, run in zip(wave, pool.map(synthesize, wave))]
                        if any(run["status"] == "does not fit" for _, run, _ in runs):
                            break
            else:
                runs = []
                for seed in seeds:
                    runs.append((seed, *synthesize(seed)))
                    if not runs[-1][2]:
                        break
                    if seed != seeds[-1]:
                        print(f"bench synth: {name} on {target} with seed {seed}: {runs[-1][1]['reason']}; "
                              f"trying seed {seeds[seeds.index(seed) + 1]}", file=sys.stderr)
            routed = sorted((run for run in runs if run[1].get("fmax_mhz")), key=lambda run: run[1]["fmax_mhz"])
            # The median placement; with none routed, the last run's failure (a board's last seed).
            report = routed[(len(routed) - 1) // 2][1] if routed else runs[-1][1]
            report["board"] = board
            report["seeds_timed_out"] = [seed for seed, _, timed_out in runs if timed_out]
            if target != "generic" and board is None:
                report["fmax_by_seed"] = {str(seed): run.get("fmax_mhz") for seed, run, _ in runs}
            report["wall_s"] = round(time.perf_counter() - start, 1)
            paths = report.get("place_and_route", {}).get("critical_paths", [])
            worst = max(paths, key=lambda p: p["delay_ns"]) if paths else None
            report["critical_path"] = f"{worst['start']} -> {worst['end']} ({worst['logic_levels']} levels)" \
                if worst else None
            out["points"].append({k: report.get(k) for k in ("config", "target", "board", "device", "status",
                                                             "reason", "resources", "fmax_mhz", "freq_mhz_requested",
                                                             "timing_met", "place_options", "fmax_by_seed",
                                                             "seeds_timed_out", "critical_path", "wall_s")})
    return out


def run_benchmarks(config: AccelConfig, quick: bool = False, device: str | None = None,
                   core_configs: list[AccelConfig] = (), sections: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The figures of ``sections`` (default: ``fsim``, ``cpu``, ``network`` and ``models``, ``rtl`` and
    ``regress`` with an RTL ``device``, ``gpu`` where a GPU is present): fsim's speed; the accelerator's core rates
    (of ``config`` and of each of ``core_configs``) and utilization on RTL; the LLVM CPU and
    GPU back ends against numpy, ONNX Runtime and the device's peak."""
    if sections is None:
        from gemforge.compiler.backends.gpu import cuda
        sections = ("fsim", "cpu", "network", "models") + (("rtl", "regress") if device not in (None, "fsim") else ()) + \
            (("gpu",) if cuda.available() else ())
    from gemforge.compiler.backends.cpu import host_description
    results: dict[str, Any] = {"machine": host_description()}
    if "fsim" in sections:
        m, k, n = (64, 256, 256) if quick else (512, 1024, 1024)
        results["fsim_gemm"] = bench_fsim_gemm(config, m, k, n, repeats=1 if quick else 3)
    if "rtl" in sections and device is not None and device != "fsim":
        from .rtl_perf import measure
        results["rtl_core"] = measure(config, simulator=device)
        others = [c for c in core_configs if c.name != config.name]
        if others:
            results["rtl_core_other_configs"] = {c.name: measure(c, simulator=device) for c in others}
        results["utilization"] = bench_utilization(config, device, RESNET18_LAYERS[:2] if quick else None)
    if "regress" in sections and device is not None and device != "fsim":
        from gemforge.hw.config import PRESETS
        configs = [PRESETS["tiny"]] + ([config] if config.name != "tiny" else [])
        results["regress"] = bench_regress(configs, device, quick)
    if "cpu" in sections:
        from .bench_llvm import bench_cpu
        results["cpu"] = bench_cpu(quick)
    if "network" in sections:
        from .bench_network import bench_networks
        results["network"] = bench_networks(config, device, quick)
    if "models" in sections:
        from .bench_models import bench_models
        results["models"] = bench_models(config.name if config.name in ("tiny", "default", "large") else "default",
                                         quick)
    if "tuning" in sections:
        from .bench_tuning import bench_tuning
        results["tuning"] = bench_tuning(config, quick)
    if "gpu" in sections:
        from .bench_llvm import bench_gpu
        results["gpu"] = bench_gpu(1024 if quick else 4096)
    if "synth" in sections:
        results["synth"] = bench_synth(SYNTH_POINTS[:1] if quick else SYNTH_POINTS)
    if "sweep" in sections:
        results["sweep"] = bench_sweep("small" if quick else "resnet18")
    return results


def bench_sweep(example: str, jobs: int = 2) -> dict[str, Any]:
    """A whole design sweep (``examples/sweeps/EXAMPLE.toml``) from an empty output directory on
    ``jobs`` local processes: its wall time, points, Pareto front, the cycle model's error on its
    RTL sample and the area model's on the confirmed Pareto points. Synthesis results cached by
    earlier runs are reused (as in any sweep); their count is reported."""
    import tempfile
    from .sweep import load_space, pareto_front, run_sweep
    from gemforge.sim.cosim.harness import cache_root
    path = Path(__file__).resolve().parents[2] / "examples" / "sweeps" / f"{example}.toml"
    if not path.is_file():
        raise FileNotFoundError(f"the example space {path} is missing (run from a source checkout)")
    space = load_space(path)
    synth_cache = cache_root() / "synth"
    cached_before = len(list(synth_cache.glob(f"{space.synthesis}-*"))) if synth_cache.is_dir() else 0
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        points = run_sweep(space, out, jobs=jobs, progress=False, log=lambda _: None)
        wall = time.perf_counter() - start
        summary = json.loads((Path(out) / "sweep.json").read_text())
    ok = [p for p in points if p.get("status") == "ok"]
    front = pareto_front(points, space.area)
    by_index = {p["index"]: p for p in points}
    return {
        "space": f"examples/sweeps/{example}.toml", "workload": space.workload, "synthesis": space.synthesis,
        "jobs": jobs, "wall_seconds": round(wall, 1), "points": len(points), "valid": len(ok) + sum(
            p.get("status") == "failed" for p in points), "ok": len(ok),
        "failed": [{"index": p["index"], "error": p.get("error")} for p in points if p.get("status") == "failed"],
        "synthesized": sum(p.get("resources_source") == "synthesis" for p in ok),
        "synth_cache_entries_before": cached_before,
        "area": space.area, "area_model": summary.get("area_model"),
        "pareto": [{"index": i, "params": by_index[i]["params"], "throughput_gmacs": by_index[i]["throughput_gmacs"],
                    "area": by_index[i]["resources"].get(space.area), "cycles": by_index[i]["cycles"],
                    "utilization": by_index[i]["utilization"],
                    "area_model_error": by_index[i].get("area_model_error")} for i in front],
        "rtl_sample": [{"index": p["index"], "params": p["params"], "cycles": p["cycles"], "rtl_cycles": p["rtl_cycles"],
                        "model_error": p["model_error"]} for p in ok if "model_error" in p],
        "seconds_per_point": round(sum(p.get("seconds", 0) for p in ok) / max(1, len(ok)), 2),
    }
