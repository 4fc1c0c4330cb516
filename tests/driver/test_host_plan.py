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
