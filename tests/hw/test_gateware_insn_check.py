"""`InsnChecker`'s tile-range checks against the ISA's rules, at and around every buffer's end
and the top of the 32-bit address space.

A LOAD writes ``sram_base .. sram_base + (y_pad0 + y_size + y_pad1)·(x_pad0 + x_size + x_pad1) - 1``
and a STORE reads ``sram_base .. sram_base + y_size·x_size - 1``; either is `Fault.BUFFER_RANGE`
when that range passes the buffer's depth (`gemforge.sim.fsim`'s rule). The checker compares
the tile's area with the room the buffer has from its base, so the test aims at the boundary:
tiles ending exactly at the depth, one entry past it, and bases at or beyond it. The DRAM side
of a tile ends at byte ``(dram_base + (y_size - 1)·x_stride + x_size)·entry bytes``, which must
not pass 2^32 (`Fault.DRAM_RANGE`): the tests aim at that top the same way.
"""

import random

import pytest

from gemforge.hw.config import PRESETS
from gemforge.hw.gateware.engine import insn_layout
from gemforge.hw.gateware.insn_check import InsnChecker
from gemforge.hw.gateware.testbench import simulate
from gemforge.hw.isa import Finish, Load, MemType, Opcode, Store, encode
from gemforge.hw.regmap import Fault


def _field_max(config, opcode, name):
    return (1 << insn_layout(config, opcode)[name].shape.width) - 1


def _random_tile(config, rng):
    """A LOAD or STORE whose tile ends near its buffer's end, and the fault fsim's rule gives."""
    if rng.random() < 0.6:
        mem = rng.choice([MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP])
        pads = {name: 0 if mem == MemType.UOP else rng.choice([0, 0, 1, 2]) for name in
                ("y_pad0", "y_pad1", "x_pad0", "x_pad1")}
        y_size, x_size = rng.randint(1, 5), rng.randint(1, 9)
        area = (pads["y_pad0"] + y_size + pads["y_pad1"]) * (pads["x_pad0"] + x_size + pads["x_pad1"])
        kind = Opcode.LOAD
    else:
        mem = rng.choice([MemType.OUT, MemType.ACC])
        y_size, x_size = rng.randint(1, 5), rng.randint(1, 9)
        pads, area = {}, y_size * x_size
        kind = Opcode.STORE
    depth = config.depth(mem.buffer)
    base = rng.choice([depth - area, depth - area + 1, depth - area - 1, depth, depth + rng.randint(1, 50),
                       rng.randint(0, depth), _field_max(config, kind, "sram_base")])
    base = max(0, min(base, _field_max(config, kind, "sram_base")))
    fields = dict(mem=mem, sram_base=base, dram_base=0, y_size=y_size, x_size=x_size, x_stride=x_size)
    insn = Load(**fields, **pads) if kind == Opcode.LOAD else Store(**fields)
    return insn, Fault.BUFFER_RANGE if base + area > depth else Fault.NONE


def _check_faults(config, cases, outcomes=(Fault.NONE, Fault.BUFFER_RANGE)):
    """Run each (instruction, expected fault) of ``cases`` through `InsnChecker`, as the program's
    last word, and compare; the cases must include each of ``outcomes``."""
    dut = InsnChecker(config)
    seen = []

    async def tb(ctx):
        for insn, _ in cases:
            ctx.set(dut.word, encode(insn, config))
            ctx.set(dut.last, 1)
            ctx.set(dut.en, 1)
            await ctx.tick()
            ctx.set(dut.en, 0)
            await ctx.tick().repeat(InsnChecker.LATENCY - 1)
            seen.append(Fault(ctx.get(dut.fault)))

    simulate(dut, tb)
    for (insn, expected), got in zip(cases, seen):
        assert got == expected, f"{insn}: {got.name}, expected {expected.name}"
    assert {expected for _, expected in cases} == set(outcomes)


