"""`gemforge sweep`: space files, points and constraints, evaluation (failures recorded, resumed
sweeps), the outputs and report, and the same results on a dask LocalCluster as locally."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gemforge.driver.tools import sweep as sweep_module
from gemforge.driver.tools.cli import main
from gemforge.driver.tools.sweep import (SweepError, evaluate_point, expand, load_space, pareto_front, render_report,
                                   run_sweep, space_from_dict)
from gemforge.hw.config import PRESETS
from gemforge.sim.cycle_model import run_cycle_model

#: A space that evaluates in seconds: the digits CNN, cycle model only.
QUICK = {"name": "quick", "base": "tiny", "workload": "digits", "synthesis": "none",
         "fields": {"block_in": [4, 8], "bus_width": [64, 128], "inp_buffer_bytes": [128, 1024]},
         "constraints": ["inp_buffer_bytes >= 32 * block_in"]}


def write_space(tmp_path: Path, data: dict) -> Path:
    import tomli_w
    path = tmp_path / "space.toml"
    path.write_text(tomli_w.dumps(data))
    return path


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"fields": {}}, r"space: no fields to sweep; a space needs a \[fields\] table"),
    ({"fields": {"blockin": [4]}}, "'blockin' is not a config field"),
    ({"fields": {"block_in": []}}, "lists no values"),
    ({"fields": {"block_in": {"start": 4, "stop": 16}}}, "a range is"),
    ({"fields": {"block_in": {"start": 16, "stop": 4, "step": 4}}}, "never reaches"),
    # A reversed geometric range was swept as its start alone.
    ({"fields": {"block_in": {"start": 8, "stop": 4, "factor": 2}}},
     "field 'block_in': factor 2 never reaches 4 from 8"),
    ({"constraints": ["block_in ="]}, "is not an expression"),
    ({"constraints": ["colour == 1"]}, "names 'colour'"),
    ({"constraints": ["__import__('os') == 1"]}, "may call only"),
    ({"constraints": ["[x for x in (1,)] == 1"]}, "do not allow"),
    ({"constraints": ["min > 1"]}, "names the function 'min' without calling it"),
    # What names no field is evaluated with the space, bounded as at the points.
    ({"constraints": ["9**9**9 > block_in"]}, "constraint '9.*' cannot be evaluated: exponent 387420489 is beyond 256"),
    ({"constraints": ["(((10**256)**256)**256)**256 > block_in"]}, "cannot be evaluated: a power beyond 4096 bits"),
    ({"constraints": ["block_in < (2**250)**8 * (2**250)**8 * (2**250)**8"]},
     "cannot be evaluated: a value beyond 4096 bits"),
    ({"synthesis": "vivado"}, "synthesis is one of"),
    ({"workload": "alexnet"}, "unknown workload 'alexnet'"),
    ({"base": "no-such-config.toml"}, "base config"),
    ({"rtl_sample": -1}, "rtl_sample"),
    ({"area": [1]}, "area names a resource"),
    ({"workload": "no-such-model.onnx"}, "is not a file"),
    ({"constraints": ['"a" * 10**12 == block_in']}, "constants are numbers"),
    ({"constraints": ["-" * 200_000 + "block_in > 1"]}, "nests deeper than the 100 levels"),
    ({"constraints": ["-" * 500 + "block_in > 1"]}, "nests 50. levels deep; a constraint may have at most 100"),
    ({"constraints": ["(" * 1000 + "block_in" + ")" * 1000 + " > 1"]}, "is not an expression"),
    # Ranges are checked and counted before they are built: never a hang or a Python error.
    ({"fields": {"block_in": {"start": 4, "stop": "x", "step": 1}}}, "stop must be a finite number"),
    ({"fields": {"block_in": {"start": 1, "stop": float("inf"), "step": 1}}}, "stop must be a finite number"),
    ({"fields": {"block_in": {"start": 1, "stop": 1e9, "factor": 1.0000001}}}, "expands to 207232669 values"),
    ({"fields": {"block_in": {"start": -1e308, "stop": 1e308, "step": 1}}}, "expands to too many values"),
    ({"fields": {"inp_buffer_bytes": {"start": 1, "stop": 1000, "step": 1},
                 "wgt_buffer_bytes": {"start": 1, "stop": 1000, "step": 1}}}, "span 1,000,000 points"),
])
def test_bad_spaces_are_refused_with_the_reason(change, message):
    with pytest.raises(SweepError, match=message):
        space_from_dict({**QUICK, **change})


@pytest.mark.parametrize("text", ["", "# nothing\n", 'name = "x"\nbase = "tiny"\nworkload = "digits"\n',
                                  'base = "tiny"\n[fields]\n'])
def test_a_space_file_without_fields_is_refused_not_run_as_the_default(tmp_path, capsys, text):
    """An empty space file (or one without [fields]) swept the one point of the defaults,
    resnet18-convs on the default config, with exit status 0."""
    (tmp_path / "space.toml").write_text(text)
    code = main(["sweep", str(tmp_path / "space.toml"), "-o", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"gemforge: error: {tmp_path / 'space.toml'}: no fields to sweep; a space needs a "
                                 "[fields] table giving config fields a list or range of values each (see "
                                 "examples/sweeps/small.toml)\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_as_the_space_file_is_refused_not_read(tmp_path):
    """Reading a FIFO blocks until something writes to it: `gemforge sweep FIFO` hung (the other
    loaders refuse one). Run in a subprocess with a timeout, so that a regression fails rather
    than hanging the suite."""
    fifo = tmp_path / "space.toml"
    os.mkfifo(fifo)
    code = "import sys; from gemforge.driver.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "sweep", str(fifo), "-o", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"gemforge: error: cannot read space file {fifo}: is not a regular file (a pipe or device "
                           "would block the read)\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("constraint, message", [
    ("inp_buffer_bytes / (block_in - 4) > 1", "division by zero"),
    ("block_in ** 100000 > 1", "exponent 100000 is beyond"),
    ("((block_in * 10**255)**256)**256 > 1", "a power beyond 4096 bits"),
    ("block_in ** 9**9 > 1", "exponent 387420489 is beyond 256"),
    # Products grow without a power: each integer is held to the bound, so no chain runs for ever.
    ("block_in * (2**250)**8 * (2**250)**8 * (2**250)**8 > 1", "a value beyond 4096 bits"),
])
def test_a_constraint_that_cannot_be_evaluated_names_itself_and_the_point(constraint, message):
    space = space_from_dict({**QUICK, "constraints": [constraint], "fields": {"block_in": [4]}})
    with pytest.raises(SweepError, match=rf"constraint .* cannot be evaluated at point 0 .*{message}"):
        expand(space)


@pytest.mark.parametrize("change, message", [
    ({"constraints": ["9**9**9 > block_in"]}, "exponent 387420489 is beyond 256"),
    ({"constraints": ["inp_buffer_bytes / (block_in - 8) > 1"]}, r"at point 4 \(\{'block_in': 8, .*division by zero"),
    ({"fields": {**QUICK["fields"], "block_in": {"start": 8, "stop": 4, "factor": 2}}}, "never reaches"),
])
def test_a_refused_space_leaves_no_output_directory(tmp_path, capsys, change, message):
    """Constraints were evaluated only after DIR/points was made: every one is now evaluated
    on every point first, so a space refused for any reason writes nothing."""
    space = write_space(tmp_path, {**QUICK, **change})
    code = main(["sweep", str(space), "-o", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("gemforge: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_an_output_folder_that_cannot_be_made_is_one_sentence(tmp_path, capsys):
    """/proc refuses new folders (to root too): named in one sentence, not errno text about points/."""
    target = Path("/proc/gemforge-sweep-test")
    if not Path("/proc").is_dir() or target.exists():
        pytest.skip("needs a /proc that refuses new folders")
    space = write_space(tmp_path, QUICK)
    code = main(["sweep", str(space), "-o", str(target), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot write the sweep's outputs under" in err, err


def test_ranges_hold_their_stop_and_a_single_point_range_its_start():
    space = space_from_dict({**QUICK, "fields": {"block_in": {"start": 1, "stop": 1000, "factor": 10},
                                                  "block_out": {"start": 4, "stop": 4, "factor": 2},
                                                  "bus_width": {"start": 64, "stop": 64, "step": 8}}})
    assert space.fields == {"block_in": [1, 10, 100, 1000], "block_out": [4], "bus_width": [64]}


def test_ranges_and_constraints_expand_into_valid_and_listed_invalid_points():
    space = space_from_dict({**QUICK, "fields": {"block_in": {"start": 2, "stop": 16, "factor": 2},
                                                  "inp_buffer_bytes": {"start": 64, "stop": 192, "step": 64},
                                                  "block_out": [4, 3]}})
    assert space.fields["block_in"] == [2, 4, 8, 16] and space.fields["inp_buffer_bytes"] == [64, 128, 192]
    points = expand(space)
    assert len(points) == 4 * 3 * 2 and [p["index"] for p in points] == list(range(24))
    for p in points:
        params = p["params"]
        if params["block_out"] == 3:                      # not a power of two: the config refuses it
            assert p["status"] == "invalid" and "block_out" in p["reason"]
        elif params["inp_buffer_bytes"] == 192:
            assert p["status"] == "invalid" and "inp_buffer_bytes must be a power of two" in p["reason"]
        elif params["inp_buffer_bytes"] < 32 * params["block_in"]:
            assert p["status"] == "invalid" and "constraint" in p["reason"]
        else:
            assert "config" in p, p


def test_pareto_front_keeps_only_undominated_points():
    pts = [{"index": i, "status": "ok", "resources": {"LUT": a}, "throughput_gmacs": t}
           for i, (a, t) in enumerate([(10, 1.0), (20, 0.5), (20, 2.0), (30, 1.5), (40, 3.0), (40, 3.0)])]
    pts.append({"index": 9, "status": "failed"})
    assert pareto_front(pts, "LUT") == [0, 2, 4]


def test_a_point_is_the_cycle_model_of_its_compiled_workload(tmp_path):
    space = space_from_dict({**QUICK, "fields": {"block_in": [8]}})
    point = expand(space)[0]
    result = evaluate_point({**point, "workload": "digits", "rtl": False})
    assert result["status"] == "ok", result
    (finished,) = run_sweep(space, tmp_path, progress=False, log=lambda _: None)
    from gemforge.driver.tools.workloads import build_workload
    from gemforge.hw.config import AccelConfig
    config = AccelConfig.from_dict(point["config"])
    workload = build_workload("digits", config)
    assert result["cycles"] == sum(run_cycle_model(l.program.instructions, config).cycles * l.count
                                   for l in workload.layers)
    assert result["macs"] == workload.macs > 0
    macs_per_cycle = config.batch * config.block_in * config.block_out
    assert finished["cycles"] == result["cycles"] and finished["fmax_source"] == "config"
    assert finished["throughput_gmacs"] == pytest.approx(workload.macs / (result["cycles"] / 100e6) / 1e9, rel=1e-5)
    assert 0 < result["utilization"] <= 1 and finished["resources"]["macs_per_cycle"] == macs_per_cycle


def test_failing_points_are_recorded_and_a_rerun_resumes(tmp_path, monkeypatch):
    from gemforge.driver.tools import workloads
    space = space_from_dict(QUICK)
    real_build = workloads.build_workload

    def flaky(spec, config):
        if config.block_in == 8 and config.bus_width == 128:
            raise RuntimeError("the compiler broke on this point")
        return real_build(spec, config)
    monkeypatch.setattr(workloads, "build_workload", flaky)
    real = sweep_module.evaluate_point
    points = run_sweep(space, tmp_path / "out", progress=False, log=lambda _: None)
    failed = [p for p in points if p.get("status") == "failed"]
    assert failed and all(p["error"] == "RuntimeError: the compiler broke on this point" for p in failed)
    ok = [p for p in points if p.get("status") == "ok"]
    assert ok and len(ok) + len(failed) + sum(p.get("status") == "invalid" for p in points) == len(points)

    # The rerun evaluates only what is not saved: the failed points (saved too) are reused as well.
    calls = []
    monkeypatch.setattr(sweep_module, "evaluate_point", lambda task: calls.append(task) or real(task))
    again = run_sweep(space, tmp_path / "out", progress=False, log=lambda _: None)
    assert calls == [] and [p.get("cycles") for p in again] == [p.get("cycles") for p in points]
    # A damaged saved point runs again instead of stopping the sweep.
    saved = sorted((tmp_path / "out" / "points").glob("*.json"))
    saved[0].write_text('{"truncated')
    saved[1].write_text('["not", "a", "point"]')
    logged = []
    run_sweep(space, tmp_path / "out", progress=False, log=logged.append)
    assert len(calls) == 2 and sum("is damaged" in line for line in logged) == 2
    calls.clear()
    # Another output directory starts afresh.
    (tmp_path / "out" / "points").rename(tmp_path / "old-points")
    (tmp_path / "out" / "points").mkdir()
    run_sweep(space, tmp_path / "out", progress=False, log=lambda _: None)
    assert len(calls) == len(ok) + len(failed)


def _fake_gates(config) -> int:
    """A made-up synthesis result that is linear in the area model's features."""
    from gemforge.hw.flow.area_model import features
    return int(features(config) @ [20_000, 7, 3, 50, 0.01])


