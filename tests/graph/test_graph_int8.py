"""The int8 network: bit-identical on fsim, the CPU back end and the graph's numpy semantics,
on several configs (hand-over in DRAM where BI = BO, through the host where not); the
artefact's round trip; runs in batch chunks; refusals of the runtime."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemforge.compiler.graph.evaluate import evaluate
from gemforge.driver.runtime.model import Model, ModelError, compile_model
from gemforge.hw.config import PRESETS, AccelConfig
from onnx_models import small_cnn

#: BI = BO (hand-over in DRAM) and BI ≠ BO (every edge through the host), batch lanes 1 and 2.
CONFIGS = {
    "default": PRESETS["default"],
    "tiny": PRESETS["tiny"],
    "wide_in": dataclasses.replace(PRESETS["tiny"], name="wide_in", block_in=8, inp_buffer_bytes=2048,
                                   wgt_buffer_bytes=8192),
    "batch2": dataclasses.replace(PRESETS["tiny"], name="batch2", batch=2, inp_buffer_bytes=2048,
                                  acc_buffer_bytes=8192, out_buffer_bytes=2048),
}


def _compile(seed, config, *, channels=16, image=8, batch=2, samples=6, **options):
    rng = np.random.default_rng(seed)
    m = small_cnn(rng, channels=channels, image=image, batch="N", **options)
    calib = rng.normal(size=(samples, batch, 3, image, image)).astype(np.float32)
    return m, compile_model(m, quantize="int8", calibrate=calib, config=config, batch=batch), rng


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed", range(2))
def test_int8_bit_identical_on_fsim_cpu_and_numpy(name, seed):
    m, model, rng = _compile(seed, CONFIGS[name], channels=8 * (1 + seed), residual=bool(seed) or name == "tiny")
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    on_cpu = model.run(x, "cpu")
    on_fsim = model.run(x, "fsim")
    assert on_cpu.dtype == np.float32 and on_cpu.shape == (2, 10)
    np.testing.assert_array_equal(on_fsim, on_cpu)
    np.testing.assert_array_equal(evaluate(model.graph, {"input": x})["logits"], on_cpu)
    placed = {n.name: n.device for n in model.graph.nodes}
    assert placed["conv1"] == placed["conv2"] == placed["conv3"] == placed["fc"] == "accel"
    # A max pool of a ReLU's output, widened on the GEMM core where its blocks are square.
    assert placed["pool"] == ("accel" if CONFIGS[name].block_in == CONFIGS[name].block_out else "cpu")
    memory = model.graph.notes.memory
    assert memory["peak_bytes"] <= memory["naive_bytes"]
    config = CONFIGS[name]
    # conv1 → conv2 hands over in DRAM exactly when the packed layouts agree.
    assert (memory["handovers"] > 0) == (config.block_in == config.block_out)


def test_int8_is_close_to_float():
    m, model, rng = _compile(3, "default", channels=16, samples=12)
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    float_out = compile_model(m, batch=2).run(x, "cpu")
    err = np.abs(model.run(x, "fsim") - float_out).max()
    assert err < 0.15 * np.abs(float_out).max()


def _windows_cnn(rng):
    """Convolutions with SAME padding at stride 2, dilated taps and uneven padding (a Pad node),
    pools with ceil mode's partial windows and uneven padding."""
    from onnx import helper

    from onnx_models import model
    N = helper.make_node
    weights = {"w1": rng.normal(size=(8, 3, 3, 3)) * 0.3, "w2": rng.normal(size=(8, 8, 3, 3)) * 0.2,
               "w3": rng.normal(size=(8, 8, 2, 2)) * 0.2, "fc": rng.normal(size=(8 * 2 * 2, 5)) * 0.2}
    nodes = [N("Conv", ["x", "w1"], ["c1"], strides=[2, 2], auto_pad="SAME_UPPER", name="c1"), N("Relu", ["c1"], ["r1"]),
             N("Conv", ["r1", "w2"], ["c2"], dilations=[2, 2], pads=[2, 2, 2, 2], name="c2"), N("Relu", ["c2"], ["r2"]),
             N("MaxPool", ["r2"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[0, 0, 1, 1], name="p"),
             N("Conv", ["p", "w3"], ["c3"], pads=[0, 0, 1, 1], name="c3"),
             N("AveragePool", ["c3"], ["a"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, count_include_pad=1,
               pads=[1, 1, 0, 0], name="a"),
             N("Flatten", ["a"], ["f"]), N("MatMul", ["f", "fc"], ["y"], name="fc")]
    return model(nodes, [("x", ["N", 3, 11, 11])], [("y", ["N", 5])],
                 {k: v.astype(np.float32) for k, v in weights.items()})


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_int8_windows_bit_identical_and_close_to_onnx_runtime(name):
    from onnx_models import ort_run
    rng = np.random.default_rng(12)
    m = _windows_cnn(rng)
    calib = rng.normal(size=(6, 2, 3, 11, 11)).astype(np.float32)
    model = compile_model(m, quantize="int8", calibrate=calib, config=CONFIGS[name], batch=2)
    x = rng.normal(size=(2, 3, 11, 11)).astype(np.float32)
    on_cpu = model.run(x, "cpu")
    np.testing.assert_array_equal(model.run(x, "fsim"), on_cpu)
    np.testing.assert_array_equal(evaluate(model.graph, {"x": x})["y"], on_cpu)
    placed = {n.name: (n.op, n.device) for n in model.graph.nodes}
    assert placed["c1"] == placed["c2"] == placed["c3"] == ("conv2d", "accel")
    assert placed["c3/pad"] == ("pad", "cpu")
    expected = ort_run(m, {"x": x})[0]
    assert np.abs(on_cpu - expected).max() < 0.15 * np.abs(expected).max()


def test_artefact_round_trip_and_batch_chunks(tmp_path):
    m, model, rng = _compile(4, "tiny", softmax=True)
    path = tmp_path / "net.gfm"
    model.save(path)
    loaded = Model.load(path)
    x = rng.normal(size=(6, 3, 8, 8)).astype(np.float32)     # three chunks of the compiled batch 2
    y = loaded.run(x, "fsim")
    assert y.shape == (6, 10)
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_array_equal(y[2:4], model.run(x[2:4], "fsim"))
    np.testing.assert_array_equal(y, model.run(x, "cpu"))
    assert loaded.summary()["model_sha256"] == model.summary()["model_sha256"] is not None


@pytest.mark.parametrize("samples", [np.float32(1.0), "abc", {"x": np.float32(1.0)}])
def test_calibration_samples_without_a_sample_axis_are_refused(samples):
    from gemforge.compiler.graph import GraphError
    m = small_cnn(np.random.default_rng(0), channels=4, image=4)
    name = m.graph.input[0].name
    samples = {name: samples["x"]} if isinstance(samples, dict) else samples
    with pytest.raises(GraphError, match="calibration samples"):
        compile_model(m, quantize="int8", calibrate=samples, config="tiny")


def _rewrite_model(data: bytes, change) -> bytes:
    """The model file with its members (name -> bytes) rewritten by ``change`` in place."""
    import io
    import zipfile
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        files = {n: z.read(n) for n in z.namelist()}
    change(files)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    return out.getvalue()


def _edit_manifest(data: bytes, edit) -> bytes:
    import json

    def change(files):
        manifest = json.loads(files["manifest.json"])
        edit(manifest)
        files["manifest.json"] = json.dumps(manifest).encode()
    return _rewrite_model(data, change)


def _accel_node(manifest):
    return next(n for n in manifest["graph"]["nodes"] if n["device"] == "accel")


def _named(manifest, name: str):
    return next(n for n in manifest["graph"]["nodes"] if n["name"] == name)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["plan"]["tensors"][0].update(tensor="bogus"), "memory plan has no slot"),
    (lambda m: m["plan"]["tensors"][0].update(last="x"), "memory plan has a malformed entry"),
    (lambda m: m["plan"]["tensors"][0].update(shape=5), "memory plan has a malformed entry"),
    (lambda m: m["plan"]["tensors"][0].update(nbytes=1), "memory plan has no slot"),
    (lambda m: m["graph"]["nodes"][0].update(name=["a"]), "names must be strings"),
    (lambda m: _accel_node(m)["attrs"].update(shift=["a"]), "attribute shift"),
    (lambda m: _accel_node(m)["attrs"].pop("relu"), "lacks attribute"),
    (lambda m: _accel_node(m)["attrs"].update(stride=0), "attribute stride"),
    (lambda m: m["layers"][_accel_node(m)["name"]].update(out_shape=[1, 0]), "layer shapes disagree"),
    (lambda m: m["graph"]["nodes"][-1].update(output=m["graph"]["inputs"][0]), "writes tensor 'input', which"),
    (lambda m: m["graph"]["nodes"][-1].update(output=m["graph"]["nodes"][-2]["output"]), "already defines"),
    # The int8 attributes this issue added: a convolution's fused upper bound, an average's
    # finer output, a max pool's that it has none, and the programs that follow from them.
    (lambda m: _accel_node(m)["attrs"].update(hi=300), "a fused int8 clip's upper bound hi is an integer"),
    (lambda m: _accel_node(m)["attrs"].update(hi=5), r"accelerator node 'conv1': its program clamps below nothing but "
                                                     r"the manifest's node makes it \d+ \(its hi 5\)"),
    (lambda m: _named(m, "avg")["attrs"].update(lshift=9), "an average's lshift is a whole number from 0 to 6"),
    (lambda m: _named(m, "pool")["attrs"].update(lshift=1), "a max pool has none"),
    (lambda m: _named(m, "avg")["attrs"].update(lshift=_named(m, "avg")["attrs"].get("lshift", 0) + 1),
     "accelerator node 'avg': the (weights|bias) packed in its program differ from"),
    (lambda m: _named(m, "residual")["attrs"].update(lshift=[0, 3]),
     "accelerator node 'residual': the weights packed in its program differ from its attribute lshift"),
])
def test_an_edited_manifest_is_refused_when_loaded_not_when_run(edit, message):
    _, model, _ = _compile(3, "tiny", channels=8)
    with pytest.raises(ModelError, match=f"not a valid gemforge model.*{message}"):
        Model.from_bytes(_edit_manifest(model.to_bytes(), edit))


