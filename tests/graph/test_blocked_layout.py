"""The CPU's blocked image layout (NCHW16c, `graph.blocked`): the blocked convolution, depthwise and
pooling kernels against numpy on random shapes, which values the planner blocks, and networks run
in it against ONNX Runtime and against the same model in NCHW (traced, replayed, saved, batched)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_models import model
from gemforge.compiler import CpuTarget, GpuTarget
from gemforge.compiler.graph import blocked
from gemforge.compiler.ops import OpError, conv2d_reference, host
from gemforge.compiler.ops.nn import CHANNEL_BLOCK
from gemforge.compiler.ops.reference import avg_pool2d_reference, max_pool2d_reference
from gemforge.driver.runtime import model as runtime_model
from gemforge.driver.runtime.device import open_device
from gemforge.driver.runtime.model import Model, compile_model

B = CHANNEL_BLOCK


def to_blocked(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """(N, C, H, W) → (N, ⌈C/16⌉, H, W, 16), a partial last block's padding ``fill``."""
    n, c, h, w = x.shape
    k = -(-c // B)
    padded = np.full((n, k * B, h, w), fill, np.float32)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, k, B, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(x: np.ndarray, channels: int | None = None) -> np.ndarray:
    n, k, h, w, b = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, k * b, h, w)[:, :channels])


def _close(got, expect):
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(expect).max())))


# ---------------------------------------------------------------------------- kernels

