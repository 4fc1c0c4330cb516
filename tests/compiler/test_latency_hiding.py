"""Latency hiding really overlaps: double buffering, token structure and an idealized timeline.

fsim checks that the tokens are correct (results equal numpy, no deadlock); these
tests check that with two virtual threads the tokens *allow* overlap: loads of
tile i+1 may run while tile i computes, and the program finishes sooner on an
idealized three-engine timeline than the single-thread schedule.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import device_for, int8
from gemforge.compiler.ops import compile_conv2d, compile_dense, conv2d_reference, dense_reference
from gemforge.compiler.ops.common import Epilogue
from gemforge.compiler.ops.accel.conv2d import conv2d_schedule, conv2d_te
from gemforge.compiler.ops.accel.dense import dense_schedule, dense_te
from gemforge.compiler.pipeline import build
from gemforge.compiler.backends.accel.fusion import alu_epilogue
from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Engine, Gemm, Load, MemType, Store
from latency_timeline import simulate

def _dense(config, m, k, n, plan, threads):
    # The ALU epilogue keeps this fixed tiling's compute long enough to hide most loads
    # under (the requantizing store takes three micro-ops per entry off it).
    t = dense_te(config, m, k, n, Epilogue(True, 4, False))
    with alu_epilogue():
        return build(dense_schedule(config, t, dict(plan, threads=threads)), config,
                 [t["a"], t["w"], t["bias"], t["out"]])


def _conv(config, data, kernel, plan, threads):
    t = conv2d_te(config, data, kernel, 1, 1, Epilogue())
    return build(conv2d_schedule(config, t, dict(plan, threads=threads)), config, [t["x"], t["w"], t["out"]])


# The same tiling with one and with two virtual threads.
CASES = {
    "dense-tiny": lambda th: _dense(PRESETS["tiny"], 16, 16, 16, dict(tm=4, tn=4, tk=4), th),
    "dense-default": lambda th: _dense(PRESETS["default"], 64, 32, 32, dict(tm=16, tn=8, tk=8), th),
    "conv-default": lambda th: _conv(PRESETS["default"], (1, 4, 28, 28), (4, 4, 3, 3),
                                     dict(toc=2, toh=7, tow=28, tic=2, tkh=3), th),
}


@pytest.mark.parametrize("name", list(CASES))
def test_two_threads_finish_sooner_on_the_timeline(name):
    with_lh, without = CASES[name](2), CASES[name](1)
    fast, slow = simulate(with_lh.instructions, with_lh.config), simulate(without.instructions, without.config)
    assert fast.makespan < 0.9 * slow.makespan
    # Most load time is hidden under GEMMs with two threads, little with one.
    def hidden(t):
        return t.overlap(Engine.LOAD, Engine.COMPUTE) / sum(e - s for s, e in t.busy(Engine.LOAD))
    assert hidden(fast) > 0.5
    assert hidden(fast) > 2 * hidden(slow)


def test_default_schedules_finish_sooner_with_latency_hiding():
    for lh_op, op in [(compile_dense(PRESETS["default"], 256, 512, 256, latency_hiding=True),
                       compile_dense(PRESETS["default"], 256, 512, 256, latency_hiding=False)),
                      (compile_conv2d(PRESETS["default"], (1, 64, 28, 28), (64, 64, 3, 3), padding=1),
                       compile_conv2d(PRESETS["default"], (1, 64, 28, 28), (64, 64, 3, 3), padding=1,
                                      latency_hiding=False))]:
        fast = simulate(lh_op.program.instructions, lh_op.program.config)
        slow = simulate(op.program.instructions, op.program.config)
        assert fast.makespan < 0.95 * slow.makespan


def _inp_range(program, gemm):
    uops = program.uops[gemm.uop_bgn:gemm.uop_end]
    lo = min(u.src for u in uops)
    hi = max(u.src for u in uops) + (gemm.iter_out - 1) * gemm.src_factor_out + (gemm.iter_in - 1) * gemm.src_factor_in
    return lo, hi


def test_loads_of_the_next_tile_are_released_a_gemm_early():
    """Token structure: an input load waits (pops a compute→load token) for the GEMM
    that last read its on-chip range. With two threads, the other thread's GEMM
    sits between that GEMM and the one consuming the load, so the DMA overlaps
    it; with one thread the consumer follows the releasing GEMM directly."""
    for threads in (2, 1):
        program = CASES["dense-tiny"](threads)
        insns = program.instructions
        pushes = [i for i, x in enumerate(insns) if isinstance(x, Gemm) and x.push_prev]
        pops = [i for i, x in enumerate(insns) if isinstance(x, Load) and x.pop_next]
        assert len(pushes) == len(pops) > 0
        between = []
        for push, pop in zip(pushes, pops):  # tokens pair up in FIFO order
            load = insns[pop]
            if load.mem != MemType.INP:
                continue
            span = (load.sram_base, load.sram_base + load.y_size * load.x_size - 1)
            consumer = next(i for i in range(pop + 1, len(insns)) if isinstance(insns[i], Gemm)
                            and not insns[i].reset and _inp_range(program, insns[i])[0] <= span[1]
                            and span[0] <= _inp_range(program, insns[i])[1])
            between.append(sum(1 for x in insns[push + 1:consumer] if isinstance(x, Gemm) and not x.reset))
        assert between
        if threads == 2:
            assert min(between) >= 1
        else:
            assert max(between) == 0


def test_double_buffering_uses_disjoint_halves():
    program = compile_dense(PRESETS["tiny"], 64, 64, 64, latency_hiding=True).program
    bases = {x.sram_base for x in program.instructions if isinstance(x, Load) and x.mem == MemType.INP}
    assert len(bases) == 2
    single = compile_dense(PRESETS["tiny"], 64, 64, 64, latency_hiding=False).program
    assert {x.sram_base for x in single.instructions if isinstance(x, Load) and x.mem == MemType.INP} == {0}


def test_latency_hidden_programs_are_correct_with_tiny_token_queues():
    from compiler_helpers import CRAMPED
    rng = np.random.default_rng(4)
    a, b = int8(rng, (20, 24)), int8(rng, (24, 12))
    out, _ = compile_dense(CRAMPED, 20, 24, 12, latency_hiding=True).run(device_for(CRAMPED), a=a, b=b)
    np.testing.assert_array_equal(out, dense_reference(a, b))
    x, w = int8(rng, (1, 8, 10, 10)), int8(rng, (8, 8, 3, 3))
    out, _ = compile_conv2d(CRAMPED, x.shape, w.shape, padding=1).run(device_for(CRAMPED), x=x, w=w)
    np.testing.assert_array_equal(out, conv2d_reference(x, w, None, 1, 1))


def test_stores_overlap_compute():
    program = compile_dense(PRESETS["tiny"], 64, 64, 64, latency_hiding=True).program
    t = simulate(program.instructions, program.config)
    assert t.overlap(Engine.STORE, Engine.COMPUTE) > 0
    assert any(isinstance(x, Store) for x in program.instructions)