def _edit_constant(data: bytes, pick, change) -> bytes:
    """The model file with the constant ``pick(manifest)`` names changed by ``change``."""
    import io
    import json

    def rewrite(files):
        with np.load(io.BytesIO(files["constants.npz"])) as npz:
            constants = {k: npz[k] for k in npz.files}
        name = pick(json.loads(files["manifest.json"]))
        constants[name] = change(constants[name].copy())
        buffer = io.BytesIO()
        np.savez(buffer, **constants)
        files["constants.npz"] = buffer.getvalue()
    return _rewrite_model(data, rewrite)


def _bump(array):
    array.reshape(-1)[0] += 1
    return array


@pytest.mark.parametrize("edit, message", [
    (lambda d: _edit_manifest(d, lambda m: _accel_node(m)["attrs"].update(shift=_accel_node(m)["attrs"]["shift"] + 1)),
     r"accelerator node 'conv1': its program's shift is \d+ but the manifest's node makes it \d+"),
    (lambda d: _edit_manifest(d, lambda m: _accel_node(m)["attrs"].update(relu=not _accel_node(m)["attrs"]["relu"])),
     "accelerator node 'conv1': its program's relu is (True but the manifest's node makes it False|False but the manifest's node makes it True)"),
    (lambda d: _edit_constant(d, lambda m: _accel_node(m)["inputs"][1], _bump),
     "accelerator node 'conv1': the weights packed in its program differ from the manifest's"),
    (lambda d: _edit_constant(d, lambda m: _accel_node(m)["inputs"][2], _bump),
     "accelerator node 'conv1': the bias packed in its program differ from the manifest's"),
])
def test_a_manifest_that_disagrees_with_the_packed_programs_is_refused(edit, message):
    """The programs run on the accelerator and the manifest's graph on the CPU: a model file
    edited in one of them ran on fsim as compiled, the edit silently ignored."""
    _, model, _ = _compile(3, "tiny", channels=8)
    data = model.to_bytes()
    Model.from_bytes(data)          # as compiled, it loads
    with pytest.raises(ModelError, match=f"not a valid gemforge model.*{message}.*compile the model again"):
        Model.from_bytes(edit(data))


