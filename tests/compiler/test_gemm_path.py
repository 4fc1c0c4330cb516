"""`gemm` (dense without epilogue) against numpy for random shapes on every preset and on
a config whose buffers force many blocks in every dimension."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gemforge.compiler import OpError, compile_dense, run_dense
from gemforge.driver.runtime.device import open_device
from gemforge.hw.config import PRESETS, AccelConfig

SMALL_BUFFERS = AccelConfig(
    name="small-buffers", batch=2, block_in=4, block_out=8, inp_buffer_bytes=64, wgt_buffer_bytes=256,
    acc_buffer_bytes=512, out_buffer_bytes=128, uop_buffer_bytes=16)


@pytest.mark.parametrize("config", [*PRESETS.values(), SMALL_BUFFERS], ids=lambda c: c.name)
@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 90), n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1),
       latency_hiding=st.booleans())
def test_gemm_equals_numpy(config, m, k, n, seed, latency_hiding):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    device = open_device("fsim", config, dram_bytes=1 << 22)
    c, result = run_dense(device, a, b, latency_hiding=latency_hiding)
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))
    tiles = -(-m // config.batch) * -(-k // config.block_in) * -(-n // config.block_out)
    assert result.counters["macs"] == tiles * config.macs_per_uop


def test_extreme_values():
    """All -128 operands over a long K: the largest int32 magnitudes a GEMM produces."""
    a = np.full((3, 4096), -128, np.int8)
    b = np.full((4096, 5), -128, np.int8)
    c, _ = run_dense(open_device("fsim", "default"), a, b)
    assert (c == 4096 * 128 * 128).all()


def test_bad_shapes_are_refused():
    with pytest.raises(OpError, match="dimension M must be a positive integer"):
        compile_dense(PRESETS["tiny"], 0, 4, 4)
    with pytest.raises(OpError, match=r"dense needs A \(M, K\) and B \(K, N\)"):
        run_dense(open_device("fsim", "tiny"), np.zeros((2, 3), np.int8), np.zeros((4, 2), np.int8))
