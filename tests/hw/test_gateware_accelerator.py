"""The whole accelerator in Amaranth's simulator on small programs, against fsim.

Focus: sequential semantics of the GEMM/ALU pipeline (read-after-write on the
accumulator between back-to-back micro-ops, which the pipeline forwards).
"""

import numpy as np
import pytest

from gemforge.hw.gateware.testbench import run_accelerator

from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Alu, AluOp, Finish, Gemm, Load, MemType, Store, Uop, encode_program, encode_uops
from gemforge.sim.fsim import Fsim

CONFIG = PRESETS["tiny"]


def run_both(insns, uops, seed=0, stall=0.0, read_at_irq=None):
    c = CONFIG
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, 1 << 15, dtype=np.uint8)
    ub = encode_uops(uops, c)
    dram[8192:8192 + len(ub)] = np.frombuffer(ub, np.uint8)
    prog = encode_program(insns, c)
    dram[4096:4096 + len(prog)] = np.frombuffer(prog, np.uint8)
    expected = dram.copy()
    Fsim(c, expected).run(4096, len(insns))
    got = bytearray(dram.tobytes())
    counters = run_accelerator(c, got, 4096, len(insns), stall=stall, read_at_irq=read_at_irq)
    return expected, np.frombuffer(bytes(got), np.uint8), counters


def test_gemm_and_alu_chains_on_one_accumulator():
    c = CONFIG
    acc_entry, inp_entry, wgt_entry = c.acc_entry_bytes, c.inp_entry_bytes, c.wgt_entry_bytes
    # Every micro-op accumulates into acc[0] (and acc[1]): each depends on the one before.
    uops = [Uop(dst=0, src=i, wgt=i) for i in range(4)] + [Uop(dst=1, src=0, wgt=0), Uop(dst=0, src=1, wgt=0)]
    insns = [
        Load(mem=MemType.UOP, sram_base=0, dram_base=8192 // c.uop_entry_bytes, y_size=1, x_size=6, x_stride=6),
        Load(mem=MemType.INP, sram_base=0, dram_base=12288 // inp_entry, y_size=1, x_size=8, x_stride=8),
        Load(mem=MemType.WGT, sram_base=0, dram_base=16384 // wgt_entry, y_size=1, x_size=8, x_stride=8,
             push_next=True),
        Load(mem=MemType.ACC, sram_base=0, dram_base=20480 // acc_entry, y_size=1, x_size=2, x_stride=2,
             pop_prev=True),
        Gemm(uop_bgn=0, uop_end=4, iter_out=2, iter_in=3),               # 24 dependent uops
        Gemm(reset=True, uop_bgn=4, uop_end=5, iter_out=1, iter_in=1),   # acc[1] = 0
        Alu(op=AluOp.ADD, uop_bgn=5, uop_end=6, iter_out=1, iter_in=3),  # acc[0] += acc[1], three times
        Alu(op=AluOp.MUL, uop_bgn=4, uop_end=6, iter_out=2, iter_in=1),  # acc[1] *= acc[0]; acc[0] *= acc[1] ...
        Alu(op=AluOp.SHR, imm=-3, uop_bgn=5, uop_end=6, iter_out=1, iter_in=2),
        Alu(op=AluOp.MAX, imm=-5, uop_bgn=4, uop_end=5, iter_out=1, iter_in=1, push_next=True),
        Store(mem=MemType.ACC, sram_base=0, dram_base=24576 // acc_entry, y_size=1, x_size=2, x_stride=2,
              pop_prev=True, push_prev=True),
        Store(mem=MemType.OUT, sram_base=0, dram_base=28672 // c.out_entry_bytes, y_size=1, x_size=2, x_stride=2),
        Finish(pop_next=True),
    ]
    expected, got, counters = run_both(insns, uops)
    np.testing.assert_array_equal(got, expected)
    assert counters["gemm_active"] == 25 and counters["gemm_reset"] == 1
    assert counters["alu_active"] == 3 + 4 + 2 + 1


def padded_gemm_program():
    c = CONFIG
    uops = [Uop(dst=i % 3, src=i, wgt=7 - i) for i in range(8)]
    insns = [
        Load(mem=MemType.UOP, sram_base=0, dram_base=8192 // c.uop_entry_bytes, y_size=1, x_size=8, x_stride=8),
        Load(mem=MemType.INP, sram_base=0, dram_base=12288 // c.inp_entry_bytes, y_size=2, x_size=5, x_stride=9,
             y_pad0=1, x_pad1=2),
        Load(mem=MemType.WGT, sram_base=0, dram_base=16384 // c.wgt_entry_bytes, y_size=3, x_size=3, x_stride=3,
             x_pad0=1, push_next=True),
        Gemm(reset=True, uop_bgn=0, uop_end=3, iter_out=1, iter_in=1, pop_prev=True),
        Gemm(uop_bgn=0, uop_end=8, iter_out=2, iter_in=2, dst_factor_in=1, src_factor_out=2, wgt_factor_in=1,
             push_next=True),
        Store(mem=MemType.OUT, sram_base=0, dram_base=28672 // c.out_entry_bytes, y_size=2, x_size=2, x_stride=3,
              pop_prev=True, push_prev=True),
        Finish(pop_next=True),
    ]
    return insns, uops


def test_random_backpressure_keeps_results():
    expected, got, _ = run_both(*padded_gemm_program(), seed=3, stall=0.35)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["insns_retired", "fetch_busy", "load_busy", "compute_busy", "store_busy",
                                  "load_mem_stall", "compute_mem_stall", "store_mem_stall", "dma_bytes_read",
                                  "dma_bytes_written", "cycles"])
def test_counters_are_complete_when_the_irq_rises(name):
    """The engine counters add a registered event a cycle late (top.py): read in the cycle
    the IRQ rises, the earliest a host can, a counter already holds its final value (the
    check fails when `cycles`, busy in the program's last cycle, is registered too)."""
    insns, uops = padded_gemm_program()
    expected, got, counters = run_both(insns, uops, read_at_irq=name)
    np.testing.assert_array_equal(got, expected)
    assert counters["at_irq"] == counters[name] & 0xFFFF_FFFF
    assert counters["insns_retired"] == len(insns)