def test_runtime_refusals(tmp_path):
    m, model, rng = _compile(5, "tiny")
    with pytest.raises(ModelError, match=r"compiled for \[2, 3, 8, 8\], or a multiple of its batch 2"):
        model.run(np.zeros((3, 3, 8, 8), np.float32), "fsim")
    with pytest.raises(ModelError, match="unknown device 'tpu'.* or uart:PORT"):
        model.run(np.zeros((2, 3, 8, 8), np.float32), "tpu")
    from gemforge.driver.runtime.device import DeviceError
    with pytest.raises(DeviceError, match="/dev/no-such-gemforge-port"):
        model.run(np.zeros((2, 3, 8, 8), np.float32), "uart:/dev/no-such-gemforge-port")
    with pytest.raises(ModelError, match="the gpu runs float32 networks"):
        model.run(np.zeros((2, 3, 8, 8), np.float32), "gpu")
    floating = compile_model(m, batch=2)
    with pytest.raises(ModelError, match="compiled without an accelerator config"):
        floating.run(np.zeros((2, 3, 8, 8), np.float32), "fsim")
    with pytest.raises(ModelError, match="compiled without an accelerator config"):
        floating.run(np.zeros((2, 3, 8, 8), np.float32), "uart:/dev/ttyUSB0")
    bad = tmp_path / "bad.gfm"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ModelError, match="not a valid gemforge model"):
        Model.load(bad)
    with pytest.raises(ModelError, match="cannot read model"):
        Model.load(tmp_path / "missing.gfm")


