"""The compute pipeline's micro-op loop (S0) against fsim's loop indices, in Amaranth's simulator."""

import dataclasses

import numpy as np
import pytest

from gemforge.hw.config import PRESETS
from gemforge.hw.gateware.testbench import simulate
from gemforge.hw.gateware.uop_loop import UopLoop
from gemforge.hw.isa import Gemm
from gemforge.sim.fsim import Fsim

CONFIG = PRESETS["tiny"]


def run_loop(insn: Gemm, half_rate: bool = False) -> list[tuple[int, int, int, int]]:
    """(micro-op, dst, src, wgt offsets) of every cycle the loop issues, started once.

    Checks on the way that ``uop_next`` announces every issuing micro-op the cycle before
    (the pipeline reads the micro-op buffer at it), and the issue rate."""
    dut = UopLoop(CONFIG.uop_index_bits)
    issued = []
    issue_cycles = []

    async def tb(ctx):
        for name in ("uop_bgn", "uop_end", "iter_out", "iter_in"):
            ctx.set(getattr(dut, name), getattr(insn, name))
        for kind in dut.kinds:
            ctx.set(getattr(dut, f"{kind}_factor_out"), getattr(insn, f"{kind}_factor_out"))
            ctx.set(getattr(dut, f"{kind}_factor_in"), getattr(insn, f"{kind}_factor_in"))
        ctx.set(dut.half_rate, half_rate)
        ctx.set(dut.start, 1)
        announced = ctx.get(dut.uop_next)
        await ctx.tick()
        ctx.set(dut.start, 0)
        limit = (2 if half_rate else 1) * insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn) + 5
        for cycle in range(limit):
            if ctx.get(dut.running):
                assert ctx.get(dut.uop) == announced, f"cycle {cycle}: uop_next did not announce the micro-op"
                issued.append((ctx.get(dut.uop), ctx.get(dut.dst_offset), ctx.get(dut.src_offset),
                               ctx.get(dut.wgt_offset)))
                issue_cycles.append(cycle)
            announced = ctx.get(dut.uop_next)
            await ctx.tick()
        assert not ctx.get(dut.running)

    simulate(dut, tb)
    interval = 2 if half_rate else 1
    assert issue_cycles == list(range(0, interval * len(issued), interval))
    return issued


@pytest.mark.parametrize("half_rate", [False, True], ids=["full_rate", "half_rate"])
@pytest.mark.parametrize("seed", range(6))
def test_loop_issues_fsims_micro_ops_in_order_one_per_cycle(seed, half_rate):
    rng = np.random.default_rng(seed)
    bgn = int(rng.integers(0, CONFIG.uop_depth - 1))
    end = int(rng.integers(bgn + 1, min(CONFIG.uop_depth, bgn + 4) + 1))
    factors = {f"{k}_factor_{s}": int(rng.integers(0, 1 << 3)) for k in ("dst", "src", "wgt") for s in ("out", "in")}
    insn = Gemm(uop_bgn=bgn, uop_end=end, iter_out=int(rng.integers(1, 4)), iter_in=int(rng.integers(1, 4)),
                **factors)
    issued = run_loop(insn, half_rate)

    # fsim's indices are each micro-op's fields plus the loop offsets: with every micro-op
    # (0, 0, 0) they are the offsets; with micro-op k = (k, 0, 0) and no dst factors, the
    # dst index names the micro-op.
    fsim = Fsim(CONFIG, np.zeros(4096, np.uint8))
    dst, src, wgt = fsim._loop_indices(insn, 0)
    fsim.uop[:, 0] = np.arange(CONFIG.uop_depth)
    which, _, _ = fsim._loop_indices(dataclasses.replace(insn, dst_factor_out=0, dst_factor_in=0), 0)
    expected = [tuple(int(x) for x in row) for row in zip(which, dst, src, wgt)]
    assert issued == expected
