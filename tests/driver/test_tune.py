"""`gemforge tune` and `gemforge compile --tuning-log` end to end: a log tuned on the CPU or on the
cycle model compiles the model with its schedules (same results), is carried in the model file,
and is not used, with one line saying why, for another model or config; dask workers measure
and a worker of another CPU is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

from onnx_models import model
from gemforge.compiler.tuning import TuningError
from gemforge.compiler.tuning.log import TuningLog
from gemforge.driver.runtime.model import Model, compile_model
from gemforge.driver.tools.cli import main


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    """Two convolutions and a pool: products the CPU tunes, convolutions the accelerator tiles."""
    rng = np.random.default_rng(5)
    m = model([helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4), helper.make_node("Relu", ["c1"], ["r1"]),
               helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, strides=[2, 2]),
               helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("GlobalAveragePool", ["r2"], ["y"])],
              [("x", [1, 3, 12, 12])], [("y", None)],
              {"w1": rng.normal(size=(16, 3, 3, 3)).astype(np.float32) * 0.3,
               "b1": rng.normal(size=16).astype(np.float32),
               "w2": rng.normal(size=(24, 16, 3, 3)).astype(np.float32) * 0.1})
    folder = tmp_path_factory.mktemp("tune")
    (folder / "m.onnx").write_bytes(m.SerializeToString())
    np.save(folder / "cal.npy", rng.normal(size=(4, 1, 3, 12, 12)).astype(np.float32))
    np.save(folder / "x.npy", rng.normal(size=(1, 3, 12, 12)).astype(np.float32))
    return folder


def test_cpu_tuning_log_compiles_runs_and_travels_in_the_model_file(onnx_file, tmp_path, capsys):
    log = tmp_path / "cpu.jsonl"
    code, out, err = run(capsys, "tune", onnx_file / "m.onnx", "-o", log, "--trials", "3", "--quiet")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["operators"] == summary["tuned"] == 2 and summary["gain"] >= 1.0
    assert summary["trials"] >= 6 and err.count("cpu.conv2d") == 2
    tuned = TuningLog.load(log)
    assert tuned.device == "cpu" and len(tuned.records) == 2
    # Every record forced to another candidate than the default: the compile must use it (two
    # vectors: whole 16-channel blocks of a blocked output with AVX2's 8 lanes and AVX-512's 16).
    for record in tuned.records:
        record.config = {"mb": 1, "vectors": 2, "order": "rows"}
    tuned.save(log)
    code, _, err = run(capsys, "compile", onnx_file / "m.onnx", "-o", tmp_path / "t.gfm", "--tuning-log", log)
    assert code == 0 and "tuning log: 2 tuned cpu schedule(s)" in err, err
    loaded = Model.load(tmp_path / "t.gfm", file_kernels=False)
    assert len(loaded.net.tuning) == 2
    convs = [n for n in loaded.graph.nodes if n.op == "conv2d"]
    plans = [loaded._host_kernel(n, "cpu").op.plan for n in convs]
    assert [(p["mb"], p["nb"] // p["lanes"], p["order"]) for p in plans] == [(1, 2, "rows")] * 2
    x = np.load(onnx_file / "x.npy")
    np.testing.assert_allclose(loaded.run(x, "cpu"), compile_model(onnx_file / "m.onnx").run(x, "cpu"),
                               rtol=1e-5, atol=1e-5)
    # The same log for another model: compiled untuned, saying why.
    other = tmp_path / "other.onnx"
    other.write_bytes((onnx_file / "m.onnx").read_bytes().replace(b"test", b"tesu"))
    code, _, err = run(capsys, "compile", other, "-o", tmp_path / "o.gfm", "--tuning-log", log)
    assert code == 0 and "tuning log not used: it was tuned for another model" in err
    assert not Model.load(tmp_path / "o.gfm").net.tuning


def test_fsim_tuning_log_applies_to_its_config_only(onnx_file, tmp_path, capsys):
    log = tmp_path / "fsim.jsonl"
    code, out, err = run(capsys, "tune", onnx_file / "m.onnx", "-o", log, "--device", "fsim", "--quantize", "int8",
                         "--calibrate", onnx_file / "cal.npy", "--trials", "6", "--quiet", "--seed", "3")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["unit"] == "cycles" and summary["tuned"] >= 1
    assert summary["operators_cost_tuned"] <= summary["operators_cost_untuned"]
    again = tmp_path / "again.jsonl"
    run(capsys, "tune", onnx_file / "m.onnx", "-o", again, "--device", "fsim", "--quantize", "int8",
        "--calibrate", onnx_file / "cal.npy", "--trials", "6", "--quiet", "--seed", "3")
    assert again.read_text() == log.read_text()                  # the cycle model: reproducible
    common = ["--quantize", "int8", "--calibrate", onnx_file / "cal.npy", "--tuning-log", log, "--no-host-kernels"]
    code, _, err = run(capsys, "compile", onnx_file / "m.onnx", "-o", tmp_path / "q.gfm", *common)
    assert code == 0 and "tuned fsim schedule(s)" in err, err
    code, _, err = run(capsys, "compile", onnx_file / "m.onnx", "-o", tmp_path / "t.gfm", "--config", "tiny", *common)
    assert code == 0 and "tuning log not used: it was measured on accelerator config 'default'" in err
    tuned = Model.load(tmp_path / "q.gfm")
    x = np.load(onnx_file / "x.npy")
    np.testing.assert_array_equal(tuned.run(x, "fsim"), tuned.run(x, "cpu"))


@pytest.mark.parametrize("argv,message", [
    (["--trials", "0"], "--trials must be a positive integer"),
    (["--device", "fsim"], "add --quantize int8"),
    (["--time-budget", "-1"], "--time-budget is a positive number"),
    (["--scheduler", "tcp://127.0.0.1:9"], "cannot reach the dask scheduler"),
    (["--config", "tiny"], "--config chooses the accelerator"),
])
def test_bad_tune_arguments_are_one_line_errors(onnx_file, tmp_path, capsys, argv, message):
    code, _, err = run(capsys, "tune", onnx_file / "m.onnx", "-o", tmp_path / "l.jsonl", "--quiet", *argv)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "l.jsonl").exists()


def test_a_model_file_with_a_tampered_tuning_record_is_refused(onnx_file, tmp_path):
    from gemforge.driver.runtime.artefact import ModelError, network_from_bytes, network_to_bytes
    m = compile_model(onnx_file / "m.onnx")
    m.net.tuning = [{"kind": "cpu.fft", "target": {}, "workload": {}, "config": {}}]
    with pytest.raises(ModelError, match="kind must be one of"):
        network_from_bytes(network_to_bytes(m.net))


def test_dask_workers_measure_and_other_cpus_are_refused(onnx_file, tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    from gemforge.compiler.tuning import search
    from gemforge.driver.tools.tune import tune_model
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        summary = tune_model(onnx_file / "m.onnx", tmp_path / "d.jsonl", trials=2, progress=False,
                             scheduler=cluster.scheduler_address, log=lambda _: None)
        assert summary["tuned"] == 2
        monkeypatch.setattr(search, "_worker_identity", lambda target: dict(target, cpu="another"))
        lines = []
        with pytest.raises(TuningError, match="no worker of the dask cluster .* can measure"):
            tune_model(onnx_file / "m.onnx", tmp_path / "e.jsonl", trials=2, progress=False,
                       scheduler=cluster.scheduler_address, log=lines.append)
        assert any("refusing worker" in line and "another" in line for line in lines)