def test_layer_the_accelerator_cannot_tile_stays_on_cpu():
    # One accumulator entry cannot hold an output pixel and its bias: conv1 runs on the CPU, and says why.
    tiny = PRESETS["tiny"]
    small = dataclasses.replace(tiny, name="small", acc_buffer_bytes=tiny.acc_entry_bytes,
                                out_buffer_bytes=tiny.out_entry_bytes)
    m, model, rng = _compile(6, small)
    rows = {r["node"]: r for r in model.graph.notes.partition}
    assert rows["conv1"]["device"] == "cpu" and "cannot be tiled" in rows["conv1"]["reason"]
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(model.run(x, "fsim"), model.run(x, "cpu"))


class _CountingDevice:
    """An open device that counts the programs it runs (chained or not)."""

    def __init__(self, device):
        self.device, self.runs, self.cycles = device, 0, 0

    def __getattr__(self, name):
        return getattr(self.device, name)

    def run(self, loaded):
        self.runs += 1
        result = self.device.run(loaded)
        self.cycles += result.cycles or 0
        return result


@pytest.mark.parametrize("name", list(CONFIGS))
def test_an_accelerator_run_is_one_program(name):
    """Consecutive accelerator layers run as one chained program (one START, one FINISH): as
    many device runs per inference as `accel_runs` (a layer whose output the host re-packs ends
    one), the same outputs as one program per layer and the CPU, and a profile row per layer
    whose work (split at the chain's links) is what the layer's own program does."""
    from gemforge.compiler.graph.partition import accel_runs
    from gemforge.driver.runtime.device import open_device
    config = CONFIGS[name]
    m, model, rng = _compile(11, config, channels=8, residual=True)
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    runs = accel_runs(model.graph, model.net.layers)
    assert model.summary()["accelerator_runs"] == len(runs)
    # The host concatenates (`small_cnn`), and re-packs conv1's output where blocks differ.
    assert len(runs) == (2 if config.block_in == config.block_out else 4)
    device = _CountingDevice(open_device("fsim", config))
    chained = model.run(x, device)
    rows = [r for r in model.last_profile if r.device == "fsim"]
    assert device.runs == len(runs) and len(rows) == sum(last - first + 1 for first, last in runs)
    device.runs = 0
    np.testing.assert_array_equal(model.run(x, device, chain=False), chained)
    alone = [r for r in model.last_profile if r.device == "fsim"]
    assert device.runs == len(alone)
    np.testing.assert_array_equal(chained, model.run(x, "cpu"))
    for row, own in zip(rows, alone):
        assert row.node == own.node
        for counter in ("gemm_uops", "alu_uops", "macs", "store_insns", "gemm_insns"):
            assert row.counters[counter] == own.counters[counter], (row.node, counter)