@pytest.mark.parametrize("seed", range(10))
def test_blocked_convolutions_on_random_shapes(seed):
    """One group, either layout in and out, any kernel, stride and padding, a residual in the
    output's layout, a clip: against numpy."""
    rng = np.random.default_rng(seed)
    blocked_in, blocked_out = [(True, True), (True, False), (False, True)][seed % 3]
    # Whole channel blocks, or a partial last one (its padding zero).
    c = B * int(rng.integers(1, 4)) if seed % 2 else int(rng.integers(1, 40))
    o = B * int(rng.integers(1, 5)) if seed % 4 < 2 else int(rng.integers(1, 40))
    k = int(rng.choice([1, 3, 5, 7]))
    stride, padding = int(rng.integers(1, 3)), int(rng.integers(0, k // 2 + 1))
    n, h, w = int(rng.integers(1, 3)), int(rng.integers(k, 16)), int(rng.integers(k, 16))
    residual, relu = bool(rng.integers(2)), bool(rng.integers(2))
    clip = (0.0, 2.0) if rng.integers(3) == 0 else None
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(o, c, k, k)).astype(np.float32) * 0.3
    b = rng.normal(size=o).astype(np.float32)
    expect = conv2d_reference(x, wt, b, stride, padding)
    skip = rng.normal(size=expect.shape).astype(np.float32)
    if residual:
        expect = expect + skip
    if relu or clip:
        expect = np.maximum(expect, 0)
    if clip:
        expect = np.clip(expect, *clip)
    op = host.compile_conv2d(CpuTarget(), x.shape, wt.shape, stride=stride, padding=padding, dtype="float32",
                             bias=True, relu=relu or clip is not None, clip=clip, residual=residual,
                             blocked_in=blocked_in, blocked_out=blocked_out)
    # A partial block's padding holds anything finite: the weights there are zero.
    args = {"x": to_blocked(x, fill=rng.normal()) if blocked_in else x, "w": wt, "bias": b}
    if residual:
        args["residual"] = to_blocked(skip) if blocked_out else skip
    out, _ = op.run(open_device("cpu"), **args)
    assert op.plan["method"] == "blocked" and (not blocked_out or op.plan["nb"] % B == 0)
    if blocked_out:
        assert not from_blocked(out)[:, o:].any()          # a partial block's padding is zero
        out = from_blocked(out, o)
    _close(out, expect)


@pytest.mark.parametrize("seed", range(6))
def test_blocked_depthwise_convolutions_on_random_shapes(seed):
    rng = np.random.default_rng(100 + seed)
    c, k = B * int(rng.integers(1, 4)) if seed % 2 else int(rng.integers(1, 40)), int(rng.choice([3, 5]))
    stride, padding = int(rng.integers(1, 3)), int(rng.integers(0, k // 2 + 1))
    n, h, w = int(rng.integers(1, 3)), int(rng.integers(k, 20)), int(rng.integers(k, 20))
    bias, clip = bool(rng.integers(2)), (0.0, 6.0) if rng.integers(2) else None
    x = rng.normal(size=(n, c, h, w)).astype(np.float32) * 4
    wt = rng.normal(size=(c, 1, k, k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32) if bias else None
    expect = conv2d_reference(x, wt, b, stride, padding, groups=c)
    if clip:
        expect = np.clip(expect, *clip)
    op = host.compile_conv2d(CpuTarget(), x.shape, wt.shape, stride=stride, padding=padding, groups=c,
                             dtype="float32", bias=bias, relu=clip is not None, clip=clip, blocked_in=True,
                             blocked_out=True)
    out, _ = op.run(open_device("cpu"), x=to_blocked(x), w=wt, **({"bias": b} if bias else {}))
    assert op.plan["method"] == "depthwise-blocked"
    assert not from_blocked(out)[:, c:].any()                # a partial block's padding stays zero
    _close(from_blocked(out, c), expect)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode,include", [
    ((3, 3), (2, 2), (1, 1, 1, 1), 1, False, False), ((3, 2), (2, 1), (1, 0, 1, 1), 1, True, True),
    ((2, 2), (2, 2), (0, 0, 0, 0), 2, False, False), ((7, 5), (1, 1), (0, 0, 0, 0), 1, False, False),
    ((3, 3), (1, 1), (1, 1, 1, 1), 1, False, True)])
def test_blocked_pooling(kind, kernel, stride, padding, dilation, ceil_mode, include):
    rng = np.random.default_rng(len(kind) + kernel[0])
    x = rng.normal(size=(2, 24, 7, 9)).astype(np.float32)           # a partial second block
    if kind == "max":
        x[0, 3, 2, 2] = np.nan           # a NaN is ignored unless the whole window is
        expect = max_pool2d_reference(x, kernel, stride, padding, dilation=dilation, ceil_mode=ceil_mode)
    else:
        expect = avg_pool2d_reference(x, kernel, stride, padding, dilation=dilation, ceil_mode=ceil_mode,
                                      count_include_pad=include)
    op = host.compile_pool2d(CpuTarget(), kind, x.shape, kernel, stride=stride, padding=padding, dilation=dilation,
                             ceil_mode=ceil_mode, dtype="float32", count_include_pad=include, blocked=True)
    out, _ = op.run(open_device("cpu"), x=to_blocked(x))
    assert not from_blocked(out)[:, 24:].any()
    np.testing.assert_allclose(from_blocked(out, 24), expect, rtol=1e-5, atol=1e-5)


def test_refusals():
    with pytest.raises(OpError, match="the CPU's"):
        host.compile_conv2d(GpuTarget("sm_90"), (1, 16, 8, 8), (16, 16, 1, 1), dtype="float32", blocked_out=True)
    with pytest.raises(OpError, match="the CPU's"):
        host.compile_conv2d(CpuTarget(), (1, 16, 8, 8), (16, 16, 1, 1), dtype="int8", shift=3, blocked_out=True)
    with pytest.raises(OpError, match="blocked in and out"):
        host.compile_conv2d(CpuTarget(), (1, 16, 8, 8), (16, 1, 3, 3), groups=16, padding=1, dtype="float32",
                            blocked_in=True)
    with pytest.raises(OpError, match="float32 images"):
        host.compile_pool2d(CpuTarget(), "max", (1, 8, 8, 8), 2, dtype="int8", blocked=True)
    with pytest.raises(OpError, match="the CPU's"):
        host.compile_pool2d(GpuTarget("sm_90"), "max", (1, 16, 8, 8), 2, dtype="float32", blocked=True)


# ---------------------------------------------------------------------------- networks

def _network(rng, channels=32, image=12):
    """A ResNet stem and block, a MobileNetV2 block (depthwise, ReLU6, residual), 24-channel layers
    (a partial block: blocked between a convolution, a pool and a convolution, NCHW where a sigmoid
    reads it), an element-wise tail, a broadcasting multiply, a transpose (NCHW only) and global
    pools (one over a partial block)."""
    c = channels

    def w(o, i, k, scale=0.3):
        return (rng.normal(size=(o, i, k, k)) * scale).astype(np.float32)

    def b(o):
        return rng.normal(size=o).astype(np.float32) * 0.1
    inits = {"w0": w(c, 3, 7, 0.1), "b0": b(c), "w1": w(c, c, 3, 0.1), "b1": b(c), "w2": w(c, c, 3, 0.1), "b2": b(c),
             "we": w(2 * c, c, 1), "be": b(2 * c), "wd": w(2 * c, 1, 3), "bd": b(2 * c), "wp": w(c, 2 * c, 1),
             "bp": b(c), "w24": w(24, c, 1), "b24": b(24), "w24b": w(24, 24, 3, 0.1), "b24b": b(24),
             "w5": w(c, 24, 3, 0.1), "b5": b(c),
             "ws": w(c, c, 3, 0.1), "bs": b(c), "sc": rng.normal(size=(1, c, 1, 1)).astype(np.float32),
             "lo": np.float32(0), "hi": np.float32(6)}
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], strides=[2, 2], pads=[3] * 4),    # plain in, blocked out
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        helper.make_node("Conv", ["p0", "w1", "b1"], ["c1"], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4),
        helper.make_node("Add", ["c2", "p0"], ["a2"]),                                      # fused residual
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "we", "be"], ["ce"]),                               # expand
        helper.make_node("Clip", ["ce", "lo", "hi"], ["ke"]),
        helper.make_node("Conv", ["ke", "wd", "bd"], ["cd"], group=2 * c, pads=[1] * 4),    # depthwise
        helper.make_node("Clip", ["cd", "lo", "hi"], ["kd"]),
        helper.make_node("Conv", ["kd", "wp", "bp"], ["cp"]),                               # project
        helper.make_node("Add", ["cp", "r2"], ["ap"]),
        helper.make_node("Conv", ["ap", "w24", "b24"], ["c24"]),                            # 24 channels
        helper.make_node("Relu", ["c24"], ["r24"]),
        helper.make_node("MaxPool", ["r24"], ["p24"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("GlobalMaxPool", ["p24"], ["g"]),                                 # a partial block's pixel
        helper.make_node("Conv", ["p24", "w24b", "b24b"], ["c24b"], pads=[1] * 4),
        helper.make_node("Sigmoid", ["c24b"], ["g24"]),                                     # NCHW: sigmoid(0) ≠ 0
        helper.make_node("Mul", ["c24b", "g24"], ["s24"]),
        helper.make_node("Conv", ["s24", "w5", "b5"], ["c5"], strides=[2, 2], pads=[1] * 4),
        helper.make_node("Sigmoid", ["c5"], ["g5"]),
        helper.make_node("Mul", ["c5", "g5"], ["s5"]),                                      # SiLU: tied operands
        helper.make_node("AveragePool", ["s5"], ["q5"], kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4),
        helper.make_node("Conv", ["q5", "ws", "bs"], ["cq"], pads=[1] * 4),
        helper.make_node("Mul", ["cq", "sc"], ["m5"]),                                      # broadcast: NCHW
        helper.make_node("Conv", ["m5", "ws", "bs"], ["cs"], pads=[1] * 4),
        helper.make_node("Transpose", ["cs"], ["t"], perm=[0, 1, 3, 2]),                    # NCHW only
        helper.make_node("Conv", ["cs", "ws", "bs"], ["cs2"], pads=[1] * 4),
        helper.make_node("GlobalAveragePool", ["cs2"], ["y"]),
    ]
    return model(nodes, [("x", ["N", 3, 4 * image, 4 * image])], [("y", None), ("t", None), ("g", None)], inits)


@pytest.fixture(scope="module")
def network():
    rng = np.random.default_rng(3)
    m = _network(rng)
    return m, compile_model(m)


def test_which_values_the_plan_blocks(network):
    _, compiled = network
    g = compiled.graph
    plan = blocked.plan(g)
    # Blocked: the convolutions' images of whole blocks (ReLUs, clips and residual adds fused into
    # them), the pools and element-wise operators between them, a convolution's reading NCHW.
    assert {"r0", "p0", "r1", "r2", "ke", "kd", "ap", "r24", "p24", "c5", "g5", "s5", "q5", "cs2"} <= plan, \
        sorted(plan)
    # NCHW: a partial block a sigmoid reads; a value a broadcasting multiply or a transpose reads; the outputs.
    assert not plan & {"x", "c24b", "g24", "s24", "cq", "m5", "cs", "y", "t"}, sorted(plan)
    # The plan is consistent: every tied operand shares its output's layout.
    form = blocked.forms(g)
    for node in g.nodes:
        tied, free, _ = form[node.output] or ((), (), False)
        for i, name in enumerate(node.inputs):
            if name in plan:
                assert i in free or (i in tied and node.output in plan), node.name
        if node.output in plan:
            assert all(node.inputs[i] in plan for i in tied), node.name


def _same(got: dict, expect: dict) -> None:
    assert set(got) == set(expect)
    for name in expect:
        _close(got[name], expect[name])


@pytest.mark.parametrize("batch", [1, 2])
def test_a_network_in_the_blocked_layout_equals_onnx_runtime(network, batch, tmp_path):
    import onnxruntime as ort
    m, compiled = network
    if batch != 1:
        compiled = compile_model(m, batch=batch)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(batch).normal(size=(batch, 3, 48, 48)).astype(np.float32)
    expect = dict(zip(["y", "t", "g"], session.run(["y", "t", "g"], {"x": x})))
    for _ in range(2):                                    # traced, then replayed
        _same(compiled.run(x, "cpu"), expect)
    methods = {compiled._host_kernel(n, "cpu").op.plan.get("method") for n in compiled.graph.nodes
               if n.op == "conv2d"}
    assert {"blocked", "depthwise-blocked"} <= methods
    compiled.compile_host_kernels()                       # kernels in the file, loaded without compiling
    compiled.save(tmp_path / "m.gfm")
    _same(Model.load(tmp_path / "m.gfm").run(x, "cpu"), expect)


def test_the_blocked_run_equals_the_nchw_run_and_the_cpu_beside_keeps_nchw(network, monkeypatch):
    m, compiled = network
    x = np.random.default_rng(9).normal(size=(1, 3, 48, 48)).astype(np.float32)
    got = compiled.run(x, "cpu")
    monkeypatch.setattr(runtime_model, "BLOCKED_LAYOUTS", False)
    plain = compile_model(m)
    assert plain._blocked() == frozenset()
    _same(got, plain.run(x, "cpu"))
    conv = next(n for n in compiled.graph.nodes if n.op == "conv2d" and n.attrs["groups"] > 1)
    assert compiled._host_kernel(conv, "cpu", beside=True).op.plan["method"] == "depthwise"