def test_area_model_predicts_and_the_pareto_front_is_confirmed_by_synthesis(tmp_path, monkeypatch):
    synthesized = []

    def fake(config, target):
        synthesized.append(config.name)
        return {"status": "ok", "fmax_mhz": None,
                "resources": {"gates": {"used": _fake_gates(config)}, "FF": {"used": 5000 + config.bus_width}}}
    monkeypatch.setattr(sweep_module, "_synthesize", fake)
    space = space_from_dict({**QUICK, "synthesis": "generic", "synthesis_sample": 6,
                             "fields": {"block_in": [4, 8, 16], "block_out": [4, 8], "bus_width": [64, 128]},
                             "constraints": []})
    points = run_sweep(space, tmp_path, progress=False, log=lambda _: None)
    ok = [p for p in points if p["status"] == "ok"]
    assert len(ok) == 12 and 6 <= len(synthesized) < 12
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert summary["area_model"]["samples"] == 6
    for p in ok:
        config = space.base.replace(**p["params"])
        assert p["resources"]["gates"] == pytest.approx(_fake_gates(config), rel=0.02), p
        assert p["resources_source"] in ("synthesis", "area model")
    front = set(summary["pareto"])
    assert front and all(points[i]["resources_source"] == "synthesis" for i in front)
    sample = set(synthesized[:6])
    for i in front - {p["index"] for p in ok if p["config"] in sample}:     # confirmed by synthesis
        assert abs(points[i]["area_model_error"]["gates"]) < 0.02
    render_report(tmp_path)
    assert "## Area model" in (tmp_path / "report.md").read_text()


