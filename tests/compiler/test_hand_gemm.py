"""The hand-built GEMM path against numpy, for random shapes on every preset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gemforge.compiler.hand_gemm import GemmShapeError, build_gemm_program, plan_gemm, run_gemm
from gemforge.driver.device import open_device
from gemforge.hw.config import PRESETS, AccelConfig

SMALL_BUFFERS = AccelConfig(  # forces many blocks in every dimension
    name="small-buffers", batch=2, block_in=4, block_out=8, inp_buffer_bytes=64, wgt_buffer_bytes=256,
    acc_buffer_bytes=512, out_buffer_bytes=128, uop_buffer_bytes=16)


def reference(a, b):
    return a.astype(np.int32) @ b.astype(np.int32)


@pytest.mark.parametrize("config", [*PRESETS.values(), SMALL_BUFFERS], ids=lambda c: c.name)
@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 90), n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_gemm_equals_numpy(config, m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    device = open_device("fsim", config, dram_bytes=1 << 22)
    c, result = run_gemm(device, a, b)
    np.testing.assert_array_equal(c, reference(a, b))
    plan = plan_gemm(config, m, k, n)
    assert result.counters["macs"] == plan.m_tiles * plan.k_tiles * plan.n_tiles * config.macs_per_uop


def test_extreme_values_wrap_free():
    """All -128 operands over a long K: the largest int32 magnitudes the path produces."""
    config = PRESETS["default"]
    a = np.full((3, 4096), -128, np.int8)
    b = np.full((4096, 5), -128, np.int8)
    c, _ = run_gemm(open_device("fsim", config), a, b)
    assert (c == 4096 * 128 * 128).all()


def test_blocks_fit_the_buffers():
    config = SMALL_BUFFERS
    plan = plan_gemm(config, 100, 100, 100)
    assert plan.block_m * plan.block_k <= config.inp_depth
    assert plan.block_n * plan.block_k <= config.wgt_depth
    assert plan.block_m * plan.block_n <= config.acc_depth
    assert plan.block_k <= config.uop_depth
    program = build_gemm_program(config, 100, 100, 100)
    assert sum(1 for i in program.instructions if type(i).__name__ == "Store") > 1


def test_bad_shapes_are_refused():
    with pytest.raises(GemmShapeError, match="must be at least 1"):
        plan_gemm(PRESETS["tiny"], 0, 4, 4)
    with pytest.raises(GemmShapeError, match="K and N must be at most"):
        plan_gemm(PRESETS["tiny"], 1, 4 * 70000, 4)
    with pytest.raises(GemmShapeError, match=r"A must be \(M, K\)"):
        run_gemm(open_device("fsim", "tiny"), np.zeros((2, 3), np.int8), np.zeros((4, 2), np.int8))
