"""Real networks: the digits CNN's int8 accuracy against its float accuracy, ResNet-18 on
fsim and the CPU (whole, on Verilator, in the slow tier), and the compile/run commands."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gemforge.compiler.graph.partition import round_trips
from gemforge.driver.tools.cli import main
from gemforge.driver.runtime.model import Model, compile_model
from gemforge.driver.runtime.profile import profile_totals
from gemforge.models import build_mobilenet_v2, build_resnet18, digits
from onnx_models import ort_run


def test_digits_int8_accuracy_within_one_point_of_float():
    x_train, _, x_test, y_test = digits.load_split()
    float_acc = digits.accuracy(compile_model(digits.MODEL_PATH, batch=len(x_test)).run(x_test, "cpu"), y_test)
    model = compile_model(digits.MODEL_PATH, quantize="int8", calibrate=x_train[:150].reshape(10, 15, 1, 8, 8),
                          config="default", batch=15)
    logits = model.run(x_test, "fsim")
    int8_acc = digits.accuracy(logits, y_test)
    assert float_acc > 0.95
    assert abs(int8_acc - float_acc) <= 0.01
    np.testing.assert_array_equal(model.run(x_test, "cpu"), logits)
    # Every layer on the accelerator: the classifier's dense layer over the flattened 2×2 pooled
    # image is the 2×2 convolution it equals (`image_dense`), bit-identical to the dense layer the
    # network compiled without a config keeps.
    assert [n.op for n in model.graph.nodes if n.device == "cpu"] == ["quantize", "unfold", "reshape", "dequantize"]
    classifier = next(n for n in model.graph.nodes if n.name == "fc")
    assert classifier.op == "conv2d" and model.graph.values[classifier.inputs[1]].shape[2:] != (1, 1)
    plain = compile_model(digits.MODEL_PATH, quantize="int8", calibrate=x_train[:150].reshape(10, 15, 1, 8, 8),
                          batch=15)
    assert next(n for n in plain.graph.nodes if n.name == "fc").op == "dense"
    np.testing.assert_array_equal(plain.run(x_test, "cpu"), logits)


def test_resnet18_int8_on_fsim_and_cpu():
    rng = np.random.default_rng(0)
    m = build_resnet18(image=64, width=16, classes=10)
    calib = rng.normal(size=(2, 1, 3, 64, 64)).astype(np.float32)
    model = compile_model(m, quantize="int8", calibrate=calib, config="default")
    placed = [n for n in model.graph.nodes if n.op == "conv2d"]
    # 20 convolutions and the classifier, a 1×1 convolution of the global pool's image (`image_dense`).
    assert len(placed) == 21 and all(n.device == "accel" for n in placed) and placed[-1].name == "fc"
    # The 7×7 stem of 3 channels is a 1×1 convolution over its 147-channel patches, unfolded on
    # the host beside the input's quantize (`unfold.py`): same integers, so the same results.
    assert [n.op for n in model.graph.nodes[:3]] == ["quantize", "unfold", "conv2d"]
    assert model.graph.values[model.graph.nodes[2].inputs[1]].shape == (16, 147, 1, 1)
    memory = model.graph.notes.memory
    assert memory["handovers"] >= 8 and memory["peak_bytes"] < memory["naive_bytes"]
    # Its 8 residual adds, the stem's max pool and the global pool (its output some bits finer
    # than its input) run on the accelerator too: from the input's quantize (and the stem's
    # unfold beside it) to the classifier's flatten and dequantize, an inference never leaves it.
    assert [n.device for n in model.graph.nodes if n.op in ("add", "max_pool", "avg_pool")] == ["accel"] * 10
    assert next(n for n in model.graph.nodes if n.op == "avg_pool").attrs["lshift"] > 0
    assert [n.op for n in model.graph.nodes if n.device == "cpu"] == ["quantize", "unfold", "reshape", "dequantize"]
    assert model.summary()["host_round_trips"] == 0
    x = rng.normal(size=(1, 3, 64, 64)).astype(np.float32)
    on_fsim = model.run(x, "fsim")
    # One chained program runs every accelerator layer: one START, one FINISH per inference.
    assert model.summary()["accelerator_runs"] == 1
    assert profile_totals(model.last_profile)["host_round_trips"] == 0
    assert profile_totals(model.last_profile)["accelerator_runs"] == 1
    np.testing.assert_array_equal(on_fsim, model.run(x, "cpu"))
    as_convolution = compile_model(m, quantize="int8", calibrate=calib)       # no accelerator: nothing unfolded
    assert "unfold" not in {n.op for n in as_convolution.graph.nodes}
    np.testing.assert_array_equal(on_fsim, as_convolution.run(x, "cpu"))


def test_mobilenet_v2_float32_as_onnx_runtime_and_int8_on_fsim_and_cpu():
    """torchvision's MobileNetV2 topology (17 depthwise convolutions, 35 ReLU6 clips, 10 residual
    adds): float32 as ONNX Runtime; int8 alike on fsim and the cpu, close to float32, its
    convolutions (depthwise ones included), the residual adds and the classifier on the
    accelerator."""
    rng = np.random.default_rng(5)
    m = build_mobilenet_v2(image=32, width=0.5, classes=10)
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("Clip") == 35 and ops.count("Add") == 10 and sum(
        any(a.name == "group" for a in n.attribute) for n in m.graph.node) == 17
    x = rng.normal(size=(1, 3, 32, 32)).astype(np.float32)
    expected = ort_run(m, {"input": x})[0]
    np.testing.assert_allclose(compile_model(m).run(x, "cpu"), expected, rtol=1e-4,
                               atol=1e-4 * np.abs(expected).max())
    model = compile_model(m, quantize="int8", calibrate=rng.normal(size=(3, 1, 3, 32, 32)).astype(np.float32),
                          config="default")
    convs = [n for n in model.graph.nodes if n.op == "conv2d"]
    depthwise = [n for n in convs if n.attrs.get("groups", 1) > 1]
    assert len(convs) == 53 and len(depthwise) == 17      # the classifier as a 1×1 convolution too
    assert all(n.device == "accel" for n in convs)       # the depthwise ones with diagonal weights
    assert [n.device for n in model.graph.nodes if n.op == "add"] == ["accel"] * 10
    on_fsim = model.run(x, "fsim")
    np.testing.assert_array_equal(on_fsim, model.run(x, "cpu"))
    cosine = float(on_fsim.ravel() @ expected.ravel() / np.linalg.norm(on_fsim) / np.linalg.norm(expected))
    assert cosine > 0.95, cosine
    # On the CPU, the 1×1 projections read ReLU6 outputs: their dot products take the bytes as they
    # are; the expansions read the (signed) residual stream.
    from gemforge.compiler.ops.host import _vnni
    from gemforge.compiler import CpuTarget
    if _vnni(CpuTarget(), "int8"):
        plans = {n.name: model._host_kernel(n, "cpu").op.plan for n in convs if n not in depthwise}
        assert plans["features.2.project"].get("nonnegative") and not plans["features.2.expand"].get("nonnegative")


@pytest.mark.parametrize("placement, trips", [([], 0), ([False, False], 0), ([True], 0), ([True, True], 0),
                                              ([False, True, False, True, False], 1),
                                              ([True, False, False, True, False, True, True, False], 2)])
def test_host_round_trips_count_the_host_runs_between_accelerator_steps(placement, trips):
    assert round_trips(placement) == trips


@pytest.mark.slow
def test_resnet18_whole_on_verilator():
    from gemforge.sim.cosim.harness import simulator_available
    if not simulator_available("verilator"):
        pytest.skip("Verilator is not installed")
    rng = np.random.default_rng(1)
    m = build_resnet18()
    model = compile_model(m, quantize="int8", calibrate=rng.normal(size=(1, 1, 3, 224, 224)).astype(np.float32),
                          config="default")
    x = rng.normal(size=(1, 3, 224, 224)).astype(np.float32)
    on_rtl = model.run(x, "verilator")
    cycles = sum(r.cycles for r in model.last_profile if r.cycles)
    np.testing.assert_array_equal(on_rtl, model.run(x, "fsim"))
    assert 6_000_000 < cycles < 12_000_000


def test_compile_and_run_commands(tmp_path, capsys):
    x_train, _, x_test, y_test = digits.load_split()
    np.save(tmp_path / "calib.npy", x_train[:40].reshape(4, 10, 1, 8, 8))
    np.save(tmp_path / "x.npy", x_test[:20])
    gfm = tmp_path / "digits.gfm"
    assert main(["compile", str(digits.MODEL_PATH), "--quantize", "int8", "--calibrate", str(tmp_path / "calib.npy"),
                 "--config", "tiny", "--batch", "10", "-o", str(gfm), "--trace"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["dtype"] == "int8" and summary["config"] == "tiny" and summary["accelerator_nodes"] == 5
    for stage in ("== infer_shapes", "== fold_constants", "== fold_batch_norm", "== fuse", "== quantize",
                  "== partition", "== pack_layouts", "== plan_memory", "memory plan:"):
        assert stage in err
    for device in ("fsim", "cpu"):
        assert main(["run", str(gfm), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / f"{device}.npy"),
                     "--device", device, "--profile"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (tmp_path / f"{device}.profile.png").read_bytes()[:4] == b"\x89PNG"
        assert [r["device"] for r in report["profile"] if r["op"] in ("conv2d", "max_pool")] == [device] * 5
    np.testing.assert_array_equal(np.load(tmp_path / "fsim.npy"), np.load(tmp_path / "cpu.npy"))
    assert np.load(tmp_path / "cpu.npy").shape == (20, 10)
    # The float32 artefact, and the errors a user gets.
    assert main(["compile", str(digits.MODEL_PATH), "-o", str(tmp_path / "f.gfm")]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "f.gfm"), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                 "--device", "fsim"]) == 2
    assert "compiled without an accelerator config" in capsys.readouterr().err
    assert main(["compile", str(digits.MODEL_PATH), "--quantize", "int8", "-o", str(tmp_path / "q.gfm")]) == 2
    assert "needs calibration samples" in capsys.readouterr().err
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    assert main(["compile", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "b.gfm")]) == 2
    assert "is not an ONNX file" in capsys.readouterr().err
    assert main(["run", str(gfm), "--input", str(tmp_path / "calib.npy"), "-o", str(tmp_path / "y.npy")]) == 2
    assert "the model was compiled for [10, 1, 8, 8], or a multiple of its batch 10" in capsys.readouterr().err
    assert Model.load(gfm).summary()["model_sha256"] == summary["model_sha256"]


def test_run_command_with_several_inputs_and_outputs(tmp_path, capsys):
    from onnx import helper
    from onnx_models import model, ort_run
    m = model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["a", "b"], ["p"])],
              [("a", [2, 3]), ("b", [3])], [("s", None), ("p", None)])
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.gfm")]) == 0
    assert main(["run", str(tmp_path / "m.gfm"), "--input", str(tmp_path / "in.npz"), "-o", str(tmp_path / "y.npy")]) == 2
    assert "give -o a .npz file" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "m.gfm"), "--input", str(tmp_path / "in.npz"), "-o", str(tmp_path / "y.npz")]) == 0
    s, p = ort_run(m, {"a": a, "b": b})
    with np.load(tmp_path / "y.npz") as out:
        np.testing.assert_allclose(out["s"], s, rtol=1e-6)
        np.testing.assert_allclose(out["p"], p, rtol=1e-6)
    assert main(["compile", str(tmp_path / "m.onnx"), "--batch", "4", "-o", str(tmp_path / "m4.gfm")]) == 2
    assert "applies to a symbolic first input dimension" in capsys.readouterr().err