@pytest.mark.parametrize("preset", ["tiny", "default", "large"])
def test_tile_range_at_the_buffer_end(preset):
    config = PRESETS[preset]
    rng = random.Random(preset)
    cases = [_random_tile(config, rng) for _ in range(120)]
    cases.append((Finish(), Fault.NONE))
    _check_faults(config, cases)


@pytest.mark.parametrize("preset", ["tiny", "default"])
def test_store_bias_range_at_the_accumulator_end(preset):
    """A requantizing STORE's bias entries, ``bias_base`` and (per row) ``y_size - 1`` more, raise
    `Fault.BUFFER_RANGE` exactly when they pass the accumulator's depth, as `isa.validate` says."""
    config = PRESETS[preset]
    depth = config.depth(MemType.ACC.buffer)
    rng = random.Random(f"bias-{preset}")
    cases = []
    for _ in range(80):
        per_row = rng.random() < 0.5
        y_size = rng.randint(1, 5)
        count = y_size if per_row else 1
        bias_base = max(0, min(rng.choice([depth - count, depth - count + 1, depth - count - 1, depth,
                                           rng.randint(0, depth)]), _field_max(config, Opcode.STORE, "bias_base")))
        insn = Store(mem=MemType.ACC, sram_base=0, dram_base=0, y_size=y_size, x_size=1, x_stride=1,
                     requant=True, bias=True, bias_per_row=per_row, bias_base=bias_base)
        cases.append((insn, Fault.BUFFER_RANGE if bias_base + count > depth else Fault.NONE))
    _check_faults(config, cases)


TOP = 1 << 32      # the first byte past the accelerator's address space


def _dram_tile_near_top(config, rng):
    """A LOAD or STORE (requantizing or not) in range on chip whose DRAM tile ends near byte 2^32,
    and the fault the rule gives, worked out here in bytes."""
    kind = rng.choice([Opcode.LOAD, Opcode.STORE, Opcode.STORE])
    if kind == Opcode.LOAD:
        mem, requant = rng.choice([MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP]), False
    else:
        mem = rng.choice([MemType.OUT, MemType.ACC])
        requant = mem == MemType.ACC and rng.random() < 0.5
    entry = config.entry_bytes("out" if requant else mem.buffer)
    y_size, x_size = rng.randint(1, 4), rng.randint(1, 4)
    x_stride = rng.choice([0, x_size, x_size + rng.randint(1, 9), _field_max(config, kind, "x_stride")])
    span = (y_size - 1) * x_stride + x_size                   # entries from dram_base to the tile's end
    end_entry = rng.choice([TOP // entry, TOP // entry + 1, TOP // entry - 1, TOP // entry + rng.randint(2, 99)])
    dram_base = min(max(0, end_entry - span), _field_max(config, kind, "dram_base"))
    if rng.random() < 0.1:
        dram_base = rng.choice([0, _field_max(config, kind, "dram_base")])
    fields = dict(mem=mem, sram_base=0, dram_base=dram_base, y_size=y_size, x_size=x_size, x_stride=x_stride)
    insn = Load(**fields) if kind == Opcode.LOAD else Store(**fields, requant=requant)
    past = (dram_base + span) * entry > TOP
    return insn, Fault.DRAM_RANGE if past else Fault.NONE


@pytest.mark.parametrize("preset", ["tiny", "default", "large"])
def test_dram_tile_at_the_address_space_top(preset):
    """A tile whose DRAM side passes byte 2^32 raises `Fault.DRAM_RANGE` (so no address wraps to
    0), one that ends exactly at it does not; a buffer-range fault of the same instruction
    comes first."""
    config = PRESETS[preset]
    rng = random.Random(f"top-{preset}")
    cases = [_dram_tile_near_top(config, rng) for _ in range(160)]
    cases.append((Store(mem=MemType.OUT, sram_base=config.out_depth - 1, y_size=2, x_size=1, x_stride=1,
                        dram_base=_field_max(config, Opcode.STORE, "dram_base")), Fault.BUFFER_RANGE))
    _check_faults(config, cases, outcomes=(Fault.NONE, Fault.DRAM_RANGE, Fault.BUFFER_RANGE))
