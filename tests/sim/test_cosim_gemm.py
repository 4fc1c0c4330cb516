"""The compiled GEMM (dense without epilogue) on the Verilator backend equals numpy (what `run-op gemm --device
verilator` runs), and reports the hardware counters."""

import numpy as np
import pytest

from gemforge.compiler.ops.dense import run_dense
from gemforge.driver.device import available_backends, open_device
from gemforge.hw.config import PRESETS
from gemforge.sim.cosim import harness


def test_rtl_backends_are_registered():
    assert {"verilator", "icarus"} <= set(available_backends())


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
@pytest.mark.parametrize("name,shape", [("tiny", (5, 9, 7)), ("default", (20, 40, 24)), ("tiny", (16, 48, 32))])
def test_gemm_on_verilator_equals_numpy(name, shape):
    m, k, n = shape
    rng = np.random.default_rng(m * k * n)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    device = open_device("verilator", PRESETS[name], dram_bytes=1 << 22)
    c, result = run_dense(device, a, b)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))
    assert result.cycles and result.hw_counters["gemm_active"] == result.counters["gemm_uops"] > 0
    assert result.hw_counters["dma_bytes_written"] > 0
