"""Faults end in an error code, never a hang, and the hardware reports the fault fsim raises.

Every fault class of `gemforge.hw.regmap.Fault` is provoked by a small program
that fsim refuses (accesses at and past the top of the 32-bit address space among them); the same programs then run back to back on the RTL with no
reset in between (as a host would run them), each must end with ERROR and the
same code, and a valid program run after all of them must produce the right
DRAM contents. ABORT of a running, bus-heavy program is part of the sequence.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.hw.config import PRESETS
from gemforge.hw.isa import (Alu, AluOp, Finish, Gemm, Load, MemType, Opcode, Store, encode, encode_program, fields_of,
                             insn_bits, insn_bytes)
from gemforge.hw.regmap import ERROR_INFO_WRITE, Fault
from gemforge.sim.cosim import harness
from gemforge.sim.fsim import Fsim, FsimError

needs_verilator = pytest.mark.skipif(not harness.simulator_available("verilator"), reason="needs verilator")

WINDOW = 64 * 1024          # the DRAM window fsim sees, from byte 0
BEYOND = 32 << 20           # beyond both fsim's window and the simulated DRAM (16 MiB): a bus error
SLOT = 256                  # bytes of instruction space per case
DATA = 0x8000               # data region of the valid program
TOP = 1 << 32               # the first byte past the accelerator's address space


def patch(word: int, config, opcode: Opcode, field: str, value: int) -> int:
    """``word`` with one field of the ``opcode`` layout replaced (to make words the encoder refuses)."""
    pos = 0
    for f in fields_of(config, opcode):
        if f.name == field:
            mask = ((1 << f.width) - 1) << pos
            return (word & ~mask) | ((value << pos) & mask)
        pos += f.width
    raise KeyError(field)


def field_hi(config, opcode, name):
    return next(f.hi for f in fields_of(config, opcode) if f.name == name)


def fault_cases(config):
    """(name, program as instructions or raw words, how to place it (None: normally; ("misaligned",),
    ("beyond",) or ("at", address[, instruction count]) to start it elsewhere), fault, ERROR_INFO)."""
    c = config
    load_inp = dict(mem=MemType.INP, sram_base=0, dram_base=DATA // c.entry_bytes("inp"), y_size=1, x_size=1,
                    x_stride=1)
    store_ok = encode(Store(mem=MemType.OUT, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1), c)
    factor = field_hi(c, Opcode.GEMM, "dst_factor_out")
    iters = -(-c.acc_depth // max(1, factor)) + 1
    finish = encode(Finish(), c)
    top = {b: TOP // c.entry_bytes(b) for b in ("inp", "out", "uop")}      # entries below the top
    store_out = dict(mem=MemType.OUT, sram_base=0, y_size=1, x_size=2, x_stride=2)
    return [
        ("empty program", [], None, Fault.EMPTY_PROGRAM, 0),
        ("misaligned program", [finish], ("misaligned",), Fault.MISALIGNED_PROGRAM, 0),
        ("unknown opcode", [(1 << 3) - 1, finish], None, Fault.INVALID_INSTRUCTION, 0),
        ("bits above the fields", [encode(Finish(), c) | 1 << (insn_bits(c) - 1), finish], None,
         Fault.INVALID_INSTRUCTION, 0),
        ("store from the input buffer", [patch(store_ok, c, Opcode.STORE, "mem", MemType.INP), finish], None,
         Fault.INVALID_INSTRUCTION, 0),
        ("alu op 7", [patch(encode(Alu(op=AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, imm=1), c),
                            c, Opcode.ALU, "op", 7), finish], None, Fault.INVALID_INSTRUCTION, 0),
        ("zero-size load", [Load(**{**load_inp, "y_size": 0}), Finish()], None, Fault.INVALID_INSTRUCTION, 0),
        ("zero loop count", [Gemm(uop_bgn=0, uop_end=1, iter_out=0, iter_in=1), Finish()], None,
         Fault.INVALID_INSTRUCTION, 0),
        ("load past the input buffer",
         [Load(**load_inp), Load(**{**load_inp, "sram_base": c.inp_depth - 1, "x_size": 2}), Finish()],
         None, Fault.BUFFER_RANGE, 1),     # ERROR_INFO: the index of the faulting instruction
        ("padding past the input buffer", [Load(**{**load_inp, "sram_base": c.inp_depth - 1, "x_pad1": 1}),
                                           Finish()], None, Fault.BUFFER_RANGE, 0),
        ("store past the output buffer",
         [Store(mem=MemType.OUT, sram_base=c.out_depth - 1, dram_base=DATA // c.entry_bytes("out"), y_size=2,
                x_size=1, x_stride=1), Finish()], None, Fault.BUFFER_RANGE, 0),
        ("requantizing store of the output buffer",
         [patch(encode(Store(mem=MemType.ACC, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1,
                             requant=True), c), c, Opcode.STORE, "mem", MemType.OUT), finish], None,
         Fault.INVALID_INSTRUCTION, 0),
        ("shift without requant", [patch(store_ok, c, Opcode.STORE, "shift", 3), finish], None,
         Fault.INVALID_INSTRUCTION, 0),
        ("store bias rows past the accumulator",
         [Store(mem=MemType.ACC, sram_base=0, dram_base=DATA // c.entry_bytes("out"), y_size=2, x_size=1,
                x_stride=1, requant=True, bias=True, bias_per_row=True, bias_base=c.acc_depth - 1), Finish()],
         None, Fault.BUFFER_RANGE, 0),
        ("empty micro-op range", [Gemm(uop_bgn=1, uop_end=1, iter_out=1, iter_in=1), Finish()], None,
         Fault.BUFFER_RANGE, 0),
        ("micro-op index past the accumulator",
         [Load(mem=MemType.UOP, sram_base=0, dram_base=DATA // c.entry_bytes("uop"), y_size=1, x_size=1,
               x_stride=1),
          Gemm(uop_bgn=0, uop_end=1, iter_out=iters, iter_in=1, dst_factor_out=factor), Finish()], None,
         Fault.BUFFER_RANGE, 0xFFFF_FFFF),
        ("finish not last", [Finish(), Finish()], None, Fault.FINISH_NOT_LAST, 0),
        # Several faulty instructions: the first in program order is reported, on both.
        ("finish not last, then an invalid word", [Finish(), (1 << 3) - 1], None, Fault.FINISH_NOT_LAST, 0),
        ("a range fault, then an invalid word",
         [Load(**{**load_inp, "sram_base": c.inp_depth - 1, "x_size": 2}), (1 << 3) - 1, Finish()], None,
         Fault.BUFFER_RANGE, 0),
        ("no finish", [Load(**load_inp)], None, Fault.NO_FINISH, 0),
        ("token never pushed", [Gemm(pop_prev=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), Finish()], None,
         Fault.DEADLOCK, 0),
        ("token left over", [Load(**load_inp, push_next=True), Finish()], None, Fault.TOKEN_IMBALANCE, 0),
        ("load beyond DRAM", [Load(**{**load_inp, "dram_base": BEYOND // c.entry_bytes("inp")}), Finish()],
         None, Fault.BUS_ERROR, 1),            # ARID 1: the input loader
        ("store beyond DRAM", [Store(mem=MemType.OUT, sram_base=0, dram_base=BEYOND // c.entry_bytes("out"),
                                     y_size=1, x_size=1, x_stride=1), Finish()], None,
         Fault.BUS_ERROR, ERROR_INFO_WRITE | 0),
        ("program beyond DRAM", [finish], ("beyond",), Fault.BUS_ERROR, 0),   # ARID 0: fetch
        # The top of the 32-bit address space: an access that would pass it is refused before
        # any of it happens (no wrap to address 0); one ending exactly at it is an ordinary
        # access beyond the DRAM, a bus error.
        ("program past the address top", [finish, finish], ("at", TOP - insn_bytes(c)), Fault.PROGRAM_RANGE, 0),
        ("program of 2^32 - 1 instructions", [finish], ("at", 0, (1 << 32) - 1), Fault.PROGRAM_RANGE, 0),
        ("program ending at the address top", [finish], ("at", TOP - insn_bytes(c)), Fault.BUS_ERROR, 0),
        ("load past the address top",
         [Load(**load_inp), Load(**{**load_inp, "dram_base": top["inp"] - 1, "x_size": 2}), Finish()], None,
         Fault.DRAM_RANGE, 1),
        ("load rows past the address top",
         [Load(**{**load_inp, "dram_base": top["inp"] - 9, "y_size": 2, "x_stride": 8, "x_size": 2}), Finish()],
         None, Fault.DRAM_RANGE, 0),
        ("micro-op load past the address top",
         [Load(mem=MemType.UOP, sram_base=0, dram_base=top["uop"] - 1, y_size=1, x_size=2, x_stride=2), Finish()],
         None, Fault.DRAM_RANGE, 0),
        ("load ending at the address top", [Load(**{**load_inp, "dram_base": top["inp"] - 2, "x_size": 2}), Finish()],
         None, Fault.BUS_ERROR, 1),
        ("store past the address top", [Store(**{**store_out, "dram_base": top["out"] - 1}), Finish()], None,
         Fault.DRAM_RANGE, 0),
        # A requantizing STORE's DRAM side moves output entries, not accumulator entries: this one
        # ends exactly at the top in output entries (in accumulator entries it would be far past).
        ("requantizing store ending at the address top",
         [Store(**{**store_out, "mem": MemType.ACC, "requant": True, "dram_base": top["out"] - 2}), Finish()],
         None, Fault.BUS_ERROR, ERROR_INFO_WRITE | 0),
        ("requantizing store past the address top",
         [Store(**{**store_out, "mem": MemType.ACC, "requant": True, "dram_base": top["out"] - 1}), Finish()],
         None, Fault.DRAM_RANGE, 0),
    ]


def _words(config, program):
    out = []
    for item in program:
        out.append(item if isinstance(item, int) else encode(item, config))
    return b"".join(w.to_bytes(insn_bytes(config), "little") for w in out)


def _valid_copy_program(config):
    """LOAD acc from DATA, STORE it to DATA + 4 KiB: the program run after every fault."""
    c = config
    n = 4
    entry = c.entry_bytes("acc")
    return [Load(mem=MemType.ACC, sram_base=0, dram_base=DATA // entry, y_size=1, x_size=n, x_stride=n,
                 push_next=True),
            Store(mem=MemType.ACC, sram_base=0, dram_base=(DATA + 4096) // entry, y_size=1, x_size=n, x_stride=n,
                  pop_prev=True),
            Finish()], n * entry


def _layout(config, rng):
    image = np.zeros(WINDOW, np.uint8)
    image[DATA:DATA + 4096] = rng.integers(0, 256, 4096, dtype=np.uint8)
    image[DATA:DATA + 64] = 0          # micro-op 0 = (0, 0, 0) for the index case
    runs, expected = [], []
    for k, (name, program, how, fault, info) in enumerate(fault_cases(config)):
        addr = k * SLOT
        raw = _words(config, program)
        assert len(raw) <= SLOT
        image[addr:addr + len(raw)] = np.frombuffer(raw, np.uint8)
        count = len(program)
        if how == ("misaligned",):
            addr += 8
        elif how == ("beyond",):
            addr = BEYOND
        elif how and how[0] == "at":
            addr, count = how[1], how[2] if len(how) > 2 else count
        runs.append({"insn_addr": addr, "insn_count": count})
        expected.append((name, fault, info))
    return image, runs, expected


@pytest.mark.parametrize("name", ["tiny"])
def test_fsim_raises_each_fault(name):
    config = PRESETS[name]
    image, runs, expected = _layout(config, np.random.default_rng(1))
    # Every fault code is provoked (ABORTED by the host, in the RTL sequence below).
    assert {fault for _, fault, _ in expected} | {Fault.NONE, Fault.ABORTED} == set(Fault)
    for run, (case, fault, _info) in zip(runs, expected):
        sim = Fsim(config, image.copy())
        with pytest.raises(FsimError) as err:
            sim.run(run["insn_addr"], run["insn_count"])
        assert err.value.fault == fault, f"{case}: fsim raised {err.value.fault.name} ({err.value})"


@needs_verilator
@pytest.mark.parametrize("stall", [0, 96])
def test_rtl_reports_each_fault_and_recovers(stall):
    config = PRESETS["tiny"]
    rng = np.random.default_rng(stall)
    image, runs, expected = _layout(config, rng)
    # A long, bus-heavy program aborted by the host while its loads are in flight.
    base = len(runs) * SLOT
    heavy = [Load(mem=MemType.WGT, sram_base=0, dram_base=DATA // config.entry_bytes("wgt"), y_size=16,
                  x_size=16, x_stride=16) for _ in range(12)] + [Finish()]
    raw = _words(config, heavy)
    image[base:base + len(raw)] = np.frombuffer(raw, np.uint8)
    runs.append({"insn_addr": base, "insn_count": len(heavy), "abort_after": 150})
    expected.append(("host abort", Fault.ABORTED, 0))
    # Then a valid program: the accelerator must be usable without the reset pin.
    valid, nbytes = _valid_copy_program(config)
    base += SLOT * 2
    raw = _words(config, valid)
    image[base:base + len(raw)] = np.frombuffer(raw, np.uint8)
    runs.append({"insn_addr": base, "insn_count": len(valid)})

    built = harness.build(config, "verilator")
    after, results = harness.run_sequence(built, image, 0, runs, stall=stall, seed=7)
    for result, (case, fault, info) in zip(results, expected):
        assert result["status"] == "fault", f"{case}: {result}"
        assert result["fault"] == fault.name, f"{case}: the RTL reported {result['fault']}, fsim {fault.name}"
        if fault != Fault.ABORTED:
            assert result["fault_info"] == info, f"{case}: ERROR_INFO {result['fault_info']:#x}"
    assert results[-1]["status"] == "done", results[-1]
    assert np.array_equal(after[DATA + 4096:DATA + 4096 + nbytes], image[DATA:DATA + nbytes])
    # The aborted program had loads in flight: the drain completed them all before the reset.
    assert results[-2]["counters"]["dma_bytes_read"] > 0
