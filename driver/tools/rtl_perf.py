"""RTL performance measurements on the co-simulation (the issue's performance targets).

``python -m gemforge.driver.tools.rtl_perf [CONFIG] [SIMULATOR]`` prints one JSON object:

* ``gemm_uops_per_cycle``: extra cycles for 102,400 more GEMM micro-ops in one
  instruction (two runs differing only in ``iter_out``), so fixed costs cancel;
* ``alu_imm_uops_per_cycle`` / ``alu_reg_uops_per_cycle``: the same for ALU ADD with an
  immediate and with a register (accumulator) operand, and ``alu_mul_uops_per_cycle`` for
  ALU MUL (register operand), which issues at half rate (`gemforge.hw.timing.issues_at_half_rate`);
* ``gemm_fixed_cycles``: cycles of a whole run (fetch, micro-op load, GEMM, FINISH)
  beyond one per micro-op;
* ``gemm_insn_fixed_cycles``: cycles each GEMM instruction of a program costs beyond
  its micro-ops (dispatch and pipeline drain), from runs of 1 and 101 instructions
  of 16 micro-ops;
* ``load_insn_fixed_cycles`` / ``store_insn_fixed_cycles``: cycles each short LOAD
  (input buffer) / STORE (output buffer) of a back-to-back stream costs beyond its data
  beats, from runs of 1 and 101 instructions of 1 row × 8 entries (`dma_insn_fixed_cycles`);
* ``load_bus_efficiency`` / ``store_bus_efficiency``: bytes per cycle of long
  weight loads and accumulator stores, as a fraction of the bus width (again from
  the difference of two sizes);
* ``uop_load_bus_efficiency``: the same for long micro-op loads, and, where input or
  output entries are narrower than a bus beat, ``inp_load_bus_efficiency`` and
  ``out_store_bus_efficiency`` (several entries share a beat; rows of about 16 beats,
  as many as the buffer holds);
* ``sim_cycles_per_s``: simulated cycles per wall-clock second of a ~1M-cycle
  GEMM-bound run (the simulator's own time, without process start).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from gemforge.hw.config import AccelConfig, load_config
from gemforge.hw.isa import Alu, AluOp, Finish, Gemm, Instruction, Load, MemType, Store, Uop, encode_program, encode_uops

from ..runtime.device import open_device

__all__ = ["measure"]


def _run(config: AccelConfig, simulator: str, make_insns, uops: list[Uop]):
    dev = open_device(simulator, config, dram_bytes=1 << 22)
    data = dev.alloc(1 << 20, align=4096)
    raw = encode_uops(uops, config)
    dev.dram[data.address:data.address + len(raw)] = np.frombuffer(raw, np.uint8)
    insns: list[Instruction] = make_insns(data.address)
    stream = encode_program(insns, config)
    code = dev.alloc(max(4096, len(stream)), align=4096)
    dev.dram[code.address:code.address + len(stream)] = np.frombuffer(stream, np.uint8)
    start = time.perf_counter()
    result = dev._execute(code.address, len(insns))
    return result, time.perf_counter() - start


def _extra_cycles(config: AccelConfig, simulator: str, program, small: int, large: int, uops: list[Uop]) -> int:
    """Cycles ``program(large)`` takes beyond ``program(small)``: fixed costs cancel."""
    return (_run(config, simulator, program(large), uops)[0].cycles
            - _run(config, simulator, program(small), uops)[0].cycles)


def _uop_load(config: AccelConfig, base: int, count: int = 16) -> Load:
    """The LOAD of the measurement micro-ops (at the start of the data area)."""
    return Load(mem=MemType.UOP, sram_base=0, dram_base=base // config.uop_entry_bytes, y_size=1, x_size=count,
                x_stride=count)


def _narrow_row(config: AccelConfig, buffer: str) -> int:
    """Entries per row of a narrow-entry DMA measurement: about 16 beats, within the buffer."""
    return min(config.depth(buffer), max(8, 16 * config.bus_bytes // config.entry_bytes(buffer)))


def dma_insn_fixed_cycles(config: AccelConfig, simulator: str = "verilator") -> dict:
    """Cycles per short DMA instruction beyond its data beats, in a stream of such instructions.

    Runs 1 and 101 LOADs (input buffer) or STOREs (output buffer) of 1 row × 8 entries, all
    to the same SRAM and DRAM place, and divides the difference by 100.
    """
    c = config
    x = 8

    def dma(kind, count):
        op, mem, buffer = (Load, MemType.INP, "inp") if kind == "load" else (Store, MemType.OUT, "out")
        return lambda base: [*(op(mem=mem, sram_base=0, dram_base=base // c.entry_bytes(buffer), y_size=1,
                                  x_size=x, x_stride=x) for _ in range(count)), Finish()]

    out = {}
    for kind, buffer in (("load", "inp"), ("store", "out")):
        beats = max(1, -(-x * c.entry_bytes(buffer) // c.bus_bytes))
        out[f"{kind}_insn_fixed_cycles"] = _extra_cycles(c, simulator, lambda n: dma(kind, n), 1, 101, []) / 100 \
            - beats
    return out


def measure(config: AccelConfig, simulator: str = "verilator") -> dict:
    """Run the measurement programs on ``config`` and return the figures."""
    c = config
    uops = [Uop(dst=i % 8, src=i % 16, wgt=i % 16) for i in range(16)]

    def gemm(iter_out):
        return lambda base: [
            _uop_load(c, base), Gemm(uop_bgn=0, uop_end=16, iter_out=iter_out, iter_in=64, dst_factor_in=1),
            Finish()]

    def alu(iter_out, imm, op=AluOp.ADD):
        return lambda base: [
            _uop_load(c, base),
            Alu(op=op, imm=imm, uop_bgn=0, uop_end=16, iter_out=iter_out, iter_in=64,
                dst_factor_in=1, src_factor_in=1), Finish()]

    def load(rows):
        return lambda base: [Load(mem=MemType.WGT, sram_base=0, dram_base=base // c.wgt_entry_bytes,
                                  y_size=rows, x_size=8, x_stride=8), Finish()]

    def store(rows):
        return lambda base: [Store(mem=MemType.ACC, sram_base=0, dram_base=base // c.acc_entry_bytes,
                                   y_size=rows, x_size=8, x_stride=8), Finish()]

    def narrow(buffer, rows):
        """A LOAD (uop, inp) or STORE (out) of ``rows`` rows of `_narrow_row` entries."""
        x = _narrow_row(c, buffer)
        mem = {"uop": MemType.UOP, "inp": MemType.INP, "out": MemType.OUT}[buffer]
        op = Store if buffer == "out" else Load
        return lambda base: [op(mem=mem, sram_base=0, dram_base=base // c.entry_bytes(buffer), y_size=rows,
                                x_size=x, x_stride=x), Finish()]

    def gemm_insns(count):
        return lambda base: [
            _uop_load(c, base),
            *(Gemm(uop_bgn=0, uop_end=16, iter_out=1, iter_in=1) for _ in range(count)), Finish()]

    narrow_rates = {}
    for buffer, kind in (("uop", "load"), ("inp", "load"), ("out", "store")):
        if buffer != "uop" and c.entry_bytes(buffer) >= c.bus_bytes:
            continue    # entries of a beat or more: the wgt/acc figures above cover them
        x = _narrow_row(c, buffer)
        rows = min(33, c.depth(buffer) // x)
        if rows < 2:
            continue
        extra = _extra_cycles(c, simulator, lambda rows, buffer=buffer: narrow(buffer, rows), 1, rows, uops)
        narrow_rates[f"{buffer}_{kind}_bus_efficiency"] = \
            (rows - 1) * x * c.entry_bytes(buffer) / extra / c.bus_bytes

    # Long loads and stores of 8-entry rows: up to 33 rows, within the buffer (the hardware
    # refuses a tile beyond it: BUFFER_RANGE).
    wgt_rows, acc_rows = min(33, c.wgt_depth // 8), min(33, c.acc_depth // 8)
    g1, _ = _run(c, simulator, gemm(1), uops)
    g2, _ = _run(c, simulator, gemm(101), uops)
    alu_rate = {kind: 100 * 64 * 16 / _extra_cycles(c, simulator, lambda n, imm=imm, op=op: alu(n, imm, op),
                                                    1, 101, uops)
                for kind, imm, op in (("imm", 5, AluOp.ADD), ("reg", None, AluOp.ADD), ("mul", None, AluOp.MUL))}
    big, wall = _run(c, simulator, gemm(1000), uops)
    extra_uops = 100 * 64 * 16
    return {
        "config": c.name, "simulator": simulator,
        "gemm_uops_per_cycle": extra_uops / (g2.cycles - g1.cycles),
        "gemm_fixed_cycles": g2.cycles - 101 * 64 * 16,
        "gemm_insn_fixed_cycles": _extra_cycles(c, simulator, gemm_insns, 1, 101, uops) / 100 - 16,
        "alu_imm_uops_per_cycle": alu_rate["imm"],
        "alu_reg_uops_per_cycle": alu_rate["reg"],
        "alu_mul_uops_per_cycle": alu_rate["mul"],
        **dma_insn_fixed_cycles(c, simulator),
        "load_bus_efficiency": (wgt_rows - 1) * 8 * c.wgt_entry_bytes
        / _extra_cycles(c, simulator, load, 1, wgt_rows, uops) / c.bus_bytes,
        "store_bus_efficiency": (acc_rows - 1) * 8 * c.acc_entry_bytes
        / _extra_cycles(c, simulator, store, 1, acc_rows, uops) / c.bus_bytes,
        **narrow_rates,
        "long_run_cycles": big.cycles,
        "sim_cycles_per_s": big.cycles / big.hw_counters["sim_wall_s"],
        "long_run_wall_s_with_process_start": wall,
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    config = load_config(argv[0] if argv else "default")
    print(json.dumps(measure(config, argv[1] if len(argv) > 1 else "verilator"), indent=2))


if __name__ == "__main__":
    main()