@pytest.mark.skipif(not __import__("gemforge.sim.cosim.harness", fromlist=["x"]).simulator_available("verilator"),
                    reason="Verilator is not installed")
def test_int8_network_on_verilator_equals_fsim():
    m, model, rng = _compile(7, "tiny", channels=8, image=6)
    x = rng.normal(size=(2, 3, 6, 6)).astype(np.float32)
    from gemforge.driver.runtime.device import open_device
    device = _CountingDevice(open_device("verilator", PRESETS["tiny"], sim_dram_bytes=model._sim_dram_bytes()))
    try:
        on_rtl = model.run(x, device)
    finally:
        device.close()
    accel = [r for r in model.last_profile if r.cycles is not None]
    # A chained program per accelerator run (the host concatenates between two), its cycles
    # split at the links between layers.
    assert device.runs == model.summary()["accelerator_runs"] == 2
    assert sum(r.cycles for r in accel) == device.cycles
    np.testing.assert_array_equal(on_rtl, model.run(x, "fsim"))
    # Three convolutions, the residual add and the pools (widened on the GEMM core) and the dense
    # layer, a 1×1 convolution of the global pool's image (`image_dense`).
    assert [r.op for r in accel] == ["conv2d", "conv2d", "add", "max_pool", "conv2d", "avg_pool", "avg_pool",
                                     "conv2d"]
    assert all(0 < r.gemm_utilization <= 1 for r in accel)


def _edge_models(rng):
    from onnx import helper
    from onnx_models import model
    w = rng.normal(size=(3, 4)).astype(np.float32)
    c = helper.make_tensor("v", 1, [3], [1.0, 2.0, 3.0])
    yield model([helper.make_node("Add", ["x", "s"], ["y"])], [("x", [2, 3])], [("y", None)],
                {"s": np.array(0.5, np.float32)}), (2, 3)                      # a 0-d constant
    yield model([helper.make_node("Mul", ["s", "x"], ["y"])], [("x", [2, 3])], [("y", None)],
                {"s": np.array([2.0], np.float32)}), (2, 3)
    yield model([helper.make_node("Clip", ["x"], ["y"])], [("x", [2, 3])], [("y", None)]), (2, 3)  # no bounds
    yield model([helper.make_node("Clip", ["x", "lo"], ["y"])], [("x", [2, 3])], [("y", None)],
                {"lo": np.array(-0.2, np.float32)}), (2, 3)
    yield model([helper.make_node("Constant", [], ["c"], value=c), helper.make_node("Add", ["x", "c"], ["y"])],
                [("x", [2, 3])], [("y", None)]), (2, 3)
    yield model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [3])], [("y", None)], {"w": w}), (3,)
    yield model([helper.make_node("Add", ["x", "x"], ["y"])], [("x", [2, 3])], [("y", None)]), (2, 3)
    yield model([helper.make_node("Concat", ["x", "c"], ["y"], axis=0)], [("x", [2, 3])], [("y", None)],
                {"c": np.ones((1, 3), np.float32)}), (2, 3)
    yield model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Add", ["y", "x"], ["z"])],
                [("x", [2, 3])], [("z", None)]), (2, 3)