def test_area_model_fit_is_exact_on_linear_data_and_reports_its_error():
    from gemforge.hw.flow.area_model import fit_area_model
    configs = [PRESETS["tiny"].replace(block_in=b, block_out=o, bus_width=w)
               for b in (4, 8, 16) for o in (4, 16) for w in (64, 128)]
    model = fit_area_model(configs, [{"gates": _fake_gates(c)} for c in configs])
    assert model.loo_error["gates"] < 0.01
    other = PRESETS["tiny"].replace(block_in=32, block_out=8, bus_width=256)
    assert model.predict(other)[0]["gates"] == pytest.approx(_fake_gates(other), rel=0.01)
    with pytest.raises(ValueError, match="at least two"):
        fit_area_model(configs[:1], [{"gates": 1}])
    with pytest.raises(SweepError, match="synthesis_sample needs a synthesis target"):
        space_from_dict({**QUICK, "synthesis_sample": 3})


def test_outputs_and_report(tmp_path):
    path = write_space(tmp_path, QUICK)
    out = tmp_path / "out"
    assert main([ "sweep", str(path), "-o", str(out), "--quiet"]) == 0
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["counts"]["ok"] + summary["counts"]["invalid"] == len(summary["points"]) == 8
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert len(rows) == 8 and {"throughput_gmacs", "cycles", "macs_per_cycle", "block_in"} <= set(rows[0])
    for name in ("pareto.png", "roofline.png", "layers.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["sweep", "--report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "| point | block_in | bus_width | inp_buffer_bytes |" in report
    assert "excluded by the constraint" in report and "pareto.png" in report
    with pytest.raises(SweepError, match="no sweep.json"):
        render_report(tmp_path)
    assert main(["sweep", str(tmp_path / "nope.toml"), "-o", str(out)]) == 2


def test_dask_local_cluster_gives_the_local_results(tmp_path):
    distributed = pytest.importorskip("distributed")
    space = space_from_dict({**QUICK, "fields": {"block_in": [4, 8], "bus_width": [64]}})
    local = run_sweep(space, tmp_path / "local", progress=False, log=lambda _: None)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        remote = run_sweep(space, tmp_path / "dask", scheduler=cluster.scheduler_address, progress=False,
                           log=lambda _: None)
    strip = lambda ps: [{k: v for k, v in p.items() if k != "seconds"} for p in ps]   # noqa: E731
    assert strip(remote) == strip(local) and all(p["status"] == "ok" for p in local)
    with pytest.raises(SweepError, match="cannot reach the dask scheduler"):
        run_sweep(space, tmp_path / "none", scheduler="tcp://127.0.0.1:9", progress=False, log=lambda _: None)


@pytest.mark.slow
def test_example_space_runs_with_synthesis_and_an_rtl_sample(tmp_path):
    """The documented example (examples/sweeps/small.toml): synthesis and Verilator included."""
    example = Path(__file__).resolve().parents[2] / "examples" / "sweeps" / "small.toml"
    space = load_space(example)
    points = run_sweep(space, tmp_path, jobs=2, progress=False, log=lambda _: None)
    ok = [p for p in points if p.get("status") == "ok"]
    assert ok and all("gates" in p["resources"] for p in ok)
    sampled = [p for p in ok if "model_error" in p]
    assert len(sampled) == space.rtl_sample and all(abs(p["model_error"]) <= 0.10 for p in sampled)


@pytest.mark.parametrize("example", sorted((Path(__file__).resolve().parents[2] / "examples" / "sweeps").glob("*.toml")),
                         ids=lambda p: p.name)
def test_example_spaces_load_and_only_their_constraints_exclude_points(example):
    points = expand(load_space(example))
    assert any("config" in p for p in points)
    assert all("constraint" in p["reason"] for p in points if p.get("status") == "invalid")


def test_unreadable_reports_and_unknown_scheduler_schemes_are_one_line(tmp_path):
    for text in ('{"points', '{"points": "x"}', "[]"):
        (tmp_path / "sweep.json").write_text(text)
        with pytest.raises(SweepError, match="sweep.json is not a"):
            render_report(tmp_path)
    with pytest.raises(SweepError, match="must be tcp://HOST:PORT"):
        run_sweep(space_from_dict(QUICK), tmp_path / "out", scheduler="bogus://x", progress=False)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_as_sweep_json_is_refused_not_read(tmp_path):
    """`sweep --report DIR` read DIR/sweep.json without the FIFO check: a FIFO there blocked it.
    Read in a thread, so that a regression fails (the FIFO then released by a writer) rather
    than hanging the suite."""
    import threading
    os.mkfifo(tmp_path / "sweep.json")
    outcome = []

    def report():
        try:
            render_report(tmp_path)
        except SweepError as exc:
            outcome.append(str(exc))

    reader = threading.Thread(target=report, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():
        os.close(os.open(tmp_path / "sweep.json", os.O_WRONLY | os.O_NONBLOCK))    # let the read end
        pytest.fail("render_report blocked reading a FIFO")
    assert outcome == [f"cannot read {tmp_path / 'sweep.json'}: is not a regular file (a pipe or device would block "
                       "the read)"]
