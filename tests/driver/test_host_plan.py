"""CPU runs replayed from a traced `HostPlan` give exactly what running every node the ordinary
way gives, on networks of every kind of node (convolutions, depthwise, pools, concat, resize,
recurrent-style reshapes, attention, int8), input after input; what a run returns stays the
caller's; runs from several threads at once are each right."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gemforge.driver.runtime.model as model_module
from gemforge.driver.runtime.model import compile_model
from gemforge.driver.runtime.device import open_device
from gemforge.models import (build_bert_tiny, build_crnn_style, build_mobilenet_v2, build_unet_style,
                             build_vit_tiny, build_yolo_style)

NETWORKS = {
    "yolo": lambda: build_yolo_style(image=32, width=8),
    "unet": lambda: build_unet_style(image=32),
    "crnn": lambda: build_crnn_style(width=32, channels=16),
    "mobilenet": lambda: build_mobilenet_v2(image=32, width=0.25, classes=10),
    "vit": lambda: build_vit_tiny(),
    "bert": lambda: build_bert_tiny(seq=8, dim=32),
}


def _inputs(m, rng, count: int = 2) -> list[dict[str, np.ndarray]]:
    out = []
    for _ in range(count):
        feeds = {}
        for value in m.graph.input:
            shape = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
            elem = value.type.tensor_type.elem_type
            feeds[value.name] = (rng.integers(0, 8, shape).astype(np.int64) if elem == 7
                                 else rng.normal(size=shape).astype(np.float32))
        out.append(feeds)
    return out


def _equal(got, expected) -> None:
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected)
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])
    else:
        np.testing.assert_array_equal(got, expected)


def _copy(value):
    return {k: np.copy(v) for k, v in value.items()} if isinstance(value, dict) else np.copy(value)


def _ordinary(model, feeds):
    model_module.HOST_PLANS = False
    try:
        return model.run(feeds, "cpu")
    finally:
        model_module.HOST_PLANS = True


@pytest.mark.parametrize("name", NETWORKS)
def test_replayed_runs_equal_the_ordinary_runs(name):
    m = NETWORKS[name]()
    rng = np.random.default_rng(len(name))
    feeds = _inputs(m, rng)
    model = compile_model(m)
    expected = [_ordinary(model, f) for f in feeds]
    first = model.run(feeds[0], "cpu")                        # traced
    assert model._plans, "the run was not planned"
    plan = next(iter(model._plans.values()))
    assert any(step.kernel is not None for step in plan.steps)
    held = _copy(first)
    for k in (1, 0, 1):
        got = model.run(feeds[k], "cpu")                      # replayed
        _equal(got, expected[k])
        assert len(model.last_profile) == len(model.graph.nodes)
    _equal(first, expected[0])
    _equal(first, held)                                       # a later run did not write into it


def test_int8_network_on_the_cpu_and_thread_counts_get_plans_of_their_own():
    m = build_mobilenet_v2(image=32, width=0.25, classes=10)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 1, 3, 32, 32)).astype(np.float32)
    model = compile_model(m, quantize="int8", calibrate=x, config="tiny")
    expected = [_ordinary(model, x[k]) for k in range(3)]
    one, two = open_device("cpu", threads=1), open_device("cpu", threads=2)
    for _ in range(2):
        for k in range(3):
            np.testing.assert_array_equal(model.run(x[k], one), expected[k])
            np.testing.assert_array_equal(model.run(x[k], two), expected[k])
    assert sorted(model._plans) == [1, 2]
    np.testing.assert_array_equal(model.run(x[0], "fsim"), expected[0])     # the accelerator is not planned


def test_runs_from_several_threads_at_once_are_each_right():
    m = build_yolo_style(image=32, width=8)
    rng = np.random.default_rng(2)
    inputs = [rng.normal(size=(1, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    model = compile_model(m)
    expected = [_ordinary(model, x) for x in inputs]
    model.run(inputs[0], "cpu")
    failures = []

    def work(k):
        for _ in range(5):
            if not np.array_equal(model.run(inputs[k], "cpu"), expected[k]):
                failures.append(k)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _dense_block(batch: int = 1, image: int = 9):
    """A DenseNet-style block: every layer concatenates all earlier outputs, the block input x
    (a graph input: never placed) and a max-pooled branch among them, a part listed twice,
    and a concatenation nested in another."""
    from onnx import helper
    from onnx_models import model
    rng = np.random.default_rng(3)
    nodes, inits, features = [], {}, ["stem"]
    nodes.append(helper.make_node("Conv", ["x", "ws", "bs"], ["stem"], pads=[1] * 4))
    inits["ws"], inits["bs"] = rng.normal(size=(16, 3, 3, 3)).astype(np.float32), np.zeros(16, np.float32)
    for k in range(3):
        cat = f"cat{k}"
        nodes.append(helper.make_node("Concat", features, [cat], axis=1))
        w = f"w{k}"
        inits[w] = rng.normal(size=(16, 16 * (k + 1), 3, 3)).astype(np.float32) * 0.2
        inits[f"b{k}"] = rng.normal(size=16).astype(np.float32)
        nodes.append(helper.make_node("Conv", [cat, w, f"b{k}"], [f"y{k}"], pads=[1] * 4))
        features.append(f"y{k}")
    nodes.append(helper.make_node("MaxPool", ["stem"], ["pooled"], kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4))
    nodes.append(helper.make_node("Concat", ["y1", "y2"], ["inner"], axis=1))
    nodes.append(helper.make_node("Concat", [*features[:2], "inner", "pooled", "y0", "x"], ["out"], axis=1))
    return model(nodes, [("x", [batch, 3, image, image])], [("out", None)], inits)


@pytest.mark.parametrize("batch", [1, 2])
def test_concatenations_are_placed_where_their_parts_are_written(batch):
    """The block's concatenations are views of one buffer their parts' kernels write into
    (batch 1; with 2 their parts are not contiguous, so nothing is placed); replays equal the
    ordinary runs and ONNX Runtime, input after input."""
    from onnx_models import ort_run
    m = _dense_block(batch)
    compiled = compile_model(m)
    feeds = _inputs(m, np.random.default_rng(4), count=3)
    for f in feeds:
        got = compiled.run(f, "cpu")
        _equal(got, _ordinary(compiled, f))
        np.testing.assert_allclose(got, ort_run(m, f)[0], rtol=1e-4, atol=1e-4)
    plan = next(iter(compiled._plans.values()))
    concats = {s.node.output: s for s in plan.steps if s.node.op == "concat"}
    placed = {name: s.hk.move for name, s in concats.items() if s.hk.op is None and hasattr(s.hk.move, "in_place")}
    if batch == 2:
        assert not placed
        return
    assert sorted(placed) == ["cat0", "cat1", "cat2", "inner", "out"]
    # Every part a kernel made is in its slice; the graph input x and y0's second listing are copied.
    assert [p is not None for p in placed["out"].in_place] == [True, True, True, True, False, False]
    assert all(p is not None for name in ("cat0", "cat1", "cat2", "inner") for p in placed[name].in_place)
    # The three layer concatenations share the stem's place (prefixes of one buffer).
    addresses = {name: concats[name].hk.move.out.__array_interface__["data"][0] for name in ("cat0", "cat1", "cat2")}
    assert len(set(addresses.values())) == 1