def test_edge_cases_float_and_int8():
    """0-d and 1-d tensors, unbounded clips, Constant nodes, x + x, constants in a concat: the
    float network equals ONNX Runtime, the int8 one runs identically on fsim and the CPU."""
    from onnx_models import ort_run
    rng = np.random.default_rng(8)
    for m, shape in _edge_models(rng):
        x = rng.normal(size=shape).astype(np.float32)
        expected = ort_run(m, {"x": x})[0]
        np.testing.assert_allclose(compile_model(m).run(x, "cpu"), expected, rtol=1e-6, atol=1e-6)
        q = compile_model(m, quantize="int8", calibrate=np.stack([x, -x]), config="tiny")
        on_fsim = q.run(x, "fsim")
        np.testing.assert_array_equal(on_fsim, q.run(x, "cpu"))
        assert np.abs(on_fsim - expected).max() <= 0.05 * max(1.0, float(np.abs(expected).max()))


@st.composite
def int8_configs(draw) -> AccelConfig:
    """Random valid int8 configs: block shapes, buffer depths, bus width and queue depths."""
    batch, block_in, block_out = (1 << draw(st.integers(0, 3)) for _ in range(3))
    depth = {b: 1 << draw(st.integers(6, 11)) for b in ("inp", "wgt", "acc")}
    return AccelConfig(
        name="random", batch=batch, block_in=block_in, block_out=block_out,
        inp_buffer_bytes=depth["inp"] * batch * block_in, wgt_buffer_bytes=depth["wgt"] * block_out * block_in,
        acc_buffer_bytes=depth["acc"] * batch * block_out * 4, out_buffer_bytes=depth["acc"] * batch * block_out,
        uop_buffer_bytes=(1 << draw(st.integers(9, 13))) * 8, bus_width=draw(st.sampled_from((64, 128, 256))),
        cmd_queue_depth=1 << draw(st.integers(2, 9)), token_queue_depth=1 << draw(st.integers(2, 9)))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=int8_configs(), seed=st.integers(0, 1 << 16), batch=st.integers(1, 3), image=st.integers(4, 9))
def test_random_configs_and_shapes(config, seed, batch, image):
    """Any valid config, any small shape: fsim and the CPU agree bit for bit (the layers the
    config cannot tile stay on the CPU, each with its reason)."""
    rng = np.random.default_rng(seed)
    m = small_cnn(rng, channels=int(rng.integers(3, 13)), image=image, batch="N", classes=int(rng.integers(2, 12)))
    calib = rng.normal(size=(2, batch, 3, image, image)).astype(np.float32)
    model = compile_model(m, quantize="int8", calibrate=calib, config=config, batch=batch)
    assert all(r["reason"] for r in model.graph.notes.partition
               if r["device"] == "cpu" and r["op"] in ("conv2d", "dense"))
    x = rng.normal(size=(batch, 3, image, image)).astype(np.float32)
    np.testing.assert_array_equal(model.run(x, "fsim"), model.run(x, "cpu"))


