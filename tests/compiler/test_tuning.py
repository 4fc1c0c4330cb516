"""Schedule search (`gemforge.compiler.tuning`): every configuration a log may choose computes the
same results (CPU against numpy, accelerator bit-exact on fsim), the search finds what it
measures and is reproducible, logs round-trip and bad ones are refused with one sentence, and
`gemforge tune` / `gemforge compile --tuning-log` work end to end (a dask cluster included)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from compiler_helpers import device_for, int8
from gemforge.compiler import CpuTarget, tuning
from gemforge.compiler.ops import conv2d_reference, host
from gemforge.compiler.ops.accel.conv2d import compile_conv2d as accel_conv2d
from gemforge.compiler.ops.cpu import plan_tile
from gemforge.compiler.tuning import TuningError
from gemforge.compiler.tuning.log import Record, TuningLog
from gemforge.compiler.tuning.search import CostModel, LocalMeasurer, tune
from gemforge.driver.runtime.device import open_device
from gemforge.hw.config import PRESETS

CPU = CpuTarget()


@pytest.fixture(scope="module")
def cpu():
    return open_device("cpu")


def _record(task, config) -> dict:
    return {"kind": task.kind, "target": task.target, "workload": task.workload, "config": config}


def _one_task(compile_call):
    with tuning.recording() as found:
        compile_call()
    assert len(found) == 1
    return next(iter(found.values()))


# --- every configuration computes the same --------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("shape,weight,stride,padding", [
    ((1, 5, 9, 11), (7, 5, 3, 3), 1, 1),        # shifted
    ((1, 6, 10, 10), (9, 6, 3, 3), 2, 1),       # im2col
    ((1, 13, 6, 7), (21, 13, 1, 1), 1, 0),      # direct
])
def test_cpu_conv2d_under_random_tuned_tiles_equals_numpy(shape, weight, stride, padding, dtype, cpu):
    rng = np.random.default_rng(sum(shape) + sum(weight) + len(dtype))
    epi = {"shift": 6, "relu": True} if dtype == "int8" else {"relu": True}
    x = int8(rng, shape) if dtype == "int8" else rng.standard_normal(shape).astype(np.float32)
    w = int8(rng, weight) if dtype == "int8" else rng.standard_normal(weight).astype(np.float32)
    bias = (rng.integers(-500, 500, weight[0]).astype(np.int32) if dtype == "int8"
            else rng.standard_normal(weight[0]).astype(np.float32))

    def compile_it():
        return host.compile_conv2d(CPU, shape, weight, stride=stride, padding=padding, dtype=dtype, bias=True, **epi)
    task = _one_task(compile_it)
    candidates = [c for c, _ in task.candidates()]
    assert task.default in candidates and len(candidates) > 10
    expect = conv2d_reference(x, w, bias, stride, padding, **epi)
    # The tiles of the other orientation of the product (`host._pixel_rows`) name their method;
    # int8 has both where it runs on VNNI.
    other = [c for c in candidates if "method" in c]
    assert bool(other) == (dtype == "float32" or compile_it().plan["method"].startswith("vnni"))
    picks = [candidates[k] for k in rng.choice(len(candidates), 3, replace=False)] + other[:1]
    for config in picks:
        with tuning.applied([_record(task, config)]):
            op = compile_it()
        assert (op.plan["mb"], op.plan["nb"] // op.plan["lanes"], op.plan["order"]) == \
            (config["mb"], config["vectors"], config["order"])
        if "method" in config:
            assert op.plan["method"].endswith("rows") == (config["method"] == "rows")
        out, _ = op.run(cpu, x=x, w=w, bias=bias)
        if dtype == "int8":
            np.testing.assert_array_equal(out, expect)
        else:
            np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4 * float(np.abs(expect).max()))


def test_cpu_dense_under_every_tile_order_equals_numpy(cpu):
    rng = np.random.default_rng(3)
    m, k, n = 19, 23, 37
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    task = _one_task(lambda: host.compile_dense(CPU, m, k, n, dtype="float32"))
    # The tallest tile this CPU's registers hold (columns first) and a small one (rows first).
    candidates = [c for c, _ in task.candidates()]
    tallest = max((c for c in candidates if c["order"] == "columns"), key=lambda c: c["mb"])
    assert {"mb": 3, "vectors": 2, "order": "rows"} in candidates and tallest["mb"] >= 8
    for config in [{"mb": 3, "vectors": 2, "order": "rows"}, tallest]:
        with tuning.applied([_record(task, config)]):
            op = host.compile_dense(CPU, m, k, n, dtype="float32")
        out, _ = op.run(cpu, a=a, b=b)
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_untuned_compiles_keep_the_planned_tile():
    op = host.compile_conv2d(CPU, (1, 16, 14, 14), (32, 16, 3, 3), padding=1, dtype="float32")
    task = _one_task(lambda: host.compile_conv2d(CPU, (1, 16, 14, 14), (32, 16, 3, 3), padding=1, dtype="float32"))
    # The product's rows are the pixels (196) or the output channels (32, against 14 rows of 16 padded pixels).
    product = (14 * 14, 32) if op.plan["method"].endswith("rows") else (32, 14 * 16)
    mb, nb = plan_tile(*product, op.plan["lanes"], 32 if "+avx512f" in task.target["features"] else 16)
    assert (op.plan["mb"], op.plan["nb"], op.plan["order"]) == (mb, nb, "columns")
    assert task.default == {"mb": mb, "vectors": nb // op.plan["lanes"], "order": "columns"}


@pytest.mark.parametrize("config_name", ["tiny", "default"])
def test_accelerator_conv2d_under_random_tuned_tilings_is_bit_exact(config_name):
    config = PRESETS[config_name]
    rng = np.random.default_rng(len(config_name))
    shape, weight = (1, 20, 9, 9), (24, 20, 3, 3)
    x, w = int8(rng, shape), int8(rng, weight)
    bias = rng.integers(-3000, 3000, weight[0]).astype(np.int32)

    def compile_it():
        return accel_conv2d(config, shape, weight, stride=1, padding=1, bias=True, shift=7, relu=True, tune=False)
    task = _one_task(compile_it)
    candidates = [c for c, _ in task.candidates()]
    assert task.default in candidates and len(candidates) > 5
    expect = conv2d_reference(x, w, bias, 1, 1, 7, True)
    device = device_for(config)
    for k in rng.choice(len(candidates), 3, replace=False):
        with tuning.applied([_record(task, candidates[k])]):
            op = compile_it()
        assert {key: op.plan[key] for key in candidates[k]} == candidates[k]
        out, _ = op.run(device, x=x, w=w, bias=bias)
        np.testing.assert_array_equal(out, expect)


def test_a_record_naming_no_configuration_of_the_operator_is_refused():
    task = _one_task(lambda: host.compile_dense(CPU, 8, 8, 8, dtype="float32"))
    with tuning.applied([_record(task, {"mb": 40, "vectors": 9, "order": "columns"})]):
        with pytest.raises(TuningError, match="not one of the operator's configurations"):
            host.compile_dense(CPU, 8, 8, 8, dtype="float32")
    # A record for another workload or target does not apply at all.
    other = dict(_record(task, {"mb": 40, "vectors": 9, "order": "columns"}), workload={"m": 1})
    with tuning.applied([other]):
        host.compile_dense(CPU, 8, 8, 8, dtype="float32")


# --- the search -----------------------------------------------------------------------------------

def _synthetic_task(best_mb: int = 5):
    """A task whose costs come from a formula, not a clock (``_Formula`` measures it)."""
    task = _one_task(lambda: host.compile_conv2d(CPU, (1, 32, 16, 16), (48, 32, 3, 3), padding=1, dtype="float32"))
    return task, best_mb


class _Formula:
    width = 1

    def __init__(self, best_mb: int):
        self.best_mb, self.calls = best_mb, []

    def __call__(self, task, configs):
        self.calls.extend(json.dumps(c, sort_keys=True) for c in configs)
        return [1e-3 * (1 + abs(c["mb"] - self.best_mb) / 4 + abs(c["vectors"] - 2) / 3
                        + 0.1 * (c["order"] == "rows") + 0.2 * ("method" in c)) for c in configs]

    def close(self):
        pass


def test_search_measures_the_default_first_finds_the_best_and_is_reproducible():
    task, best_mb = _synthetic_task()
    runs = []
    for _ in range(2):
        measurer = _Formula(best_mb)
        result = tune([task], device="fsim", trials=45, seed=7, measurer=measurer)
        runs.append(measurer.calls)
        (record,) = result.records
        assert json.loads(measurer.calls[0]) == task.default
        assert record.trials == 45 and record.cost <= record.default_cost
    assert runs[0] == runs[1]                                     # same seed, same trials
    # 45 of the candidates (the tiles of both orientations of the product: 168 with 32 vector
    # registers, 104 with 16) measured: the one kept is among the best few of all of them.
    every = sorted(_Formula(best_mb)(task, [c for c, _ in task.candidates()]))
    assert len(every) > 100 and record.cost <= every[3]
    other = _Formula(best_mb)
    tune([task], device="fsim", trials=45, seed=8, measurer=other)
    assert other.calls != runs[0]


def test_search_stops_at_its_time_budget_and_keeps_what_it_measured():
    task, best_mb = _synthetic_task()

    class Slow(_Formula):
        def __call__(self, task, configs):
            import time
            time.sleep(0.05)
            return super().__call__(task, configs)
    result = tune([task, task], device="fsim", trials=1000, time_budget=0.3, measurer=Slow(best_mb))
    assert result.stopped and "time budget" in result.stopped
    assert len(result.records) == 1 and 1 < result.records[0].trials < 20


def test_a_failing_candidate_is_skipped_and_a_failing_default_is_refused():
    task, _ = _synthetic_task()

    def flaky(task_, configs):
        return ["CompileError: no" if c["mb"] == 1 else 1.0 + c["mb"] for c in configs]
    flaky.width = 1
    result = tune([task], device="fsim", trials=40, measurer=flaky)
    assert result.failures and result.records[0].config["mb"] != 1

    def broken(task_, configs):
        return ["CompileError: no"] * len(configs)
    broken.width = 1
    with pytest.raises(TuningError, match="untuned configuration failed"):
        tune([task], device="fsim", trials=3, measurer=broken)


def test_cost_model_learns_a_ranking_the_estimate_does_not_have():
    rng = np.random.default_rng(0)
    xs = np.column_stack([np.ones(60), np.zeros(60), rng.random(60), rng.random(60)])
    costs = np.exp(2 * xs[:, 2] - xs[:, 3])
    model = CostModel()
    for x, c in zip(xs[:30], costs[:30]):
        model.add(list(x), float(c))
    predicted = model.predict(xs[30:])
    assert np.corrcoef(predicted, np.log(costs[30:]))[0, 1] > 0.95


def test_cpu_measurements_time_real_kernels():
    task = _one_task(lambda: host.compile_dense(CPU, 64, 64, 64, dtype="float32"))
    (seconds,) = LocalMeasurer("cpu")(task, [task.default])
    assert 0 < seconds < 0.1


# --- logs -----------------------------------------------------------------------------------------

def _log(tmp_path, **changes):
    task = _one_task(lambda: host.compile_dense(CPU, 8, 16, 8, dtype="float32"))
    log = TuningLog("cpu", task.target, "a" * 64, 0, 4,
                    [Record(task.kind, task.target, task.workload, task.default, 1e-5, 2e-5, 4)])
    path = tmp_path / "t.jsonl"
    log.save(path)
    return path, log


def test_logs_round_trip_and_say_why_they_do_not_apply(tmp_path):
    path, log = _log(tmp_path)
    again = TuningLog.load(path)
    assert again.records[0].as_dict() == log.records[0].as_dict() and again.records[0].gain == 2.0
    assert again.applicable(log.target, "a" * 64) is None and again.applicable(None, None) is None
    assert "another model" in again.applicable(log.target, "b" * 64)
    assert "not CPU" in again.applicable(dict(log.target, cpu="other"), "a" * 64)


@pytest.mark.parametrize("mangle,message", [
    (lambda lines: ["{nope"] + lines[1:], "not JSON"),
    (lambda lines: lines[1:], "not a gemforge tuning log"),
    (lambda lines: [lines[0].replace('"version": 1', '"version": 9')] + lines[1:], "format version 9"),
    (lambda lines: [lines[0].replace('"space_version": 1', '"space_version": 0')] + lines[1:], "search space version"),
    (lambda lines: lines + [lines[1]], "a second record"),
    (lambda lines: [lines[0], lines[1].replace('"cpu.dense"', '"cpu.fft"')], "kind must be"),
    (lambda lines: [lines[0], lines[1].replace('"cost": 1e-05', '"cost": -1')], "positive finite"),
    (lambda lines: [lines[0], lines[1].replace('"cost": 1e-05', '"cost": NaN')], "positive finite"),
    (lambda lines: [lines[0], lines[1].replace('"trials": 4', '"trials": true')], "trials must be"),
    (lambda lines: [lines[0].replace('"device": "cpu"', '"device": "gpu"')] + lines[1:], "device must be"),
    (lambda lines: [lines[0], lines[1].replace('"threads": 0', '"threads": 3')], "not the header's"),
])
def test_malformed_logs_are_refused_with_one_sentence(tmp_path, mangle, message):
    path, _ = _log(tmp_path)
    path.write_text("\n".join(mangle(path.read_text().splitlines())) + "\n")
    with pytest.raises(TuningError, match=message) as info:
        TuningLog.load(path)
    assert "\n" not in str(info.value)


def test_unreadable_logs_are_refused(tmp_path):
    with pytest.raises(TuningError, match="cannot read tuning log"):
        TuningLog.load(tmp_path / "missing.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TuningError, match="not UTF-8"):
        TuningLog.load(tmp_path / "bin.jsonl")


def test_a_log_write_replaces_the_file_whole(tmp_path):
    path, log = _log(tmp_path)
    log.records.append(Record("cpu.dense", log.target, {"m": 1}, {"mb": 1, "vectors": 1, "order": "rows"},
                              1.0, math.inf, 1))             # json writes Infinity: refused on reading
    log.save(path)
    with pytest.raises(TuningError, match="positive finite"):
        TuningLog.load(path)
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]       # no temporary file left behind


# --- the shipped logs ----------------------------------------------------------------------------

def test_shipped_logs_name_configurations_their_operators_take_and_compiles_use_them():
    """The shipped log of `default` covers ResNet-18's convolutions: each record is one of its
    layer's tilings, and the network compile gives the layers those tilings."""
    from gemforge.compiler.tuning.log import DEFAULTS, default_records
    from gemforge.driver.runtime.model import compile_model
    from gemforge.models import build_resnet18
    assert sorted(p.stem for p in DEFAULTS.glob("*.jsonl")) == ["default"]
    config = PRESETS["default"]
    shipped = {r.key: r for r in default_records(config)}
    assert shipped and all(r.kind == "accel.conv2d" and r.cost <= r.default_cost for r in shipped.values())
    x = np.random.default_rng(0).normal(size=(1, 1, 3, 224, 224)).astype(np.float32)
    with tuning.recording() as found:
        net = compile_model(build_resnet18(), quantize="int8", calibrate=x, config=config).net
    covered = [t for key, t in found.items() if key in shipped]
    assert len(covered) == sum(t.kind == "accel.conv2d" for t in found.values()) > 10
    plans = [layer.plan for layer in net.layers.values()]
    for task in covered:
        record = shipped[task.key]
        assert record.config in [c for c, _ in task.candidates()]
        assert any(all(p.get(k) == v for k, v in record.config.items()) for p in plans), record.workload
    planned = compile_model(build_resnet18(), quantize="int8", calibrate=x, config=config, shipped_tuning=False).net
    changed = [name for name, layer in net.layers.items() if layer.plan != planned.layers[name].plan]
    # Every layer whose shipped tiling is not the planner's changed, and only those (a workload
    # a network repeats is one record, counted once per layer).
    assert changed and len(changed) == sum(found.counts[t.key] for t in covered if shipped[t.key].config != t.default)
    other = config.replace(wgt_buffer_bytes=config.wgt_buffer_bytes * 2)
    assert default_records(other) == []               # another config of the same name: not its log


def test_shipped_records_are_passed_over_where_they_no_longer_fit():
    task = _one_task(lambda: host.compile_dense(CPU, 8, 8, 8, dtype="float32"))
    wrong = _record(task, {"mb": 40, "vectors": 9, "order": "columns"})
    with tuning.applied([wrong], strict=False):
        op = host.compile_dense(CPU, 8, 8, 8, dtype="float32")
    assert (op.plan["mb"], op.plan["nb"] // op.plan["lanes"]) == (task.default["mb"], task.default["vectors"])


def test_a_dask_round_measures_every_configuration_it_is_given():
    distributed = pytest.importorskip("distributed")
    from gemforge.compiler.tuning.search import DaskMeasurer
    task = _one_task(lambda: host.compile_dense(CPU, 16, 16, 16, dtype="float32"))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        measurer = DaskMeasurer(c.scheduler_address, "cpu", task.target, log=lambda _: None)
        try:
            configs = [task.default, {"mb": 1, "vectors": 1, "order": "rows"}, {"mb": 2, "vectors": 1, "order": "rows"}]
            costs = measurer(task, configs)          # more configurations than workers
        finally:
            measurer.close()
    assert len(costs) == 3 and all(isinstance(c, float) and c > 0 for c in costs)