def test_layer_programs_keep_the_compilers_own_constants():
    """Found by `test_random_configs_and_shapes`: a conv2d that loads zero rows from a constant
    of its program (kernel rows chunked with padding) lost that constant when the network put
    its weights in, and read whatever a reused arena slot held."""
    config = AccelConfig(name="random", batch=8, block_in=1, block_out=4, inp_buffer_bytes=512,
                         wgt_buffer_bytes=4096, acc_buffer_bytes=8192, out_buffer_bytes=2048, uop_buffer_bytes=4096,
                         bus_width=128, cmd_queue_depth=8, token_queue_depth=4)
    rng = np.random.default_rng(1109)
    m = small_cnn(rng, channels=int(rng.integers(3, 13)), image=5, batch="N", classes=int(rng.integers(2, 12)))
    model = compile_model(m, quantize="int8", calibrate=rng.normal(size=(2, 2, 3, 5, 5)).astype(np.float32),
                          config=config, batch=2)
    assert any(name.startswith("zeros") for layer in model.net.layers.values() for name in layer.program.constants)
    x = rng.normal(size=(2, 3, 5, 5)).astype(np.float32)
    np.testing.assert_array_equal(model.run(x, "fsim"), model.run(x, "cpu"))


def _pool_model(rng, pool: dict, relu: bool):
    """conv (+ ReLU) → ``pool`` (a MaxPool's or AveragePool's attributes and op) → conv."""
    from onnx import helper
    from onnx_models import model
    c = 16
    init = {"w1": rng.normal(0, 0.4, (c, 3, 3, 3)).astype(np.float32),
            "w2": rng.normal(0, 0.2, (c, c, 1, 1)).astype(np.float32)}
    op = pool.pop("op")
    nodes = [helper.make_node("Conv", ["input", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1")]
    if relu:
        nodes.append(helper.make_node("Relu", ["c1"], ["r1"], name="relu1"))
    nodes += [helper.make_node(op, ["r1" if relu else "c1"], ["p"], name="pool", **pool),
              helper.make_node("Conv", ["p", "w2"], ["out"], name="conv2")]
    return model(nodes, [("input", [1, 3, 9, 9])], [("out", None)], init)


@pytest.mark.parametrize("pool, relu, reason", [
    ({"op": "MaxPool", "kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, True, ""),
    ({"op": "MaxPool", "kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, False,
     "a padded max pool of inputs that may be negative"),
    ({"op": "MaxPool", "kernel_shape": [3, 3], "strides": [2, 2]}, False, ""),
    ({"op": "MaxPool", "kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, True,
     r"its ceil_mode keeps partial windows \(\[5, 5\] outputs where whole windows give \[4, 4\]\)"),
    ({"op": "AveragePool", "kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}, True,
     "without count_include_pad"),
    ({"op": "AveragePool", "kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
      "count_include_pad": 1}, True, ""),
])
def test_pools_on_the_accelerator_or_on_the_cpu_with_the_reason(pool, relu, reason):
    """Pools run on the accelerator where it computes them exactly (`compile_int8_pool2d`);
    elsewhere on the CPU with the reason recorded. Either way fsim equals the CPU."""
    rng = np.random.default_rng(11)
    m = _pool_model(rng, dict(pool), relu)
    calib = rng.normal(size=(4, 1, 3, 9, 9)).astype(np.float32)
    model = compile_model(m, quantize="int8", calibrate=calib, config="default")
    row = next(r for r in model.graph.notes.partition if r["node"] == "pool")
    if row["device"] == "cpu" and row["reason"] == "" and pool["op"] == "AveragePool":
        pytest.skip("the quantizer kept this average pool in float32 (its output calibrated finer)")
    assert row["device"] == ("cpu" if reason else "accel"), row
    if reason:
        assert re.search(reason, row["reason"]), row
    x = rng.normal(size=(1, 3, 9, 9)).astype(np.float32)
    np.testing.assert_array_equal(model.run(x, "fsim"), model.run(x, "cpu"))


def test_a_depthwise_convolution_runs_on_the_accelerator_and_its_file_is_checked():
    """A depthwise convolution (a group per channel) runs on the accelerator with diagonal weights,
    as the CPU computes it, through a saved .gfm; its program's weights edited are refused."""
    from onnx import helper
    from onnx_models import model as onnx_model
    from gemforge.hw.program import Program
    rng = np.random.default_rng(12)
    c = 24
    init = {"w1": rng.normal(0, 0.4, (c, 3, 3, 3)).astype(np.float32),
            "dw": rng.normal(0, 0.4, (c, 1, 3, 3)).astype(np.float32),
            "w2": rng.normal(0, 0.2, (8, c, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["input", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "dw"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2], group=c, name="dw"),
             helper.make_node("Conv", ["d", "w2"], ["out"], name="conv2")]
    m = onnx_model(nodes, [("input", [1, 3, 10, 10])], [("out", None)], init)
    compiled = compile_model(m, quantize="int8", calibrate=rng.normal(size=(4, 1, 3, 10, 10)).astype(np.float32),
                             config="tiny")
    assert {n.name: n.device for n in compiled.graph.nodes}["dw"] == "accel"
    data = compiled.to_bytes()
    x = rng.normal(size=(1, 3, 10, 10)).astype(np.float32)
    loaded = Model.from_bytes(data)
    np.testing.assert_array_equal(loaded.run(x, "fsim"), loaded.run(x, "cpu"))
    files = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        files = {name: z.read(name) for name in z.namelist()}
    member = json.loads(files["manifest.json"])["layers"]["dw"]["program"]
    program = Program.from_bytes(files[member])
    program.constants["w"] = program.constants["w"].copy()
    program.constants["w"][0, 0, 0, 0, 1] = 5          # off the diagonal
    files[member] = program.to_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, raw in files.items():
            z.writestr(name, raw)
    with pytest.raises(ModelError, match="accelerator node 'dw': the weights packed in its program differ"):
        Model.from_bytes(buffer.getvalue())


def test_a_model_file_from_before_chained_runs_runs_a_program_per_layer():
    """A plan whose lifetimes are per layer (model files written before runs were chained) still
    loads, and runs one program per layer: chained, its host-read tensors could be overwritten."""
    from gemforge.compiler.graph.memory_plan import pack_layouts, plan_memory
    m, model, rng = _compile(12, "tiny", channels=8, residual=True)
    net = model.net
    net.plan = plan_memory(net.graph, pack_layouts(net.graph, net.layers, run_wide=False), net.config)
    old = Model.from_bytes(model.to_bytes())
    assert not old.net.plan.run_wide
    assert old.summary()["accelerator_runs"] == sum(n.device == "accel" for n in old.graph.nodes)
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    on_fsim = old.run(x, "fsim")
    assert len({r.run for r in old.last_profile if r.run is not None}) == old.summary()["accelerator_runs"]
    np.testing.assert_array_equal(on_fsim, old.run(x, "cpu"))
    assert Model.from_bytes(compile_model(m, quantize="int8", calibrate=rng.normal(size=(3, 2, 3, 8, 8)).astype(
        np.float32), config="tiny", batch=2).to_bytes()).net.plan.run_wide


def test_an_open_device_keeps_the_network_between_runs():
    """On a device the caller keeps open, the first run places the arena and the chained
    programs (weights, micro-ops, streams); later runs write only their inputs and read only
    their outputs; `release` frees all of it."""
    from gemforge.driver.runtime.device import open_device
    m, model, rng = _compile(13, "default", channels=8, residual=True)
    device = open_device("fsim", PRESETS["default"])
    written = []
    write = device.write
    device.write = lambda buf, data, offset=0: (written.append(np.asarray(data).nbytes), write(buf, data, offset))[1]
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    first = model.run(x, device)
    placed = sum(written)
    written.clear()
    again = model.run(x, device)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, model.run(x, "cpu"))
    inputs = sum(written)
    weights = sum(np.asarray(c).nbytes for layer in model.net.layers.values() for c in layer.program.constants.values())
    # The packed input and the concatenation's output (the host makes them), not the weights again.
    assert 0 < inputs <= placed - weights
    model.release(device)
    assert not device._allocated
